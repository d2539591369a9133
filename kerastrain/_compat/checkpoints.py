"""Checkpoint internals: asynchronous saves of Keras variables, traced writes, sharded variables."""

from __future__ import annotations

import contextlib
import os

import tensorflow as tf

from kerastrain._compat.overrides import instance_override


def not_copied_by_async_save(checkpoint) -> list[str]:
    """What in `checkpoint` TensorFlow's asynchronous save would not copy (it logs the
    object and leaves it out of the file): objects that save themselves but whose class has
    no `_copy_trackable_to_cpu`, and objects of the checkpoint's graph whose saving is
    overridden on the instance (the copy would be of the class's kind). The rule is
    TensorFlow's own (`async_checkpoint_helper._get_all_trackables`)."""
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
