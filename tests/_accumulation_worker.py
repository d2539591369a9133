"""Subprocess entry for accumulation tests: train with k accumulated batches, save the weights.

Usage: python tests/_accumulation_worker.py JOB_JSON OUT_PREFIX
       python tests/_accumulation_worker.py '[[JOB, OUT_PREFIX], ...]'
The second form runs the jobs one after another in this process (TensorFlow started once;
under ps, one local cluster: they must ask for the same cluster size), each job's output
following a line `@@ job INDEX`.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import helpers  # noqa: E402


def main():
    helpers.run_jobs(run, sys.argv)


def run(job, out):
    import kerastrain as kt  # the strategy must be built before any TF op runs

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "step"))
    import test_accumulation as cases

    x, y = cases.data(job["n"])
    resume = {"model_dir": job["model_dir"], "checkpoint": {"every_steps": 1}} \
        if "model_dir" in job else {}
    if "model_dir" in job:
        helpers.as_interrupted(job["model_dir"])  # the chain's legs stop to resume elsewhere
    model = cases.builder(job["k"])
    if job.get("instance"):  # the user's own object, trained by model.fit first
        model = model()
        model.fit(x, y, batch_size=job["batch"], epochs=1, shuffle=False, verbose=0)
    trainer = kt.Trainer(model, strategy=job["strategy"], verbose=0,
                         steps_per_loop=job.get("steps_per_loop", "auto"), **resume)
    callbacks = [cases.StopAfter(job["stop_after"])] if "stop_after" in job else []
    history = trainer.fit(x, y, batch_size=job["batch"], epochs=job["epochs"], shuffle=False,
                          callbacks=callbacks)
    result = {"history": history.history, "global_step": trainer.global_step,
              "iterations": int(trainer.model.optimizer.iterations),
              "weights": [w.tolist() for w in trainer.model.get_weights()]}
    if job.get("instance"):  # what the object holds after the Trainer, and then model.fit
        result["user_optimizer"] = [v.numpy().tolist() for v in model.optimizer.variables]
        model.fit(x, y, batch_size=job["batch"], epochs=1, shuffle=False, verbose=0)
        result["user_weights_after_fit"] = [w.tolist() for w in model.get_weights()]
    with open(out + ".json", "w") as f:
        json.dump(result, f)
    trainer.close()  # the next job's Trainer starts as in a new process


if __name__ == "__main__":
    main()
