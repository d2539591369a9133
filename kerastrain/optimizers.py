"""Lazy optimizers: Keras's Adam, AdamW, Adagrad and Lion, updating only the rows a step touched.

An embedding's gradient is a `tf.IndexedSlices`: the rows the batch looked up.
Keras 3's optimizers turn it into a dense update of the whole table (Adam's
moments of every row decay each step), so a step costs the table's size, not
the batch's. The optimizers here read and write, for such a variable, only the
touched rows of the variable and of its slots (duplicate ids summed first); a
variable with a dense gradient is updated by the Keras optimizer's own code,
so dense layers train bit for bit as with the Keras optimizer.

Semantics of the lazy update (as TF Addons' `LazyAdam`): an untouched row
keeps its value and its slots, its moments do not decay; the bias correction
uses the global step (`optimizer.iterations`), not a per-row count. Weight
decay (`weight_decay`, AdamW's default 0.004) shrinks the touched rows only.

The slots are the Keras optimizer's (same names, same order), so a checkpoint
or `.keras` file written with `keras.optimizers.Adam` restores into `LazyAdam`
and back. Each class is registered as a Keras serializable (package
`kerastrain`), so models compiled with one save and load as `.keras` files
once this module is imported; importing it also lets `compile` take the names
"lazy_adam", "lazy_adamw", "lazy_adagrad" and "lazy_lion".

Example:

    import keras
    from kerastrain.optimizers import LazyAdam

    model = keras.Sequential([keras.Input((8,), dtype="int32"),
                              keras.layers.Embedding(1_000_000, 32),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer=LazyAdam(1e-3), loss="mse")
"""

from __future__ import annotations

import keras
import tensorflow as tf

from kerastrain import _compat


def _as_tf(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable


def _gather(variable, rows):
    return tf.gather(_as_tf(variable), rows)


def _scatter(variable, rows, values):
    _as_tf(variable).scatter_update(tf.IndexedSlices(values, rows))


class _Lazy(_compat.RowSparseWeightDecay):
    """The row-sparse path of `update_step`; subclasses define `_update_rows`."""

    def update_step(self, gradient, variable, learning_rate):
        if not isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        lr = tf.cast(learning_rate, dtype)
        summed = _compat.unique_rows(gradient, dtype)
        rows, grad = summed.indices, summed.values
        weights = _gather(variable, rows)
        if _compat.decays_weights(self, variable):
            # Keras's decoupled decay (`variable -= variable * wd * lr`), on these rows.
            weights = weights - weights * tf.cast(self.weight_decay, dtype) * lr
        weights = self._update_rows(variable, rows, grad, weights, lr)
        _scatter(variable, rows, weights)

    def _update_rows(self, variable, rows, grad, weights, lr):
        """Write the slots' new rows; return the variable's new rows."""
        raise NotImplementedError

    def _slot_rows(self, kind, variable, rows):
        slot = _compat.optimizer_slot(self, kind, variable)
        return slot, _gather(slot, rows)


class _LazyAdamRows(_Lazy):
    """Adam's update (Keras's formulas) on the touched rows; shared by LazyAdam and LazyAdamW."""

    def _update_rows(self, variable, rows, grad, weights, lr):
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        beta_1_power = tf.pow(tf.cast(self.beta_1, dtype), step)
        beta_2_power = tf.pow(tf.cast(self.beta_2, dtype), step)
        alpha = lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        m, m_rows = self._slot_rows("momentums", variable, rows)
        v, v_rows = self._slot_rows("velocities", variable, rows)
        m_rows = m_rows + (grad - m_rows) * (1 - self.beta_1)
        v_rows = v_rows + (tf.square(grad) - v_rows) * (1 - self.beta_2)
        _scatter(m, rows, m_rows)
        _scatter(v, rows, v_rows)
        if self.amsgrad:
            v_hat, v_hat_rows = self._slot_rows("velocity_hats", variable, rows)
            v_rows = tf.maximum(v_hat_rows, v_rows)
            _scatter(v_hat, rows, v_rows)
        return weights - (m_rows * alpha) / (tf.sqrt(v_rows) + self.epsilon)


@keras.saving.register_keras_serializable(package="kerastrain")
class LazyAdam(_LazyAdamRows, keras.optimizers.Adam):
    """`keras.optimizers.Adam` that updates only the touched rows of an embedding.

    Takes exactly `keras.optimizers.Adam`'s arguments. For a variable whose
    gradient is a `tf.IndexedSlices`, only the touched rows of the variable and
    of its moments are read and written; untouched rows' moments do not decay;
    the bias correction uses the global step. Dense variables update exactly as
    with `keras.optimizers.Adam`.
    """

    def __init__(self, *args, name="lazy_adam", **kwargs):
        super().__init__(*args, name=name, **kwargs)


@keras.saving.register_keras_serializable(package="kerastrain")
class LazyAdamW(_LazyAdamRows, keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` that updates (and decays) only the touched rows of an embedding.

    Takes exactly `keras.optimizers.AdamW`'s arguments; see `LazyAdam`. The
    weight decay of a row-sparse variable shrinks the touched rows only.
    """

    def __init__(self, *args, name="lazy_adamw", **kwargs):
        super().__init__(*args, name=name, **kwargs)


@keras.saving.register_keras_serializable(package="kerastrain")
class LazyAdagrad(_Lazy, keras.optimizers.Adagrad):
    """`keras.optimizers.Adagrad` that reads and writes only the touched rows of an embedding.

    Adagrad leaves a row with a zero gradient unchanged, so this computes what
    `keras.optimizers.Adagrad` computes, for the cost of the touched rows.
    """

    def __init__(self, *args, name="lazy_adagrad", **kwargs):
        super().__init__(*args, name=name, **kwargs)

    def _update_rows(self, variable, rows, grad, weights, lr):
        accumulator, acc_rows = self._slot_rows("accumulators", variable, rows)
        acc_rows = acc_rows + tf.square(grad)
        _scatter(accumulator, rows, acc_rows)
        return weights - (lr * grad) / tf.sqrt(acc_rows + self.epsilon)


@keras.saving.register_keras_serializable(package="kerastrain")
class LazyLion(_Lazy, keras.optimizers.Lion):
    """`keras.optimizers.Lion` that updates only the touched rows of an embedding.

    Keras's Lion moves every row each step (by the sign of its momentum), even
    with a zero gradient; here an untouched row and its momentum stay as they are.
    """

    def __init__(self, *args, name="lazy_lion", **kwargs):
        super().__init__(*args, name=name, **kwargs)

    def _update_rows(self, variable, rows, grad, weights, lr):
        dtype = variable.dtype
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        m, m_rows = self._slot_rows("momentums", variable, rows)
        weights = weights - lr * tf.sign(m_rows * beta_1 + grad * (1.0 - beta_1))
        _scatter(m, rows, m_rows * beta_2 + grad * (1.0 - beta_2))
        return weights


def is_lazy(optimizer) -> bool:
    """Whether `optimizer` (or the one a `LossScaleOptimizer` wraps) is one of these."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return isinstance(inner, _Lazy)


def read_rows(model) -> list:
    """Make `model`'s Keras `Embedding` layers read only the rows they look up.

    Keras's `Embedding` reads its whole table each step, then gathers. Once an
    optimizer has written rows in place (a scatter), TensorFlow copies the whole
    table at every such read (it cannot hand out a buffer that is updated in
    place), so a lazy step would cost the table's size again: 25-40 ms for
    2,000,000 x 32 floats on a 2-core VM. Reading the rows from the variable (a
    gather on it) avoids that; values and gradients are unchanged.

    kerastrain's `Trainer` calls this for a model compiled with a lazy optimizer.
    With Keras's own `model.fit`, call it once the model is built. Subclasses of
    `Embedding` with their own `call`, LoRA or quantized layers, and layers
    kerastrain already reads shard by shard are left as they are.

    Returns:
        The names of the layers changed.
    """
    changed = []
    for layer in {id(layer): layer for layer in _compat.variable_owners(model).values()}.values():
        if (type(layer).call is not keras.layers.Embedding.call
                or "_kerastrain_call" in layer.__dict__
                or getattr(layer, "lora_enabled", False)
                or getattr(layer, "quantization_mode", None)):
            continue
        object.__setattr__(layer, "_kerastrain_call", layer.call)
        object.__setattr__(layer, "call", _row_call(layer, layer.call))
        changed.append(layer.name)
    return changed


def _row_call(layer, original):
    import functools

    @functools.wraps(original)
    def call(inputs, *args, **kwargs):
        if args or kwargs or not isinstance(inputs, tf.Tensor):  # sparse, ragged: Keras's
            return original(inputs, *args, **kwargs)
        if inputs.dtype not in (tf.int32, tf.int64):
            inputs = tf.cast(inputs, tf.int32)
        rows = tf.gather(_as_tf(layer.embeddings), inputs)
        return tf.cast(rows, layer.compute_dtype)
    return call


# The names recipes and `compile(optimizer=...)` use.
LAZY_OPTIMIZERS = {"lazy_adam": LazyAdam, "lazy_adamw": LazyAdamW,
                   "lazy_adagrad": LazyAdagrad, "lazy_lion": LazyLion}
keras.saving.get_custom_objects().update(LAZY_OPTIMIZERS)

__all__ = ["LazyAdagrad", "LazyAdam", "LazyAdamW", "LazyLion", "is_lazy", "read_rows"]
