"""The recipe schema: typed, frozen config objects, checked key by key with every error at once.

A recipe is a mapping with these sections (see docs/recipes.md):

    model:       builder (import path), args, compile (optimizer, loss, metrics)
    data:        train / validation builders, validation_split, batch_size, shard, service
    strategy:    name plus options
    trainer:     epochs, steps_per_epoch, validation_steps, steps_per_loop, seed,
                 model_dir, verbose, jit_compile, mixed_precision, on_nonfinite,
                 max_recoveries, spike_factor, stall_timeout
    callbacks:   Keras callbacks, as fit(callbacks=...): {name: EarlyStopping, **arguments}
    checkpoints: CheckpointOptions fields, or false
    tensorboard: TensorBoardOptions fields, or false
    tuning:      TuningOptions fields (speed choices kerastrain makes), or false

`validate(tree, positions)` checks a loaded tree without importing TensorFlow and
returns a `Recipe`, or raises `RecipeError` listing every problem with its dotted
key, file and line, the value received and what is expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any, Callable, Mapping

from kerastrain._options import REQUIRED, Bad, TrainerConfig, default_of, is_number
from kerastrain.cli.sections import (BuilderConfig, CompileConfig, DataConfig, ModelConfig,
                                     Recipe, _import_path, _import_path_unimported,
                                     resolve)

# Keras's built-in optimizers and learning-rate schedules, by the names recipes use.
# (Checked by name here, so that a typo fails before TensorFlow is imported.)
OPTIMIZERS = ("adadelta", "adafactor", "adagrad", "adam", "adamax", "adamw", "ftrl", "lamb",
              "lion", "muon", "nadam", "rmsprop", "sgd")
# kerastrain's lazy (row-sparse) variants, kerastrain.optimizers (docs/optimizers.md).
LAZY_OPTIMIZERS = ("lazy_adagrad", "lazy_adam", "lazy_adamw", "lazy_lion")
SCHEDULES = {
    "exponential_decay": "ExponentialDecay", "cosine_decay": "CosineDecay",
    "cosine_decay_restarts": "CosineDecayRestarts",
    "piecewise_constant_decay": "PiecewiseConstantDecay",
    "polynomial_decay": "PolynomialDecay", "inverse_time_decay": "InverseTimeDecay",
}


# -- errors ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Problem:
    key: str          # dotted key, "" for the whole file
    where: str        # "file:line", or "--set key=value"
    message: str

    def __str__(self):
        key = f"{self.key}: " if self.key else ""
        return f"{self.where}: {key}{self.message}"


class RecipeError(ValueError):
    """Every problem found in a recipe, one per line."""

    def __init__(self, problems):
        self.problems = list(problems)
        n = len(self.problems)
        head = f"{n} problem{'s' if n != 1 else ''} in the recipe:"
        super().__init__("\n".join([head] + [f"  {p}" for p in self.problems]))


# -- checks: each returns the checked value or raises Bad(expected) --------------------------
# (ints, choices, numbers: `kerastrain._options`, shared with the Trainer's arguments; import
# paths and the sections' own: `kerastrain.cli.sections`)

def _describe(value):
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return repr(value)


# -- the schema, generated from the config objects ----------------------------------------

@dataclasses.dataclass(frozen=True)
class Key:
    check: Callable | None = None      # None: taken as it is (checked elsewhere)
    required: bool = False
    default: Any = None
    doc: str = ""
    section: dict | None = None


def _section(cls, doc="", required=False) -> Key:
    """The schema of a recipe section: one `Key` per field of its dataclass."""
    fields = {}
    for f in dataclasses.fields(cls):
        meta, default = f.metadata, default_of(f)
        required_here = default is REQUIRED
        if meta.get("section"):
            fields[f.name] = _section(meta["section"], meta["doc"], required_here)
        else:
            fields[f.name] = Key(meta.get("check"), required=required_here,
                                 default=None if required_here else default, doc=meta["doc"])
    return Key(section=fields, doc=doc, required=required)


def schema() -> dict:
    """The recipe's sections and keys, with defaults, checks and docs from the dataclasses."""
    return {
        "model": _section(ModelConfig, "the model", required=True),
        "data": _section(DataConfig, "the data", required=True),
        "strategy": Key(None, doc="a name, or {name: ..., **options}"),
        "trainer": _section(TrainerConfig, "the training loop"),
        "callbacks": Key(None, doc="Keras callbacks, as fit(callbacks=...): a list of "
                                   "{name: EarlyStopping, **arguments} (cli/fit_options.py)"),
        "checkpoints": Key(None, doc="CheckpointOptions fields, or false"),
        "tensorboard": Key(None, doc="TensorBoardOptions fields, or false"),
        "tuning": Key(None, doc="TuningOptions fields, or false"),
        "mlflow": Key(None, doc="MLflowOptions fields, or true; off unless given"),
    }


# -- validation ------------------------------------------------------------------------------

def position(positions, path):
    """Where the key `path` (a tuple) is set, "file:line", or where its nearest enclosing
    section is; None when the recipe sets none of them (`positions`: `recipes.load_file`'s)."""
    for i in range(len(path), -1, -1):
        if tuple(path[:i]) in positions:
            return positions[tuple(path[:i])]
    return None


class _Checker:
    def __init__(self, positions, imports=True):
        self.positions = positions
        self.imports = imports
        self.problems = []

    def where(self, path):
        return position(self.positions, path) or "recipe"

    def add(self, path, message):
        key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
        self.problems.append(Problem(key, self.where(path), message))  # callbacks[0].name

    def bad(self, path, value, expected):
        self.add(path, f"expected {expected}. Received: {_describe(value)}")

    def section(self, path, fields, value):
        """Check a mapping against `fields`; return the checked dict (missing keys defaulted)."""
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            self.bad(path, value, "a mapping of " + ", ".join(fields))
            return None
        out = {}
        for key in value:
            if not path and str(key).startswith("x-"):
                continue  # a top-level home for YAML anchors, as in Compose files
            if key not in fields:
                close = difflib.get_close_matches(str(key), list(fields), n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                extra = ("" if path else
                         " (keep shared YAML anchors under a top-level key starting with 'x-')")
                self.add(path + (key,), f"unknown key.{hint} Valid keys here: "
                                        f"{', '.join(fields)}{extra}")
        for key, spec in fields.items():
            if spec.section is not None:
                if key in value and value[key] is not None:
                    out[key] = self.section(path + (key,), spec.section, value[key])
                else:
                    if spec.required:
                        self.add(path + (key,), f"missing; expected {spec.doc} section")
                    out[key] = None
                continue
            if key not in value:
                if spec.required:
                    self.add(path + (key,), f"missing; expected {spec.doc}")
                out[key] = spec.default
                continue
            if spec.check is None:
                out[key] = value[key]
                continue
            try:
                check = spec.check
                if check is _import_path and not self.imports:
                    check = _import_path_unimported
                out[key] = check(value[key])
            except Bad as e:
                self.bad(path + (key,), value[key], e.args[0])
                out[key] = spec.default
        return out


def _check_strategy(checker, value):
    from kerastrain.distribute import strategies  # pure Python: no TensorFlow here
    if value is None:
        value = "auto"
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, Mapping):
        checker.bad(("strategy",), value, "a strategy name or a mapping {name: ..., **options}")
        return {"name": "auto"}
    try:
        name, options = strategies.normalize(dict(value))
    except (ValueError, TypeError) as e:
        message = str(e)
        key = re.search(r"(?:Unknown option |Strategy option )[`']?(\w+)", message)
        path = ("strategy", key.group(1)) if key and key.group(1) in value else ("strategy", "name")
        checker.add(path, message)
        return {"name": "auto"}
    return {"name": name, **options}


def _check_builder_args(checker, path, builder, args, injected=()):
    """The builder's `args` must bind to its signature: catch a misspelt argument now."""
    import inspect
    try:
        fn = resolve(builder)
        signature = inspect.signature(fn)
    except (Bad, TypeError, ValueError):
        return
    params = signature.parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for key in args:
        if key not in named:
            close = difflib.get_close_matches(str(key), named, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            checker.add(path + ("args", key), f"{builder} takes no argument {key!r}.{hint} "
                                              f"Its arguments: {', '.join(named) or 'none'}")
    missing = [n for n, p in params.items() if p.default is p.empty and p.kind in (
        p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in args and n not in injected]
    if missing:
        checker.add(path + ("args",), f"{builder} needs argument(s) {', '.join(missing)}; "
                                      "give them under args")


def _check_options(checker, section, cls, value):
    """`checkpoints:` / `tensorboard:`: true/false or the fields of their options class."""
    if value is None or value is True:
        return True
    if value is False:
        return False
    fields = {f.name: Key(lambda v: v) for f in dataclasses.fields(cls)}
    checked = checker.section((section,), fields, value)
    if checked is None:
        return True
    given = {k: v for k, v in dict(value).items() if k in fields}
    if isinstance(given.get("profile_steps"), list):
        given["profile_steps"] = tuple(given["profile_steps"])
    try:
        cls(**given)
    except (ValueError, TypeError) as e:
        message = str(e)
        field = re.search(r"`(\w+)`", message)
        path = (section, field.group(1)) if field and field.group(1) in given else (section,)
        checker.add(path, message)
    return given


def _check_compile(checker, value):
    if value is None:
        return CompileConfig()
    optimizer = value.get("optimizer")
    path = ("model", "compile", "optimizer")
    if optimizer is not None:
        options = optimizer if isinstance(optimizer, Mapping) else {"name": optimizer}
        name = options.get("name")
        if isinstance(name, str) and ":" in name:
            try:
                (resolve if checker.imports else _import_path_unimported)(name)
            except Bad as e:
                checker.bad(path + ("name",), name, e.args[0])
        elif not isinstance(name, str) or name.lower() not in OPTIMIZERS + LAZY_OPTIMIZERS:
            close = difflib.get_close_matches(str(name).lower(), OPTIMIZERS + LAZY_OPTIMIZERS,
                                              n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            checker.bad(path + (("name",) if isinstance(optimizer, Mapping) else ()), name,
                        f"a Keras optimizer name{hint}: {', '.join(OPTIMIZERS)}; a lazy one "
                        f"(kerastrain.optimizers): {', '.join(LAZY_OPTIMIZERS)}; or an import "
                        "path 'package.module:Class'")
        lr = options.get("learning_rate")
        if isinstance(lr, Mapping):
            schedule = lr.get("schedule")
            if schedule not in SCHEDULES:
                close = difflib.get_close_matches(str(schedule), list(SCHEDULES), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                checker.bad(path + ("learning_rate", "schedule"), schedule,
                            f"a schedule name{hint}: {', '.join(SCHEDULES)}")
        elif lr is not None and not is_number(lr, above=0):
            checker.bad(path + ("learning_rate",), lr,
                        "a positive number, or {schedule: name, ...schedule arguments}")
    loss = value.get("loss")
    if loss is not None and not (isinstance(loss, str) or (
            isinstance(loss, Mapping) and isinstance(loss.get("name"), str))):
        checker.bad(("model", "compile", "loss"), loss,
                    "a Keras loss name, or {name: ..., **kwargs}")
    metrics = value.get("metrics")
    if metrics is not None and (not isinstance(metrics, list) or not all(
            isinstance(m, str) or (isinstance(m, Mapping) and isinstance(m.get("name"), str))
            for m in metrics)):
        checker.bad(("model", "compile", "metrics"), metrics,
                    "a list of Keras metric names (or {name: ..., **kwargs})")
        metrics = None
    return CompileConfig(optimizer=optimizer, loss=loss,
                         metrics=None if metrics is None else tuple(metrics))


def validate(tree, positions=None, *, imports=True) -> Recipe:
    """Check a loaded recipe tree; return a `Recipe` or raise `RecipeError` with every problem.

    Args:
        tree: the recipe as plain data (`recipes.load_file`).
        positions: dotted key path -> "file:line", for the messages.
        imports: import the modules the recipe names (builders, an optimizer class), to check
            that they exist and take their `args`. That runs their code: False checks only the
            form of their import paths (see `import_paths` for what was left unchecked).
    """
    from kerastrain.io.checkpoints import CheckpointOptions
    from kerastrain.io.monitor import TensorBoardOptions
    from kerastrain.io.tracking import MLflowOptions
    from kerastrain.loop.tuning import TuningOptions

    checker = _Checker(positions or {}, imports)
    sections = schema()
    if not isinstance(tree, Mapping):
        checker.bad((), tree, "a mapping with the sections " + ", ".join(sections))
        raise RecipeError(checker.problems)
    checked = checker.section((), sections, tree)
    strategy = _check_strategy(checker, tree.get("strategy"))
    checkpoints = _check_options(checker, "checkpoints", CheckpointOptions, tree.get("checkpoints"))
    tensorboard = _check_options(checker, "tensorboard", TensorBoardOptions, tree.get("tensorboard"))
    tuning = _check_options(checker, "tuning", TuningOptions, tree.get("tuning"))
    mlflow = tree.get("mlflow") not in (None, False) and _check_options(
        checker, "mlflow", MLflowOptions, tree.get("mlflow"))
    trainer = checked.get("trainer") or {}
    if trainer.get("spike_factor") is not None and trainer.get("on_nonfinite") != "recover":
        checker.add(("trainer", "spike_factor"), "acts only with trainer.on_nonfinite: recover; "
                                                 "set it, or remove spike_factor")
    model = checked.get("model") or {}
    data = checked.get("data") or {}
    compile_config = _check_compile(checker, model.get("compile"))
    callbacks = _check_fit_options(checker, tree, trainer, data)
    if not checker.problems and imports:
        _check_builder_args(checker, ("model",), model["builder"], model["args"])
        for part in ("train", "validation"):
            if data.get(part):
                _check_builder_args(checker, ("data", part), data[part]["builder"],
                                    data[part]["args"], injected=("batch_size",))
    if checker.problems:
        raise RecipeError(checker.problems)

    def builder(section):
        return None if section is None else BuilderConfig(section["builder"], section["args"])

    return Recipe(
        model=ModelConfig(model["builder"], model["args"], compile_config),
        data=DataConfig(**dict(data, train=builder(data["train"]),
                               validation=builder(data["validation"]))),
        strategy=strategy,
        trainer=TrainerConfig(**(checked.get("trainer") or {
            k: spec.default for k, spec in sections["trainer"].section.items()})),
        checkpoints=checkpoints, tensorboard=tensorboard, tuning=tuning, mlflow=mlflow,
        callbacks=callbacks)


def _check_fit_options(checker, tree, trainer, data):
    """`callbacks:` (`fit_options.check_callbacks`) and `data.validation_split`: what a
    ported `model.fit(...)` call says."""
    from kerastrain.cli import fit_options
    if data.get("validation_split") is not None and data.get("validation"):
        checker.add(("data", "validation_split"), "holds out part of the training data for "
                    "validation, and data.validation gives validation data too: give one "
                    f"(Received: validation_split={data['validation_split']} and a "
                    "data.validation builder)")

    def resolve_class(name):
        return resolve(name) if checker.imports else _import_path_unimported(name) and None
    callbacks, problems = fit_options.check_callbacks(
        tree.get("callbacks"), model_dir=trainer.get("model_dir"),
        tensorboard=tree.get("tensorboard"), resolve=resolve_class)
    for path, message in problems:
        checker.add(path, message)
    return callbacks


def import_paths(recipe: Recipe) -> dict:
    """Dotted key -> import path of each module the recipe names (what `imports=False` skips)."""
    paths = {"model.builder": recipe.model.builder, "data.train.builder": recipe.data.train.builder}
    if recipe.data.validation is not None:
        paths["data.validation.builder"] = recipe.data.validation.builder
    optimizer = recipe.model.compile.optimizer
    name = optimizer.get("name") if isinstance(optimizer, Mapping) else optimizer
    if isinstance(name, str) and ":" in name:
        paths["model.compile.optimizer"] = name
    from kerastrain.cli import fit_options
    paths.update(fit_options.import_paths(recipe.callbacks))
    return paths


def to_tree(recipe: Recipe) -> dict:
    """The recipe as plain data (what is written to `model_dir/recipe.yaml`)."""
    def plain(value):
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, Mapping):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value
    tree = plain(recipe)
    compile_section = tree["model"]["compile"]
    tree["model"]["compile"] = {k: v for k, v in compile_section.items() if v is not None}
    if not tree["model"]["compile"]:
        del tree["model"]["compile"]
    if tree["data"]["validation"] is None:
        del tree["data"]["validation"]
    for section, cls in _option_classes().items():   # defaults filled in, as for the rest
        value = tree[section]
        if value is True or isinstance(value, Mapping):
            given = value if isinstance(value, Mapping) else {}
            tree[section] = {**{f.name: plain(default_of(f)) for f in dataclasses.fields(cls)},
                             **given}
    return tree


def _option_classes() -> dict:
    """The sections given as the fields of an options class, by section."""
    from kerastrain.io.checkpoints import CheckpointOptions
    from kerastrain.io.monitor import TensorBoardOptions
    from kerastrain.io.tracking import MLflowOptions
    from kerastrain.loop.tuning import TuningOptions
    return {"checkpoints": CheckpointOptions, "tensorboard": TensorBoardOptions,
            "tuning": TuningOptions, "mlflow": MLflowOptions}

