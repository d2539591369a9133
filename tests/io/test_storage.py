"""A model_dir on any TensorFlow file system: ram:// stands in for gs:// (issue 20).

TensorFlow's ram:// lives in this process only, so every test runs in-process and
uses its own bucket name. Each one also runs with a fresh working directory and
checks that nothing named after the URL appears on the local disk.
"""

import importlib.util
import json
import logging
import os
import signal
import uuid

import numpy as np
import pytest

import helpers
import kerastrain as kt
from kerastrain.io import checkpoints
from kerastrain.cli import command as cli
from kerastrain.io import files
from kerastrain.io import locks
from kerastrain.cli import recipes

QUICKSTART = os.path.join(helpers.REPO, "recipes", "quickstart.yaml")


@pytest.fixture
def url(tmp_path, monkeypatch):
    """A fresh ram:// model_dir; the working directory is an empty temporary one."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield f"ram://kt-{uuid.uuid4().hex[:8]}/run"
    assert os.listdir(cwd) == [], "something was written to the local disk"


def gfile():
    import tensorflow as tf
    return tf.io.gfile


def trainer(model_dir, strategy="one_device", **kwargs):
    return kt.Trainer(helpers.build_model, helpers.global_batch_dataset_fn(), strategy=strategy,
                      seed=0, verbose=0, model_dir=model_dir, **kwargs)


@pytest.mark.parametrize("strategy", ["one_device", {"name": "mirrored", "cpu_devices": 2}],
                         ids=["one_device", "mirrored"])
def test_a_url_model_dir_keeps_everything_there_and_resumes(url, strategy, caplog):
    import keras
    import tensorflow as tf
    with caplog.at_level(logging.INFO, logger="kerastrain"):
        first = trainer(url, strategy)
    assert first.model_dir == url
    assert f"model_dir: {url} (TensorFlow's in-memory file system" in caplog.text
    first.fit(epochs=2)
    first.close()
    names = files.listdir(f"{url}/checkpoints")
    assert {"checkpoint", "ckpt-6.index", "ckpt-12.index"} <= set(names), names
    assert tf.train.latest_checkpoint(f"{url}/checkpoints") == f"{url}/checkpoints/ckpt-12"
    assert gfile().glob(f"{url}/logs/train/events.out.tfevents.*")
    assert "strategy:" in files.read_text(f"{url}/config.yaml")
    x = helpers.arrays(8)[0]
    expected = first.model.predict(x, verbose=0)
    reloaded = keras.models.load_model(f"{url}/export/model.keras")
    np.testing.assert_allclose(reloaded.predict(x, verbose=0), expected, atol=1e-6)
    served = tf.saved_model.load(f"{url}/export/saved_model")
    np.testing.assert_allclose(served.serve(tf.constant(x)).numpy(), expected, atol=1e-6)
    assert checkpoints.export_is_current(f"{url}/export", 12)

    with caplog.at_level(logging.INFO, logger="kerastrain"):
        resumed = trainer(url, strategy)
        resumed.fit(epochs=3)
    resumed.close()
    assert f"resumed from {url}/checkpoints/ckpt-12: step 12, after epoch 2 of 3" in caplog.text
    assert resumed.global_step == 18
    assert checkpoints.export_is_current(f"{url}/export", 18)


def test_a_url_lease_refuses_a_second_trainer_until_the_owner_closes(url):
    owner = trainer(url)
    record = json.loads(files.read_text(f"{url}/{locks.NAME}"))
    assert record["pid"] == os.getpid() and record["ttl"] > 0
    with pytest.raises(locks.ModelDirInUse, match=rf"in use by another run \(owner "
                                                  rf"{record['owner']}, .*call close\(\)"):
        trainer(url)
    owner.close()
    assert not files.exists(f"{url}/{locks.NAME}")
    nxt = trainer(url)
    assert json.loads(files.read_text(f"{url}/{locks.NAME}"))["owner"] != record["owner"]
    nxt.close()


class FakeTime:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_a_lease_is_taken_over_only_once_it_stops_being_renewed(url, caplog):
    clock = FakeTime()
    path = f"{url}/{locks.NAME}"
    files.makedirs(url)

    def other(renewed):  # a run in another process, as its record shows it
        files.write_text(path, json.dumps({"owner": "elsewhere", "host": "h2", "pid": 7,
                                           "since": 0, "renewed": renewed, "ttl": 60}))

    # Renewed while we wait: that run is alive.
    other(clock.now - 10)
    lock = locks.ModelDirLock(url, clock=clock, sleep=lambda s: (clock.sleep(s),
                                                                  other(clock.now)))
    with pytest.raises(locks.ModelDirInUse, match="owner elsewhere, host 'h2', pid 7.*renewing"):
        lock.acquire()
    # Not renewed for its ttl: taken over, after waiting for the rest of it.
    other(clock.now - 10)
    lock = locks.ModelDirLock(url, clock=clock, sleep=clock.sleep)
    start = clock.now
    with caplog.at_level(logging.WARNING, logger="kerastrain"):
        lock.acquire()
    assert 50 <= clock.now - start <= 60 and "expired" in caplog.text
    mine = json.loads(files.read_text(path))["owner"]
    # The owner renews; when another run took the record over, it notices and stops writing.
    lock._impl.renew()
    assert json.loads(files.read_text(path))["owner"] == mine
    other(clock.now)
    with caplog.at_level(logging.ERROR, logger="kerastrain"):
        lock._impl.renew()
    assert "was taken over by owner elsewhere" in caplog.text
    with pytest.raises(locks.ModelDirInUse, match="took over this run's lease"):
        locks.check(f"{url}/checkpoints")
    lock.release()
    assert json.loads(files.read_text(path))["owner"] == "elsewhere"  # not ours to remove
    # A garbled record is stale.
    files.write_text(path, "{not json")
    with caplog.at_level(logging.WARNING, logger="kerastrain"):
        lock = locks.ModelDirLock(url, clock=clock, sleep=clock.sleep).acquire()
    assert "not a lock record" in caplog.text
    lock.release()


def test_s3_without_tensorflow_io_fails_at_construction_and_exits_2(tmp_path, capsys):
    if importlib.util.find_spec("tensorflow_io") is not None:
        pytest.skip("tensorflow-io is installed: s3:// is implemented")
    with pytest.raises(ValueError) as e:
        trainer("s3://b/x")
    message = str(e.value)
    assert "\n" not in message and "'s3://'" in message and "pip install tensorflow-io" in message
    for command in ("validate", "run"):
        code = cli.main([command, QUICKSTART, "--set", "trainer.model_dir=s3://b/x"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert "trainer.model_dir" in err and "tensorflow-io" in err and "Traceback" not in err
    assert cli.main(["validate", QUICKSTART, "--set", "trainer.model_dir=gs://b/x"]) == 0


def test_the_recipe_cli_and_the_evaluator_use_a_url_model_dir(url, capsys, monkeypatch):
    # 6 batches of 256: two epochs of 3 steps (finite data ends an epoch early, as in fit).
    sets = ["trainer.epochs=1", "trainer.steps_per_epoch=3", f"trainer.model_dir={url}",
            "data.train.args.num_examples=1536", "data.validation.args.num_examples=128",
            "trainer.verbose=0", "strategy=default"]
    args = [a for s in sets for a in ("--set", s)]
    assert cli.main(["run", QUICKSTART, *args]) == 0
    assert "kerastrain: done: 1 epoch, step 3," in capsys.readouterr().out
    assert files.read_text(f"{url}/recipe.yaml").startswith("# resolved from ")
    assert cli.main(["run", QUICKSTART, *args, "--set", "trainer.epochs=2"]) == 0
    assert "kerastrain: done: 1 epoch, step 6," in capsys.readouterr().out
    assert files.exists(f"{url}/recipe.yaml.previous-1")
    assert checkpoints.export_is_current(f"{url}/export", 6)

    # The side-car evaluator reads the chief's checkpoints there and writes its scalars there.
    from kerastrain.cli import evaluator
    recipe, _ = recipes.load(QUICKSTART, sets)
    port = kt.cluster.free_port()  # nobody listens: the chief "never came", after a moment
    monkeypatch.setenv("TF_CONFIG", helpers.tf_config(
        {"chief": [f"127.0.0.1:{port}"], "evaluator": ["127.0.0.1:1"]}, "evaluator", 0))
    assert evaluator.run(recipe, poll_secs=0.2, startup_timeout=1.0) == 0
    assert gfile().glob(f"{url}/logs/evaluator/events.out.tfevents.*")


def test_preemption_and_nan_stop_with_a_url_model_dir(url):
    import tensorflow as tf
    sent = []

    def sigterm_at_example_40(i):
        if int(i) == 40 and not sent:  # while the compiled loop runs, as a real SIGTERM lands
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        return 0.0

    def data(ctx):
        x, y = helpers.arrays(96)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).enumerate()
        return ds.map(lambda i, xy: (xy[0] + tf.reshape(tf.py_function(
            sigterm_at_example_40, [i], tf.float32), []), xy[1])).batch(16)

    t = kt.Trainer(helpers.build_model, data, strategy="one_device", seed=0, verbose=0,
                   model_dir=url)
    with pytest.raises(kt.Preempted) as e:
        t.fit(epochs=2)
    t.close()
    step = e.value.step
    assert 0 < step < 6 and e.value.path == f"{url}/checkpoints/ckpt-{step}"
    assert tf.train.latest_checkpoint(f"{url}/checkpoints").endswith(f"ckpt-{step}")
    resumed = trainer(url)
    resumed.fit(epochs=2)
    resumed.close()
    assert resumed.global_step == 12

    def nan_label(ctx):
        x, y = helpers.arrays(96)
        y[50] = np.nan
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(16)

    nan_dir = url.replace("/run", "/nan")  # (not url + suffix: ram:// matches string prefixes)
    t = kt.Trainer(helpers.build_model, nan_label, strategy="one_device", verbose=0,
                   model_dir=nan_dir, checkpoint={"every_steps": 2, "at_epoch_end": False},
                   steps_per_loop=1)
    t.fit(epochs=1)
    t.close()
    assert tf.train.latest_checkpoint(f"{nan_dir}/checkpoints").endswith("ckpt-2")
    assert not files.exists(f"{nan_dir}/export")
