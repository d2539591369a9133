"""Where a parameter-server run's data stands: the position a checkpoint keeps and a resumed
run (or a later fit) goes on from."""

from __future__ import annotations

import logging

logger = logging.getLogger("kerastrain")


class DataPosition:
    """The data position of a `ps.driver.PSDriver`, as `SyncDriver` keeps its own.

    With exact visits (`kerastrain.distribute.ps.visits`), the global batches scheduled
    since the first pass began (`cursor`), kept by the input's reader between fits; for
    a job all workers share (the tf.data service), the passes read to their end and the
    steps the current one trained. Checkpointed as (passes begun, batches into the
    current pass).
    """

    def __init__(self):
        self.reader = None     # the input's `visits.Reader` in use
        self.per_pass = None   # its batches per pass (0: unknown; None: no reader yet)
        self.drained = 0       # passes of a shared job read to their end (`run_pass`)
        self.pass_steps = 0    # steps the current pass of a shared job trained

    @property
    def passes(self):
        """Passes over the data begun (as `SyncDriver.passes`; 1 when its size is unknown)."""
        if self.drained:
            return self.drained
        if self.per_pass is None:
            return 0
        if not self.per_pass:
            return 1 if self.cursor else 0
        return self.cursor // self.per_pass + (1 if self.cursor % self.per_pass else 0)

    @property
    def offset(self):
        """Batches into the current pass (all batches so far when its size is unknown)."""
        if self.drained:
            return self.pass_steps
        if not self.per_pass:
            return self.cursor if self.per_pass is not None else 0
        return self.cursor % self.per_pass

    @property
    def cursor(self):
        """Global batches scheduled since the first pass began (0 before any reader)."""
        return self.reader.cursor if self.reader is not None else 0

    @cursor.setter
    def cursor(self, value):
        self.reader.cursor = value

    def use(self, reader):
        """Read `reader`'s positions; the first time, begin where its last fit stopped.

        Starting again at position 0 would put every loop behind the workers'
        iterators: each would run as a fresh loop (new iterators that read up to
        its positions), one at a time.
        """
        self.per_pass = reader.positions.per_pass or 0
        if self.reader is reader:
            return
        self.reader = reader
        if self.per_pass and self.cursor % self.per_pass:
            self.cursor += self.per_pass - self.cursor % self.per_pass

    def fast_forward(self, train_input, passes, offset):
        if train_input.drains:
            # A shared job cannot be rejoined where it stood: the next epoch reads pass
            # `passes` (a new order for NumPy data) from its beginning.
            self.drained = train_input.passes_read = passes
            if offset:
                logger.warning(
                    "resumed %d step(s) into an epoch read through the tf.data service: the "
                    "epoch reads a whole new pass, so the examples of those steps are trained "
                    "again in it (a service job cannot be rejoined where it stood)", offset)
            return
        reader = train_input.reader()
        if reader is None:
            return
        self.use(reader)
        per_pass = self.per_pass
        if per_pass:  # a synchronous run counts a group the pass ended early as k batches
            offset = min(offset, per_pass)
        self.cursor = (passes - (1 if offset else 0)) * per_pass + offset if per_pass else offset
        where = (f"pass {self.cursor // per_pass + 1}, batch {self.cursor % per_pass} of "
                 f"{per_pass}" if per_pass else f"batch {self.cursor} of its stream")
        logger.info("the data continues at %s: no batch of the epoch is skipped; batches the "
                    "stopped run trained after this checkpoint are trained again (none after a "
                    "SIGTERM, which saves once its loops in flight finish)", where)
