"""Subprocess entry for the parameter-server recovery test: a poisoned batch on worker 0.

Usage: python tests/_recover_worker.py OUT_DIR
Writes OUT_DIR/result.json; the run's log is the process's stderr.
"""

import json
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import helpers  # noqa: E402

BATCHES, POISONED = 48, 2  # per worker; worker 0's batch 2 has NaN labels


def main():
    out = sys.argv[1]
    import kerastrain as kt  # the strategy must be built before any TF op runs
    import numpy as np
    import tensorflow as tf

    def dataset_fn(ctx):
        x, y = helpers.arrays(BATCHES * helpers.GLOBAL_BATCH, seed=ctx.input_pipeline_id)
        if ctx.input_pipeline_id == 0:
            y[POISONED * helpers.GLOBAL_BATCH:(POISONED + 1) * helpers.GLOBAL_BATCH] = np.nan
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(helpers.GLOBAL_BATCH)

    trainer = kt.Trainer(helpers.build_model, dataset_fn,
                         strategy={"name": "ps", "num_workers": 2, "num_ps": 1}, seed=0,
                         verbose=0, steps_per_loop=2, model_dir=f"{out}/run",
                         checkpoint={"every_steps": 4}, on_nonfinite="recover")
    history = trainer.fit(epochs=2, steps_per_epoch=12)
    weights = trainer.model.get_weights()
    with open(f"{out}/result.json", "w") as f:
        json.dump({"history": history.history, "global_step": trainer.global_step,
                   "recoveries": trainer.recoveries,
                   "weights_finite": all(bool(np.isfinite(w).all()) for w in weights)}, f)


if __name__ == "__main__":
    main()
