"""File systems by URL scheme: which one a path names, and whether TensorFlow implements it here.

Standard library only until TensorFlow's own registry is asked (`scheme_advice`), so that
the option checks (`kerastrain._options`: a recipe's `model_dir`) and `kerastrain.io.files`
share one answer without the checks importing the io layer.
"""

from __future__ import annotations

import importlib.util
import re

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")

# Schemes TensorFlow 2.16-2.21 implements in its own core (Linux and macOS wheels).
CORE_SCHEMES = ("file", "gs", "ram")
# Schemes that tensorflow-io registers when it is imported (TensorFlow dropped them in 2.6).
TFIO_SCHEMES = ("s3", "hdfs", "viewfs", "har", "az", "http", "https")


def scheme(path: str) -> str:
    """'gs' for 'gs://b/x', '' for a local path."""
    match = _URL.match(path)
    return match.group(1).lower() if match else ""


def is_url(path: str) -> bool:
    return bool(_URL.match(path))


def scheme_advice(path: str, *, ask_tensorflow: bool = True) -> str | None:
    """What to do when `path`'s file system cannot be used here (a clause), or None when it can.

    With `ask_tensorflow=False` (recipe checks, before TensorFlow starts) the answer
    comes from the schemes TensorFlow's core implements and whether tensorflow-io
    is installed; otherwise TensorFlow's registry is asked (after importing
    tensorflow-io, if installed, which registers its schemes on import).
    """
    name = scheme(path)
    if not name or name == "file":
        return None
    has_tfio = importlib.util.find_spec("tensorflow_io") is not None
    if ask_tensorflow:
        import tensorflow as tf
        registered = set(tf.io.gfile.get_registered_schemes())
        if name not in registered and has_tfio:
            import tensorflow_io  # noqa: F401  (registers s3://, hdfs://, ... on import)
            registered = set(tf.io.gfile.get_registered_schemes())
        if name in registered:
            return None
        here = sorted(registered - {"", "file"})
    else:
        if name in CORE_SCHEMES or (name in TFIO_SCHEMES and has_tfio):
            return None
        here = [s for s in CORE_SCHEMES if s != "file"]
    if name not in TFIO_SCHEMES:
        return ("use a local path (a mounted volume works) or one of: "
                + ", ".join(f"{s}://" for s in here))
    if not has_tfio:
        return ("install tensorflow-io (`pip install tensorflow-io`, the release made for your "
                "TensorFlow), which adds it")
    return ("the installed tensorflow-io does not register it either: check that its release "
            "matches your TensorFlow")
