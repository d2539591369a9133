"""What one replica computes in one exact step: its share of the global mean loss, its gradients
and the metric deltas, packed into the totals vector the loops sum (`kerastrain.step.loops`).

Each replica's loss is weighed by its share of the global batch's examples, which makes the
summed gradient the one-device gradient for every loss Keras averages over examples. A loss
that divides by something else per replica (its unmasked entries, its sample weights) is not
averaged over examples; Keras fit under the same strategy weighs replicas alike, so kerastrain
trains it as Keras does there, and says so once when the step is traced (`say_losses`)."""

from __future__ import annotations

import logging

import tensorflow as tf

from kerastrain import _compat
from kerastrain.step import updates
from kerastrain.step import metrics as metrics_lib
from kerastrain.data import inputs as data_lib

logger = logging.getLogger("kerastrain")


def unpack(data):
    """`(x, y, sample_weight)` of a batch, as Keras unpacks it (x-only batches: y is None)."""
    return data_lib.split_batch(data)


def first_input(x):
    """The first tensor of a batch's inputs `x` (an optional input given None skipped)."""
    return next(t for t in tf.nest.flatten(x) if t is not None)


def batch_size(x):
    """The examples in a replica's batch `x` (dense, sparse or ragged), as float32."""
    first = first_input(x)
    if isinstance(first, tf.SparseTensor):
        n = first.dense_shape[0]
    elif isinstance(first, tf.RaggedTensor):
        n = first.nrows()
    else:
        n = tf.shape(first)[0]
    return tf.cast(n, tf.float32)


class ReplicaStep:
    """One replica's exact step of `model` (run inside `strategy.run`), and nothing else.

    Args:
        model: the compiled Keras model.
        metrics: the `metrics.MetricState` whose deltas the step packs.
        partitioned: partitioned variables (parameter servers): gradients and updates
            per shard; None elsewhere.
    """

    def __init__(self, model, metrics, partitioned=None):
        self.model = model
        self.metrics = metrics
        self.partitioned = partitioned
        self._said_masked = False

    def _forward(self, x, training):
        """`(y_pred, forward)`: the model's forward pass, and what `_losses_and_metrics`
        needs of it (None without layer-owned metrics).

        With metrics that layers update in `call`, the pass runs in a stateless scope in
        which those metrics' variables start at zero, so their updates come back as deltas
        (summed across replicas and steps like the compiled metrics'); the pass's
        `add_loss` losses are collected in the scope, and every other update it makes
        (batch statistics, seed states) is applied for real as it returns.
        """
        variables = self.metrics.layer_variables
        if not variables:
            return self.model(x, training=training), None
        zeros = [tf.zeros(v.shape, v.dtype) for v in variables]
        with metrics_lib.RecordingScope(list(zip(variables, zeros)),
                                        collect_losses=True) as scope:
            y_pred = self.model(x, training=training)
            losses = list(self.model.losses)
            deltas = [scope.get_current_value(v) for v in variables]
        scope.apply_updates_except(variables)
        return y_pred, (losses, deltas)

    def _losses_and_metrics(self, x, y, y_pred, sw, training, forward=None):
        """Keras's compiled loss plus `model.losses` (scaled 1/replicas by Keras), and
        the metric deltas.

        Called right after the forward pass, outside any stateless scope, so that
        `model.losses` holds that pass's `add_loss` and activity-regularizer losses
        and the weight regularizers read their live variables (inside the tape:
        gradients flow to them). Inside the scope below only the metrics' variables
        are mapped (to zeros), so their update gives deltas, not totals.
        """
        model = self.model
        variables = self.metrics.variables
        start = self.metrics.zeros()
        if forward is None:
            extra = list(model.losses)
        else:  # layer-owned metrics' deltas from the forward pass, its losses
            extra, deltas = forward
            start[len(start) - len(deltas):] = deltas
        with _compat.stateless_scope(list(zip(variables, start))) as scope, \
                _compat.model_losses(model, extra):
            loss = _compat.compute_loss(model, x, y, y_pred, sw, training)
            cm = _compat.compile_metrics(model)
            if cm is not None:
                cm.update_state(y, y_pred, sw)
            new = [scope.get_current_value(v) for v in variables]
        return loss, new

    def _pack(self, loss_sum, n, new_state):
        return tf.concat([tf.stack([loss_sum, n])] + self.metrics.flatten(new_state), axis=0)

    def gradients(self, data):
        """One replica's gradients of its share of the global mean loss of one batch.

        Returns:
            (gradients, examples in the global batch, the packed totals vector).
        """
        optimizer = self.model.optimizer
        x, y, sw = unpack(data)
        n = batch_size(x)
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        global_n = n
        if replicas > 1:
            global_n = tf.distribute.get_replica_context().all_reduce("sum", n)
        guard = EmptyBatchGuard(self.model, x, n, replicas)
        with tf.GradientTape() as tape:
            y_pred, forward = self._forward(x, training=True)
            if replicas > 1 and not self._said_masked:   # decided once, while tracing
                self._said_masked = True
                say_losses(self.model, y_pred, replicas, weighted=sw is not None)
            loss, state = self._losses_and_metrics(x, y, y_pred, sw, training=True,
                                                   forward=forward)
            # Keras returned (local mean + regularization) / replicas. Weighting each
            # replica by its share of the global batch makes the summed gradient the
            # gradient of the global mean, also when the last batch is partial.
            loss_sum = loss * (replicas * n)
            objective = tf.math.divide_no_nan(loss_sum, global_n)
            if hasattr(optimizer, "scale_loss"):
                objective = optimizer.scale_loss(objective)
        variables, _ = self.update_target()
        grads = guard.gradients(tape.gradient(objective, variables))
        return grads, global_n, self._pack(guard.value(loss_sum), n, state)

    def update_target(self):
        """(variables, optimizer) of an update: per shard for partitioned variables."""
        if self.partitioned:
            return (self.partitioned.flat(self.model.trainable_variables),
                    self.partitioned.update_optimizer)
        return self.model.trainable_variables, self.model.optimizer

    def train_step(self, data):
        grads, _, packed = self.gradients(data)
        variables, optimizer = self.update_target()
        updates.apply_summed(optimizer, grads, variables)
        return packed

    def eval_step(self, data):
        # The replica count Keras divided by (1 for coordinator-side evaluation).
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        x, y, sw = unpack(data)
        n = batch_size(x)
        y_pred, forward = self._forward(x, training=False)
        loss, state = self._losses_and_metrics(x, y, y_pred, sw, training=False,
                                               forward=forward)
        return self._pack(loss * (replicas * n), n, state)


class EmptyBatchGuard:
    """What a replica whose batch is empty must not change.

    When the last global batch has fewer examples than there are replicas,
    TensorFlow gives some replicas an empty batch. Keras's BatchNormalization
    takes the mean of nothing there: its gradient for `gamma` is NaN (summed
    into every replica's update) and this replica's copy of the moving mean and
    variance (aggregation "none": each replica keeps its own) becomes NaN, so
    that replica's inference gives NaN ever after. Measured under `model.fit`
    with MirroredStrategy too (docs/strategies.md). An empty replica contributes
    nothing: zero gradients, and its local non-trainable state is put back.

    Only for a model with such local state (batch statistics; a dropout seed) and
    when a replica's batch can be empty: several replicas, and a batch dimension
    the data does not fix. (An MLP with BatchNormalization under mirrored on this
    2-core machine: 6.36 ms CPU a step without, 6.69 with, within the noise.)
    """

    def __init__(self, model, x, n, replicas):
        self.n = n
        may_be_empty = replicas > 1 and first_input(x).shape[0] is None
        self.local = [v for v in model.non_trainable_variables
                      if getattr(v, "aggregation", None) == "none"] if may_be_empty else []
        self.active = bool(self.local)
        # Read before the forward pass (automatic control dependencies keep the order).
        self.before = [tf.identity(v.value) for v in self.local]

    def value(self, t):
        return tf.where(self.n > 0, t, tf.zeros_like(t)) if self.active else t

    def gradients(self, grads):
        """Zero gradients for an empty batch, and the local state restored."""
        if not self.active:
            return grads
        for v, old in zip(self.local, self.before):
            v.assign(tf.where(self.n > 0, v.value, old))
        return [g if g is None else tf.IndexedSlices(self.value(g.values), g.indices, g.dense_shape)
                if isinstance(g, tf.IndexedSlices) else self.value(g) for g in grads]


def say_losses(model, y_pred, replicas, weighted=False):
    """One line when the loss averages over unmasked entries only (a Keras mask on an
    output, as `Embedding(mask_zero=True)` gives sequence outputs, or a loss's
    `ignore_class`): each replica then averages over its own share's unmasked entries,
    and its weight is its share of the batch's examples, not of the unmasked entries,
    so the step differs slightly from one device's (Keras fit weights replicas alike). The
    same for a loss divided by the batch's sample weights (`weighted`: the batch has them)."""
    masked = [i for i, t in enumerate(tf.nest.flatten(y_pred))
              if _compat.keras_mask(t) is not None]
    ignoring = [loss for loss in tf.nest.flatten(getattr(model, "loss", None))
                if getattr(loss, "ignore_class", None) is not None]
    if masked or ignoring:
        what = "a Keras mask on output(s) %s" % masked if masked else "`ignore_class`"
        logger.info(
            "the loss averages over unmasked entries only (%s): under %d replicas each "
            "averages over its own share's, weighted by its share of the examples, so losses "
            "and updates differ slightly from one device's (as under Keras fit with this "
            "strategy); one device trains it exactly", what, replicas)
    if weighted and any(getattr(loss, "reduction", None) == "mean_with_sample_weight"
                        for loss in tf.nest.flatten(getattr(model, "loss", None))):
        logger.info(
            "the loss divides by the batch's sum of sample weights "
            "(reduction='mean_with_sample_weight'): under %d replicas each divides by its own "
            "share's, weighted by its share of the examples, so losses and updates differ "
            "slightly from one device's (as under Keras fit with this strategy); the default "
            "reduction ('sum_over_batch_size') or one device trains exactly", replicas)
