"""Compiled inner loops: many steps per `tf.function` call, reduced exactly across replicas.

Each replica returns one flat float32 vector per step (`kerastrain.step.replica`):
`[sum of per-example losses (+ regularization x examples), examples, metric deltas...]`
where the metric deltas are the change of every metric variable, computed with
Keras's stateless metric API from a zero state (`kerastrain.step.metrics`). The loop
sums that vector across replicas with `strategy.reduce(SUM)` and across its steps,
and returns it. The host adds loops up in float64 and turns the totals back into
metric results.

Why not Keras's own metric variables: they are `on_read` variables, which
parameter-server training turns into caching variables that lose updates
(measured: 336 of 480 examples counted). Returned values are also counted once
even when the coordinator retries a closure after a worker failure.
"""

from __future__ import annotations

import logging

import keras
import tensorflow as tf

from kerastrain.step import metrics as metrics_lib
from kerastrain.step import replica as replica_lib
from kerastrain._tracing import compiled, runs_eagerly, unconverted

logger = logging.getLogger("kerastrain")


def loop_condition(stop_flag):
    """The condition of a training loop: steps left, and no stop requested."""
    def go_on(steps, num_steps):
        # The stop request is part of the loop's condition, not a branch in its
        # body: a branch per step cost 3.6% more CPU in the core benchmark.
        if stop_flag is None:
            return steps < num_steps
        return tf.logical_and(steps < num_steps, tf.logical_not(stop_flag.read_value()))
    return go_on


def say_unrolled(step):
    """Once a Step: its training loop runs `step.unroll` steps per iteration."""
    if not getattr(step, "_said_unrolled", False):
        step._said_unrolled = True
        logger.debug("training loop: %d steps per iteration where that many are known to be "
                     "left, so consecutive steps overlap; same steps, same order (switch off "
                     "with tuning={'unroll_steps': False})", step.unroll)


def skip_loop():
    """`fn(iterator, n) -> skipped`: read and drop up to n batches (resuming mid-pass;
    a step reads `accumulation` of them)."""
    @tf.function
    def skip(iterator, num_batches):
        skipped = tf.constant(0, tf.int32)
        for _ in tf.range(num_batches):
            optional = iterator.get_next_as_optional()
            if not optional.has_value():
                break
            skipped += 1
        return skipped
    return skip


class Step:
    """The compiled functions for one model under one strategy, and nothing else.

    `train_loop` and `eval_loop` each run many steps per `tf.function` call; a driver
    (`kerastrain.loop.driver`) decides how many and where. Under parameter servers
    `kerastrain.step.ps.steps.PSStep` runs them on workers and adds the loops only they need.
    """

    def __init__(self, built, model, global_step, jit_compile=False, stop_flag=None,
                 partitioned=None, accumulation=1, unroll=1):
        from kerastrain.step import accumulation as accumulation_lib

        self.built = built
        self.stop_flag = stop_flag  # a bool variable; True ends a training loop before a step
        self.strategy = built.strategy
        self.model = model
        self.global_step = global_step
        # `run_eagerly=True` (Keras's debugging mode): the same loops, not compiled.
        self.eager = runs_eagerly(model)
        self.metrics = metrics_lib.MetricState(model)
        # Partitioned variables (parameter servers): gradients and updates per shard.
        self.partitioned = partitioned
        # What each replica computes in one step (its gradients, update and totals).
        self.replica = replica_lib.ReplicaStep(model, self.metrics, partitioned)
        self._train = {}  # XLA or not -> its compiled training loop
        self._eval = None
        # XLA fuses the forward pass, gradients and optimizer update of one step. The
        # other variant is made on demand (`train_loop(jit=...)`: `jit_compile="auto"`
        # measures both).
        self.jit_compile = bool(jit_compile)
        self.jit_trial = None  # `tuning.JitTrial` where jit_compile="auto" measures
        self._replicas = {False: self.replica.train_step}
        # Batches per update: more than one when the optimizer accumulates gradients.
        self.accumulation = accumulation
        # Training steps per loop iteration where that many are known to be left (`_until_end`
        # on in-memory input, `PSStep.worker_steps`).
        self.unroll = unroll
        self._accumulator = (accumulation_lib.Accumulator(self, accumulation, jit_compile)
                             if accumulation > 1 else None)
        self._batches = None  # `batch_loop`, made on first use

    # -- what a loop returns, and how results add up ---------------------------

    @property
    def width(self) -> int:
        """Length of the float vector a loop returns: `[loss, examples, ...]`."""
        return self.metrics.width

    def accumulate(self, totals, part):
        """Totals after another step or loop (tensors in a loop, NumPy on the host)."""
        return totals + part

    def results(self, totals, kind="train") -> dict:
        """The logs (`loss` first, then the metrics) of accumulated totals of a
        `"train"` or `"eval"` loop."""
        return self.metrics.results(totals)

    def reduce(self, per_replica):
        """Sum a per-replica value across replicas."""
        return self.strategy.reduce("SUM", per_replica, axis=None)

    def _train_replica_for(self, jit):
        """What one replica runs for a training step, compiled with XLA or not."""
        if jit not in self._replicas:
            self._replicas[jit] = tf.function(self.replica.train_step, jit_compile=True)
        return self._replicas[jit]

    def _run_train(self, data, jit=None):
        """One step on every replica, reduced: what the loop accumulates (`jit`: XLA or
        not; None: the Step's own choice)."""
        replica_fn = self._train_replica_for(self.jit_compile if jit is None else jit)
        return self.reduce(self.strategy.run(replica_fn, args=(data,)))

    def _run_eval(self, data):
        return self.reduce(self.strategy.run(self.replica.eval_step, args=(data,)))

    # -- compiled loops ------------------------------------------------------

    def train_loop(self, jit=None):
        """`fn(iterator, num_steps) -> (totals float32[width], steps int32)`.

        It stops early at the end of a finite dataset (under parameter servers the
        per-worker data repeats and exactly `num_steps` run: `PSStep`).
        `jit`: the loop whose steps are compiled with XLA (True) or not (False), on one
        replica without gradient accumulation (`tuning.JitTrial`); None: the Step's own.
        """
        jit = self.jit_compile if jit is None else bool(jit)
        if jit not in self._train:
            self._train[jit] = (self._build_train_loop() if jit == self.jit_compile
                                else self._build_variant_loop(jit))
        return self._train[jit]

    def _build_variant_loop(self, jit):
        if self._accumulator is not None:
            raise ValueError("A training loop of the other `jit_compile` is made on one "
                             "replica without gradient accumulation only.")
        return self._until_end(lambda data: self._run_train(data, jit), after=self._count_steps,
                               stop_flag=self.stop_flag, unroll=self.unroll)

    def _build_train_loop(self):
        if self._accumulator is not None:
            return self._accumulator.sync_loop(loop_condition(self.stop_flag),
                                               after=self._count_steps)
        return self._until_end(self._run_train, after=self._count_steps,
                               stop_flag=self.stop_flag, unroll=self.unroll)

    def _count_steps(self, steps):
        """Traced after a synchronous loop: the global step advances by the steps it ran."""
        self.global_step.assign_add(tf.cast(steps, self.global_step.dtype))

    def batch_loop(self):
        """One batch per call with the update at each k-th (`Accumulator.batch_loop`), for
        callbacks that watch every batch; None without accumulation (or under ps: `PSStep`)."""
        if self._accumulator is None:
            return None
        if self._batches is None:
            self._batches = self._accumulator.batch_loop(after=self._count_steps)
        self._accumulator.reset()  # a fit stopped inside a group left its batches held
        return self._batches

    def reset_held(self):
        if self._accumulator is not None:
            self._accumulator.reset()

    def _until_end(self, run_one, after=None, stop_flag=None, unroll=1):
        """A compiled loop of up to `num_steps` batches that stops where the data ends.

        `unroll` > 1: on an iterator that knows how many batches its pass has left
        (`in_step_batches`), `unroll` steps per iteration of the loop while that many are left,
        then one. The steps and their order are the same, but an iteration waits for
        all of its body, so steps in one iteration overlap: the next step's first
        layers run while the previous one still updates its last. A stop request is
        seen between iterations.
        """
        go_on = unconverted(loop_condition(stop_flag))
        run_one, accumulate = unconverted(run_one), unconverted(self.accumulate)
        after = after and unconverted(after)

        def loop(iterator, num_steps):
            totals = tf.zeros([self.width], tf.float32)
            steps = tf.constant(0, tf.int32)
            if hasattr(iterator, "read_ahead"):  # in-memory batches: positions known ahead
                first, left = iterator.read_ahead()
                ahead = tf.minimum(num_steps, left)
                if unroll > 1:
                    say_unrolled(self)
                    while go_on(steps + (unroll - 1), ahead):
                        for k in range(unroll):
                            totals = accumulate(totals, run_one(iterator.batch_at(
                                first + tf.cast(steps + k, tf.int64))))
                        steps += unroll
                while go_on(steps, ahead):
                    totals = accumulate(totals, run_one(iterator.batch_at(
                        first + tf.cast(steps, tf.int64))))
                    steps += 1
                iterator.advance(steps)
                if after is not None:
                    after(steps)
                return totals, steps
            while go_on(steps, num_steps):
                optional = iterator.get_next_as_optional()
                if not optional.has_value():
                    break
                totals = accumulate(totals, run_one(optional.get_value()))
                steps += 1
            if after is not None:
                after(steps)
            return totals, steps
        return compiled(loop, eager=self.eager)

    def eval_loop(self):
        """`fn(iterator, num_steps) -> (totals, steps)` over distributed data (sync strategies)."""
        if self._eval is None:
            self._eval = self._build_eval_loop()
        return self._eval

    def _build_eval_loop(self):
        return self._until_end(self._run_eval)

    def start_epoch(self):
        """Before each epoch and evaluation: from what `reset_state` leaves (`metrics`)."""
        self.metrics.start()


def overrides(model, name) -> bool:
    """Whether the model's class overrides Keras's `train_step` / `test_step`."""
    return getattr(type(model), name) is not getattr(keras.Model, name)
