"""Small real workloads used by the quick start, the docs and the benchmarks."""

from __future__ import annotations

import numpy as np


def synthetic_binary(num_examples: int = 65536, features: int = 64, seed: int = 0,
                     task_seed: int = 1234):
    """A learnable binary task: the label is the sign of a fixed random projection.

    `task_seed` fixes the projection (the task); `seed` draws the examples, so a
    validation set from another `seed` is new data of the same task.
    """
    w = np.random.RandomState(task_seed).randn(features).astype("float32")
    rng = np.random.RandomState(seed)
    x = rng.randn(num_examples, features).astype("float32")
    y = (x @ w + 0.5 * rng.randn(num_examples) > 0).astype("float32")[:, None]
    return x, y


def build_mlp(features: int = 64, hidden: int = 256, learning_rate: float = 1e-3):
    """Dense(hidden, relu) -> Dense(hidden, relu) -> Dense(1) logits, Adam, binary cross-entropy."""
    import keras
    model = keras.Sequential([
        keras.Input((features,)),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(1),
    ])
    return _compile_binary(model, learning_rate)


def _compile_binary(model, learning_rate):
    """Adam and binary cross-entropy on logits, with accuracy at logit 0."""
    import keras
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=[keras.metrics.BinaryAccuracy(threshold=0.0, name="accuracy")])
    return model


def synthetic_dataset_fn(num_examples: int = 65536, features: int = 64, global_batch: int = 256,
                         seed: int = 0, shuffle: bool = True, repeat: bool = False):
    """A `dataset_fn(ctx)` over `synthetic_binary`, sharded per input pipeline.

    Each pass draws a new permutation of this pipeline's example indices and
    gathers whole batches from memory: tf.data then does per-batch, not
    per-example, work, which matters when two cores also run the model.
    """
    x, y = synthetic_binary(num_examples, features, seed)

    def dataset_fn(ctx):
        import tensorflow as tf
        batch = ctx.get_per_replica_batch_size(global_batch)
        xs, ys = tf.constant(x), tf.constant(y)
        mine = tf.range(ctx.input_pipeline_id, num_examples, ctx.num_input_pipelines, tf.int64)
        batches = -(-len(range(ctx.input_pipeline_id, num_examples, ctx.num_input_pipelines))
                    // batch)

        def one_pass(pass_seed):
            order = tf.random.experimental.stateless_shuffle(
                mine, seed=tf.stack([tf.constant(seed, tf.int64), pass_seed])) if shuffle else mine

            def gather(i):
                idx = order[i * batch:(i + 1) * batch]
                return tf.gather(xs, idx), tf.gather(ys, idx)
            return tf.data.Dataset.range(batches).map(gather)

        # A new seed, hence a new order, every time the dataset is iterated (each epoch).
        seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
        if repeat:
            ds = seeds.flat_map(one_pass)
        else:
            ds = seeds.take(1).flat_map(one_pass).apply(
                tf.data.experimental.assert_cardinality(batches))
        # One gather per batch needs one thread. tf.data's default pool and autotuning
        # start more, and on a two-core host they pre-empt the model's matmul
        # threads: measured 0.80x -> 1.03x of a bare in-memory loop with this setting.
        options = tf.data.Options()
        options.threading.private_threadpool_size = 1
        options.autotune.enabled = False
        return ds.prefetch(2).with_options(options)
    return dataset_fn


def write_tfrecords(directory, x, y, num_files: int = 8, prefix: str = "part"):
    """Write `(x, y)` as `num_files` TFRecord files of `tf.train.Example`s; return their paths.

    Each example holds `x` (float list), `y` (float list) and `id` (its row
    index), so a reader can tell exactly which examples it saw. Rows go to files
    in contiguous, nearly equal runs. Existing files of the same names are an
    error: nothing is overwritten.
    """
    import os

    import tensorflow as tf

    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, f"{prefix}-{k:05d}-of-{num_files:05d}.tfrecord")
             for k in range(num_files)]
    existing = [p for p in paths if os.path.exists(p)]
    if existing:
        raise FileExistsError(f"TFRecord files already exist, not overwriting: {existing[:3]}")
    bounds = np.linspace(0, len(x), num_files + 1).astype(int)
    for path, start, stop in zip(paths, bounds[:-1], bounds[1:]):
        tmp = f"{path}.tmp-{os.getpid()}"
        with tf.io.TFRecordWriter(tmp) as writer:
            for i in range(start, stop):
                feature = {
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=x[i].ravel())),
                    "y": tf.train.Feature(float_list=tf.train.FloatList(value=y[i].ravel())),
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                }
                writer.write(tf.train.Example(
                    features=tf.train.Features(feature=feature)).SerializeToString())
        os.replace(tmp, path)
    return paths


def example_parser(features: int = 64, targets: int = 1, with_ids: bool = False):
    """A `parse_fn` for a batch of records written by `write_tfrecords`: `(x, y)` batches.

    With `with_ids`, batches are `(x, y, ids)`; `ids` is not a sample weight,
    so use it only to inspect data, not to train.
    """
    import tensorflow as tf

    spec = {"x": tf.io.FixedLenFeature([features], tf.float32),
            "y": tf.io.FixedLenFeature([targets], tf.float32)}
    if with_ids:
        spec["id"] = tf.io.FixedLenFeature([], tf.int64)

    def parse(records):
        parsed = tf.io.parse_example(records, spec)
        if with_ids:
            return parsed["x"], parsed["y"], parsed["id"]
        return parsed["x"], parsed["y"]
    return parse


# -- builders named in recipes (recipes/*.yaml) ------------------------------------------

def synthetic_data(num_examples: int = 65536, features: int = 64, seed: int = 0):
    """`synthetic_binary` as NumPy arrays `(x, y)`, the form recipes pass to `fit`."""
    return synthetic_binary(num_examples, features, seed)


def digits(split: str = "train", validation_fraction: float = 0.25, seed: int = 0):
    """The 8x8 handwritten digits that scikit-learn ships (1,797 images, no download).

    Returns `(x, y)`: 64 pixel intensities scaled to [0, 1], integer labels 0-9.
    The split is stratified and fixed by `seed`.
    """
    if split not in ("train", "validation"):
        raise ValueError(f"`split` must be 'train' or 'validation'. Received: split={split!r}")
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("The digits data comes with scikit-learn: "
                          "pip install 'kerastrain[digits]' (or scikit-learn)") from None
    data = load_digits()
    x = (data.data / 16.0).astype("float32")
    y = data.target.astype("int32")
    rng = np.random.RandomState(seed)
    validation = np.zeros(len(y), bool)
    for label in np.unique(y):
        members = np.flatnonzero(y == label)
        chosen = rng.choice(members, int(round(len(members) * validation_fraction)), replace=False)
        validation[chosen] = True
    keep = validation if split == "validation" else ~validation
    return x[keep], y[keep]


def synthetic_interactions(num_examples: int = 65536, items: int = 100_000,
                           ids_per_example: int = 8, seed: int = 0, task_seed: int = 1234):
    """A click-style task over a large item vocabulary: `(ids int32 [n, k], y float32 [n, 1])`.

    Every item has a hidden score (fixed by `task_seed`); an example is `k` items drawn
    with Zipf-like popularity (a few items are frequent, most are rare, as in real
    logs), labelled 1 when their mean score plus noise is positive. Learning it
    means learning one embedding row per item, so it exercises large tables.
    """
    scores = np.random.RandomState(task_seed).randn(items).astype("float32")
    rng = np.random.RandomState(seed)
    ids = ((rng.zipf(1.3, size=(num_examples, ids_per_example)) - 1) % items).astype("int32")
    noise = 0.3 * rng.randn(num_examples).astype("float32")
    y = (scores[ids].mean(axis=1) + noise > 0).astype("float32")[:, None]
    return ids, y


def build_ranker(items: int = 100_000, dim: int = 32, ids_per_example: int = 8,
                 hidden: int = 64, learning_rate: float = 1e-3):
    """Embedding(items, dim) -> mean over the ids -> Dense(hidden, relu) -> Dense(1) logits.

    The item table is the model's bulk (`items * dim` floats); under `ps` with a
    `variable_partitioner` it is split over the parameter servers.
    """
    import keras
    model = keras.Sequential([
        keras.Input((ids_per_example,), dtype="int32"),
        keras.layers.Embedding(items, dim, name="items"),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(1),
    ])
    return _compile_binary(model, learning_rate)


def build_classifier(features: int = 64, classes: int = 10, hidden: int = 128,
                     dropout: float = 0.0, learning_rate: float = 1e-3):
    """Dense(hidden, relu) [-> Dropout] -> Dense(classes) logits; Adam; sparse cross-entropy."""
    import keras
    layers = [keras.Input((features,)), keras.layers.Dense(hidden, activation="relu")]
    if dropout:
        layers.append(keras.layers.Dropout(dropout))
    layers.append(keras.layers.Dense(classes))
    model = keras.Sequential(layers)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def tfrecord_data(directory: str, num_files: int = 8, num_examples: int = 65536,
                  features: int = 64, seed: int = 0, batch_size: int = 256,
                  wait_secs: float = 300.0):
    """Synthetic data as TFRecord files, written on first use; returns a function of global batches.

    The chief task writes the files (and a `_COMPLETE` marker last); other tasks
    wait for the marker, so workers starting together never read a half-written set.
    Existing complete files are used as they are.
    """
    import glob
    import os
    import time

    from kerastrain.data import record_files as data
    from kerastrain.distribute import cluster
    from kerastrain.io import outputs

    marker = os.path.join(directory, "_COMPLETE")
    if not os.path.exists(marker):
        if outputs.Outputs(directory, cluster.this_task_is_chief()).enabled:  # the chief rule
            if glob.glob(os.path.join(directory, "*.tfrecord")):
                raise FileExistsError(
                    f"{directory} holds TFRecord files but no _COMPLETE marker (an interrupted "
                    "write?). Remove the directory, or point `directory` elsewhere.")
            x, y = synthetic_binary(num_examples, features, seed)
            write_tfrecords(directory, x, y, num_files=num_files)
            with open(marker, "w") as f:
                f.write(f"{num_files} files, {num_examples} examples, {features} features\n")
        else:
            deadline = time.monotonic() + wait_secs
            while not os.path.exists(marker):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"The chief did not finish writing {directory} within "
                                       f"{wait_secs:.0f} s (no _COMPLETE marker).")
                time.sleep(0.5)
    parse = example_parser(features, 1)
    pattern = os.path.join(directory, "*.tfrecord")
    return lambda: data.files(pattern, parse, batch_size=batch_size, seed=seed)
