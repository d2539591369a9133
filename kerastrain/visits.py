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

import numpy as np


class Positions:
    """Where the batches of a pass come from, and which batches a loop trains.

    Args:
        sizes: batches per pass of each input pipeline (all > 0).
    """

    def __init__(self, sizes):
        self.sizes = np.asarray(sizes, np.int64)
        pipeline, batch = [], []
        for k in range(int(self.sizes.max())):
            for j, size in enumerate(self.sizes):
                if k < size:
                    pipeline.append(j)
                    batch.append(k)
        self._pipeline = np.asarray(pipeline, np.int32)
        self._batch = np.asarray(batch, np.int64)
        self.per_pass = int(self.sizes.sum())

    def of(self, start, count):
        """`(pipelines, positions)` of the global batches `start .. start+count-1`.

        A position counts batches along the pipeline's repeated stream: pass p,
        batch b is `p * size + b`.
        """
        passes, k = np.divmod(np.arange(start, start + count, dtype=np.int64), self.per_pass)
        pipelines = self._pipeline[k]
        return pipelines, passes * self.sizes[pipelines] + self._batch[k]


class Reader:
    """Per-worker iterators over an input's pipelines, and how a loop reads a position.

    Args:
        coordinator: the `ClusterCoordinator`.
        sizes: batches per pass of each pipeline.
        make: `make(j) -> tf.data.Dataset`, pipeline j's batches for one pass
            (called on the workers, and inside loops for a retried batch).
        finish: `finish(element) -> batch`, run on the worker after the read (the
            NumPy gather); None: the element is the batch.
    """

    def __init__(self, coordinator, sizes, make, finish=None):
        self.positions = Positions(sizes)
        self._make = make
        self._finish = finish or (lambda element: element)
        self.iterators = tuple(
            iter(coordinator.create_per_worker_dataset(lambda j=j: self.stream(j)))
            for j in range(len(sizes)))

    def stream(self, j):
        return self._make(j).repeat().enumerate()

    def _read_one(self, iterator, j, position):
        """Batch `position` of pipeline j, and 1 if it came from a fresh copy."""
        import tensorflow as tf

        index, element = iterator.get_next()
        index, element = tf.while_loop(lambda i, e: i < position,
                                       lambda i, e: iterator.get_next(), (index, element))

        def fresh():
            return self.stream(j).skip(position).take(1).get_single_element()
        behind = index > position
        index, element = tf.cond(behind, fresh, lambda: (index, element))
        return element, tf.cast(behind, tf.int32)

    def read(self, iterators, pipeline, position):
        """Traced in a loop on a worker: `(batch, refetched)` at `position` of `pipeline`."""
        import tensorflow as tf

        if len(iterators) == 1:
            element, refetched = self._read_one(iterators[0], 0, position)
        else:
            element, refetched = tf.switch_case(pipeline, [
                lambda j=j: self._read_one(iterators[j], j, position)
                for j in range(len(iterators))])
        return self._finish(element), refetched
