"""tf.data and Keras data-adapter internals: auto-shard, the tf.data service, a dataset's stages."""

from __future__ import annotations

import tensorflow as tf


def class_weight_to_sample_weights(y, class_weight):
    """Keras's own conversion of NumPy targets to per-example class weights (as `fit`)."""
    from keras.src.trainers.data_adapters import data_adapter_utils
    return data_adapter_utils.class_weight_to_sample_weights(y, class_weight)


def class_weight_map_fn(class_weight):
    """Keras's own `Dataset.map` function that adds class weights to `(x, y)` batches."""
    from keras.src.trainers.data_adapters import tf_dataset_adapter
    return tf_dataset_adapter.make_class_weight_map_fn(class_weight)


def auto_shard(dataset, num_shards, index):
    """TensorFlow's own auto-shard rewrite (FILE / DATA, per the dataset's options).

    `tf.distribute` applies it only to the datasets it distributes itself; under
    parameter servers TensorFlow gives every worker the whole dataset, so
    kerastrain applies the same rewrite per worker (TF 2.16-2.21:
    `tensorflow.python.data.experimental.ops.distribute._AutoShardDataset`).
    """
    from tensorflow.python.data.experimental.ops import distribute
    return distribute._AutoShardDataset(dataset, num_shards, index, 1)


def _with_task_refresh(name, task_refresh_ms, *args, **kwargs):
    """`tf.data.experimental.service.<name>(*args, **kwargs)` with the consumer's heartbeat
    interval set.

    The consumer learns that its job has finished only at its next heartbeat to the
    dispatcher, every second by default, so each pass (one job) ended about 0.9 s after
    its last batch (measured: docs/performance.md). The public functions do not take the
    interval; their private twins (`_distribute`, `_from_dataset_id`) do, as
    `task_refresh_interval_hint_ms` (TF 2.16-2.21:
    `tensorflow.python.data.experimental.ops.data_service_ops`). Without them, the
    public function (and the default interval).
    """
    import inspect

    from tensorflow.python.data.experimental.ops import data_service_ops
    private = getattr(data_service_ops, "_" + name, None)
    if private is None or "task_refresh_interval_hint_ms" not in inspect.signature(
            private).parameters:
        return getattr(tf.data.experimental.service, name)(*args, **kwargs)
    return private(*args, task_refresh_interval_hint_ms=task_refresh_ms, **kwargs)


def service_distribute(processing_mode, address, *, task_refresh_ms):
    """`tf.data.experimental.service.distribute`, heartbeat every `task_refresh_ms`."""
    return _with_task_refresh("distribute", task_refresh_ms, processing_mode, address)


def service_from_dataset_id(processing_mode, address, dataset_id, element_spec, *, job_name,
                            task_refresh_ms):
    """`tf.data.experimental.service.from_dataset_id`, heartbeat every `task_refresh_ms`."""
    return _with_task_refresh("from_dataset_id", task_refresh_ms, processing_mode, address,
                              dataset_id, element_spec, job_name=job_name)


def service_worker_port(worker) -> int:
    """The port a tf.data service `WorkerServer` listens on (it keeps its address private)."""
    return int(worker._address.rsplit(":", 1)[1])


def serialize_dataset(dataset, external_state="warn"):
    """A dataset's graph as a string tensor (a serialised GraphDef).

    "warn" to rebuild it on another task (state such as a shuffle's seed
    generator is re-created there); "ignore" to read its structure only.
    """
    return tf.raw_ops.DatasetToGraphV2(
        input_dataset=tf.data.experimental.to_variant(dataset),
        external_state_policy={"warn": 0, "ignore": 1}[external_state],
        strip_device_assignment=True)


def deserialize_dataset(graph, element_spec):
    return tf.data.experimental.from_variant(
        tf.raw_ops.DatasetFromGraph(graph_def=graph), element_spec)


def slices_then_batch(dataset):
    """`(tensors, element_spec, batch_size, drop_remainder, prefetch_buffer, options)` when
    `dataset` is exactly `from_tensor_slices(tensors).batch(b)[.prefetch(p)][.with_options()]`
    of dense tensors, else None.

    tf.data has no public way to read a pipeline's stages; the classes and fields read
    here (`_TensorSliceDataset._tensors`, `_BatchDataset._batch_size/_drop_remainder`,
    `_PrefetchDataset._buffer_size`, `_OptionsDataset._input_dataset`) are those of
    TensorFlow 2.16-2.21. Anything else (a shuffle, a map, a parallel batch) gives None.
    """
    options = dataset.options()
    while type(dataset).__name__ == "_OptionsDataset":
        dataset = dataset._input_dataset
    prefetch = None
    if type(dataset).__name__ == "_PrefetchDataset":
        prefetch = tf.get_static_value(dataset._buffer_size)
        if prefetch is None:
            return None
        prefetch = int(prefetch)
        dataset = dataset._input_dataset
    if type(dataset).__name__ != "_BatchDataset":
        return None
    batch_size, drop = dataset._batch_size, dataset._drop_remainder
    source = dataset._input_dataset
    if type(source).__name__ != "_TensorSliceDataset":
        return None
    spec = source.element_spec
    tensors = list(getattr(source, "_tensors", ()))
    if not tensors or not all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(spec)) \
            or len(tensors) != len(tf.nest.flatten(spec)):
        return None
    return tensors, spec, batch_size, drop, prefetch, options


def is_py_dataset(data) -> bool:
    """A `keras.utils.PyDataset` (Keras's own test: its adapter's base class)."""
    from keras.src.trainers.data_adapters import py_dataset_adapter
    return isinstance(data, py_dataset_adapter.PyDataset)


def python_batches_dataset(data, *, shuffle):
    """A `tf.data.Dataset` of the batches a `keras.utils.PyDataset` or a generator yields,
    made by Keras's own adapters (`PyDatasetAdapter`, `GeneratorDataAdapter`, Keras 3.10-3.15:
    their `get_tf_dataset()`), so batches, specs, sparse conversion, `workers`,
    `use_multiprocessing` and `max_queue_size` are `model.fit`'s.

    Each iteration of the dataset is one pass. A PyDataset's pass begins with its
    `on_epoch_begin` (starting its enqueuer) and a finished one ends with `on_epoch_end`,
    as `model.fit`'s epoch iterator calls them around each epoch (kerastrain has no
    adapter at its epoch boundaries; a pass is an epoch but where `steps_per_epoch` cuts
    them). `shuffle` shuffles a finite PyDataset's batch order each pass, as in `fit`.

    A generator yields once: its adapter chains the two batches it peeked (for the specs)
    before the rest each time it is iterated, so a second pass replayed those two; here
    every pass continues the one chain, and a finished generator yields nothing more.
    """
    from keras.src.trainers.data_adapters import generator_data_adapter, py_dataset_adapter
    if is_py_dataset(data):
        adapter = py_dataset_adapter.PyDatasetAdapter(data, shuffle=shuffle)
        iterate = adapter._get_iterator

        def one_pass():
            adapter._within_epoch = False  # a pass left unfinished never saw its end
            adapter.on_epoch_begin()
            yield from iterate()
            adapter.on_epoch_end()
        adapter._get_iterator = one_pass
        return adapter.get_tf_dataset()
    adapter = generator_data_adapter.GeneratorDataAdapter(data)
    chain = adapter.generator()
    adapter.generator = lambda: chain
    return adapter.get_tf_dataset()


def arrays_dataset(arrays, *, batch_size, shuffle):
    """A `tf.data.Dataset` of batches of `arrays` (`x`, `(x,)`, `(x, y)` or `(x, y,
    sample_weight)`) made by Keras's own `ArrayDataAdapter` (Keras 3.10-3.15), for arrays
    kerastrain's NumPy input cannot hold in variables: `tf.RaggedTensor`s, sparse tensors
    (`tf.SparseTensor`, SciPy sparse matrices) and `None` for an optional input. Keras's
    slicing keeps them ragged, sparse and None; `shuffle` reshuffles the examples each
    pass, as in `fit`."""
    from keras.src.trainers.data_adapters import array_data_adapter
    x, y, sample_weight = (tuple(arrays) + (None, None))[:3] if isinstance(
        arrays, tuple) else (arrays, None, None)
    return array_data_adapter.ArrayDataAdapter(
        x, y, sample_weight=sample_weight, batch_size=batch_size,
        shuffle=shuffle).get_tf_dataset()


def is_sparse_or_ragged(value) -> bool:
    """A `tf.RaggedTensor`, `tf.SparseTensor` or SciPy sparse matrix (Keras's own tests)."""
    from keras.src.trainers.data_adapters import data_adapter_utils
    return isinstance(value, (tf.RaggedTensor, tf.SparseTensor)) or \
        data_adapter_utils.is_scipy_sparse(value)
