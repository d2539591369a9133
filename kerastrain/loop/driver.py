"""Drivers: run one epoch's compiled loops on this task's replicas, or on parameter-server workers.

A driver knows nothing of the Trainer. It is given a compiled loop
(`fn(iterator, num_steps) -> (totals, steps)`, see `kerastrain.step.loops`), the input,
and how long the epoch and each loop are; it yields one `LoopResult` per loop.
What happens between loops (logging, checkpoints, callbacks, stopping) is the
business of the actions the caller runs on each result (`kerastrain.loop.actions`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import re
import time
from typing import Callable, Iterator

import numpy as np

logger = logging.getLogger("kerastrain")


@dataclasses.dataclass(frozen=True)
class LoopResult:
    """What one compiled loop returned.

    Attributes:
        totals: the loop's summed `[loss sum, examples, metric deltas...]` (float64).
        steps: steps it ran (fewer than asked where the data ended).
        in_sync: the variables hold the state after exactly the steps reported so
            far. Always true under synchronous strategies; under parameter servers,
            only for the last result delivered by a join.
        batches: None, or one batch per result (`SyncDriver` with a `batch_loop`): the
            batches of the current group read so far, this one included (0: the data
            ended and the held batches were applied).
    """

    totals: np.ndarray
    steps: int
    in_sync: bool = True
    batches: int | None = None


def loop_size(steps_per_loop, steps_per_epoch, done, to_boundary):
    """Steps for the next loop: at most `steps_per_loop`, never past the epoch or a boundary."""
    n = steps_per_loop
    if steps_per_epoch is not None:
        n = min(n, steps_per_epoch - done)
    if to_boundary:
        n = min(n, to_boundary)
    return n


class SyncDriver:
    """Runs epochs under synchronous strategies (one device, mirrored, multi-worker).

    It tracks the data position as (passes begun, batches into the current
    pass), which checkpoints keep: a resumed run re-creates that many iterators
    (each advances the data's reshuffling exactly as the first run did) and skips
    the batches already trained on, so it sees the batches the first run would have.

    Args:
        train_loop: the compiled training loop; it stops early where the data ends.
        skip_loop: `fn(iterator, n) -> skipped`, reads and drops up to n batches.
        accumulation: batches a step reads (gradient accumulation). `offset` counts
            steps; checkpoints keep batches (`saved_offset`), as `PSDriver` does, so a
            checkpoint resumes under any strategy.
    """

    def __init__(self, train_loop, skip_loop, accumulation=1, batch_loop=None, reset=None):
        self._loop = train_loop
        self._skip = skip_loop
        self._batches = accumulation
        # One batch per call, the update at each k-th (`Accumulator.batch_loop`), and how
        # to drop the batches it holds: for callbacks that watch every batch.
        self._batch_loop, self._reset, self._held = batch_loop, reset, 0
        self._iterator = None
        self._continue_pass = False
        self.passes = 0
        self.offset = 0
        # Set by a recovery (`kerastrain.loop.recovery`): a position to go back to before the
        # next loop, batches never to train on, and a range to run one step per loop.
        self._rewind_to = None
        self.skips = set()        # {(pass, offset)}
        self.probe = None         # (pass, first offset, end offset) or None
        self.last_loop = None     # (pass, first offset, steps) of the latest loop

    def _new_iterator(self, train_input):
        self._iterator = iter(train_input.distributed())
        self.passes += 1
        self.offset = 0

    @property
    def saved_offset(self):
        """Batches into the current pass (a step that the data ended early only ends a pass)."""
        return self.offset * self._batches

    def fast_forward(self, train_input, passes, offset, *, batches=False):
        """Stand where a run that began `passes` passes and trained `offset` steps of the
        last (`batches=True`: read `offset` batches, as a checkpoint keeps it) stood."""
        import tensorflow as tf

        dataset = train_input.distributed()
        for _ in range(passes - (1 if offset else 0)):
            iter(dataset)
        self.passes = passes - (1 if offset else 0)
        if offset:
            self._new_iterator(train_input)
            wanted = offset if batches else offset * self._batches
            skipped = int(self._skip(self._iterator, tf.constant(wanted, tf.int32)))
            self.offset = -(-skipped // self._batches)
            self._continue_pass = True

    def resume(self, train_input, passes, offset):
        """Stand where a checkpoint's (passes, batches into the pass) say."""
        self._drop_held()
        self.fast_forward(train_input, passes, offset, batches=True)

    def _drop_held(self):
        if self._held:
            self._reset()
            self._held = 0

    def epoch_done(self, steps_per_epoch):
        if steps_per_epoch is None:
            self.offset = 0  # the pass ended with the epoch; the next epoch starts a new one

    def seek(self, passes, offset):
        """Before the next loop, stand again at the data position (passes, offset).

        The data is rebuilt and read forward as a resumed run reads it, so the
        batches after that position are the ones seen the first time.
        """
        self._rewind_to = (passes, offset)

    def settle(self):
        """Nothing runs between loops here (a parameter-server driver waits for its loops)."""

    def _rewind(self, train_input):
        passes, offset = self._rewind_to
        self._rewind_to = None
        self._drop_held()
        self._iterator, self._continue_pass, self.passes, self.offset = None, False, 0, 0
        train_input.distributed(fresh=True)  # a dataset object that was iterated 0 times
        self.fast_forward(train_input, passes, offset)

    def _skip_poisoned(self):
        """Read and drop the batches at this position that a recovery marked."""
        import tensorflow as tf
        while (self.passes, self.offset) in self.skips:
            if not int(self._skip(self._iterator, tf.constant(self._batches, tf.int32))):
                return
            self.offset += 1

    def _cut(self, n):
        """`n`, cut so a loop ends before a marked batch and probes one step at a time."""
        here = self.offset
        ahead = [o - here for p, o in self.skips if p == self.passes and o > here]
        if ahead:
            n = min(n, min(ahead))
        if self.probe is not None and self.probe[0] == self.passes:
            if self.probe[1] <= here < self.probe[2]:
                n = 1
            elif here < self.probe[1]:
                n = min(n, self.probe[1] - here)
        return n

    def run_epoch(self, train_input, steps_per_epoch, steps_per_loop, step,
                  boundary: Callable[[int], int | None]) -> Iterator[LoopResult]:
        """Yield a result per compiled loop; loops stop `boundary(step)` steps ahead.

        `steps_per_loop` is an int, or a `tuning.LoopSizer` that measures the first
        loops and then says how long they should be.

        Stops at `steps_per_epoch` steps (starting more passes over the data as
        needed) or, when it is None, where the data ends. The caller may stop
        consuming at any result.
        """
        import tensorflow as tf

        if self._rewind_to is not None:
            self._rewind(train_input)
        if self._continue_pass:
            self._continue_pass = False
        elif steps_per_epoch is None or self._iterator is None:
            self._new_iterator(train_input)
        if self._batch_loop is not None:
            yield from self._run_batches(train_input, steps_per_epoch)
            return
        done = 0
        restarted = False
        sizer = None if isinstance(steps_per_loop, int) else steps_per_loop
        if sizer is not None:
            sizer.calibrate(self._loop, self._iterator)
        while steps_per_epoch is None or done < steps_per_epoch:
            most = steps_per_loop if sizer is None else sizer.next_size()
            n = loop_size(most, steps_per_epoch, done, boundary(step))
            if self.skips or self.probe:
                self._skip_poisoned()
                n = self._cut(n)
            started = time.perf_counter()
            part, ran = self._loop(self._iterator, tf.constant(n, tf.int32))
            ran = int(ran)
            self.last_loop = (self.passes, self.offset, ran)
            if sizer is not None:
                sizer.observe(n, ran, time.perf_counter() - started)
            done += ran
            step += ran
            self.offset += ran
            yielded = time.perf_counter()
            yield LoopResult(np.asarray(part, np.float64), ran)
            if sizer is not None:
                sizer.observe_gap(time.perf_counter() - yielded)  # the actions' time
            if ran < n:
                if steps_per_epoch is None or (ran == 0 and restarted):
                    return  # the end of the data (or an empty dataset, which fit reports)
                # The data ended before `steps_per_epoch`: start another pass.
                self._say_new_pass(steps_per_epoch)
                self._new_iterator(train_input)
                restarted = True

    def _say_new_pass(self, steps_per_epoch):
        """Once a fit: finite data ended inside an epoch, where `model.fit` would stop."""
        if getattr(self, "_said_new_pass", False):
            return
        self._said_new_pass = True
        logger.warning(  # a warning, as fit's own (shown at verbose=0)
            "the training data ended inside an epoch of steps_per_epoch=%d: its next pass "
            "begins and the epoch goes on (model.fit would stop training here, warning \"Your "
            "input ran out of data\"); repeat() the data, or steps_per_epoch=None for epochs of "
            "one pass", steps_per_epoch)

    def _run_batches(self, train_input, steps_per_epoch):
        """`run_epoch` one batch per result, the update at each k-th: a step's batches are
        each a result (steps 0), its last one the update (steps 1)."""
        done, restarted = 0, False
        while steps_per_epoch is None or done < steps_per_epoch:
            if self.skips and not self._held:  # skip a marked group at its start
                self._skip_poisoned()
            part, ran, read = self._batch_loop(self._iterator)
            ran, read = int(ran), int(read)
            if not ran and not read:  # the data ended, nothing held
                if steps_per_epoch is None or restarted:
                    return
                self._say_new_pass(steps_per_epoch)
                self._new_iterator(train_input)
                restarted = True
                continue
            restarted = False
            self._held = 0 if ran else read
            self.last_loop = (self.passes, self.offset, ran)
            done += ran
            self.offset += ran
            yield LoopResult(np.asarray(part, np.float64), ran, batches=read)


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
        self._per_pass = None
        self._width = width
        self._batches = accumulation
        self._reader = None
        self.repeated_steps = 0   # steps run twice (loops retried after a worker failed)
        self.refetched = 0        # batches retried loops read from a fresh copy of the data
        self.scheduled = 0        # batches the workers were asked to read, in all
        self.last_loop = None     # loops are not replayed one step at a time (kerastrain.loop.recovery)
        # Epochs of one pass of a shared job (`run_pass`): passes read to their end, the
        # workers whose reader of the current pass has ended, steps the pass trained.
        self._drained = 0
        self._ended = set()
        self._pass_start, self._pass_steps, self._pass_examples = 0, 0, 0.0

    @property
    def passes(self):
        """Passes over the data begun (as `SyncDriver.passes`; 1 when its size is unknown)."""
        if self._drained:
            return self._drained
        if self._per_pass is None:
            return 0
        if not self._per_pass:
            return 1 if self.cursor else 0
        return self.cursor // self._per_pass + (1 if self.cursor % self._per_pass else 0)

    @property
    def offset(self):
        """Batches into the current pass (all batches so far when its size is unknown)."""
        if self._drained:
            return self._pass_steps
        if not self._per_pass:
            return self.cursor if self._per_pass is not None else 0
        return self.cursor % self._per_pass

    @property
    def cursor(self):
        """Global batches scheduled since the first pass began (0 before any reader)."""
        return self._reader.cursor if self._reader is not None else 0

    @cursor.setter
    def cursor(self, value):
        self._reader.cursor = value

    def _use(self, reader):
        """Read `reader`'s positions; the first time, begin where its last fit stopped.

        Starting again at position 0 would put every loop behind the workers'
        iterators: each would run as a fresh loop (new iterators that read up to
        its positions), one at a time.
        """
        self._per_pass = reader.positions.per_pass or 0
        if self._reader is reader:
            return
        self._reader = reader
        if self._per_pass and self.cursor % self._per_pass:
            self.cursor += self._per_pass - self.cursor % self._per_pass

    def fast_forward(self, train_input, passes, offset):
        if train_input.drains:
            # A shared job cannot be rejoined where it stood: the next epoch reads pass
            # `passes` (a new order for NumPy data) from its beginning.
            self._drained = train_input.passes_read = passes
            if offset:
                logger.warning(
                    "resumed %d step(s) into an epoch read through the tf.data service: the "
                    "epoch reads a whole new pass, so the examples of those steps are trained "
                    "again in it (a service job cannot be rejoined where it stood)", offset)
            return
        reader = train_input.reader()
        if reader is None:
            return
        self._use(reader)
        per_pass = self._per_pass
        if per_pass:  # a synchronous run counts a group the pass ended early as k batches
            offset = min(offset, per_pass)
        self.cursor = (passes - (1 if offset else 0)) * per_pass + offset if per_pass else offset
        where = (f"pass {self.cursor // per_pass + 1}, batch {self.cursor % per_pass} of "
                 f"{per_pass}" if per_pass else f"batch {self.cursor} of its stream")
        logger.info("the data continues at %s: no batch of the epoch is skipped; batches the "
                    "stopped run trained after this checkpoint are trained again (none after a "
                    "SIGTERM, which saves once its loops in flight finish)", where)

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
        if self._per_pass is None:
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
                self._pass_steps += steps  # at most; the steps it ran are not known
            return LoopResult(np.zeros(self._width, np.float64), steps, in_sync)
        if fresh is _PASS:
            # A pass loop: fewer steps than asked means its worker's reader of the job
            # has ended (and stays ended).
            if int(ran) < steps:
                self._ended.add(int(extra[0]))
            self._pass_steps += int(ran)
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
            step = self._pass_start + self._pass_steps
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
        import tensorflow as tf
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
                  boundary: Callable[[int], int | None]) -> Iterator[LoopResult]:
        """Schedule `steps_per_epoch` steps in loops cut at `boundary(step)`; yield results.
        `steps_per_epoch=None`: one pass of a shared job (`run_pass`)."""
        if steps_per_epoch is None:
            yield from self.run_pass(train_input, steps_per_loop, step, boundary)
            return
        reader = train_input.reader() if self._positions_loop is not None else None
        if reader is not None:
            self._use(reader)
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
        import tensorflow as tf
        iterator, worker = train_input.pass_iterators()
        self._drained = train_input.passes_read
        self._ended = set()
        self._pass_start, self._pass_steps, self._pass_examples = step, 0, 0.0
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
                step = self._pass_start + self._pass_steps
            while len(in_flight) > self._max_in_flight:
                yield self._fetch(in_flight.popleft())
        yield from self._join(in_flight, None)
        if self._stop_requested() and len(self._ended) < self._workers:
            return  # stopped mid-pass: a resumed run reads a new pass
        missing = sorted(set(range(self._workers)) - self._ended)
        if missing:
            logger.warning("tf.data service: worker(s) %s never reported the end of pass %d "
                           "after %d rounds; batches they held are not trained in this epoch",
                           missing, self._drained, rounds)
        train_input.pass_ended(self._pass_examples)


_PASS = "pass"  # marks a scheduled loop of `run_pass` (its results name its worker)
DRAIN_ROUNDS = 50  # rounds of loops asking workers to read what they hold of a pass


def run_to_end(loop, iterator, steps, width, chunk=1000, accumulate=np.add, after=None):
    """Run `loop` over `iterator` for `steps` steps, or to the end of the data (None).

    Returns the loops' totals (float64) combined by `accumulate` (summed by default).
    Used for evaluation, where every task reads to the end and nothing happens
    between loops but `after()` (progress, for a `stalls.StallWatch`).
    """
    import tensorflow as tf

    totals = np.zeros(width, np.float64)
    remaining = steps
    while remaining is None or remaining > 0:
        n = chunk if remaining is None else min(chunk, remaining)
        part, ran = loop(iterator, tf.constant(n, tf.int32))
        if after is not None:
            after()
        if int(ran):
            totals = accumulate(totals, np.asarray(part, np.float64))
        ran = int(ran)
        if remaining is not None:
            remaining -= ran
        if ran < n:
            break
    return totals


def cluster_errors():
    import tensorflow as tf
    return (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError,
            tf.errors.InternalError)


def _tasks(text):
    """The (job, index) of every task an error message names."""
    return sorted(set(re.findall(r"/job:(ps|worker|chief)/replica:\d+/task:(\d+)", text)))


def _resume_advice(latest_checkpoint):
    return (f"the latest checkpoint is {latest_checkpoint}; run the job again (or `kerastrain "
            "launch --max-restarts N`) to resume from it" if latest_checkpoint else
            "no checkpoint was written yet (set trainer.model_dir to keep progress)")


def lost_peer(error, latest_checkpoint=None):
    """The error to raise when a multi-worker peer is gone: which one, and what to do."""
    text = str(error)
    peers = [f"{job}:{index}" for job, index in _tasks(text)]
    who = ", ".join(peers) if peers else "a peer"
    why = ("TensorFlow's heartbeats say it stopped answering" if "heartbeat" in text else
           f"{type(error).__name__}: {text.strip().splitlines()[0][:160]}" if text.strip() else
           type(error).__name__)
    from kerastrain.loop.stalls import LostPeer
    return LostPeer(
        f"Lost a worker of this multi-worker job ({who}: {why}). Every step needs every worker, "
        f"so training stops here; {_resume_advice(latest_checkpoint)}.")


def lost_cluster(error, latest_checkpoint=None):
    """The error to raise when a parameter server is gone: which task, and what to do."""
    resume = _resume_advice(latest_checkpoint)
    tasks = _tasks(str(error))
    lost = [f"{job}:{index}" for job, index in tasks if job == "ps"] or [
        f"{job}:{index}" for job, index in tasks]
    what = f"{', '.join(lost)} unreachable" if lost else "a task unreachable"
    return RuntimeError(
        f"Lost contact with the parameter-server cluster ({what}; {type(error).__name__}). "
        f"Parameter servers hold the model, so training stops here; {resume}.")
