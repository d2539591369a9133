"""Exact visits under parameter servers: each scheduled loop names the batches it trains.

A `ClusterCoordinator` runs a loop on whichever worker is free, so a worker that
reads "its own shard" trains as much of it as it happens to get: measured on 2
workers, 32-step epochs, one loop could take the whole epoch and train half the
examples twice and half never. Here a loop instead carries the *positions* of the
batches it trains, and the worker that runs it reads exactly those:

- The data is a list of input pipelines (one for global-batch data and NumPy
  arrays; one per worker for a `dataset_fn(ctx)`), each of known length. A pass
  over the data takes their batches round-robin; an epoch takes the next
  `steps_per_epoch` of them, continuing into the next pass as one device would.
- Every worker keeps an iterator over every pipeline, repeated and enumerated
  (`(position, batch)`), and reads forward to the position asked, dropping the
  batches other workers trained. A worker behind never needs to go back, except
  for a loop retried after its first worker failed; then it reads the batch from
  a fresh copy of the pipeline (`skip(position)`), so the retry trains what the
  first attempt was given.
- NumPy data is a pipeline of index batches (the seeded shuffle of one device),
  gathered only for the batches a worker trains.

Workers agree on a pipeline's order only if it is deterministic: a shuffle needs
a seed (kerastrain's `seed` gives every op one).
"""

from __future__ import annotations

import gc

import numpy as np
import tensorflow as tf

from kerastrain._tracing import unconverted


def worker_indices(built):
    """Per-worker iterators, each yielding its worker's own index (int32) forever: what a
    scheduled loop reads to know on which worker it runs."""
    from kerastrain import _compat
    return _compat.per_worker_iterator(
        built.coordinator, built.strategy,
        lambda index: tf.data.Dataset.from_tensors(tf.constant(index, tf.int32)).repeat())


class Positions:
    """Where the batches of a pass come from, and which batches a loop trains.

    Args:
        sizes: batches per pass of each input pipeline (all > 0), or None where
            a size is unknown or infinite: the pipelines are then taken in turn,
            batch k of every pipeline before batch k+1, along their repeated streams.
    """

    def __init__(self, sizes):
        count = len(sizes)
        if any(size is None for size in sizes):
            self.sizes, self.per_pass = None, None
            self._pipeline = np.arange(count, dtype=np.int32)
            self._batch = np.zeros(count, np.int64)
            self._period = np.ones(count, np.int64)
            return
        self.sizes = np.asarray(sizes, np.int64)
        pipeline, batch = [], []
        for k in range(int(self.sizes.max())):
            for j, size in enumerate(self.sizes):
                if k < size:
                    pipeline.append(j)
                    batch.append(k)
        self._pipeline = np.asarray(pipeline, np.int32)
        self._batch = np.asarray(batch, np.int64)
        self._period = self.sizes
        self.per_pass = int(self.sizes.sum())

    def of(self, start, count):
        """`(pipelines, positions)` of the global batches `start .. start+count-1`.

        A position counts batches along the pipeline's repeated stream: pass p,
        batch b is `p * size + b`.
        """
        cycle = len(self._pipeline)
        rounds, k = np.divmod(np.arange(start, start + count, dtype=np.int64), cycle)
        pipelines = self._pipeline[k]
        return pipelines, rounds * self._period[pipelines] + self._batch[k]

    def firsts(self, pipelines, positions):
        """The first position a loop reads from each pipeline (-1: none)."""
        firsts = np.full(len(self._period), -1, np.int64)
        for j in range(len(firsts)):
            mine = positions[pipelines == j]
            if mine.size:
                firsts[j] = mine.min()
        return firsts


class Reader:
    """Per-worker iterators over an input's pipelines, and how a loop reads its positions.

    A worker's iterators only move forward. Where each stands is kept on a
    parameter server (`read_positions[worker, pipeline]`, the next position it
    yields). A loop whose first positions are behind that record (a loop run
    again after its first worker failed, on a worker that has read past them)
    trains nothing and says so; the driver then runs it as a *fresh* loop, which
    reads the same positions from new iterators (`skip(position)`). The record is
    never behind the iterator: a worker that restarts begins its iterators again
    at 0 and reads forward from there.

    Args:
        built: the `strategies.BuiltStrategy` (parameter servers).
        sizes: batches per pass of each pipeline (None: unknown or infinite).
        make: `make(j) -> tf.data.Dataset`, pipeline j's batches for one pass
            (called on the workers, and in fresh loops).
        finish: `finish(element) -> batch`, run on the worker after the read (the
            NumPy gather); None: the element is the batch.
        element_spec: the spec of a batch (a model's own step traces one to learn
            its logs).
    """

    def __init__(self, built, sizes, make, finish=None, element_spec=None):
        # Free earlier trainers' resources now, while no loop runs: collected by Python's
        # garbage collector during a fit, they stalled it for 8-80 s (measured, 2 workers in
        # process; not diagnosed further). About 0.3 s here.
        gc.collect()
        self.positions = Positions(sizes)
        self._make = make
        self._finish = finish or (lambda element: element)
        self.count = len(sizes)
        self.element_spec = element_spec
        # Global batches scheduled on this input so far (`loop.ps.driver.PSDriver.cursor`), kept
        # here so that a later fit goes on from it.
        self.cursor = 0
        self._loops = {}
        coordinator = built.coordinator
        self.iterators = tuple(
            iter(coordinator.create_per_worker_dataset(lambda j=j: self.stream(j)))
            for j in range(len(sizes)))
        # Each worker's own index, read by its loops to find its row of `read_positions`.
        self.worker = worker_indices(built)
        with tf.device("/job:ps/replica:0/task:0/device:CPU:0"):
            self.read_positions = tf.Variable(
                tf.zeros([max(built.num_workers, 1), len(sizes)], tf.int64), trainable=False,
                name="read_positions")

    def stream(self, j):
        return self._make(j).repeat().enumerate()

    def fresh_iterators(self, firsts):
        """Traced in a fresh loop: iterators standing at each pipeline's first position."""
        return tuple(iter(self.stream(j).skip(tf.maximum(firsts[j], 0)))
                     for j in range(self.count))

    def start(self, worker):
        """This worker's record of where its iterators stand (traced at a loop's start)."""
        return self.read_positions[worker]

    def end(self, worker, record):
        """Keep the record for the worker's next loop (traced at a loop's end)."""
        self.read_positions.scatter_nd_update([[worker]], [record])

    def read(self, iterators, pipeline, position, record):
        """Traced in a loop: `(batch, record)`, reading forward to `position` of `pipeline`;
        `record[j]` is the next position iterator j yields."""
        def branch(j):
            iterator = iterators[j]
            index, element = iterator.get_next()
            index, element = tf.while_loop(lambda i, e: i < position,
                                           lambda i, e: iterator.get_next(), (index, element))
            return element, tf.tensor_scatter_nd_update(record, [[j]], [index + 1])
        if self.count == 1:
            element, record = branch(0)
        else:
            element, record = tf.switch_case(pipeline,
                                             [lambda j=j: branch(j) for j in range(self.count)])
        return self._finish(element), record

    def loop(self, step, fresh=False):
        """The compiled loop of `step` (a `loops.Step`) reading this input's positions.

        `fn(iterators, worker, pipelines, positions, firsts) -> (totals, steps, behind)`
        reads with the worker's own iterators (`worker` yields its index); a step
        reads the batches at `step.accumulation` positions. It runs no step and
        returns `behind=1` when that worker has read past `firsts`, the first
        position it needs of each pipeline. `fresh=True` gives
        `fn(pipelines, positions, firsts)`, which reads from new iterators.
        """
        if (step, fresh) in self._loops:
            return self._loops[step, fresh]
        width = step.width  # what the loop returns (a model's own step: its logs, known now)
        start, end, fresh_iterators = (unconverted(self.start), unconverted(self.end),
                                       unconverted(self.fresh_iterators))

        def steps_of(iterators, record, pipelines, positions, num_steps):
            def read(state):
                i, record = state
                batch, record = self.read(iterators, pipelines[i], positions[i], record)
                return batch, (i + 1, record)
            totals, (_, record) = step.worker_steps(read, (tf.constant(0, tf.int32), record),
                                                    num_steps, width=width)
            return totals, record

        # Loops cut at a boundary (a log or checkpoint step) carry fewer positions: traced
        # once more with their length left open, not once per length (each trace of a step
        # cost 0.6 s on the coordinator, in epochs that ran 0.3 s; bench/real_models.py).
        function = tf.function(reduce_retracing=True)
        if fresh:
            @function
            def loop(pipelines, positions, firsts):
                steps = tf.size(positions) // step.accumulation
                totals, _ = steps_of(fresh_iterators(firsts), firsts, pipelines, positions,
                                     steps)
                return totals, steps, tf.constant(0, tf.int32)
        else:
            @function
            def loop(iterators, worker, pipelines, positions, firsts):
                worker = next(worker)
                record = start(worker)
                behind = tf.reduce_any((firsts >= 0) & (firsts < record))
                steps = tf.where(behind, 0, tf.size(positions) // step.accumulation)
                totals, record = steps_of(iterators, record, pipelines, positions, steps)
                end(worker, record)
                return totals, steps, tf.cast(behind, tf.int32)
        self._loops[step, fresh] = loop
        return loop
