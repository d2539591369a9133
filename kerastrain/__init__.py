"""kerastrain: Keras 3 training under every tf.distribute strategy, by name."""

import os as _os

# TensorFlow's C++ start-up chatter (CUDA probes, oneDNN notices) is not for users;
# an explicit setting by the user wins.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from kerastrain.cluster import serve  # noqa: E402
from kerastrain.strategies import build_strategy, configure_cpu_devices  # noqa: E402
from kerastrain.trainer import Trainer  # noqa: E402

__version__ = "0.1.0"

__all__ = ["Trainer", "build_strategy", "configure_cpu_devices", "serve", "__version__"]
