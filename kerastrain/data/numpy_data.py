"""NumPy input: arrays held in host variables, read by a tf.data pipeline of global batches."""

from __future__ import annotations

import functools

import keras
import numpy as np
import tensorflow as tf

from kerastrain._options import is_int
from kerastrain._tracing import unconverted
from kerastrain.data import pipelines as pipeline_lib


def keras_arrays(structure):
    """Arrays as Keras's array adapter hands them to a model (`array_slicing`, Keras
    3.15): lists become tuples (tf.data would stack a list `y = [y_a, y_b]`, a model's
    two targets, into one tensor) and floats other than Keras's floatx (NumPy's
    default float64) become floatx, so a step, a loss or a metric sees float32."""
    def one(leaf):
        array = np.asarray(leaf)
        if array.dtype.kind == "f" and array.dtype != np.dtype(keras.backend.floatx()):
            array = array.astype(keras.backend.floatx())
        return array
    return tf.nest.map_structure(one, _lists_to_tuples(structure))


def _lists_to_tuples(structure):
    if isinstance(structure, (list, tuple)) and not hasattr(structure, "_fields"):
        return tuple(_lists_to_tuples(item) for item in structure)
    if isinstance(structure, dict):
        return type(structure)((k, _lists_to_tuples(v)) for k, v in structure.items())
    return structure


class NumpyData:
    """NumPy arrays held in host variables, read by a tf.data pipeline of global batches.

    The arrays live in non-trainable variables on this task's CPU, not in the
    dataset graph, so a pipeline serialised for another worker stays small (the
    2 GB GraphDef limit of embedded constants). Each pass shuffles the example
    indices with the seed and gathers whole batches: the batches are those of
    `tf.data.Dataset.from_tensor_slices(arrays).shuffle(len(x), seed).batch(batch_size)`.
    """

    def __init__(self, arrays, batch_size, *, shuffle, seed, argument="dataset_fn"):
        if not is_int(batch_size, 1):
            raise ValueError(f"`batch_size` must be a positive int. Received: batch_size={batch_size!r}")
        structure = keras_arrays(tuple(arrays))
        lengths = {leaf.shape[0] if leaf.ndim else None for leaf in tf.nest.flatten(structure)}
        if None in lengths or len(lengths) != 1:
            raise ValueError(
                f"The arrays in `{argument}` must all have the same number of examples (first "
                f"dimension). Received shapes: "
                f"{tf.nest.map_structure(lambda a: list(a.shape), structure)}")
        self.num_examples = lengths.pop()
        if self.num_examples == 0:
            raise ValueError(f"The arrays in `{argument}` are empty (0 examples).")
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.seed = seed
        with tf.init_scope(), tf.device("/cpu:0"):
            self._variables = tf.nest.map_structure(
                lambda a: tf.Variable(a, trainable=False, name="numpy_data"), structure)

    def constants(self):
        """The arrays as constants (for a pipeline that runs in another process)."""
        return tf.nest.map_structure(lambda v: tf.constant(v.numpy()), self._variables)

    def indices(self, pipeline=0):
        """The batches of example indices of one pass (shuffled: seeded, anew each pass).

        A shuffled pass is one permutation op (`stateless_shuffle`, its key drawn anew each
        time the pipeline is iterated, from `seed`) cut into batches: per-batch work only.
        `Dataset.range(n).shuffle(n)` did per-example work: with the gathers, 0.13 against
        0.08 CPU-seconds per pass of 65,536 examples (2026-11-23, `bench/numpy_order.py`).
        The passes' orders are a function of `seed` alone, so every worker and every fresh
        copy of the pipeline (resume, a retried ps loop) reads them alike.
        """
        n, size = self.num_examples, self.batch_size
        batches = -(-n // size)
        if not self.shuffle:
            return tf.data.Dataset.range(n).batch(size)

        @unconverted
        def one_pass(order):
            return tf.data.Dataset.range(batches).map(
                unconverted(lambda k: order[k * size:tf.minimum((k + 1) * size, n)]))
        return self.orders().flat_map(one_pass).apply(
            tf.data.experimental.assert_cardinality(batches))

    def orders(self):
        """A dataset whose every iteration yields the next pass's permutation of the
        examples (`stateless_shuffle` keyed by a draw from `seed`): the order of
        `indices` (and of `kerastrain.data.in_step_batches`, which reads the batches in the
        loop)."""
        return self._pass_keys().map(unconverted(self._permutation))

    def order_drawer(self):
        """`() -> the next pass's permutation`: the orders `orders()` yields, pass after
        pass, with the permutation computed by a compiled function instead of inside a
        tf.data iterator made per pass (1.3 against 4.5 ms of CPU per pass of 65,536)."""
        keys, n = self._pass_keys(), tf.constant(self.num_examples, tf.int64)
        return lambda: _permute()(next(iter(keys)), n)

    def _pass_keys(self):
        """Every iteration: one key, drawn anew from `seed` (the next pass's)."""
        return tf.data.Dataset.random(seed=self.seed, rerandomize_each_iteration=True).take(1)

    def _permutation(self, key):
        return _permutation_of(key, tf.constant(self.num_examples, tf.int64))

    def pack(self, parts):
        """A batch from its flat parts. `(x,)`, the inputs alone, yields x itself: what
        `model.fit(x)` hands a model's `train_step` (Keras packs a tuple or list of
        inputs as `((a, b),)`, kept so)."""
        batch = tf.nest.pack_sequence_as(self._variables, list(parts))
        return batch[0] if len(batch) == 1 and not isinstance(batch[0], tuple) else batch

    @property
    def variables(self):
        """The host variables holding the arrays, flat."""
        return tf.nest.flatten(self._variables)

    def gather(self, idx, arrays=None):
        """The batch of examples `idx` (of `arrays`, default the host variables)."""
        return self.pack([tf.gather(v, idx) for v in
                          tf.nest.flatten(self._variables if arrays is None else arrays)])

    def dataset(self, whole_batches=False):
        """The pipeline of global batches. `whole_batches`: when the batch size divides the
        examples, say so in the shapes (lets TensorFlow fold a step's shape arithmetic);
        only where nothing shards the batches later (one worker)."""
        size = self.batch_size if whole_batches and self.num_examples % self.batch_size == 0 \
            else None

        @unconverted
        def gather(idx):
            if size:
                idx.set_shape([size])
            return self.gather(idx)
        return pipeline_lib.threaded(self.indices().map(gather), pipeline_lib.check_threads("auto"))


def _permutation_of(key, n):
    """The permutation of `n` examples a pass with `key` reads them in."""
    return tf.random.experimental.stateless_shuffle(tf.range(n, dtype=tf.int64),
                                                    seed=tf.stack([key, n]))


@functools.cache
def _permute():
    """`_permutation_of`, compiled once a process for every NumPy input (a function made
    per input was traced per input, and after five TensorFlow warned of retracing)."""
    scalar = tf.TensorSpec([], tf.int64)
    return tf.function(_permutation_of, autograph=False, input_signature=[scalar, scalar])
