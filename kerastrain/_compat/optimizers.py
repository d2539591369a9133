"""Keras optimizer internals: iterations, learning rates, slots, clipping, row-sparse decay."""

from __future__ import annotations

import contextlib

import keras
import tensorflow as tf

from kerastrain._compat.overrides import instance_override


def rekey_optimizer(optimizer):
    """After `replace_storage` of the variables an optimizer was built for: key them again.

    Keras's TensorFlow optimizer finds a variable's slots by its TensorFlow variable's id
    (`_var_key`), taken at `build`; new storage is a new TensorFlow variable, which the
    optimizer would refuse as "Unknown variable" (checked on Keras 3.10-3.15).
    """
    if not optimizer.built:
        return
    optimizer._trainable_variables_indices = {
        optimizer._var_key(v): i for i, v in enumerate(optimizer._trainable_variables)}


def share_optimizer_state(update, optimizer):
    """Make `update` count steps and read its learning rate from `optimizer`.

    Keras 3 keeps both in private attributes (`_iterations`, `_learning_rate`);
    sharing the objects keeps schedules, bias corrections and learning-rate
    callbacks exact for the per-shard update optimizer.
    """
    object.__setattr__(update, "_iterations", optimizer._iterations)
    object.__setattr__(update, "_learning_rate", optimizer._learning_rate)


def optimizer_strategy_scope(optimizer):
    """The scope of the strategy a Keras optimizer was made under (its private
    `_distribution_strategy`, Keras 3.10-3.15), where its variables must be made; a null
    context for the default strategy or when already inside it."""
    strategy = getattr(optimizer, "_distribution_strategy", None)
    if strategy is None or strategy is tf.distribute.get_strategy() or \
            type(strategy).__name__ == "_DefaultDistributionStrategy":
        return contextlib.nullcontext()
    return strategy.scope()


def optimizer_slot(optimizer, kind, variable):
    """The slot `kind` of `variable` ("momentums", "velocities", "velocity_hats",
    "accumulators"): Keras's built-in optimizers keep each kind in a private list
    (`Adam._momentums`...) indexed by `_get_variable_index` (Keras 3.10-3.15)."""
    return getattr(optimizer, f"_{kind}")[optimizer._get_variable_index(variable)]


def iteration_counter(optimizer):
    """The optimizer's own count of `apply` calls (a variable).

    With `gradient_accumulation_steps`, Keras 3.15's public `optimizer.iterations`
    is a tensor (this count // the steps), and schedules read `_iterations`, the
    batches seen; kerastrain's accumulation keeps `_iterations` as Keras does.
    """
    return getattr(optimizer, "inner_optimizer", optimizer)._iterations


def gradient_accumulators(optimizer) -> list:
    """The variables a built optimizer with `gradient_accumulation_steps` sums gradients into
    between updates (Keras 3.10-3.15's private `_accumulated_gradients`; a LossScaleOptimizer's
    are its inner optimizer's); [] when it has none."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return [v for v in getattr(inner, "_accumulated_gradients", None) or () if v is not None]


def learning_rate_schedule(optimizer):
    """The optimizer's LearningRateSchedule, or None for a fixed (variable) rate.

    Keras 3 keeps it only as `optimizer._learning_rate`; `optimizer.learning_rate`
    evaluates it at the *next* step, and we log the rate a step actually used.
    """
    lr = getattr(optimizer, "_learning_rate", None)
    return lr if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule) else None


@contextlib.contextmanager
def learning_rate_at(optimizer, iteration):
    """While tracing an update: a learning-rate schedule reads `iteration`.

    Keras 3.15 evaluates a schedule at `_iterations` (`_get_current_learning_rate`);
    when it accumulates, that is the index of the group's last batch, which
    kerastrain's accumulating update gives here (Keras has no argument for it).
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    schedule = getattr(inner, "_learning_rate", None)
    if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        yield
        return
    with instance_override(inner, "_get_current_learning_rate", lambda: schedule(iteration)):
        yield


def moving_averages(optimizer) -> list:
    """(variable, its moving average) of an optimizer with `use_ema=True`, else []."""
    if not getattr(optimizer, "use_ema", False):
        return []
    return [(v, a) for v, a in zip(optimizer._trainable_variables,
                                   optimizer._model_variables_moving_average) if a is not None]


# -- gradient clipping of the summed gradient -----------------------------------------------

_CLIPPING = ("clipnorm", "global_clipnorm", "clipvalue")


def clips_gradients(optimizer) -> bool:
    """Whether the optimizer (a LossScaleOptimizer's inner one) clips gradients."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return any((getattr(inner, name, None) or 0) > 0 for name in _CLIPPING)


def clip_as_optimizer(optimizer, grads):
    """`grads` clipped as the optimizer's own `apply` would clip them (Keras 3.10-3.15:
    `BaseOptimizer._clip_gradients`, on the unscaled gradients of a LossScaleOptimizer,
    whose scale, a power of two, is divided out and multiplied back exactly)."""
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is None:
        return optimizer._clip_gradients(grads)
    scale = optimizer.scale_loss(1.0)
    unscaled = [g if g is None else g / scale for g in grads]
    return [g if g is None else g * scale for g in inner._clip_gradients(unscaled)]


@contextlib.contextmanager
def clipping_off(optimizer):
    """The optimizer's `apply` without its clipping (the gradients are clipped already)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    with instance_override(inner, "_clip_gradients", lambda grads: grads):
        yield


# -- lazy (row-sparse) optimizers ---------------------------------------------------------

class RowSparseWeightDecay:
    """Mixin for a Keras optimizer: row gradients stay rows through decay and clipping.

    Keras applies weight decay to every variable, whole, before the update
    (`BaseOptimizer._backend_apply_gradients` -> `_apply_weight_decay`, which asks
    `_use_weight_decay(variable)`); it has no public hook that sees the gradients.
    For a variable whose gradient is `tf.IndexedSlices` this mixin says "no decay"
    there, and the lazy update decays the touched rows itself (`decays_weights`).
    With `gradient_accumulation_steps` Keras sums gradients into dense accumulators,
    so every update is dense and decays as Keras does. `global_clipnorm` would make
    row gradients dense (`_clip_gradients`); here it scales the rows' values.
    Private names checked in Keras 3.10-3.15: `_backend_apply_gradients`,
    `_use_weight_decay`, `_clip_gradients`, `_var_key`, `clip_by_global_norm`.
    """

    def _backend_apply_gradients(self, grads, trainable_variables):
        sparse = frozenset()
        if not self.gradient_accumulation_steps:
            sparse = frozenset(self._var_key(v) for g, v in zip(grads, trainable_variables)
                               if isinstance(g, tf.IndexedSlices))
        object.__setattr__(self, "_kerastrain_row_sparse", sparse)
        try:
            return super()._backend_apply_gradients(grads, trainable_variables)
        finally:
            object.__setattr__(self, "_kerastrain_row_sparse", frozenset())

    def _use_weight_decay(self, variable):
        if self._var_key(variable) in getattr(self, "_kerastrain_row_sparse", ()):
            return False
        return super()._use_weight_decay(variable)

    def _clip_gradients(self, grads):
        # Keras's `clip_by_global_norm` makes row gradients dense; this is the same
        # formula on the rows' values (duplicates summed first, so their norm is the
        # dense gradient's), and rows stay rows. Other clipping keeps rows already.
        from keras.src.optimizers.base_optimizer import clip_by_global_norm
        if (self.clipnorm and self.clipnorm > 0) or not (
                self.global_clipnorm and self.global_clipnorm > 0) or not any(
                isinstance(g, tf.IndexedSlices) for g in grads):
            return super()._clip_gradients(grads)
        grads = [unique_rows(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        values = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads]
        clipped = clip_by_global_norm(values, self.global_clipnorm)
        return [tf.IndexedSlices(c, g.indices, g.dense_shape) if isinstance(g, tf.IndexedSlices)
                else c for g, c in zip(grads, clipped)]


def unique_rows(gradient, dtype=None):
    """A `tf.IndexedSlices` with each row once, its gradients summed (cast to `dtype`)."""
    rows, position = tf.unique(gradient.indices)
    values = gradient.values if dtype is None else tf.cast(gradient.values, dtype)
    values = tf.math.unsorted_segment_sum(values, position, tf.shape(rows)[0])
    return tf.IndexedSlices(values, rows, gradient.dense_shape)


def decays_weights(optimizer, variable) -> bool:
    """Whether Keras would decay `variable` (weight_decay set, not excluded by the user)."""
    if optimizer.weight_decay is None:
        return False
    return super(RowSparseWeightDecay, optimizer)._use_weight_decay(variable)
