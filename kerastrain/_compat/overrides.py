"""Replacing one method of one object for a while, where Keras and TensorFlow have no hook."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def instance_override(obj, name, fn):
    """Temporarily replace one method of one object (not of its class).

    Used to route a Keras optimizer's slot creation (`add_variable_from_reference`,
    which every built-in optimizer's `build` calls per variable) through kerastrain
    for partitioned variables; Keras has no hook for where slots are placed.
    """
    object.__setattr__(obj, name, fn)
    try:
        yield
    finally:
        obj.__dict__.pop(name, None)
