"""The metric variables the exact step reduces: their deltas in the totals, and results read back.

A metric's update in a step is computed with Keras's stateless metric API from a zero state:
the change of each of its variables (a delta) is packed after `[loss sum, examples]` in the
totals vector a loop returns (`kerastrain.step.loops`), summed across replicas, steps, loops and
workers, and turned back into the metric's result on the host. Where layers (or a model's own
step) update metrics in a pass, it runs in a `RecordingScope` in which those variables start
at zero, so what it adds comes back the same way.
"""

from __future__ import annotations

import logging

import keras
import numpy as np
import tensorflow as tf

from kerastrain import _compat
from kerastrain._tracing import runs_eagerly
from kerastrain.data import inputs as data_lib
from kerastrain.step import instances

logger = logging.getLogger("kerastrain")


def log_value(value):
    """A metric's result as `model.fit`'s logs hold it (Keras's `pythonify_logs`): a float
    where NumPy converts it to one, else the NumPy array (`F1Score`'s, one value a class)."""
    value = np.asarray(value)
    try:
        return float(value)
    except TypeError:
        return value


def flat_logs(logs):
    """Nested dicts of logs merged into one, as `model.fit` reports them (a compiled
    metrics container's result is a dict of its metrics)."""
    flat = {}
    for key, value in sorted(logs.items()):
        if isinstance(value, dict):
            flat.update(flat_logs(value))
        else:
            flat[key] = value
    return flat


class RecordingScope(keras.StatelessScope):
    """A stateless scope that remembers which variables were updated in it.

    A variable it does not map reads its live value, as outside the scope; that includes
    Keras's weight regularizers, which ask the scope itself (a plain `StatelessScope`
    gives them None: "'NoneType' object has no attribute 'dtype'").
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.updated = {}
        self._reading = False

    def get_current_value(self, variable):
        value = super().get_current_value(variable)
        if value is not None or self._reading or \
                getattr(variable, "regularizer", None) is None:
            return value
        self._reading = True  # `.value` asks the scope again: None sends it to the variable
        try:
            return variable.value
        finally:
            self._reading = False

    def add_update(self, update):
        super().add_update(update)
        self.updated[id(update[0])] = update[0]

    def apply_updates_except(self, kept):
        """After the scope: apply for real every update made in it but those to `kept`
        (variables whose scope values the caller reads as deltas)."""
        kept = {id(v) for v in kept}
        for key, variable in self.updated.items():
            if key not in kept:
                variable.assign(self.get_current_value(variable))


def _probe_batch(model, element_spec, rows=2):
    """`(x, y, y_pred)`: a made-up batch of `rows` examples of the data's shapes: x and
    the targets zeros, the predictions 0.5 in the shapes the model gives."""
    x_spec, y_spec, _ = data_lib.split_batch(element_spec)

    def concrete(spec, value):
        shape = [rows if d is None else d for d in spec.shape]
        return tf.fill(shape, tf.cast(value, spec.dtype) if spec.dtype.is_numeric else "")
    symbolic = tf.nest.map_structure(
        lambda s: keras.KerasTensor([rows if d is None else d for d in s.shape], s.dtype.name),
        x_spec)
    outputs = model.compute_output_spec(symbolic)
    y_pred = tf.nest.map_structure(lambda o: tf.fill(o.shape, tf.cast(0.5, o.dtype)), outputs)
    return (tf.nest.map_structure(lambda s: concrete(s, 0), x_spec),
            tf.nest.map_structure(lambda s: concrete(s, 0), y_spec), y_pred)


class MetricState:
    """The metric variables kerastrain reduces, and how to read results from totals."""

    def __init__(self, model, metrics=None):
        self.parts = []  # (metric, [variables])
        self._eager = runs_eagerly(model)  # results computed as Keras's run_eagerly does
        containers = [_compat.compile_metrics(model)]
        loss = _compat.compile_loss(model)
        if loss is not None:
            containers.extend(getattr(loss, "metrics", []) or [])
        owned = []
        if metrics is not None:  # a model's own metrics (`model.metrics`)
            containers = list(metrics)
        else:  # metrics the layers update in `call`, logged by `fit` too (after the others)
            owned = _compat.layer_metrics(model)
        for metric in containers + owned:
            if metric is not None and metric.variables:
                self.parts.append((metric, list(metric.variables)))
        self.variables = [v for _, vs in self.parts for v in vs]
        self.layer_variables = [v for m in owned for v in m.variables]
        self._results = None  # the compiled `_metric_results`
        self.sizes = [int(np.prod(v.shape)) for v in self.variables]
        # The state an epoch or evaluation starts from (`start`; None: zeros, as every Keras
        # metric's `reset_state` leaves it), and the latest state results were read of.
        self._base = None
        self._last = None
        odd = sorted({v.path for v in self.variables if getattr(v, "aggregation", "sum") != "sum"})
        if odd:
            logger.warning("metric variables %s are not sums; kerastrain adds them across "
                           "replicas and steps anyway", odd)

    def check_sums(self, model, element_spec):
        """Refuse a compiled metric whose update is not a sum of per-batch parts.

        kerastrain reduces a metric by summing what each step's `update_state` adds to
        its variables (across steps, replicas and workers), which is exact for Keras's
        metrics (counts and sums). A metric that keeps a maximum or the last batch's
        value would come out wrong without a word (a maximum error of 2.5 logged as
        9.6). Probe: one made-up batch (targets 0, predictions 0.5, of the data's and
        the model's shapes) updates the metrics from a state of zeros and from a state
        of ones; a sum moves both alike. Metrics the probe cannot run are not judged.
        """
        metrics = _compat.compile_metrics(model)
        _, y_spec, _ = data_lib.split_batch(element_spec)
        owned = [v for m, vs in self.parts if m is metrics for v in vs]
        if not owned or y_spec is None:
            return
        try:
            x, y, y_pred = _probe_batch(model, element_spec)
            moved = []
            for start in (0, 1):
                state = [tf.fill(v.shape, tf.cast(start, v.dtype)) for v in owned]
                with _compat.stateless_scope(list(zip(owned, state))) as scope:
                    metrics.update_state(y, y_pred)
                    moved.append([np.asarray(scope.get_current_value(v)) - start
                                  for v in owned])
        except Exception:  # noqa: BLE001 - a metric the probe cannot feed is not judged
            return
        odd = [v.path for v, a, b in zip(owned, *moved)
               if not np.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)]
        if odd:
            raise ValueError(
                f"Metric variable(s) {odd} do not add up: from a state of ones, a batch's "
                "`update_state` moved them otherwise than from zeros (a metric keeping a "
                "maximum, or the last batch's value). kerastrain sums each step's updates "
                "across steps, replicas and workers, exact for sums and counts as Keras's "
                "metrics keep, so this metric would be logged wrong. Write its update_state "
                "to add to its variables (`assign_add`, or `assign(v + ...)`), or compute it "
                "outside training (a callback).")

    @property
    def width(self) -> int:
        return 2 + sum(self.sizes)

    def start(self):
        """Before an epoch or an evaluation, as Keras's `reset_metrics()`: each metric's
        `reset_state` is applied to the latest state (in a stateless scope, the variables
        untouched). Keras's metrics come back to zeros; a metric whose `reset_state` keeps
        its state (a running count over epochs) goes on from it, as under `model.fit`."""
        if not self.parts:
            return
        if self._last is None:
            self._last = np.concatenate(
                [np.asarray(instances.value_or_zeros(v), np.float64).ravel()
                 for v in self.variables]).astype(np.float64)
        last = np.split(self._last, np.cumsum(self.sizes)[:-1])
        state = [tf.constant(a.reshape(v.shape), v.dtype) for a, v in zip(last, self.variables)]
        with _compat.stateless_scope(list(zip(self.variables, state))) as scope:
            for metric, _ in self.parts:
                metric.reset_state()
            base = np.concatenate([np.asarray(scope.get_current_value(v)).ravel()
                                   for v in self.variables]).astype(np.float64)
        self._base = base if np.any(base) else None

    def zeros(self):
        return [tf.zeros(v.shape, v.dtype) for v in self.variables]

    def flatten(self, values):
        return [tf.reshape(tf.cast(v, tf.float32), [-1]) for v in values]

    def results(self, totals) -> dict:
        """Epoch logs (`loss` first, then every metric) from a float64 totals vector."""
        loss_sum, count = float(totals[0]), float(totals[1])
        logs = {"loss": loss_sum / count if count else float("nan")}
        logs.update(self.metric_results(totals))
        return logs

    def metric_results(self, totals, updated_only=False) -> dict:
        """Every metric's result from a totals vector (`[loss, examples, deltas...]`).
        `updated_only`: only metrics whose deltas are not all zero (updated at all)."""
        if not self.parts:
            return {}
        if self._results is None:
            # Compiled once: eager metric results cost ~1 ms per logged step.
            # One per model's metrics, by design: kept out of TensorFlow's retracing warning.
            self._results = self._metric_results if self._eager else \
                _compat.quiet_retracing(tf.function(self._metric_results, autograph=False))
        totals = np.array(totals, np.float64)
        deltas = totals[2:].copy()
        if self._base is not None:
            totals[2:] += self._base  # the state the epoch started from, and what it added
        self._last = totals[2:].copy()
        logs, offset = {}, 2
        for (_, variables), part in zip(self.parts, self._results(tf.constant(totals))):
            size = sum(int(np.prod(v.shape)) for v in variables)
            if not updated_only or np.any(deltas[offset - 2:offset - 2 + size]):
                logs.update({k: log_value(v) for k, v in part.items()})
            offset += size
        return logs

    def _metric_results(self, totals):
        """Each metric's results (a dict per metric, in `parts` order)."""
        parts = []
        offset = 2
        for metric, variables in self.parts:
            values = []
            for v in variables:
                size = int(np.prod(v.shape))
                values.append(tf.reshape(tf.cast(totals[offset:offset + size], v.dtype),
                                         v.shape))
                offset += size
            # Read the result inside the scope: a metric whose `result()` returns one
            # of its variables would otherwise be read outside, at its live value.
            with _compat.stateless_scope(list(zip(variables, values))):
                result = metric.result()
                # A dict (a metric's own, or the compiled metrics' holding one) is flattened
                # into the logs, as Keras's `fit` logs it.
                result = flat_logs(
                    result if isinstance(result, dict) else {metric.name: result})
                # Converted here, in the scope: a variable returned would be read after it.
                parts.append({k: tf.convert_to_tensor(r) for k, r in result.items()})
        return parts
