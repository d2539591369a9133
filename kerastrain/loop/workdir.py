"""Where a Trainer's run writes, and what: its `model_dir` (or a `BackupAndRestore`'s
backup_dir in its place), the lock on it, the chief's metric writers, `config.yaml`.

The Trainer holds one `WorkDir`; what this task keeps of what it writes (the chief rule) is
`io/outputs.py`'s to decide, asked through `self.outputs`.
"""

from __future__ import annotations

import dataclasses
import logging

from kerastrain.io import checkpoints
from kerastrain.io import files
from kerastrain.io import monitor as monitor_lib
from kerastrain.io import outputs as outputs_lib
from kerastrain.io import summaries
from kerastrain.loop import callbacks as callbacks_lib

logger = logging.getLogger("kerastrain")


class WorkDir:
    """One Trainer's place for its outputs (see the module docstring).

    Args:
        model_dir: normalized (`outputs.normalize_model_dir`), or None: nowhere.
        is_chief: whether this task is the chief, handed to `outputs.Outputs` (the rule).
        checkpoint: a `checkpoints.CheckpointOptions`, or None.
        tensorboard: a `monitor.TensorBoardOptions`, or None.
        writers: the user's more `summaries.MetricWriter`s.
    """

    def __init__(self, model_dir, *, is_chief, checkpoint, tensorboard, writers):
        self.model_dir = model_dir
        self.checkpoint, self.tensorboard = checkpoint, tensorboard
        self.settings = {}           # what the run resolved to (config.yaml), set by the Trainer
        self._settings_text = None
        self._extra_writers = list(writers or [])
        self._writer = self._tb_writer = None
        # Where the run's state goes from the next fit on, once a BackupAndRestore moved it
        # (`(model_dir, outputs, options)`): taken by its keeper (`take_move`).
        self._moved_to = None
        self._backup = None          # a BackupAndRestore's `callbacks.Backup` in use
        self._before_backup = None   # the checkpoint options it replaced
        self.outputs = outputs_lib.Outputs(model_dir, is_chief)
        self._lock = None

    def claim(self, settings):
        """Take model_dir's lock and tidy what interrupted writes left (chief only; the
        Trainer does so once its model is built: a failed build holds no lock); keep the
        run's resolved `settings` for `config.yaml`."""
        self._lock = self.outputs.claim(tidy=checkpoints.tidy)
        self.settings = settings

    def close(self):
        """Flush the writers and release the model_dir lock."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._lock is not None:
            self._lock.release()

    # -- metrics --------------------------------------------------------------------------

    def metric_writer(self):
        """The chief's writers (TensorBoard under model_dir/logs, plus the user's); else None."""
        if self._writer is None:
            writers = self.outputs.writers(self._extra_writers)
            logdir = self.outputs.dir("logs") if self.tensorboard else None
            if logdir:
                self._tb_writer = summaries.TensorBoardWriter(logdir)
                writers.insert(0, self._tb_writer)
            if writers:
                self._writer = writers[0] if len(writers) == 1 else summaries.MultiWriter(writers)
                self._writer.open(self.model_dir)
        return self._writer

    def monitor(self, model, step, element_spec):
        """The chief's `monitor.Monitor` for one fit, started at `step`."""
        import yaml
        if self._settings_text is None:
            # The settings this run resolved to, next to what it wrote (chief only); once
            # per place, not per fit (dumping and writing them was 1% of a short epoch).
            self._settings_text = yaml.safe_dump(self.settings, sort_keys=False)
            self.outputs.replace_text("config.yaml", self._settings_text)
        writer = self.metric_writer()
        return monitor_lib.model_monitor(
            model, writer, self.tensorboard, step=step, settings=self._settings_text,
            element_spec=element_spec,
            train_logdir=self._tb_writer.train_dir if self._tb_writer is not None else None)

    def wrote_export(self):
        """Tell the writers that `model_dir/export` was written."""
        if self._writer is not None:
            self._writer.write_export(self.outputs.path("export"))

    # -- a BackupAndRestore ---------------------------------------------------------------

    def use_backup(self, callbacks):
        """A `keras.callbacks.BackupAndRestore` among `callbacks`: its backup_dir is this
        Trainer's model_dir (the same place) or, without one, where the run's checkpoints
        go (nothing else is written there). Returns the other callbacks."""
        callbacks, backup = callbacks_lib.take_backup(callbacks)
        if backup is None:
            return callbacks
        if backup.backup_dir == self.model_dir:
            if self._backup is not None:
                # The backup of an earlier fit of this Trainer: as Keras's callback restores
                # it at every fit's start, the state it holds (left by a fit an error ended)
                # is where this fit begins.
                self._moved_to = (self.model_dir, self.outputs, self.checkpoint)
            return callbacks
        if self.model_dir is not None and self._backup is None:
            raise ValueError(
                "`BackupAndRestore(backup_dir=...)` and the Trainer's `model_dir` are two places "
                "for one run's state: pass the same directory, or drop the callback (model_dir's "
                "checkpoints already back the run up). Received: backup_dir="
                f"{backup.backup_dir!r}, model_dir={self.model_dir!r}")
        if self._backup is None:
            self._before_backup = self.checkpoint
        self._move(backup.backup_dir, backup.checkpoint_options())
        self._backup, self.tensorboard = backup, None
        logger.info("BackupAndRestore: the run's checkpoints go to backup_dir %s (save_freq=%r"
                    "%s); kerastrain's checkpoints replace the callback's own files", backup.
                    backup_dir, backup.save_freq, ", removed when training ends" if
                    backup.delete else "")
        return callbacks

    def backup_done(self):
        """Training ended: remove a `BackupAndRestore(delete_checkpoint=True)`'s state, as
        Keras does (kerastrain's own files only), so the script's next run starts over."""
        backup = self._backup
        if backup is None or not backup.delete:
            return
        directory = self.outputs.path()
        if directory is not None:
            for name in ("checkpoints", "config.yaml"):
                files.remove(files.join(directory, name))
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if directory is not None and not files.listdir(directory):
            files.remove(directory)
        self._move(None, self._before_backup)
        self._backup = None

    def _move(self, model_dir, options):
        if self._lock is not None:
            self._lock.release()
        self.model_dir, self.checkpoint = model_dir, options
        self.settings.update(model_dir=model_dir,
                             checkpoint=options and dataclasses.asdict(options))
        self._settings_text = None
        self.outputs = self.outputs.at(model_dir)
        self._lock = self.outputs.claim(tidy=checkpoints.tidy)
        self._moved_to = (model_dir, self.outputs, options)

    def take_move(self):
        """Where the run's state goes since `use_backup` or `backup_done` moved it, once:
        `(model_dir, outputs, options)`, or None when it stays."""
        moved, self._moved_to = self._moved_to, None
        return moved
