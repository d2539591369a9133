"""`kerastrain tune` (issue 54): sweeps whose trials are real `kerastrain run` processes.

Each test runs the command as a user does, on a tiny recipe (64 examples, 2-3 epochs), and
reads back what it left on disk: the Optuna study, each trial's folder, the HParams event
files, the MLflow store, best.yaml.
"""

import glob
import json
import os
import re
import signal

import pytest
import yaml

import helpers
from kerastrain.cli import command as cli

RECIPE = helpers.TINY_RECIPE.replace("num_examples: 256", "num_examples: 64").replace(
    "  args: {features: 8, hidden: 8}\n",
    "  args: {features: 8, hidden: 8}\n  compile: {optimizer: adam}\n").replace(
    "  batch_size: 32\n",
    "  validation:\n    builder: kerastrain.examples:synthetic_data\n"
    "    args: {num_examples: 32, features: 8, seed: 1}\n  batch_size: 32\n") + (
    "trainer: {epochs: 2, verbose: 0, seed: 0}\n"
    "checkpoints: {export: false, background: false}\ntensorboard: false\n")

LR = "model.compile.optimizer.learning_rate"


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def tune(recipe, space, *args, timeout=240):
    """The command as a user runs it (its own process): (exit code, output)."""
    proc = helpers.run_python(["-m", "kerastrain.cli", "tune", recipe, "--space", space, *args],
                              timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def study(sweep_dir):
    import optuna
    return optuna.load_study(study_name="kerastrain",
                             storage=f"sqlite:///{os.path.join(sweep_dir, 'study.db')}")


def epochs_of(trial_dir):
    with open(os.path.join(trial_dir, "sweep", "epochs.jsonl")) as f:
        return [json.loads(line)["epoch"] for line in f]


def test_parallel_trials_pruning_hparams_mlflow_and_a_best_recipe_that_runs(tmp_path, capsys):
    sweep_dir = str(tmp_path / "sweep")
    recipe = write(tmp_path, "recipe.yaml", RECIPE)
    # Two trials of one sound learning rate run at once: the same values and seed train to the
    # same losses, so whichever ends first, the other is never worse than the median (a median
    # pruner prunes what is strictly worse) however the two interleave. The third (10: Adam's
    # steps blow the weights up) starts when one of them is done and is pruned at its first
    # epoch.
    space = write(tmp_path, "space.yaml", f"""\
params:
  {LR}: {{float: [1.0e-4, 10.0], log: true}}
  model.args.hidden: [4, 8]
first_trials:
  - {{{LR}: 0.05, model.args.hidden: 8}}
  - {{{LR}: 0.05, model.args.hidden: 8}}
  - {{{LR}: 10.0, model.args.hidden: 4}}
trials: 3
parallel: 2
pruner: {{name: median, startup_trials: 1}}
sweep_dir: {sweep_dir}
""")
    code, out = tune(recipe, space, "--mlflow")
    assert code == 0, out
    assert "absl" not in out, out   # the sweep's own process never loads TensorFlow
    lines = out.splitlines()
    # Parallel: trials 0 and 1 both started before either ended, each pinned to its own half
    # of the cores (one each on 2 cores), where TensorFlow saw that many and no more.
    started = {int(m.group(1)): (i, set(m.group(2).split(","))) for i, line in enumerate(lines)
               for m in [re.match(r"trial ([01]) started on cores? ([\d,]+):", line)] if m}
    ended = [i for i, line in enumerate(lines) if re.match(r"trial [01] done", line)]
    assert len(started) == 2 and max(i for i, _ in started.values()) < min(ended), out
    assert not started[0][1] & started[1][1], out
    for number, (_, cores) in started.items():
        log = open(os.path.join(sweep_dir, f"trial-{number}", "trial.log")).read()
        assert f"({len(cores)} core(s) for this process)" in log, log
    # Pruning: one line with the reason; the run ended cleanly after that epoch.
    pruned = [line for line in lines if line.startswith("trial 2 pruned")]
    assert len(pruned) == 1 and re.fullmatch(
        r"trial 2 pruned at epoch 1: val_loss [\d.]+ above the median [\d.]+ of [12] completed "
        r"trials? at that epoch", pruned[0]), out
    assert epochs_of(os.path.join(sweep_dir, "trial-2")) == [1]
    log = open(os.path.join(sweep_dir, "trial-2", "trial.log")).read()
    assert "kerastrain: done: 1 epoch" in log and "ended early at epoch 1 of 2" in log, log
    states = {t.number: t.state.name for t in study(sweep_dir).trials}
    assert states == {0: "COMPLETE", 1: "COMPLETE", 2: "PRUNED"}

    # TensorBoard's HParams table: the experiment at the root, one session per trial.
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    def hparams_of(directory, tag):
        acc = event_accumulator.EventAccumulator(directory)
        acc.Reload()
        data = acc.SummaryMetadata(tag).plugin_data.content
        return acc, plugin_data_pb2.HParamsPluginData.FromString(data)

    _, root = hparams_of(sweep_dir, "_hparams_/experiment")
    assert {h.name for h in root.experiment.hparam_infos} == {LR, "model.args.hidden", "state"}
    assert "val_loss" in {m.name.tag for m in root.experiment.metric_infos}
    for trial in study(sweep_dir).trials:
        acc, session = hparams_of(os.path.join(sweep_dir, f"trial-{trial.number}", "hparams"),
                                  "_hparams_/session_start_info")
        values = session.session_start_info.hparams
        assert values[LR].number_value == pytest.approx(trial.params[LR])
        assert values["state"].string_value == {"COMPLETE": "complete",
                                                "PRUNED": "pruned"}[trial.state.name]
        if trial.value is not None:
            assert acc.Scalars("val_loss")[-1].value == pytest.approx(trial.value)

    # MLflow: a parent run for the sweep, a child run per trial.
    from mlflow.tracking import MlflowClient
    client = MlflowClient(f"sqlite:///{sweep_dir}/mlflow/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = {r.info.run_name: r for r in runs if r not in parents}
    assert len(parents) == 1 and set(children) == {"trial-0", "trial-1", "trial-2"}
    assert {r.data.tags["mlflow.parentRunId"] for r in children.values()} == {
        parents[0].info.run_id}
    best = min((t for t in study(sweep_dir).trials if t.value is not None), key=lambda t: t.value)
    assert parents[0].data.tags["best_trial"] == str(best.number)
    assert float(children[f"trial-{best.number}"].data.params[LR]) == pytest.approx(
        best.params[LR])

    # The table, and best.yaml, which `kerastrain run` takes as it is.
    assert re.search(rf"^  1 +{best.number} +{best.value:.4g} ", out, flags=re.M), out
    best_yaml = os.path.join(sweep_dir, "best.yaml")
    tree = yaml.safe_load(open(best_yaml))
    assert tree["model"]["compile"]["optimizer"]["learning_rate"] == pytest.approx(best.params[LR])
    assert "callbacks" not in tree and "mlflow" not in tree   # the user's recipe, not the trial's
    assert cli.main(["run", best_yaml]) == 0
    assert "kerastrain: done: 2 epochs" in capsys.readouterr().out
    assert os.path.exists(os.path.join(sweep_dir, f"best-trial-{best.number}", "recipe.yaml"))


def test_a_sweep_killed_with_sigkill_resumes_where_it_was(tmp_path):
    sweep_dir = str(tmp_path / "sweep")
    recipe = write(tmp_path, "recipe.yaml", RECIPE.replace("epochs: 2", "epochs: 4"))
    space = write(tmp_path, "space.yaml", f"""\
params:
  {LR}: {{float: [1.0e-3, 0.1], log: true}}
trials: 2
parallel: 1
sampler: {{name: random, seed: 0}}
pruner: none
sweep_dir: {sweep_dir}
""")
    args = ["-m", "kerastrain.cli", "tune", recipe, "--space", space]
    first = helpers.Child(args)
    try:
        first.wait_for(r"^trial 0 done")
        # Its checkpoints of epochs 1 and 2 are written; two epochs, each waiting for the
        # sweep's verdict, and the end of its process are still ahead of it.
        first.wait_for(r"^trial 1 epoch 2:")
        first.process.send_signal(signal.SIGKILL)
    finally:
        first.finish(timeout=60)
    values = {t.number: t.params for t in study(sweep_dir).trials}
    assert {t.number: t.state.name for t in study(sweep_dir).trials} == {
        0: "COMPLETE", 1: "RUNNING"}

    code, out = tune(recipe, space)
    assert code == 0, out
    assert "1 trial(s) kept, 1 interrupted" in out, out
    assert re.search(r"^trial 1 resumed on core", out, flags=re.M), out
    assert not re.search(r"^trial 0 (started|resumed)", out, flags=re.M), out
    trials = study(sweep_dir).trials
    assert {t.number: t.state.name for t in trials} == {0: "COMPLETE", 1: "COMPLETE"}
    assert {t.number: t.params for t in trials} == values   # the same values, run once
    assert sorted(n for n in os.listdir(sweep_dir) if not n.startswith("events.out")) == [
        "best.yaml", "study.db", "sweep.json", "trial-0", "trial-1"]
    # Trial 0 ran once; trial 1 went on from its checkpoint: epoch 1 was never trained again,
    # and it ran to its end after the restart.
    headers = [open(os.path.join(sweep_dir, f"trial-{n}", "trial.log")).read().count(
        "# kerastrain tune,") for n in (0, 1)]
    assert headers == [1, 2]
    assert epochs_of(os.path.join(sweep_dir, "trial-0")) == [1, 2, 3, 4]
    resumed = epochs_of(os.path.join(sweep_dir, "trial-1"))
    assert resumed.count(1) == 1 and resumed[-1] == 4, resumed


BAD_SPACES = [
    # (name, the space's params/keys, the line's marker, the key named, words of the message)
    ("unknown recipe key", "params:\n  model.argz.hidden: [4, 8]\n", "argz",
     "params.model.argz.hidden", "the recipe refuses the value 4: model.argz: unknown key. "
                                 "Did you mean 'args'?"),
    ("builder argument", "params:\n  model.args.hiden: [4, 8]\n", "hiden",
     "params.model.args.hiden", "takes no argument 'hiden'. Did you mean 'hidden'?"),
    ("empty range", "params:\n  model.args.hidden: {int: [64, 8]}\n", "hidden",
     "params.model.args.hidden", "empty range: low must be below high"),
    ("schema refuses", "params:\n  data.batch_size: [0, 32]\n", "batch_size",
     "params.data.batch_size", "the recipe refuses the value 0: data.batch_size: expected an "
                               "int >= 1 or null. Received: 0"),
    ("unknown sampler", "params:\n  model.args.hidden: [4, 8]\nsampler: tpee\n", "sampler",
     "sampler", "unknown sampler (did you mean 'tpe'?); expected one of tpe, random. "
                "Received: \"tpee\""),
    ("unknown space key", "params:\n  model.args.hidden: [4, 8]\ntrails: 3\n", "trails",
     "trails", "unknown key. Did you mean 'trials'?"),
    ("log of zero", "params:\n  model.args.hidden: {int: [0, 8], log: true}\n", "hidden",
     "params.model.args.hidden", "log: true needs low > 0"),
    ("unmeasured objective", "params:\n  model.args.hidden: [4, 8]\nobjective: {metric: "
     "val_loss}\n", "objective", "objective.metric", "the recipe has none"),
]


@pytest.mark.parametrize("name, text, marker, key, words", BAD_SPACES,
                         ids=[b[0] for b in BAD_SPACES])
def test_a_bad_space_is_refused_with_its_line_before_anything_runs(
        tmp_path, capsys, name, text, marker, key, words):
    recipe = RECIPE if name != "unmeasured objective" else RECIPE.split("  validation:")[0] + \
        "  batch_size: 32\n" + RECIPE.split("  batch_size: 32\n")[1]
    recipe_path = write(tmp_path, "recipe.yaml", recipe)
    space = write(tmp_path, "space.yaml", text + f"sweep_dir: {tmp_path / 'sweep'}\n")
    assert cli.main(["tune", recipe_path, "--space", space]) == 2
    err = capsys.readouterr().err
    line = next(i for i, s in enumerate(text.splitlines(), 1) if marker in s)
    assert re.search(rf"space\.yaml:{line}: {re.escape(key)}: .*{re.escape(words)}", err), err
    assert err.startswith(f"kerastrain: {space}: 1 problem in the search space:"), err
    assert not os.path.exists(tmp_path / "sweep")   # nothing ran, nothing was made


def test_every_problem_of_a_space_is_reported_at_once_in_the_files_order(tmp_path, capsys):
    recipe = write(tmp_path, "recipe.yaml", RECIPE)
    space = write(tmp_path, "space.yaml", f"""\
params:
  model.argz.hidden: [64, 128]
  {LR}: {{float: [1.0e-4, 1.0e-2], log: true}}
  data.batch_size: [0, 32]
trials: 8
parallel: 2
sampler: tpee
""")
    assert cli.main(["tune", recipe, "--space", space]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"kerastrain: {space}: 3 problems in the search space:"
    assert [re.match(r"  .*space\.yaml:(\d+): ([\w.]+):", line).groups() for line in lines[1:]] == [
        ("2", "params.model.argz.hidden"), ("4", "params.data.batch_size"), ("7", "sampler")]


def test_a_folder_of_another_search_or_of_no_sweep_is_refused(tmp_path, capsys):
    recipe = write(tmp_path, "recipe.yaml", RECIPE)
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    (sweep_dir / "notes.txt").write_text("mine")
    space = write(tmp_path, "space.yaml",
                  f"params:\n  model.args.hidden: [4, 8]\nsweep_dir: {sweep_dir}\n")
    assert cli.main(["tune", recipe, "--space", space]) == 2
    err = capsys.readouterr().err
    assert "holds files and no sweep.json, so it is not a sweep's folder" in err, err
    assert os.listdir(sweep_dir) == ["notes.txt"]

    (sweep_dir / "notes.txt").unlink()
    (sweep_dir / "sweep.json").write_text(json.dumps({
        "recipe": yaml.safe_load(RECIPE), "params": {"model.args.hidden": "one of 4, 16"},
        "objective": "minimize val_loss"}))
    assert cli.main(["tune", recipe, "--space", space]) == 2
    err = capsys.readouterr().err
    assert ("holds a sweep of another search" in err and
            'params: model.args.hidden "one of 4, 16" before, "one of 4, 8" now' in err), err
    assert sorted(os.listdir(sweep_dir)) == ["sweep.json"]


def test_trials_run_in_ray_actors_with_ray(tmp_path):
    pytest.importorskip("ray", reason="Ray is an optional extra (the test extra installs it)")
    sweep_dir = str(tmp_path / "sweep")
    recipe = write(tmp_path, "recipe.yaml", RECIPE)
    space = write(tmp_path, "space.yaml", f"params:\n  {LR}: [0.01, 0.05]\n"
                                          f"first_trials: [{{{LR}: 0.01}}, {{{LR}: 0.05}}]\n"
                                          f"trials: 2\nparallel: 2\nsweep_dir: {sweep_dir}\n")
    code, out = tune(recipe, space, "--ray")
    assert code == 0, out
    assert "kerastrain tune: network: every trial and Ray runs in one private network " \
        "namespace" in out, out
    assert sorted(re.findall(r"^trial (\d) started in the Ray actor of slot (\d)", out, re.M)) \
        == [("0", "0"), ("1", "1")], out
    assert {t.number: t.state.name for t in study(sweep_dir).trials} == {
        0: "COMPLETE", 1: "COMPLETE"}
    log = open(os.path.join(sweep_dir, "trial-1", "trial.log")).read()
    assert "Ray actor slot-1" in log and "kerastrain: done: 2 epochs" in log, log


def test_cores_are_shared_out_between_trials():
    from kerastrain.cli.tune import trials
    assert trials.core_slots(2, cores={0, 1}) == [(0,), (1,)]
    assert trials.core_slots(2, cores=range(4)) == [(0, 1), (2, 3)]
    assert trials.core_slots(3, cores={0, 1}) == [(0,), (1,), (0,)]
    assert trials.core_slots(1, cores={5, 3}) == [(3, 5)]


def test_the_shipped_space_checks_against_the_quickstart_recipe():
    from kerastrain.cli import recipes
    from kerastrain.cli.tune import space
    recipe = os.path.join(helpers.REPO, "recipes", "quickstart.yaml")
    shipped = space.load(os.path.join(helpers.REPO, "recipes", "quickstart.space.yaml"))
    tree, positions = recipes.read(recipe)
    space.check_recipe(shipped, tree, positions)
    assert {p.key for p in shipped.params} == {LR, "model.args.hidden"}
    assert glob.glob(os.path.join(helpers.REPO, "docs", "sweeps.md"))


def test_a_launched_cluster_per_trial_is_kerastrain_launch_with_its_flags(tmp_path, capsys):
    import kerastrain
    from kerastrain.cli.tune import sweep
    assert kerastrain.Sweep is sweep.Sweep   # the Python API, beside Trainer
    recipe = write(tmp_path, "recipe.yaml", RECIPE + "strategy: multi_worker_mirrored\n")
    space = {"params": {LR: [0.01, 0.1]}, "launch": {"workers": 2},
             "sweep_dir": str(tmp_path / "sweep")}
    argv = sweep.Sweep(recipe, space).command(3, {LR: 0.1}, str(tmp_path / "t3"), None)
    assert argv[2:7] == ["kerastrain.cli", "launch", recipe, "--workers", "2"]
    assert f"{LR}=0.1" in argv and f"trainer.model_dir=\"{tmp_path / 't3'}\"" in argv
    # A cluster the recipe's strategy cannot use is refused before anything runs.
    space_file = write(tmp_path, "space.yaml", f"params:\n  {LR}: [0.01, 0.1]\n"
                                               f"launch: {{workers: 2, ps: 1}}\n")
    assert cli.main(["tune", recipe, "--space", space_file]) == 2
    err = capsys.readouterr().err
    assert "space.yaml:3: launch: --ps 1 gives parameter servers to a recipe whose strategy " \
           "is 'multi_worker_mirrored'" in err, err


def test_a_different_best_yaml_is_kept_not_overwritten(tmp_path):
    from kerastrain.cli.tune import records
    path = str(tmp_path / "best.yaml")
    records.write_kept(path, "a: 1\n")
    records.write_kept(path, "a: 1\n")            # the same best again: nothing kept twice
    records.write_kept(path, "a: 2\n")            # a later best: the earlier one is kept
    assert sorted(os.listdir(tmp_path)) == ["best.yaml", "best.yaml.previous-1"]
    assert open(path + ".previous-1").read() == "a: 1\n" and open(path).read() == "a: 2\n"
