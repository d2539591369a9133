"""Input forms (dataset_fn(ctx), global-batch datasets, NumPy arrays) made iterable per strategy.

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
workers, worker i reading shard i, repeated so no worker runs dry.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import random
import warnings

import numpy as np

from kerastrain import _compat, _logging
from kerastrain.data import instep
from kerastrain.data import pipelines as pipeline_lib
from kerastrain.data import sharding
from kerastrain.distribute.ps import visits
from kerastrain.data import service as service_lib
from kerastrain.data.numpy_data import NumpyData

logger = logging.getLogger("kerastrain")

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
        raise TypeError(f"`{argument}` is not usable as training data.{_python_batches(data)} "
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


# -- one input under one strategy ---------------------------------------------------

def _with_policy(dataset, policy):
    import tensorflow as tf
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = {
        "file": tf.data.experimental.AutoShardPolicy.FILE,
        "data": tf.data.experimental.AutoShardPolicy.DATA,
    }.get(policy, tf.data.experimental.AutoShardPolicy.OFF)
    return dataset.with_options(options)


class DistributedInput:
    """One input (any form) made iterable under one strategy.

    Attributes:
        form: "context_fn", "global_fn", "dataset" or "numpy".
        plan: the `sharding.Plan` decided (logged once).
        element_spec: the element spec of the batches (checked).
        cardinality: batches per epoch: per pipeline for `dataset_fn(ctx)`
            under synchronous strategies, global batches otherwise (the sum over
            workers under parameter servers); or INFINITE / UNKNOWN.

    `role` ("training", "validation", "evaluation") names the input in the log
    line; only training data is shuffled (NumPy input).
    """

    def __init__(self, built, data, *, argument="dataset_fn", shard="auto", batch_size=None,
                 seed=None, role="training", shuffle=True, input_options=True, in_step=True,
                 service=None):
        import tensorflow as tf

        self.form = input_form(data, argument)
        sharding.check_policy(shard)
        if batch_size is not None and self.form != "numpy":
            raise ValueError(
                "`batch_size` applies to NumPy input only; a dataset or dataset_fn batches its "
                f"own data. Received: batch_size={batch_size!r} with {argument} of form "
                f"{self.form!r}")
        self._built = built
        self._argument = argument
        self._role = role
        self._input_options = input_options  # `pipeline_lib.tuned` on what synchronous loops read
        for_training = role == "training" and shuffle  # NumPy training data is reshuffled
        strategy = built.strategy
        ps = built.is_parameter_server
        pipelines = max(built.num_workers, 1)
        self._pipelines = pipelines
        # Built on first use (the last two, and `passes_read`, kept between fits: ps + service)
        self._distributed = self._per_worker = self._worker_index = self._account = None
        self.passes_read = 0
        # A `kerastrain.data.service.Service` reads training data only (validation stays local).
        self._service = service if role == "training" else None
        if self.form == "numpy":
            seed = shuffle_seed(seed, built)
            if seed is None and for_training:
                seed = random.randrange(2 ** 31)
            self._numpy = NumpyData(data, DEFAULT_BATCH_SIZE if batch_size is None else batch_size,
                                    shuffle=for_training, seed=seed, argument=argument)
            whole = input_options and not ps and pipelines == 1  # a `tuning` choice
            self._make = lambda: self._numpy.dataset(whole_batches=whole)
        elif self.form == "dataset":
            if ps:
                _check_usable_here(data, argument)
            self._make = lambda: data
        elif self.form == "global_fn":
            self._make = data
        else:
            self._fn = data

        if self.form == "context_fn":
            # Build one copy here, on this task, to check structure and size first.
            contexts = [tf.distribute.InputContext(pipelines, i, strategy.num_replicas_in_sync)
                        for i in range(pipelines if ps else 1)]
            probes = [self._fn(ctx) for ctx in contexts]
            for probe in probes:
                check_element_spec(probe, argument)
            sizes = [cardinality(p) for p in probes]
            self.cardinality = (sizes[0] if len(sizes) == 1 or min(sizes) < 0 else sum(sizes))
            self._sizes = sizes
            self.element_spec = probes[0].element_spec
            source, global_batch = None, None
        else:
            probe = self._make()
            check_element_spec(probe, argument)
            self.element_spec = probe.element_spec
            self.cardinality = cardinality(probe)
            self._sizes = [self.cardinality]
            pipeline = sharding.PipelineGraph(probe)  # serialised at most once, if needed
            source = pipeline.file_source() if pipelines > 1 or shard == "file" else None
            global_batch = (self._numpy.batch_size if self.form == "numpy"
                            else pipeline.batch_size())
            replicas = strategy.num_replicas_in_sync
            if global_batch and not ps and global_batch % replicas:
                low = global_batch // replicas
                raise ValueError(
                    f"The global batch size {global_batch} does not divide evenly over the "
                    f"{replicas} replicas, so replicas would get batches of {low} and "
                    f"{low + 1}. Use a multiple of {replicas}, e.g. {low * replicas} or "
                    f"{(low + 1) * replicas}. Received: global batch size {global_batch} from "
                    f"`{argument}`")
        self.plan = sharding.decide(
            shard, form=self.form, pipelines=pipelines, source=source, parameter_servers=ps,
            global_batch=global_batch, replicas=strategy.num_replicas_in_sync)
        self._decide_visits(shard, role)
        self._say_plan(probes[0] if self.form == "context_fn" else probe, in_step)

    def _say_plan(self, probe, in_step):
        """Log the plan (the service's, if one splits the data) and how batches are read."""
        if self._service is not None:
            self.plan = self._service_plan(probe)
        if self.plan.policy == "none" and self._built.strategy.num_replicas_in_sync == 1:
            # One pipeline feeding one replica: nothing decided worth a line of its own.
            _logging.tuning(f"{self._role} data: one input pipeline", "%s data: %s",
                            self._role, self.plan.sentence)
        else:
            logger.info("%s data: %s", self._role, self.plan.sentence)
        self._in_step = in_step and self._in_step_source(probe)

    def _in_step_source(self, probe):
        """`() -> instep.InStepBatches` when the batches can be read inside the compiled
        loop (`instep.source`), else None."""
        built = self._built
        if built.is_parameter_server or self._pipelines != 1 or self._service is not None:
            return None
        return instep.source(self._numpy if self.form == "numpy" else None, probe,
                             self.element_spec, built.replica_devices or ("/cpu:0",),
                             self._role)

    def _service_plan(self, probe):
        """The plan when the tf.data service splits the data (no sharding by kerastrain)."""
        if self.form != "numpy":  # NumPy data goes as `service.numpy_batches`, split by batch
            self._service.check_splittable(sharding.PipelineGraph(probe).graph, self._argument)
        expected = self._numpy.num_examples if self.form == "numpy" else None
        self._expected = expected
        return dataclasses.replace(self.plan, policy="off", sentence=self._service.sentence(
            parameter_servers=self._built.is_parameter_server, expected=expected))

    def _service_source(self, ctx=None, first_pass=0, passes=1):
        """The whole data as one pipeline, for the service to split (NumPy: by batch)."""
        import tensorflow as tf
        if self.form == "context_fn":
            return self._checked(self._fn(ctx or tf.distribute.InputContext(
                1, 0, self._built.strategy.num_replicas_in_sync)))
        if self.form == "numpy":
            return service_lib.numpy_batches(self._numpy, first_pass, passes)
        return self._checked(self._make())

    def _decide_visits(self, shard, role):
        """Under parameter servers, loops name the batches they train (kerastrain.distribute.ps.visits)
        unless a worker splits its batches over replicas, a pipeline is empty, or
        shard='off' opts out (each worker reads its own pipeline, or all the data)."""
        ps = self._built.is_parameter_server
        self._reader = None
        self._local = None  # local_dataset(), made once
        self._off = shard == "off"
        self.exact = (ps and self._built.strategy.num_replicas_in_sync == 1
                      and 0 not in self._sizes and not self._off and self._service is None)
        if ps and role == "training":
            self.plan = dataclasses.replace(self.plan, sentence=self._ps_account())

    def _ps_account(self):
        """What holds under parameter servers: exact visits, or why not."""
        if self.exact:
            if self.form == "context_fn":
                what = (f"dataset_fn(ctx) is called once per input pipeline ({self._pipelines} in "
                        "all); every worker reads every pipeline, taking their batches in turn")
            else:
                what = "every worker reads the whole data, in one device's order"
            what += ", and trains the positions the coordinator gives each loop: every batch "
            if INFINITE in self._sizes:
                return what + ("of the data's (infinite) stream once, in order (a shuffle in the "
                               "pipeline must be seeded)")
            if UNKNOWN in self._sizes:
                return what + ("once per pass of the data (its size is unknown: an epoch is "
                               "`steps_per_epoch` batches of the repeated data; a shuffle in the "
                               "pipeline must be seeded)")
            return what + "once per pass of the data (a shuffle in the pipeline must be seeded)"
        why = ("shard='off' asked for it, exact visits off" if self._off
               else "a pipeline is empty" if 0 in self._sizes
               else "each worker splits its batches over several replicas")
        return (f"{self.plan.sentence}; each worker reads its own shard ({why}): within an epoch "
                "examples may repeat or be skipped")

    # -- what the runners iterate ---------------------------------------------------

    def _checked(self, dataset, repeat=False):
        check_element_spec(dataset, self._argument)
        if repeat and cardinality(dataset) != INFINITE:
            dataset = dataset.repeat()
        return dataset

    def distributed(self, fresh=False):
        """A distributed dataset for synchronous strategies (iterate it once per pass).

        `fresh`: build it again, as a new run would (a recovery reads the data again
        from its first pass, and reshuffling follows how often the object was iterated).
        """
        if self._distributed is None or fresh:
            strategy = self._built.strategy
            # Batches are prefetched onto each replica's device by TensorFlow's default
            # `InputOptions(experimental_fetch_to_device=True)` (passing it explicitly
            # breaks CentralStorageStrategy in TF 2.21): a GPU step does not wait for a
            # host-to-device copy.
            if self._service is not None:
                account = service_lib.PassAccount(self._expected)

                def one_pass(k):
                    def through(ctx=None):
                        return self._tuned(self._service.consumer_dataset(
                            self._service_source(ctx, first_pass=k), account))
                    if self.form == "context_fn":
                        return strategy.distribute_datasets_from_function(through)
                    return strategy.experimental_distribute_dataset(
                        _with_policy(through(), "off"))
                self._distributed = service_lib.PerPass(one_pass)
            elif self._in_step:
                self._distributed = self._in_step()
            elif self.form == "context_fn":
                self._distributed = strategy.distribute_datasets_from_function(
                    lambda ctx: self._tuned(self._checked(self._fn(ctx))))
            else:
                dataset = self._tuned(_with_policy(self._make(), self.plan.policy))
                self._distributed = strategy.experimental_distribute_dataset(dataset)
        return self._distributed

    def _tuned(self, dataset):
        """`dataset` with kerastrain's tf.data options (`pipeline_lib.tuned`), logged once."""
        if not self._input_options:
            return dataset
        dataset, sentence = pipeline_lib.tuned(dataset, on_gpu=self._built.on_gpu)
        if not getattr(self, "_tuning_logged", False):
            self._tuning_logged = True
            _logging.tuning(f"{self._role} data: tf.data options tuned",
                            "%s data: tf.data options: %s (switch off with "
                            "tuning={'input_options': False})", self._role, sentence)
        return dataset

    def _worker_dataset(self, index, repeat=True):
        """Worker `index`'s (repeated) shard, built eagerly here or traced for that worker."""
        import tensorflow as tf

        if self.form == "context_fn":
            ctx = tf.distribute.InputContext(self._pipelines, index,
                                             self._built.strategy.num_replicas_in_sync)
            return self._checked(self._fn(ctx), repeat=repeat)
        dataset = _with_policy(self._make(), self.plan.policy)
        if self.plan.policy in ("file", "data"):
            dataset = _compat.auto_shard(dataset, self._pipelines, index)
        return self._checked(dataset, repeat=repeat)

    def per_worker_iterator(self):
        """Per-worker iterators under parameter servers; repeated, so they never run dry."""
        if self._per_worker is None:
            strategy = self._built.strategy
            if self._service is not None:
                numpy = self.form == "numpy"  # its source counts passes itself
                through = self._service.per_worker_fn(
                    self._service_source(passes=2 ** 40 if numpy else 1), repeat=not numpy)

                def make(index):
                    return strategy.distribute_datasets_from_function(lambda ctx: through())
            elif self.form == "dataset":
                # A dataset object lives here; workers get it as a serialised graph.
                graphs = [_compat.serialize_dataset(self._worker_dataset(i))
                          for i in range(self._pipelines)]
                spec = self.element_spec

                def make(index):
                    return strategy.distribute_datasets_from_function(
                        lambda ctx: _compat.deserialize_dataset(graphs[index], spec))
            else:
                def make(index):
                    return strategy.distribute_datasets_from_function(
                        lambda ctx: self._worker_dataset(index))
            with warnings.catch_warnings():
                # tf.data warns that dataset options are not known while tracing.
                warnings.simplefilter("ignore", UserWarning)
                self._per_worker = _compat.per_worker_iterator(
                    self._built.coordinator, strategy, make)
        return self._per_worker

    @property
    def drains(self) -> bool:
        """Under parameter servers through the tf.data service: an epoch of
        `steps_per_epoch=None` is one pass of a job every worker reads to its end
        (`ps_driver.PSDriver.run_pass`)."""
        return self._service is not None and self._built.is_parameter_server

    def pass_iterators(self):
        """Per-worker iterators over the next pass's job (one job, shared by every ps
        worker), and per-worker iterators yielding each worker's index."""
        strategy, coordinator = self._built.strategy, self._built.coordinator
        k, self.passes_read = self.passes_read, self.passes_read + 1
        source = (self._service_source(first_pass=k) if self.form == "numpy"
                  else self._service_source())
        through = self._service.pass_fn(source)
        with warnings.catch_warnings():
            # tf.data warns that dataset options are not known while tracing.
            warnings.simplefilter("ignore", UserWarning)
            iterator = _compat.per_worker_iterator(
                coordinator, strategy,
                lambda index: strategy.distribute_datasets_from_function(lambda ctx: through()))
            if self._worker_index is None:
                self._worker_index = visits.worker_indices(self._built)
        return iterator, self._worker_index

    def pass_ended(self, examples):
        """A pass read through the service trained `examples`: fewer than a pass has are
        reported (`service.PassAccount`)."""
        if self._account is None:
            self._account = service_lib.PassAccount(self._expected)
        self._account.ended(int(round(examples)))

    def reader(self):
        """The `visits.Reader` of exact visits under parameter servers (None: not exact)."""
        if not self.exact:
            return None
        if self._reader is None:
            finish = None
            if self.form == "numpy":
                make, finish = self._numpy.indices, self._numpy.gather
            elif self.form == "context_fn":
                import tensorflow as tf
                replicas = self._built.strategy.num_replicas_in_sync

                def make(j):
                    return self._checked(self._fn(tf.distribute.InputContext(
                        self._pipelines, j, replicas)))
            elif self.form == "dataset":
                graph = _compat.serialize_dataset(self._make())
                spec = self.element_spec

                def make(j):
                    return _compat.deserialize_dataset(graph, spec)
            else:
                def make(j):
                    return self._checked(self._make())
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                sizes = [size if size > 0 else None for size in self._sizes]
                self._reader = visits.Reader(self._built, sizes, make, finish,
                                             element_spec=self.element_spec)
        return self._reader

    def local_dataset(self):
        """The whole dataset read on this task (coordinator-side evaluation under PS).

        Made once and iterated anew for each evaluation, as `fit` iterates its
        `validation_data`: making it traces its functions, which a coordinator registers
        with every worker while holding the GIL, so with a frozen worker a new one each
        epoch would block every thread of the process (the stall watch's too).
        """
        import tensorflow as tf
        if self._local is None:
            if self.form == "context_fn":
                self._local = self._checked(self._fn(tf.distribute.InputContext(1, 0, 1)))
            else:
                self._local = self._checked(self._make())
        return self._local


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
        expected = [len(t.shape) for t in tf.nest.flatten(inputs)] if inputs else None
    except (AttributeError, TypeError, ValueError):
        expected = None
    _check_targets(element_spec, model, steps)
    got = [s.shape.rank for s in tf.nest.flatten(split_batch(element_spec)[0])]
    if expected and len(expected) == len(got) and all(
            g is not None and g == e - 1 for g, e in zip(got, expected)):
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
