"""Subprocess entry for tf.data service tests: train through the service, count the ids trained.

Usage: python tests/_service_worker.py JOB_JSON OUT_PATH

`JOB_JSON` may list `runs`: overrides of the job, each trained in turn in this process.

A layer of the model adds a histogram of each training batch's ids to a non-trainable
variable (TensorFlow's own `assign_add` on `.value`, aggregation "sum"), read at every
epoch end: the difference is what that epoch trained on.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import _visits_worker  # noqa: E402
from _visits_worker import arrays  # noqa: E402,F401  (ids in column 0)


def build_model(n):
    """The visits tests' id counter; its counts summed across replicas (mirrored)."""
    return _visits_worker.build_model(n, aggregation="sum")


def train(job, trainer_options=None):
    """Train as `job` says; returns (per-epoch id counts, global step)."""
    import keras
    import numpy as np

    import kerastrain as kt

    n, batch = job["n"], job["batch"]
    trainer = kt.Trainer(build_model(n), strategy=job["strategy"], seed=0, verbose=0,
                         steps_per_loop=job.get("steps_per_loop", 4),
                         data_service=job["service"], **(trainer_options or {}))
    layer = trainer.model.get_layer("count_ids")
    before, per_epoch = [np.zeros(n)], []

    def on_epoch_end(epoch, logs=None):
        now = np.asarray(layer.counts.numpy(), np.float64)
        per_epoch.append((now - before[0]).astype(int).tolist())
        before[0] = now
    callbacks = [keras.callbacks.LambdaCallback(on_epoch_end=on_epoch_end)]
    if job.get("sleep_per_loop"):
        def slow(b, logs=None):
            if job.get("marker") and b == 2:
                open(job["marker"], "w").close()
            time.sleep(job["sleep_per_loop"])
        callbacks.append(keras.callbacks.LambdaCallback(on_train_batch_end=slow))
    # `fit_per_epoch`: one fit call per epoch, as a Keras user's loop of fit(epochs=1) does.
    for epochs in ([1] * job["epochs"] if job.get("fit_per_epoch") else [job["epochs"]]):
        trainer.fit(arrays(n), batch_size=batch, epochs=epochs, callbacks=callbacks,
                    steps_per_epoch=job.get("steps_per_epoch"))
    step = trainer.global_step
    trainer.close()
    return per_epoch, step


def main():
    job = json.loads(sys.argv[1])
    import kerastrain as kt
    if job.get("cpu_devices"):
        kt.configure_cpu_devices(job["cpu_devices"])
    results = []
    for overrides in job.get("runs", [{}]):  # several trainings in one process (one import)
        per_epoch, step = train({**job, **overrides})
        results.append({"per_epoch": per_epoch, "global_step": step})
    with open(sys.argv[2], "w") as f:
        json.dump(results[0] if "runs" not in job else {"runs": results}, f)


if __name__ == "__main__":
    main()
