"""Gradient accumulation: one optimizer update from k batches, under every strategy.

Keras 3 accumulates inside `optimizer.apply`, applying in a `cond` on its
iteration count; tf.distribute strategies cannot synchronise replicas inside a
`cond` ("merge_call called while defining a new graph"). kerastrain's own step
does it instead: each step of its compiled loop reads up to k batches, each
replica sums its gradients over them (weighted by the examples of each batch),
and one `optimizer.apply` divides the sum by the examples of all k batches. So
one step over k batches of B examples gives the update one batch of k x B gives,
also when the data ends inside a group (that step uses the batches it got).

What a step means: one update. `steps_per_epoch`, `global_step`, the checkpoints'
positions and `optimizer.iterations` count updates; the optimizer's private
batch counter and its learning-rate schedule count batches (k per update), as
under Keras.
"""

from __future__ import annotations

import contextlib
import logging

import tensorflow as tf

from kerastrain import _compat
from kerastrain.step import updates
from kerastrain._tracing import compiled, unconverted

logger = logging.getLogger("kerastrain")


def _accumulating(optimizer):
    # A LossScaleOptimizer (mixed float16) wraps the optimizer that accumulates.
    return getattr(optimizer, "inner_optimizer", optimizer)


def steps_of(optimizer) -> int:
    """The optimizer's `gradient_accumulation_steps`, or 1 when it accumulates nothing."""
    return int(getattr(_accumulating(optimizer), "gradient_accumulation_steps", None) or 1)


@contextlib.contextmanager
def keras_accumulation_off(optimizer):
    """While tracing or building: Keras's own accumulation off (kerastrain does it), so
    `apply` updates at once and `build` makes no accumulator variables."""
    optimizer = _accumulating(optimizer)
    steps = getattr(optimizer, "gradient_accumulation_steps", None)
    if not steps:
        yield
        return
    optimizer.gradient_accumulation_steps = None
    try:
        yield
    finally:
        optimizer.gradient_accumulation_steps = steps


def whole_groups(optimizer, steps) -> int:
    """The optimizer's count of batches (returned), made whole groups of `steps`.

    kerastrain's updates start a group where the count stands (`Accumulator._update`).
    A `model.fit` that ended inside a group left the gradients of its batches in Keras's
    accumulators, which kerastrain's own accumulation does not read: they are dropped
    (emptied where the optimizer has them), said, and the count goes back to the group's
    start, so that Adam's step and the schedule go on from the updates made.
    """
    counter = _compat.iteration_counter(optimizer)
    count = int(counter.numpy())
    held = count % steps
    if held:
        logger.warning(
            "the model's optimizer held the gradients of %d batch(es) of an unfinished group "
            "of gradient_accumulation_steps=%d (a model.fit ended inside the group): kerastrain "
            "accumulates itself and starts a new group, so those gradients are dropped, unlike "
            "a second model.fit", held, steps)
        counter.assign(count - held)
        for accumulator in _compat.gradient_accumulators(optimizer):
            accumulator.assign(tf.zeros_like(accumulator))
    return count - held


class Accumulator:
    """The compiled training loops of a `loops.Step` whose optimizer accumulates k batches.

    Args:
        step: the `loops.Step`; its `replica.gradients(data)` gives one replica's
            gradients of one batch and the batch's packed totals, and its
            `replica.update_target()` the variables and optimizer an update applies to.
        steps: k, the batches per update.
    """

    def __init__(self, step, steps, jit_compile=False):
        self.step = step
        self.steps = steps
        self._present = None  # which variables get a gradient (known when traced)
        self._held = None  # `batch_loop`'s sums between calls: per-replica variables
        # The optimizer's batches before this Trainer (an earlier `model.fit`, carried by
        # `instances.carry_optimizer`), whole groups. Under parameter servers a group's batch
        # count comes from the global step, which starts at 0 in each Trainer: these come
        # first (`kerastrain.step.ps.steps.PSStep`).
        self.batches_counted = whole_groups(step.model.optimizer, steps)
        # XLA fuses one batch's forward pass and gradients; the update runs apart.
        self._run_micro = (tf.function(self._micro, jit_compile=True) if jit_compile
                           else self._micro)

    # -- per replica ---------------------------------------------------------------

    def _micro(self, data):
        """One replica's gradient sum over one batch (x the batch's global examples)."""
        grads, global_n, packed = self.step.replica.gradients(data)
        present = [g is not None for g in grads]
        if self._present is None:
            self._present = present
        elif present != self._present:
            raise ValueError("The model's gradients reach different variables from one batch "
                             "to the next, so they cannot be accumulated.")
        return [g * global_n for g in grads if g is not None], packed

    def _apply(self, sums, examples, last):
        variables, optimizer = self.step.replica.update_target()
        if sums is None:  # `batch_loop`: the sums held in this replica's variables
            sums = [held.read_value() for held, on in zip(self._held, self._present) if on]
        sums = iter(sums)
        grads = [next(sums) / examples if on else None for on in self._present]
        with keras_accumulation_off(optimizer), _compat.learning_rate_at(optimizer, last):
            updates.apply_summed(optimizer, grads, variables)

    # -- compiled loops ------------------------------------------------------------

    def _first(self, data):
        """Run the first batch of a group: (gradient sums, totals, examples)."""
        strategy = self.step.strategy
        sums, packed = strategy.run(self._run_micro, args=(data,))
        part = self.step.reduce(packed)
        return sums, part, part[1]

    def _add(self, sums, data, totals, examples):
        strategy = self.step.strategy
        more, packed = strategy.run(self._run_micro, args=(data,))
        sums = strategy.run(lambda a, b: [x + y for x, y in zip(a, b)], args=(sums, more))
        part = self.step.reduce(packed)
        return sums, self.step.accumulate(totals, part), examples + part[1]

    def _update(self, sums, examples, before=None):
        """Apply a group, seeing the iteration counts Keras would.

        Keras counts batches in `_iterations`; at a group's last batch its schedule
        reads that batch's index, and `optimizer.iterations` (Adam's bias correction)
        reads the index // k. A group the data ends early counts as k batches too, so
        `optimizer.iterations` stays the number of updates. `before`: the batches
        before this group, when the counter cannot be trusted (parameter servers).
        """
        counter = _compat.iteration_counter(self.step.model.optimizer)
        before = counter.value if before is None else tf.cast(before, counter.dtype)
        last = before + self.steps - 1
        counter.assign(last // self.steps)
        self.step.strategy.run(self._apply, args=(sums, examples, last))
        counter.assign(last + 1)

    def group_parts(self):
        """`_first`, `_add` and `_update` as the compiled loops call them (`unconverted`)."""
        return unconverted(self._first), unconverted(self._add), unconverted(self._update)

    def sync_loop(self, go_on, after):
        """`fn(iterator, num_steps) -> (totals, steps)` that stops where the data ends."""
        k = self.steps
        go_on, after, accumulate = unconverted(go_on), unconverted(after), unconverted(
            self.step.accumulate)
        first, add, update = self.group_parts()

        def loop(iterator, num_steps):
            totals = tf.zeros([self.step.width], tf.float32)
            steps = tf.constant(0, tf.int32)
            while go_on(steps, num_steps):
                optional = iterator.get_next_as_optional()
                if not optional.has_value():
                    break
                sums, totals_add, examples = first(optional.get_value())
                totals = accumulate(totals, totals_add)
                batches = tf.constant(1, tf.int32)
                while batches < k:
                    optional = iterator.get_next_as_optional()
                    if not optional.has_value():
                        break
                    sums, totals, examples = add(sums, optional.get_value(), totals, examples)
                    batches += 1
                update(sums, examples)
                steps += 1
            after(steps)
            return totals, steps
        return compiled(loop, eager=self.step.eager)

    def batch_loop(self, after):
        """`fn(iterator) -> (totals, steps, batches)`: one batch per call, the update after
        each k-th (or, with fewer held, where the data ends: a call that reads nothing).

        For callbacks that watch every batch: under `model.fit` the optimizer applies at
        every k-th batch, so a callback sees the variables change there and only there.
        Each replica holds its gradient sums between calls in variables of its own
        (`ON_READ`), which `reset()` empties (a rewind, a resume: the group's batches are
        read again). `batches`: the batches of the group read so far (0 at a flush).
        """
        strategy, k = self.step.strategy, self.steps
        if self._held is None:
            variables, _ = self.step.replica.update_target()
            with strategy.scope():
                self._held = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                          synchronization=tf.VariableSynchronization.ON_READ,
                                          aggregation=tf.VariableAggregation.SUM)
                              for v in variables]
                self._held_examples = tf.Variable(0.0, trainable=False)
                self._held_batches = tf.Variable(0, trainable=False)

        def hold(sums):
            sums = iter(sums)
            for held, on in zip(self._held, self._present):
                if on:
                    held.assign_add(next(sums))

        @unconverted
        def read_one(batch, totals):
            sums, packed = strategy.run(self._run_micro, args=(batch,))
            part = self.step.reduce(packed)
            strategy.run(hold, args=(sums,))
            self._held_examples.assign_add(tf.cast(part[1], tf.float32))
            self._held_batches.assign_add(1)
            return self.step.accumulate(totals, part), self._held_batches.read_value()

        @unconverted
        def flush():
            self._update(None, tf.cast(self._held_examples.read_value(), tf.float32))
            self.reset()

        after = unconverted(after)

        def loop(iterator):
            totals = tf.zeros([self.step.width], tf.float32)
            steps, batches = tf.constant(0, tf.int32), tf.constant(0, tf.int32)
            optional = iterator.get_next_as_optional()
            if optional.has_value():
                totals, batches = read_one(optional.get_value(), totals)
            held = self._held_batches.read_value()
            if held >= k or (batches == 0 and held > 0):
                flush()
                steps = tf.constant(1, tf.int32)
            after(steps)
            return totals, steps, batches

        return compiled(loop, eager=self.step.eager)

    def reset(self):
        """Drop the sums a `batch_loop` holds (the data goes back to a group's start)."""
        if self._held is not None:  # each replica empties its own (ON_READ) sums
            self.step.strategy.run(lambda: [h.assign(tf.zeros_like(h)) for h in self._held])
            self._held_examples.assign(0.0)
            self._held_batches.assign(0)
