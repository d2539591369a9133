"""A recipe's sections as frozen dataclasses: each field states its default, check and doc once.

`model:` (`ModelConfig`), `data:` (`DataConfig`) and the `Recipe` they make up; `trainer:` is
`kerastrain._options.TrainerConfig`, the Trainer's and fit's own arguments. The checks here
(import paths, builder arguments, the data service) raise `kerastrain._options.Bad`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import re
from typing import Any, Callable, Mapping

from kerastrain._options import (REQUIRED, Bad, TrainerConfig, choice, ints, is_number,
                                 option)

def _service(value):
    from kerastrain.data import service  # pure Python until a Trainer starts it
    try:
        options = service.ServiceOptions.coerce(value)
    except (ValueError, TypeError) as e:
        raise Bad(f"null, 'local', 'grpc://host:port' or a mapping ({e})") from None
    return None if options is None else dataclasses.asdict(options)


def _mapping(value):
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise Bad("a mapping of keyword arguments")
    return dict(value)


_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
# The rule of docs/recipes.md ("Where builders are imported from"), said where an import fails.
WHERE_FROM = ("a recipe's modules are imported from the working directory first, then from the "
              "recipe file's folder, then from the installed packages: put the module beside "
              "the recipe, run from its folder, or install it")


def resolve(path: str) -> Callable:
    """Import `package.module:attribute`; raise Bad with the reason if it does not resolve."""
    if not isinstance(path, str) or not _IMPORT_PATH.match(path):
        raise Bad("an import path 'package.module:function'")
    module_name, attribute = path.split(":")
    try:
        obj = importlib.import_module(module_name)
    except Exception as e:  # the user's module may fail in any way while importing
        missing = isinstance(e, ModuleNotFoundError) and e.name is not None and (
            module_name + ".").startswith(e.name + ".")  # the module itself, not its imports
        raise Bad(f"an importable module; importing {module_name!r} failed with "
                  f"{type(e).__name__}: {e}" + (f" ({WHERE_FROM})" if missing else "")) from None
    for part in attribute.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise Bad(f"a name defined in {module_name!r}; it has no {part!r}{hint}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise Bad(f"a callable; {path!r} is a {type(obj).__name__}")
    return obj


def _import_path(value):
    resolve(value)
    return value


def _import_path_unimported(value):
    """`_import_path` for `validate --no-import`: the form only, the module is not imported."""
    if not isinstance(value, str) or not _IMPORT_PATH.match(value):
        raise Bad("an import path 'package.module:function'")
    return value


def _fraction(value):
    """A fraction strictly between 0 and 1, or null."""
    if value is None or (is_number(value, above=0) and value < 1):
        return value
    raise Bad("a number between 0 and 1 (exclusive) or null")


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
    validation_split: float | None = option(None, "NumPy data only: hold out the last fraction "
                                                  "of the arrays for validation (model.fit's)",
                                            check=_fraction)
    batch_size: int | None = option(None, "global batch size: for NumPy data (default 32), and "
                                          "passed to builders that take `batch_size`",
                                    check=ints(1, optional=True))
    shard: str = option("auto", "sharding across workers: auto, file, data or off",
                        check=choice("auto", "file", "data", "off"))
    service: Any = option(None, "tf.data service for the training data: null, local, "
                                "grpc://host:port, or {dispatcher, workers, processing_mode}",
                          check=_service)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A validated recipe. `strategy` is `{"name": ..., **options}`; `checkpoints`,
    `tensorboard` and `mlflow` are option mappings, True, or False when switched off;
    `callbacks` the `{name, **arguments}` of each (`fit_options`)."""
    model: ModelConfig
    data: DataConfig
    strategy: Mapping[str, Any]
    trainer: TrainerConfig = TrainerConfig()
    checkpoints: Any = True
    tensorboard: Any = True
    tuning: Any = True
    mlflow: Any = False
    callbacks: tuple = ()
