"""Which hooks of a Keras callback do anything: Keras marks the no-op ones."""

from __future__ import annotations

import keras


def hook_is_default(callback, name):
    """Whether `callback.<name>` is `keras.callbacks.Callback`'s own no-op hook.

    Keras decorates each no-op hook of `Callback` with `@default` (an `_is_default`
    attribute, `keras.src.utils.python_utils`), and `CallbackList` reads it to decide
    which batch hooks it may call asynchronously; there is no public test. Checked with
    Keras 3.10-3.15; where the attribute is missing, the hook is compared with
    `Callback`'s own function.
    """
    method = getattr(callback, name, None)
    if method is None:
        return True
    if getattr(method, "_is_default", False):
        return True
    return getattr(method, "__func__", None) is getattr(keras.callbacks.Callback, name, ())


def tensorboard_profiles(callback):
    """Whether a `keras.callbacks.TensorBoard` profiles batches (`profile_batch` not 0):
    its private `_should_trace`, set in `__init__` (Keras 3.10-3.15)."""
    return bool(getattr(callback, "_should_trace", False))
