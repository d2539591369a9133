"""How long one fit's epochs and compiled loops are: steps per epoch, what callbacks are told,
steps per compiled call."""

from __future__ import annotations

import logging

from kerastrain.data import inputs as data_lib
from kerastrain.loop import callbacks as callbacks_lib

logger = logging.getLogger("kerastrain")


class Lengths:
    """The lengths of one fit's epochs and loops.

    Args:
        step: the compiled step (its accumulation; whether it runs eagerly).
        model: the model trained (its `steps_per_execution`).
        mode: the kind of strategy (`modes`): the epoch length of data without a set size,
            what "auto" loop sizes come to.
        steps_per_loop: as asked: an int or "auto".
        loop_sizer: the Trainer's `tuning.LoopSizer` (what "auto" measured stays measured).
        tuning: the Trainer's `tuning.TuningOptions`.
        num_workers: the strategy's workers (for the log line).
    """

    def __init__(self, step, model, mode, *, steps_per_loop, loop_sizer, tuning, num_workers):
        self.step, self.model, self.mode = step, model, mode
        self.asked_steps_per_loop = steps_per_loop
        self.loop_sizer, self.tuning, self.num_workers = loop_sizer, tuning, num_workers
        self.steps_per_epoch = None  # as `epoch_length` decided

    def epoch_length(self, train_input, steps_per_epoch):
        """Steps in an epoch: as asked, else one pass of finite data (None: a pass of a
        shared tf.data service job, whose end the workers find).

        Raises:
            ValueError: infinite data without `steps_per_epoch`.
        """
        self.steps_per_epoch = self._epoch_length(train_input, steps_per_epoch)
        return self.steps_per_epoch

    def _epoch_length(self, train_input, steps_per_epoch):
        if steps_per_epoch is not None:
            every = callbacks_lib.steps_per_execution(self.model)
            if steps_per_epoch % every:
                # Keras 3.15's fit runs whole executions of `steps_per_execution` batches,
                # so an epoch runs to the next multiple (its own tests count so).
                whole = -(-steps_per_epoch // every) * every
                logger.info("steps_per_epoch=%d is not a multiple of the model's "
                            "steps_per_execution=%d: an epoch runs %d steps (whole "
                            "executions), as model.fit does", steps_per_epoch, every, whole)
                return whole
            return steps_per_epoch
        n = train_input.cardinality
        if n == data_lib.INFINITE:
            raise ValueError(
                "The training data is infinite (it repeats), so an epoch has no end: pass "
                "`steps_per_epoch`. Received: steps_per_epoch=None")
        if train_input.drains and self.step.accumulation == 1:
            logger.info("steps_per_epoch=None through the tf.data service under parameter "
                        "servers: one epoch is one pass of a job the %d workers read to its "
                        "end, each example of the pass once", self.num_workers)
            return None
        return self.mode.epoch_length(n, self.step.accumulation)

    def steps_known(self, train_input):
        """Steps in an epoch where known (after `epoch_length`): as asked, else one pass of
        data of known size (None: unknown). What Keras gives callbacks as `params["steps"]`."""
        return self.steps_per_epoch or steps_the_data_holds(train_input, self.step)

    def steps_per_loop(self, callbacks, steps_per_epoch, train_input):
        """Steps per compiled call: as asked, or what "auto" comes to for this fit: one of
        the model's executions (`steps_per_execution` batches) when a callback needs the
        batch hooks of each, as `model.fit` calls them (an asked size is cut there by the
        `actions.Callbacks` boundaries)."""
        acting = sorted({type(cb).__name__ for cb in callbacks
                         if callbacks_lib.needs_every_execution(cb)})
        every = callbacks_lib.steps_per_execution(self.model)
        if acting:
            logger.info("callbacks acting at batches (%s): loops end after every %d batch(es), "
                        "where model.fit calls their batch hooks (compile(steps_per_execution"
                        "=N) calls them every N batches)", ", ".join(acting), every)
        if self.asked_steps_per_loop != "auto":
            return self.asked_steps_per_loop
        if self.step.eager:
            return 1  # run_eagerly: debugging, one step per loop (nothing to amortise)
        if acting:
            return -(-every // self.step.accumulation)
        if steps_per_epoch is None and train_input.drains and train_input.cardinality > 0:
            steps_per_epoch = train_input.cardinality  # a pass's batches, about
        return self.mode.auto_steps_per_loop(steps_per_epoch, sizer=self.loop_sizer,
                                             measure=self.tuning.measure_steps_per_loop)


def batches_the_data_holds(train_input):
    """Batches in one pass of data of known size (None: unknown or infinite)."""
    n = train_input.cardinality
    return n if n >= 0 else None


def steps_the_data_holds(train_input, step):
    """Steps in one pass of data of known size (None: unknown or infinite). An epoch
    that ends where the data does still knows its last loop: a mid-epoch checkpoint
    there would stand in for the epoch end's, and a finished run would resume
    "16 steps into epoch 2 of 2" instead of "after epoch 2 of 2"."""
    n = train_input.cardinality
    return -(-n // step.accumulation) if n >= 0 else None
