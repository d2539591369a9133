"""A sweep's search space, read from YAML and checked key by key before anything runs.

    params:                                   # recipe key -> what to try
      model.args.hidden: {int: [16, 256], log: true}
      model.compile.optimizer.learning_rate: {float: [1.0e-4, 1.0e-1], log: true}
      data.batch_size: [128, 256]             # a list: one of these
    objective: {metric: val_loss, direction: minimize}
    trials: 12
    parallel: 2
    sampler: tpe                  # or random, or {name: tpe, seed: 0, startup_trials: 4}
    pruner: median                            # median, successive_halving or none

Every problem is reported at once with its file:line and key (`SpaceError`); a value the
recipe's own schema refuses is found by checking the recipe with it (`check_recipe`), as
`kerastrain run --set key=value` would. Pure Python: no TensorFlow, no Optuna.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import os
from typing import Any, Mapping

from kerastrain._options import is_int, is_number
from kerastrain.cli import config, recipes
from kerastrain.cli.config import Problem, RecipeError

SAMPLERS = {"tpe": ("seed", "startup_trials"), "random": ("seed",)}
PRUNERS = {"median": ("startup_trials", "warmup_epochs"),
           "successive_halving": ("min_epochs", "reduction_factor"), "none": ()}
DIRECTIONS = ("minimize", "maximize")
KEYS = {
    "params": "recipe key -> a list of choices, {int: [low, high]} or {float: [low, high]}",
    "objective": "{metric: val_loss, direction: minimize}",
    "trials": "how many trials in all (a resumed sweep counts those it holds)",
    "parallel": "how many trials run at once, each on its share of the cores",
    "sampler": "tpe or random, or {name: ..., seed: ..., startup_trials: ...}",
    "pruner": "median, successive_halving or none, or {name: ..., **options}",
    "sweep_dir": "the sweep's folder: study.db, a folder per trial, best.yaml",
    "first_trials": "values to try first: a list of {recipe key: value}",
    "launch": "{workers: N, ps: M, chief: false}: each trial a local cluster (kerastrain launch)",
}
LAUNCH = {"workers": 1, "ps": 0, "chief": False}


class SpaceError(ValueError):
    """Every problem found in a search space, one per line (`config.Problem`s)."""

    def __init__(self, problems):
        self.problems = list(problems)
        n = len(self.problems)
        head = f"{n} problem{'s' if n != 1 else ''} in the search space:"
        super().__init__("\n".join([head] + [f"  {p}" for p in self.problems]))


@dataclasses.dataclass(frozen=True)
class Param:
    """One recipe key to search: `kind` is "int", "float" or "choice"."""

    key: str
    kind: str
    low: Any = None
    high: Any = None
    log: bool = False
    step: Any = None
    choices: tuple = ()
    where: str = "space"

    @property
    def probes(self) -> tuple:
        """The values the recipe must accept: both ends of a range, or every choice."""
        return self.choices if self.kind == "choice" else (self.low, self.high)

    def holds(self, value) -> bool:
        if self.kind == "choice":
            return any(type(value) is type(c) and value == c for c in self.choices)
        ok = is_int(value) if self.kind == "int" else is_number(value)
        return ok and self.low <= value <= self.high

    def describe(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(json.dumps(c) for c in self.choices)
        extra = ", log" if self.log else (f", step {self.step}" if self.step else "")
        return f"{self.kind} in [{self.low}, {self.high}]{extra}"


@dataclasses.dataclass(frozen=True)
class Space:
    """A checked search space (`load`)."""

    params: tuple
    metric: str = "val_loss"
    direction: str = "minimize"
    trials: int = 10
    parallel: int = 1
    sampler: Mapping = dataclasses.field(default_factory=lambda: {"name": "tpe"})
    pruner: Mapping = dataclasses.field(default_factory=lambda: {"name": "median"})
    sweep_dir: str | None = None
    first_trials: tuple = ()
    launch: Mapping | None = None
    source: str = "space"
    positions: Mapping = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def where(self, *path) -> str:
        return config.position(self.positions, path) or self.source

    def identity(self) -> dict:
        """What makes two sweeps the same search (the rest may change between runs of it)."""
        return {"params": {p.key: p.describe() for p in self.params},
                "objective": f"{self.direction} {self.metric}", "launch": self.launch}


def default_sweep_dir(space_path) -> str:
    """runs/<name>-sweep for SPACE `name.space.yaml` or `name.yaml`."""
    name = os.path.basename(str(space_path))
    for suffix in (".yaml", ".yml", ".space"):
        name = name[:-len(suffix)] if name.endswith(suffix) else name
    return os.path.join("runs", f"{name}-sweep")


def load(path_or_tree, *, recipe=None, trials=None, parallel=None, sweep_dir=None) -> Space:
    """Read and check a space file (or a mapping); the arguments override its keys. With
    `recipe` ((tree, positions) of `recipes.read`), each value is checked against it too
    (`check_recipe`), and every problem of both kinds is reported at once.

    Raises:
        SpaceError: every problem, each with its file:line and key, in the file's order.
    """
    if isinstance(path_or_tree, Mapping):
        tree, positions, source = copy.deepcopy(dict(path_or_tree)), {}, "space"
    else:
        try:
            tree, positions = recipes.load_file(path_or_tree)
        except RecipeError as e:   # unreadable or not YAML: the same words, about a space
            raise SpaceError([dataclasses.replace(p, message=p.message.replace(
                "a recipe needs at least `model:` and `data:` sections",
                "a search space needs at least `params:`")) for p in e.problems]) from None
        source = os.path.relpath(path_or_tree)
    for key, value in (("trials", trials), ("parallel", parallel), ("sweep_dir", sweep_dir)):
        if value is not None:
            tree = tree if isinstance(tree, dict) else {}
            tree[key] = value
            positions[(key,)] = f"--{key.replace('_', '-')} {value}"
    reader = _Reader(positions, source)
    space = reader.space(tree, source, path_or_tree)
    problems = reader.problems + (_recipe_problems(space, *recipe) if recipe else [])
    if problems:
        raise SpaceError(sorted(problems, key=_line))
    return space


def _line(problem):
    """A problem's line in the file, for the order of the report (others last)."""
    line = problem.where.rsplit(":", 1)[-1]
    return int(line) if line.isdigit() else 1 << 30


class _Reader:
    def __init__(self, positions, source):
        self.positions, self.source, self.problems = positions, source, []

    def add(self, path, message, value=dataclasses.MISSING):
        if value is not dataclasses.MISSING:
            message += f". Received: {json.dumps(value, default=str)}"
        where = config.position(self.positions, path) or self.source
        self.problems.append(Problem(".".join(map(str, path)), where, message))

    def space(self, tree, source, given) -> Space:
        if not isinstance(tree, Mapping):
            self.add((), "expected a mapping with " + ", ".join(KEYS), tree)
            raise SpaceError(self.problems)
        for key in tree:
            if key not in KEYS:
                close = difflib.get_close_matches(str(key), list(KEYS), n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                self.add((key,), f"unknown key.{hint} Valid keys: {', '.join(KEYS)}")
        params = self.params(tree.get("params"))
        metric, direction = self.objective(tree.get("objective", {}))
        counts = {k: tree.get(k, d) for k, d in (("trials", 10), ("parallel", 1))}
        for key, value in counts.items():
            if not is_int(value, 1):
                self.add((key,), "expected an int >= 1", value)
        sweep_dir = tree.get("sweep_dir") or (
            default_sweep_dir(given) if not isinstance(given, Mapping) else None)
        if not isinstance(sweep_dir, (str, type(None))) or (
                sweep_dir and "://" in sweep_dir):
            self.add(("sweep_dir",), "expected a local folder (trials are local processes "
                     "sharing its SQLite study)", sweep_dir)
        space = Space(
            params=params, metric=metric, direction=direction, trials=counts["trials"],
            parallel=counts["parallel"],
            sampler=self.named("sampler", tree.get("sampler", "tpe"), SAMPLERS),
            pruner=self.named("pruner", tree.get("pruner", "median"), PRUNERS),
            sweep_dir=sweep_dir, source=source, positions=self.positions)
        space = dataclasses.replace(space, first_trials=self.first(tree.get("first_trials"),
                                                                   params),
                                    launch=self.launch(tree.get("launch")))
        return space   # `load` raises with every problem

    def params(self, value) -> tuple:
        if not isinstance(value, Mapping) or not value:
            self.add(("params",), "expected a mapping of recipe keys to what to try, e.g. "
                                  "{model.args.hidden: {int: [16, 256], log: true}}",
                     value if value is not None else "missing")
            return ()
        return tuple(p for p in (self.param(k, v) for k, v in value.items()) if p)

    def param(self, key, spec):
        path = ("params", key)
        where = config.position(self.positions, path) or self.source
        if not isinstance(key, str) or not all(key.split(".")):
            self.add(path, "expected a dotted recipe key such as model.args.hidden", key)
            return None
        if isinstance(spec, list):
            return self.choices(path, key, spec, where)
        kinds = [k for k in ("int", "float") if isinstance(spec, Mapping) and k in spec]
        if len(kinds) != 1 or set(spec) - {kinds[0], "log", "step"}:
            self.add(path, "expected a list of choices ([128, 256]), {int: [low, high]} or "
                           "{float: [low, high]}, with log: true or step: n", spec)
            return None
        kind, bounds = kinds[0], spec[kinds[0]]
        test = is_int if kind == "int" else is_number
        if not (isinstance(bounds, list) and len(bounds) == 2 and all(map(test, bounds))):
            self.add(path, f"expected {kind}: [low, high], two {kind}s", bounds)
            return None
        low, high = bounds
        log, step = spec.get("log", False), spec.get("step")
        if low >= high:
            self.add(path, f"empty range: low must be below high; give [low, high] with low < "
                           "high (one value: a list of one choice)", bounds)
        if not isinstance(log, bool):
            self.add(path + ("log",), "expected true or false", log)
        elif log and low <= 0:
            self.add(path, "log: true needs low > 0 (a log scale has no 0)", bounds)
        if step is not None and (not test(step) or step <= 0 or log):
            self.add(path + ("step",), f"expected a {kind} > 0, and no log: true beside it", step)
        return Param(key, kind, low, high, bool(log), step, where=where)

    def choices(self, path, key, values, where):
        scalar = all(v is None or isinstance(v, (str, bool, int, float)) for v in values)
        if not values or not scalar:
            self.add(path, "expected a non-empty list of choices, each a number, string, "
                           "true/false or null (Optuna stores choices as such)", values)
            return None
        if len({json.dumps(v) for v in values}) != len(values):
            self.add(path, "a choice is given twice; list each once", values)
        return Param(key, "choice", choices=tuple(values), where=where)

    def objective(self, value):
        if isinstance(value, str):
            value = {"metric": value}
        if not isinstance(value, Mapping) or set(value) - {"metric", "direction"}:
            self.add(("objective",), "expected {metric: val_loss, direction: minimize}", value)
            return "val_loss", "minimize"
        metric, direction = value.get("metric", "val_loss"), value.get("direction", "minimize")
        if not isinstance(metric, str) or not metric:
            self.add(("objective", "metric"), "expected an epoch metric's name (val_loss, "
                                              "val_accuracy, loss...)", metric)
        if direction not in DIRECTIONS:
            self.add(("objective", "direction"), "expected minimize or maximize", direction)
        return metric, direction

    def named(self, key, value, known):
        """`sampler:` / `pruner:`: a name or {name: ..., **options} of that name."""
        options = {"name": value} if isinstance(value, str) else value
        name = options.get("name") if isinstance(options, Mapping) else None
        if name not in known:
            close = difflib.get_close_matches(str(name), list(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            self.add((key,) + (("name",) if isinstance(value, Mapping) else ()),
                     f"unknown {key}{hint}; expected one of {', '.join(known)}", name)
            return {"name": next(iter(known))}
        for option, given in options.items():
            if option == "name":
                continue
            if option not in known[name]:
                self.add((key, option), f"{name} takes {', '.join(known[name]) or 'no options'}"
                                        f"; not {option!r}")
            elif not is_int(given, 0 if option in ("seed", "startup_trials",
                                                   "warmup_epochs") else 1):
                self.add((key, option), "expected an int >= " + (
                    "0" if option in ("seed", "startup_trials", "warmup_epochs") else "1"), given)
        return dict(options)

    def launch(self, value):
        """`launch:` (or null): the cluster `kerastrain launch` starts for each trial."""
        if value is None:
            return None
        if not isinstance(value, Mapping) or set(value) - set(LAUNCH):
            self.add(("launch",), "expected {workers: N, ps: M, chief: true/false} (the flags "
                                  "of kerastrain launch)", value)
            return None
        launch = {**LAUNCH, **value}
        for key, minimum in (("workers", 1), ("ps", 0)):
            if not is_int(launch[key], minimum):
                self.add(("launch", key), f"expected an int >= {minimum}", launch[key])
        if not isinstance(launch["chief"], bool):
            self.add(("launch", "chief"), "expected true or false", launch["chief"])
        return launch

    def first(self, value, params) -> tuple:
        if value is None:
            return ()
        by_key = {p.key: p for p in params}
        if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
            self.add(("first_trials",), "expected a list of {recipe key: value}", value)
            return ()
        for i, values in enumerate(value):
            for key, item in values.items():
                if key not in by_key:
                    self.add(("first_trials", i, key), "not a key of params; first_trials "
                             f"give values of {', '.join(by_key) or 'the params'}")
                elif not by_key[key].holds(item):
                    self.add(("first_trials", i, key),
                             f"outside its param ({by_key[key].describe()})", item)
        return tuple(dict(v) for v in value)


def override(key, value) -> str:
    """The `--set` text that gives `key` this value (JSON is YAML: parsed back exactly)."""
    return f"{key}={json.dumps(value)}"


def with_values(tree, positions, values, where=None):
    """The recipe tree with `values` applied as `kerastrain run --set` applies them; each key's
    position is `where[key]` (the space's line) when given."""
    positions = dict(positions)
    tree = recipes.apply_overrides(tree, positions, [override(k, v) for k, v in values.items()])
    for key in values:
        if where and key in where:
            positions[tuple(key.split("."))] = where[key]
    return tree, positions


def check_recipe(space: Space, tree, positions, *, imports=True):
    """Check that the recipe takes every value of the space (both ends of each range, every
    choice), as its schema checks a `--set`; also that a `val_` objective has validation data.

    Raises:
        SpaceError: each value refused, at the space's line of its param, with the recipe's words.
    """
    problems = _recipe_problems(space, tree, positions, imports=imports)
    if problems:
        raise SpaceError(problems)


def _recipe_problems(space, tree, positions, *, imports=True) -> list:
    problems = []
    for param in space.params:
        for value in param.probes:
            try:
                probe, probe_positions = with_values(tree, positions, {param.key: value},
                                                     {param.key: param.where})
                config.validate(probe, probe_positions, imports=imports)
            except RecipeError as e:
                said = "; ".join(f"{p.key}: {p.message}" if p.key else p.message
                                 for p in e.problems)
                problems.append(Problem(f"params.{param.key}", param.where,
                                        f"the recipe refuses the value {json.dumps(value)}: "
                                        f"{said}"))
                break   # one value's words are enough for the key
    data = tree.get("data") if isinstance(tree.get("data"), Mapping) else {}
    if str(space.metric).startswith("val_") and not (data.get("validation") or
                                                data.get("validation_split")):
        problems.append(Problem("objective.metric", space.where("objective", "metric"), (
            f"{space.metric!r} is measured on validation data, and the recipe has none: "
            "give it data.validation (or data.validation_split), or choose a training metric "
            f"(e.g. {space.metric[4:]!r})")))
    return problems
