"""Subprocess: every gallery example under one local in-process ps cluster (2 workers, 1 ps).

Usage: python tests/_gallery_ps.py OUT.json. Writes, per example, the history and final loss,
or the error that refused it; for three examples, `Trainer.predict` against `model.predict`
of a local copy holding the trained weights.
"""

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

import kerastrain  # noqa: E402,F401  (before any TensorFlow op: the strategy comes first)

PS = {"name": "ps", "num_workers": 2, "num_ps": 1}
PREDICT = ("mlp", "multi_io", "lookup")


def predict_difference(example, trainer):
    """Largest relative difference of `Trainer.predict` (the coordinator) from `model.predict`
    of a local model holding the trained weights."""
    import numpy as np
    import tensorflow as tf
    x = example.data()["x"]
    numpy = isinstance(x, (np.ndarray, dict))
    batch = {"batch_size": 10} if numpy else {}  # 64 examples: a last batch of 4
    ours = trainer.predict(x, **batch)
    reference = example.build()
    reference.set_weights(trainer.model.get_weights())
    theirs = reference.predict(x if numpy else example.data()["x"], verbose=0, **batch)
    diffs = tf.nest.map_structure(
        lambda a, b: float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-6)))
        if a.shape == b.shape else float("inf"), ours, theirs)
    return max(tf.nest.flatten(diffs))


def main():
    import gallery
    report = {}
    directory = tempfile.mkdtemp(prefix="gallery-ps-")
    for name, example in gallery.EXAMPLES.items():
        started = time.perf_counter()
        try:
            history, trainer = gallery.run_kerastrain(example, os.path.join(directory, name), PS)
            entry = {"history": history, "final_loss": gallery._final(history),
                     "epochs": len(next(iter(history.values())))}
            if name in PREDICT:
                entry["predict_rel"] = predict_difference(example, trainer)
        except ValueError as e:
            entry = {"refused": str(e)}
        except Exception as e:  # reported, and the test says which example broke
            entry = {"error": f"{type(e).__name__}: {e}"[:2000]}
        entry["seconds"] = round(time.perf_counter() - started, 1)
        report[name] = entry
        print(name, json.dumps(entry)[:300], flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
