"""Recovery from a NaN, infinite or spiking loss: go back to the last good state, skip the bad batch.

`Trainer(on_nonfinite="recover")` puts a `Recovery` action where `StopOnNonFinite`
would be. After a loop whose loss is not finite (or, with `spike_factor=k`, whose
mean loss is over k times the running median of the loops before it), it:

1. waits for loops still running (parameter servers), then restores the last good
   state: the newest checkpoint this `fit` saved in `model_dir`, or, where none
   was saved at or after the start of the epoch (no `model_dir`, or checkpoints
   not at epoch ends), a copy of the variables kept in memory at the epoch start.
   Model, optimizer slots and step counters all come back, so nothing a bad step
   wrote is kept; the learning rate and every other setting stay as they were.
2. under synchronous strategies, finds the bad batch and never trains on it: a
   loop runs many steps, so when it ran more than one the data goes back to the
   restored position and the loop's batches are replayed one step per loop until
   the bad one shows (its position in the data is then known); the state is
   restored once more and training goes on with every other batch. The result
   equals a run on the same data without that batch.
3. under parameter servers, loops are not replayed: the batches scheduled since the
   restored state are skipped (logged), and the data goes on from where it stood
   (with exact visits, `kerastrain.distribute.ps.visits`, those batches miss this pass).

After `max_recoveries` recoveries in one `fit` the next bad loss raises
`TooManyRecoveries`; the model then holds the last good state.
"""

from __future__ import annotations

import collections
import dataclasses
import logging

import keras
import numpy as np

from kerastrain import _compat
from kerastrain.loop import actions

logger = logging.getLogger("kerastrain")

SPIKE_HISTORY = 20     # loops whose mean losses make the running median
SPIKE_MIN_HISTORY = 5  # loops seen before a spike can be called one


class TooManyRecoveries(RuntimeError):
    """The loss went bad again after `max_recoveries` recoveries in one `fit`."""


def action(driver, *, on_nonfinite, max_recoveries, spike_factor, model, step, global_step,
           checkpointer, writer):
    """The `Recovery` of one `fit` (None with on_nonfinite="stop").

    Args:
        step: the `loops.Step`; a model's own step reports its last loss, not a sum.
        checkpointer: the `checkpoints.Checkpointer` whose saves are restore points (or None).
        writer: the chief's `MetricWriter` (None elsewhere).
    """
    from kerastrain.step import own_step as own_step_lib
    if on_nonfinite != "recover":
        return None
    own_step = isinstance(step, own_step_lib.ModelStep)

    def snapshot():
        extra = step.partitioned.update_optimizer.variables if step.partitioned else []
        return Snapshot(list(model.variables) + list(model.optimizer.variables) + list(extra)
                        + [global_step])

    def read_checkpoint(path):
        checkpointer.wait()  # a restore point still being written in the background
        checkpointer.checkpoint.read(path).expect_partial()

    def loop_loss(totals):
        return float(totals[0]) if own_step else float(totals[0]) / max(float(totals[1]), 1.0)

    return Recovery(driver, max_recoveries=max_recoveries, spike_factor=spike_factor,
                    snapshot=snapshot, read_checkpoint=read_checkpoint, loop_loss=loop_loss,
                    writer=writer)


class Snapshot:
    """The values of some variables, kept in this process's memory, to put back later.

    Works for mirrored (the primary copy is read; an assignment from the
    cross-replica context sets every replica), parameter-server and partitioned
    variables (each shard is kept).
    """

    def __init__(self, variables):
        sharded = _compat.sharded_variable_class()
        self._parts, seen = [], set()
        for v in variables:
            value = v.value if isinstance(v, keras.Variable) else v
            for part in value.variables if isinstance(value, sharded) else [value]:
                if id(part) not in seen:
                    seen.add(id(part))
                    self._parts.append(part)
        self._values = [np.array(part.numpy()) for part in self._parts]

    def restore(self):
        for part, value in zip(self._parts, self._values):
            part.assign(value)


@dataclasses.dataclass
class RestorePoint:
    """A good state to go back to: where training stood, and where its variables are."""

    step: int
    epoch: int
    batch: int
    totals: np.ndarray
    passes: int
    offset: int
    scheduled: int = 0              # batches scheduled so far (parameter servers)
    path: str | None = None         # a checkpoint ...
    snapshot: Snapshot | None = None  # ... or a copy in memory

    def describe(self) -> str:
        if self.path:
            return f"checkpoint {self.path} (step {self.step})"
        return f"the state of step {self.step} kept in memory at the epoch start"


class Recovery(actions.Action):
    """Restores the last good state after a bad loss and skips the batch that caused it.

    Args:
        driver: the epoch driver (`SyncDriver` finds and skips the batch; `PSDriver`
            waits for its loops).
        max_recoveries: recoveries allowed in one `fit`; the next bad loss raises.
        spike_factor: None, or k: a loop's mean loss over k times the running
            median of the previous loops' means is bad too.
        snapshot: `() -> Snapshot` of every variable training changes.
        read_checkpoint: `(path) -> None` restores a checkpoint into the variables.
        loop_loss: `(totals) -> float`, a loop's mean loss.
        writer: the chief's `MetricWriter` (None: nothing written).
    """

    def __init__(self, driver, *, max_recoveries, spike_factor, snapshot, read_checkpoint,
                 loop_loss, writer=None):
        self.driver = driver
        self.max_recoveries = max_recoveries
        self.spike_factor = spike_factor
        self.snapshot = snapshot
        self.read_checkpoint = read_checkpoint
        self.loop_loss = loop_loss
        self.writer = writer
        self.point = None
        self.count = 0
        self.losses = collections.deque(maxlen=SPIKE_HISTORY)

    # -- restore points ----------------------------------------------------------

    def epoch_begin(self, p):
        """Keep the state of the epoch start in memory, unless a checkpoint holds it."""
        point = self.point
        if point is None or point.epoch != p.epoch or point.step != p.step:
            self.point = self._point(p, snapshot=self.snapshot())

    def saved(self, path, p, epoch, batch, totals):
        """A checkpoint of this state was kept at `path` (None: not kept by this task)."""
        if path:
            self.point = self._point(p, epoch=epoch, batch=batch, totals=totals, path=path)

    def _point(self, p, *, epoch=None, batch=None, totals=None, **where):
        return RestorePoint(
            step=p.step, epoch=p.epoch if epoch is None else epoch,
            batch=p.batch if batch is None else batch,
            totals=np.array(p.totals if totals is None else totals, np.float64),
            passes=self.driver.passes, offset=self.driver.offset,
            scheduled=getattr(self.driver, "scheduled", 0), **where)

    # -- after each loop -----------------------------------------------------------

    def _bad(self, loss):
        """Why this loop's mean loss is bad, or None."""
        if not np.isfinite(loss):
            return f"a non-finite loss ({loss})"
        if self.spike_factor and len(self.losses) >= SPIKE_MIN_HISTORY:
            median = float(np.median(self.losses))
            if loss > self.spike_factor * median:
                return (f"a loss spike ({loss:.4g} > {self.spike_factor:g} x the running "
                        f"median {median:.4g})")
        return None

    def __call__(self, p):
        last = p.last
        # A result of one batch (`LoopResult.batches`) is judged by that batch's loss.
        if p.epoch_end or not (last.steps if last.batches is None else last.batches):
            return
        loss = self.loop_loss(p.last.totals)
        why = self._bad(loss)
        if why is None:
            self._accept(loss)
            return
        self._recover(p, why)
        p.stop = actions.RECOVERING

    def _accept(self, loss):
        self.losses.append(loss)
        probe = getattr(self.driver, "probe", None)
        if probe is not None and (self.driver.passes, self.driver.offset) >= (probe[0], probe[2]):
            logger.warning("replayed batches %d-%d of data pass %d one step at a time and every "
                           "loss was finite: nothing skipped", probe[1], probe[2] - 1, probe[0])
            self.driver.probe = None

    def _recover(self, p, why):
        at_step, loop = p.step, self.driver.last_loop
        if getattr(self.driver, "probe", None) is None:
            self.count += 1  # a replay that finds the batch is the same recovery
        if self.count > self.max_recoveries:
            restored = self._restore(p)
            raise TooManyRecoveries(
                f"Gave up: {why} at step {at_step} (epoch {p.epoch + 1}), after "
                f"{self.max_recoveries} recoveries in this fit; the model holds {restored}. "
                "A loss that goes bad again after bad batches are skipped usually comes from the "
                "training itself (learning rate too high, an unstable layer), not from the data: "
                "lower the learning rate, or raise `max_recoveries` if the data has more bad "
                f"batches. Received: max_recoveries={self.max_recoveries}")
        if loop is not None and loop[2] > 1:
            self.driver.probe = (loop[0], loop[1], loop[1] + loop[2])
            restored = self._restore(p)
            logger.warning("%s in the loop of steps %d-%d (epoch %d): restored %s; replaying batches "
                           "%d-%d of data pass %d one step at a time to find the bad one", why,
                           at_step - loop[2] + 1, at_step, p.epoch + 1, restored, loop[1],
                           loop[1] + loop[2] - 1, loop[0])
            return
        if loop is not None:
            self.driver.skips.add((loop[0], loop[1]))
            self.driver.probe = None
            skipped = f"skipped 1 batch (batch {loop[1]} of data pass {loop[0]})"
        else:
            n = self.driver.scheduled - self.point.scheduled
            skipped = f"skipped the {n} batches scheduled since then ({self.driver.replay_note})"
        restored = self._restore(p)
        line = (f"recovered from {why} at step {at_step} (epoch {p.epoch + 1}): restored "
                f"{restored}, {skipped}; recovery {self.count} of at most {self.max_recoveries}")
        logger.warning(line)
        if self.writer is not None:
            self.writer.write_scalars(at_step, {"recoveries": self.count})
            self.writer.write_texts(at_step, {"recovery": line})

    def _restore(self, p):
        """Put the variables, the progress and the data back where the restore point stood."""
        self.driver.settle()
        point = self.point
        if point.path:
            self.read_checkpoint(point.path)
        else:
            point.snapshot.restore()
        p.step, p.batch, p.totals = point.step, point.batch, point.totals.copy()
        self.driver.seek(point.passes, point.offset)
        point.scheduled = getattr(self.driver, "scheduled", 0)  # those batches are gone
        return point.describe()
