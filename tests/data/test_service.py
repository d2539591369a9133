"""The tf.data service (`data_service=`): ids counted inside the model, through the service.

Mirrored runs in this process (two logical CPUs); parameter servers and a service of separate
processes (one worker killed mid-epoch) run in subprocesses.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import _service_worker
import helpers
import kerastrain as kt
from kerastrain.cli import config, template
from kerastrain.data import service

N, BATCH = 512, 16


@pytest.mark.parametrize("value, message", [
    ("grpc://nowhere", "must be 'local' (an in-process service on this machine) or a "
                       "dispatcher's address 'grpc://host:port'. "
                       "Received: dispatcher='grpc://nowhere'"),
    ({"workers": 0}, "must be an int >= 1 (in-process workers of the 'local' service). "
                     "Received: workers=0"),
    ({"processing_mode": "dynamic"}, "must be one of ['distributed_epoch', 'parallel_epochs']. "
                                     "Received: processing_mode='dynamic'"),
    ({"dispatcher": "local", "worker": 2}, "Unknown data_service option(s) ['worker']"),
    (3, "Received: data_service=3 of type int"),
])
def test_bad_options_are_clear_errors(value, message):
    with pytest.raises((ValueError, TypeError)) as e:
        kt.Trainer(_service_worker.build_model(8), strategy="one_device", data_service=value)
    assert message in str(e.value)


def test_a_dispatcher_nobody_serves_is_a_clear_error_at_once(monkeypatch):
    monkeypatch.setattr(service, "CONNECT_WAIT_SECS", 1.0)
    port = kt.cluster.free_port()
    started = time.monotonic()
    with pytest.raises(ValueError) as e:
        kt.Trainer(_service_worker.build_model(8), strategy="one_device",
                   data_service=f"grpc://127.0.0.1:{port}")
    assert time.monotonic() - started < 10
    assert f"Cannot reach the tf.data service dispatcher at grpc://127.0.0.1:{port} " \
        "within 1 s (Connection refused). Start one there" in str(e.value)
    assert f"Received: dispatcher='grpc://127.0.0.1:{port}'" in str(e.value)


def test_recipe_data_service_key_parses_and_is_checked():
    tree = {"model": {"builder": "kerastrain.examples:build_mlp"},
            "data": {"train": {"builder": "kerastrain.examples:synthetic_data"},
                     "service": "local"}}
    recipe = config.validate(tree, imports=False)
    assert recipe.data.service == {"dispatcher": "local", "workers": 2,
                                   "processing_mode": "distributed_epoch", "network": "private"}
    assert config.validate({**tree, "data": {**tree["data"], "service": None}},
                           imports=False).data.service is None
    bad = {**tree, "data": {**tree["data"], "service": {"workers": -1}}}
    with pytest.raises(config.RecipeError) as e:
        config.validate(bad, imports=False)
    assert "data.service: expected null, 'local', 'grpc://host:port' or a mapping" in str(e.value)
    assert "Received: workers=-1" in str(e.value)
    assert "service:" in template.template()


def test_local_service_is_isolated_by_kerastrain_run_and_multi_worker_mirrored_is_refused():
    # What `kerastrain run` reads before TensorFlow: a local service is kept private.
    assert service.local_network("local") == "private"
    assert service.local_network({"network": "host"}) == "host"
    assert service.local_network("grpc://10.0.0.1:5050") is None
    assert service.local_network(None) is None
    from kerastrain.loop import modes
    built = type("Built", (), {"is_multi_worker": True, "is_parameter_server": False,
                               "name": "multi_worker_mirrored", "num_workers": 2})()
    with pytest.raises(ValueError) as e:
        service.check_strategy(service.ServiceOptions(), built,
                               modes.for_strategy(built).input_policy())
    assert "Train with strategy 'ps', or without the service. Received: " \
        "strategy='multi_worker_mirrored'" in str(e.value)


def test_unsplittable_source_is_refused_with_what_to_do(caplog):
    import tensorflow as tf

    def generated():
        def gen():
            for i in range(64):
                yield np.full([4], i, "float32"), np.zeros([1], "float32")
        return tf.data.Dataset.from_generator(gen, output_signature=(
            tf.TensorSpec([4], tf.float32), tf.TensorSpec([1], tf.float32))).batch(16)
    trainer = kt.Trainer(_service_worker.build_model(64), strategy="one_device", verbose=0,
                         data_service="local")
    try:
        with pytest.raises(ValueError) as e:
            trainer.fit(generated)
    finally:
        trainer.close()
    assert "starts from a Python generator, which TensorFlow cannot split" in str(e.value)
    assert "'processing_mode': 'parallel_epochs'" in str(e.value)


def test_mirrored_trains_every_id_exactly_once_per_epoch_through_a_local_service(caplog):
    caplog.set_level("INFO", "kerastrain")
    job = {"n": N, "batch": BATCH, "epochs": 3, "strategy": {"name": "mirrored", "cpu_devices": 2},
           "service": "local"}
    per_epoch, step = _service_worker.train(job)
    for counts in per_epoch:
        assert set(counts) == {1}, np.unique(counts, return_counts=True)
    # NumPy data is split by batch: 32 whole batches a pass, as without the service.
    assert step == 3 * 32
    text = caplog.text
    assert "training data: through an in-process tf.data service (dispatcher and 2 worker(s) " \
        "on ports" in text
    assert "processing_mode='distributed_epoch': one job per pass: each example is trained " \
        "once per pass (checked against 512 examples" in text
    assert "were lost" not in text


@pytest.mark.multiprocess
def test_closing_a_trainer_after_a_mirrored_fit_through_a_local_service_never_hangs(tmp_path):
    """`Trainer.close` stops the local service. The last fit's iterator reads from it on
    threads of its own, and freeing it waits for them: freed after the service stopped, it
    waited forever, in about one of four closes (a CI run hung in the test above). Eight
    trainers, each fit and closed in one process, end."""
    job = {"n": N, "batch": BATCH, "epochs": 2, "service": "local", "cpu_devices": 2,
           "strategy": {"name": "mirrored", "cpu_devices": 2}, "runs": [{}] * 8}
    try:
        proc = helpers.run_python(["tests/_service_worker.py", json.dumps(job),
                                   str(tmp_path / "out.json")], timeout=150)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"eight fits and closes did not end within 150 s: {e.stderr}")
    assert proc.returncode == 0, proc.stderr[-5000:]
    runs = json.loads((tmp_path / "out.json").read_text())["runs"]
    assert [r["global_step"] for r in runs] == [2 * 32] * 8


@pytest.mark.multiprocess
def test_ps_two_workers_train_every_example_once_per_epoch_through_a_local_service(tmp_path):
    """Two ps workers read one job per pass. With steps_per_epoch=None an epoch is a pass
    read to its end by both workers: every id exactly once in each epoch. With
    steps_per_epoch set, epochs count steps of one repeated job: every id once per pass,
    but passes overlap at epoch ends by the batches workers hold, so over 4 epochs of a
    pass's length every id is trained 3 to 5 times. A later `fit` reads the next pass."""
    job = {"n": N, "batch": BATCH, "epochs": 3, "service": "local",
           "strategy": {"name": "ps", "num_workers": 2, "num_ps": 1},
           "runs": [{}, {"epochs": 4, "steps_per_epoch": 32},
                    {"epochs": 2, "fit_per_epoch": True}]}
    proc = helpers.run_python(["tests/_service_worker.py", json.dumps(job),
                               str(tmp_path / "out.json")], timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    passes, steps, fits = json.loads((tmp_path / "out.json").read_text())["runs"]
    assert passes["global_step"] == 3 * 32 and fits["global_step"] == 2 * 32
    for counts in passes["per_epoch"] + fits["per_epoch"]:  # a later fit reads a new pass
        assert counts == [1] * N
    assert steps["global_step"] == 4 * 32
    for counts in map(np.asarray, steps["per_epoch"]):
        assert counts.sum() == N  # 32 whole batches
    # The bound the code guarantees: the job's stream is pass after pass, each id once per
    # pass, and the 128 trained batches are the stream's first 128 + h minus the h batches
    # the workers fetched and still held when training stopped (or that the last epoch end
    # left in their buffers). While h < 32 (a pass; each worker holds a few), a held batch
    # and its replacement lie within one pass of the 128th: an id is trained 4 times, once
    # fewer or once more. The sums say the same: 3s and 5s pair up.
    total = np.sum(steps["per_epoch"], axis=0)
    assert set(total) <= {3, 4, 5}, np.unique(total, return_counts=True)
    assert (total == 3).sum() == (total == 5).sum()
    assert "one epoch is one pass of a job the 2 workers read to its end" in proc.stderr
    assert "with steps_per_epoch=None an epoch is one pass: one job per pass, which every " \
        "ps worker reads to its end" in proc.stderr
    assert "NumPy data is split by batch (a pass has the same batches as without the " \
        "service)" in proc.stderr
    assert "were lost" not in proc.stderr and "never reported" not in proc.stderr


def _server(args, log=None):
    """A service server; with `log`, its TensorFlow log of the tasks it serves goes there."""
    env = {"TF_CPP_MIN_LOG_LEVEL": "2"} if log is None else {
        "TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "worker_impl=3"}
    return subprocess.Popen([sys.executable, "-m", "kerastrain.data.service", *args],
                            cwd=helpers.REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL if log is None else open(log, "w"),
                            env=helpers.child_env(**env))


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", [{"name": "mirrored", "cpu_devices": 2},
                                      {"name": "ps", "num_workers": 2, "num_ps": 1}],
                         ids=["mirrored", "ps"])
def test_a_service_worker_killed_mid_epoch_training_finishes_and_reports_the_lost_examples(
        tmp_path, strategy):
    """A dispatcher and 2 worker processes; worker 1 is killed (SIGKILL) in epoch 0 and, as a
    supervisor would, restarted at its address. The splits it held are lost: training
    finishes, and the warning's count equals the ids the model never trained (under ps,
    with epochs of one pass, counted from what the loops trained)."""
    free = kt.cluster.free_port
    port, ports = free(), [free(), free()]
    servers = [_server(["dispatcher", "--port", str(port)])]
    log = tmp_path / "worker1.log"
    servers += [_server(["worker", "--dispatcher", f"127.0.0.1:{port}", "--port", str(p)],
                        log=log if p == ports[1] else None) for p in ports]
    marker = tmp_path / "started"
    job = {"n": 2048, "batch": 16, "epochs": 2, "steps_per_loop": 1, "sleep_per_loop": 0.02,
           "marker": str(marker), "strategy": strategy,
           "cpu_devices": strategy.get("cpu_devices"), "service": f"grpc://127.0.0.1:{port}"}
    chief = subprocess.Popen(
        [sys.executable, "tests/_service_worker.py", json.dumps(job), str(tmp_path / "out.json")],
        cwd=helpers.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=helpers.child_env(TF_CPP_MIN_LOG_LEVEL="2"))
    try:
        # Killed once training has started and worker 1 holds data: a worker that registered
        # before the job learns of its task only at its next heartbeat, and one killed before
        # that holds nothing to lose (TensorFlow logs each element it produces at level 3).
        deadline = time.monotonic() + 240
        while not (marker.exists() and "Producing an element" in log.read_text()):
            assert chief.poll() is None and time.monotonic() < deadline, chief.stderr.read()
            time.sleep(0.05)
        servers[2].send_signal(signal.SIGKILL)
        servers[2].wait()
        servers[2] = _server(["worker", "--dispatcher", f"127.0.0.1:{port}", "--port",
                              str(ports[1])])
        stderr = chief.communicate(timeout=300)[1]
    finally:
        for p in servers + [chief]:
            p.kill()
    assert chief.returncode == 0, stderr[-5000:]
    first, second = (np.asarray(c) for c in json.loads(
        (tmp_path / "out.json").read_text())["per_epoch"])
    missed = int((first == 0).sum())
    assert set(first) <= {0, 1} and missed > 0
    assert f"pass 1 of the training data: {2048 - missed} of 2048 examples reached training; " \
        f"{missed} were lost (a service worker stopped while processing them" in stderr
    assert set(second) == {1}  # the next pass is whole again


def test_launch_starts_a_dispatcher_and_workers_and_points_the_recipe_at_them():
    from kerastrain.cli import tasks as tasks_lib
    tasks, sets = tasks_lib.service_tasks(2, ["trainer.epochs=1"])
    assert [t.name for t in tasks] == ["data_dispatcher:0", "data_worker:0", "data_worker:1"]
    port = tasks[0].command[-1]
    assert sets == ["trainer.epochs=1", f"data.service=grpc://127.0.0.1:{port}"]
    assert all(t.command[-6:-4] == ["--dispatcher", f"127.0.0.1:{port}"] and
               t.command[-2:] == ["--host", "127.0.0.1"] for t in tasks[1:])
    # On multihost every server is a host of its own, on the same port of its own address,
    # and each worker tells the dispatcher its host name, by which consumers reach it.
    tasks, sets = tasks_lib.service_tasks(2, [], multihost=True)
    assert sets == ["data.service=grpc://data-dispatcher-0:5050"]
    assert tasks[0].command[-2:] == ["--port", "5050"]
    assert [t.command[-6:] for t in tasks[1:]] == [
        ["--dispatcher", "data-dispatcher-0:5050", "--port", "5050", "--host", f"data-worker-{i}"]
        for i in range(2)]
    assert tasks_lib.service_tasks(0, ["a=1"]) == ([], ["a=1"])
    with pytest.raises(ValueError, match=r"`--service-workers` must be an int >= 0. "
                                         r"Received: -1"):
        tasks_lib.service_tasks(-1)


def test_validation_and_evaluation_data_stay_off_the_service(caplog):
    caplog.set_level("DEBUG", "kerastrain")  # one input pipeline: said in full at DEBUG
    x, y = _service_worker.arrays(64)
    trainer = kt.Trainer(_service_worker.build_model(64), strategy="one_device", verbose=0,
                         data_service="local", seed=0)
    try:
        history = trainer.fit(x, y, batch_size=16, validation_data=(x, y))
        logs = trainer.evaluate(x, y, batch_size=16)
    finally:
        trainer.close()
    assert history.history["val_loss"][0] == pytest.approx(logs["loss"], rel=1e-5)
    lines = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("training data: through an in-process tf.data service") for m in lines)
    assert any(m.startswith("validation data: one input pipeline reads all the data") for m in lines)
    assert any(m.startswith("evaluation data: one input pipeline reads all the data") for m in lines)
