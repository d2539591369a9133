"""The side-car evaluator: an `evaluator` task evaluates each new checkpoint as it appears.

It is not part of the training cluster (a coordinator that sees it in the
cluster spec waits for it forever, tensorflow#46169): it trains nothing, runs
on its own devices, reads `model_dir/checkpoints`, and writes `val_*`-style
scalars to `model_dir/logs/evaluator` for TensorBoard. It stops once the chief
has come and gone, or if the chief never appears.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

from kerastrain.distribute import cluster
from kerastrain.io import files
from kerastrain.io import outputs

logger = logging.getLogger("kerastrain")


class _ChiefWatch:
    """True once the chief has been reachable and then was not for three polls."""

    def __init__(self, address, startup_timeout):
        self.address = address
        self.startup_timeout = startup_timeout
        self.start = time.monotonic()
        self.seen = False
        self.misses = 0

    def __call__(self) -> bool:
        if cluster._reachable(self.address):
            self.seen, self.misses = True, 0
            return False
        if self.seen:
            self.misses += 1
            return self.misses >= 3
        return time.monotonic() - self.start > self.startup_timeout


def run(recipe, *, poll_secs: float = 2.0, startup_timeout: float = 600.0) -> int:
    """Evaluate every checkpoint the chief writes until the job ends; returns an exit code."""
    import tensorflow as tf

    from kerastrain import _logging
    from kerastrain.cli import training
    from kerastrain.io import summaries

    _logging.ensure_visible()
    config = cluster.read_tf_config()
    model_dir = recipe.trainer.model_dir
    if not model_dir:
        raise ValueError("An evaluator task evaluates the checkpoints in `trainer.model_dir`, "
                         "and the recipe sets none. Set trainer.model_dir (shared by the chief "
                         "and the evaluator).")
    jobs = config.cluster
    chief = (jobs.get("chief") or jobs.get("worker"))[0]
    # This task joins no cluster: it builds its model on its own devices.
    os.environ.pop("TF_CONFIG", None)
    local = dataclasses.replace(
        recipe, strategy={"name": "default"}, checkpoints=False, tensorboard=False,
        trainer=dataclasses.replace(recipe.trainer, model_dir=None, verbose=0))
    trainer = training.build_trainer(local)
    data_config = recipe.data.validation or recipe.data.train
    data = training.call_builder(data_config, recipe.data.batch_size, key="data.validation"
                                 if recipe.data.validation else "data.train")
    batch = training.numpy_batch_size(data, recipe.data.batch_size)
    trainer.build(data, batch_size=batch)
    model_dir = outputs.normalize_model_dir(model_dir)  # a URL as given, a local path absolute
    writer = tf.summary.create_file_writer(files.join(model_dir, "logs", "evaluator"))
    directory = files.join(model_dir, "checkpoints")
    logger.info("evaluator: watching %s until %s finishes", directory, chief)
    evaluated = 0
    for path in tf.train.checkpoints_iterator(directory, min_interval_secs=0, timeout=poll_secs,
                                              timeout_fn=_ChiefWatch(chief, startup_timeout)):
        try:
            step = trainer.load_checkpoint(path)
        except (tf.errors.OpError, ValueError) as e:  # rotated away or half-written
            logger.warning("evaluator: skipped %s (%s)", path, type(e).__name__)
            continue
        logs = trainer.evaluate(data, steps=recipe.trainer.validation_steps, batch_size=batch)
        with writer.as_default(step=step):
            for name, value in summaries.scalars(logs).items():
                tf.summary.scalar(f"eval_{name}", value)
        writer.flush()
        evaluated += 1
        logger.info("evaluator: step %d: %s", step,
                    ", ".join(f"{k} {v:.4g}" for k, v in summaries.scalars(logs).items()))
    logger.info("evaluator: the chief has finished; evaluated %d checkpoint(s)", evaluated)
    return 0
