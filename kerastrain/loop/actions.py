"""Actions: what happens after each compiled loop and at each epoch end, each with its own cadence.

Each `fit`'s controller builds one list of actions (`controller.Controller.actions`; every
task runs them, and `io/outputs.py` decides what the chief keeps) and calls them in order with
the same `Progress`: after
every loop, and once more at the end of each epoch (`progress.logs` set). An
action may end training by setting `progress.stop`; the actions after it are not
called for that loop. Each action also says how many steps ahead it next needs
the loop to stop (`steps_to_boundary`), so that it sees exactly the steps it acts on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import numpy as np

from kerastrain import _logging
from kerastrain.io import cadence
from kerastrain.loop import callbacks as callbacks_lib
from kerastrain.loop import preemption

logger = logging.getLogger("kerastrain")

DIVERGED = "diverged"      # the loss became NaN or infinite
PREEMPTED = "preempted"    # SIGTERM: saved, then `fit` raises `Preempted`
REQUESTED = "requested"    # a callback set `model.stop_training`
RECOVERING = "recovering"  # a bad loss: the state went back (`kerastrain.loop.recovery`); go on
RAN_OUT = "ran out"        # data read once (a generator) ended before an epoch: fit stops


@dataclasses.dataclass
class Progress:
    """Where training stands, as the actions see it.

    Attributes:
        epoch: the epoch in progress (0-based).
        step: the global step after the last loop.
        batch: steps taken in this epoch.
        totals: the epoch's running totals (`[loss sum, examples, metric deltas...]`).
        last: the last loop's `LoopResult` (None at an epoch end with no new loop).
        logs: at an epoch end, the epoch's logs (`val_*` added by validation);
            None after a loop.
        stop: why training ends here, set by an action (None: it goes on).
    """

    epoch: int
    step: int
    batch: int
    totals: np.ndarray
    last: object = None
    logs: dict | None = None
    stop: str | None = None

    @property
    def epoch_end(self) -> bool:
        return self.logs is not None

    def request_stop(self) -> None:
        """End training after this loop, as a callback's `model.stop_training = True` does
        (a stop already decided, by SIGTERM or a bad loss, stays)."""
        if self.stop is None:
            self.stop = REQUESTED


class Action:
    """Called after each loop and at each epoch end; override what applies.

    Public as `kerastrain.Action` for `Trainer.fit(actions=[...])`, as Orbit's `Controller`
    takes `train_actions`: `__call__(progress)` runs after every compiled loop and once more
    at each epoch end (`progress.epoch_end`, `progress.logs` the epoch's logs, `val_*`
    included); `steps_to_boundary(step)` returns how many steps from `step` the next loop
    must stop for the action to see that step exactly (`kerastrain.Every(steps=N)` has one),
    or None; `progress.request_stop()` ends training. User actions run after kerastrain's
    own (validation, summaries, checkpoints) and before the Keras callbacks, on every task
    that runs `fit` (under multi-worker mirrored every worker must decide a stop alike, as
    with `model.stop_training`; under parameter servers, on the coordinator).

    Example:
        >>> class LogEvery100(kerastrain.Action):
        ...     def __init__(self):
        ...         self.every = kerastrain.Every(steps=100)
        ...     def steps_to_boundary(self, step):
        ...         return self.every.steps_to_boundary(step)
        ...     def __call__(self, progress):
        ...         if self.every.at_step(progress.step):
        ...             print("step", progress.step)
    """

    def steps_to_boundary(self, step: int) -> int | None:
        return None

    def epoch_begin(self, progress: Progress) -> None:
        """Called before an epoch's first loop (where `progress` resumes it)."""

    def __call__(self, progress: Progress) -> None:
        pass


def epoch_begin(actions, progress: Progress) -> None:
    for action in actions:
        action.epoch_begin(progress)


def steps_to_boundary(actions, step):
    """Steps until the nearest step at which some action must see the loop stop."""
    found = [b for b in (a.steps_to_boundary(step) for a in actions) if b]
    return min(found) if found else None


def run(actions, progress: Progress) -> Progress:
    """Call the actions in order. After a preemption or a recovery none follows; after
    divergence only those that report it (callbacks see the end of the epoch that diverged).
    kerastrain's lines of an epoch end print after the callbacks' (Keras's progress line)."""
    with _logging.held_lines() if progress.epoch_end else contextlib.nullcontext():
        for action in actions:
            if progress.stop in (PREEMPTED, RECOVERING) or (
                    progress.stop == DIVERGED and not getattr(action, "reports_divergence",
                                                              False)):
                continue
            action(progress)
    return progress


class Preemption(Action):
    """SIGTERM: once the variables hold the step reached, save exactly it and stop; the
    `Preempted` that `fit` raises is left in the watch (`watch.preempted`).

    Under parameter servers the results of a join arrive loop by loop and only
    the last one is `in_sync`; saving before it would record a step the variables
    have already passed.
    """

    def __init__(self, watch, save):
        self.watch = watch  # the fit's `preemption.SigtermWatch`
        self.save = save  # (progress) -> checkpoint path or None

    def __call__(self, p):
        if p.epoch_end or not self.watch.requested or not p.last.in_sync:
            return
        path = self.save(p)
        logger.warning("SIGTERM: stopped after step %d%s; exiting with code %d so the job can be "
                       "restarted", p.step, f", checkpoint {path}" if path else
                       " (no model_dir: nothing saved)", preemption.EXIT_CODE)
        self.watch.preempted = preemption.Preempted(p.step, path)
        p.stop = PREEMPTED


class AgreeOnPreemption(Action):
    """Multi-worker mirrored: all workers call `agree(step)` after every loop; after a
    SIGTERM on any of them all save that same step (TensorFlow's handler raises)."""

    def __init__(self, agree, record_state):
        self.agree = agree
        self.record_state = record_state  # (progress) -> None: what the save must hold

    def __call__(self, p):
        if p.epoch_end:
            return
        self.record_state(p)
        self.agree(p.step)


class StopOnNonFinite(Action):
    """A NaN or infinite loss stops training before anything is saved after it
    (and sets `model.stop_training`, as Keras's `TerminateOnNaN` does)."""

    def __init__(self, model):
        self.model = model

    def __call__(self, p):
        if p.epoch_end or np.isfinite(p.last.totals[0]):
            return
        logger.error(
            "the loss became %s by step %d (epoch %d); training stopped. Nothing was saved after "
            "the last finite step, so the latest checkpoint is the last good one.",
            p.last.totals[0], p.step, p.epoch + 1)
        self.model.stop_training = True
        p.stop = DIVERGED


class Validation(Action):
    """At the end of every `every`-th epoch, evaluates and adds `val_*` to the epoch's logs
    (`validation_freq` in `model.fit`). The callbacks' test hooks run around it, as around
    `model.fit`'s validation (TensorBoard writes `evaluation_*_vs_iterations` in
    `on_test_end`): `on_test_begin`, the batch hooks of every execution, `on_test_end`.

    Reports divergence: `model.fit` validates the epoch a `TerminateOnNaN` stopped, and
    its logs have `val_*` (NaN) too."""

    reports_divergence = True

    def __init__(self, evaluate, every=1, callbacks=None, model=None):
        self.evaluate = evaluate  # (hooks) -> logs
        self.every = cadence.Every(epochs=every)
        self.callbacks = callbacks  # a keras CallbackList, or None
        self.model = model

    def __call__(self, p):
        if p.epoch_end and self.every.at_epoch_end(p.epoch):
            logs = callbacks_lib.evaluated(self.callbacks, self.evaluate, self.model)
            p.logs.update({f"val_{k}": v for k, v in logs.items()})


class Summaries(Action):
    """Running values every `log_every_steps`, epoch values at epoch ends (`monitor.Monitor`)."""

    def __init__(self, monitor, results, timed=True):
        self.monitor = monitor
        self.results = results  # (totals) -> logs
        self.timed = timed      # False where results arrive after a join (parameter servers)

    def steps_to_boundary(self, step):
        return self.monitor.steps_to_boundary(step)

    def __call__(self, p):
        if p.epoch_end:
            self.monitor.epoch_end(p.epoch, p.step, p.logs)
        else:
            self.monitor.after_loop(p.step, float(p.last.totals[1]),
                                    lambda: self.results(p.totals), timed=self.timed)


class Checkpoints(Action):
    """Saves at the checkpointer's cadence: mid-epoch every N steps or seconds (when the
    variables hold the step), and at epoch ends."""

    def __init__(self, checkpointer, save, steps_per_epoch):
        self.checkpointer = checkpointer
        self.save = save  # (progress, epoch, batch, totals) -> path
        self.steps_per_epoch = steps_per_epoch

    def steps_to_boundary(self, step):
        return self.checkpointer.cadence.steps_to_boundary(step)

    def __call__(self, p):
        if p.epoch_end:
            if self.checkpointer.due(p.step, epoch_end=True):
                self.save(p, p.epoch + 1, 0, np.zeros_like(p.totals))
        elif p.last.in_sync and self.checkpointer.due(p.step, epoch_end=False) and (
                self.steps_per_epoch is None or p.batch < self.steps_per_epoch):
            self.save(p, p.epoch, p.batch, p.totals)


class Callbacks(Action):
    """Keras callbacks: the batch hooks around each loop as `model.fit` calls them around
    each execution of `steps_per_execution` batches (`callbacks.BatchHooks`; the loops end
    at each execution's end where a callback needs every one), epoch ends with the epoch's
    logs.

    The end hook sees a loop whose loss became NaN or infinite too, as under `model.fit`
    (a `TerminateOnNaN` raises or stops there). `model.stop_training`, set by a callback,
    ends training after this loop (or epoch).
    """

    reports_divergence = True  # callbacks see the batch and the epoch that diverged

    def __init__(self, callback_list, model, results, accumulation=1, before_epoch_end=None,
                 batches_known=None):
        self.callback_list = callback_list
        self.model = model
        self.results = results
        self.accumulation = accumulation  # batches per step
        self.before_epoch_end = before_epoch_end  # e.g. the user's model object takes the weights
        self.known = batches_known  # batches in an epoch where known: none begins past them
        self.hooks = callbacks_lib.BatchHooks(callback_list, "train",
                                              callbacks_lib.steps_per_execution(model))
        self.epoch_start = 0  # the global step at the start of this epoch
        self.asked = None     # batches the loop begun asked for; None: not begun by the driver

    def epoch_begin(self, p):
        self.epoch_start = p.step - p.batch

    def steps_to_boundary(self, step):
        batches = self.hooks.steps_to_boundary((step - self.epoch_start) * self.accumulation)
        return None if batches is None else -(-batches // self.accumulation)

    def loop_begin(self, p, steps, held=None):
        """Called by a synchronous driver before a loop of `steps` steps from `p` (`held`:
        one batch of a `batch_loop`, after the `held` batches of its group read so far).
        Parameter-server loops run ahead of their results: their begin hook runs when the
        result arrives, just before the end hook."""
        self.asked = steps * self.accumulation if held is None else 1
        self.hooks.begin(p.batch * self.accumulation + (held or 0), self.known)

    def __call__(self, p):
        last = p.last
        if p.epoch_end:
            self.hooks.end(p.batch * self.accumulation, 0, lambda: self.results(p.totals),
                           last=True)
            if self.before_epoch_end is not None:
                self.before_epoch_end()
            self.callback_list.on_epoch_end(p.epoch, p.logs)
        else:
            k = self.accumulation
            if last.batches is None:
                ran = last.steps * k
                start = p.batch * k - ran
            else:  # one batch per result (a `batch_loop`): whether it read one
                ran = 1 if last.batches else 0
                start = (p.batch - last.steps) * k + max(last.batches - 1, 0)
            if self.asked is None:
                self.hooks.begin(start, self.known)
            ended = (self.asked is not None and ran < self.asked) or (
                self.known is not None and start + ran >= self.known)
            self.hooks.end(start, ran, lambda: self.results(p.totals), last=ended)
            self.asked = None
        if self.model.stop_training and not p.stop:
            p.stop = REQUESTED


class Heartbeat(Action):
    """Listed last: each loop and epoch end, once every other action is done, is progress
    (`kerastrain.loop.stalls.StallWatch`)."""

    def __init__(self, watch):
        self.watch = watch

    def __call__(self, p):
        self.watch.beat()


class UserActions(Action):
    """The actions given to `fit(actions=...)`, called after each loop that trained steps
    (a loop that found the data's end trained none) and at each epoch end."""

    def __init__(self, actions):
        self.actions = actions

    def steps_to_boundary(self, step):
        return steps_to_boundary(self.actions, step)

    def epoch_begin(self, progress):
        epoch_begin(self.actions, progress)

    def __call__(self, progress):
        if progress.epoch_end or (progress.last is not None and progress.last.steps):
            for action in self.actions:
                action(progress)


def check_user_actions(actions):
    """`fit(actions=...)`: one `Action` or a list of them (None: none), as a list."""
    actions = list(actions) if isinstance(actions, (list, tuple)) else \
        [] if actions is None else [actions]
    for action in actions:
        if not isinstance(action, Action):
            raise TypeError(
                "`actions` must be a list of kerastrain.Action instances (subclass it and "
                "override `__call__(progress)`). Received an item of type "
                f"{type(action).__name__}: {action!r}")
    return actions
