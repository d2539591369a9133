"""Partitioned variables on a local PS cluster (1 worker, 2 ps), compared with one device.

Usage: python tests/_partition_worker.py OUT_DIR
Writes OUT_DIR/result.json with what tests/distribute/ps/test_partitioning.py asserts. One process
(TensorFlow imported once, one in-process cluster) runs every Trainer in turn.
"""

import json
import logging
import os
import sys

import numpy as np

import kerastrain as kt

ROWS, DIM, IDS, BATCH, STEPS = 100_000, 32, 4, 64, 12
SPLIT = {"name": "min_size", "min_shard_bytes": 256 << 10, "max_shards": 2}
OUT = sys.argv[1]


def build_model():
    import keras
    model = keras.Sequential([
        keras.Input((IDS,), dtype="int32"),
        keras.layers.Embedding(ROWS, DIM, name="table"),
        keras.layers.Flatten(),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def arrays():
    rng = np.random.default_rng(0)
    x = rng.integers(0, ROWS, (BATCH * STEPS, IDS)).astype("int32")
    y = ((x[:, :1] % 7) / 7.0).astype("float32")
    return x, y


def dataset_fn(ctx=None):
    import tensorflow as tf
    return tf.data.Dataset.from_tensor_slices(arrays()).batch(BATCH)


def ps(split, **kwargs):
    options = {"name": "ps", "num_workers": 1, "num_ps": 2}
    if split is not None:
        options["variable_partitioner"] = split
    return kt.Trainer(build_model, dataset_fn, strategy=options, seed=1, verbose=0, **kwargs)


def state(trainer):
    """Every model and optimizer variable as a whole array, keyed by its position."""
    import tensorflow as tf
    model = trainer.model
    values = [np.asarray(tf.convert_to_tensor(v.value)) for v in model.weights]
    values += [np.asarray(tf.convert_to_tensor(v.value)) for v in model.optimizer.variables]
    return values


def max_diff(a, b):
    return max(float(np.abs(x.astype("float64") - y.astype("float64")).max()) for x, y in zip(a, b))


def shards(trainer):
    from kerastrain.distribute.ps import partitioning
    table = trainer.model.get_layer("table").embeddings
    parts = partitioning.shards_of(table) or [table.value]
    return [{"rows": int(p.shape[0]), "device": p.device} for p in parts]


def resumed(trainer):
    """Restore the trainer's checkpoint (a resumed fit with nothing left to train)."""
    trainer.fit(epochs=1, steps_per_epoch=STEPS)
    return trainer


def main():
    import keras
    import tensorflow as tf

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    result = {}
    x, y = arrays()

    # 1. Train with the table split over both ps tasks; one device runs the same steps.
    run = os.path.join(OUT, "run")
    trainer = ps(SPLIT, model_dir=run)
    before = trainer.evaluate()["loss"]
    trainer.fit(epochs=1, steps_per_epoch=STEPS)
    result["loss_before"], result["loss_after"] = before, trainer.evaluate()["loss"]
    result["shards"] = shards(trainer)
    slot = trainer.model.optimizer.variables[2]  # the table's first Adam slot
    from kerastrain.distribute.ps import partitioning
    result["slot_devices"] = [p.device for p in partitioning.shards_of(slot) or []]
    trained = state(trainer)
    one = kt.Trainer(build_model, dataset_fn, strategy="one_device", seed=1, verbose=0)
    one.fit(epochs=1, steps_per_epoch=STEPS)
    result["vs_one_device"] = max_diff(trained, state(one))

    # 2. The checkpoint restores into 3 shards, 1 shard (no partitioner), one device.
    checkpoint = os.path.join(run, "checkpoints", f"ckpt-{STEPS}")
    result["restored"] = {}
    for name, make in [
            ("3 shards", lambda **kw: ps({"name": "fixed_shards", "num_shards": 3}, **kw)),
            ("1 shard", lambda **kw: ps(None, **kw)),
            ("one device", lambda **kw: kt.Trainer(build_model, dataset_fn, strategy="one_device",
                                                   seed=7, verbose=0, **kw))]:
        other = resumed(make(checkpoint={"restore": checkpoint}))
        result["restored"][name] = {"diff": max_diff(trained, state(other)),
                                    "shards": len(shards(other)), "step": other.global_step}
        if name == "3 shards":
            # Training goes on from 3 shards exactly as from one device.
            other.fit(epochs=2, steps_per_epoch=STEPS)
            three = state(other)
    again = resumed(kt.Trainer(build_model, dataset_fn, strategy="one_device", seed=7, verbose=0,
                               checkpoint={"restore": checkpoint}))
    again.fit(epochs=2, steps_per_epoch=STEPS)
    result["continued_3_shards_vs_one_device"] = max_diff(three, state(again))

    # 3. The export has whole variables and predicts what the trained model predicts.
    exported = keras.models.load_model(os.path.join(run, "export", "model.keras"))
    served = tf.saved_model.load(os.path.join(run, "export", "saved_model"))
    expected = trainer.model(x[:BATCH]).numpy()
    result["export_keras_diff"] = float(np.abs(exported.predict(x[:BATCH], verbose=0)
                                               - expected).max())
    result["export_serve_diff"] = float(np.abs(served.serve(x[:BATCH]).numpy() - expected).max())
    result["export_whole"] = all(partitioning.shards_of(v) is None for v in exported.weights)

    # 4. Layers that cannot use a partitioned variable say which and what to do.
    errors = {}

    def constrained():
        model = keras.Sequential([
            keras.Input((IDS,), dtype="int32"),
            keras.layers.Embedding(ROWS, DIM, name="normed", embeddings_constraint="max_norm"),
            keras.layers.Flatten(), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        return model

    class Handle(keras.layers.Layer):
        """Reads its table through the raw resource handle, as some custom ops do."""

        def build(self, shape):
            self.table = self.add_weight(shape=(ROWS, DIM), name="raw_table")

        def call(self, ids):
            rows = tf.raw_ops.ResourceGather(resource=self.table.value.handle, indices=ids,
                                             dtype=self.table.dtype)
            return tf.reduce_sum(rows, axis=1)

    def handle_model():
        model = keras.Sequential([keras.Input((IDS,), dtype="int32"), Handle(name="raw"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        return model

    def small(optimizer):
        def build():
            model = keras.Sequential([keras.Input((IDS,), dtype="int32"),
                                      keras.layers.Embedding(ROWS, 8),
                                      keras.layers.Flatten(), keras.layers.Dense(1)])
            model.compile(optimizer=optimizer(), loss="mse")
            return model
        return build

    cases = [("constraint", constrained), ("handle", handle_model),
             ("lamb", small(lambda: keras.optimizers.Lamb(0.01))),
             ("clipnorm", small(lambda: keras.optimizers.Adam(0.01, clipnorm=1.0)))]
    for name, builder in cases:
        try:
            kt.Trainer(builder, dataset_fn, seed=1, verbose=0, strategy={
                "name": "ps", "num_workers": 1, "num_ps": 2, "variable_partitioner": SPLIT,
            }).fit(epochs=1, steps_per_epoch=2)
            errors[name] = None
        except Exception as e:  # the test checks the type and the message
            errors[name] = f"{type(e).__name__}: {e}"
    result["errors"] = errors

    # 5. Optimizers whose update is element by element: per shard equals whole, exactly.
    from kerastrain import optimizers as lazy
    optimizers = {
        "SGD": lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
        "Adam": lambda: keras.optimizers.Adam(0.01, amsgrad=True, global_clipnorm=0.5),
        "AdamW": lambda: keras.optimizers.AdamW(0.01),
        "RMSprop": lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True),
        "Adagrad": lambda: keras.optimizers.Adagrad(0.1),
        "Adamax": lambda: keras.optimizers.Adamax(0.01),
        "Adadelta": lambda: keras.optimizers.Adadelta(1.0),
        "Lion": lambda: keras.optimizers.Lion(0.01),
        "Ftrl": lambda: keras.optimizers.Ftrl(0.1),
        # Row by row (issue 17): each shard's touched rows, updated on its own ps.
        "LazyAdam": lambda: lazy.LazyAdam(0.01, amsgrad=True, global_clipnorm=0.5),
        "LazyAdamW": lambda: lazy.LazyAdamW(0.01, weight_decay=0.1),
        "LazyAdagrad": lambda: lazy.LazyAdagrad(0.1),
        "LazyLion": lambda: lazy.LazyLion(0.01),
    }
    result["optimizers"] = {}
    for name, optimizer in optimizers.items():
        both = []
        for strategy in ({"name": "ps", "num_workers": 1, "num_ps": 2,
                          "variable_partitioner": {"name": "fixed_shards", "num_shards": 2}},
                         "one_device"):
            t = kt.Trainer(small(optimizer), dataset_fn, strategy=strategy, seed=1, verbose=0)
            t.fit(epochs=1, steps_per_epoch=3)
            both.append(state(t))
        result["optimizers"][name] = max_diff(*both)

    with open(os.path.join(OUT, "result.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
