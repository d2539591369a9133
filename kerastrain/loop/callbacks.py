"""Bridge to Keras callbacks: which ones need every batch, and the CallbackList."""

from __future__ import annotations

import dataclasses
import sys

import keras

from kerastrain import _compat
from kerastrain import _options

VERBOSE = (0, 1, 2, "auto")  # as `model.fit`'s

_HOOKS = {  # a kind of loop -> its batch hooks (Keras's `on_batch_*` are training's)
    "train": ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end"),
    "test": ("on_test_batch_begin", "on_test_batch_end"),
    "predict": ("on_predict_batch_begin", "on_predict_batch_end"),
}


def steps_per_execution(model):
    """Batches per execution, as the model was compiled: `model.fit` / `evaluate` call the
    batch hooks around each."""
    return max(int(getattr(model, "steps_per_execution", 1) or 1), 1)


def has_batch_hooks(callback, kind="train") -> bool:
    """Whether any of the callback's `kind` ("train", "test", "predict") batch hooks does
    something (is not `keras.callbacks.Callback`'s no-op)."""
    return not all(_compat.hook_is_default(callback, name) for name in _HOOKS[kind])


def needs_every_execution(callback, kind="train") -> bool:
    """Whether the callback's `kind` batch hooks must run at each of Keras's executions:
    before and after every `steps_per_execution` batches (every batch by default), as
    `model.fit` / `evaluate` call them, and not once per compiled loop.

    A user's hooks (a subclass's, a `LambdaCallback`'s functions) always do; so do Keras's
    own callbacks that act at batches: `TerminateOnNaN`, `ModelCheckpoint` (or
    `OrbaxCheckpoint`) with a batch `save_freq`, `TensorBoard` with a batch `update_freq` or `profile_batch`. The progress
    bar, and Keras's callbacks whose batch hooks do nothing in their configuration, are
    called once per loop (with the index of its last execution).
    """
    for name in _HOOKS[kind]:
        if _compat.hook_is_default(callback, name):
            continue
        if name in vars(callback) or not _keras_own(type(callback), name):
            return True  # a user's hook
        if _keras_hook_acts(callback, kind):
            return True
    return False


def _keras_own(cls, name):
    """Whether the class that defines `name` for `cls` is one of Keras's own."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass.__module__.split(".")[0] == "keras"
    return True


def _keras_hook_acts(callback, kind):
    """Whether a Keras callback's own batch hooks act at each call in its configuration."""
    if isinstance(callback, keras.callbacks.ProgbarLogger):
        return False  # display only: the bar counts from the batch index it is given
    if hasattr(callback, "save_freq"):  # ModelCheckpoint, OrbaxCheckpoint: saves at batches
        return callback.save_freq != "epoch"
    if isinstance(callback, keras.callbacks.TensorBoard):
        return callback.update_freq != "epoch" or (
            kind == "train" and _compat.tensorboard_profiles(callback))
    return True  # TerminateOnNaN, and any other


class BatchHooks:
    """A `CallbackList`'s batch hooks of one kind ("train" or "test") over compiled loops,
    called as Keras calls them with `compile(steps_per_execution=N)`: before each
    execution of N batches `on_*_batch_begin(i)` (i = 0, N, 2N, ... into the epoch), after
    it `on_*_batch_end(i + N - 1, logs)` with the running logs (`i + N - 1` also after a
    last, shorter execution, as in Keras).

    Where a callback needs every execution (`needs_every_execution`), the caller ends its
    loops at each execution's end (`steps_to_boundary`, `loop_size`), or runs several
    loops in one execution (one batch each); otherwise a loop is any run of batches and
    the hooks run once around it, with the indices of its first and last execution.

    Args:
        callback_list: a `keras.callbacks.CallbackList`.
        kind: "train" or "test".
        steps_per_execution: the model's `steps_per_execution` (batches per execution).
    """

    def __init__(self, callback_list, kind, steps_per_execution=1):
        callbacks = [] if callback_list is None else callback_list.callbacks
        self.every = max(int(steps_per_execution or 1), 1)
        self.active = any(has_batch_hooks(cb, kind) for cb in callbacks)
        self.every_execution = any(needs_every_execution(cb, kind) for cb in callbacks)
        self._begin = getattr(callback_list, f"on_{kind}_batch_begin", None)
        self._end = getattr(callback_list, f"on_{kind}_batch_end", None)
        self._open = None  # the first batch of the execution begun and not yet ended
        self._ran = 0      # batches it ran so far

    def steps_to_boundary(self, batch):
        """Batches from `batch` (into the epoch) to where the next loop must end: the end of
        its execution when a callback needs every execution, else None."""
        if not self.every_execution:
            return None
        return self.every - batch % self.every

    def loop_size(self, most):
        """Batches per loop: `most`, or one execution when a callback needs every one."""
        return self.every if self.every_execution else most

    def begin(self, batch, known=None):
        """Before a loop that starts `batch` batches into the epoch (`known`: the batches
        the epoch has, where known: a loop past them runs none, and Keras begins none)."""
        if self._open is not None and batch < self._open:
            self._open = None  # the data went back (a recovery): that execution never ended
        if not self.active or (self.every_execution and self._open is not None):
            return  # a loop inside the execution begun
        if known is not None and batch >= known:
            return
        self._open, self._ran = batch - batch % self.every, 0
        self._begin(self._open)

    def end(self, batch, ran, logs, last=False):
        """After a loop that started at `batch` and ran `ran` batches; `logs()` gives the
        running logs; `last`: the epoch (or pass) ended with it.

        An execution that ran no batch (the data had ended) gets no end hook, as in Keras.
        """
        if not self.active or self._open is None:
            return
        self._ran += ran
        if self.every_execution and ran and not last and (batch + ran) % self.every:
            return  # the execution goes on in the next loop
        if self._ran:
            final = self._open if self.every_execution or not ran else batch + ran - 1
            self._end(final - final % self.every + self.every - 1, logs())
        self._open = None


def check_callbacks(callbacks):
    """The callbacks as a list: one callback, or a (nested) list of them, as `model.fit`
    takes them (Keras flattens them)."""
    callbacks = keras.tree.flatten(callbacks) if callbacks else []
    for cb in callbacks:
        if not isinstance(cb, keras.callbacks.Callback):
            raise TypeError(
                "`callbacks` must be a list of keras.callbacks.Callback instances. "
                f"Received an item of type {type(cb).__name__}: {cb!r}")
    return callbacks


@dataclasses.dataclass(frozen=True)
class Backup:
    """What a `keras.callbacks.BackupAndRestore` asked for, in kerastrain's terms.

    kerastrain's checkpoints already save the whole training state and resume
    exactly, so the callback itself never runs: its `backup_dir` becomes where the
    run's checkpoints live (when the Trainer has no `model_dir`), `save_freq` the
    checkpoint cadence, `double_checkpoint` two checkpoints kept, and
    `delete_checkpoint` removes them once training has finished, as Keras does.
    """

    backup_dir: str
    save_freq: object  # "epoch", a number of steps, or False (saves on preemption only)
    keep: int
    delete: bool

    def checkpoint_options(self):
        """Saves at every epoch end (also with a step cadence: a resume then never
        repeats the epoch's last steps), every `save_freq` steps when it is a number."""
        from kerastrain.io import checkpoints
        steps = None if isinstance(self.save_freq, (str, bool)) else self.save_freq
        return checkpoints.CheckpointOptions(
            every_steps=steps, at_epoch_end=self.save_freq is not False,
            max_to_keep=self.keep, export=False)


def take_backup(callbacks):
    """Split a `BackupAndRestore` off `callbacks`: (the other callbacks, a `Backup` or None)."""
    from kerastrain.io import outputs
    found = [cb for cb in callbacks if isinstance(cb, keras.callbacks.BackupAndRestore)]
    if not found:
        return callbacks, None
    if len(found) > 1:
        raise ValueError(
            "Pass one `BackupAndRestore`: a run has one place for its state. Received: "
            f"{len(found)} with backup_dir={[cb.backup_dir for cb in found]}")
    cb = found[0]
    freq = cb.save_freq
    if not (freq == "epoch" or freq is False or _options.is_int(freq, 1)):
        raise ValueError(
            "`BackupAndRestore(save_freq=...)` must be 'epoch', a number of steps >= 1 or "
            f"False. Received: save_freq={freq!r}")
    return [c for c in callbacks if c is not cb], Backup(
        backup_dir=outputs.normalize_model_dir(cb.backup_dir), save_freq=freq,
        keep=2 if getattr(cb, "double_checkpoint", False) else 1,
        delete=bool(getattr(cb, "delete_checkpoint", True)))


def callback_list(callbacks, *, model, verbose, epochs, steps, history=True):
    return keras.callbacks.CallbackList(
        callbacks, add_history=history, add_progbar=verbose != 0, model=model,
        verbose=verbose, epochs=epochs, steps=steps)


def history_of(callback_list, user_model=None):
    """The list's `History`; its `model` is the user's own model object when kerastrain
    trained a copy of it (as `model.fit`'s History holds the model it was called on)."""
    for cb in callback_list.callbacks:
        if isinstance(cb, keras.callbacks.History):
            if user_model is not None:
                cb.set_model(user_model)
            return cb
    raise AssertionError("CallbackList(add_history=True) always holds a History")


def why_stopped(callbacks, model) -> str:
    """Why training was asked to stop, for the record of the run's end: EarlyStopping with
    its monitor and patience, another callback with a `stopped_epoch`, else which callbacks
    might have set `model.stop_training` (or an `Action`'s `progress.request_stop()`)."""
    if not model.stop_training:
        return "a kerastrain.Action called progress.request_stop()"
    for cb in callbacks:
        if isinstance(cb, keras.callbacks.EarlyStopping) and cb.stopped_epoch:
            by = f" by more than {abs(cb.min_delta):g}" if cb.min_delta else ""
            return (f"EarlyStopping: {cb.monitor} did not improve{by} for {cb.wait} "
                    f"epoch{'s' if cb.wait != 1 else ''}")
    for cb in callbacks:
        if getattr(cb, "stopped_epoch", 0):
            return f"{type(cb).__name__}: stopped_epoch {cb.stopped_epoch}"
    names = sorted({type(cb).__name__ for cb in callbacks})
    return "a callback set model.stop_training" + (f"; callbacks: {', '.join(names)}"
                                                   if names else "")


def resolve_verbose(verbose, *, default, speaks):
    """The verbosity of one `fit`/`evaluate`/`predict` call (`verbose` None: the Trainer's
    `default`): "auto" is 1 on an interactive terminal, 2 on a pipe, 0 on a task that does
    not speak (`outputs.Outputs.speaks`: all but the chief); 1 on a pipe is 2 (a progress bar
    there is one line per update)."""
    if verbose is not None:
        _options.check_choice("verbose", verbose, VERBOSE)
    verbose = default if verbose is None else verbose
    interactive = getattr(sys.stdout, "isatty", lambda: False)() or "ipykernel" in sys.modules
    if verbose == "auto":
        return (1 if interactive else 2) if speaks else 0
    if verbose == 1 and not interactive:
        return 2  # a progress bar on a pipe is one line per update: keep logs readable
    return verbose


def known_batches(cardinality, steps):
    """Batches a pass of data with `cardinality` (negative: unknown or infinite) has, at
    most `steps` (None: all); None when unknown. What Keras gives callbacks as
    `params["steps"]` and counts executions to."""
    if cardinality < 0:
        return steps
    return cardinality if steps is None else min(cardinality, steps)


class PassHooks:
    """The test hooks around the loops of one evaluation pass (`driver.run_to_end`).

    Args:
        hooks: the pass's `BatchHooks`.
        results: `(totals) -> logs`, the running logs.
        model: the model whose `stop_evaluating` a callback may set.
        known: batches the pass has where known, else None.
    """

    def __init__(self, hooks, results, model, known):
        self.hooks, self.results, self.model, self.known = hooks, results, model, known

    def loop_size(self, most):
        return self.hooks.loop_size(most)

    def begin(self, done):
        self.hooks.begin(done, self.known)

    def end(self, done, ran, totals, asked):
        """After a loop of `asked` steps: the end hook; True when a callback stopped the
        evaluation."""
        last = ran < asked or (self.known is not None and done + ran >= self.known)
        self.hooks.end(done, ran, lambda: self.results(totals), last=last)
        return bool(getattr(self.model, "stop_evaluating", False))


def evaluated(callback_list, evaluate, model=None):
    """`evaluate(hooks)`'s logs, with the callbacks' test hooks around it as `model.evaluate`
    and `model.fit`'s validation call them: `on_test_begin`, the batch hooks of each of the
    model's executions (`BatchHooks`, given to `evaluate`), `on_test_end(logs)`.
    `model.stop_evaluating`, set by a callback, ends the evaluation after a batch end hook.
    No hooks when `callback_list` is None."""
    if callback_list is None:
        return evaluate(None)
    if model is not None:
        model.stop_evaluating = False
    callback_list.on_test_begin()
    logs = evaluate(BatchHooks(callback_list, "test", steps_per_execution(model)))
    callback_list.on_test_end(logs)
    return logs
