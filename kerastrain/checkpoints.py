"""Chief-only checkpoints that never lose work: cadence, restore with fallback, lock, export."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import socket
import time

from kerastrain import outputs
from kerastrain._options import option

logger = logging.getLogger("kerastrain")


@dataclasses.dataclass(frozen=True)
class CheckpointOptions:
    """When checkpoints are written under `model_dir/checkpoints`, and what happens at start.

    Each field's doc is in its declaration (also shown by `kerastrain run --print-config`).
    """

    every_steps: int | None = option(None, "also save every N global steps")
    every_secs: float | None = option(None, "also save when N seconds passed since the last save")
    at_epoch_end: bool = option(True, "save at every epoch end")
    max_to_keep: int = option(3, "checkpoints kept; older ones are deleted after a newer one")
    restore: str = option("latest", "latest (resume from model_dir), none, or a checkpoint path")
    export: bool = option(True, "export/model.keras and export/saved_model when training ends")

    def __post_init__(self):
        if self.every_steps is not None and (isinstance(self.every_steps, bool) or not isinstance(
                self.every_steps, int) or self.every_steps < 1):
            raise ValueError("`every_steps` must be a positive int or None. "
                             f"Received: every_steps={self.every_steps!r}")
        if self.every_secs is not None and (isinstance(self.every_secs, bool) or not isinstance(
                self.every_secs, (int, float)) or self.every_secs <= 0):
            raise ValueError("`every_secs` must be a positive number or None. "
                             f"Received: every_secs={self.every_secs!r}")
        if isinstance(self.max_to_keep, bool) or not isinstance(
                self.max_to_keep, int) or self.max_to_keep < 1:
            raise ValueError("`max_to_keep` must be an int >= 1 (the latest is always kept). "
                             f"Received: max_to_keep={self.max_to_keep!r}")
        if not isinstance(self.restore, str) or not self.restore:
            raise ValueError("`restore` must be 'latest', 'none' or a checkpoint path. "
                             f"Received: restore={self.restore!r}")

    @classmethod
    def coerce(cls, value):
        """Accept True/False/None, a mapping of fields, or an instance."""
        from kerastrain import _options
        return _options.coerce(cls, value, "checkpoint")

class ModelDirInUse(RuntimeError):
    """Another live run holds the model_dir."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ModelDirLock:
    """`model_dir/.kerastrain.lock`: one live run per model_dir; a dead run's lock is taken over.

    The lock records host and pid. On the same host a lock whose process is gone
    is stale and is taken over with a warning; a lock from another host cannot be
    checked and is refused, with the command that removes it.
    """

    NAME = ".kerastrain.lock"

    def __init__(self, model_dir: str):
        self.path = os.path.join(model_dir, self.NAME)
        self.held = False

    def acquire(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                other = self._read()
                if other.get("host") == me["host"] and other.get("pid") == me["pid"]:
                    self.held = True  # this process already holds it (a second Trainer)
                    return
                if other.get("host") == me["host"] and isinstance(other.get("pid"), int) \
                        and not _pid_alive(other["pid"]):
                    logger.warning("model_dir lock %s was left by process %d, which is gone; "
                                   "taking it over", self.path, other["pid"])
                    try:
                        os.remove(self.path)
                    except FileNotFoundError:
                        pass
                    continue
                raise ModelDirInUse(
                    f"model_dir {os.path.dirname(self.path)!r} is in use by another run "
                    f"(host {other.get('host')!r}, pid {other.get('pid')!r}, since "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(other.get('since', 0)))}). "
                    "Two runs writing one model_dir would overwrite each other's checkpoints. "
                    "Use another model_dir, wait for that run to end, or, if it is certainly "
                    f"dead, remove {self.path!r}.") from None
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return
        raise ModelDirInUse(f"could not take the lock {self.path!r}; another run keeps taking it")

    def _read(self):
        try:
            with open(self.path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def release(self):
        if self.held and self._read().get("pid") == os.getpid():
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
        self.held = False


_MANAGER = None


def _manager_class():
    """A CheckpointManager whose `restore_or_initialize` does nothing.

    kerastrain restores itself (with fallback and the `restore=` option).
    TensorFlow's PreemptionCheckpointHandler calls `restore_or_initialize` on the
    manager it is given; a second restore of the newest file would undo
    `restore="none"`, an explicit path, or a fallback past an unreadable newest one.
    """
    global _MANAGER
    if _MANAGER is None:
        import tensorflow as tf

        class Manager(tf.train.CheckpointManager):
            def restore_or_initialize(self):
                return None

        _MANAGER = Manager
    return _MANAGER


class Checkpointer:
    """Saves and restores a `tf.train.Checkpoint` of the training state.

    Every task calls `save` (under multi-worker mirrored, all workers must take part);
    only the chief keeps files. Other tasks write to a temporary directory that
    is removed at once.
    """

    def __init__(self, directory: str | None, options: CheckpointOptions, *, is_chief: bool,
                 **trackables):
        import tensorflow as tf
        self.options = options
        self.is_chief = is_chief
        self.directory = directory
        self.checkpoint = tf.train.Checkpoint(**trackables)
        self.manager = None
        if is_chief and directory:
            self.manager = _manager_class()(
                self.checkpoint, directory, max_to_keep=options.max_to_keep,
                checkpoint_name="ckpt")
        self.last_save_time = time.monotonic()
        self.last_saved_step = None
        self.last_path = None

    def save(self, step: int) -> str | None:
        if self.last_saved_step == step:
            return None
        if self.manager is not None:
            path = self.manager.save(checkpoint_number=step)
        else:
            with outputs.scratch_dir() as scratch:
                self.checkpoint.write(os.path.join(scratch, "ckpt"))
            path = None
        self.last_save_time = time.monotonic()
        self.last_saved_step = step
        self.last_path = path or self.last_path
        if path:
            logger.info("checkpoint saved at step %d: %s", step, path)
        return path

    def due(self, step: int, *, epoch_end: bool, now: float | None = None) -> bool:
        o = self.options
        if epoch_end and o.at_epoch_end:
            return True
        if o.every_steps and step % o.every_steps == 0:
            return True
        now = time.monotonic() if now is None else now
        return bool(o.every_secs) and now - self.last_save_time >= o.every_secs

    def candidates(self) -> list[str]:
        """Checkpoints to try, newest first."""
        import tensorflow as tf
        restore = self.options.restore
        if restore == "none":
            return []
        if restore != "latest":
            return [restore]
        if not self.directory:
            return []
        state = tf.train.get_checkpoint_state(self.directory)
        if state is None:
            return []
        paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
        return [p if os.path.isabs(p) else os.path.join(self.directory, p) for p in reversed(paths)]

    def restore(self) -> str | None:
        """Restore the newest readable checkpoint; warn about and skip unreadable ones.

        Raises:
            FileNotFoundError: an explicit `restore=` path does not exist or cannot be read.
        """
        import tensorflow as tf
        tried = []
        for path in self.candidates():
            try:
                status = self.checkpoint.read(path)
                status.assert_existing_objects_matched()
                # The file also holds Checkpoint's own save_counter, which `read` leaves
                # alone on purpose; without this TensorFlow warns about it at exit.
                status.expect_partial()
            # A truncated file surfaces as IndexError ("Read less bytes than requested").
            except (tf.errors.OpError, ValueError, AssertionError, IndexError, OSError) as e:
                if self.options.restore not in ("latest", "none"):
                    raise FileNotFoundError(
                        f"Cannot restore `restore={path!r}`: {type(e).__name__}: "
                        f"{str(e).splitlines()[0][:200]}. Give a checkpoint prefix such as "
                        "'runs/exp/checkpoints/ckpt-200', or restore='latest'.") from None
                logger.warning("checkpoint %s is unreadable (%s: %s); trying the previous one",
                               path, type(e).__name__, str(e).splitlines()[0][:160])
                tried.append(path)
                continue
            if tried:
                logger.warning("resumed from %s instead of the newer unreadable %s", path, tried)
            return path
        if tried:
            # Training from scratch would save over them, and rotation would delete
            # them: the user decides.
            raise RuntimeError(
                f"None of the {len(tried)} checkpoint(s) in {self.directory} can be read "
                f"(tried {tried}); kerastrain will not train over them. Move them away or use "
                "another model_dir to start afresh, or point `checkpoint={'restore': PATH}` at a "
                "readable checkpoint.")
        return None


def export(model, export_dir: str) -> dict:
    """`export_dir/model.keras` (Keras) and `export_dir/saved_model/` (TensorFlow serving)."""
    os.makedirs(export_dir, exist_ok=True)
    keras_path = os.path.join(export_dir, "model.keras")
    saved_model = os.path.join(export_dir, "saved_model")
    model.save(keras_path)
    if os.path.exists(saved_model):
        shutil.rmtree(saved_model)  # ours, from an earlier fit on this model_dir
    model.export(saved_model, verbose=False)
    return {"keras": keras_path, "saved_model": saved_model}
