"""Lookup tables under parameter servers (a local in-process cluster): writes a JSON report.

Usage: python tests/_lookup_worker.py OUT_JSON
"""

import json
import sys


def main():
    import kerastrain as kt
    import keras
    import numpy as np
    import tensorflow as tf

    words = np.array(["a", "b", "c", "d"] * 16)[:, None]
    labels = (np.arange(64) % 2).astype("float32")[:, None]
    ps = {"name": "ps", "num_workers": 1, "num_ps": 1, "network": "host"}

    # Everything made before the first Trainer connects this process to the cluster.
    adapted = keras.layers.StringLookup()
    adapted.adapt(words.ravel())
    vocabulary = adapted.get_vocabulary(include_special_tokens=False)

    def tower(lookup):
        inputs = keras.Input((1,), dtype="string")
        x = keras.layers.Flatten()(keras.layers.Embedding(8, 4)(lookup(inputs)))
        model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))
        model.compile(optimizer="adam", loss="binary_crossentropy")
        return model

    keras.utils.set_random_seed(0)
    instance = tower(adapted)  # an adapted instance, built the ordinary way
    stale = keras.layers.StringLookup(vocabulary=vocabulary)  # made outside, used by a builder
    report = {}

    trainer = kt.Trainer(instance, strategy=ps, verbose=0, seed=0)
    report["instance_loss"] = trainer.fit(words, labels, batch_size=16, epochs=2).history["loss"]
    report["instance_eval"] = trainer.evaluate((words, labels), batch_size=16)["loss"]
    # The user's own object after the fit, as after `model.fit`: its lookup table was made
    # before the cluster connected ("unknown device" until kerastrain made it again).
    expected = trainer.predict(words, batch_size=16)
    strings = tf.constant(words)  # Keras's own fit and predict take no NumPy strings
    report["predict_gap"] = float(np.abs(instance.predict(strings, batch_size=16, verbose=0)
                                         - expected).max())
    report["call_gap"] = float(np.abs(np.asarray(instance(strings[:4])) - expected[:4]).max())
    report["user_eval"] = instance.evaluate(strings, labels, batch_size=16, verbose=0)
    report["user_fit"] = instance.fit(strings, labels, batch_size=16, epochs=1,
                                      verbose=0).history["loss"]
    adapted.adapt(words.ravel())  # its adapt state was made before the connection too
    report["vocabulary"] = [vocabulary, adapted.get_vocabulary(include_special_tokens=False)]

    built = kt.Trainer(lambda: tower(keras.layers.StringLookup(vocabulary=vocabulary)),
                       strategy=ps, verbose=0, seed=0)
    built.fit(words, labels, batch_size=16, epochs=1, validation_data=(words, labels))
    report["builder_eval"] = built.evaluate((words, labels), batch_size=16)["loss"]

    try:
        kt.Trainer(lambda: tower(stale), strategy=ps, verbose=0).fit(
            words, labels, batch_size=16, epochs=1)
        report["stale"] = "trained"
    except ValueError as e:
        report["stale"] = str(e)
    with open(sys.argv[1], "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
