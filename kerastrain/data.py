"""Turn a user's `dataset_fn(InputContext)` into what each strategy iterates.

Under synchronous strategies the function is called once per input pipeline
(worker) through `distribute_datasets_from_function`; under parameter servers it
runs on every worker through `ClusterCoordinator.create_per_worker_dataset` and is
repeated so that no worker runs dry mid-epoch.
"""

from __future__ import annotations

import inspect
import logging

logger = logging.getLogger("kerastrain")

INFINITE = -1
UNKNOWN = -2


def check_dataset_fn(dataset_fn, argument="dataset_fn"):
    """Raise a clear error unless `dataset_fn` is a callable taking an InputContext."""
    import tensorflow as tf

    if isinstance(dataset_fn, tf.data.Dataset) or not callable(dataset_fn):
        raise TypeError(
            f"`{argument}` must be a function taking a tf.distribute.InputContext and returning a "
            "tf.data.Dataset of per-replica batches, e.g. `def dataset_fn(ctx): return "
            "make_ds().shard(ctx.num_input_pipelines, ctx.input_pipeline_id)"
            ".batch(ctx.get_per_replica_batch_size(256))`. "
            f"Received: {argument}={dataset_fn!r} of type {type(dataset_fn).__name__}")
    try:
        params = [p for p in inspect.signature(dataset_fn).parameters.values()
                  if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return
    if len(params) > 1:
        raise TypeError(
            f"`{argument}` must take exactly one argument, the tf.distribute.InputContext. "
            f"Received a function with required arguments {[p.name for p in params]}.")


def describe(spec):
    import tensorflow as tf

    def one(s):
        if isinstance(s, tf.TensorSpec):
            return f"Tensor(shape={s.shape.as_list()}, dtype={s.dtype.name})"
        return type(s).__name__
    return str(tf.nest.map_structure(one, spec))


def check_element_spec(dataset, argument="dataset_fn"):
    """The dataset must yield `(x, y)` or `(x, y, sample_weight)` batches."""
    import tensorflow as tf

    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            f"`{argument}` must return a tf.data.Dataset. "
            f"Received: an object of type {type(dataset).__name__}")
    spec = dataset.element_spec
    if not isinstance(spec, (tuple, list)) or len(spec) not in (2, 3):
        raise ValueError(
            f"The dataset from `{argument}` must yield batches of (x, y) or "
            f"(x, y, sample_weight). Received: element_spec={describe(spec)}. Map it to a "
            "tuple, e.g. `ds.map(lambda d: (d['features'], d['label']))`.")
    x = tf.nest.flatten(spec[0])
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


class DistributedInput:
    """One dataset_fn made iterable under one strategy.

    Attributes:
        element_spec: the per-replica element spec (checked).
        cardinality: per-pipeline number of per-replica batches, or INFINITE/UNKNOWN.
    """

    def __init__(self, built, dataset_fn, *, argument="dataset_fn", for_training=True):
        import tensorflow as tf

        check_dataset_fn(dataset_fn, argument)
        self._built = built
        self._fn = dataset_fn
        self._argument = argument
        strategy = built.strategy
        # Build one copy here, on this task, to check structure and size before
        # anything is traced or sent to workers.
        # TensorFlow gives every parameter-server worker a one-pipeline context
        # (each reads the whole dataset); synchronous workers get one pipeline each.
        pipelines = 1 if built.is_parameter_server else max(built.num_workers, 1)
        probe_ctx = tf.distribute.InputContext(
            num_input_pipelines=pipelines, input_pipeline_id=0,
            num_replicas_in_sync=strategy.num_replicas_in_sync)
        probe = dataset_fn(probe_ctx)
        check_element_spec(probe, argument)
        self.element_spec = probe.element_spec
        self.cardinality = cardinality(probe)
        self._probe = probe
        self._distributed = None
        self._per_worker = None
        self._for_training = for_training

    def _checked_fn(self, repeat):
        def fn(ctx):
            ds = self._fn(ctx)
            check_element_spec(ds, self._argument)
            if repeat and cardinality(ds) != INFINITE:
                ds = ds.repeat()
            return ds
        return fn

    def distributed(self):
        """A distributed dataset for synchronous strategies (iterate it once per pass)."""
        if self._distributed is None:
            self._distributed = self._built.strategy.distribute_datasets_from_function(
                self._checked_fn(repeat=False))
        return self._distributed

    def per_worker_iterator(self):
        """A per-worker iterator under parameter servers; repeated, so it never runs dry."""
        import tensorflow as tf

        if self._per_worker is None:
            strategy = self._built.strategy
            fn = self._checked_fn(repeat=True)

            @tf.function
            def per_worker_dataset_fn():
                return strategy.distribute_datasets_from_function(fn)

            dataset = self._built.coordinator.create_per_worker_dataset(per_worker_dataset_fn)
            self._per_worker = iter(dataset)
        return self._per_worker

    def local_dataset(self):
        """The whole dataset read on this task (coordinator-side evaluation under PS)."""
        import tensorflow as tf
        ctx = tf.distribute.InputContext(1, 0, 1)
        ds = self._fn(ctx)
        check_element_spec(ds, self._argument)
        return ds


def check_against_model(element_spec, model):
    """Catch the commonest mismatch (unbatched data) before Keras fails deep inside."""
    import tensorflow as tf

    inputs = getattr(model, "inputs", None)
    try:
        expected = [len(t.shape) for t in tf.nest.flatten(inputs)] if inputs else None
    except (AttributeError, TypeError, ValueError):
        expected = None
    got = [s.shape.rank for s in tf.nest.flatten(element_spec[0])]
    if expected and len(expected) == len(got) and all(
            g is not None and g == e - 1 for g, e in zip(got, expected)):
        raise ValueError(
            f"The inputs (x) have rank {got} but the model expects rank {expected} (with a batch "
            f"dimension). Received: element_spec={describe(element_spec)}. "
            "Did you forget `.batch(...)` in the dataset_fn?")
