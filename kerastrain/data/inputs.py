"""The input forms (dataset_fn(ctx), datasets, NumPy arrays): recognised, resolved and checked.

The four forms a user may pass wherever data is expected:

1. `dataset_fn(ctx)`: called once per input pipeline with a
   `tf.distribute.InputContext`; returns per-replica batches and shards itself.
2. A zero-argument function returning a `tf.data.Dataset` of **global** batches.
3. A `tf.data.Dataset` of global batches.
4. NumPy arrays `(x, y)` or `(x, y, sample_weight)` with a `batch_size`
   (`kerastrain.data.numpy_data`). Arrays holding a `tf.RaggedTensor`, a sparse
   tensor (`tf.SparseTensor`, SciPy) or `None` (an optional input) are sliced by
   Keras's own array adapter instead (`_compat.arrays_dataset`).
5. Python batches, as `model.fit` takes them: a `keras.utils.PyDataset` or a
   generator, read by Keras's own adapters into a dataset of global batches
   (`python_dataset`), on this process only: refused where other processes would
   read it (several workers, parameter servers).

Batches are read as Keras reads them (`split_batch`): `(x, y)`, `(x, y,
sample_weight)`, or the inputs alone (`x` or `(x,)`), for a model whose loss
needs no targets (`add_loss`, an endpoint layer, its own `train_step`).

Forms 2-4 are distributed by kerastrain: sharded across workers by the policy
in `kerastrain.data.sharding` and split into per-replica batches by TensorFlow.
Under parameter servers every form becomes a per-worker dataset built on the
workers, worker i reading shard i, repeated so no worker runs dry
(`kerastrain.data.distributed`: one input made iterable under one strategy).
"""

from __future__ import annotations

import dataclasses
import inspect
import random

import keras
import numpy as np
import tensorflow as tf

from kerastrain.data import numpy_data
from kerastrain.data import sharding

INFINITE = -1
UNKNOWN = -2
DEFAULT_BATCH_SIZE = 32  # as in Keras's `fit(x, y)`

_FORMS_HELP = (
    "Pass one of: a function `dataset_fn(ctx)` taking a tf.distribute.InputContext and returning "
    "per-replica batches; a zero-argument function or a tf.data.Dataset yielding global batches; "
    "NumPy arrays `(x, y)` / `(x, y, sample_weight)` with `batch_size`; or a "
    "keras.utils.PyDataset or a generator of batches.")


def _python_batches(data) -> str:
    """What to do with an iterator that is neither a generator nor a PyDataset (which
    `model.fit` refuses too)."""
    if hasattr(data, "__next__") and hasattr(data, "__iter__"):
        return (" An iterator that is not a generator is not data model.fit reads either: "
                "wrap it in a generator (`(batch for batch in it)`) or a keras.utils.PyDataset.")
    return ""


def is_python_batches(data) -> bool:
    """A `keras.utils.PyDataset` or a generator: batches Python code makes, as `model.fit`
    takes them (Keras's test: `types.GeneratorType`)."""
    import types

    from kerastrain import _compat
    return isinstance(data, types.GeneratorType) or _compat.is_py_dataset(data)


def describe_python(data) -> str:
    return "a keras.utils.PyDataset" if not inspect.isgenerator(data) else "a generator"


def python_dataset(data, *, shuffle=False, argument="x"):
    """A generator or a `keras.utils.PyDataset` as a `tf.data.Dataset` of its batches,
    through Keras's own adapters (`_compat.python_batches_dataset`: `workers`,
    `use_multiprocessing` and `max_queue_size` as in `model.fit`; a PyDataset's
    `on_epoch_begin` / `on_epoch_end` around each pass; `shuffle`: a finite PyDataset's
    batch order, each pass). A generator is read once: its batches are one pass, and a
    pass after its end is empty. The dataset remembers where it came from
    (`python_origin`), for the strategies that cannot read it."""
    from kerastrain import _compat
    try:
        dataset = _compat.python_batches_dataset(data, shuffle=bool(shuffle))
    except ValueError as e:  # Keras's own words: an empty generator, a batch not a tuple
        raise ValueError(f"{e} Received: {argument} of type {type(data).__name__}") from None
    specs = tf.nest.flatten(dataset.element_spec)
    if any(isinstance(s, (tf.OptionalSpec, tf.SparseTensorSpec)) for s in specs):
        # Keras's generator adapter yields an empty Optional for a `None` (an optional
        # input given no value), which Keras's TF trainer turns back into None before
        # its step; tf.data carries None itself. A sparse batch is put in row order
        # (a SciPy COO matrix need not be): TensorFlow splits a batch over replicas
        # only with ordered indices.
        def one(t):
            if isinstance(t, tf.experimental.Optional):
                return None
            return tf.sparse.reorder(t) if isinstance(t, tf.SparseTensor) else t

        def standard(*batch):
            return tf.nest.map_structure(one, batch if len(batch) > 1 else batch[0])
        dataset = dataset.map(standard)
    return keep_origin(dataset, describe_python(data))


def keep_origin(dataset, origin):
    """`dataset`, marked as made from Python batches (`origin`: "a generator", "a
    keras.utils.PyDataset"; None: not)."""
    if origin is not None:
        dataset._kerastrain_python_origin = origin
    return dataset


def python_origin(dataset):
    """"a generator" or "a keras.utils.PyDataset" for a dataset `python_dataset` made,
    else None."""
    return getattr(dataset, "_kerastrain_python_origin", None)


def check_python_readable(built, dataset, argument, policy):
    """A dataset of Python batches is read by this process only: where the workers build
    their datasets from graphs (`policy.built_on_workers`: a Python object cannot travel),
    or several pipelines would each run their own copy.

    Raises:
        ValueError: such a dataset where another process would read it.
    """
    what = python_origin(dataset)
    if what is None or not (policy.built_on_workers or policy.pipelines > 1):
        return
    raise ValueError(
        f"`{argument}` is {what}, whose batches Python code in this process makes; under "
        f"`{built.name}` with {policy.pipelines} worker(s) "
        + ("the parameter-server workers build their input from tf.data graphs, which cannot "
           "call this process's Python" if policy.built_on_workers else
           "every worker would run its own copy, and the shards would not be one pass of "
           "the data")
        + ". Build the input with tf.data (e.g. `kerastrain.data.files(...)` or a "
        "`dataset_fn(ctx)` reading the worker's shard), or train it under one_device, "
        f"mirrored or central_storage. Received: {argument}={type(dataset).__name__} made "
        f"from {what}, strategy={built.name!r}")


# -- recognising the form ------------------------------------------------------

def _is_array(value):
    from kerastrain import _compat
    return isinstance(value, np.ndarray) or (
        hasattr(value, "__array__") and hasattr(value, "shape") and not callable(value)) or (
        _compat.is_sparse_or_ragged(value))


def array_leaves(data):
    """The arrays of `data` (a nested structure), or None if any leaf is not an array.
    A `None` leaf (an optional input given no value, as Keras takes it) is no array but
    leaves the structure arrays; it is not in the list."""
    leaves = tf.nest.flatten(data)
    arrays = [v for v in leaves if v is not None]
    return arrays if arrays and all(_is_array(v) for v in arrays) else None


def dense_arrays(data) -> bool:
    """Whether arrays `data` are all dense, as `numpy_data.NumpyData` holds them: no
    `None`, ragged or sparse leaf (those Keras's own array adapter slices)."""
    from kerastrain import _compat
    return not any(v is None or _compat.is_sparse_or_ragged(v) for v in tf.nest.flatten(data))


def shuffle_seed(seed, policy):
    """The seed of NumPy data's shuffle: `seed`, or 0 without one where workers must share
    it (`policy.shared_order_seed`: every worker must shuffle alike for data sharding to
    stay exact)."""
    return 0 if seed is None and policy.shared_order_seed else seed


def input_form(data, argument="dataset_fn") -> str:
    """"context_fn", "global_fn", "dataset", "numpy" or "python"; a clear error for anything
    else."""
    if isinstance(data, tf.data.Dataset):
        return "dataset"
    if is_python_batches(data):
        return "python"
    if isinstance(data, (tuple, list)) and len(data) in (1, 2, 3) and array_leaves(data):
        return "numpy"
    if isinstance(data, (tuple, list, dict)) or _is_array(data):
        raise TypeError(
            f"`{argument}` got {type(data).__name__} data that is not a tuple `(x, y)` or "
            f"`(x, y, sample_weight)` of arrays. {_FORMS_HELP} Received: {argument} of type "
            f"{type(data).__name__}" + (f" with {len(data)} items" if hasattr(data, "__len__")
                                         else ""))
    if not callable(data):
        raise TypeError(f"`{argument}` is not data kerastrain can read.{_python_batches(data)} "
                        f"{_FORMS_HELP} Received: {argument}={data!r} of type "
                        f"{type(data).__name__}")
    try:
        params = [p for p in inspect.signature(data).parameters.values()
                  if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return "context_fn"
    if len(params) > 1:
        raise TypeError(
            f"`{argument}` must take the tf.distribute.InputContext as its only argument, or no "
            f"argument at all. Received a function with required arguments "
            f"{[p.name for p in params]}.")
    return "global_fn" if not params else "context_fn"


def describe(spec):
    def one(s):
        if isinstance(s, tf.TensorSpec):
            return f"Tensor(shape={s.shape.as_list()}, dtype={s.dtype.name})"
        return type(s).__name__
    return str(tf.nest.map_structure(one, spec))


def split_batch(batch):
    """`(x, y, sample_weight)` of a batch (or of its spec), as Keras's `fit` reads it.

    A tuple or list of 2 or 3 items is `(x, y[, sample_weight])`, one of 1 item is
    `(x,)`; anything else (a tensor, a dict) is `x` alone: y and sample_weight None.
    """
    if isinstance(batch, list):
        batch = tuple(batch)
    if not isinstance(batch, tuple):
        return batch, None, None
    if len(batch) in (1, 2, 3):
        return (tuple(batch) + (None, None))[:3]
    raise ValueError("A batch must be `x`, `(x,)`, `(x, y)` or `(x, y, sample_weight)`, as "
                     f"in `model.fit`. Received: a tuple of {len(batch)} items")


def check_element_spec(dataset, argument="dataset_fn"):
    """The dataset must yield `(x, y)`, `(x, y, sample_weight)` or x-only batches, as `model.fit`
    takes them (x-only: the model's losses are its own, e.g. `add_loss` or `train_step`)."""
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            f"`{argument}` must return a tf.data.Dataset. "
            f"Received: an object of type {type(dataset).__name__}")
    spec = dataset.element_spec
    if isinstance(spec, (tuple, list)) and len(spec) not in (1, 2, 3):
        raise ValueError(
            f"The dataset from `{argument}` must yield batches of (x, y), "
            f"(x, y, sample_weight) or x alone. Received: element_spec={describe(spec)} "
            f"(a tuple of {len(spec)}). Map it to one of those, e.g. "
            "`ds.map(lambda *t: ((t[0], t[1]), t[2]))`.")
    x = [s for s in tf.nest.flatten(split_batch(spec)[0]) if not is_absent(s)]
    if not x or any(not isinstance(s, _BATCHED) or s.shape.rank == 0 for s in x):
        raise ValueError(
            f"The inputs (x) from `{argument}` must be batched tensors with a batch dimension. "
            f"Received: element_spec={describe(spec)}. Did you forget `.batch(...)`?")


def _batched():
    return (tf.TensorSpec, tf.SparseTensorSpec, tf.RaggedTensorSpec)


class _Batched:
    """isinstance against the specs of batched tensors (dense, sparse, ragged), TensorFlow
    imported on first use."""
    def __instancecheck__(self, value):
        return isinstance(value, _batched())


_BATCHED = _Batched()


def is_absent(spec_or_value) -> bool:
    """An optional input given no value: `None` (Keras's array adapter keeps it; tf.data
    carries it as a `NoneTensorSpec`) or an empty `tf.experimental.Optional` (Keras's
    generator adapter yields one for `None`)."""
    return spec_or_value is None or type(spec_or_value).__name__ == "NoneTensorSpec" or \
        isinstance(spec_or_value, (tf.OptionalSpec, tf.experimental.Optional))


def check_no_absent(element_spec, argument, built, policy):
    """An optional input given None trains on one device (the default strategy reads the
    dataset as it is, as Keras's `fit` does: `policy.absent_inputs`); it cannot pass a
    distributed iterator yet.

    Raises:
        ValueError: a None among the inputs (x) under a strategy that distributes the data,
            naming the cause and what to do.
    """
    if not policy.absent_inputs and any(
            is_absent(s) for s in tf.nest.flatten(split_batch(element_spec)[0])):
        raise ValueError(
            f"`{argument}` gives an optional input (`keras.Input(..., optional=True)`) the "
            f"value None, which trains on one device. Under {built.name!r} kerastrain's "
            "compiled loops read batches through tf.distribute iterators, which cannot carry "
            "a None (TensorFlow 2.21: a NoneTensorSpec has no shape); Keras's TF trainer "
            "carries it as an empty tf.experimental.Optional and turns it back into None "
            "before its step, which kerastrain does not do yet. Feed the input zeros, build "
            "the model without it, or train on one device. Received: "
            f"element_spec={describe(element_spec)} under strategy={built.name!r}")


def cardinality(dataset) -> int:
    n = tf.get_static_value(dataset.cardinality())
    if n is None:  # traced on a PS worker: the size is known only at run time
        return UNKNOWN
    n = int(n)
    return {tf.data.INFINITE_CARDINALITY: INFINITE, tf.data.UNKNOWN_CARDINALITY: UNKNOWN}.get(n, n)


# -- one input resolved in its form ------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Source:
    """One input resolved in its form (`resolve`): how its pipelines are made, and what the
    copy made on this task showed of their structure and size."""
    form: str
    probe: object  # the pipeline made here (the first one, for dataset_fn(ctx))
    element_spec: object
    cardinality: int
    sizes: list  # of each pipeline made here: one, or one per worker (dataset_fn(ctx) in turn)
    make: object = None  # () -> a dataset of global batches (every form but dataset_fn(ctx))
    fn: object = None  # dataset_fn(ctx)
    numpy: object = None  # `numpy_data.NumpyData` of NumPy input
    file_source: object = None  # the files it reads (`sharding.PipelineGraph.file_source`)
    global_batch: int | None = None


def resolve(built, data, form, *, policy, argument, shard, batch_size, seed, for_training,
            input_options) -> Source:
    """`data` of `form` (`input_form`) made into its `Source`, one copy of its pipelines built
    here, on this task, to check structure and size first (`policy`: the
    `data.policy.InputPolicy` of the strategy `built`).

    NumPy arrays are held in host variables (`numpy_data.NumpyData`, shuffled when
    `for_training`); a dataset object must be usable here (`policy.check_dataset`).
    """
    pipelines = policy.pipelines
    replicas = built.strategy.num_replicas_in_sync
    numpy = global_batch = None
    if form == "python":  # as a dataset of global batches, on this process only
        data, form = python_dataset(data, shuffle=for_training, argument=argument), "dataset"
    if form == "dataset":
        check_python_readable(built, data, argument, policy)
    if form == "numpy" and not dense_arrays(data):
        # Ragged, sparse or None leaves: Keras's own array adapter slices them.
        global_batch = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        arrays, form = tuple(data), "dataset"

        def make():
            from kerastrain import _compat
            return _compat.arrays_dataset(arrays, batch_size=global_batch, shuffle=for_training)
    elif form == "numpy":
        seed = shuffle_seed(seed, policy)
        if seed is None and for_training:
            seed = random.randrange(2 ** 31)
        numpy = numpy_data.NumpyData(
            data, DEFAULT_BATCH_SIZE if batch_size is None else batch_size,
            shuffle=for_training, seed=seed, argument=argument)
        # A `tuning` choice, where this task's loops read the one pipeline.
        whole = input_options and not policy.built_on_workers and pipelines == 1

        def make():
            return numpy.dataset(whole_batches=whole)
    elif form == "dataset":
        if policy.check_dataset is not None and python_origin(data) is None:
            policy.check_dataset(data, argument)

        def make():
            return data
    elif form == "global_fn":
        make = data
    else:
        # Batches taken in turn: the size of an epoch is that of every pipeline together.
        contexts = [tf.distribute.InputContext(pipelines, i, replicas)
                    for i in range(pipelines if policy.in_turn else 1)]
        probes = [data(ctx) for ctx in contexts]
        for probe in probes:
            check_element_spec(probe, argument)
        sizes = [cardinality(p) for p in probes]
        return Source(form, probes[0], probes[0].element_spec,
                      sizes[0] if len(sizes) == 1 or min(sizes) < 0 else sum(sizes), sizes,
                      fn=data)
    probe = make()
    check_element_spec(probe, argument)
    check_no_absent(probe.element_spec, argument, built, policy)
    size = cardinality(probe)
    pipeline = sharding.PipelineGraph(probe)  # serialised at most once, if needed
    file_source = pipeline.file_source() if pipelines > 1 or shard == "file" else None
    global_batch = numpy.batch_size if numpy else global_batch or pipeline.batch_size()
    return Source(form, probe, probe.element_spec, size, [size], make=make, numpy=numpy,
                  file_source=file_source, global_batch=global_batch)


def check_against_model(element_spec, model, steps=("train_step", "compute_loss")):
    """Catch the commonest mismatches (unbatched data, no targets) before Keras fails deep
    inside; a model overriding one of `steps` decides itself what its batches need."""
    inputs = getattr(model, "inputs", None)
    try:
        shapes = [tuple(t.shape) for t in tf.nest.flatten(inputs)] if inputs else None
    except (AttributeError, TypeError, ValueError):
        shapes = None
    _check_targets(element_spec, model, steps)
    got = [None if is_absent(s) else s.shape.rank
           for s in tf.nest.flatten(split_batch(element_spec)[0])]
    expected = shapes and [len(shape) for shape in shapes]
    # Keras's functional models add a last dimension of 1 themselves (`Input((1,))` fed
    # arrays of shape (n,): keras.io's structured-data models): not a missing batch.
    if expected and len(expected) == len(got) and all(
            g is not None and g == len(shape) - 1 and shape[-1:] != (1,)
            for g, shape in zip(got, shapes)):
        raise ValueError(
            f"The inputs (x) have rank {got} but the model expects rank {expected} (with a batch "
            f"dimension). Received: element_spec={describe(element_spec)}. "
            "Did you forget `.batch(...)` in the dataset_fn?")


def _check_targets(element_spec, model, steps):
    """x-only batches train (or evaluate) a model whose losses are its own, not a compiled one."""
    x_only = split_batch(element_spec)[1] is None
    if not x_only or getattr(model, "loss", None) is None:
        return
    if any(getattr(type(model), name) is not getattr(keras.Model, name) for name in steps):
        return  # the model decides what its loss needs
    raise ValueError(
        "The batches hold inputs (x) only, but the model was compiled with a loss, which needs "
        "targets (y). Yield (x, y) batches, or compile without `loss` when the model adds its "
        f"own (`add_loss`). Received: element_spec={describe(element_spec)}, "
        f"loss={model.loss!r}")
