"""The only module that touches private Keras/TensorFlow APIs.

Checked against TensorFlow 2.16-2.21 and Keras 3.3-3.15. Each helper says why
the private name is needed; when Keras grows a public equivalent, switch here.
"""

from __future__ import annotations

import keras


def compile_metrics(model):
    """The model's `CompileMetrics` container (or None).

    Keras 3 exposes it only as `model._compile_metrics`; we need the container
    itself to drive its stateless update with our own cross-replica reduction.
    """
    return getattr(model, "_compile_metrics", None)


def compile_loss(model):
    """The model's `CompileLoss` (holds per-output loss trackers), or None."""
    return getattr(model, "_compile_loss", None)


def loss_tracker(model):
    """Keras's own running-mean "loss" tracker, which kerastrain replaces."""
    return getattr(model, "_loss_tracker", None)


def symbolic_build(model, element_spec):
    """Create model, metric, loss and optimizer state from shapes only.

    `model.fit` does the same through `Trainer._symbolic_build`; calling it inside
    `strategy.scope()` places every variable the way the strategy wants before
    the first compiled step (creating them inside a `tf.function` under mirrored
    fails).
    """
    import tensorflow as tf

    def to_zeros(spec):
        shape = [1 if d is None else d for d in spec.shape]
        return tf.zeros(shape, spec.dtype)

    batch = tf.nest.map_structure(to_zeros, element_spec)
    model._symbolic_build(data_batch=batch)


def compile_args(model):
    """The arguments the user passed to `compile()`, as live objects.

    `get_compile_config()` serialises them, which fails for unregistered custom
    losses and metrics; the raw objects are kept in `_compile_config.config`.
    """
    config = getattr(model, "_compile_config", None)
    if config is None:
        return None
    return dict(getattr(config, "config", {}) or {})


def is_compiled(model) -> bool:
    return bool(getattr(model, "compiled", False)) and (
        getattr(model, "_compile_loss", None) is not None or bool(model.losses)
    )


def stateless_scope(mapping):
    return keras.StatelessScope(state_mapping=mapping)


def learning_rate_schedule(optimizer):
    """The optimizer's LearningRateSchedule, or None for a fixed (variable) rate.

    Keras 3 keeps it only as `optimizer._learning_rate`; `optimizer.learning_rate`
    evaluates it at the *next* step, and we log the rate a step actually used.
    """
    lr = getattr(optimizer, "_learning_rate", None)
    if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
        return lr
    return None


def stop_preemption_handler(handler):
    """Stop a PreemptionCheckpointHandler's watcher threads now.

    TensorFlow stops them only in `__del__` (checked in TF 2.16-2.21); a Trainer
    that finished `fit` must not leave threads watching for a signal nobody acts on.
    """
    for name in ("_stop_poll_termination_signal_thread",
                 "_stop_cluster_wise_termination_watcher_thread"):
        stop = getattr(handler, name, None)
        if stop is not None:
            stop()
