"""`kerastrain tune`: a sweep whose trials are real kerastrain runs, searched with Optuna.

    sweep = kt.Sweep("recipes/quickstart.yaml", "recipes/quickstart.space.yaml")
    result = sweep.run()          # prints a line per trial, then the best ones
    result.best["values"]         # {'model.args.hidden': 181, ...}; result.best_recipe: best.yaml

Everything is checked before anything runs (the recipe, the space, each value of the space
against the recipe's schema, the sweep folder). The sweep folder holds the study
(`study.db`), `sweep.json` (what is searched: a folder of another search is refused), a folder
per trial (`trial-N`: the run's model_dir) and, at the end, `best.yaml`. A sweep started again
on its folder goes on: finished trials are kept, a trial that was running is run again in its
folder, where kerastrain resumes it from its checkpoint (docs/sweeps.md).
"""

from __future__ import annotations

import dataclasses
import json
import os

from kerastrain.cli import manifests, ray_cluster, recipes
from kerastrain.io import locks, tracking   # no TensorFlow; MLflow only once a writer opens
from kerastrain.cli.tune import records
from kerastrain.cli.tune.loop import Loop
from kerastrain.cli.tune import space as space_lib
from kerastrain.cli.tune import study as study_lib
from kerastrain.cli.tune import trials as trials_lib


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """What a sweep found: `best` is {"trial", "value", "values", "directory"} (None when no
    trial completed); `best_recipe` the path of best.yaml; `counts` trials by state."""

    sweep_dir: str
    best: dict | None
    best_recipe: str | None
    counts: dict


class Sweep:
    """A search over recipe keys, each trial a `kerastrain run` of the recipe with its values.

    Args:
        recipe: the recipe file.
        space: the search space, a YAML file (docs/sweeps.md) or the same as a mapping.
        sets: `--set key=value` overrides for every trial, applied before the trial's values.
        sweep_dir, trials, parallel: override the space's keys.
        mlflow: a parent MLflow run with a child per trial (also when the recipe has `mlflow:`).
        ray: run each trial in a Ray actor: "local" (a Ray cluster started here) or a running
            cluster's address, whose every node sees the sweep folder at the same path.
        say: where the sweep's lines go.

    Raises:
        kerastrain.config.RecipeError: the recipe has problems.
        kerastrain.cli.tune.space.SpaceError: the space has problems (each with its file:line).
        ValueError: the sweep folder holds another search, or is not a sweep's folder.
    """

    def __init__(self, recipe, space, *, sets=(), sweep_dir=None, trials=None, parallel=None,
                 mlflow=False, ray=None, say=print):
        self.recipe_path, self.sets, self.say, self.ray = str(recipe), list(sets), say, ray
        study_lib.require_optuna()   # a missing extra is said before anything else
        tree, positions = recipes.read(self.recipe_path, self.sets)
        recipes.import_from(self.recipe_path)   # the builders, as `kerastrain run` finds them
        self.recipe, _ = recipes.check(tree, positions)
        self.space = space_lib.load(space, recipe=(tree, positions), trials=trials,
                                    parallel=parallel, sweep_dir=sweep_dir)
        if self.space.sweep_dir is None:
            raise ValueError("A sweep needs a folder: give `sweep_dir` (in the space or as an "
                             "argument). Received: sweep_dir=None")
        if self.space.launch is not None:   # as `kerastrain launch` would refuse it, once
            manifests.check_ps_for(self.recipe.strategy["name"], self.space.launch["ps"],
                                   command=f"{self.space.where('launch')}: launch")
        self.tree, self.sweep_dir = tree, os.path.abspath(self.space.sweep_dir)
        self.mlflow = bool(mlflow or self.recipe.mlflow)
        self.identity = {"recipe": json.loads(json.dumps(tree)), **self.space.identity()}
        _refuse_other_sweeps(self.sweep_dir, self.identity)

    def run(self) -> SweepResult:
        """Run the trials still to run (all, or what a sweep before left), then say the best."""
        lock = _claim(self.sweep_dir, self.identity)
        parent = hosts = None
        try:
            study = study_lib.Study(self.sweep_dir, self.space)
            parent = self._open_mlflow() if self.mlflow else None
            self.say(self._opening(study))
            if self.ray is not None:   # an actor per slot, each running its trials in turn
                hosts = ray_cluster.RayHosts([f"slot-{i}" for i in range(self.space.parallel)],
                                             address=None if self.ray == "local" else self.ray)
            Loop(self, study, parent, hosts).run()
            return self._finish(study, parent)
        finally:
            for opened in (hosts, parent):
                if opened is not None:
                    opened.close()
            lock.release()

    # -- what trials get ----------------------------------------------------------------------

    def command(self, number, values, directory, parent):
        extra = []
        if self.recipe.tensorboard is not False:   # the sweep writes the HParams rows itself
            extra.append(space_lib.override("tensorboard.hparams", {}))
        if parent is not None:
            options = self.recipe.mlflow if isinstance(self.recipe.mlflow, dict) else {}
            extra.append(space_lib.override("mlflow", {
                **options, "tracking_uri": parent.tracking_uri, "run_name": f"trial-{number}",
                "experiment": parent.options.experiment, "parent_run_id": parent.run_id}))
        return trials_lib.command(self.recipe_path, self.sets, values, directory,
                                  self.tree.get("callbacks"), extra, self.space.launch)

    def trial_epochs(self, values) -> int:
        return values.get("trainer.epochs", self.recipe.trainer.epochs)

    # -- the sweep's own lines and records --------------------------------------------------

    def _open_mlflow(self):
        options = self.recipe.mlflow if isinstance(self.recipe.mlflow, dict) else {}
        params = {f"space.{p.key}": p.describe() for p in self.space.params}
        params.update({"recipe": self.recipe_path, "objective": self.identity["objective"],
                       "sampler": self.space.sampler["name"],
                       "pruner": self.space.pruner["name"]})
        writer = tracking.MLflowWriter(options.get("tracking_uri"),
                              experiment=options.get("experiment", "kerastrain"),
                              run_name=os.path.basename(self.sweep_dir), log_export=False,
                              params=params)
        writer.open(self.sweep_dir)
        return writer

    def _opening(self, study) -> str:
        held = study.trials("COMPLETE", "PRUNED", "FAIL")
        running = study.trials("RUNNING")
        slots = trials_lib.core_slots(self.space.parallel)
        where = (f"on cores {' | '.join(','.join(map(str, s)) for s in slots)}"
                 if self.ray is None else f"in Ray actors ({self.ray})")
        start = (f"resuming the sweep in {self.sweep_dir}: {len(held)} trial(s) kept, "
                 f"{len(running)} interrupted (run again in their folders, from their "
                 "checkpoints)" if held or running else f"sweep in {self.sweep_dir}")
        n = self.space.trials
        return (f"kerastrain tune: {start}; {n} trial{'s' if n != 1 else ''} of {self.recipe_path} "
                f"over {', '.join(p.key for p in self.space.params)}; {self.space.parallel} at "
                f"once {where}; "
                f"{self.space.direction} {self.space.metric}; sampler "
                f"{self.space.sampler['name']}, pruner {self.space.pruner['name']}")

    def _finish(self, study, parent) -> SweepResult:
        counts = {word: len(study.trials(state)) for state, word in (
            ("COMPLETE", "complete"), ("PRUNED", "pruned"), ("FAIL", "failed"))}
        said = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no trial ended"
        best = study.best()
        if not best:
            self.say(f"kerastrain tune: {said}: none completed, so there is no best recipe")
            return SweepResult(self.sweep_dir, None, None, counts)
        for line in records.table(best, self.space, said):
            self.say(line)
        top = best[0]
        path = os.path.join(self.sweep_dir, "best.yaml")
        text = records.best_recipe(self.recipe_path, self.sets, top, self.sweep_dir,
                                   self.space.metric, self.space.launch)
        records.write_kept(path, text)
        if parent is not None:
            parent.set_tags({"best_trial": top.number, f"best_{self.space.metric}": top.value,
                             **{f"best.{k}": v for k, v in top.params.items()}})
        self.say(f"kerastrain tune: best recipe: {path} ({records.runs(self.space.launch)} "
                 f"{_shown(path)}); "
                 f"compare the trials: tensorboard --logdir {_shown(self.sweep_dir)}"
                 " (HParams)" + (f"; MLflow run {parent.run_id} at {parent.tracking_uri}"
                                 if parent is not None else ""))
        return SweepResult(self.sweep_dir, {
            "trial": top.number, "value": top.value, "values": dict(top.params),
            "directory": top.user_attrs.get("directory")}, path, counts)


def _shown(path):
    """A path as a user would type it here: relative below the working directory."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _refuse_other_sweeps(sweep_dir, identity):
    """A folder of another search, or one that is no sweep's, is refused: nothing mixes."""
    record = os.path.join(sweep_dir, "sweep.json")
    if os.path.exists(record):
        with open(record) as f:
            saved = json.load(f)
        differ = [f"{part}: {_difference(saved.get(part), identity[part])}"
                  for part in identity if saved.get(part) != identity[part]]
        if differ:
            raise ValueError(
                f"The sweep folder {sweep_dir} holds a sweep of another search; mixing their "
                f"trials would compare runs of different recipes or spaces. Received: "
                f"{'; '.join(differ)}. Choose another sweep_dir (--sweep-dir, or `sweep_dir:` "
                "in the space), or remove that folder to start afresh. (trials, parallel, "
                "sampler and pruner may change between runs of one sweep.)")
    elif os.path.isdir(sweep_dir) and set(os.listdir(sweep_dir)) - {locks.NAME}:
        raise ValueError(
            f"The sweep folder {sweep_dir} holds files and no sweep.json, so it is not a "
            "sweep's folder; nothing in it was touched. Received: "
            f"{sorted(os.listdir(sweep_dir))[:5]}. Choose another sweep_dir (--sweep-dir, or "
            "`sweep_dir:` in the space).")


def _difference(old, new, prefix=""):
    """The first keys whose values differ, as `key: old -> new`."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = [_difference(old.get(k), new.get(k), f"{prefix}{k}.")
                 for k in sorted(set(old) | set(new), key=str) if old.get(k) != new.get(k)]
        return ", ".join(found[:3])
    return f"{prefix.rstrip('.')} {json.dumps(old)} before, {json.dumps(new)} now"


def _claim(sweep_dir, identity):
    """The folder's lock (one sweep at a time on it), and its sweep.json."""
    os.makedirs(sweep_dir, exist_ok=True)
    try:
        lock = locks.ModelDirLock(sweep_dir).acquire()
    except locks.ModelDirInUse as e:
        raise locks.ModelDirInUse(
            f"Another sweep is running in {sweep_dir}: two would start the same trials. "
            f"Wait for it to end (or stop it: the same command resumes it). The folder's "
            f"lock says: {e}") from None
    record = os.path.join(sweep_dir, "sweep.json")
    if not os.path.exists(record):
        with open(record + ".tmp", "w") as f:
            json.dump(identity, f, indent=1)
        os.replace(record + ".tmp", record)
    return lock
