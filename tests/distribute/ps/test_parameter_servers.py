"""Parameter-server training: local in-process cluster and a TF_CONFIG cluster of processes."""

import json
import os
import re

import pytest

import helpers

pytestmark = pytest.mark.multiprocess

EPOCHS, STEPS = 3, 12


def check_result(result):
    loss = result["history"]["loss"]
    assert len(loss) == EPOCHS
    assert loss[-1] < loss[0], loss
    # Exact, and so is the optimizer's own count of updates (Keras's read-then-write
    # increment loses some with two workers updating at once).
    assert result["global_step"] == result["iterations"] == EPOCHS * STEPS
    assert result["devices"] and all("/job:ps/" in d for d in result["devices"]), result["devices"]
    # Every variable the workers' loops read is on a ps, the stop flag too: on the coordinator,
    # each worker step called into the coordinator's own server ("Unable to parse request").
    assert "/job:ps/" in result["stop_flag_device"], result["stop_flag_device"]
    assert result["is_chief"]


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory):
    """The jobs that train on a local in-process cluster of 2 workers and 1 ps, one after
    another in one process (TensorFlow and the cluster start once; each job is its own
    Trainer): {name: (its result, its log)}. The first job starts the cluster."""
    tmp = tmp_path_factory.mktemp("local_cluster")
    jobs = {
        "without_cluster": {
            "strategy": {"name": "ps", "num_workers": 2, "num_ps": 1},
            "epochs": EPOCHS, "steps_per_epoch": STEPS, "data": "infinite",
            # Loops of 5: 4 steps per loop iteration, then one (no step lost
            # or repeated: the exact counts of check_result).
            "steps_per_loop": 5, "tuning": {"unroll_steps": True},
            "evaluate": True, "model_dir": str(tmp / "run"),
            # `Adam(learning_rate=0.001)` is the model's own "adam", as an object made
            # before the cluster starts.
            "optimizer_object": 0.001,
            "tensorboard": {"log_every_steps": 6}},
        "fresh_restore": {
            "strategy": {"name": "ps", "num_workers": 2, "num_ps": 1},
            "epochs": 2, "steps_per_epoch": 10, "data": "infinite",
            "steps_per_loop": 3, "model_dir": str(tmp / "restore"),
            "checkpoint": {"every_steps": 5}, "fresh_restore": True,
            "count_registrations": True},
        "counting": {
            "strategy": {"name": "ps", "num_workers": 2, "num_ps": 1}, "epochs": 3,
            "n": 512, "steps_per_epoch": 32, "counting": True, "steps_per_loop": 4}}
    proc = helpers.run_python(["tests/_worker.py", json.dumps(
        [[job, str(tmp / name)] for name, job in jobs.items()])])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    logs = proc.stderr.split("@@ job ")[1:]
    assert [int(log.split("\n", 1)[0]) for log in logs] == list(range(len(jobs)))
    return {name: (json.loads((tmp / f"{name}.json").read_text()), log)
            for name, log in zip(jobs, logs)} | {"dir": tmp}


def test_ps_without_cluster_starts_local_in_process_cluster(local_cluster):
    result, log = local_cluster["without_cluster"]
    # Truthful: TensorFlow's servers listen on every interface, not on 127.0.0.1.
    assert "local in-process cluster of 2 worker(s) and 1 ps, listening on ports" in log
    # Said before a user meets it: two workers update asynchronously.
    assert "; its 2 workers update the variables asynchronously, each step reading weights " \
        "others may be updating: losses differ from one device's and from run to run" \
        in log
    check_result(result)
    # The coordinator (chief) wrote TensorBoard logs: running values every 6 steps, and at
    # each epoch end the epoch's value, although results arrive only after each join.
    train = helpers.read_scalars(str(local_cluster["dir"] / "run" / "logs" / "train"))
    assert [s for s, _ in train["loss"]] == list(range(6, EPOCHS * STEPS + 1, 6))
    epoch_ends = dict(train["loss"])
    assert [epoch_ends[(e + 1) * STEPS] for e in range(EPOCHS)] == pytest.approx(
        result["history"]["loss"], rel=1e-6)
    assert [s for s, _ in train["examples_per_second"]] == [STEPS * (e + 1) for e in range(EPOCHS)]
    # Coordinator-side evaluation saw every example once: 96 examples, exact accuracy.
    assert result["evaluate"]["accuracy"] * 96 == pytest.approx(round(result["evaluate"]["accuracy"] * 96), abs=1e-3)


def test_ps_checkpoint_restores_into_a_fresh_trainer_with_the_exact_step(local_cluster):
    result, log = local_cluster["fresh_restore"]
    # Written in the foreground: TensorFlow's asynchronous copy would live on the ps.
    assert result["ckpt_background"] is False
    assert result["global_step"] == 20
    assert result["fresh_global_step"] == 20  # restored exactly, nothing left to train
    assert result["fresh_max_weight_diff"] == 0.0
    names = sorted(os.listdir(local_cluster["dir"] / "restore" / "checkpoints"))
    assert [n for n in names if n.endswith(".index")] == [
        "ckpt-10.index", "ckpt-15.index", "ckpt-20.index"]  # max_to_keep=3
    assert "resumed from" in log


def test_ps_checkpoints_after_the_first_send_nothing_new_to_the_cluster(local_cluster):
    """An eager save over several tasks traced a new save function every time and
    registered it with every worker, holding the GIL: one frozen worker then blocked the
    chief at its next checkpoint (the multihost rehearsal's freeze flake)."""
    result, _ = local_cluster["fresh_restore"]
    per_save = result["registered_per_save"]
    assert len(per_save) >= 4, per_save  # steps 5, 10, 15, 20
    assert per_save[0] >= 1 and per_save[1:] == [0] * (len(per_save) - 1), per_save


def test_a_layer_that_counts_with_assign_add_counts_exactly_under_two_ps_workers(local_cluster):
    """Keras's `assign_add` is a read and a write: two workers lost 30-45 % of the counts."""
    result, _ = local_cluster["counting"]
    assert result["global_step"] == 3 * 512 // 16
    assert result["count"] == 3 * 512  # every example of every epoch, once


def test_an_optimizer_object_made_before_the_trainer_trains_under_ps(local_cluster):
    """`Trainer(build, strategy="ps", optimizer=keras.optimizers.Adam(1e-3))`: the object's
    learning rate is a variable of this process, unreadable once it joined the cluster
    ("Client for target /job:localhost/replica:0/task:0 not found")."""
    result, _ = local_cluster["without_cluster"]
    assert result["optimizer"] == ["Adam", pytest.approx(0.001)]  # float32
    assert result["iterations"] == result["global_step"] > 0


def test_ps_with_tf_config_cluster_of_real_processes(tmp_path, tf_config_cluster):
    """Two ps processes, and every variable with two rows or more split over both."""
    cluster = tf_config_cluster(chief=1, worker=2, ps=2)
    servers = [cluster.serve(task_type, index)
               for task_type, index in (("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1))]
    split = {"name": "fixed_shards", "num_shards": 2}
    job = json.dumps({"strategy": {"name": "ps", "variable_partitioner": split},
                      "epochs": EPOCHS, "steps_per_epoch": STEPS, "data": "infinite",
                      "steps_per_loop": 4})
    chief = helpers.run_python(["tests/_worker.py", job, str(tmp_path / "chief")],
                               env={"TF_CONFIG": cluster.tf_config("chief", 0)})
    assert chief.returncode == 0, chief.stdout[-3000:] + chief.stderr[-5000:]
    result = json.loads((tmp_path / "chief.json").read_text())
    check_result(result)
    assert {d.split("/task:")[1][0] for d in result["devices"]} == {"0", "1"}
    # The last bias has one row: it stays whole.
    assert sorted(result["shards"].values()) == [2, 2, 2], result["shards"]
    assert "2 workers and 2 ps from TF_CONFIG; variables split by fixed_shards(num_shards=2)" \
        in chief.stderr
    # Worker and ps servers notice that the chief has finished and stop by themselves.
    for server in servers:
        out = server.communicate(timeout=60)[0]
        assert server.returncode == 0, out[-2000:]
        assert "chief-finished" in out, out[-2000:]


@pytest.mark.multiprocess
def test_a_script_that_trains_mirrored_then_ps_then_mirrored_again_prints_no_errors():
    # Functions traced before the process connected to the cluster were removed "remotely"
    # when deleted, from tasks that never had them: one error line each (about 40).
    proc = helpers.run_python("""
import sys; sys.path.insert(0, "tests")
import kerastrain as kt
kt.configure_cpu_devices(2)
import helpers
x, y = helpers.arrays(256)
kt.Trainer(helpers.build_model, strategy={"name": "mirrored", "cpu_devices": 2},
           verbose=0).fit((x, y), batch_size=16, epochs=1)
mirrored = kt.Trainer(helpers.build_model, strategy={"name": "mirrored", "cpu_devices": 2},
                      verbose=0)
mirrored.fit((x, y), batch_size=16, epochs=1)  # still alive at exit
one = kt.Trainer(helpers.build_model, strategy="one_device", verbose=0)
one.fit((x, y), batch_size=16, epochs=1)
ps = kt.Trainer(helpers.build_model, strategy={"name": "ps", "num_workers": 2, "num_ps": 1},
                verbose=0)
ps.fit((x, y), batch_size=16, epochs=1)
del one   # dropped once connected (a notebook's `trainer = ...` again): removed locally
import gc; gc.collect()
# Connected to the cluster, TensorFlow lists its tasks' devices too: mirrored again on this
# process's own two, training as one device does.
import numpy as np
runs = {}
for name in ("mirrored", "one_device"):
    import keras; keras.utils.set_random_seed(3)
    strategy = {"name": "mirrored", "cpu_devices": 2} if name == "mirrored" else name
    t = kt.Trainer(helpers.build_model, strategy=strategy, verbose=0)
    runs[name] = (t.fit((x, y), batch_size=16, epochs=2, shuffle=False).history["loss"],
                  t.model.get_weights(), list(t.strategy.extended.worker_devices))
print("mirrored devices:", runs["mirrored"][2])
np.testing.assert_allclose(runs["mirrored"][0], runs["one_device"][0], rtol=1e-5)
for a, b in zip(runs["mirrored"][1], runs["one_device"][1]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
print("trained")
""")
    assert proc.returncode == 0 and "trained" in proc.stdout, proc.stderr[-3000:]
    assert "Failed to remove function" not in proc.stderr, proc.stderr[-3000:]
    assert re.search(r"mirrored devices: \['/job:chief/replica:0/task:0/device:CPU:0', "
                     r"'/job:chief/replica:0/task:0/device:CPU:1'\]", proc.stdout), proc.stdout
