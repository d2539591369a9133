"""tf.distribute and eager-context internals: a cluster's functions, ps workers, variables."""

from __future__ import annotations

import contextlib

import tensorflow as tf

from kerastrain._compat.overrides import instance_override


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


def without_deprecation_notes():
    """A context in which TensorFlow prints no deprecation notes (`deprecation.silence`,
    private; checked on 2.21). For TensorFlow's own use of what it deprecated: its
    PreemptionCheckpointHandler reads its deprecated `total_run_calls` when it saves after a
    SIGTERM, and every worker printed six lines about it, which no user can act on."""
    from tensorflow.python.util import deprecation
    return deprecation.silence()


def per_worker_iterator(coordinator, strategy, make):
    """One iterator per parameter-server worker, worker i's built by `make(i)`.

    `ClusterCoordinator.create_per_worker_dataset` traces one function for all
    workers, so no worker can know its index and take its own shard. This builds
    one concrete function per worker and registers it with that worker, which
    also re-creates it when the worker restarts (TF 2.16-2.21: `_cluster.workers`,
    `Worker.create_resource`, `PerWorkerDistributedIterator`, and the iterator
    type-spec patch that `PerWorkerDatasetFromDatasetFunction.__iter__` does).
    """
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
def partitioned_like(parts):
    """Variables created inside are `ShardedVariable`s split like `parts`, shard by shard.

    Each shard is created next to the matching shard of `parts` (the parameter-server
    strategy does not partition a variable created with `colocate_with`), so a slot
    and its variable's shard share a parameter server.
    """
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


def set_variable_partitioner(strategy, partitioner):
    """Change the partitioner of an existing `ParameterServerStrategy`.

    A process connects to one in-process cluster through one strategy object
    (kerastrain caches it); the partitioner is a constructor argument, kept in
    `extended._variable_partitioner` and read only when variables are created.
    """
    strategy.extended._variable_partitioner = partitioner


def sharded_variable_class():
    """TensorFlow's ShardedVariable class (what a partitioned variable is under ps)."""
    return tf.__internal__.distribute.ShardedVariable


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
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    keras_way = getattr(type(variable), name)

    def add(delta):
        if in_stateless_scope():  # kerastrain's own metric step: updates are collected there
            return keras_way(variable, delta)
        delta = tf.cast(tf.convert_to_tensor(delta), variable.dtype)
        return value.assign_add(delta) if sign > 0 else value.assign_sub(delta)
    return add


def quiet_retracing(function):
    """`function` (a `tf.function`), kept out of TensorFlow's "N out of the last N calls
    triggered tf.function retracing" warning: `Function._omit_frequent_tracing_warning`
    (private; TensorFlow sets it on its restored functions; checked on 2.21). For a function
    made anew per object on purpose (one per TensorBoard writer, which captures the writer;
    one per model's metrics), each traced once: the warning counts every function made from
    the same code as one and would tell the user of a sweep of Trainers in one process to
    fix a loop that is not theirs."""
    function._omit_frequent_tracing_warning = True
    return function
