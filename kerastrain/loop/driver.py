"""Drivers: run one epoch's compiled loops on this task's replicas, or on parameter-server workers.

A driver knows nothing of the Trainer. It is given a compiled loop
(`fn(iterator, num_steps) -> (totals, steps)`, see `kerastrain.step.loops`), the input,
and how long the epoch and each loop are; it yields one `LoopResult` per loop.
What happens between loops (logging, checkpoints, callbacks, stopping) is the
business of the actions the caller runs on each result (`kerastrain.loop.actions`).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from typing import Callable, Iterator

import numpy as np
import tensorflow as tf

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

    def __init__(self, train_loop, skip_loop, accumulation=1, batch_loop=None, reset=None,
                 jit_trial=None):
        self._loop = train_loop
        self._trial = jit_trial  # `tuning.JitTrial` of jit_compile="auto", or None
        self._skip = skip_loop
        self._batches = accumulation
        # One batch per call, the update at each k-th (`Accumulator.batch_loop`), and how
        # to drop the batches it holds: for callbacks that watch every batch.
        self._batch_loop, self._reset, self._held = batch_loop, reset, 0
        self._iterator = None
        self._continue_pass = False
        self._pass_ended = False  # the last epoch ended where the data's pass did
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
        while (self.passes, self.offset) in self.skips:
            if not int(self._skip(self._iterator, tf.constant(self._batches, tf.int32))):
                return
            self.offset += 1

    def _probing(self):
        """Whether the next loop replays a recovery's range one step at a time."""
        probe = self.probe
        return probe is not None and probe[0] == self.passes and probe[1] <= self.offset < probe[2]

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
                  boundary: Callable[[int], int | None],
                  before: Callable[..., None] | None = None) -> Iterator[LoopResult]:
        """Yield a result per compiled loop; loops stop `boundary(step)` steps ahead.

        `steps_per_loop` is an int, or a `tuning.LoopSizer` that measures the first
        loops and then says how long they should be. `before(n)` is called just before a
        loop of n steps runs (`before(1, held=b)`: one batch of a `batch_loop`, after the
        b batches of its group held), for the callbacks' begin hooks.

        Stops at `steps_per_epoch` steps or where the data's pass ends, whichever comes
        first, as `model.fit` does: an epoch shorter than one pass leaves the rest of the
        pass to the next epoch; one that reaches the pass's end stops there (said once),
        and the next epoch begins a new pass. The caller may stop consuming at any result.
        """
        self._begin_epoch(train_input, steps_per_epoch)
        before = before or (lambda *args, **kwargs: None)
        if self._batch_loop is not None:
            yield from self._run_batches(train_input, steps_per_epoch, before)
            return
        done, restarted = 0, False
        sizer = None if isinstance(steps_per_loop, int) else steps_per_loop
        if sizer is not None:
            sizer.calibrate(self._loop, self._iterator)
        while steps_per_epoch is None or done < steps_per_epoch:
            most = steps_per_loop if sizer is None else sizer.next_size()
            # jit_compile="auto"'s trial, once the loop size is known; it may lengthen loops
            # only where their size is kerastrain's own (`free`): a size asked for, or 1 for
            # callbacks that see every batch, stays.
            sized, free = sizer is None or sizer.size is not None, sizer is not None
            if self._trial is not None and sized and free:
                most = self._trial.most(most)
            n = self._within_pass(train_input, loop_size(most, steps_per_epoch, done,
                                                         boundary(step)))
            if n == 0:  # the pass ended on its last batch (data of known size)
                if not self._pass_end(train_input, steps_per_epoch, done, restarted):
                    return
                restarted = True
                continue
            if self.skips or self.probe:
                self._skip_poisoned()
                n = self._cut(n)
            loop, jit = self._loop, None
            if self._trial is not None and not self._probing():
                jit, n = self._trial.choose(n, sized=sized, free=free)
                loop = self._loop if jit is None else self._trial.step.train_loop(jit)
            before(n)
            started, cpu_started = time.perf_counter(), time.process_time()
            try:
                part, ran = loop(self._iterator, tf.constant(n, tf.int32))
            except tf.errors.OpError as error:
                if not (jit and self._trial.compiling):
                    raise
                self._xla_failed(error, train_input)
                continue
            ran = int(ran)
            self.last_loop = (self.passes, self.offset, ran)
            if sizer is not None:
                sizer.observe(n, ran, time.perf_counter() - started)
            if self._trial is not None:
                self._trial.observe(jit, ran, time.perf_counter() - started,
                                    time.process_time() - cpu_started)
                if self._trial.decided is not None:
                    self._loop, self._trial = self._trial.step.train_loop(), None
            done += ran
            step += ran
            self.offset += ran
            yielded = time.perf_counter()
            yield LoopResult(np.asarray(part, np.float64), ran)
            if sizer is not None:
                sizer.observe_gap(time.perf_counter() - yielded)  # the actions' time
            if ran < n:
                if not self._pass_end(train_input, steps_per_epoch, done, restarted):
                    return
                restarted = True

    def _xla_failed(self, error, train_input):
        """jit_compile="auto": the step compiled with XLA failed on its first batch, before
        any update. Off for good, and the data is read again from where that loop began
        (it may have taken a batch from a tf.data iterator)."""
        self._trial.failed(error)
        self._loop, self._trial = self._trial.step.train_loop(), None
        passes, offset = self.passes, self.offset
        train_input.distributed(fresh=True)
        self.fast_forward(train_input, passes - 1, 0)  # the passes before this one
        self._new_iterator(train_input)
        if offset:  # one batch a step: a trial runs without gradient accumulation
            self.offset = int(self._skip(self._iterator, tf.constant(offset, tf.int32)))

    def _begin_epoch(self, train_input, steps_per_epoch):
        """Where the epoch's first batch comes from: a recovery's position, a resumed
        pass, the pass the last epoch left, or a new pass (an epoch of one pass, or after
        an epoch that ended where the data's pass did)."""
        if self._rewind_to is not None:
            self._rewind(train_input)
        if self._continue_pass:
            self._continue_pass = False
        elif steps_per_epoch is None or self._iterator is None or self._pass_ended:
            self._new_iterator(train_input)
        self._pass_ended = False

    def _within_pass(self, train_input, n):
        """`n` steps, cut to those left in this pass of data of known size. Where none is
        left (0) the epoch ends (or, at its start, begins a new pass) before a loop that
        would find the data empty, as `model.fit` knows the size and calls no callback's
        batch begin for it."""
        count = train_input.cardinality
        if not (isinstance(count, int) and count > 0):
            return n
        return min(n, max(0, -(-(count - self.saved_offset) // self._batches)))

    def _pass_end(self, train_input, steps_per_epoch, done, restarted):
        """The data's pass ended after `done` steps of this epoch: whether the epoch goes on
        (in a new pass). It does only where no step ran yet, a pass that ended exactly where
        the last epoch did (the epoch then begins the next pass); else the epoch ends here,
        as `model.fit`'s does, and the next one begins a new pass."""
        if steps_per_epoch is None:
            return False  # an epoch of one pass
        self._pass_ended = True
        if done or restarted:  # (restarted: an empty pass, which fit reports)
            if done:
                self._say_ran_out(steps_per_epoch, done)
            return False
        self._new_iterator(train_input)
        self._pass_ended = False
        return True

    def _say_ran_out(self, steps_per_epoch, done):
        """Once a fit: finite data ended inside an epoch of `steps_per_epoch` steps."""
        if getattr(self, "_said_ran_out", False):
            return
        self._said_ran_out = True
        logger.warning(  # a warning, as fit's own (shown at verbose=0)
            "the training data ran out after %d of the epoch's steps_per_epoch=%d steps: the "
            "epoch ends here and the next one begins a new pass of the data, as model.fit does "
            "(\"Your input ran out of data\"); repeat() the data for epochs of "
            "steps_per_epoch steps each, or leave steps_per_epoch=None for epochs of one pass",
            done, steps_per_epoch)

    def _run_batches(self, train_input, steps_per_epoch, before):
        """`run_epoch` one batch per result, the update at each k-th: a step's batches are
        each a result (steps 0), its last one the update (steps 1)."""
        done, restarted = 0, False
        while steps_per_epoch is None or done < steps_per_epoch:
            if self.skips and not self._held:  # skip a marked group at its start
                self._skip_poisoned()
            before(1, held=self._held)
            part, ran, read = self._batch_loop(self._iterator)
            ran, read = int(ran), int(read)
            if not ran and not read:  # the data ended, nothing held
                if not self._pass_end(train_input, steps_per_epoch, done, restarted):
                    return
                restarted = True
                continue
            restarted = False
            self._held = 0 if ran else read
            self.last_loop = (self.passes, self.offset, ran)
            done += ran
            self.offset += ran
            yield LoopResult(np.asarray(part, np.float64), ran, batches=read)


def run_to_end(loop, iterator, steps, width, chunk=1000, accumulate=np.add, after=None,
               hooks=None):
    """Run `loop` over `iterator` for `steps` steps, or to the end of the data (None).

    Returns the loops' totals (float64) combined by `accumulate` (summed by default).
    Used for evaluation, where every task reads to the end and nothing happens
    between loops but `after()` (progress, for a `stalls.StallWatch`) and the callbacks'
    `hooks` (a `callbacks.PassHooks`, or None): `hooks.loop_size(chunk)` steps a loop,
    `hooks.begin(done)` before it, `hooks.end(done, ran, totals, n)` after a loop of n
    steps (True: stop).
    """
    totals = np.zeros(width, np.float64)
    remaining, done = steps, 0
    size = chunk if hooks is None else hooks.loop_size(chunk)
    while remaining is None or remaining > 0:
        n = size if remaining is None else min(size, remaining)
        if hooks is not None:
            hooks.begin(done)
        part, ran = loop(iterator, tf.constant(n, tf.int32))
        if after is not None:
            after()
        ran = int(ran)
        if ran:
            totals = accumulate(totals, np.asarray(part, np.float64))
        stop = hooks is not None and hooks.end(done, ran, totals, n)
        done += ran
        if remaining is not None:
            remaining -= ran
        if ran < n or stop:
            break
    return totals


def cluster_errors():
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
