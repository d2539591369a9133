"""A model's own `train_step` / `test_step`, run as `model.fit` runs them, and the choice
between it and kerastrain's exact step (`kerastrain.step.loops.Step`).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from kerastrain.data import inputs as data_lib
from kerastrain.step.loops import Step, overrides
from kerastrain.step.metrics import flat_logs, log_value
from kerastrain.step.replica import batch_size


def has_own_step(model) -> bool:
    """Whether the model's class has its own `train_step` or `test_step` (`ModelStep`)."""
    return overrides(model, "train_step") or overrides(model, "test_step")


def step_for(built, model, global_step, *, policy, classes=None, **options):
    """kerastrain's exact `Step`, or `ModelStep` for a model with its own train/test step.

    `policy`: the kind of strategy's `policy.StepPolicy`; `classes`: the pair to choose
    from, `(Step, ModelStep)` unless given (the parameter servers' pair:
    `kerastrain.step.ps.steps.step_for`).
    """
    from kerastrain.step import accumulation
    exact, own = classes or (Step, ModelStep)
    if has_own_step(model):
        return own(built, model, global_step, policy, stop_flag=options.get("stop_flag"),
                   jit_compile=options.get("jit_compile", False))
    return exact(built, model, global_step, accumulation=accumulation.steps_of(model.optimizer),
                 **options)


class ModelStep(Step):
    """The model's own `train_step` / `test_step`, run as `model.fit` runs them.

    Each replica runs the model's step inside `strategy.run`; what it returns is
    reduced as Keras reduces it (the mean over replicas), and a loop returns the
    logs of its last step, as `fit`'s logs are. Its metrics are the model's own,
    reset at each epoch and before each evaluation, as `fit` and `evaluate` do.

    A loop returns `[loss, examples, value of each log key...]` (loss: the `loss`
    log, or 0), so the driver and the actions treat it like the exact step's.
    (Under parameter servers, `kerastrain.step.ps.steps.PSModelStep` adds the metric
    deltas of concurrent workers after `examples`.)
    """

    def __init__(self, built, model, global_step, policy, stop_flag=None, jit_compile=False):
        super().__init__(built, model, global_step, stop_flag=stop_flag, jit_compile=jit_compile)
        self._jit_train_step = None  # the model's train_step compiled with XLA, made on use
        self.keys = {}   # "train" / "eval" -> the sorted keys of the step's logs
        self.shapes = {}  # log key -> its value's shape (a metric may give one per class)
        self._tracing = "train"  # which loop is being traced (sets `width`)
        self._mean_spans_tasks = policy.logs_mean_spans_tasks  # see `_mean`
        self._deltas = 0  # metric deltas a loop carries after `examples` (`PSModelStep`)

    @property
    def width(self):
        keys = self.keys.get(self._tracing) or ()
        return 2 + self._deltas + sum(self._size(k) for k in keys)

    def _size(self, key):
        return int(np.prod(self.shapes[key], dtype=np.int64))

    def accumulate(self, totals, part):
        # The last step's logs (they are already running values); the examples and
        # metric deltas summed.
        d = 2 + self._deltas
        pieces = [part[:1], totals[1:d] + part[1:d], part[d:]]
        if isinstance(totals, np.ndarray):
            if not part[1]:
                return totals  # a loop that ran no step (the data had ended) has no logs
            return np.concatenate(pieces)
        return tf.concat(pieces, axis=0)

    def results(self, totals, kind="train"):
        logs, offset = {}, 2 + self._deltas
        for k in self.keys.get(kind, ()):
            size = self._size(k)
            value = log_value(np.reshape(totals[offset:offset + size], self.shapes[k]))
            # Arrays as the step made them (float32), not as the totals hold them.
            logs[k] = value.astype(np.float32) if isinstance(value, np.ndarray) else value
            offset += size
        return logs

    def start_epoch(self):
        self.model.reset_metrics()

    def _mean(self, per_replica):
        """Keras's reduction of a step's logs: the mean over replicas."""
        if self._mean_spans_tasks:
            return self.strategy.reduce("MEAN", per_replica, axis=None)
        values = self.strategy.experimental_local_results(per_replica)
        return values[0] if len(values) == 1 else tf.reduce_mean(tf.stack(values), axis=0)

    def _pack_logs(self, kind, logs, n, deltas=None):
        if not isinstance(logs, dict):
            raise TypeError(f"The model's `{kind}_step` must return a dict of scalar logs, as "
                            f"Keras requires. Received: {type(logs).__name__}")
        logs = flat_logs(logs)
        keys = self.keys.setdefault(kind, sorted(logs))
        for k in keys:
            shape = tf.convert_to_tensor(logs[k]).shape
            if not shape.is_fully_defined():
                raise ValueError(
                    f"The model's `{kind}_step` returned the log {k!r} of shape {shape}: logs "
                    "must have a fixed shape (a scalar, or one value per class as F1Score "
                    "gives). Return a scalar or a fixed-size result.")
            self.shapes.setdefault(k, tuple(shape))
        values = [tf.reshape(tf.cast(logs[k], tf.float32), [-1]) for k in keys]
        loss = tf.reshape(logs["loss"], [-1])[0] if "loss" in keys else tf.constant(0.0)
        loss = tf.cast(loss, tf.float32)
        return tf.concat([tf.stack([loss, n])] + self._flat_deltas(deltas) + values, axis=0)

    def _flat_deltas(self, deltas):
        """The metric deltas a loop carries after `examples`: none (`PSModelStep`'s)."""
        return []

    def _replica(self, step_fn):
        def run(data):
            x = data_lib.split_batch(data)[0]
            return step_fn(data), batch_size(x)
        return run

    def _run(self, kind, step_fn, data):
        logs, n = self.strategy.run(self._replica(step_fn), args=(data,))
        return self._pack_logs(kind, tf.nest.map_structure(self._mean, logs),
                               self.strategy.reduce("SUM", n, axis=None))

    def _run_train(self, data, jit=None):
        step_fn = self.model.train_step
        if self.jit_compile if jit is None else jit:  # as fit's `jit_compile=True` compiles it
            if self._jit_train_step is None:
                self._jit_train_step = tf.function(step_fn, jit_compile=True)
            step_fn = self._jit_train_step
        return self._run("train", step_fn, data)

    def _run_eval(self, data):
        return self._run("eval", self.model.test_step, data)

    def _learn_keys(self, kind, element_spec, run=None):
        """Trace one step (never run) to learn the logs' keys: the loop's width. Eagerly
        (`run_eagerly`) nothing is traced, as under Keras: the first step's logs tell
        (`accumulate` takes a step's logs whatever the width of the totals before it).
        `run`: the step traced (default: the training or the evaluation step)."""
        if kind in self.keys or self.eager:
            return
        self._tracing = kind
        fn = run or (self._run_train if kind == "train" else self._run_eval)
        tf.function(fn, autograph=False).get_concrete_function(element_spec)

    def _keyed(self, kind, make, run=None):
        """A loop that first learns its width from the iterator's element spec."""
        compiled = {}

        def loop(iterator, *args):
            if "loop" not in compiled:
                self._learn_keys(kind, iterator.element_spec, run)
                self._tracing = kind
                compiled["loop"] = make()
            self._tracing = kind
            return compiled["loop"](iterator, *args)
        return loop

    def _build_train_loop(self):
        return self._keyed("train", super()._build_train_loop)

    def _build_variant_loop(self, jit):
        variant = super()._build_variant_loop
        return self._keyed("train", lambda: variant(jit))

    def _build_eval_loop(self):
        return self._keyed("eval", super()._build_eval_loop)

