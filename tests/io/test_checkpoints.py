"""Checkpoints never lose work: resume, crash consistency, fallback, lock, NaN, export."""

import json
import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import helpers
import kerastrain as kt
from kerastrain.io import checkpoints


def shuffled_fn(ctx):
    import tensorflow as tf
    x, y = helpers.arrays(96)
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(96, seed=7).batch(
        ctx.get_per_replica_batch_size(helpers.GLOBAL_BATCH))


def trainer(model_dir=None, strategy="default", **kwargs):
    return kt.Trainer(helpers.build_model, shuffled_fn, strategy=strategy, seed=0, verbose=0,
                      model_dir=model_dir, **kwargs)


def test_fit_resumes_to_the_requested_total_with_identical_results(tmp_path, caplog):
    reference = trainer()
    ref_history = reference.fit(epochs=3).history
    trainer(tmp_path).fit(epochs=2)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == [
        "checkpoint", "ckpt-12.data-00000-of-00001", "ckpt-12.index",
        "ckpt-6.data-00000-of-00001", "ckpt-6.index"]
    with caplog.at_level(logging.INFO, logger="kerastrain"):
        resumed = trainer(tmp_path)
        history = resumed.fit(epochs=3).history
    assert "resumed from" in caplog.text and "step 12, after epoch 2 of 3" in caplog.text
    assert resumed.global_step == 18
    np.testing.assert_allclose(history["loss"], ref_history["loss"][2:], rtol=1e-6)
    for a, b in zip(resumed.model.get_weights(), reference.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # restore="none" starts over.
    fresh = trainer(tmp_path, checkpoint={"restore": "none"})
    fresh.fit(epochs=1)
    assert fresh.global_step == 6


@pytest.mark.parametrize("strategy", ["one_device", {"name": "mirrored", "cpu_devices": 2}],
                         ids=["one_device", "mirrored"])
def test_a_resumed_run_draws_the_dropout_masks_an_uninterrupted_one_draws(tmp_path, strategy):
    """A Dropout's seed generator state is not a weight: the checkpoint left it out, so a
    run stopped after 5 epochs and resumed to 8 ended with other losses than 8 in one go."""
    import keras
    x, y = helpers.arrays(64)

    def build():
        model = keras.Sequential([keras.Input((helpers.FEATURES,)), keras.layers.Dense(8),
                                  keras.layers.Dropout(0.5), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        return model

    options = dict(strategy=strategy, verbose=0, tensorboard=False, seed=0)
    fit = dict(batch_size=16, shuffle=False)
    straight = kt.Trainer(build, model_dir=str(tmp_path / "a"), **options).fit(
        x, y, epochs=8, **fit).history["loss"]
    kt.Trainer(build, model_dir=str(tmp_path / "b"), **options).fit(x, y, epochs=5, **fit)
    resumed = kt.Trainer(build, model_dir=str(tmp_path / "b"), **options).fit(
        x, y, epochs=8, **fit).history["loss"]
    np.testing.assert_allclose(resumed, straight[5:], rtol=1e-6)


def test_mid_epoch_checkpoint_resumes_the_epoch_exactly(tmp_path, caplog):
    import keras
    reference = trainer()
    ref_history = reference.fit(epochs=2).history

    class Crash(Exception):
        pass

    def crash_at_fifth_step(batch, logs):
        if batch == 4:
            raise Crash()

    first = trainer(tmp_path, checkpoint={"every_steps": 4})
    with pytest.raises(Crash):
        first.fit(epochs=2, callbacks=[keras.callbacks.LambdaCallback(
            on_train_batch_end=crash_at_fifth_step)])
    with caplog.at_level(logging.INFO, logger="kerastrain"):
        resumed = trainer(tmp_path, checkpoint={"every_steps": 4})
        history = resumed.fit(epochs=2).history
    assert "step 4, 4 steps into epoch 1 of 2" in caplog.text
    assert resumed.global_step == 12
    # Epoch 1's first 4 steps come from the checkpoint: the same epoch loss as uninterrupted.
    np.testing.assert_allclose(history["loss"], ref_history["loss"], rtol=1e-6)
    for a, b in zip(resumed.model.get_weights(), reference.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["default", {"name": "mirrored", "cpu_devices": 2}])
def test_sigkill_mid_training_then_rerun_gives_identical_weights(tmp_path, strategy):
    epochs = 3
    reference = trainer(strategy=strategy if strategy == "default" else {"name": "mirrored"})
    reference.fit(epochs=epochs)
    model_dir = tmp_path / "run"
    job = json.dumps({"strategy": strategy, "epochs": epochs, "data": "shuffled",
                      "model_dir": str(model_dir), "checkpoint": {"every_steps": 4},
                      "sleep_per_step": 0.15})
    env = helpers.child_env(TF_CPP_MIN_LOG_LEVEL="2")
    args = [sys.executable, "tests/_worker.py", job, str(tmp_path / "out")]
    proc = subprocess.Popen(args, env=env, cwd=helpers.REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(model_dir / "checkpoints" / "ckpt-4.index"):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)  # a step or two past the checkpoint, before the next one (step 8)
    proc.kill()
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not os.path.exists(tmp_path / "out.json")  # it really died mid-training
    rerun = subprocess.run(args, env=env, cwd=helpers.REPO, capture_output=True, text=True,
                           timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resumed from" in rerun.stderr and "ckpt-" in rerun.stderr
    assert json.loads((tmp_path / "out.json").read_text())["global_step"] == 18
    weights = list(np.load(tmp_path / "out.npz").values())
    for a, b in zip(weights, reference.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_truncated_latest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
    trainer(tmp_path).fit(epochs=2)
    data = tmp_path / "checkpoints" / "ckpt-12.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:100])
    with caplog.at_level(logging.INFO, logger="kerastrain"):
        resumed = trainer(tmp_path)
        resumed.fit(epochs=2)
    assert "ckpt-12 is unreadable" in caplog.text
    assert "resumed from" in caplog.text and "ckpt-6" in caplog.text
    assert resumed.global_step == 12  # epoch 2 trained again from step 6
    assert os.path.exists(tmp_path / "checkpoints" / "ckpt-6.index")  # never deleted


def test_no_readable_checkpoint_is_an_error_not_a_fresh_start_over_them(tmp_path):
    trainer(tmp_path).fit(epochs=2)
    for name in ("ckpt-6", "ckpt-12"):
        data = tmp_path / "checkpoints" / f"{name}.data-00000-of-00001"
        data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(RuntimeError, match=r"None of the 2 checkpoint\(s\) in .* can be read.*"
                                           r"will not train over them"):
        trainer(tmp_path).fit(epochs=3)
    assert os.path.exists(tmp_path / "checkpoints" / "ckpt-6.index")


def test_a_relative_model_dir_resumes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainer("runs/rel").fit(epochs=1)
    resumed = trainer("runs/rel")
    resumed.fit(epochs=2)
    assert resumed.global_step == 12  # resumed at step 6, not trained from scratch
    assert resumed.model_dir == str(tmp_path / "runs" / "rel")


def test_a_second_live_run_is_refused_and_a_stale_lock_is_taken_over(tmp_path, caplog):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = tmp_path / checkpoints.ModelDirLock.NAME
        import socket
        lock.write_text(json.dumps({"host": socket.gethostname(), "pid": sleeper.pid,
                                    "since": time.time()}))
        with pytest.raises(checkpoints.ModelDirInUse, match=rf"in use by another run .*pid "
                                                            rf"{sleeper.pid}.*Use another model_dir"):
            trainer(tmp_path)
    finally:
        sleeper.kill()
        sleeper.wait()
    with caplog.at_level(logging.WARNING, logger="kerastrain"):
        t = trainer(tmp_path)  # the holder is dead now
    assert f"left by process {sleeper.pid}, which is gone" in caplog.text
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    t.close()
    assert not lock.exists()


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, caplog):
    def nan_in_second_epoch(ctx):
        import tensorflow as tf
        x, y = helpers.arrays(96)
        clean = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
        y[50] = np.nan  # a label, not an input: see test_terminate_on_nan_stops
        bad = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
        return clean.concatenate(bad)

    t = kt.Trainer(helpers.build_model, nan_in_second_epoch, strategy="default", verbose=0,
                   model_dir=tmp_path, checkpoint={"every_steps": 3, "at_epoch_end": False})
    with caplog.at_level(logging.ERROR, logger="kerastrain"):
        t.fit(epochs=1)
    # Example 50 of the second pass is in step 10, inside the loop of steps 10-12.
    assert "the loss became nan by step 12" in caplog.text
    import tensorflow as tf
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-9")
    assert not os.path.exists(tmp_path / "export")


def test_export_loads_without_kerastrain_and_predicts_the_same(tmp_path):
    t = trainer(tmp_path)
    t.fit(epochs=1)
    x = helpers.arrays(8)[0]
    expected = t.model.predict(x, verbose=0)
    np.save(tmp_path / "x.npy", x)
    code = f"""
import numpy as np, tensorflow as tf, sys
assert "kerastrain" not in sys.modules
served = tf.saved_model.load({str(tmp_path / 'export' / 'saved_model')!r})
print(np.asarray(served.serve(tf.constant(np.load({str(tmp_path / 'x.npy')!r})))).tolist())
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_allclose(json.loads(proc.stdout.strip().splitlines()[-1]), expected,
                               atol=1e-6)
    import keras
    reloaded = keras.models.load_model(tmp_path / "export" / "model.keras")
    np.testing.assert_allclose(reloaded.predict(x, verbose=0), expected, atol=1e-6)


def test_bad_checkpoint_options():
    with pytest.raises(ValueError, match=r"Unknown checkpoint option\(s\) \['every_step'\]"):
        trainer(checkpoint={"every_step": 5})
    with pytest.raises(ValueError, match=r"`max_to_keep` must be an int >= 1.*max_to_keep=0"):
        checkpoints.CheckpointOptions(max_to_keep=0)


def test_explicit_restore_path_that_does_not_exist(tmp_path):
    t = trainer(checkpoint={"restore": str(tmp_path / "nope" / "ckpt-3")})
    with pytest.raises(FileNotFoundError, match=r"Cannot restore `restore=.*ckpt-3"):
        t.fit(epochs=1)


@pytest.mark.multiprocess
def test_sigterm_saves_at_the_step_reached_and_exits_143_then_resumes(tmp_path):
    model_dir = tmp_path / "run"
    marker = tmp_path / "started"
    job = {"strategy": "default", "epochs": 3, "n": 960, "data": "slow", "steps_per_loop": 50,
           "model_dir": str(model_dir), "started_marker": str(marker)}
    # Some 30 steps in: inside the first 50-step compiled loop.
    code, stderr, step, rerun = helpers.sigterm_worker(job, tmp_path / "out", delay=1.0,
                                                       stop_timeout=60)
    assert code == 143 and step is not None, stderr[-3000:]
    assert "Traceback" not in stderr
    assert 0 < step < 50  # the loop stopped after its current step, not at its end
    import tensorflow as tf
    assert tf.train.latest_checkpoint(str(model_dir / "checkpoints")).endswith(f"ckpt-{step}")
    again = rerun()
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"step {step}, {step} steps into epoch 1 of" in again.stderr
    assert json.loads((tmp_path / "out.json").read_text())["global_step"] == 180


@pytest.mark.multiprocess
def test_multi_worker_sigterm_on_one_worker_stops_all_at_one_step_then_resumes(
        tmp_path, tf_config_cluster):
    cluster = tf_config_cluster(worker=2)
    model_dir = tmp_path / "shared"  # both workers see it, as on shared storage
    marker = tmp_path / "started"

    def start():
        job = json.dumps({"strategy": "multi_worker_mirrored", "epochs": 2, "n": 960,
                          "data": "slow", "steps_per_loop": 5, "model_dir": str(model_dir),
                          "started_marker": str(marker)})
        return [cluster.start("worker", i, ["tests/_worker.py", job, str(tmp_path / f"w{i}")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                for i in range(2)]

    procs = start()
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(2.0)
    procs[1].send_signal(signal.SIGTERM)  # the non-chief is preempted
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [143, 143], "\n".join(e[-2000:] for e in errs)
    import tensorflow as tf
    latest = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
    step = int(latest.rsplit("-", 1)[1])
    assert 0 < step < 120 and f"all workers saved step {step}" in errs[0]
    # The non-chief saved into a temporary directory that is gone again.
    assert not [n for n in os.listdir(model_dir / "checkpoints") if "temp" in n]
    marker.unlink()
    procs = start()  # the same command again, on both workers
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(e[-2000:] for e in errs)
    assert "resumed from" in errs[0] and f"step {step}" in errs[0]
    for i in range(2):
        assert json.loads((tmp_path / f"w{i}.json").read_text())["global_step"] == 120


def test_explicit_restore_path_and_resolved_config(tmp_path):
    import yaml
    trainer(tmp_path).fit(epochs=2)
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert config["strategy"] == "default" and config["seed"] == 0
    assert config["checkpoint"]["max_to_keep"] == 3
    path = str(tmp_path / "checkpoints" / "ckpt-6")
    other = tmp_path / "other"
    t = trainer(other, checkpoint={"restore": path})
    t.fit(epochs=1)  # restored at the end of epoch 1: nothing left to train
    assert t.global_step == 6


def test_every_secs_and_every_steps_cadence():
    options = checkpoints.CheckpointOptions(every_steps=5, every_secs=30, at_epoch_end=False)
    c = checkpoints.Checkpointer(None, options, keep=False)
    c.cadence.done(now=100.0)
    assert c.due(10, epoch_end=False, now=101.0)          # a multiple of every_steps
    assert not c.due(11, epoch_end=False, now=129.0)      # neither
    assert c.due(11, epoch_end=False, now=130.0)          # 30 s since the last save
    assert not c.due(12, epoch_end=True, now=101.0)       # at_epoch_end=False


def test_one_cadence_rule_in_steps_seconds_and_epochs():
    from kerastrain.loop import actions
    from kerastrain.io import cadence
    from kerastrain.io import monitor
    now = [0.0]
    every = cadence.Every(steps=4, secs=10, clock=lambda: now[0])
    assert [every.steps_to_boundary(s) for s in (0, 1, 3, 4, 5)] == [4, 3, 1, 4, 3]
    assert [every.at_step(s) for s in (0, 4, 6, 8)] == [False, True, False, True]
    assert not every.due(5) and every.due(8)
    now[0] = 10.0
    assert every.due(5)                 # 10 s since it was made
    every.done()
    assert not every.due(5, now=19.9) and every.due(5, now=20.0)
    assert [cadence.Every(epochs=3).at_epoch_end(e) for e in range(6)] == [
        False, False, True, False, False, True]
    never = cadence.Every(steps=0, secs=None, epochs=0)
    assert never.steps_to_boundary(7) is None and not never.due(8, now=1e9)
    assert not never.at_epoch_end(0)
    # Its users: checkpoints stop loops at their steps, as summaries and profiles do.
    c = checkpoints.Checkpointer(None, checkpoints.CheckpointOptions(every_steps=6),
                                 keep=False)
    assert actions.Checkpoints(c, save=None, steps_per_epoch=None).steps_to_boundary(4) == 2
    schedule = monitor.Schedule(log_every_steps=5, profile_steps=(2, 3),
                                histograms_every_epochs=2)
    assert [schedule.steps_to_boundary(s) for s in (0, 2, 3, 9)] == [2, 1, 2, 1]
    assert schedule.log_due(10) and not schedule.log_due(0)
    assert schedule.histograms.at_epoch_end(1) and not schedule.histograms.at_epoch_end(0)


def test_the_chief_manager_never_restores_behind_kerastrains_back(tmp_path):
    # TensorFlow's PreemptionCheckpointHandler calls restore_or_initialize() on the
    # manager it is given; that must not undo restore="none" (or a fallback).
    trainer(tmp_path).fit(epochs=1)
    # No save by this run: the newest file stays the first run's ckpt-6 (6 steps), which
    # a stock restore_or_initialize() would load over these 1-step weights.
    fresh = trainer(tmp_path, checkpoint={"restore": "none", "at_epoch_end": False})
    fresh.fit(epochs=1, steps_per_epoch=1)
    import tensorflow as tf
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-6")
    before = [w.copy() for w in fresh.model.get_weights()]
    assert fresh._state.run.checkpointer.manager.restore_or_initialize() is None
    for a, b in zip(fresh.model.get_weights(), before):
        np.testing.assert_array_equal(a, b)


def test_sigterm_during_a_callback_saves_that_step_and_resumes_to_the_total(tmp_path):
    """A SIGTERM that lands while callbacks run after a loop (found on the old loop: it was
    taken for the end of the epoch, and the resumed run stopped short of its total)."""
    import keras

    class TerminateAtBatch3(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    def make():
        return kt.Trainer(helpers.build_model, helpers.global_batch_dataset_fn(), seed=0,
                          strategy="default", model_dir=tmp_path, steps_per_loop=1, verbose=0)

    first = make()
    with pytest.raises(kt.Preempted) as stopped:
        first.fit(epochs=2, callbacks=[TerminateAtBatch3()])
    # The loop in progress when the watcher thread flips the stop flag finishes its one step.
    step = stopped.value.step
    assert stopped.value.code == 143 and step in (3, 4)
    first.close()
    import tensorflow as tf
    saved = tf.train.load_checkpoint(str(tmp_path / "checkpoints" / f"ckpt-{step}"))
    assert int(saved.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE")) == step
    assert int(saved.get_tensor("step_in_epoch/.ATTRIBUTES/VARIABLE_VALUE")) == step
    assert int(saved.get_tensor("epoch/.ATTRIBUTES/VARIABLE_VALUE")) == 0
    again = make()
    again.fit(epochs=2)
    assert again.global_step == 12  # 2 epochs of 6 steps, none lost or repeated


@pytest.mark.parametrize("strategy", ["default", {"name": "mirrored", "cpu_devices": 2},
                                      {"name": "central_storage", "cpu_devices": 2}],
                         ids=["default", "mirrored", "central_storage"])
def test_checkpoints_written_in_the_background_hold_the_values_of_their_step(tmp_path,
                                                                              strategy):
    """Training goes on while each checkpoint is written (TensorFlow's asynchronous save, the
    default); each file still holds its own step's values: tensor for tensor what a run that
    writes in the foreground saved, checkpoint by checkpoint (a later step's values, or a
    Keras variable left out, would differ). Every write is whole when `fit` returns."""
    import tensorflow as tf
    saved = {}
    for background in (False, True):
        model_dir = tmp_path / ("background" if background else "foreground")
        t = trainer(model_dir, strategy=strategy, steps_per_loop=1,
                    checkpoint={"every_steps": 2, "max_to_keep": 10, "background": background})
        t.fit(epochs=4)   # 24 steps: 12 checkpoints, the last 10 kept
        assert t._state.run.checkpointer.background is background
        names = sorted(os.listdir(model_dir / "checkpoints"))
        assert not [n for n in names if "_temp" in n or ".tmp" in n], names
        saved[background] = {n[:-len(".index")]: tf.train.load_checkpoint(
            str(model_dir / "checkpoints" / n[:-len(".index")])) for n in names
            if n.endswith(".index")}
        assert tf.train.latest_checkpoint(str(model_dir / "checkpoints")).endswith("ckpt-24")
    assert sorted(saved[True]) == sorted(saved[False]) and len(saved[True]) == 10
    for name, reader in saved[True].items():
        keys = reader.get_variable_to_shape_map()
        assert keys == saved[False][name].get_variable_to_shape_map()
        for key in keys:  # save_counter: tf.train.Checkpoint's own count, not read back
            if key not in ("_CHECKPOINTABLE_OBJECT_GRAPH",
                           "save_counter/.ATTRIBUTES/VARIABLE_VALUE"):
                np.testing.assert_array_equal(reader.get_tensor(key),
                                              saved[False][name].get_tensor(key), err_msg=key)


def test_what_the_background_save_cannot_copy_keeps_saves_in_the_foreground():
    """TensorFlow's asynchronous save leaves out, with only a log line, what it cannot copy:
    kerastrain finds it first (here a variable whose saving is overridden on the object: the
    copy would be of its class's kind) and writes in the foreground."""
    import tensorflow as tf

    from kerastrain import _compat
    model = helpers.build_model()
    whole = tf.Variable([1.0, 2.0], name="saved_whole")
    assert _compat.not_copied_by_async_save(tf.train.Checkpoint(model=model)) == []
    object.__setattr__(whole, "_serialize_to_tensors", lambda: {"VARIABLE_VALUE": whole + 0})
    assert _compat.not_copied_by_async_save(
        tf.train.Checkpoint(model=model, whole=whole)) == ["saved_whole:0 (saved whole)"]


def test_a_finished_run_whose_every_steps_divides_its_epochs_resumes_after_its_last_epoch(
        tmp_path, caplog):
    """NumPy input: the epoch ends where the data does (16 batches), every_steps=4 lands on its
    last loop too; the checkpoint there is the epoch end's, so a rerun says where it stopped."""
    x, y = helpers.arrays(256)
    for _ in range(2):
        t = kt.Trainer(helpers.build_model, strategy="default", seed=0, verbose=0,
                       model_dir=tmp_path, steps_per_loop=2, checkpoint={"every_steps": 4})
        with caplog.at_level(logging.INFO, logger="kerastrain"):
            t.fit(x, y, batch_size=16, epochs=2)
        t.close()
    assert t.global_step == 32
    assert f"resumed from {tmp_path / 'checkpoints' / 'ckpt-32'}: step 32, after epoch 2 of 2" \
        in caplog.text, caplog.text[-2000:]


KILLED_WRITER = """
import sys
import numpy as np, keras, tensorflow as tf
import kerastrain as kt
def build():
    model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(4096),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model
x = np.random.RandomState(0).rand(64, 1024).astype("float32")
y = x[:, :1].copy()
trainer = kt.Trainer(build, strategy="default", seed=0, verbose=0, model_dir=sys.argv[1],
                     steps_per_loop=1, checkpoint={"every_steps": 2, "export": False})
trainer.fit(x, y, batch_size=8, epochs=6, shuffle=False)
print("trained to", trainer.global_step, "background", trainer._state.run.checkpointer.background)
"""


def test_a_process_killed_while_a_checkpoint_is_written_in_the_background_loses_nothing_older(
        tmp_path):
    """A 4 M-parameter model (a ~50 MB checkpoint with Adam's slots) saves every 2 steps in the
    background. Once a later checkpoint's files are being written (its `ckpt-N_temp` exists)
    the process is frozen, the write seen still unfinished, then killed: the checkpoints the
    state file names are whole, the newest of them is older than the one cut off, and the
    rerun removes the partial one, resumes from it and trains to the end."""
    import tensorflow as tf
    checkpoints_dir = tmp_path / "checkpoints"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path)],
                            cwd=helpers.REPO, env=helpers.child_env(TF_CPP_MIN_LOG_LEVEL="2"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cut = None
    deadline = time.monotonic() + 180
    try:
        while cut is None:
            assert proc.poll() is None, "it ended before a write was caught: " + \
                proc.stderr.read()[-2000:]
            assert time.monotonic() < deadline
            temps = [n for n in (os.listdir(checkpoints_dir) if checkpoints_dir.exists() else [])
                     if n.endswith("_temp") and n != "ckpt-2_temp"]
            if temps:
                proc.send_signal(signal.SIGSTOP)
                if (checkpoints_dir / temps[0]).exists():   # still being written: cut it off
                    cut = int(temps[0][len("ckpt-"):-len("_temp")])
                    break
                proc.send_signal(signal.SIGCONT)
            time.sleep(0.002)
    finally:
        proc.kill()
        proc.wait()
    assert (checkpoints_dir / f"ckpt-{cut}_temp").exists()
    latest = tf.train.latest_checkpoint(str(checkpoints_dir))
    assert latest is not None and int(latest.rsplit("-", 1)[1]) < cut, (latest, cut)
    tf.train.load_checkpoint(latest)          # whole
    rerun = helpers.run_python(["-c", KILLED_WRITER, str(tmp_path)])
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resumed from {latest}" in rerun.stderr, rerun.stderr[-3000:]
    assert "trained to 48 background True" in rerun.stdout
    assert not [n for n in os.listdir(checkpoints_dir) if "_temp" in n]
