"""`kerastrain launch --workers MIN:MAX`: an elastic job on real processes, and its refusals."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import helpers
from test_clusters import PS_RECIPE, QUICKSTART, Launch, _alive, _sets
from kerastrain.cli import elastic

# 2 epochs of 200 global batches of 16 (helpers.global_batch_dataset_fn: each worker takes its
# share of every global batch, so the batches are one device's at every size). One step a
# loop and a checkpoint every 10 steps keep a size change within an epoch.
ELASTIC_RECIPE = """\
model: {builder: helpers:build_model}
data:
  train: {builder: helpers:global_batch_dataset_fn, args: {n: 3200}}
strategy: multi_worker_mirrored
trainer: {epochs: 2, seed: 0, verbose: 2, steps_per_loop: 1, model_dir: MODEL_DIR}
checkpoints: {every_steps: 10}
tensorboard: false
"""


def _recipe(tmp_path):
    recipe = tmp_path / "elastic.yaml"
    recipe.write_text(ELASTIC_RECIPE.replace("MODEL_DIR", str(tmp_path / "run")))
    return str(recipe)


def _launch_cli(*args):
    return subprocess.run([sys.executable, "-m", "kerastrain.cli", "launch", *args],
                          capture_output=True, text=True, cwd=helpers.REPO,
                          env=helpers.child_env(tests=True), timeout=120)


@pytest.mark.parametrize("value", ["3:2", "0:2", "a:b", "2:", ":3", "0"])
def test_bad_workers_values_are_refused_saying_the_form(value):
    with pytest.raises(ValueError, match=re.escape(
            f"`--workers` must be N or MIN:MAX with 1 <= MIN <= MAX (an elastic job: at least "
            f"MIN workers, at most MAX). Received: --workers {value}")):
        elastic.parse_workers(value)
    assert elastic.parse_workers("2:4") == (2, 4) and elastic.parse_workers("3") == (3, 3)


def test_what_an_elastic_launch_cannot_do_yet_is_refused_in_one_line(tmp_path):
    done = _launch_cli(QUICKSTART, "--workers", "3:2", "--dry-run")
    assert done.returncode == 2 and "Received: --workers 3:2" in done.stderr, done.stderr
    script = tmp_path / "train.py"
    script.write_text("")
    done = _launch_cli(str(script), "--workers", "1:2", "--dry-run")
    assert done.returncode == 2 and "resumes each new size from the recipe's model_dir, which " \
        f"the launcher reads. Received: --workers 1:2 with a script" in done.stderr, done.stderr
    done = _launch_cli(QUICKSTART, "--workers", "2", "--fault", "remove worker:1 at step 8",
                       "--dry-run")
    assert done.returncode == 2 and "`--fault remove` changes an elastic job's hosts: it " \
        "needs `--workers MIN:MAX`" in done.stderr, done.stderr


def test_exported_jobs_say_how_they_take_a_change_of_size(capsys):
    """Slurm takes a node range (`--nodes=2-4`) and says what it does with it; a TFJob has a
    fixed size, refuses MIN:MAX and says so in its first lines."""
    from kerastrain.cli import command as cli
    from kerastrain.cli import manifests
    assert cli.main(["export", "slurm", "recipes/multi_worker.yaml", "--nodes", "2:4", "--set",
                     "trainer.model_dir=/shared/run"]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --nodes=2-4" in script and "# Elastic: Slurm starts the job on 2 to 4 " \
        "nodes" in script and "Not supported: resizing a running allocation" in script
    assert cli.main(["export", "k8s", "recipes/multi_worker.yaml", "--workers", "2:4",
                     "--volume", "runs"]) == 2
    assert "a TFJob has a fixed size" in capsys.readouterr().err
    assert cli.main(["export", "k8s", "recipes/multi_worker.yaml", "--workers", "2",
                     "--volume", "runs"]) == 0
    assert capsys.readouterr().out.startswith(manifests.K8S_SIZE_NOTE)


def test_below_min_at_the_start_starts_nothing(tmp_path):
    capacity = tmp_path / "capacity"
    capacity.write_text("1\n")
    done = _launch_cli(_recipe(tmp_path), "--workers", "2:3", "--capacity-file", str(capacity))
    assert done.returncode == elastic.BELOW_MIN, done.stdout + done.stderr
    assert f"[launch] elastic: 1 worker(s) available (capacity file {capacity} says 1), below " \
        "the minimum 2: not starting (exit 69)" in done.stdout, done.stdout
    assert "started" not in done.stdout


def _weights_match_one_device(model_dir, n=3200, atol=1e-5):
    """The export holds what 2 epochs of `ELASTIC_RECIPE` give on one device: every global
    batch trained once, in order, across the size changes."""
    import keras

    import kerastrain as kt
    reference = kt.Trainer(helpers.build_model, helpers.global_batch_dataset_fn(n),
                           strategy="one_device", seed=0, verbose=0, steps_per_loop=1)
    reference.fit(epochs=2)
    exported = keras.saving.load_model(os.path.join(model_dir, "export", "model.keras"))
    for got, want in zip(exported.get_weights(), reference.model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=0, atol=atol)


@pytest.mark.multiprocess
def test_a_multi_worker_job_loses_a_host_for_good_goes_on_smaller_then_grows_back(tmp_path):
    """2 workers; worker:1's host removed once a checkpoint of step 40 exists: the job restarts
    at 1 worker from its last checkpoint; the host returns at step 120: every worker saves the
    step it reached (SIGTERM) and the job restarts at 2 from exactly there. It ends at step
    400 with one device's weights (the global batch is kept at every size)."""
    run = Launch([_recipe(tmp_path), "--workers", "1:2", "--fault", "remove worker:1 at step 40",
                  "--fault", "return worker:1 at step 120"])
    assert run.finish() == 0, run.text[-6000:]
    assert "[launch] elastic: 1 to 2 workers; starting with 2" in run.text
    lost = re.search(r"\[launch\] worker:1 lost for good \(host worker-1 removed\); going on "
                     r"with 1 worker\(s\) \(min 1\) from step (\d+)", run.text)
    assert lost, run.text[-6000:]
    assert f"kerastrain: resumed from {tmp_path}/run/checkpoints/ckpt-{lost.group(1)}: step " \
        f"{lost.group(1)}" in run.text
    assert "(1 workers from TF_CONFIG, this is worker:0)" in run.text
    saved = re.search(r"\[worker:0\] kerastrain: SIGTERM in the cluster: all workers saved step "
                      r"(\d+)", run.text)
    assert saved, run.text[-6000:]
    assert f"[launch] growing to 2 worker(s) (max 2) from step {saved.group(1)}" in run.text
    assert "WARNING:tensorflow" not in run.text   # its note on its own deprecated property
    assert run.text.count("(2 workers from TF_CONFIG, this is worker:1)") == 2
    assert "step 400," in run.wait_for(r"\[worker:0\] kerastrain: done:").string
    assert "restarting every task" not in run.text   # size changes are not --max-restarts
    _weights_match_one_device(tmp_path / "run")
    assert not [p for p in run.pids() if _alive(p)]


@pytest.mark.multiprocess
def test_a_ps_job_goes_on_without_a_worker_lost_for_good_and_ends_at_its_step(tmp_path):
    """worker:1's host removed: it is not restarted, the coordinator runs its steps on
    worker:0, and the job ends normally at the exact step count."""
    run = Launch([PS_RECIPE, "--workers", "1:2", "--ps", "1",
                  "--fault", "remove worker:1 at step 32", *_sets([
                      "trainer.epochs=2", "data.train.args.num_examples=16384",
                      "data.validation.args.num_examples=256", "trainer.verbose=2",
                      "trainer.steps_per_loop=4", "checkpoints.every_steps=16",
                      "tensorboard=false", f"trainer.model_dir={tmp_path}"])])
    assert run.finish() == 0, run.text[-6000:]
    assert re.search(r"\[launch\] worker:1 lost for good \(host worker-1 removed\); going on "
                     r"with 1 worker\(s\) \(min 1\), no restart: the coordinator runs its steps "
                     r"on the others \(last checkpoint: step \d+\)", run.text), run.text[-6000:]
    assert "restarting it" not in run.text and run.text.count("started worker:1") == 1
    assert "step 128," in run.wait_for(r"\[chief:0\] kerastrain: done:").string
    assert "[launch] job finished: chief:0 exited with 0" in run.text


@pytest.mark.multiprocess
def test_below_min_while_running_stops_the_job_saying_where_it_resumes(tmp_path):
    """`--workers 2:2` with a capacity file: once it says 1, the job stops with 69."""
    capacity = tmp_path / "capacity"
    capacity.write_text("2\n")
    run = Launch([_recipe(tmp_path), "--workers", "2:2", "--capacity-file", str(capacity)])
    run.wait_for(r"\[worker:0\] kerastrain: checkpoint saved at step 20\b")
    capacity.write_text("1\n")
    assert run.finish() == elastic.BELOW_MIN, run.text[-6000:]
    assert re.search(rf"\[launch\] 1 worker\(s\) lost \(capacity file {capacity} says 1\); 1 "
                     r"worker\(s\) left, below the minimum 2: stopping the job \(exit 69\); run "
                     r"it again when workers are back: it resumes from step \d+", run.text), \
        run.text[-4000:]
    assert not [p for p in run.pids() if _alive(p)]


@pytest.mark.multiprocess
def test_a_multihost_rehearsal_removes_the_chiefs_host_for_good_and_goes_on_on_the_other(
        tmp_path):
    """Each worker a host of its own (`--network multihost`); worker:0's host, the chief's,
    removed at step 40: the job goes on at 1 worker, which runs on host worker-1 (the slot
    that is left, now worker:0), and ends at step 400 with one device's weights."""
    run = Launch([_recipe(tmp_path), "--workers", "1:2", "--network", "multihost",
                  "--fault", "remove worker:0 at step 40"])
    assert run.finish() == 0, run.text[-6000:]
    assert re.search(r"\[launch\] worker:0 lost for good \(host worker-0 removed\); going on "
                     r"with 1 worker\(s\) \(min 1\) from step \d+", run.text), run.text[-6000:]
    after = run.text.split("lost for good", 1)[1]
    # The chief's lock names host worker-0, which the chief on worker-1 cannot check: the
    # launcher, which saw that process end, removes it.
    assert re.search(r"\[launch\] removed the model_dir lock left by worker:0 \(pid \d+ on "
                     r"host worker-0, which has ended\)", after), after[:3000]
    assert re.search(r"\[launch\] started worker:0 \(pid \d+\) on host worker-1 "
                     r"\(198\.18\.0\.\d+\)", after), after[:3000]
    assert "step 400," in run.wait_for(r"\[worker:0\] kerastrain: done:").string
    _weights_match_one_device(tmp_path / "run")


def test_the_slots_available_follow_the_fault_plan_the_capacity_file_and_lost_workers(
        tmp_path):
    capacity = tmp_path / "capacity"
    job = elastic.Elastic(2, 4, build=None, capacity_file=str(capacity))
    assert job.available() == ["worker-0", "worker-1", "worker-2", "worker-3"]  # no file yet
    capacity.write_text("3\n")
    assert job.available() == ["worker-0", "worker-1", "worker-2"]
    job.gone["worker-1"] = "host worker-1 removed"
    assert job.available() == ["worker-0", "worker-2", "worker-3"]
    job.lost.add("worker-3")
    assert job.available() == ["worker-0", "worker-2"]
    assert job.why_fewer(["worker-1", "worker-3"]) == "host worker-1 removed; lost for good"
    said = []
    capacity.write_text("1\n")
    assert job.first_slots(said.append) is None
    assert said == [f"elastic: 1 worker(s) available (host worker-1 removed; lost for good), "
                    f"below the minimum 2: not starting (exit 69)"]


class _Launcher:
    """What `Elastic.after` reads of a launcher."""

    def __init__(self, tasks):
        self.tasks, self.max_restarts, self.outages, self.said = tasks, 0, None, []

    def say(self, text, act=None):
        self.said.append(text)


def test_past_its_restarts_a_killed_worker_is_lost_for_good_and_a_failing_job_fails():
    """A worker that a signal ended (its host lost) shrinks the job; an error of the program's
    own (exit 1 in every task) fails it as without MIN:MAX, instead of shrinking it to MIN."""
    from kerastrain.cli.tasks import Task
    built = []

    def build(slots):
        built.append(slots)
        return [Task("worker", i, "", [], slot=slot) for i, slot in enumerate(slots)]

    job = elastic.Elastic(1, 2, build=build)
    launcher = _Launcher(build(["worker-0", "worker-1"]))
    assert job.after(launcher, 1, {"worker:0": 1, "worker:1": 1}, exhausted=True) == "restart"
    assert job.after(launcher, 1, {"worker:0": 1, "worker:1": -9}, exhausted=False) == "restart"
    assert built[-1] == ["worker-0", "worker-1"] and not launcher.said
    assert job.after(launcher, 1, {"worker:0": 1, "worker:1": -9}, exhausted=True) == "resized"
    assert built[-1] == ["worker-0"]
    assert launcher.said == ["worker:1 lost for good (worker:1 ended by a signal after "
                             "--max-restarts 0); going on with 1 worker(s) (min 1) from step "
                             "None"]


def test_a_ps_job_restarted_after_a_ps_failure_restarts_on_the_slots_available_then():
    from kerastrain.cli.tasks import Task

    def build(slots):
        return [Task("chief", 0, "", [])] + [
            Task("worker", i, "", [], slot=slot) for i, slot in enumerate(slots)]

    job = elastic.Elastic(1, 2, build=build, ps=True)
    launcher = _Launcher(build(["worker-0", "worker-1"]))
    job.gone["worker-0"] = "host worker-0 removed"
    assert job.after(launcher, 1, {}, exhausted=False) == "restart"
    assert [(t.name, t.slot) for t in launcher.tasks] == [("chief:0", None),
                                                         ("worker:0", "worker-1")]
    assert launcher.said == ["the job restarts with 1 worker(s) (min 1, max 2): the slots "
                             "available now"]
