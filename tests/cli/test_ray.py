"""`kerastrain launch --ray`: the job `kerastrain launch` runs, each task in a Ray actor.

Each test starts a Ray cluster of its own inside the launcher's private network namespace
(loopback only), as a user's `kerastrain launch --ray` does: nothing it starts is reachable
from outside. The results are compared with what a local launch is tested to give (one
device's weights exactly, for multi-worker mirrored) and its fault handling.
"""

import re

import pytest

import helpers
from test_clusters import PS_RECIPE, Launch, _alive, _sets, assert_export_matches_one_device

pytestmark = pytest.mark.multiprocess
pytest.importorskip("ray", reason="Ray is an optional extra: pip install -e '.[test]' installs "
                                  "it (as CI does)")


SCRIPT = """\
import helpers
import kerastrain as kt

trainer = kt.Trainer(helpers.build_model, helpers.global_batch_dataset_fn(96), seed=0,
                     strategy="multi_worker_mirrored", model_dir=MODEL_DIR, verbose=2,
                     tensorboard=False)
trainer.fit(epochs=2)
"""


def test_a_users_trainer_script_on_ray_actors_trains_exactly_as_one_device(tmp_path):
    """`kerastrain launch train.py --workers 2 --ray`: the user's own script, a Trainer under
    multi-worker mirrored, on two actors; the chief's export equals one device's training
    (as a local launch's is tested to)."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.replace("MODEL_DIR", repr(str(tmp_path / "run"))))
    run = Launch([str(script), "--workers", "2", "--ray"])
    assert run.finish(timeout=300) == 0, run.text[-6000:]
    # One actor per task, in the launcher's private namespace; output prefixed as launch does.
    for task in ("worker:0", "worker:1"):
        assert re.search(rf"\[launch\] started {task} \(pid \d+\) in a Ray actor on "
                         r"\(127\.0\.0\.1\)", run.text), run.text[-4000:]
    assert "[launch] network: every task runs in one private network namespace" in run.text
    assert "[worker:1] kerastrain: strategy: multi_worker_mirrored (2 workers from TF_CONFIG, " \
        "this is worker:1)" in run.text
    # Ray's start-up lines about a cluster it cannot see from here are held back.
    assert "Failed to determine local IP" not in run.text
    assert "Token authentication is enabled" not in run.text
    assert_export_matches_one_device(tmp_path / "run")
    assert "[launch] job finished: worker:0 exited with 0" in run.text
    assert not [p for p in run.pids() if _alive(p)]


def test_parameter_servers_on_ray_actors_restart_a_killed_worker_and_finish(tmp_path):
    """The fault plan kills worker:1 through its actor once a checkpoint of step 12 exists:
    the launcher restarts it in the same actor, at the same address, and the job ends at
    its exact step; a side-car evaluator runs in an actor of its own."""
    run = Launch([PS_RECIPE, "--workers", "2", "--ps", "1", "--evaluator", "--ray",
                  "--fault", "kill worker:1 at step 12", *_sets([
                      "trainer.epochs=2", "data.train.args.num_examples=6144",
                      "data.validation.args.num_examples=256", "trainer.steps_per_loop=2",
                      "trainer.verbose=2", "checkpoints.every_steps=12",
                      "tensorboard.log_every_steps=0", f"trainer.model_dir={tmp_path}"])])
    assert run.finish(timeout=300) == 0, run.text[-6000:]
    for task in ("chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0"):
        assert f"[launch] started {task} (pid" in run.text
    # The side-car evaluator in its actor evaluated the final checkpoint, then stopped.
    assert re.search(r"\[evaluator:0\] kerastrain: evaluator: step 48: loss", run.text), \
        run.text[-4000:]
    assert "[launch] fault: killed worker:1 (kill worker:1 at step 12)" in run.text
    assert "[launch] worker:1 exited with signal SIGKILL; restarting it (1/3)" in run.text, \
        run.text[-6000:]
    assert len(re.findall(r"\[launch\] started worker:1 \(pid \d+\) in a Ray actor",
                          run.text)) == 2
    assert re.search(r"\[chief:0\] kerastrain: done: 2 epochs, step 48,", run.text)
    assert "[launch] job finished: chief:0 exited with 0" in run.text
    assert not [p for p in run.pids() if _alive(p)]


def test_ray_options_that_cannot_work_are_refused_before_anything_starts(tmp_path):
    cases = {
        ("--ray", "auto"): r"`--ray auto` joins a running Ray cluster over the network.*"
                           r"Received: --network private. Add --network host",
        ("--ray", "--service-workers", "1"): r"does not start tf.data service workers yet. "
                                             r"Received: --service-workers 1",
        ("--ray", "--network", "multihost"): r"two places to run: choose one",
        ("--set", "trainer.epochs=1"): r"A launched script sets up its own Trainer.*"
                                        r"Received: --set with .*train\.py",
    }
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('never run')\n")
    for extra, message in cases.items():
        target = str(script) if extra[0] == "--set" else PS_RECIPE
        proc = helpers.run_python(["-m", "kerastrain.cli", "launch", target, "--workers", "1",
                                   "--ps", "1", *extra], timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert re.search(message, proc.stderr), proc.stderr
        assert "[launch] started" not in proc.stdout


def test_an_elastic_job_on_ray_actors_goes_on_smaller_when_a_host_is_removed(tmp_path):
    """`--workers 1:2 --ray`: worker:1's host removed at step 40; the job restarts on one
    actor from its last checkpoint and ends at step 400 with one device's weights."""
    from test_elastic import _recipe, _weights_match_one_device
    run = Launch([_recipe(tmp_path), "--workers", "1:2", "--ray",
                  "--fault", "remove worker:1 at step 40"])
    assert run.finish(timeout=300) == 0, run.text[-6000:]
    assert re.search(r"\[launch\] worker:1 lost for good \(host worker-1 removed\); going on "
                     r"with 1 worker\(s\) \(min 1\) from step \d+", run.text), run.text[-6000:]
    assert "(1 workers from TF_CONFIG, this is worker:0)" in run.text
    assert "step 400," in run.wait_for(r"\[worker:0\] kerastrain: done:").string
    _weights_match_one_device(tmp_path / "run")
