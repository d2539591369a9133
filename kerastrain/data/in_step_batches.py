"""Batches read inside the compiled loop from tensors in memory (`tuning.in_step_batches`).

For one replica on one worker, two inputs are whole tensors in memory read in a
known order: NumPy arrays (a seeded permutation per pass) and a pipeline that is
exactly `from_tensor_slices(arrays).batch(b)` (contiguous slices, as the README's
`dataset_fn` writes it). kerastrain then reads their batches in the compiled loop
itself, by index: a step slices (or gathers) batch i from the tensors, with no
tf.data iterator and no input thread. On 2 cores that thread's wake-ups competed
with the model's matrix multiplications (docs/performance_history.md). The batches and
their order are those of the pipelines they replace (tested).

`source` decides (and logs) whether an input is read so; `InStepBatches` is the
input, and `iter()` on it begins a pass and returns an iterator on which the
compiled loops call `get_next_as_optional()`, as on a tf.data iterator, or, knowing
the positions ahead, `read_ahead()`, `batch_at(position)` and one `advance(steps)`. That
iterator is a value (an ExtensionType) holding the tensors, the pass's order and
the handle of a position variable: a loop is traced for its type, once.
"""

# No `from __future__ import annotations`: an ExtensionType reads its fields' annotations
# as types, not strings.
import concurrent.futures
import contextlib
import functools
import logging

import numpy as np
import tensorflow as tf

from kerastrain import _logging

logger = logging.getLogger("kerastrain")

# On a GPU the tensors are copied to device memory once, up to this size; larger data
# stays with tf.data, which prefetches each batch to the device (a host gather inside
# the step would make the device wait for the copy).
GPU_BYTES = 1 << 30


def placement(nbytes, devices, strings=False):
    """`(device, why_not)`: where the tensors go for in-step reading (None: where they
    are), or why tf.data keeps the input.

    One replica only. On a CPU the tensors stay where they are. On a GPU they are
    copied to its memory once, when they take at most `GPU_BYTES` and hold no
    `strings` (which a GPU cannot hold).
    """
    if len(devices) != 1:
        return None, f"{len(devices)} replicas on this worker"
    device = str(devices[0])
    if "GPU" not in device.upper():
        return None, None
    if strings:
        return None, "string arrays cannot be copied to a GPU"
    if nbytes > GPU_BYTES:
        return None, (f"the arrays take {nbytes / 2 ** 30:.1f} GiB, over the "
                      f"{GPU_BYTES / 2 ** 30:.0f} GiB copied to a GPU")
    return device, None


def source(numpy, probe, element_spec, devices, role):
    """`() -> InStepBatches` for an input read inside the compiled loop, or None; logged.

    `numpy`: the input's `numpy_data.NumpyData`, or None for a pipeline (`probe`), which
    must be exactly `from_tensor_slices(arrays).batch(b)[.prefetch(p)]` of eager
    tensors. `devices`: the worker's replica devices (one replica only).
    """
    from kerastrain import _compat
    if numpy is not None:
        tensors, size, drop = numpy.variables, numpy.batch_size, False
        what = ("NumPy arrays gathered by a seeded permutation per pass" if numpy.shuffle
                else "NumPy arrays sliced in order")
    else:
        found = _compat.slices_then_batch(probe)
        if found is None:
            return None
        tensors, _, size, drop, _, _ = found
        size, drop = tf.get_static_value(size), tf.get_static_value(drop)
        if size is None or drop is None or any(tf.is_symbolic_tensor(t) for t in tensors):
            return None
        size, drop = int(size), bool(drop)
        what = "from_tensor_slices(...).batch(...) sliced in order"
    nbytes = sum(int(np.prod(t.shape)) * t.dtype.size for t in tensors)
    device, why_not = placement(nbytes, devices,
                                strings=any(t.dtype == tf.string for t in tensors))
    if why_not:
        _logging.tuning(f"{role} data: read by tf.data",
                        "%s data: read by tf.data, not inside the compiled loop: %s", role,
                        why_not)
        return None
    orders = numpy.order_drawer if numpy is not None and numpy.shuffle else None
    _logging.tuning(f"{role} data: read inside the compiled loop",
                    "%s data: read inside the compiled loop, one batch per step, no tf.data "
                    "iterator: %s%s (switch off with tuning={'in_step_batches': False})",
                    role, what, f", copied once to {device}" if device else "")

    def make():
        return InStepBatches(tensors, element_spec, size, drop_remainder=drop,
                             orders=orders() if orders else None, device=device)
    return make


class InStepBatches:
    """The passes of an in-memory input, read one batch per call inside compiled loops.

    `iter()` begins a pass and returns an iterator that is a `tf.experimental.ExtensionType`
    (as a tf.data iterator is a composite tensor): a compiled loop is traced for its
    type (shapes, dtypes, batch size), not for the object, so one trace serves every
    pass and every input of the same shapes, and no trace keeps an input's tensors.

    Args:
        tensors: the flat list of arrays (tensors or variables), same first dimension.
        element_spec: the batches' structure and specs; the parts are packed into it in
            `tf.nest.flatten` order (the order of `tensors`).
        batch_size: examples per batch; the last batch of a pass is partial unless
            `drop_remainder`.
        orders: None (batches in order: contiguous slices), or `() -> the next pass's
            permutation of the examples` (`NumpyData.order_drawer()`: the NumPy input's
            own, so passes are shuffled as its pipeline shuffles them).
        device: where the tensors are placed (None: where they are).
    """

    def __init__(self, tensors, element_spec, batch_size, *, drop_remainder=False,
                 orders=None, device=None):
        n = int(tensors[0].shape[0])
        self._size, self._drop = int(batch_size), bool(drop_remainder)
        rows = self._size if self._drop or n % self._size == 0 else None
        self.element_spec = tf.nest.map_structure(
            lambda s: tf.TensorSpec([rows] + s.shape.as_list()[1:], s.dtype), element_spec)
        self._structure = repr(self.element_spec)
        _STRUCTURES[self._structure] = self.element_spec
        self._orders = orders
        with tf.init_scope():
            with tf.device(device) if device else contextlib.nullcontext():
                # A variable's value is its buffer, not a copy (on the device it lives on).
                self._tensors = tuple(tf.identity(t) if device else tf.convert_to_tensor(t)
                                      for t in tensors)
                self._position = tf.Variable(0, dtype=tf.int64, trainable=False,
                                             name="in_step_position")
            self._in_order = tf.zeros([0], tf.int64)
        self._drawing = None  # the next pass's order, being drawn

    def _draw(self):
        with tf.init_scope():
            return self._orders()

    def __iter__(self):
        """Begin a pass: position 0, in the pass's order (shuffled input).

        Passes' orders are drawn in sequence, each one pass ahead on a thread of its
        own: drawing one (the pass's key from a tf.data iterator, then a permutation of
        every example) took 4-14 ms, on one core, between two passes that use both
        (about 1.3 ms of CPU since the permutation is a compiled function).
        """
        with tf.init_scope():
            order = self._in_order
            if self._orders is not None:
                if self._drawing is None:
                    self._drawing = _DRAWS.submit(self._draw)
                order = self._drawing.result()
                self._drawing = _DRAWS.submit(self._draw)
            self._position.assign(0)
        return _iterator_type()(self._tensors, self._position.handle, order,
                                self._orders is not None, self._size, self._drop,
                                self._structure)


_DRAWS = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kerastrain-order")
_STRUCTURES = {}  # repr(element_spec) -> element_spec: what an iterator packs its parts as


def _batch_at(iterator, position):
    """The batch at `position` (batches of `size`) of an `InStepIterator`'s pass."""
    n, size = iterator.tensors[0].shape[0], iterator.size
    start = position * size
    end = tf.minimum(start + size, n)
    if not iterator.shuffled:
        parts = [t[start:end] for t in iterator.tensors]
    else:
        index = iterator.order[start:end]
        parts = [tf.gather(t, index) for t in iterator.tensors]
    spec = iterator.element_spec
    for part, part_spec in zip(parts, tf.nest.flatten(spec)):
        part.set_shape(part_spec.shape)
    return tf.nest.pack_sequence_as(spec, parts)


@functools.cache
def _next_type():
    """What `get_next_as_optional` returns: has_value() and get_value(), as a tf Optional."""
    from kerastrain._tracing import unconverted

    class Next:
        def __init__(self, has, value):
            self._has, self._value = has, value

        @unconverted
        def has_value(self):
            return self._has

        @unconverted
        def get_value(self):
            return self._value
    return Next


@functools.cache
def _iterator_type():
    """The iterator's class, made on first use (defining it needs TensorFlow)."""
    import typing

    from kerastrain._tracing import unconverted
    Next = _next_type()

    class InStepIterator(tf.experimental.ExtensionType):
        """The reading position in a pass of in-memory tensors (a value, traced by type).

        `order` is the pass's permutation of the examples when `shuffled` (else
        empty); `position` the handle of the variable counting the batches read (its
        owner, an `InStepBatches`, keeps it alive).
        """
        tensors: typing.Tuple[tf.Tensor, ...]
        position: tf.Tensor
        order: tf.Tensor
        shuffled: bool
        size: int
        drop_remainder: bool
        structure: str

        @property
        def element_spec(self):
            return _STRUCTURES[self.structure]

        def __iter__(self):
            return self

        def __next__(self):
            """The next batch, read eagerly (compiled loops call `get_next_as_optional`)."""
            optional = self.get_next_as_optional()
            if not bool(optional.has_value()):
                raise StopIteration
            return optional.get_value()

        @unconverted
        def read_ahead(self):
            """Inside a compiled loop: `(first, left)`, the position the loop starts at and
            the batches of the pass left from there (int32). A loop reads batch `first + k`
            with `batch_at` and moves the position once, `advance(k)`, at its end: no step
            then reads or writes the position variable, so the next batch's slicing need not
            wait for the step before it (the variable ordered every read after the previous
            step's updates: bench/step_profile.py)."""
            first = self._position()
            return first, tf.cast(self._batches() - first, tf.int32)

        @unconverted
        def batch_at(self, position):
            return _batch_at(self, position)

        @unconverted
        def advance(self, steps):
            tf.raw_ops.AssignAddVariableOp(resource=self.position,
                                           value=tf.cast(steps, tf.int64))

        @unconverted
        def get_next_as_optional(self):
            """Inside a compiled loop: the next batch of the pass, or none at its end."""
            position = self._position()
            has = position < self._batches()
            # Past the end, batch 0 is read and never used: every read has the batch's shape.
            batch = self._batch_at(tf.where(has, position, 0))
            tf.raw_ops.AssignAddVariableOp(resource=self.position,
                                           value=tf.cast(has, tf.int64))
            return Next(has, batch)

        def _position(self):
            return tf.raw_ops.ReadVariableOp(resource=self.position, dtype=tf.int64)

        def _batches(self):
            n, size = self.tensors[0].shape[0], self.size
            return n // size if self.drop_remainder else -(-n // size)

        def _batch_at(self, position):
            return _batch_at(self, position)

    return InStepIterator
