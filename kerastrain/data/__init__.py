"""Input: every form a user gives (NumPy, datasets, `dataset_fn(ctx)`, record files, the tf.data
service) made into per-replica batches, and the sharding decided for it.

`kerastrain.data.files` is public; it is imported on first use, so that the command line's
TensorFlow-free modules can import the submodules they need.
"""

import importlib as _importlib

__all__ = ["files"]


def __getattr__(name):
    if name in __all__:
        value = getattr(_importlib.import_module("kerastrain.data.record_files"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kerastrain.data' has no attribute {name!r}")
