"""The parameter-server driver: an epoch's loops scheduled on workers by a `ClusterCoordinator`.

Like `driver.SyncDriver` it yields one `driver.LoopResult` per loop and knows nothing of the
Trainer; unlike it, loops run on whichever worker is free, their results arrive after joins, and
a loop lost with a worker runs again elsewhere (`kerastrain.distribute.ps` for exact visits).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Callable, Iterator

import numpy as np
import tensorflow as tf

from kerastrain.loop.driver import LoopResult, _tasks, cluster_errors, loop_size
from kerastrain.loop.ps.position import DataPosition

logger = logging.getLogger("kerastrain")


class PSDriver:
    """Schedules loops on parameter-server workers through a `ClusterCoordinator`.

    When the input allows it (`DistributedInput.reader()`: finite data of known
    size), each loop carries the positions of the batches it trains
    (`kerastrain.distribute.ps.visits`), so every batch is trained once per pass whichever
    worker runs which loop, and a loop retried after a worker failure trains the
    same batches. The data position (`cursor`: global batches scheduled since
    the first pass began) is checkpointed as (passes begun, batches into the
    current pass), as `SyncDriver` does, and a resumed run continues from it.
    The input's reader keeps it between `fit` calls: a later fit begins the next
    pass, as one device does (an infinite or unknown-size stream goes on where
    it stopped), so the workers' iterators never stand past its loops' positions.
    Other inputs are read from repeated per-worker shards, with no position.

    At most `max_in_flight` loops are scheduled ahead: when more are queued, the
    oldest one's result is fetched (waiting for it), so a stop request is acted
    on within that many loops rather than after a whole scheduled epoch.
    Results fetched that way are not `in_sync` (other loops are still running);
    a join makes the last result `in_sync`, and it happens before a checkpoint
    is due, when a stop is requested, and at the end of the epoch.

    Args:
        train_loop: the compiled training loop (runs exactly `num_steps` steps).
        coordinator: the `ClusterCoordinator`.
        global_step: kerastrain's step variable; set after each join to the steps
            asked for. The loops count every step they run, so steps run beyond
            those asked (a loop a failed worker had begun, run again elsewhere)
            are counted and logged before that.
        stop_requested: `() -> bool`, checked before each loop is scheduled.
        join_at: `(step) -> bool`, whether the variables must hold exactly `step`
            (a mid-epoch checkpoint); None never asks.
        max_in_flight: loops scheduled ahead of the oldest unfinished one.
        on_lost: `(error) -> Exception` to raise when the cluster cannot be reached.
        positions_loop: `(reader, fresh=False) -> fn`, the compiled loops of exact
            visits (`loops.Step.positions_loop`).
        width: the length of a loop's totals (`loops.Step.width`).
        accumulation: batches a step reads (gradient accumulation): `cursor`, `passes`
            and `offset` count batches.
    """

    def __init__(self, train_loop, coordinator, global_step, *, stop_requested,
                 join_at=None, max_in_flight=4, on_lost=None, positions_loop=None, width=2,
                 accumulation=1, pass_loop=None, workers=1):
        self._loop = train_loop
        self._positions_loop = positions_loop
        self._pass_loop = pass_loop
        self._workers = workers
        self._coordinator = coordinator
        self._global_step = global_step
        self._stop_requested = stop_requested
        self._join_at = join_at or (lambda step: False)
        self._max_in_flight = max_in_flight
        self._on_lost = on_lost or (lambda e: e)
        self._position = DataPosition()  # where the data stands: what a checkpoint keeps
        self._width = width
        self._batches = accumulation
        self.repeated_steps = 0   # steps run twice (loops retried after a worker failed)
        self.refetched = 0        # batches retried loops read from a fresh copy of the data
        self.scheduled = 0        # batches the workers were asked to read, in all
        self.last_loop = None     # loops are not replayed one step at a time (kerastrain.loop.recovery)
        # Epochs of one pass of a shared job (`run_pass`): the workers whose reader of the
        # current pass has ended, where the pass began, its examples (passes read to their
        # end and steps the pass trained are the position's `drained` and `pass_steps`).
        self._ended = set()
        self._pass_start, self._pass_examples = 0, 0.0

    @property
    def passes(self):
        """Passes over the data begun (`DataPosition.passes`)."""
        return self._position.passes

    @property
    def offset(self):
        """Batches into the current pass (`DataPosition.offset`)."""
        return self._position.offset

    @property
    def cursor(self):
        """Global batches scheduled since the first pass began (`DataPosition.cursor`)."""
        return self._position.cursor

    @cursor.setter
    def cursor(self, value):
        self._position.cursor = value

    def fast_forward(self, train_input, passes, offset):
        self._position.fast_forward(train_input, passes, offset)

    resume = fast_forward  # a checkpoint's offset counts batches, as `cursor` does

    @property
    def saved_offset(self):
        return self.offset

    def epoch_done(self, steps_per_epoch):
        pass

    def seek(self, passes, offset):
        """Loops go on from the data position they reached: nothing to rewind (a recovery
        skips the batches scheduled since its restore point)."""

    @property
    def replay_note(self):
        """Why a recovery skips the batches since its restore point instead of replaying them."""
        if self._position.per_pass is None:
            return "parameter-server workers read their own data, with no position to go back to"
        return ("parameter-server loops are not replayed: the data goes on from where it "
                "stood, so those batches are not trained in this pass")

    def settle(self):
        """Wait for every scheduled loop (a recovery restores variables no loop may touch)."""
        try:
            self._coordinator.join()
        except cluster_errors() as e:
            raise self._on_lost(e) from None

    def _schedule(self, fn, args):
        try:
            return self._coordinator.schedule(fn, args=args)
        except cluster_errors() as e:
            raise self._on_lost(e) from None

    def _fetch(self, loop, in_sync=False):
        """The result of a scheduled loop `(remote, steps, fresh args)`, waiting for it."""
        remote, steps, fresh = loop
        try:
            # A positions loop returns whether it was behind; a pass loop, its worker.
            part, ran, *extra = remote.fetch()
        except cluster_errors() as e:
            lost = _tasks(str(e))
            if not lost or any(job == "ps" for job, _ in lost):
                raise self._on_lost(e) from None
            # The loop ran; its worker went away before the coordinator copied its
            # results (they stay on the worker). Its steps trained and count; its sums
            # are missing from the epoch's loss and metrics.
            logger.warning("the results of a loop of %d step(s) were lost with %s after it "
                           "trained; the epoch's loss and metrics leave those steps out",
                           steps, ", ".join(f"{job}:{i}" for job, i in lost if job == "worker"))
            if fresh is _PASS:
                self._position.pass_steps += steps  # at most; the steps it ran are not known
            return LoopResult(np.zeros(self._width, np.float64), steps, in_sync)
        if fresh is _PASS:
            # A pass loop: fewer steps than asked means its worker's reader of the job
            # has ended (and stays ended).
            if int(ran) < steps:
                self._ended.add(int(extra[0]))
            self._position.pass_steps += int(ran)
            self._pass_examples += float(part[1])
        elif extra and int(extra[0]):
            # Run again after a worker failed, on a worker already past its batches: it
            # trained nothing. Read the same batches from a fresh copy of the data.
            self.refetched += steps * self._batches
            logger.warning("a loop run again after a worker failed found its new worker past "
                           "its %d batch(es); they are read from a fresh copy of the data",
                           steps * self._batches)
            return self._fetch((self._schedule(*fresh), steps, None), in_sync)
        return LoopResult(np.asarray(part, np.float64), int(ran), in_sync)

    def _join(self, in_flight, step):
        """Wait for every scheduled loop; yield their results, the last one `in_sync`.
        `step`: the step the variables now hold (None: a pass's, known once fetched)."""
        try:
            self._coordinator.join()
        except cluster_errors() as e:
            raise self._on_lost(e) from None
        results = [self._fetch(loop) for loop in in_flight]
        in_flight.clear()
        if step is None:
            step = self._pass_start + self._position.pass_steps
        try:
            counted = int(self._global_step.numpy())
        except cluster_errors() as e:
            raise self._on_lost(e) from None
        if counted > step:
            # A worker failed while running loops; the coordinator ran them again
            # elsewhere, and the steps the failed attempts had run were trained twice.
            self.repeated_steps += counted - step
            logger.warning(
                "a worker failed with loops in flight; they ran again on other workers, so "
                "%d step(s) (their batches) were trained twice (%d so far this run)",
                counted - step, self.repeated_steps)
        self._global_step.assign(step)
        for k, result in enumerate(results):
            yield dataclasses.replace(result, in_sync=k == len(results) - 1)

    def _next_loop(self, train_input, reader, n):
        """Schedule the next loop of n steps: `(remote, n, args of its fresh variant)`."""
        if reader is None:
            return self._schedule(self._loop, (train_input.per_worker_iterator(),
                                               tf.constant(n, tf.int32))), n, None
        pipelines, positions = reader.positions.of(self.cursor, n * self._batches)
        self.cursor += n * self._batches
        where = (tf.constant(pipelines), tf.constant(positions),
                 tf.constant(reader.positions.firsts(pipelines, positions)))
        remote = self._schedule(self._positions_loop(reader),
                                (reader.iterators, reader.worker) + where)
        return remote, n, (self._positions_loop(reader, fresh=True), where)

    def run_epoch(self, train_input, steps_per_epoch, steps_per_loop, step,
                  boundary: Callable[[int], int | None], before=None) -> Iterator[LoopResult]:
        """Schedule `steps_per_epoch` steps in loops cut at `boundary(step)`; yield results.
        `steps_per_epoch=None`: one pass of a shared job (`run_pass`). `before` is not
        called: loops are scheduled ahead of their results, whose actions see them."""
        if steps_per_epoch is None:
            yield from self.run_pass(train_input, steps_per_loop, step, boundary)
            return
        reader = train_input.reader() if self._positions_loop is not None else None
        if reader is not None:
            self._position.use(reader)
        in_flight = collections.deque()
        done = 0
        while done < steps_per_epoch and not self._stop_requested():
            n = loop_size(steps_per_loop, steps_per_epoch, done, boundary(step))
            in_flight.append(self._next_loop(train_input, reader, n))
            self.scheduled += n * self._batches
            done += n
            step += n
            if done < steps_per_epoch and self._join_at(step):
                yield from self._join(in_flight, step)
            while len(in_flight) > self._max_in_flight:
                yield self._fetch(in_flight.popleft())
        if in_flight and done < steps_per_epoch:
            logger.info("stop requested: %d loop(s) in flight (%d steps) finish first, so the "
                        "variables hold every batch they read and none is trained again on "
                        "resume", len(in_flight), sum(loop[1] for loop in in_flight))
        yield from self._join(in_flight, step)

    def run_pass(self, train_input, steps_per_loop, step, boundary):
        """An epoch of one pass of a job all workers share (the tf.data service), read to
        its end: every example of the pass once, whichever worker reads it.

        Loops run until one worker's reader of the job ends: the job has then handed
        out all its data, and what is left are the batches other workers' readers
        hold. Then every worker whose reader has not ended runs a loop, round after
        round, until each has ended (a worker reports its index), so no batch of this
        pass waits for the next epoch.
        """
        iterator, worker = train_input.pass_iterators()
        self._position.drained = train_input.passes_read
        self._ended = set()
        self._pass_start, self._position.pass_steps, self._pass_examples = step, 0, 0.0
        in_flight = collections.deque()
        rounds = 0

        def schedule(n):
            in_flight.append((self._schedule(self._pass_loop, (
                iterator, worker, tf.constant(n, tf.int32))), n, _PASS))
            self.scheduled += n

        while not self._stop_requested():
            if self._ended:
                yield from self._join(in_flight, None)
                if len(self._ended) >= self._workers or rounds >= DRAIN_ROUNDS:
                    break
                rounds += 1
                for _ in range(self._workers - len(self._ended)):
                    schedule(steps_per_loop)
                continue
            n = loop_size(steps_per_loop, None, 0, boundary(step))
            schedule(n)
            step += n
            if self._join_at(step):
                yield from self._join(in_flight, None)
                step = self._pass_start + self._position.pass_steps
            while len(in_flight) > self._max_in_flight:
                yield self._fetch(in_flight.popleft())
        yield from self._join(in_flight, None)
        if self._stop_requested() and len(self._ended) < self._workers:
            return  # stopped mid-pass: a resumed run reads a new pass
        missing = sorted(set(range(self._workers)) - self._ended)
        if missing:
            logger.warning("tf.data service: worker(s) %s never reported the end of pass %d "
                           "after %d rounds; batches they held are not trained in this epoch",
                           missing, self._position.drained, rounds)
        train_input.pass_ended(self._pass_examples)


_PASS = "pass"  # marks a scheduled loop of `run_pass` (its results name its worker)
DRAIN_ROUNDS = 50  # rounds of loops asking workers to read what they hold of a pass
