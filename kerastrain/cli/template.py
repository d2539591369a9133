"""The commented recipe template: every key, its default and what it is for.

Generated from the option dataclasses (`kerastrain._options.option` fields), so it always
shows their defaults (`kerastrain template`).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from kerastrain._options import REQUIRED, TrainerConfig, default_of
from kerastrain.cli.sections import DataConfig, ModelConfig

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
    parts.append(_CALLBACKS)
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


_CALLBACKS = """\
callbacks: []                 # Keras callbacks, as fit(callbacks=[...]), for example:
#  - {name: EarlyStopping, monitor: val_loss, patience: 3, restore_best_weights: true}
#  - {name: ReduceLROnPlateau, monitor: val_loss, factor: 0.5, patience: 2}
#  - {name: CSVLogger, filename: history.csv}  # relative paths: under trainer.model_dir
#  - {name: ModelCheckpoint, filepath: best.keras, save_best_only: true}
#  - TerminateOnNaN
#  - {name: mypkg.callbacks:MyCallback, every: 10}  # your own class, by import path
"""
