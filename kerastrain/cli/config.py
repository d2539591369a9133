"""The recipe schema: typed, frozen config objects, checked key by key with every error at once.

A recipe is a mapping with six sections (see docs/recipes.md):

    model:       builder (import path), args, compile (optimizer, loss, metrics)
    data:        train / validation builders, batch_size, shard, service
    strategy:    name plus options
    trainer:     epochs, steps_per_epoch, validation_steps, steps_per_loop, seed,
                 model_dir, verbose, jit_compile, mixed_precision, on_nonfinite,
                 max_recoveries, spike_factor, stall_timeout
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
import importlib
import re
from typing import Any, Callable, Mapping

from kerastrain._options import REQUIRED, default_of, is_int, is_number, option

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


# -- checks: each returns the checked value or raises _Bad(expected) -------------------------

class _Bad(Exception):
    pass


def _describe(value):
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return repr(value)


def _int(minimum=None, optional=False):
    def check(value):
        if value is None and optional:
            return None
        if not is_int(value):
            raise _Bad(f"an int{'' if minimum is None else f' >= {minimum}'}"
                       f"{' or null' if optional else ''}")
        if minimum is not None and value < minimum:
            raise _Bad(f"an int >= {minimum}")
        return value
    return check


def _choice(*choices, extra=None):
    def check(value):
        if value in choices and not isinstance(value, bool):
            return value
        if extra is not None:
            try:
                return extra(value)
            except _Bad:
                pass
        listed = ", ".join(_describe(c) for c in choices)
        raise _Bad(f"one of {listed}" + (" or an int >= 1" if extra else ""))
    return check


def _jit(value):
    if value is None or isinstance(value, bool) or value == "auto":
        return value
    raise _Bad("true, false, auto or null")


def _bool(optional=False):
    def check(value):
        if value is None and optional:
            return None
        if not isinstance(value, bool):
            raise _Bad("true or false" + (" or null" if optional else ""))
        return value
    return check


def _string(optional=False):
    def check(value):
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value:
            raise _Bad("a non-empty string" + (" or null" if optional else ""))
        return value
    return check


def _model_dir(value):
    value = _string(optional=True)(value)
    if value is not None:
        from kerastrain.io import files  # pure Python: TensorFlow is not asked here
        advice = files.scheme_advice(value, ask_tensorflow=False)
        if advice:
            raise _Bad("a local path or a URL whose file system TensorFlow implements "
                       f"('{files.scheme(value)}://': {advice})")
    return value


def _number_over_one(value):
    if value is None:
        return None
    if not is_number(value, above=1):
        raise _Bad("a number > 1 or null")
    return value


def _stall_timeout(value):
    if value is None or value == "auto":
        return value
    if not is_number(value, above=0):
        raise _Bad("'auto', a number of seconds > 0, or null (never)")
    return value


def _service(value):
    from kerastrain.data import service  # pure Python until a Trainer starts it
    try:
        options = service.ServiceOptions.coerce(value)
    except (ValueError, TypeError) as e:
        raise _Bad(f"null, 'local', 'grpc://host:port' or a mapping ({e})") from None
    return None if options is None else dataclasses.asdict(options)


def _mapping(value):
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _Bad("a mapping of keyword arguments")
    return dict(value)


_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def resolve(path: str) -> Callable:
    """Import `package.module:attribute`; raise _Bad with the reason if it does not resolve."""
    if not isinstance(path, str) or not _IMPORT_PATH.match(path):
        raise _Bad("an import path 'package.module:function'")
    module_name, attribute = path.split(":")
    try:
        obj = importlib.import_module(module_name)
    except Exception as e:  # the user's module may fail in any way while importing
        raise _Bad(f"an importable module; importing {module_name!r} failed with "
                   f"{type(e).__name__}: {e}") from None
    for part in attribute.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _Bad(f"a name defined in {module_name!r}; it has no {part!r}{hint}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise _Bad(f"a callable; {path!r} is a {type(obj).__name__}")
    return obj


def _import_path(value):
    resolve(value)
    return value


def _import_path_unimported(value):
    """`_import_path` for `validate --no-import`: the form only, the module is not imported."""
    if not isinstance(value, str) or not _IMPORT_PATH.match(value):
        raise _Bad("an import path 'package.module:function'")
    return value


def _as_given(value):
    return value  # checked as a whole elsewhere (`_check_compile`)


# -- the config objects: each field states its default, check and doc once -------------

@dataclasses.dataclass(frozen=True)
class BuilderConfig:
    """A function named by import path, with keyword arguments."""
    builder: str = option(REQUIRED, "import path 'package.module:function'", check=_import_path,
                          example="kerastrain.examples:synthetic_data")
    args: Mapping[str, Any] = option({}, "keyword arguments for the builder", check=_mapping)


@dataclasses.dataclass(frozen=True)
class CompileConfig:
    """Overrides of what the model builder compiled (None: keep the builder's)."""
    optimizer: Any = option(None, "'adam', or {name: adam, learning_rate: 0.001}; learning_rate "
                                  "may be {schedule: cosine_decay, ...}; lazy_adam, lazy_adamw, "
                                  "lazy_adagrad, lazy_lion update only an embedding's touched "
                                  "rows", check=_as_given)
    loss: Any = option(None, "a Keras loss name, or {name: ..., **kwargs}; null keeps the "
                             "builder's", check=_as_given)
    metrics: tuple | None = option(None, "a list of Keras metric names; null keeps the builder's",
                                   check=_as_given)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    builder: str = option(REQUIRED, "returns a keras.Model (compiled, or compiled via "
                                    "model.compile)", check=_import_path,
                          example="kerastrain.examples:build_mlp")
    args: Mapping[str, Any] = option({}, "keyword arguments for the builder", check=_mapping)
    compile: CompileConfig = option(CompileConfig(), "overrides of what the builder compiled; "
                                                     "omit to keep the builder's",
                                    section=CompileConfig)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    train: BuilderConfig = option(REQUIRED, "training data: the builder returns NumPy arrays "
                                            "(x, y), a tf.data.Dataset, a function of no "
                                            "arguments, or a dataset_fn(ctx)",
                                  section=BuilderConfig)
    validation: BuilderConfig | None = option(None, "validation data (optional), same forms",
                                              section=BuilderConfig)
    batch_size: int | None = option(None, "global batch size: for NumPy data (default 32), and "
                                          "passed to builders that take `batch_size`",
                                    check=_int(1, optional=True))
    shard: str = option("auto", "sharding across workers: auto, file, data or off",
                        check=_choice("auto", "file", "data", "off"))
    service: Any = option(None, "tf.data service for the training data: null, local, "
                                "grpc://host:port, or {dispatcher, workers, processing_mode}",
                          check=_service)


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    epochs: int = option(1, "epochs to train", check=_int(0))
    steps_per_epoch: int | None = option(None, "null: to the end of the data",
                                         check=_int(1, optional=True))
    validation_steps: int | None = option(None, "null: all the validation data",
                                          check=_int(1, optional=True))
    steps_per_loop: int | str = option("auto", "steps per compiled call",
                                       check=_choice("auto", extra=_int(1)))
    seed: int | None = option(None, "seeds Python, NumPy, TensorFlow and Keras",
                              check=_int(0, optional=True))
    model_dir: str | None = option(None, "checkpoints, logs, export and the resolved recipe go "
                                         "here; reruns resume (a path, or a URL such as gs://)",
                                   check=_model_dir)
    verbose: int | str = option("auto", "0 silent, 1 progress bar, 2 one line per epoch",
                                check=_choice("auto", 0, 1, 2))
    jit_compile: bool | str | None = option(
        None, "XLA for each step; null follows the model's compile setting; auto: on with a "
              "GPU (Keras's rule), off under strategies that place variables",
        check=_jit)
    mixed_precision: str | None = option(
        None, "null, mixed_float16 (with loss scaling) or mixed_bfloat16",
        check=_choice(None, "mixed_float16", "mixed_bfloat16"))
    on_nonfinite: str = option(
        "stop", "a NaN/inf loss: stop, or recover (restore the last good checkpoint or epoch "
                "start, skip the bad batch, go on)", check=_choice("stop", "recover"))
    max_recoveries: int = option(3, "with recover: recoveries per run before it gives up",
                                 check=_int(1))
    spike_factor: float | None = option(
        None, "with recover: also a loop loss over k x the running median (null: off)",
        check=_number_over_one)
    stall_timeout: float | str | None = option(
        "auto", "a task with no training progress for this long writes who stalled and its "
                "stacks, and exits 75 (auto: multi-worker and ps only, max(5 min, 20 x the slowest "
                "loop); null: never)",
        check=_stall_timeout)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A validated recipe. `strategy` is `{"name": ..., **options}`; `checkpoints`,
    `tensorboard` and `mlflow` are option mappings, True, or False when switched off."""
    model: ModelConfig
    data: DataConfig
    strategy: Mapping[str, Any]
    trainer: TrainerConfig = TrainerConfig()
    checkpoints: Any = True
    tensorboard: Any = True
    tuning: Any = True
    mlflow: Any = False


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
        "checkpoints": Key(None, doc="CheckpointOptions fields, or false"),
        "tensorboard": Key(None, doc="TensorBoardOptions fields, or false"),
        "tuning": Key(None, doc="TuningOptions fields, or false"),
        "mlflow": Key(None, doc="MLflowOptions fields, or true; off unless given"),
    }


# -- validation ------------------------------------------------------------------------------

class _Checker:
    def __init__(self, positions, imports=True):
        self.positions = positions
        self.imports = imports
        self.problems = []

    def where(self, path):
        for i in range(len(path), -1, -1):
            if tuple(path[:i]) in self.positions:
                return self.positions[tuple(path[:i])]
        return "recipe"

    def add(self, path, message):
        self.problems.append(Problem(".".join(str(p) for p in path), self.where(path), message))

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
            except _Bad as e:
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
    except (_Bad, TypeError, ValueError):
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
            except _Bad as e:
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
        data=DataConfig(builder(data["train"]), builder(data["validation"]), data["batch_size"],
                        data["shard"], data["service"]),
        strategy=strategy,
        trainer=TrainerConfig(**(checked.get("trainer") or {
            k: spec.default for k, spec in sections["trainer"].section.items()})),
        checkpoints=checkpoints, tensorboard=tensorboard, tuning=tuning, mlflow=mlflow)


def import_paths(recipe: Recipe) -> dict:
    """Dotted key -> import path of each module the recipe names (what `imports=False` skips)."""
    paths = {"model.builder": recipe.model.builder, "data.train.builder": recipe.data.train.builder}
    if recipe.data.validation is not None:
        paths["data.validation.builder"] = recipe.data.validation.builder
    optimizer = recipe.model.compile.optimizer
    name = optimizer.get("name") if isinstance(optimizer, Mapping) else optimizer
    if isinstance(name, str) and ":" in name:
        paths["model.compile.optimizer"] = name
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
    return tree


_HEADER = """\
# A kerastrain recipe: every key, its default, and what it is for (docs/recipes.md).
# Check it with `kerastrain validate RECIPE`, run it with `kerastrain run RECIPE`.
# include: base.yaml          # optional: start from another recipe; this file's keys win
"""
_COMMENT_COLUMN = 30


def _yaml_value(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_yaml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    return str(value)


def _line(indent, key, value, doc):
    text = "  " * indent + f"{key}:" + (f" {value}" if value else "")
    return f"{text:<{_COMMENT_COLUMN - 2}}  # {doc}" if doc else text


def _template_lines(cls, indent=1):
    lines = []
    for f in dataclasses.fields(cls):
        meta, default = f.metadata, default_of(f)
        if meta.get("section") and default is not None:
            lines.append(_line(indent, f.name, "", meta["doc"]))
            lines.extend(_template_lines(meta["section"], indent + 1))
        elif default is REQUIRED:
            lines.append(_line(indent, f.name, _yaml_value(meta["example"]),
                               "required: " + meta["doc"]))
        else:
            lines.append(_line(indent, f.name, _yaml_value(default), meta["doc"]))
    return lines


def template() -> str:
    """Every key with its default and what it means: a recipe to start from.

    Generated from the option dataclasses, so it always shows their defaults.
    """
    from kerastrain.io.checkpoints import CheckpointOptions
    from kerastrain.io.monitor import TensorBoardOptions
    from kerastrain.loop.tuning import TuningOptions

    parts = [_HEADER]
    for name, cls in (("model", ModelConfig), ("data", DataConfig)):
        parts.append("\n".join([f"{name}:"] + _template_lines(cls)) + "\n")
    parts.append(_line(0, "strategy", "auto", "or {name: mirrored, cpu_devices: 2}, "
                                             "{name: ps, num_workers: 2}, ...") + "\n")
    parts.append("\n".join(["trainer:"] + _template_lines(TrainerConfig)) + "\n")
    for name, cls in (("checkpoints", CheckpointOptions), ("tensorboard", TensorBoardOptions),
                      ("tuning", TuningOptions)):
        head = _line(0, name, "", "or false" + ("" if name == "tuning" else
                                               " (needs trainer.model_dir)"))
        parts.append("\n".join([head] + _template_lines(cls)) + "\n")
    from kerastrain.io.tracking import MLflowOptions
    head = _line(0, "mlflow", "false", "or true, or these fields (pip install "
                                      "'kerastrain[mlflow]')")
    parts.append("\n".join([head] + ["# " + line for line in _template_lines(MLflowOptions)])
                 + "\n")
    return "\n".join(parts)
