"""How a step's gradients update the variables: one device's arithmetic under any replicas."""

from __future__ import annotations

import keras
import tensorflow as tf

from kerastrain import _compat


def apply_summed(optimizer, grads, variables):
    """`optimizer.apply` in a replica context, clipping (`clipnorm`, `global_clipnorm`,
    `clipvalue`) acting on the gradient summed over the replicas, as on one device.

    Keras 3's optimizers clip each replica's part before they are summed, so under 2
    replicas `clipnorm=1.0` lets a step of norm 2 through, and the same model trains
    differently on one device. Here the replicas sum their gradients, each clips the
    sum alike, and replica 0 alone hands it to `apply`, whose own sum then adds zeros
    (exact). Without clipping, or with one replica, `apply` as Keras runs it.
    """
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1 or \
            not _compat.clips_gradients(optimizer):
        optimizer.apply(grads, variables)
        return
    present = [g for g in grads if g is not None]
    summed = iter(_compat.clip_as_optimizer(optimizer, context.all_reduce("sum", present)))
    first = tf.equal(context.replica_id_in_sync_group, 0)

    def mine(g):
        if isinstance(g, tf.IndexedSlices):
            return tf.IndexedSlices(tf.where(first, g.values, tf.zeros_like(g.values)),
                                    g.indices, g.dense_shape)
        return tf.where(first, g, tf.zeros_like(g))
    grads = [None if g is None else mine(next(summed)) for g in grads]
    with _compat.clipping_off(optimizer):
        optimizer.apply(grads, variables)


def finalize(model, epochs):
    """What `model.fit` does once its epochs end (Keras 3.15, `epochs > 0`): the optimizer's
    `finalize_variable_values`, which puts the moving averages of an optimizer with
    `use_ema=True` into the model's variables (nothing for other optimizers)."""
    if epochs > 0 and isinstance(model.optimizer, keras.optimizers.Optimizer):
        model.optimizer.finalize_variable_values(model.trainable_weights)
