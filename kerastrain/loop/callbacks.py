"""Bridge to Keras callbacks: which ones need every batch, and the CallbackList."""

from __future__ import annotations

import dataclasses
import sys

import keras

from kerastrain import _options

VERBOSE = (0, 1, 2, "auto")  # as `model.fit`'s

_BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end")


def wants_every_batch(callback) -> bool:
    """Whether a callback has batch-level hooks written by the user.

    Keras's own callbacks already cope with batch hooks called once per
    `steps_per_execution`, so they are loop-aware; a user's class (or a
    `LambdaCallback` given batch functions) may count on seeing every batch.
    """
    if isinstance(callback, keras.callbacks.LambdaCallback):
        return any(name in vars(callback) for name in _BATCH_HOOKS)
    for cls in type(callback).__mro__:
        if cls.__module__.startswith("keras"):
            break
        if any(name in vars(cls) for name in _BATCH_HOOKS):
            return True
    return False


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


def resolve_verbose(verbose, *, default, is_chief):
    """The verbosity of one `fit`/`evaluate`/`predict` call (`verbose` None: the Trainer's
    `default`): "auto" is 1 on an interactive chief, 2 on a pipe, 0 off the chief; 1 on a
    pipe is 2 (a progress bar there is one line per update)."""
    if verbose is not None:
        _options.check_choice("verbose", verbose, VERBOSE)
    verbose = default if verbose is None else verbose
    interactive = getattr(sys.stdout, "isatty", lambda: False)() or "ipykernel" in sys.modules
    if verbose == "auto":
        return (1 if interactive else 2) if is_chief else 0
    if verbose == 1 and not interactive:
        return 2  # a progress bar on a pipe is one line per update: keep logs readable
    return verbose


def evaluated(callback_list, evaluate, steps):
    """`evaluate()`'s logs, with the callbacks' test hooks around it as `model.evaluate` and
    `model.fit`'s validation call them: `on_test_begin`, the batch hooks once (evaluation
    runs in compiled chunks), `on_test_end(logs)`. No hooks when `callback_list` is None."""
    if callback_list is None:
        return evaluate()
    callback_list.on_test_begin()
    callback_list.on_test_batch_begin(0)
    logs = evaluate()
    callback_list.on_test_batch_end((steps or 1) - 1, logs)
    callback_list.on_test_end(logs)
    return logs
