"""The step under parameter servers: loops a `ClusterCoordinator` schedules on workers.

Workers run their loops at once, each updating the variables on the servers: a loop runs
exactly `num_steps` steps on data that repeats (`PSStep.train_loop`), or reads one shared
tf.data service job per pass (`pass_loop`), or the batches at given positions (exact visits,
`positions_loop`, `kerastrain.distribute.ps.visits`). Evaluation runs on the coordinator
itself (`eval_loop_local`). A model's own `train_step` (`PSModelStep`) returns its metric
updates as deltas, summed exactly.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from kerastrain import _compat
from kerastrain.data import inputs as data_lib
from kerastrain.step import own_step
from kerastrain.step.loops import Step, say_unrolled
from kerastrain.step.metrics import MetricState, RecordingScope, flat_logs
from kerastrain.step.replica import batch_size
from kerastrain._tracing import unconverted


def step_for(built, model, global_step, *, policy, **options):
    """`own_step.step_for` choosing between `PSStep` and `PSModelStep`."""
    return own_step.step_for(built, model, global_step, policy=policy,
                             classes=(PSStep, PSModelStep), **options)


class PSStep(Step):
    """kerastrain's exact step, its training loops run on parameter-server workers (see the
    module docstring); `Step` says what each loop returns."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pass = None
        self._eval_local = None

    # -- training on workers -------------------------------------------------------------

    def _build_variant_loop(self, jit):
        raise ValueError("A training loop of the other `jit_compile` is made on one "
                         "replica without gradient accumulation only.")

    def _build_train_loop(self):
        @tf.function
        def loop(iterator, num_steps):
            totals, _ = self.worker_steps(lambda state: (next(iterator), state),
                                          tf.constant(0, tf.int32), num_steps)
            return totals, num_steps
        return loop

    def batch_loop(self):
        """None: a worker's loop runs whole steps (`Step.batch_loop`)."""
        return None

    def worker_steps(self, read, state, num_steps, width=None):
        """Traced on a parameter-server worker: `num_steps` steps (updates), each reading
        `accumulation` batches by `read(state) -> (batch, state)`. Returns (totals, state)."""
        if self._accumulator is not None:
            return self._accumulated_steps(read, state, num_steps)
        totals = tf.zeros([width or self.width], tf.float32)
        read, worker_step = unconverted(read), unconverted(self._worker_step)
        if self.unroll > 1:  # exactly `num_steps` run: `unroll` per iteration, then the rest
            say_unrolled(self)
            for _ in tf.range(num_steps // self.unroll):
                for _ in range(self.unroll):
                    batch, state = read(state)
                    totals = worker_step(totals, batch)
            num_steps = num_steps % self.unroll
        for _ in tf.range(num_steps):
            batch, state = read(state)
            totals = worker_step(totals, batch)
        return totals, state

    def _worker_step(self, totals, batch):
        """Traced on a parameter-server worker: one step on `batch`, added to `totals`."""
        # Keras's own count of updates, a layer's counters and totals (`assign_add` in
        # `call`) would lose increments with workers updating at once. (A model's own
        # step may keep no optimizer: None.)
        optimizer = self.model.optimizer
        counter = [] if optimizer is None else [_compat.iteration_counter(optimizer)]
        with _compat.atomic_adds(self.model.variables + self.model.metrics_variables + counter):
            totals = self.accumulate(totals, self._run_train(batch))
        self.global_step.assign_add(1)
        return totals

    def _accumulated_steps(self, read, state, num_steps):
        """`worker_steps` where the optimizer accumulates k batches per update
        (`accumulation.Accumulator`; the data repeats)."""
        accumulator = self._accumulator
        k = accumulator.steps
        read, accumulate = unconverted(read), unconverted(self.accumulate)
        first, add, update = accumulator.group_parts()
        totals = tf.zeros([self.width], tf.float32)
        for _ in tf.range(num_steps):
            batch, state = read(state)
            sums, part, examples = first(batch)
            totals = accumulate(totals, part)
            for _ in tf.range(k - 1):
                batch, state = read(state)
                sums, totals, examples = add(sums, batch, totals, examples)
            # Keras's counter loses increments under asynchronous training: the
            # batches before this group come from the exact step.
            update(sums, examples,
                   before=self.global_step.read_value() * k + accumulator.batches_counted)
            self.global_step.assign_add(1)
        return totals, state

    def pass_loop(self):
        """Reading one shared job per pass (the tf.data service):
        `fn(iterator, worker, num_steps) -> (totals, steps, worker index)`, up to
        `num_steps` steps, fewer where this worker's reader of the job has ended;
        `worker` yields the index of the worker it runs on."""
        if self._pass is None:
            self._pass = self._build_pass_loop()
        return self._pass

    def _build_pass_loop(self):
        worker_step = unconverted(self._worker_step)

        @tf.function
        def loop(iterator, worker, num_steps):
            totals = tf.zeros([self.width], tf.float32)
            steps = tf.constant(0, tf.int32)
            while steps < num_steps:
                optional = iterator.get_next_as_optional()
                if not optional.has_value():
                    break
                totals = worker_step(totals, optional.get_value())
                steps += 1
            return totals, steps, next(worker)
        return loop

    def positions_loop(self, reader, fresh=False):
        """The compiled loops of exact visits (`visits.loop`)."""
        return reader.loop(self, fresh)

    # -- evaluation on the coordinator ---------------------------------------------------

    def eval_loop_local(self):
        """Coordinator-side evaluation: a plain loop reading variables from the ps."""
        if self._eval_local is None:
            self._eval_local = self._build_eval_loop_local()
        return self._eval_local

    def _run_eval_local(self, data):
        return self.replica.eval_step(data)

    def _build_eval_loop_local(self):
        return self._until_end_local(self._run_eval_local)

    def _until_end_local(self, run_one):
        """`_until_end` for coordinator-side evaluation.

        The step runs in the while body, not in a branch: a `cond` does not forward
        call-time captures such as the handle of a `DistributedTable` (a lookup layer
        made in the ps scope), a while loop does (while_v2's deferred captures). The
        next batch is read only while `steps < num_steps`, so none is lost between calls.
        """
        run_one, accumulate = unconverted(run_one), unconverted(self.accumulate)

        @unconverted
        def next_or_empty(iterator, steps, num_steps):
            return tf.cond(steps < num_steps, iterator.get_next_as_optional,
                           lambda: tf.experimental.Optional.empty(iterator.element_spec))

        @tf.function
        def loop(iterator, num_steps):
            totals = tf.zeros([self.width], tf.float32)
            steps = tf.constant(0, tf.int32)
            optional = next_or_empty(iterator, steps, num_steps)
            while optional.has_value():
                totals = accumulate(totals, run_one(optional.get_value()))
                steps += 1
                optional = next_or_empty(iterator, steps, num_steps)
            return totals, steps
        return loop


class PSModelStep(own_step.ModelStep, PSStep):
    """A model's own `train_step` / `test_step` on parameter-server workers.

    Workers run the training step concurrently, and the model's metric variables live on
    the ps: Keras's metric variables (`on_read`) become caching variables there and lose
    updates (measured, 2 workers: a `Sum` of the examples counted 704 and 560 of 768 in two
    epochs). So each step runs in a stateless scope in which the metric variables start at
    zero (`run_with_metric_deltas`): what the step adds to them comes back as deltas, summed
    exactly after `examples` like kerastrain's own step's (`metrics.MetricState`), and a log
    named like one of `model.metrics`' results is that metric's result over every step; any
    other log is the last step's value.
    """

    def __init__(self, built, model, global_step, policy, stop_flag=None, jit_compile=False):
        super().__init__(built, model, global_step, policy, stop_flag=stop_flag,
                         jit_compile=jit_compile)
        check_optimizers_built(model)
        self.exact = MetricState(model, metrics=model.metrics)
        self._deltas = sum(self.exact.sizes)

    def results(self, totals, kind="train"):
        logs = super().results(totals, kind)
        if self._deltas and kind == "train":
            # A log named like a metric's result is that result over every step, if the
            # step updated the metric at all; a metric it left alone (Keras's loss tracker
            # beside a step returning its own loss tensor) does not replace the log.
            exact = self.exact.metric_results(np.asarray(totals[:2 + self._deltas]),
                                              updated_only=True)
            logs.update({k: exact[k] for k in logs if k in exact})
        return logs

    def _flat_deltas(self, deltas):
        if not self._deltas:
            return []
        return self.exact.flatten(deltas if deltas is not None else self.exact.zeros())

    def _run_train(self, data, jit=None):
        """One training step on a parameter-server worker, its metric deltas returned."""
        step_fn = self.model.train_step

        def replica(data):
            x = data_lib.split_batch(data)[0]
            logs, deltas = run_with_metric_deltas(
                step_fn, data, self.exact.variables)
            return self._pack_logs("train", logs, batch_size(x), deltas)
        return self.reduce(self.strategy.run(replica, args=(data,)))

    def _run_eval_local(self, data):
        logs, n = self._replica(self.model.test_step)(data)
        return self._pack_logs("eval", logs, n)

    def _keyed(self, kind, make, run=None, scheduled=True):
        loop = super()._keyed(kind, make, run)
        if not scheduled:
            return loop
        # The coordinator schedules only tf.functions.
        return tf.function(loop, autograph=False)

    def _build_pass_loop(self):
        return self._keyed("train", super()._build_pass_loop)

    def positions_loop(self, reader, fresh=False):
        self._learn_keys("train", reader.element_spec)
        self._tracing = "train"
        return super().positions_loop(reader, fresh)

    def _build_eval_loop_local(self):
        return self._keyed("eval", super()._build_eval_loop_local, run=self._run_eval_local,
                           scheduled=False)


def run_with_metric_deltas(step_fn, data, metric_variables):
    """Run `step_fn(data)`; metric variables start at zero and are left untouched.

    Returns:
        (the step's logs, flat and read inside the scope; the metric variables'
        values after the step, i.e. what the step added).

    Raises:
        TypeError: the step did not return a dict.
    """
    zeros = [tf.zeros(v.shape, v.dtype) for v in metric_variables]
    with RecordingScope(list(zip(metric_variables, zeros)), collect_losses=True) as scope:
        logs = step_fn(data)
        if not isinstance(logs, dict):
            raise TypeError("The model's `train_step` must return a dict of scalar logs, as "
                            f"Keras requires. Received: {type(logs).__name__}")
        # Read here: a log that is a metric's result reads the scope's values.
        logs = {k: tf.convert_to_tensor(v) for k, v in flat_logs(logs).items()}
        deltas = [scope.get_current_value(v) for v in metric_variables]
    scope.apply_updates_except(metric_variables)
    return logs, deltas


def check_optimizers_built(model):
    """Under parameter servers a worker's step cannot create variables: an optimizer the
    model keeps besides `model.optimizer` (a GAN's two) must be built in the model function.

    Raises:
        ValueError: naming the attribute and how to build it.
    """
    for name, value in sorted(vars(model).items()):
        if isinstance(value, keras.optimizers.Optimizer) and not value.built \
                and value is not model.optimizer:
            raise ValueError(
                f"The model's optimizer `{name}` ({type(value).__name__}) is not built. Under "
                "parameter servers a model's own `train_step` runs on workers, which cannot "
                "create its variables: build it in the model function (or in `compile`), e.g. "
                f"`self.{name}.build(self.discriminator.trainable_variables)` with the "
                "variables it updates. Received: strategy='ps'")
