"""Inside a trial: each epoch's logs go to the sweep, and the sweep's verdict comes back.

The sweep adds `Reporter` to the trial's `callbacks:` (`kerastrain run ... --set callbacks=`),
so a trial is a plain recipe run. The channel is two kinds of small files in the trial's
folder, `sweep/epochs.jsonl` (one line per epoch, appended by the chief) and
`sweep/verdict-<epoch>` (written whole by the sweep: "go" or "prune"): they outlive either
process, so a sweep or a trial killed and started again picks the exchange up where it was.
"""

from __future__ import annotations

import json
import logging
import os
import time

import keras

from kerastrain.distribute import cluster
from kerastrain.io import outputs
from kerastrain.cli.tune.trials import EPOCHS, FOLDER, verdict_path

logger = logging.getLogger("kerastrain")


class Reporter(keras.callbacks.Callback):
    """At each epoch's end: append `{"epoch": n, "logs": {...}}` to `directory/sweep/epochs.jsonl`
    (the chief only), then wait for the sweep's verdict on that epoch; "prune" ends the run
    cleanly, as `EarlyStopping` would (`model.stop_training`), on every task alike.

    Args:
        directory: the trial's folder (its `trainer.model_dir`).
        timeout: seconds to wait for a verdict before training on (the sweep answers within
            a second; a trial dies with the sweep that started it).
    """

    def __init__(self, directory, timeout=600.0):
        super().__init__()
        self.directory, self.timeout = directory, float(timeout)
        self._outputs = outputs.Outputs(directory, cluster.this_task_is_chief())

    def on_epoch_end(self, epoch, logs=None):
        number = epoch + 1   # epochs are counted from 1 in the sweep's lines
        folder = self._outputs.dir(FOLDER)
        if folder is not None:
            line = json.dumps({"epoch": number, "logs": {
                k: float(v) for k, v in (logs or {}).items() if _is_scalar(v)}})
            with open(os.path.join(folder, EPOCHS), "a") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())
        if self._verdict(number) == "prune":
            self.model.stop_training = True

    def _verdict(self, number):
        path, deadline = verdict_path(self.directory, number), time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            try:
                with open(path) as f:
                    return f.read().strip()
            except FileNotFoundError:
                time.sleep(0.05)
        logger.warning("no verdict from the sweep on epoch %d within %.0f s (%s): training on",
                       number, self.timeout, path)
        return "go"


def _is_scalar(value):
    try:
        float(value)   # a NumPy or TensorFlow scalar too; NaN and inf are said as they are
    except (TypeError, ValueError):
        return False
    return True
