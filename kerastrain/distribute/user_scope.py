"""A user's own `tf.distribute` scope around kerastrain: refused, saying which name to pass."""

from __future__ import annotations

# The kerastrain name of each tf.distribute strategy class a user may have entered.
_NAMES_OF_CLASSES = {
    "OneDeviceStrategy": "one_device", "MirroredStrategy": "mirrored",
    "CentralStorageStrategy": "central_storage",
    "MultiWorkerMirroredStrategy": "multi_worker_mirrored",
    "CollectiveAllReduceStrategy": "multi_worker_mirrored",
    "ParameterServerStrategy": "ps"}


def check_outside(what="kerastrain.Trainer(...)"):
    """kerastrain builds and enters its own strategy; inside a user's `strategy.scope()`
    TensorFlow fails at the first variable ("Mixing different tf.distribute.Strategy
    objects"). Refused first, saying which name to give instead.

    Raises:
        RuntimeError: called inside a `tf.distribute` strategy's scope.
    """
    import tensorflow as tf
    if not tf.distribute.has_strategy():
        return
    outer = type(tf.distribute.get_strategy()).__name__.removesuffix("V1")
    name = _NAMES_OF_CLASSES.get(outer)
    instead = f"strategy={name!r}" if name else "the strategy's kerastrain name"
    raise RuntimeError(
        f"{what} was called inside a `tf.distribute` strategy's scope ({outer}). kerastrain "
        f"builds and enters its strategy itself: call it outside `strategy.scope()` and pass "
        f"{instead} (a model built in your scope may be given as it is). Received: a call "
        f"inside {outer}.scope()")
