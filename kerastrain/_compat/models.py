"""Keras model internals: compile state, losses, metrics, a model's layers and lookup tables."""

from __future__ import annotations

import contextlib

import keras
import numpy as np
import tensorflow as tf


def compile_metrics(model):
    """The model's `CompileMetrics` container (or None): Keras 3 keeps it private, and
    kerastrain drives its stateless update with its own cross-replica reduction."""
    return getattr(model, "_compile_metrics", None)


def compile_loss(model):
    """The model's `CompileLoss` (holds per-output loss trackers), or None."""
    return getattr(model, "_compile_loss", None)


def layer_metrics(model):
    """Metrics the model's layers own and update in `call` (keras.io's endpoint layer:
    `self.accuracy_fn.update_state(...)`), which `model.metrics` lists after the compiled
    ones and `fit` logs: every metric with variables in `model.metrics` but the loss
    tracker, the compiled metrics container and the compiled loss's trackers."""
    loss = compile_loss(model)
    compiled = {id(m) for m in [getattr(model, "_loss_tracker", None), compile_metrics(model),
                                *(getattr(loss, "metrics", None) or [])] if m is not None}
    return [m for m in model.metrics if id(m) not in compiled and m.variables]


def symbolic_build(model, element_spec):
    """Create model, metric, loss and optimizer state from shapes only.

    `model.fit` does the same through `Trainer._symbolic_build`; calling it inside
    `strategy.scope()` places every variable the way the strategy wants before
    the first compiled step (creating them inside a `tf.function` under mirrored
    fails).
    """
    model._symbolic_build(data_batch=zeros_batch(element_spec))


def zeros_batch(element_spec):
    """A batch of one example of zeros shaped like `element_spec`: dense, sparse (no
    values) and ragged (one value per ragged row) tensors; None where the spec is of an
    optional input given none (`NoneTensorSpec`, `OptionalSpec`)."""
    def to_zeros(spec):
        if type(spec).__name__ == "NoneTensorSpec" or isinstance(spec, tf.OptionalSpec):
            return None
        shape = [1 if d is None else d for d in spec.shape]
        if isinstance(spec, tf.SparseTensorSpec):
            return tf.SparseTensor(tf.zeros([0, len(shape)], tf.int64),
                                   tf.zeros([0], spec.dtype), shape)
        if isinstance(spec, tf.RaggedTensorSpec):
            rank = spec.ragged_rank
            values = tf.zeros([1] + shape[rank + 1:], spec.dtype)
            return tf.RaggedTensor.from_nested_row_lengths(
                values, [tf.ones([1], spec.row_splits_dtype)] * rank)
        return tf.zeros(shape, spec.dtype)
    return tf.nest.map_structure(to_zeros, element_spec)


def eager_build(model, element_spec):
    """`symbolic_build` for a model compiled with `run_eagerly=True` whose `call` needs
    values (`.numpy()`, a print of a value), which a symbolic build cannot give it.

    Keras's `fit` without a strategy builds such a model in its first (eager) step; under a
    strategy its symbolic build fails ("Unable to automatically build the model"). Here the
    model runs once, eagerly, on a batch of zeros shaped like the data (its `call` sees that
    batch), and the compiled metrics and loss are built from its outputs, without updating
    them (`CompileMetrics.build` / `CompileLoss.build`, Keras 3.15.1). The optimizer is built
    by the caller, as after `symbolic_build`.
    """
    from keras.src.trainers import data_adapters

    x, y, _ = data_adapters.data_adapter_utils.unpack_x_y_sample_weight(
        zeros_batch(element_spec))
    y_pred = model(x, training=False)
    for container in (model._compile_metrics, model._compile_loss):
        if container is not None and not container.built and y is not None:
            container.build(y, y_pred)


def compile_args(model):
    """The arguments the user passed to `compile()`, as live objects.

    `get_compile_config()` serialises them, which fails for unregistered custom
    losses and metrics; the raw objects are kept in `_compile_config.config`.
    """
    config = getattr(model, "_compile_config", None)
    if config is None:
        return None
    args = dict(getattr(config, "config", {}) or {})
    # `auto_scale_loss` is not kept there (Keras 3.10-3.15): it is read off what compile
    # did. A mixed_float16 model whose optimizer compile left unwrapped was compiled with
    # `auto_scale_loss=False`, which a copy compiled again must keep.
    if getattr(model.dtype_policy, "name", None) == "mixed_float16" and \
            getattr(model, "optimizer", None) is not None and \
            not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer):
        args["auto_scale_loss"] = False
    return args


def stateless_scope(mapping):
    return keras.StatelessScope(state_mapping=mapping)


@contextlib.contextmanager
def model_losses(model, losses):
    """While active, `model.losses` is `losses` (computed by the forward pass outside).

    kerastrain computes the compiled loss and metric deltas inside a stateless
    scope, where `Layer.losses` only sees losses recorded *in* that scope, so the
    `add_loss` / activity-regularizer losses of a forward pass run outside it
    would be dropped. Keras's own stateless (JAX) trainer hands them over the
    same way, through `Layer._losses_override`.
    """
    model._losses_override = list(losses)
    try:
        yield
    finally:
        model._losses_override = []


def compute_loss(model, x, y, y_pred, sample_weight, training):
    """`model.compute_loss`, also when a user's override has no `training` argument.

    Keras 3.3 added `training=`; its `_compute_loss` calls an override with or without
    it, as `model.fit` does (kerastrain needs Keras >= 3.10, which has it).
    """
    return model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                               training=training)


def flatten_metrics_in_order(model, logs):
    """`model.evaluate(..., return_dict=False)`'s list (or scalar) from a logs dict.

    Keras orders the values by the model's metrics, its compiled metrics expanded,
    in `Trainer._flatten_metrics_in_order` (checked on Keras 3.10-3.15).
    """
    return model._flatten_metrics_in_order(logs)


def compile_token(model):
    """What the model's latest `compile` call made: Keras's `_compile_config`, a new object
    at every call (Keras 3.0-3.15, private), compared by identity to tell that the user's
    model was compiled again. None for a model never compiled."""
    return getattr(model, "_compile_config", None)


def model_supports_jit(model):
    """Keras's own test of whether every layer supports XLA (and op determinism is off):
    `keras.src.trainers.trainer.model_supports_jit`, private in Keras 3.3-3.15; the
    rule behind `jit_compile="auto"`."""
    from keras.src.trainers.trainer import model_supports_jit as supports
    return supports(model)


def keras_mask(tensor):
    """The Keras mask a layer attached to `tensor` (`Embedding(mask_zero=True)` and the
    layers after it), or None: `keras.src.backend.get_keras_mask` (Keras 3.5-3.15), not
    exported."""
    from keras.src.backend import get_keras_mask
    return get_keras_mask(tensor)


def all_layers(model):
    """Every layer nested in `model`, itself excluded (Keras 3's own walk, `_flatten_layers`,
    Keras 3.10-3.15)."""
    return list(model._flatten_layers(include_self=False))


def sublayers_built(model) -> bool:
    """Whether every layer inside `model` (not the model itself) has its variables.

    `Layer._flatten_layers` is Keras's own walk over nested layers (Keras 3.10-3.15).
    """
    return all(layer.built for layer in model._flatten_layers(include_self=False))


def variable_owners(model) -> dict:
    """{id(variable): layer} for the innermost layer that owns each of the model's variables.

    Keras 3 walks sublayers only through `_flatten_layers` and keeps a layer's own
    variables in `_trainable_variables` / `_non_trainable_variables`; errors about a
    partitioned variable name its layer.
    """
    owners = {}
    for layer in model._flatten_layers(include_self=True):
        for v in list(getattr(layer, "_trainable_variables", [])) + list(
                getattr(layer, "_non_trainable_variables", [])):
            owners[id(v)] = layer
    return owners


def lookup_layers(model):
    """Keras's lookup layers in `model` (StringLookup, IntegerLookup, the one inside
    TextVectorization). Their vocabulary is a `tf.lookup` table, not a variable, so
    `get_weights`/`set_weights` and `clone_model` do not carry an adapted one; the class
    is `keras.src.layers.preprocessing.index_lookup.IndexLookup` (Keras 3.3-3.15)."""
    from keras.src.layers.preprocessing.index_lookup import IndexLookup
    return [layer for layer in model._flatten_layers(include_self=False)
            if isinstance(layer, IndexLookup)]


def lookup_contents(layer):
    """What a lookup layer of `lookup_layers` looks up, for `set_lookup_contents`: its
    vocabulary (special tokens included, so indices stay) and, under `output_mode="tf_idf"`,
    its IDF weights (`idf_weights_const`, private; cut to the vocabulary's length, as
    `set_vocabulary` pads them again to `max_tokens`)."""
    vocabulary = layer.get_vocabulary(include_special_tokens=True)
    if layer.output_mode != "tf_idf":
        return vocabulary, None
    return vocabulary, np.asarray(layer.idf_weights_const)[:len(vocabulary)]


def set_lookup_contents(layer, contents):
    """Make a lookup layer's table (and IDF weights) again, holding `contents`
    (`lookup_contents`), where the current scope and device put them: the public
    `set_vocabulary`, given the IDF weights a `"tf_idf"` layer needs."""
    vocabulary, idf_weights = contents
    layer.set_vocabulary(vocabulary, idf_weights=idf_weights)


def renew_adapt_state(layer):
    """Make a lookup layer's adapt state (`token_counts`, and under `"tf_idf"`
    `token_document_counts`, `num_documents`: made in `IndexLookup.__init__` when no
    vocabulary was given, Keras 3.3-3.15) again, empty, on this process's device: the next
    `adapt` empties it first anyway. Nothing for a layer given its vocabulary."""
    if layer._has_input_vocabulary:
        return

    def counts():
        return tf.lookup.experimental.MutableHashTable(
            key_dtype=layer.vocabulary_dtype, value_dtype="int64", default_value=0)
    layer.token_counts = counts()
    if layer.output_mode == "tf_idf":
        layer.token_document_counts = counts()
        layer.num_documents = tf.Variable(0, dtype="int64", trainable=False)


def table_job(table):
    """The job of a lookup table's resource (None for a per-worker `DistributedTable`)."""
    if getattr(table, "is_distributed_table", False):
        return None
    handle = getattr(table, "_resource_handle", None)
    return tf.DeviceSpec.from_string(getattr(handle, "device", "") or "").job
