"""Subprocess entry for visitation tests: count how often each example id is trained on.

Usage: python tests/_visits_worker.py JOB_JSON OUT_PREFIX

The model carries a layer that adds a histogram of each training batch's ids to a
non-trainable variable (TensorFlow's own `assign_add` on `.value`, so the add
happens once, where the variable lives, whichever worker runs the step). A callback
reads it at every epoch end; the difference is what that epoch trained on.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

FEATURES = 3


def build_model(n, own_step=False, accumulation=None, aggregation="none",
                steps_per_execution=1):
    """The counting model; `own_step`: a subclass with its own `train_step` (kerastrain's
    `ModelStep`); `accumulation`: SGD with `gradient_accumulation_steps`; `aggregation` of
    the counts (`"sum"` under mirrored: each replica adds its own ids); `steps_per_execution`:
    how many batches apart batch hooks run, as Keras calls them."""
    import keras
    import tensorflow as tf

    class OwnStep(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables),
                                 self.trainable_variables)
            return {"loss": loss}

    class CountIds(keras.layers.Layer):
        def build(self, shape):
            self.counts = self.add_weight(shape=(n,), initializer="zeros", trainable=False,
                                          name="counts", aggregation=aggregation)

        def call(self, x, training=None):
            if training:
                ids = tf.cast(x[:, 0], tf.int32)
                self.counts.value.assign_add(
                    tf.cast(tf.math.bincount(ids, minlength=n, maxlength=n), tf.float32))
            return x[:, 1:]

    def make():
        inputs = keras.Input((1 + FEATURES,))
        hidden = CountIds(name="count_ids")(inputs)
        model = (OwnStep if own_step else keras.Model)(inputs, keras.layers.Dense(1)(hidden))
        model.compile(optimizer=keras.optimizers.SGD(gradient_accumulation_steps=accumulation),
                      loss="mse", steps_per_execution=steps_per_execution)
        return model
    return make


def arrays(n):
    import numpy as np
    rng = np.random.RandomState(0)
    x = np.concatenate([np.arange(n, dtype="float32")[:, None],
                        rng.randn(n, FEATURES).astype("float32")], axis=1)
    return x, x[:, 1:2].copy()


def context_fn(n, batch):
    """dataset_fn(ctx): pipeline i holds ids i, i+P, ..., shuffled (seeded), batched."""
    def dataset_fn(ctx):
        import tensorflow as tf
        x, y = arrays(n)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(ctx.num_input_pipelines,
                                                               ctx.input_pipeline_id)
        return ds.shuffle(n, seed=1).batch(batch)
    return dataset_fn


def global_data(n, batch, form):
    """Global batches (a seeded shuffle): a tf.data.Dataset, or a function returning one;
    "unknown": of a size TensorFlow cannot tell (filtered)."""
    def make():
        import tensorflow as tf
        x, y = arrays(n)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=2)
        if form == "unknown":
            ds = ds.filter(lambda a, b: True)
        return ds.batch(batch)
    return make() if form == "dataset" else make


def infinite_fn(n, batch):
    def dataset_fn(ctx):
        return context_fn(n, batch)(ctx).repeat()
    return dataset_fn


def main():
    job = json.loads(sys.argv[1])
    out = sys.argv[2]
    import keras
    import numpy as np

    import kerastrain as kt

    n = job.get("n", 512)
    results = []
    for case in job["cases"]:
        started = time.monotonic()
        # A batch hook that sleeps (below) runs once a loop, as it did before batch hooks
        # followed `steps_per_execution` (one step a loop under ps made the run 2x longer).
        model = build_model(n, own_step=case.get("own_step", False),
                            accumulation=case.get("accumulation"),
                            steps_per_execution=case["steps_per_loop"]
                            if case.get("sleep_per_loop") else 1)
        trainer = kt.Trainer(model, strategy={"name": "ps", "num_workers": 2, "num_ps": 1,
                                              **case.get("strategy", {})},
                             seed=0, verbose=0, steps_per_loop=case["steps_per_loop"],
                             model_dir=case.get("model_dir"), shard=case.get("shard", "auto"))
        layer = trainer.model.get_layer("count_ids")
        before = [np.zeros(n)]
        per_epoch = []

        def on_epoch_end(epoch, logs=None):
            now = np.asarray(layer.counts.numpy(), np.float64)
            per_epoch.append((now - before[0]).astype(int).tolist())
            before[0] = now
        callback = keras.callbacks.LambdaCallback(on_epoch_end=on_epoch_end)
        batch = case.get("batch", 16)
        callbacks = [callback]
        if case.get("started_marker"):
            marker = case["started_marker"]
            at = case.get("marker_epoch", 0)
            callbacks.append(keras.callbacks.LambdaCallback(
                on_epoch_begin=lambda epoch, logs=None: epoch == at and open(marker, "w").close()))
        if case.get("sleep_per_loop"):
            # A slower coordinator, a longer run: a sleep every `steps_per_loop` batches.
            callbacks.append(keras.callbacks.LambdaCallback(
                on_train_batch_end=lambda b, logs=None: time.sleep(case["sleep_per_loop"])))
        form = case["form"]
        if form == "numpy":
            x, y = arrays(n)
            data = dict(x=x, y=y, batch_size=batch)
        elif form in ("dataset", "global_fn", "unknown"):
            data = dict(x=global_data(n, batch, form))
        elif form == "infinite":
            data = dict(x=infinite_fn(n, batch))
        else:
            data = dict(x=context_fn(n, batch))
        # "fit_per_epoch": one fit call per epoch (`initial_epoch`), as Keras users loop.
        for first, last in ([(e, e + 1) for e in range(case["epochs"])]
                            if case.get("fit_per_epoch") else [(0, case["epochs"])]):
            trainer.fit(**data, epochs=last, initial_epoch=first,
                        steps_per_epoch=case["steps_per_epoch"], callbacks=callbacks)
        # How often a scheduled loop was traced: loops cut short at a boundary carry fewer
        # positions, and a trace per length cost 0.6 s a loop on a real model.
        readers = [i._reader for _, i in trainer._inputs.inputs.values() if getattr(i, "_reader", None)]
        traces = max([f.experimental_get_tracing_count() for r in readers
                      for f in r._loops.values()] or [0])
        results.append({"case": case, "per_epoch": per_epoch, "global_step": trainer.global_step,
                        "traces": traces,
                        "seconds": round(time.monotonic() - started, 2),
                        "total": np.asarray(layer.counts.numpy()).astype(int).tolist()})
    with open(out + ".json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
