"""Where a run stands, kept with every checkpoint; restoring it; the chief's export.

A checkpoint holds the model and optimizer, the global step, and four counters: the
epoch in progress, the steps taken into it, and the data position (passes begun over
the training data, batches into the current pass), plus the epoch's running totals
so that a resumed epoch's logs are exact. `RunState` creates those variables, writes
them before a save, reads them back on the first `fit` of a Trainer, and exports the
trained model (chief only; other multi-worker tasks take part in a removed scratch
directory, as the collective save requires).

A run a callback ended (`model.stop_training`: EarlyStopping...) is saved once more at its
stop, after the callbacks' `on_train_end` (the weights EarlyStopping restored), and the chief
writes `checkpoints/ended.json` beside it: a rerun that resumes from that checkpoint has
nothing left to train and says why (`Ended`). A SIGTERM or a NaN loss is no end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os

import numpy as np
import tensorflow as tf

from kerastrain.io import checkpoints
from kerastrain.io import files
from kerastrain.step import models as models_lib
from kerastrain.io import outputs as outputs_lib

logger = logging.getLogger("kerastrain")

COUNTERS = ("epoch", "step_in_epoch", "data_pass", "data_offset")
ENDED = "ended.json"  # in model_dir/checkpoints: the checkpoint a callback's stop was saved in


@dataclasses.dataclass(frozen=True)
class Ended:
    """A run a callback ended: at which epoch (1-based) of how many, at which step, why,
    and the checkpoint saved at the stop (the record is valid while it is the newest)."""

    epoch: int
    epochs: int
    step: int
    reason: str
    checkpoint: str

    def __str__(self):
        early = " early" if self.epoch < self.epochs else ""
        return (f"ended{early} at epoch {self.epoch} of {self.epochs}, step {self.step} "
                f"({self.reason})")


class RunState:
    """The counters of a run (made under the strategy's scope) and its checkpointer."""

    def __init__(self, *, options, model_dir, outputs, every_task_saves, background=True,
                 traced=False):
        self.options = options  # a `checkpoints.CheckpointOptions`, or None: no checkpoints
        self.model_dir = model_dir
        self.outputs = outputs  # `outputs.Outputs`: what this task keeps (the chief rule)
        # Every task takes part in each save and export (the mode's rule: multi-worker
        # mirrored reads on-read variables collectively), so none exports alone.
        self.every_task_saves = every_task_saves
        self.background = background  # the strategy allows background checkpoint writes
        self.traced = traced  # foreground writes through one traced function (modes.py)
        self.counters = {name: tf.Variable(0, dtype=tf.int64, trainable=False, name=name)
                         for name in COUNTERS}
        self.epoch_totals = None
        self.checkpointer = None
        self.restored = False
        self.ended = None  # an `Ended`: the run restored, or this fit, was ended by a callback

    def attach(self, *, width, model, global_step):
        """Create the epoch totals (`width` values; any length later: a model's own
        train_step says how many logs it has on first use) and the checkpointer."""
        self.epoch_totals = tf.Variable(np.zeros(width), dtype=tf.float64,
                                        shape=tf.TensorShape([None]), trainable=False,
                                        name="epoch_totals")
        self._saved = dict(model=model, global_step=global_step)
        self._make_checkpointer()

    def _make_checkpointer(self):
        options, model = self.options, self._saved["model"]
        self.checkpointer = None
        if options and (self.model_dir or options.restore not in ("latest", "none")):
            directory = files.join(self.model_dir, "checkpoints") if self.model_dir else None
            # `background`: the mode's rule (modes.py; foreground under multi-worker mirrored
            # and parameter servers).
            self.checkpointer = checkpoints.Checkpointer(
                directory, options, keep=self.outputs.enabled,
                background=options.background and self.background, traced=self.traced,
                model=model,
                optimizer=model.optimizer, global_step=self._saved["global_step"],
                epoch_totals=self.epoch_totals, **_states(model), **self.counters)

    def move(self, *, model_dir, outputs, options):
        """Keep the state in another place from the next fit on (a `BackupAndRestore`'s
        backup_dir, or none once it is deleted): it is restored from there if it holds some."""
        self.wait()
        self.model_dir, self.outputs, self.options = model_dir, outputs, options
        self.restored = False
        if self.epoch_totals is not None:
            self._make_checkpointer()

    def restore(self, driver, train_input, global_step, epochs=None):
        """On the first fit, restore the latest checkpoint and move the driver's data to
        where it stood; return where training stood (None: nothing restored). `epochs`:
        the fit's, for the log line. A run a callback ended is `self.ended` then."""
        self.ended = None
        if self.restored or self.checkpointer is None:
            return None
        self.restored = True
        path = self.checkpointer.restore()
        if path is None:
            return None
        info = {k: int(v.numpy()) for k, v in self.counters.items()}
        info["totals"] = np.asarray(self.epoch_totals.numpy(), np.float64)
        self.ended = self._ended_at(path)
        if self.ended is not None:
            logger.info("resumed from %s, where the run %s: nothing left to train. To train "
                        "on from there anyway, restore that checkpoint explicitly "
                        "(Trainer(checkpoint={'restore': %r}); a recipe: checkpoints.restore), "
                        "or give another model_dir to start afresh", path, self.ended, path)
        else:
            logger.info("resumed from %s: step %d, %s", path, global_step(),
                        _where(info, epochs))
        driver.resume(train_input, info["data_pass"], info["data_offset"])
        return info

    def first_epoch(self, resumed, initial_epoch, epochs):
        """The fit's first epoch: after where a restored run stood (`epochs`, none to train,
        when a callback had ended it)."""
        if self.ended is not None:
            return max(initial_epoch, epochs)
        return max(initial_epoch, resumed["epoch"]) if resumed else initial_epoch

    def _ended_at(self, path):
        """The `Ended` recorded for the checkpoint `path` restored from model_dir (None: none,
        an explicit `restore=` path, or a record of an older checkpoint)."""
        if self.options.restore != "latest" or not self.checkpointer.directory:
            return None
        text = files.read_text(files.join(self.checkpointer.directory, ENDED))
        try:
            record = json.loads(text)
            if record["checkpoint"] != os.path.basename(path):
                return None
            return Ended(**{f.name: record[f.name] for f in dataclasses.fields(Ended)})
        except (TypeError, ValueError, KeyError):
            return None  # no record, or one kerastrain cannot read: resume as before

    def save_end(self, driver, progress, *, epochs, within, reason):
        """A callback ended training at `progress`: `self.ended`; with checkpoints, save that
        step again with the weights the model holds now (after `on_train_end`) and where
        training stood: `within` its epoch, the batch, totals and data position of the stop
        (`{batch, totals, data}`, as a mid-epoch checkpoint has them); else (None) after the
        epoch. Then, on the chief, record the end beside it. Every task takes part."""
        path = None
        if self.checkpointer is not None:
            if within:
                self.set(within["data"], progress.epoch, within["batch"], within["totals"])
            else:
                self.set(driver, progress.epoch + 1, 0, np.zeros_like(progress.totals))
            path = self.checkpointer.save(progress.step, again=True)
            self.wait()
        self.ended = Ended(epoch=progress.epoch + 1, epochs=epochs, step=progress.step,
                           reason=reason, checkpoint=os.path.basename(path or ""))
        if path is not None and self.checkpointer.manager is not None:
            record = files.join(self.checkpointer.directory, ENDED)
            with files.disk_full_guard("the record of the run's end", record,
                                       "the checkpoint of the stop is whole; a rerun resumes "
                                       "from it and trains on"):
                files.write_text(record, json.dumps(dataclasses.asdict(self.ended)))
            logger.info("training %s; recorded in %s: a rerun on this model_dir trains nothing",
                        self.ended, record)

    def set(self, driver, epoch, batch, totals):
        for name, value in (("epoch", epoch), ("step_in_epoch", batch),
                            ("data_pass", driver.passes), ("data_offset", driver.saved_offset)):
            self.counters[name].assign(value)
        self.epoch_totals.assign(totals)

    def save(self, driver, epoch, batch, totals, step):
        """Save training state at `step`; returns the checkpoint's path (None: not kept here)."""
        if self.checkpointer is None:
            return None
        self.set(driver, epoch, batch, totals)
        return self.checkpointer.save(step)

    def wait(self):
        """Block until a checkpoint written in the background is whole (its error raised)."""
        if self.checkpointer is not None:
            self.checkpointer.wait()

    @contextlib.contextmanager
    def writes_settled(self):
        """A `fit`'s training: when it ends, by any way, the last checkpoint is whole on disk
        (a write that fails raises, unless an error is already on its way: then it is said)."""
        try:
            yield
        except BaseException:
            try:
                self.wait()
            except Exception as e:  # noqa: BLE001 (the first error is the one raised)
                logger.error("the last checkpoint could not be written either: %s", e)
            raise
        self.wait()

    def latest_checkpoint(self):
        """The newest checkpoint kept in model_dir (None: none)."""
        ckpt = self.checkpointer
        candidates = ckpt.candidates() if ckpt is not None and ckpt.directory else []
        return candidates[0] if candidates else None

    def export(self, model, *, model_source, partitioned, step):
        """The chief exports to model_dir/export; other workers take part in a removed temp dir."""
        if not (self.options and self.options.export and self.model_dir):
            return None
        if self.outputs.enabled:  # the chief (there is a model_dir)
            if partitioned:
                # One machine serves it: the same model with whole variables.
                model = models_lib.unpartitioned_copy(model, model_source)
            paths = checkpoints.export(model, self.outputs.path("export"), step=step)
            logger.info("exported %s and %s", paths["keras"], paths["saved_model"])
            return paths
        if self.every_task_saves:
            with outputs_lib.scratch_dir() as scratch:
                checkpoints.export(model, scratch)
        return None

    def export_missing(self, step):
        """Whether the chief's export is missing or not of this step (a run killed or out of
        disk while exporting): a rerun with nothing left to train writes it again."""
        if not (self.options and self.options.export and self.outputs.enabled) \
                or self.every_task_saves or step == 0:
            return False
        return not checkpoints.export_is_current(self.outputs.path("export"), step)


def _where(info, epochs):
    """Where a restored run stood, for the log line."""
    of = f" of {epochs}" if epochs else ""
    if info["step_in_epoch"]:
        return f"{info['step_in_epoch']} steps into epoch {info['epoch'] + 1}{of}"
    if epochs and info["epoch"] >= epochs:   # as `kerastrain run` says it in its last line
        return (f"after epoch {info['epoch']}{of}: nothing left to train (pass more epochs to "
                "go on)")
    if info["epoch"]:
        return f"after epoch {info['epoch']}{of}"
    return "at the start of epoch 1"


def _states(model):
    """The model's variables that are not weights (the seed generators' states of
    `Dropout` and other random layers), which a checkpoint of the model alone leaves out:
    kept beside it, a resumed run draws what an uninterrupted one draws."""
    weights = {id(v) for v in model.weights}
    states = [v for v in model.variables if id(v) not in weights]
    return {"model_states": states} if states else {}
