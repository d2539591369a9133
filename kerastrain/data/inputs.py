"""The input forms (dataset_fn(ctx), datasets, NumPy arrays): recognised, resolved and checked.

The four forms a user may pass wherever data is expected:

1. `dataset_fn(ctx)`: called once per input pipeline with a
   `tf.distribute.InputContext`; returns per-replica batches and shards itself.
2. A zero-argument function returning a `tf.data.Dataset` of **global** batches.
3. A `tf.data.Dataset` of global batches.
4. NumPy arrays `(x, y)` or `(x, y, sample_weight)` with a `batch_size`
   (`kerastrain.data.numpy_data`).

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

import numpy as np

from kerastrain.data import numpy_data
from kerastrain.data import sharding

INFINITE = -1
UNKNOWN = -2
DEFAULT_BATCH_SIZE = 32  # as in Keras's `fit(x, y)`

_FORMS_HELP = (
    "Pass one of: a function `dataset_fn(ctx)` taking a tf.distribute.InputContext and returning "
    "per-replica batches; a zero-argument function or a tf.data.Dataset yielding global batches; "
    "or NumPy arrays `(x, y)` / `(x, y, sample_weight)` with `batch_size`.")


def _python_batches(data) -> str:
    """What to do with batches Python code makes, which `model.fit` takes and kerastrain not:
    a compiled loop over many steps reads a tf.data pipeline, on any worker."""
    import keras
    if isinstance(data, keras.utils.PyDataset) or inspect.isgenerator(data) or (
            hasattr(data, "__next__") and hasattr(data, "__iter__")):
        return (" A keras.utils.PyDataset, a generator or an iterator of Python batches "
                "(which model.fit takes) runs Python for every batch; kerastrain reads tf.data "
                "inside its compiled loops, on every worker. Wrap it as a zero-argument function "
                "returning `tf.data.Dataset.from_generator(...)` with `output_signature` (one "
                "process; under parameter servers batches must come from tf.data ops), or build "
                "the pipeline with tf.data.")
    return ""


# -- recognising the form ------------------------------------------------------

def _is_array(value):
    return isinstance(value, np.ndarray) or (
        hasattr(value, "__array__") and hasattr(value, "shape") and not callable(value))


def array_leaves(data):
    """The arrays of `data` (a nested structure), or None if any leaf is not an array."""
    import tensorflow as tf
    leaves = tf.nest.flatten(data)
    return leaves if leaves and all(_is_array(v) for v in leaves) else None


def shuffle_seed(seed, built):
    """The seed of NumPy data's shuffle: `seed`, or 0 without one under multi-worker
    training (every worker must shuffle alike for data sharding to stay exact)."""
    return 0 if seed is None and built.is_multi_worker else seed


def input_form(data, argument="dataset_fn") -> str:
    """"context_fn", "global_fn", "dataset" or "numpy"; a clear error for anything else."""
    import tensorflow as tf

    if isinstance(data, tf.data.Dataset):
        return "dataset"
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
    import tensorflow as tf

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
    import tensorflow as tf

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
    x = tf.nest.flatten(split_batch(spec)[0])
    if not x or any(not isinstance(s, tf.TensorSpec) or s.shape.rank == 0 for s in x):
        raise ValueError(
            f"The inputs (x) from `{argument}` must be batched tensors with a batch dimension. "
            f"Received: element_spec={describe(spec)}. Did you forget `.batch(...)`?")


def cardinality(dataset) -> int:
    import tensorflow as tf
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
    sizes: list  # of each pipeline made here: one, or one per worker (dataset_fn(ctx) under ps)
    make: object = None  # () -> a dataset of global batches (every form but dataset_fn(ctx))
    fn: object = None  # dataset_fn(ctx)
    numpy: object = None  # `numpy_data.NumpyData` of NumPy input
    file_source: object = None  # the files it reads (`sharding.PipelineGraph.file_source`)
    global_batch: int | None = None


def resolve(built, data, form, *, argument, shard, batch_size, seed, for_training,
            input_options) -> Source:
    """`data` of `form` (`input_form`) made into its `Source`, one copy of its pipelines built
    here, on this task, to check structure and size first.

    NumPy arrays are held in host variables (`numpy_data.NumpyData`, shuffled when
    `for_training`); a dataset under parameter servers must be usable on this task.
    """
    import tensorflow as tf

    ps = built.is_parameter_server
    pipelines = max(built.num_workers, 1)
    replicas = built.strategy.num_replicas_in_sync
    numpy = None
    if form == "numpy":
        seed = shuffle_seed(seed, built)
        if seed is None and for_training:
            seed = random.randrange(2 ** 31)
        numpy = numpy_data.NumpyData(
            data, DEFAULT_BATCH_SIZE if batch_size is None else batch_size,
            shuffle=for_training, seed=seed, argument=argument)
        whole = input_options and not ps and pipelines == 1  # a `tuning` choice

        def make():
            return numpy.dataset(whole_batches=whole)
    elif form == "dataset":
        if ps:
            _check_usable_here(data, argument)

        def make():
            return data
    elif form == "global_fn":
        make = data
    else:
        contexts = [tf.distribute.InputContext(pipelines, i, replicas)
                    for i in range(pipelines if ps else 1)]
        probes = [data(ctx) for ctx in contexts]
        for probe in probes:
            check_element_spec(probe, argument)
        sizes = [cardinality(p) for p in probes]
        return Source(form, probes[0], probes[0].element_spec,
                      sizes[0] if len(sizes) == 1 or min(sizes) < 0 else sum(sizes), sizes,
                      fn=data)
    probe = make()
    check_element_spec(probe, argument)
    size = cardinality(probe)
    pipeline = sharding.PipelineGraph(probe)  # serialised at most once, if needed
    file_source = pipeline.file_source() if pipelines > 1 or shard == "file" else None
    global_batch = numpy.batch_size if form == "numpy" else pipeline.batch_size()
    return Source(form, probe, probe.element_spec, size, [size], make=make, numpy=numpy,
                  file_source=file_source, global_batch=global_batch)


def _check_usable_here(dataset, argument):
    """A dataset made before the PS cluster connected lives on devices that are gone."""
    import tensorflow as tf
    try:
        dataset.with_options(tf.data.Options())
    except tf.errors.InvalidArgumentError as e:
        raise ValueError(
            f"The tf.data.Dataset given as `{argument}` was created before kerastrain connected "
            "to the parameter-server cluster, which replaces TensorFlow's devices, so it cannot "
            "be used any more. Pass a zero-argument function that returns the dataset instead "
            f"(e.g. `lambda: make_dataset()`), or create it after the Trainer. TensorFlow said: "
            f"{e.message.splitlines()[0]}") from None


def check_against_model(element_spec, model, steps=("train_step", "compute_loss")):
    """Catch the commonest mismatches (unbatched data, no targets) before Keras fails deep
    inside; a model overriding one of `steps` decides itself what its batches need."""
    import tensorflow as tf

    inputs = getattr(model, "inputs", None)
    try:
        shapes = [tuple(t.shape) for t in tf.nest.flatten(inputs)] if inputs else None
    except (AttributeError, TypeError, ValueError):
        shapes = None
    _check_targets(element_spec, model, steps)
    got = [s.shape.rank for s in tf.nest.flatten(split_batch(element_spec)[0])]
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
    import keras
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
