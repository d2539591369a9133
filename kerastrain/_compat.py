"""The only module that touches private Keras/TensorFlow APIs.

Checked against TensorFlow 2.16-2.21 and Keras 3.10-3.15 (tools/check_versions.sh runs
the smoke subset on the lowest; Keras 3.9 and older scale losses differently under
tf.distribute, so they are refused at import). Each helper says why
the private name is needed; when Keras grows a public equivalent, switch here.
"""

from __future__ import annotations

import contextlib
import os

import keras

LOWEST_KERAS = (3, 10)


def _check_keras_version(version):
    """Refuse a Keras older than kerastrain's tested lowest, whatever pip was told.

    Before Keras 3.10 a `Loss` called in a replica context did not divide by the
    number of replicas in the same way, so under mirrored the objective would be
    silently wrong.
    """
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    if tuple(parts) < LOWEST_KERAS:
        raise ImportError(
            f"kerastrain needs Keras >= {'.'.join(map(str, LOWEST_KERAS))}: older Keras 3 "
            f"releases scale losses differently under tf.distribute, so training would be "
            f"silently different. Received: keras {version}. Upgrade with "
            f"`pip install -U 'keras>={'.'.join(map(str, LOWEST_KERAS))}'`.")


_check_keras_version(keras.__version__)


_SKIPPING_REMOVAL_AT_EXIT = []


def skip_function_removal_at_exit():
    """At interpreter exit, do not remove this process's functions from the cluster one by one.

    Once a context is connected to a cluster, deleting a function removes it from every
    remote task too, and one traced before connecting (a mirrored Trainer's loop, a dataset's
    map) was never there: each logs "Failed to remove function remotely" (about 40 lines at
    the exit of a script that trained under mirrored, then ps). TensorFlow's own switch for
    module teardown, `atomic_function.RUNTIME_FUNCTION_REFS = None`, skips the removal;
    the process is ending anyway. Checked on TF 2.16-2.21.
    """
    if _SKIPPING_REMOVAL_AT_EXIT:
        return
    import atexit

    def skip():
        from tensorflow.python.eager.polymorphic_function import atomic_function
        atomic_function.RUNTIME_FUNCTION_REFS = None
    atexit.register(skip)
    _SKIPPING_REMOVAL_AT_EXIT.append(True)


def keep_local_functions_local():
    """Functions traced before this process connects to a cluster stay out of its reach.

    Once connected, deleting a function removes it from every remote task as well, where
    one traced before (an earlier Trainer's loop, still referenced: a notebook's previous
    `trainer`) never was, and TensorFlow logs an error for each ("Failed to remove function
    remotely ... non-existent function", two lines per remote task). One more reference on
    each live function's runtime entry means its deletion never reaches the cluster: its
    definition stays in this process's context (a few per earlier Trainer) until exit.
    TensorFlow's refcount `atomic_function.RUNTIME_FUNCTION_REFS`; checked on TF 2.16-2.21.
    """
    from tensorflow.python.eager.polymorphic_function import atomic_function
    refs = atomic_function.RUNTIME_FUNCTION_REFS
    if refs:
        for key in list(refs):
            refs[key] += 1


def wait_at_barrier(name: str, timeout_ms: int) -> bool:
    """Wait until every task of the coordination service's cluster is here (multi-worker
    mirrored); False when the barrier failed (a peer gone, a timeout) or there is no
    service. TF 2.16-2.21 expose it on the eager context only."""
    from tensorflow.python.eager import context
    try:
        context.context().wait_at_barrier(name, timeout_ms)
    except Exception:  # noqa: BLE001 - any failure means: do not wait for peers
        return False
    return True


def compile_metrics(model):
    """The model's `CompileMetrics` container (or None): Keras 3 keeps it private, and
    kerastrain drives its stateless update with its own cross-replica reduction."""
    return getattr(model, "_compile_metrics", None)


def compile_loss(model):
    """The model's `CompileLoss` (holds per-output loss trackers), or None."""
    return getattr(model, "_compile_loss", None)


def layer_metrics(model):
    """Metrics the model's layers own and update in `call` (keras.io's endpoint layer:
    `self.accuracy_fn.update_state(...)`), which `model.metrics` lists after the compiled
    ones and `fit` logs: every metric with variables in `model.metrics` but the loss
    tracker, the compiled metrics container and the compiled loss's trackers."""
    loss = compile_loss(model)
    compiled = {id(m) for m in [getattr(model, "_loss_tracker", None), compile_metrics(model),
                                *(getattr(loss, "metrics", None) or [])] if m is not None}
    return [m for m in model.metrics if id(m) not in compiled and m.variables]


def symbolic_build(model, element_spec):
    """Create model, metric, loss and optimizer state from shapes only.

    `model.fit` does the same through `Trainer._symbolic_build`; calling it inside
    `strategy.scope()` places every variable the way the strategy wants before
    the first compiled step (creating them inside a `tf.function` under mirrored
    fails).
    """
    import tensorflow as tf

    def to_zeros(spec):
        shape = [1 if d is None else d for d in spec.shape]
        return tf.zeros(shape, spec.dtype)

    batch = tf.nest.map_structure(to_zeros, element_spec)
    model._symbolic_build(data_batch=batch)


def compile_args(model):
    """The arguments the user passed to `compile()`, as live objects.

    `get_compile_config()` serialises them, which fails for unregistered custom
    losses and metrics; the raw objects are kept in `_compile_config.config`.
    """
    config = getattr(model, "_compile_config", None)
    if config is None:
        return None
    return dict(getattr(config, "config", {}) or {})


def stateless_scope(mapping):
    return keras.StatelessScope(state_mapping=mapping)


@contextlib.contextmanager
def model_losses(model, losses):
    """While active, `model.losses` is `losses` (computed by the forward pass outside).

    kerastrain computes the compiled loss and metric deltas inside a stateless
    scope, where `Layer.losses` only sees losses recorded *in* that scope, so the
    `add_loss` / activity-regularizer losses of a forward pass run outside it
    would be dropped. Keras's own stateless (JAX) trainer hands them over the
    same way, through `Layer._losses_override`.
    """
    model._losses_override = list(losses)
    try:
        yield
    finally:
        model._losses_override = []


def replace_storage(variables, values):
    """Give Keras variables new TensorFlow storage, on this process's device, holding `values`.

    A model instance built before this process connected to a parameter-server
    cluster has its variables on `/job:localhost`, which then no longer exists
    ("Client for target /job:localhost... not found"). Keras's TensorFlow backend
    makes a variable's storage in `Variable._initialize`; calling it again with the
    trained values re-homes each variable, so the user's model object stays usable.
    """
    for variable, value in zip(variables, values):
        variable._value = None
        variable._initialize(value)


def rekey_optimizer(optimizer):
    """After `replace_storage` of the variables an optimizer was built for: key them again.

    Keras's TensorFlow optimizer finds a variable's slots by its TensorFlow variable's id
    (`_var_key`), taken at `build`; new storage is a new TensorFlow variable, which the
    optimizer would refuse as "Unknown variable" (checked on Keras 3.10-3.15).
    """
    if not optimizer.built:
        return
    optimizer._trainable_variables_indices = {
        optimizer._var_key(v): i for i, v in enumerate(optimizer._trainable_variables)}


def class_weight_to_sample_weights(y, class_weight):
    """Keras's own conversion of NumPy targets to per-example class weights (as `fit`)."""
    from keras.src.trainers.data_adapters import data_adapter_utils
    return data_adapter_utils.class_weight_to_sample_weights(y, class_weight)


def class_weight_map_fn(class_weight):
    """Keras's own `Dataset.map` function that adds class weights to `(x, y)` batches."""
    from keras.src.trainers.data_adapters import tf_dataset_adapter
    return tf_dataset_adapter.make_class_weight_map_fn(class_weight)


def compute_loss(model, x, y, y_pred, sample_weight, training):
    """`model.compute_loss`, also when a user's override has no `training` argument.

    Keras 3.3 added `training=`; its `_compute_loss` calls an override with or without
    it, as `model.fit` does (kerastrain needs Keras >= 3.10, which has it).
    """
    return model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                               training=training)


def learning_rate_schedule(optimizer):
    """The optimizer's LearningRateSchedule, or None for a fixed (variable) rate.

    Keras 3 keeps it only as `optimizer._learning_rate`; `optimizer.learning_rate`
    evaluates it at the *next* step, and we log the rate a step actually used.
    """
    lr = getattr(optimizer, "_learning_rate", None)
    return lr if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule) else None


def stop_preemption_handler(handler):
    """Stop a PreemptionCheckpointHandler's watcher threads now.

    TensorFlow stops them only in `__del__` (checked in TF 2.16-2.21); a Trainer
    that finished `fit` must not leave threads watching for a signal nobody acts on.
    """
    for name in ("_stop_poll_termination_signal_thread",
                 "_stop_cluster_wise_termination_watcher_thread"):
        stop = getattr(handler, name, None)
        if stop is not None:
            stop()


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

    import tensorflow as tf
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


def serialize_dataset(dataset, external_state="warn"):
    """A dataset's graph as a string tensor (a serialised GraphDef).

    "warn" to rebuild it on another task (state such as a shuffle's seed
    generator is re-created there); "ignore" to read its structure only.
    """
    import tensorflow as tf
    return tf.raw_ops.DatasetToGraphV2(
        input_dataset=tf.data.experimental.to_variant(dataset),
        external_state_policy={"warn": 0, "ignore": 1}[external_state],
        strip_device_assignment=True)


def deserialize_dataset(graph, element_spec):
    import tensorflow as tf
    return tf.data.experimental.from_variant(
        tf.raw_ops.DatasetFromGraph(graph_def=graph), element_spec)


def per_worker_iterator(coordinator, strategy, make):
    """One iterator per parameter-server worker, worker i's built by `make(i)`.

    `ClusterCoordinator.create_per_worker_dataset` traces one function for all
    workers, so no worker can know its index and take its own shard. This builds
    one concrete function per worker and registers it with that worker, which
    also re-creates it when the worker restarts (TF 2.16-2.21: `_cluster.workers`,
    `Worker.create_resource`, `PerWorkerDistributedIterator`, and the iterator
    type-spec patch that `PerWorkerDatasetFromDatasetFunction.__iter__` does).
    """
    import tensorflow as tf
    from tensorflow.python.distribute import input_lib
    from tensorflow.python.distribute.coordinator import values as values_lib

    remotes = []
    for index, worker in enumerate(coordinator._cluster.workers):
        dataset_fn = tf.function(lambda index=index: make(index)).get_concrete_function()
        remote = worker.create_resource(lambda fn=dataset_fn: iter(fn()))
        remote._type_spec = input_lib.get_iterator_spec_from_dataset(
            strategy, dataset_fn.structured_outputs)
        remotes.append(remote)
    return values_lib.PerWorkerDistributedIterator(tuple(remotes))


@contextlib.contextmanager
def instance_override(obj, name, fn):
    """Temporarily replace one method of one object (not of its class).

    Used to route a Keras optimizer's slot creation (`add_variable_from_reference`,
    which every built-in optimizer's `build` calls per variable) through kerastrain
    for partitioned variables; Keras has no hook for where slots are placed.
    """
    object.__setattr__(obj, name, fn)
    try:
        yield
    finally:
        obj.__dict__.pop(name, None)


@contextlib.contextmanager
def partitioned_like(parts):
    """Variables created inside are `ShardedVariable`s split like `parts`, shard by shard.

    Each shard is created next to the matching shard of `parts` (the parameter-server
    strategy does not partition a variable created with `colocate_with`), so a slot
    and its variable's shard share a parameter server.
    """
    import tensorflow as tf

    def creator(next_creator, **kwargs):
        initial = kwargs.get("initial_value")
        if callable(initial):
            initial = initial()
        initial = tf.convert_to_tensor(initial)
        name = kwargs.get("name") or "Variable"
        shards, offset = [], 0
        for j, part in enumerate(parts):
            rows = int(part.shape[0])
            # `colocate_with` is the strategy's own "place it there, do not partition".
            shards.append(next_creator(**dict(
                kwargs, initial_value=initial[offset:offset + rows], shape=part.shape,
                name=f"{name}/part_{j}", colocate_with=part)))
            offset += rows
        return tf.__internal__.distribute.ShardedVariable(shards, name=name)

    with tf.variable_creator_scope(creator):
        yield


def share_optimizer_state(update, optimizer):
    """Make `update` count steps and read its learning rate from `optimizer`.

    Keras 3 keeps both in private attributes (`_iterations`, `_learning_rate`);
    sharing the objects keeps schedules, bias corrections and learning-rate
    callbacks exact for the per-shard update optimizer.
    """
    object.__setattr__(update, "_iterations", optimizer._iterations)
    object.__setattr__(update, "_learning_rate", optimizer._learning_rate)


def not_copied_by_async_save(checkpoint) -> list[str]:
    """What in `checkpoint` TensorFlow's asynchronous save would not copy (it logs the
    object and leaves it out of the file): objects that save themselves but whose class has
    no `_copy_trackable_to_cpu`, and objects of the checkpoint's graph whose saving is
    overridden on the instance (the copy would be of the class's kind). The rule is
    TensorFlow's own (`async_checkpoint_helper._get_all_trackables`)."""
    import tensorflow as tf
    from tensorflow.python.trackable import base

    saves = ("_serialize_to_tensors", "_gather_saveables_for_checkpoint")
    missing = []
    for obj in tf.train.TrackableView(checkpoint).descendants():
        if obj is checkpoint:
            continue
        if any(name in getattr(obj, "__dict__", {}) for name in saves):
            missing.append(f"{getattr(obj, 'name', type(obj).__name__)} (saved whole)")
            continue
        classes = [c for c in type(obj).mro() if c is not base.Trackable]
        if any(name in c.__dict__ for c in classes for name in saves) and not any(
                "_copy_trackable_to_cpu" in c.__dict__ for c in classes):
            missing.append(type(obj).__name__)
    return missing


def keras_variables_copy_for_async_save():
    """Let TensorFlow's asynchronous save copy Keras variables more than once.

    Keras 3 (3.10 to 3.16.dev at least) maps a variable to a new `tf.Variable` made from
    its CPU copy each time the copy runs; the copy runs in a `tf.function`, which refuses a
    second variable, so the second asynchronous save fails ("tf.function only supports
    singleton tf.Variables"), and the wrapper would hold the first save's values anyway.
    The variable's CPU copy (refreshed by TensorFlow at each save) is what the Keras
    variable saves, under the same key: mapping the variable to it is the fix. Applied once,
    on the first checkpoint written in the background.
    """
    from keras.src.backend import Variable

    def _copy_trackable_to_cpu(self, object_map):
        self.value._copy_trackable_to_cpu(object_map)
        object_map[self] = object_map[self.value]

    if getattr(Variable._copy_trackable_to_cpu, "_kerastrain", False):
        return
    _copy_trackable_to_cpu._kerastrain = True
    Variable._copy_trackable_to_cpu = _copy_trackable_to_cpu


def take_async_save_error(checkpoint):
    """The error of `checkpoint`'s last asynchronous write, cleared (None: none). TensorFlow
    keeps it until the next save and `sync()` does not raise it."""
    helper = getattr(checkpoint, "_async_checkpointer_impl", None)
    error = getattr(helper, "_async_error", None)
    if error is not None:
        helper._async_error = None
    return error


class TracedCheckpointWrite:
    """Writes of one `tf.train.Checkpoint` through one `tf.function`, traced again only when
    the checkpoint's objects change.

    Eager `Checkpoint.write` over variables on several tasks (parameter servers) traces a
    new function at every save (`functional_saver.MultiDeviceSaver.save`: "re-create
    SaveableObjects each time") and registers it with every task of the cluster, removing
    the previous one, while holding the GIL: a frozen worker then blocks the chief at its
    next checkpoint. Traced once, later saves send nothing new to the workers. Used as
    `with writer.around(): manager.save(...)`: the manager's numbering, state file and
    rotation stay TensorFlow's (its callbacks run here, with the written path).
    """

    def __init__(self, checkpoint):
        self.checkpoint = checkpoint
        self._objects = None   # ids of the checkpoint's objects when `_fn` was traced
        self._fn = None

    def _write(self, file_prefix, options=None):
        import tensorflow as tf
        from tensorflow.python.checkpoint import checkpoint as checkpoint_lib

        options = options or tf.train.CheckpointOptions()
        if options.experimental_enable_async_checkpoint:
            raise ValueError("TracedCheckpointWrite writes in the foreground only")
        objects = tuple(id(o) for o in tf.train.TrackableView(self.checkpoint).descendants())
        if objects != self._objects:
            checkpoint = self.checkpoint

            @tf.function(autograph=False, jit_compile=False)
            def write(prefix):
                return checkpoint_lib.Checkpoint._write(checkpoint, prefix)

            self._objects, self._fn = objects, write
        tf.io.gfile.makedirs(os.path.dirname(file_prefix))  # as the eager write does
        path = self._fn(tf.constant(file_prefix)).numpy().decode()
        if options.experimental_write_callbacks:
            checkpoint_lib._execute_callbacks(options.experimental_write_callbacks, path)
        return path

    @contextlib.contextmanager
    def around(self):
        """The checkpoint's `_write` (what `CheckpointManager.save` calls) goes through
        the traced function inside."""
        with instance_override(self.checkpoint, "_write", self._write):
            yield


def checkpoint_whole(sharded):
    """Checkpoint a `ShardedVariable` as one whole variable, restorable into any split.

    A Keras variable holding a `ShardedVariable` asks it for `_serialize_to_tensors`,
    which TensorFlow implements only in its legacy form (Keras then falls back to
    saving the object as one tensor, which fails for want of a device). Saving the
    whole value under the key a one-device run uses makes the checkpoint restore
    into any number of shards, or into a model without partitioning; restoring
    splits it by rows. (Slices of one variable would avoid the whole copy, but
    TensorFlow's restore path for Keras variables hands back one slice only.)
    The whole value is assembled on the first shard's parameter server.
    """
    import tensorflow as tf
    from tensorflow.python.checkpoint import tensor_callable

    key = "VARIABLE_VALUE"
    parts = list(sharded.variables)
    device = parts[0].device

    def read():
        with tf.device(device):
            return tf.concat([p.read_value() for p in parts], axis=0)

    def serialize():
        # A callable, read at each save (as TensorFlow's own variables do).
        return {key: tensor_callable.Callable(read, dtype=sharded.dtype, device=device)}

    def restore(restored):
        value, pieces, offset = restored[key], [], 0
        for part in parts:
            rows = int(part.shape[0])
            pieces.append(part._restore_from_tensors({key: value[offset:offset + rows]}))
            offset += rows
        return tf.group(pieces)

    object.__setattr__(sharded, "_serialize_to_tensors", serialize)
    object.__setattr__(sharded, "_restore_from_tensors", restore)


def set_variable_partitioner(strategy, partitioner):
    """Change the partitioner of an existing `ParameterServerStrategy`.

    A process connects to one in-process cluster through one strategy object
    (kerastrain caches it); the partitioner is a constructor argument, kept in
    `extended._variable_partitioner` and read only when variables are created.
    """
    strategy.extended._variable_partitioner = partitioner


def variable_owners(model) -> dict:
    """{id(variable): layer} for the innermost layer that owns each of the model's variables.

    Keras 3 walks sublayers only through `_flatten_layers` and keeps a layer's own
    variables in `_trainable_variables` / `_non_trainable_variables`; errors about a
    partitioned variable name its layer.
    """
    owners = {}
    for layer in model._flatten_layers(include_self=True):
        for v in list(getattr(layer, "_trainable_variables", [])) + list(
                getattr(layer, "_non_trainable_variables", [])):
            owners[id(v)] = layer
    return owners


def lookup_layers(model):
    """Keras's lookup layers in `model` (StringLookup, IntegerLookup, the one inside
    TextVectorization). Their vocabulary is a `tf.lookup` table, not a variable, so
    `get_weights`/`set_weights` and `clone_model` do not carry an adapted one; the class
    is `keras.src.layers.preprocessing.index_lookup.IndexLookup` (Keras 3.3-3.15)."""
    from keras.src.layers.preprocessing.index_lookup import IndexLookup
    return [layer for layer in model._flatten_layers(include_self=False)
            if isinstance(layer, IndexLookup)]


def table_job(table):
    """The job of a lookup table's resource (None for a per-worker `DistributedTable`)."""
    import tensorflow as tf
    if getattr(table, "is_distributed_table", False):
        return None
    handle = getattr(table, "_resource_handle", None)
    return tf.DeviceSpec.from_string(getattr(handle, "device", "") or "").job


def model_supports_jit(model):
    """Keras's own test of whether every layer supports XLA (and op determinism is off):
    `keras.src.trainers.trainer.model_supports_jit`, private in Keras 3.3-3.15; the
    rule behind `jit_compile="auto"`."""
    from keras.src.trainers.trainer import model_supports_jit as supports
    return supports(model)


def slices_then_batch(dataset):
    """`(tensors, element_spec, batch_size, drop_remainder, prefetch_buffer, options)` when
    `dataset` is exactly `from_tensor_slices(tensors).batch(b)[.prefetch(p)][.with_options()]`
    of dense tensors, else None.

    tf.data has no public way to read a pipeline's stages; the classes and fields read
    here (`_TensorSliceDataset._tensors`, `_BatchDataset._batch_size/_drop_remainder`,
    `_PrefetchDataset._buffer_size`, `_OptionsDataset._input_dataset`) are those of
    TensorFlow 2.16-2.21. Anything else (a shuffle, a map, a parallel batch) gives None.
    """
    import tensorflow as tf
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


def iteration_counter(optimizer):
    """The optimizer's own count of `apply` calls (a variable).

    With `gradient_accumulation_steps`, Keras 3.15's public `optimizer.iterations`
    is a tensor (this count // the steps), and schedules read `_iterations`, the
    batches seen; kerastrain's accumulation keeps `_iterations` as Keras does.
    """
    return getattr(optimizer, "inner_optimizer", optimizer)._iterations


@contextlib.contextmanager
def atomic_adds(variables):
    """While tracing a parameter-server step: `assign_add` / `assign_sub` of these Keras
    variables (a layer's counters and running totals, metrics' states) are atomic.

    Keras 3.10-3.15's `Variable.assign_add` is `assign(self + value)`, a read then a write:
    with two workers updating a variable on a parameter server at once, updates are lost
    (a keras.io counting layer counted 3,392 of 6,144 examples; the optimizer's count of its
    updates, which Adam's bias correction and schedules read, 50 of 60). TensorFlow's `assign_add`
    on the variable's `.value` is one op on the parameter server. Plain `assign` stays what
    it is (last writer wins). Partitioned variables keep Keras's way.
    """
    import tensorflow as tf
    with contextlib.ExitStack() as stack:
        for variable in variables:
            value = getattr(variable, "value", None)
            if not isinstance(value, tf.Variable) or hasattr(value, "variables"):
                continue
            for name, sign in (("assign_add", 1), ("assign_sub", -1)):
                stack.enter_context(instance_override(
                    variable, name, _atomic_add(variable, value, name, sign)))
        yield


def _atomic_add(variable, value, name, sign):
    import tensorflow as tf
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    keras_way = getattr(type(variable), name)

    def add(delta):
        if in_stateless_scope():  # kerastrain's own metric step: updates are collected there
            return keras_way(variable, delta)
        delta = tf.cast(tf.convert_to_tensor(delta), variable.dtype)
        return value.assign_add(delta) if sign > 0 else value.assign_sub(delta)
    return add


@contextlib.contextmanager
def learning_rate_at(optimizer, iteration):
    """While tracing an update: a learning-rate schedule reads `iteration`.

    Keras 3.15 evaluates a schedule at `_iterations` (`_get_current_learning_rate`);
    when it accumulates, that is the index of the group's last batch, which
    kerastrain's accumulating update gives here (Keras has no argument for it).
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    schedule = getattr(inner, "_learning_rate", None)
    if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        yield
        return
    with instance_override(inner, "_get_current_learning_rate", lambda: schedule(iteration)):
        yield

# -- gradient clipping of the summed gradient -----------------------------------------------

_CLIPPING = ("clipnorm", "global_clipnorm", "clipvalue")


def moving_averages(optimizer) -> list:
    """(variable, its moving average) of an optimizer with `use_ema=True`, else []."""
    if not getattr(optimizer, "use_ema", False):
        return []
    return [(v, a) for v, a in zip(optimizer._trainable_variables,
                                   optimizer._model_variables_moving_average) if a is not None]


def clips_gradients(optimizer) -> bool:
    """Whether the optimizer (a LossScaleOptimizer's inner one) clips gradients."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return any((getattr(inner, name, None) or 0) > 0 for name in _CLIPPING)


def clip_as_optimizer(optimizer, grads):
    """`grads` clipped as the optimizer's own `apply` would clip them (Keras 3.10-3.15:
    `BaseOptimizer._clip_gradients`, on the unscaled gradients of a LossScaleOptimizer,
    whose scale, a power of two, is divided out and multiplied back exactly)."""
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is None:
        return optimizer._clip_gradients(grads)
    scale = optimizer.scale_loss(1.0)
    unscaled = [g if g is None else g / scale for g in grads]
    return [g if g is None else g * scale for g in inner._clip_gradients(unscaled)]


@contextlib.contextmanager
def clipping_off(optimizer):
    """The optimizer's `apply` without its clipping (the gradients are clipped already)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    with instance_override(inner, "_clip_gradients", lambda grads: grads):
        yield


# -- lazy (row-sparse) optimizers ---------------------------------------------------------

class RowSparseWeightDecay:
    """Mixin for a Keras optimizer: row gradients stay rows through decay and clipping.

    Keras applies weight decay to every variable, whole, before the update
    (`BaseOptimizer._backend_apply_gradients` -> `_apply_weight_decay`, which asks
    `_use_weight_decay(variable)`); it has no public hook that sees the gradients.
    For a variable whose gradient is `tf.IndexedSlices` this mixin says "no decay"
    there, and the lazy update decays the touched rows itself (`decays_weights`).
    With `gradient_accumulation_steps` Keras sums gradients into dense accumulators,
    so every update is dense and decays as Keras does. `global_clipnorm` would make
    row gradients dense (`_clip_gradients`); here it scales the rows' values.
    Private names checked in Keras 3.10-3.15: `_backend_apply_gradients`,
    `_use_weight_decay`, `_clip_gradients`, `_var_key`, `clip_by_global_norm`.
    """

    def _backend_apply_gradients(self, grads, trainable_variables):
        import tensorflow as tf
        sparse = frozenset()
        if not self.gradient_accumulation_steps:
            sparse = frozenset(self._var_key(v) for g, v in zip(grads, trainable_variables)
                               if isinstance(g, tf.IndexedSlices))
        object.__setattr__(self, "_kerastrain_row_sparse", sparse)
        try:
            return super()._backend_apply_gradients(grads, trainable_variables)
        finally:
            object.__setattr__(self, "_kerastrain_row_sparse", frozenset())

    def _use_weight_decay(self, variable):
        if self._var_key(variable) in getattr(self, "_kerastrain_row_sparse", ()):
            return False
        return super()._use_weight_decay(variable)

    def _clip_gradients(self, grads):
        # Keras's `clip_by_global_norm` makes row gradients dense; this is the same
        # formula on the rows' values (duplicates summed first, so their norm is the
        # dense gradient's), and rows stay rows. Other clipping keeps rows already.
        import tensorflow as tf
        from keras.src.optimizers.base_optimizer import clip_by_global_norm
        if (self.clipnorm and self.clipnorm > 0) or not (
                self.global_clipnorm and self.global_clipnorm > 0) or not any(
                isinstance(g, tf.IndexedSlices) for g in grads):
            return super()._clip_gradients(grads)
        grads = [unique_rows(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        values = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads]
        clipped = clip_by_global_norm(values, self.global_clipnorm)
        return [tf.IndexedSlices(c, g.indices, g.dense_shape) if isinstance(g, tf.IndexedSlices)
                else c for g, c in zip(grads, clipped)]


def unique_rows(gradient, dtype=None):
    """A `tf.IndexedSlices` with each row once, its gradients summed (cast to `dtype`)."""
    import tensorflow as tf
    rows, position = tf.unique(gradient.indices)
    values = gradient.values if dtype is None else tf.cast(gradient.values, dtype)
    values = tf.math.unsorted_segment_sum(values, position, tf.shape(rows)[0])
    return tf.IndexedSlices(values, rows, gradient.dense_shape)


def decays_weights(optimizer, variable) -> bool:
    """Whether Keras would decay `variable` (weight_decay set, not excluded by the user)."""
    if optimizer.weight_decay is None:
        return False
    return super(RowSparseWeightDecay, optimizer)._use_weight_decay(variable)


def optimizer_slot(optimizer, kind, variable):
    """The slot `kind` of `variable` ("momentums", "velocities", "velocity_hats",
    "accumulators"): Keras's built-in optimizers keep each kind in a private list
    (`Adam._momentums`...) indexed by `_get_variable_index` (Keras 3.10-3.15)."""
    return getattr(optimizer, f"_{kind}")[optimizer._get_variable_index(variable)]

def flatten_metrics_in_order(model, logs):
    """`model.evaluate(..., return_dict=False)`'s list (or scalar) from a logs dict.

    Keras orders the values by the model's metrics, its compiled metrics expanded,
    in `Trainer._flatten_metrics_in_order` (checked on Keras 3.10-3.15).
    """
    return model._flatten_metrics_in_order(logs)


def optimizer_strategy_scope(optimizer):
    """The scope of the strategy a Keras optimizer was made under (its private
    `_distribution_strategy`, Keras 3.10-3.15), where its variables must be made; a null
    context for the default strategy or when already inside it."""
    import tensorflow as tf
    strategy = getattr(optimizer, "_distribution_strategy", None)
    if strategy is None or strategy is tf.distribute.get_strategy() or \
            type(strategy).__name__ == "_DefaultDistributionStrategy":
        return contextlib.nullcontext()
    return strategy.scope()


def keras_mask(tensor):
    """The Keras mask a layer attached to `tensor` (`Embedding(mask_zero=True)` and the
    layers after it), or None: `keras.src.backend.get_keras_mask` (Keras 3.5-3.15), not
    exported."""
    from keras.src.backend import get_keras_mask
    return get_keras_mask(tensor)


def all_layers(model):
    """Every layer nested in `model`, itself excluded (Keras 3's own walk, `_flatten_layers`,
    Keras 3.10-3.15)."""
    return list(model._flatten_layers(include_self=False))


def sublayers_built(model) -> bool:
    """Whether every layer inside `model` (not the model itself) has its variables.

    `Layer._flatten_layers` is Keras's own walk over nested layers (Keras 3.10-3.15).
    """
    return all(layer.built for layer in model._flatten_layers(include_self=False))


def sharded_variable_class():
    """TensorFlow's ShardedVariable class (what a partitioned variable is under ps)."""
    import tensorflow as tf
    return tf.__internal__.distribute.ShardedVariable


def service_worker_port(worker) -> int:
    """The port a tf.data service `WorkerServer` listens on (it keeps its address private)."""
    return int(worker._address.rsplit(":", 1)[1])
