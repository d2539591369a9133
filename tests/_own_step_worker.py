"""Subprocess entry: train a model with its own train_step under ps, save logs and weights.

Usage: python tests/_own_step_worker.py JOB_JSON OUT_PREFIX
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


def main():
    job = json.loads(sys.argv[1])
    import kerastrain as kt  # the strategy must be built before any TF op runs

    import _own_step_models as models

    def dataset():
        return models.dataset().repeat() if job.get("repeat") else models.dataset()

    trainer = kt.Trainer(models.BUILDERS[job["model"]], dataset, strategy=job["strategy"],
                         verbose=0, steps_per_loop=job.get("steps_per_loop", 2))
    history = trainer.fit(epochs=job["epochs"], steps_per_epoch=job.get("steps"))
    with open(sys.argv[2] + ".json", "w") as f:
        json.dump({"history": history.history, "global_step": trainer.global_step,
                   "weights": [w.tolist() for w in trainer.model.get_weights()]}, f)


if __name__ == "__main__":
    main()
