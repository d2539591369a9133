"""The gallery (tests/gallery.py) under parameter servers, in one local in-process cluster.

Usage: python tests/_gallery_ps_worker.py OUT_JSON [NUM_WORKERS]
Writes {example: {"loss": [...]} or {"error": message, "type": class name}}; for the
examples in PREDICT also "predict_rel": the largest relative difference of `Trainer.predict`
(run by the coordinator, reading the ps) from `model.predict` of a local copy of the weights.
"""

import json
import os
import sys
import tempfile

PREDICT = ("multi_io_dict", "string_lookup", "custom_layer_add_loss")


def predict_difference(example, trainer, directory):
    import numpy as np
    import tensorflow as tf
    x = example.fit_args(directory)["x"]
    numpy = not isinstance(x, tf.data.Dataset)
    batch = {"batch_size": 10} if numpy else {}  # 48 examples: a last batch of 8
    ours = trainer.predict(x, **batch)
    reference = example.build()
    reference.set_weights(trainer.model.get_weights())
    theirs = reference.predict(x if numpy else example.fit_args(directory)["x"], verbose=0,
                               **batch)
    diffs = tf.nest.map_structure(
        lambda a, b: float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-6)))
        if a.shape == b.shape else float("inf"), ours, theirs)
    return max(tf.nest.flatten(diffs))


def make_trainer(example, ps):
    """A Trainer of the example's model instance, as keras.io code has one, or of its builder
    where a Trainer option changes the build or Keras cannot clone the instance (said in the
    error, which the report keeps): (trainer, the instance or None)."""
    import kerastrain as kt
    from kerastrain.step import models
    if not example.trainer_kwargs:
        user_model = example.build()
        try:
            return kt.Trainer(user_model, strategy=ps, verbose=0, seed=0), user_model
        except models.NotClonable:
            pass
    return kt.Trainer(example.build, strategy=ps, verbose=0, seed=0,
                      **example.trainer_kwargs), None


def after_fit(user_model, trainer, directory):
    """The user's object after `trainer.fit`: its weights are the trained ones, and it saves."""
    import numpy as np
    same = all(np.array_equal(a, b) for a, b in zip(user_model.get_weights(),
                                                      trainer.model.get_weights()))
    path = os.path.join(directory, "user.keras")
    user_model.save(path)
    return {"weights_equal": bool(same), "saved_bytes": os.path.getsize(path)}


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gallery
    import kerastrain as kt

    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    ps = {"name": "ps", "num_workers": workers, "num_ps": 1, "network": "host"}
    report = {}
    for example in gallery.EXAMPLES:
        with tempfile.TemporaryDirectory() as directory:
            try:
                trainer, user_model = make_trainer(example, ps)
                history = trainer.fit(epochs=example.epochs, **example.fit_args(directory))
                report[example.name] = {
                    "loss": [float(v) for v in history.history[example.ps_key]]}
                if user_model is not None:
                    report[example.name]["user_model"] = after_fit(user_model, trainer, directory)
                if example.name in PREDICT:
                    report[example.name]["predict_rel"] = predict_difference(
                        example, trainer, directory)
            except Exception as e:  # noqa: BLE001 (reported, judged by the test)
                report[example.name] = {"error": str(e)[:2000], "type": type(e).__name__}
        print(example.name, report[example.name], flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
