"""Chief-only checkpoints that never lose work: cadence, restore with fallback, lock, export."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
import uuid

from kerastrain.io import cadence
from kerastrain.io import files
from kerastrain.io import locks
from kerastrain.io import outputs
from kerastrain.io.locks import ModelDirInUse, ModelDirLock  # noqa: F401  (public here since 0.1)
from kerastrain._options import is_int, is_number, option

logger = logging.getLogger("kerastrain")

STATE_FILE = "checkpoint"  # TensorFlow's index of the kept checkpoints
_INDEX = re.compile(r"^ckpt-(\d+)\.index$")
# What a killed save leaves in model_dir/checkpoints: TensorFlow writes `ckpt-N_temp/`
# and renames out of it, and writes the state file beside as `checkpoint.tmp<uuid hex>`.
_SAVE_TEMPORARY = re.compile(r"^(ckpt-\d+_temp.*|checkpoint\.tmp[0-9a-f]{32})$")
EXPORT = "export"
EXPORT_MARKER = "kerastrain-export.json"  # written last: an export without it is incomplete
_STAGING = ".kerastrain-partial-"  # export/ is written beside, as export.kerastrain-partial-<hex>
_OLD = ".kerastrain-old-"  # ... and the one it replaces is moved to export.kerastrain-old-<hex>


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
    background: bool = option(True, "write each checkpoint in a background thread: training "
                              "goes on once the values are copied in memory; the next save, "
                              "SIGTERM and the end of training wait for the write (foreground "
                              "under multi-worker mirrored and parameter servers)")

    def __post_init__(self):
        if self.every_steps is not None and not is_int(self.every_steps, 1):
            raise ValueError("`every_steps` must be a positive int or None. "
                             f"Received: every_steps={self.every_steps!r}")
        if self.every_secs is not None and not is_number(self.every_secs, above=0):
            raise ValueError("`every_secs` must be a positive number or None. "
                             f"Received: every_secs={self.every_secs!r}")
        if not is_int(self.max_to_keep, 1):
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
    one that keeps nothing (`keep`) writes to a temporary directory that is removed at once.

    Args:
        directory: where checkpoints are read from, and kept (None: none).
        keep: whether this task keeps what it saves in `directory`: the chief rule's answer
            (`outputs.Outputs.enabled`).
    """

    def __init__(self, directory: str | None, options: CheckpointOptions, *, keep: bool,
                 background: bool = False, traced: bool = False, **trackables):
        import tensorflow as tf
        self.options = options
        self.directory = directory
        self.checkpoint = tf.train.Checkpoint(**trackables)
        # Read checkpoints written before a model's states were kept (`model_states`).
        self._without_states = tf.train.Checkpoint(**{
            k: v for k, v in trackables.items() if k != "model_states"}) \
            if "model_states" in trackables else self.checkpoint
        self.manager = None
        if keep and directory:
            _recover_state(directory)  # before the manager reads it
            self.manager = _manager_class()(
                self.checkpoint, directory, max_to_keep=options.max_to_keep,
                checkpoint_name="ckpt")
        self.cadence = cadence.Every(steps=options.every_steps, secs=options.every_secs)
        self.last_saved_step = None
        self.last_path = None       # the newest checkpoint written whole by this Checkpointer
                                    # (set by the writer thread once a background write is)
        self.saved_path = None      # the newest one asked for (whole, or being written)
        # Written in a background thread (TensorFlow's asynchronous save) where it can be:
        # decided at the first save, once the optimizer's variables exist.
        self.background = bool(background and self.manager is not None)
        self._checked_background = False
        self._pending = None        # (step, path, what holds if it fails) being written
        # Foreground saves through one traced function (`traced`: the mode's rule, under
        # parameter servers; `_compat.TracedCheckpointWrite` says why).
        self._traced = None
        if traced and self.manager is not None:
            from kerastrain import _compat
            self._traced = _compat.TracedCheckpointWrite(self.checkpoint)

    def _can_write_in_background(self):
        """Whether TensorFlow's asynchronous save copies every object of this checkpoint;
        one it cannot copy would be left out of the file (TensorFlow only logs it), so the
        saves stay in the foreground, said once."""
        if not self._checked_background:
            self._checked_background = True
            from kerastrain import _compat
            _compat.keras_variables_copy_for_async_save()
            missing = _compat.not_copied_by_async_save(self.checkpoint)
            if missing:
                self.background = False
                logger.info("checkpoints: written in the foreground: TensorFlow's background "
                            "save cannot copy %s", ", ".join(missing[:3]))
        return self.background

    def _save_in_background(self, step):
        import tensorflow as tf

        def written(path):  # in TensorFlow's writer thread, once the files are whole
            self.last_path = path
            logger.debug("checkpoint saved at step %d: %s (written in the background)",
                         step, path)
        options = tf.train.CheckpointOptions(enable_async=True,
                                             experimental_write_callbacks=[written])
        return self.manager.save(checkpoint_number=step, options=options)

    def wait(self):
        """Block until the checkpoint being written in the background is whole on disk.

        Raises:
            files.DiskFull: the disk filled during the write (the earlier checkpoints are
                intact, and the partial one is removed).
            Exception: any other error of the write, for the step it was writing.
        """
        if self._pending is None:
            return
        step, path, after = self._pending
        self._pending = None
        from kerastrain import _compat
        self.checkpoint.sync()
        error = _compat.take_async_save_error(self.checkpoint)
        if error is None and self.last_path != path:
            error = RuntimeError(f"the background write of the checkpoint of step {step} "
                                 "ended without writing it (TensorFlow reported no error)")
        if error is None:
            return
        _remove_quietly(files.join(self.directory, f"ckpt-{step}_temp"))
        with files.disk_full_guard(f"the checkpoint of step {step}", self.directory, after):
            raise error

    def save(self, step: int, *, again: bool = False) -> str | None:
        """Save at `step` (once per step; `again`: write that step's checkpoint once more, with
        what the variables hold now); returns the path being written (None: not kept by this
        task). A background write is whole once `wait` returns."""
        if self.last_saved_step == step and not again:
            return self.saved_path
        background = False
        if self.manager is not None:
            self.wait()
            locks.check(self.directory)
            latest = self.manager.latest_checkpoint
            after = (f"the earlier checkpoints are intact (latest: {latest}); free space and run "
                     "again to resume from it" if latest else
                     "no checkpoint was kept yet; free space and run again")
            background = self.background and self._can_write_in_background()
            try:
                with files.disk_full_guard(f"the checkpoint of step {step}", self.directory,
                                           after):
                    if background:
                        path = self._save_in_background(step)
                        self._pending = (step, path, after)
                    elif self._traced is not None:
                        with self._traced.around():
                            path = self.manager.save(checkpoint_number=step)
                    else:
                        path = self.manager.save(checkpoint_number=step)
            except files.DiskFull:
                _remove_quietly(files.join(self.directory, f"ckpt-{step}_temp"))
                raise
        else:
            with outputs.scratch_dir() as scratch:
                with files.disk_full_guard(f"this worker's part of the checkpoint of step {step}",
                                           scratch, "the chief's checkpoints are intact"):
                    self.checkpoint.write(os.path.join(scratch, "ckpt"))
            path = None
        self.cadence.done()
        self.last_saved_step = step
        self.saved_path = path
        if path and not background:
            self.last_path = path
            logger.info("checkpoint saved at step %d: %s", step, path)
        elif path:
            # Said now, with the epoch it ends (the writer thread's line would land in the
            # next one); whole before the next save, SIGTERM's exit and the end of `fit`.
            logger.info("checkpoint at step %d: %s (being written in the background)",
                        step, path)
        return path

    def due(self, step: int, *, epoch_end: bool, now: float | None = None) -> bool:
        if epoch_end and self.options.at_epoch_end:
            return True
        return self.cadence.due(step, now)

    def candidates(self) -> list[str]:
        """Checkpoints to try, newest first."""
        restore = self.options.restore
        if restore == "none":
            return []
        if restore != "latest":
            return [restore]
        if not self.directory:
            return []
        listed = []
        state = _state(self.directory)
        if state is not None:
            paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
            listed = [p if files.is_url(p) or os.path.isabs(p) else files.join(self.directory, p)
                      for p in reversed(paths)]
        # Checkpoints the state file does not list (it was lost, or written before a save
        # that failed): never train over them, try them after the listed ones.
        return listed + [p for _, p in reversed(on_disk(self.directory)) if p not in listed]

    def _reader_for(self, path):
        """The checkpoint object that reads `path`: one without the model's states where
        the file has none (written by an older kerastrain)."""
        import tensorflow as tf
        if self._without_states is self.checkpoint:
            return self.checkpoint
        try:
            names = [name for name, _ in tf.train.list_variables(path)]
        except (tf.errors.OpError, ValueError):
            return self.checkpoint  # unreadable: the read below says so
        return self.checkpoint if any(n.startswith("model_states/") for n in names) \
            else self._without_states

    def restore(self) -> str | None:
        """Restore the newest readable checkpoint; warn about and skip unreadable ones.

        Raises:
            FileNotFoundError: an explicit `restore=` path does not exist or cannot be read.
        """
        import tensorflow as tf
        self.wait()
        tried = []
        for path in self.candidates():
            try:
                status = self._reader_for(path).read(path)
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


def _state(directory):
    """TensorFlow's CheckpointState of `directory`, or None if missing or unreadable."""
    import tensorflow as tf
    try:
        return tf.train.get_checkpoint_state(directory)
    except ValueError:  # an empty state file: TensorFlow raises instead of ignoring it
        return None


def on_disk(directory: str) -> list[tuple[int, str]]:
    """(step, prefix) of every `ckpt-N` with an index file in `directory`, oldest first."""
    found = []
    for name in files.listdir(directory):
        match = _INDEX.match(name)
        if match:
            found.append((int(match.group(1)), files.join(directory, f"ckpt-{match.group(1)}")))
    return sorted(found)


def _recover_state(directory):
    """Write the state file again when it is gone but checkpoints are there.

    Without it, TensorFlow's manager believes the directory empty: a run would start
    over, save over `ckpt-N` of the same names, and never rotate the old ones. With
    it rebuilt, they are restored from and rotated as if nothing had happened.
    """
    found = on_disk(directory)
    if not found or _state(directory) is not None:
        return
    import tensorflow as tf
    paths = [p for _, p in found]
    now = time.time()
    with files.disk_full_guard("the checkpoint state file", files.join(directory, STATE_FILE)):
        # Timestamps after `last_preserved_timestamp`: the manager may rotate them.
        tf.compat.v1.train.update_checkpoint_state(
            directory, paths[-1], all_model_checkpoint_paths=paths,
            all_model_checkpoint_timestamps=[now] * len(paths), last_preserved_timestamp=now - 1)
    logger.warning("the checkpoint state file %s was missing or unreadable; rebuilt it from the "
                   "%d checkpoint(s) in that directory (%s)", files.join(directory, STATE_FILE),
                   len(paths), ", ".join(os.path.basename(p) for p in paths))


def _remove_quietly(path):
    try:
        files.remove(path)
    except Exception:  # tidying after a failure must not hide the failure
        pass


def tidy(model_dir: str):
    """Remove what killed saves left (chief only, lock held): kerastrain's and TensorFlow's
    temporary names only. Put a previous export back if a run died while replacing it."""
    removed = []
    directory = files.join(model_dir, "checkpoints")
    for name in files.listdir(directory):
        if _SAVE_TEMPORARY.match(name) or files.is_own_temporary(name):
            files.remove(files.join(directory, name))
            removed.append(f"checkpoints/{name}")
    export_dir = files.join(model_dir, EXPORT)
    names = files.listdir(model_dir)
    for name in names:
        if files.is_own_temporary(name) or name.startswith(EXPORT + _STAGING):
            files.remove(files.join(model_dir, name))
            removed.append(name)
    for name in sorted(n for n in names if n.startswith(EXPORT + _OLD)):
        if not files.exists(export_dir):
            files.rename(files.join(model_dir, name), export_dir)
            logger.warning("a run ended while replacing %s; put the previous export back",
                           export_dir)
        else:
            files.remove(files.join(model_dir, name))
            removed.append(name)
    if removed:
        logger.info("removed what interrupted writes left in %s: %s", model_dir,
                    ", ".join(removed))


def export_is_current(export_dir: str, step: int) -> bool:
    """Whether `export_dir` holds a complete export of the model at `step`."""
    text = files.read_text(files.join(export_dir, EXPORT_MARKER))
    try:
        return json.loads(text)["step"] == step
    except (TypeError, ValueError, KeyError):
        return False


def export(model, export_dir: str, *, step: int | None = None) -> dict:
    """`export_dir/model.keras` (Keras) and `export_dir/saved_model/` (TensorFlow serving).

    A reader sees the previous export or the whole new one. Where directories
    rename atomically (local disks, ram://), the export is written beside as
    `export.kerastrain-partial-<hex>` and swapped in by two renames (a run killed
    between them gets the previous one back at its next start). On object stores
    (gs://) it is written in place and `kerastrain-export.json` is written last:
    an export without it is incomplete, and the next run writes it again.

    Raises:
        kerastrain.io.files.DiskFull: no space; the previous export is intact (or,
            on object stores, marked incomplete).
    """
    locks.check(export_dir)
    paths = {"keras": files.join(export_dir, "model.keras"),
             "saved_model": files.join(export_dir, "saved_model")}
    if files.renames_atomically(export_dir):
        staging = f"{export_dir}{_STAGING}{uuid.uuid4().hex[:12]}"
        before = "the previous export is intact" if files.exists(export_dir) else \
            "no export was written"
        try:
            with files.disk_full_guard("the export", export_dir,
                                       f"{before}; free space and run again to write it"):
                _write_export(model, staging, step)
                old = None
                if files.exists(export_dir):
                    old = f"{export_dir}{_OLD}{uuid.uuid4().hex[:12]}"
                    files.rename(export_dir, old)
                files.rename(staging, export_dir)
                if old:
                    _remove_quietly(old)
        finally:
            _remove_quietly(staging)
        return paths
    with files.disk_full_guard("the export", export_dir, f"it is marked incomplete (no "
                               f"{EXPORT_MARKER}); free space and run again to write it"):
        marker = files.join(export_dir, EXPORT_MARKER)
        if files.exists(marker):
            files.remove(marker)
        _write_export(model, export_dir, step)
    return paths


def _write_export(model, directory, step):
    files.makedirs(directory)
    saved_model = files.join(directory, "saved_model")
    if files.exists(saved_model):
        files.remove(saved_model)  # ours, from an earlier fit on this model_dir
    model.save(files.join(directory, "model.keras"))
    model.export(saved_model, verbose=False)
    files.write_text(files.join(directory, EXPORT_MARKER), json.dumps(
        {"step": step, "written": time.time(), "files": ["model.keras", "saved_model"]}))
