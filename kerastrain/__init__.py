"""kerastrain: Keras 3 training under every tf.distribute strategy, by name.

Names are imported on first use, so that `kerastrain validate` and recipe checks
run without starting TensorFlow.
"""

import importlib as _importlib
import os as _os

from kerastrain import _logging

# TensorFlow's C++ chatter (oneDNN notices, placement logs, and the lines it prints while
# loading, before it reads any setting) is not for users: held back when TensorFlow loads,
# after `import kerastrain` (docs/monitoring.md). An explicit setting by the user wins: they
# see TensorFlow's lines as they asked.
# What kerastrain set is marked: a process this one starts (a script's workers) inherits both,
# and holds TensorFlow's start-up back too instead of taking the level for the user's.
_SET_BY_KERASTRAIN = "KERASTRAIN_TF_CPP_MIN_LOG_LEVEL"
_TF_LOG_LEVEL_SET_BY_USER = "TF_CPP_MIN_LOG_LEVEL" in _os.environ and \
    _os.environ.get(_SET_BY_KERASTRAIN) != _os.environ["TF_CPP_MIN_LOG_LEVEL"]
if not _TF_LOG_LEVEL_SET_BY_USER:
    _os.environ["TF_CPP_MIN_LOG_LEVEL"] = _os.environ[_SET_BY_KERASTRAIN] = "2"
    _logging.hold_tensorflow_startup()
elif _os.environ["TF_CPP_MIN_LOG_LEVEL"].strip() in ("1", "2", "3"):
    # The user's level, applied to the lines TensorFlow prints before it reads it (a shell,
    # an image or a test harness that sets 2 would see them in every process otherwise).
    _logging.hold_tensorflow_startup(int(_os.environ["TF_CPP_MIN_LOG_LEVEL"]))

__version__ = "0.1.0"

_EXPORTS = {
    "Action": "kerastrain.loop.actions",
    "Every": "kerastrain.io.cadence",
    "Progress": "kerastrain.loop.actions",
    "CSVWriter": "kerastrain.io.summaries",
    "CheckpointOptions": "kerastrain.io.checkpoints",
    "DiskFull": "kerastrain.io.files",
    "LoggingWriter": "kerastrain.io.summaries",
    "MLflowOptions": "kerastrain.io.tracking",
    "MLflowWriter": "kerastrain.io.tracking",
    "MetricWriter": "kerastrain.io.summaries",
    "ModelDirInUse": "kerastrain.io.locks",
    "MultiWriter": "kerastrain.io.summaries",
    "Preempted": "kerastrain.loop.preemption",
    "ServiceOptions": "kerastrain.data.service",
    "Sweep": "kerastrain.cli.tune.sweep",
    "TensorBoardOptions": "kerastrain.io.monitor",
    "TensorBoardWriter": "kerastrain.io.summaries",
    "TooManyRecoveries": "kerastrain.loop.recovery",
    "Trainer": "kerastrain.trainer",
    "TrainerConfig": "kerastrain._options",
    "build_strategy": "kerastrain.distribute.strategies",
    "configure_cpu_devices": "kerastrain.distribute.devices",
    "isolate_network": "kerastrain.distribute.network",
    "serve": "kerastrain.distribute.cluster",
}
# Modules reachable as attributes (`kt.cluster.serve`), by where they live.
_SUBMODULES = {
    "cluster": "kerastrain.distribute.cluster",
    "config": "kerastrain.cli.config",
    "data": "kerastrain.data",
    "examples": "kerastrain.examples",
    "optimizers": "kerastrain.optimizers",
    "recipes": "kerastrain.cli.recipes",
    "service": "kerastrain.data.service",
    "sharding": "kerastrain.data.sharding",
    "strategies": "kerastrain.distribute.strategies",
}

__all__ = sorted(_EXPORTS) + ["data", "__version__"]


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(_importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBMODULES:
        value = _importlib.import_module(_SUBMODULES[name])
    else:
        raise AttributeError(f"module 'kerastrain' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS) + list(_SUBMODULES))
