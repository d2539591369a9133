"""When periodic work is due: one rule for checkpoints, summaries, validation and histograms.

`Every(steps=N)` is due at the global steps that are multiples of N (never at step 0) and
tells the training loop how far the next one is (`steps_to_boundary`), so a compiled loop
stops exactly there; `Every(secs=S)` is due once S seconds of its clock have passed since
`done()` (or since it was made); `Every(epochs=E)` at the end of every E-th epoch. A measure
that is 0 or None never fires; with several, the work is due when any of them is.

What is done when it is due, and on which task, is decided by the caller (`actions`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable


@dataclasses.dataclass
class Every:
    """A cadence in steps, seconds or epochs (see the module docstring).

    Args:
        steps: every N global steps.
        secs: every N seconds since the last `done()`.
        epochs: at the end of every N-th epoch.
        clock: `() -> seconds`; tests pass a fake one.
        last: when the seconds measure counts from (None: now, read from `clock`;
            `-inf`: due at once).
    """

    steps: int | None = None
    secs: float | None = None
    epochs: int | None = None
    clock: Callable[[], float] = time.monotonic
    last: float | None = None

    def __post_init__(self):
        if self.last is None:
            self.last = self.clock()

    def steps_to_boundary(self, step: int) -> int | None:
        """Steps from `step` to the next multiple of `steps` (None: no step measure)."""
        return self.steps - step % self.steps if self.steps else None

    def at_step(self, step: int) -> bool:
        """Whether `step` is one of the steps of the step measure."""
        return bool(self.steps) and step > 0 and step % self.steps == 0

    def due(self, step: int, now: float | None = None) -> bool:
        """Due at `step` by the step measure, or by the time since `done()`."""
        if self.at_step(step):
            return True
        if not self.secs:
            return False
        now = self.clock() if now is None else now
        return now - self.last >= self.secs

    def at_epoch_end(self, epoch: int) -> bool:
        """Due at the end of `epoch` (0-based) by the epoch measure."""
        return bool(self.epochs) and (epoch + 1) % self.epochs == 0

    def done(self, now: float | None = None) -> None:
        """The work was done now: the seconds measure counts from here."""
        self.last = self.clock() if now is None else now
