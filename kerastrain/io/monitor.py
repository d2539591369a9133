"""What the chief writes during a fit, and at which steps: `TensorBoardOptions`, the
`Schedule` and the `Monitor` that feeds the metric writers (`summaries.py`)."""

from __future__ import annotations

import dataclasses
import logging
import numbers
from typing import Mapping

from kerastrain.io import cadence
from kerastrain.io import files
from kerastrain.io.summaries import VALIDATION_PREFIX, scalars

from kerastrain._options import is_int, is_number, option

logger = logging.getLogger("kerastrain")


@dataclasses.dataclass(frozen=True)
class TensorBoardOptions:
    """What the chief writes under `model_dir/logs` (each field's doc is in its declaration)."""

    log_every_steps: int = option(
        100, "running loss/metrics, learning rate and throughput every N steps; 0: epoch ends only")
    histograms_every_epochs: int = option(0, "weight histograms every N epochs; 0: never")
    write_graph: bool = option(False, "the model's forward graph, once")
    write_config: bool = option(False, "the trainer's resolved settings as text, once per fit")
    profile_steps: tuple | None = option(None, "[first, last] global steps to profile")
    hparams: dict | None = option(
        None, "values for TensorBoard's HParams table (names to numbers, strings or booleans); "
              "`kerastrain run` gives the recipe's values, flattened (`trainer.epochs`)")

    def __post_init__(self):
        for name in ("log_every_steps", "histograms_every_epochs"):
            value = getattr(self, name)
            if not is_int(value, 0):
                raise ValueError(f"`{name}` must be an int >= 0. Received: {name}={value!r}")
        p = self.profile_steps
        if p is not None:
            if (not isinstance(p, (tuple, list)) or len(p) != 2
                    or not all(is_int(s) for s in p)
                    or not 0 <= p[0] < p[1]):
                raise ValueError("`profile_steps` must be a pair (first, last) of steps with "
                                 f"0 <= first < last. Received: profile_steps={p!r}")
            object.__setattr__(self, "profile_steps", tuple(p))
        if self.hparams is not None:
            bad = ({} if isinstance(self.hparams, Mapping) else None)
            if bad is not None:
                bad = {k: v for k, v in self.hparams.items() if not isinstance(k, str) or not (
                    isinstance(v, (str, bool)) or is_number(v))}
            if bad is None or bad:
                raise ValueError(
                    "`hparams` must map names to numbers, strings or booleans (TensorBoard's "
                    f"HParams table holds nothing else). Received: hparams={self.hparams!r}"
                    + (f"; not allowed: {bad!r}" if bad else "") + ". Give a list or None as "
                    "a string (str(value)), or leave it out.")
            # NumPy scalars as Python's: the settings YAML and TensorBoard take only those.
            object.__setattr__(self, "hparams", {
                k: v if isinstance(v, (str, bool, int, float)) else
                int(v) if isinstance(v, numbers.Integral) else float(v)
                for k, v in self.hparams.items()})

    @classmethod
    def coerce(cls, value):
        """Accept True/False/None, a mapping of fields, or an instance."""
        from kerastrain import _options
        return _options.coerce(cls, value, "tensorboard")

class Schedule:
    """Decides, from the global step alone, where loops must stop and what happens there."""

    def __init__(self, log_every_steps=0, profile_steps=None, histograms_every_epochs=0):
        self.logs = cadence.Every(steps=log_every_steps)
        self.histograms = cadence.Every(epochs=histograms_every_epochs)
        self.profile_steps = profile_steps

    def steps_to_boundary(self, step: int) -> int | None:
        """Steps until the next step at which something must happen (None: none ahead)."""
        candidates = [s - step for s in self.profile_steps or () if s > step]
        logs = self.logs.steps_to_boundary(step)
        if logs is not None:
            candidates.append(logs)
        return min(candidates) if candidates else None

    def log_due(self, step: int) -> bool:
        return self.logs.at_step(step)

    def profile_action(self, step: int) -> str | None:
        if not self.profile_steps:
            return None
        first, last = self.profile_steps
        if step == first:
            return "start"
        if step == last:
            return "stop"
        return None


class Monitor:
    """Writes what the chief logs during one `fit`, at the steps the Schedule names.

    Step-level scalars are the *running epoch* values (as a progress bar shows
    them), so the value written at an epoch's last step equals `history`.
    Throughput covers the steps since the previous write. Time comes from
    `clock`, so tests need no sleeps.
    """

    flush_seconds = 5.0  # epoch ends flush at most this often; the end of fit always does

    def __init__(self, writer, options, *, learning_rate_fn, weights_fn, train_logdir=None,
                 clock=None):
        import time
        self.writer = writer
        self.options = options or TensorBoardOptions(log_every_steps=0)
        self.schedule = Schedule(self.options.log_every_steps, self.options.profile_steps,
                                 self.options.histograms_every_epochs)
        self.learning_rate_fn = learning_rate_fn
        self.weights_fn = weights_fn
        self.train_logdir = train_logdir
        self.clock = clock or time.perf_counter
        self._mark = None  # (step, examples, time) at the previous write
        self._examples = 0.0
        self._last_written_step = None
        self._last_timed = False
        self._profiling = False
        # Epoch ends flush at most every `flush_seconds` (from `start`; `close` always flushes).
        self._flush = cadence.Every(secs=self.flush_seconds, clock=self.clock,
                                    last=float("-inf"))

    @property
    def active(self) -> bool:
        return self.writer is not None

    def start(self, step, texts=None, graph=None):
        self._mark = (step, self._examples, self.clock())
        self._flush.done(self._mark[2])
        if not self.active:
            return
        if texts and self.options.write_config:
            self.writer.write_texts(step, texts)
        if graph is not None and self.options.write_graph:
            self.writer.write_graph(graph)
        if self.options.hparams:
            self.writer.write_hparams(self.options.hparams)
        self._profile(step)

    def steps_to_boundary(self, step):
        # On every task, writing or not: the workers of a multi-worker job must end their
        # loops at the same steps, or one reads on to the data's end alone and waits forever
        # for the others' collectives.
        return self.schedule.steps_to_boundary(step)

    def _profile(self, step):
        action = self.schedule.profile_action(step)
        if action == "start" and not self._profiling and self.train_logdir:
            import tensorflow as tf
            tf.profiler.experimental.start(self.train_logdir)
            self._profiling = True
        elif action == "stop" and self._profiling:
            import importlib.util

            import tensorflow as tf
            tf.profiler.experimental.stop()
            self._profiling = False
            first, last = self.schedule.profile_steps
            shown = ("TensorBoard's Profile tab shows it" if importlib.util.find_spec(
                "tensorboard_plugin_profile") else "TensorBoard shows it in its Profile tab "
                "once its plugin is installed: pip install 'kerastrain[profile]'")
            logger.info("profile: steps %d to %d traced into %s; %s", first, last,
                        files.join(self.train_logdir, "plugins", "profile"), shown)

    def _write_step(self, step, logs, timed=True):
        already = step == self._last_written_step
        if already and (self._last_timed or not timed):
            return
        # A step first written untimed (results that arrived late) still gets its
        # throughput when a timed write for it follows (the epoch end under PS).
        values = {} if already else dict(logs, learning_rate=self.learning_rate_fn(step))
        if timed:
            now = self.clock()
            mark_step, mark_examples, mark_time = self._mark
            elapsed = now - mark_time
            if step > mark_step and elapsed > 0:
                values["examples_per_second"] = (self._examples - mark_examples) / elapsed
                values["step_time_seconds"] = elapsed / (step - mark_step)
            self._mark = (step, self._examples, now)
        if values:
            self.writer.write_scalars(step, scalars(values))
        self._last_written_step, self._last_timed = step, timed

    def after_loop(self, step, examples, running_logs_fn, timed=True):
        """Called after each compiled loop; `running_logs_fn()` gives the epoch's logs so far.

        `timed=False` when results arrive later than they were computed (parameter
        servers deliver an epoch's loops after joining): throughput is then
        measured over the whole epoch at its end instead.
        """
        self._examples += examples
        if not self.active:
            return
        if self.schedule.log_due(step):
            self._write_step(step, running_logs_fn(), timed=timed)
        self._profile(step)

    def epoch_end(self, epoch, step, logs):
        if not self.active:
            return
        self._write_step(step, {k: v for k, v in logs.items()
                                if not k.startswith(VALIDATION_PREFIX)})
        validation = {k: v for k, v in logs.items() if k.startswith(VALIDATION_PREFIX)}
        if validation:
            self.writer.write_scalars(step, scalars(validation))
        # Keras's per-epoch tags, so TensorBoard shows the same charts as for model.fit.
        per_epoch = {}
        for key, value in logs.items():
            if key.startswith(VALIDATION_PREFIX):
                per_epoch[VALIDATION_PREFIX + "epoch_" + key[len(VALIDATION_PREFIX):]] = value
            else:
                per_epoch["epoch_" + key] = value
        self.writer.write_scalars(epoch, scalars(per_epoch))
        if self.schedule.histograms.at_epoch_end(epoch):
            self.writer.write_histograms(epoch, self.weights_fn())
        now = self.clock()
        if self._flush.due(step, now):
            # At most every few seconds: a flush per short epoch cost 1% of it; the end
            # of `fit` always flushes (`close`).
            self.writer.flush()
            self._flush.done(now)
        # Validation and epoch-end work are not training throughput.
        self._mark = (step, self._examples, self.clock())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        if self._profiling:
            import tensorflow as tf
            tf.profiler.experimental.stop()
            self._profiling = False
        if self.active:
            self.writer.flush()


def model_monitor(model, writer, options, *, step, settings, element_spec, train_logdir=None):
    """A started `Monitor` for `model`: its learning rate, weights and (if asked) its graph.

    Args:
        writer: the chief's writer, or None (other tasks: nothing is written).
        settings: the run's resolved settings as YAML text (`write_config`).
        element_spec: the training batches' spec, to trace the forward graph.
    """
    import numpy as np  # here, not at the top: recipes are checked before NumPy may start

    from kerastrain import _compat
    optimizer = model.optimizer
    schedule = _compat.learning_rate_schedule(optimizer)

    def learning_rate(at):
        # The rate the step just taken used: the schedule at its iteration.
        if schedule is not None:
            return float(schedule(max(at - 1, 0)))
        return float(np.asarray(optimizer.learning_rate))

    def weights():
        return {v.path: np.asarray(v.numpy()) for v in model.weights}

    monitor = Monitor(writer, options, learning_rate_fn=learning_rate, weights_fn=weights,
                      train_logdir=train_logdir)
    graph = None
    if monitor.active and monitor.options.write_graph:
        graph = _forward_graph(model, element_spec)
    monitor.start(step, texts={"config": "```\n" + settings + "```"}, graph=graph)
    return monitor


def _forward_graph(model, element_spec):
    import tensorflow as tf

    from kerastrain.data import inputs as data_lib
    try:
        return tf.function(lambda x: model(x, training=False)).get_concrete_function(
            data_lib.split_batch(element_spec)[0]).graph
    except Exception as e:  # the graph is a nicety; never fail training for it
        logger.warning("could not trace the model's graph for TensorBoard: %s", e)
        return None
