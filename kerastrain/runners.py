"""How one epoch's compiled loops are driven: synchronous strategies and parameter servers."""

from __future__ import annotations

import numpy as np


def loop_size(steps_per_loop, steps_per_epoch, done, to_boundary):
    n = steps_per_loop
    if steps_per_epoch is not None:
        n = min(n, steps_per_epoch - done)
    if to_boundary:
        n = min(n, to_boundary)
    return n


class SyncRunner:
    """Runs epochs under synchronous strategies (one device, mirrored, multi-worker).

    It tracks the data position as (passes begun, batches into the current
    pass), which checkpoints keep: a resumed run re-creates that many iterators
    (each advances the data's reshuffling exactly as the first run did) and skips
    the batches already trained on, so it sees the batches the first run would have.
    """

    # The variables always hold the state of the last yielded step.
    in_sync = True

    def __init__(self, trainer):
        self.trainer = trainer
        self._iterator = None
        self._continue_pass = False
        self.passes = 0
        self.offset = 0

    def _new_iterator(self, train_input):
        self._iterator = iter(train_input.distributed())
        self.passes += 1
        self.offset = 0

    def fast_forward(self, train_input, passes, offset):
        import tensorflow as tf

        dataset = train_input.distributed()
        for _ in range(passes - (1 if offset else 0)):
            iter(dataset)
        self.passes = passes - (1 if offset else 0)
        if offset:
            self._new_iterator(train_input)
            skip = self.trainer._loops.skip_loop()
            skipped = int(skip(self._iterator, tf.constant(offset, tf.int32)))
            self.offset = skipped
            self._continue_pass = True

    def epoch_done(self, steps_per_epoch):
        if steps_per_epoch is None:
            self.offset = 0  # the pass ended with the epoch; the next epoch starts a new one

    def train_epoch(self, train_input, steps_per_epoch, steps_per_loop, step, boundary):
        """Yield (totals, steps) per compiled loop; loops stop at `boundary(step)` steps."""
        import tensorflow as tf

        loop = self.trainer._loops.train_loop()
        if self._continue_pass:
            self._continue_pass = False
        elif steps_per_epoch is None or self._iterator is None:
            self._new_iterator(train_input)
        done = 0
        restarted = False
        while steps_per_epoch is None or done < steps_per_epoch:
            n = loop_size(steps_per_loop, steps_per_epoch, done, boundary(step))
            part, ran = loop(self._iterator, tf.constant(n, tf.int32))
            ran = int(ran)
            done += ran
            step += ran
            self.offset += ran
            yield np.asarray(part, np.float64), ran
            watch = self.trainer._watch
            if self.trainer._model.stop_training or (watch is not None and watch.requested):
                return
            if ran < n:
                if steps_per_epoch is None:
                    return
                if ran == 0 and restarted:
                    return  # empty dataset; fit() reports it
                # The data ended before `steps_per_epoch`: start another pass.
                self._new_iterator(train_input)
                restarted = True


class PSRunner:
    """Schedules loops on parameter-server workers and joins them at epoch end.

    Workers read repeated per-worker datasets, so there is no shared data
    position to save: a resumed run continues with fresh data passes.

    Results arrive after a join, several loops at a time; `in_sync` is True only
    for the last of them, when the variables hold the state of the step reported.
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self.passes = 0
        self.offset = 0
        self.in_sync = True

    def fast_forward(self, train_input, passes, offset):
        pass

    def epoch_done(self, steps_per_epoch):
        pass

    def _drain(self, coordinator, scheduled, step):
        """Join, then yield each scheduled loop's (totals, steps).

        `step` is the global step once every scheduled loop has run. A loop that a
        failed worker had begun is run again elsewhere by the coordinator, so the
        variables may have taken a few extra updates; the step counter is set to
        the number of steps asked for, which is what checkpoints and resumes count.
        """
        try:
            coordinator.join()
            results = [remote.fetch() for remote, _ in scheduled]
        except cluster_errors() as e:
            raise lost_cluster(self.trainer, e) from None
        self.trainer._global_step.assign(step)
        for i, (part, ran) in enumerate(results):
            self.in_sync = i == len(results) - 1
            yield np.asarray(part, np.float64), int(ran)

    def train_epoch(self, train_input, steps_per_epoch, steps_per_loop, step, boundary):
        import tensorflow as tf

        loop = self.trainer._loops.train_loop()
        coordinator = self.trainer._built.coordinator
        iterator = train_input.per_worker_iterator()
        checkpointer = self.trainer._checkpointer
        scheduled = []
        done = 0
        watch = self.trainer._watch
        while done < steps_per_epoch and not (watch is not None and watch.requested):
            # Cut at boundaries too, so results can be logged at exactly those steps.
            n = loop_size(steps_per_loop, steps_per_epoch, done, boundary(step))
            try:
                scheduled.append((coordinator.schedule(
                    loop, args=(iterator, tf.constant(n, tf.int32))), n))
            except cluster_errors() as e:
                raise lost_cluster(self.trainer, e) from None
            done += n
            step += n
            if done < steps_per_epoch and checkpointer is not None and checkpointer.due(
                    step, epoch_end=False):
                # A mid-epoch save must see the variables of exactly this step.
                yield from self._drain(coordinator, scheduled, step)
                scheduled = []
        yield from self._drain(coordinator, scheduled, step)


def cluster_errors():
    import tensorflow as tf
    return (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError,
            tf.errors.InternalError)


def lost_cluster(trainer, error):
    """The error a coordinator raises when a parameter server is gone: say what to do."""
    checkpointer = trainer._checkpointer
    latest = None
    if checkpointer is not None and checkpointer.directory:
        candidates = checkpointer.candidates()
        latest = candidates[0] if candidates else None
    resume = (f"the latest checkpoint is {latest}; run the job again (or `kerastrain launch "
              "--max-restarts N`) to resume from it" if latest else
              "no checkpoint was written yet (set trainer.model_dir to keep progress)")
    import re
    text = str(error)
    tasks = sorted(set(re.findall(r"/job:(ps|worker|chief)/replica:\d+/task:(\d+)", text)))
    lost = [f"{job}:{index}" for job, index in tasks if job == "ps"] or [
        f"{job}:{index}" for job, index in tasks]
    what = f"{', '.join(lost)} unreachable" if lost else "a task unreachable"
    return RuntimeError(
        f"Lost contact with the parameter-server cluster ({what}; {type(error).__name__}). "
        f"Parameter servers hold the model, so training stops here; {resume}.")
