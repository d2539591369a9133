"""Bridge to Keras callbacks: which ones need every batch, and the CallbackList."""

from __future__ import annotations

import keras

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
    callbacks = list(callbacks or [])
    for cb in callbacks:
        if not isinstance(cb, keras.callbacks.Callback):
            raise TypeError(
                "`callbacks` must be a list of keras.callbacks.Callback instances. "
                f"Received an item of type {type(cb).__name__}: {cb!r}")
        if isinstance(cb, keras.callbacks.BackupAndRestore):
            # Its own saves would race kerastrain's on every task, and its restore would
            # fight kerastrain's resume; silently ignoring it would lose work.
            raise ValueError(
                "`BackupAndRestore` does what kerastrain's checkpoints already do: with "
                "`Trainer(..., model_dir=...)` the chief saves the whole training state and a "
                "rerun resumes exactly where it stopped (also after SIGKILL or SIGTERM). Remove "
                "the callback and pass `model_dir` instead (`checkpoint={'every_steps': N}` for "
                f"mid-epoch saves). Received: callbacks=[..., {type(cb).__name__}(...)]")
    return callbacks


def callback_list(callbacks, *, model, verbose, epochs, steps, history=True):
    return keras.callbacks.CallbackList(
        callbacks, add_history=history, add_progbar=verbose != 0, model=model,
        verbose=verbose, epochs=epochs, steps=steps)


def history_of(callback_list):
    for cb in callback_list.callbacks:
        if isinstance(cb, keras.callbacks.History):
            return cb
    raise AssertionError("CallbackList(add_history=True) always holds a History")
