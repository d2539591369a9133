"""Subprocess entry: train models with their own train_step under ps, save logs and weights.

Usage: python tests/_own_step_worker.py JOBS_JSON OUT_PREFIX
JOBS_JSON maps a name to a job; the jobs run one after another in this process (TensorFlow
started once, one local cluster: they must ask for the same cluster size), each writing
OUT_PREFIX + name + ".json".
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


def train(name, job):
    import kerastrain as kt  # the strategy must be built before any TF op runs

    import _own_step_models as models

    def dataset():
        return models.dataset().repeat() if job.get("repeat") else models.dataset()

    trainer = kt.Trainer(models.BUILDERS[job["model"]], dataset, strategy=job["strategy"],
                         verbose=0, steps_per_loop=job.get("steps_per_loop", 2))
    history = trainer.fit(epochs=job["epochs"], steps_per_epoch=job.get("steps"))
    with open(sys.argv[2] + name + ".json", "w") as f:
        json.dump({"history": history.history, "global_step": trainer.global_step,
                   "weights": [w.tolist() for w in trainer.model.get_weights()]}, f)


def main():
    for name, job in json.loads(sys.argv[1]).items():
        train(name, job)


if __name__ == "__main__":
    main()
