"""kerastrain: Keras 3 training under every tf.distribute strategy, by name."""

import os as _os

# TensorFlow's C++ start-up chatter (oneDNN notices, placement logs) is not for
# users; an explicit setting by the user wins.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from kerastrain import data  # noqa: E402  (kerastrain.data.files)
from kerastrain.checkpoints import CheckpointOptions  # noqa: E402
from kerastrain.cluster import serve  # noqa: E402
from kerastrain.preemption import Preempted  # noqa: E402
from kerastrain.strategies import build_strategy, configure_cpu_devices  # noqa: E402
from kerastrain.summaries import MetricWriter, TensorBoardOptions  # noqa: E402
from kerastrain.trainer import Trainer  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CheckpointOptions",
    "MetricWriter",
    "Preempted",
    "TensorBoardOptions",
    "Trainer",
    "build_strategy",
    "configure_cpu_devices",
    "data",
    "serve",
    "__version__",
]
