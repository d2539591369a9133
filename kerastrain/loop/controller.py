"""The controller of one `fit`: the epochs from the restored step to the last, and what
happens after each compiled loop.

In the manner of Orbit's `Controller`: `Trainer.fit` resolves the data and builds the step,
then hands over to `Controller.fit`, which owns the rest of the epoch: the callbacks and their
History, the SIGTERM watch and preemption, the restore, the list of actions (validation,
summaries, checkpoints, callbacks; `loop/actions.py`) run in order after each loop and epoch,
and the final save and export. It meets the inner loop at one small contract: the driver
(`loop/driver.py`, made by the kind of strategy, `loop/modes.py`) runs the compiled loops of an
epoch (`step/loops.py`) and yields one `driver.LoopResult` per loop. How long an epoch and a
loop are is `loop/lengths.py`'s.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging

import numpy as np

from kerastrain import _logging
from kerastrain.loop import actions as actions_lib
from kerastrain.loop import callbacks as callbacks_lib
from kerastrain.loop import driver as driver_lib
from kerastrain.loop import lengths as lengths_lib
from kerastrain.loop import recovery as recovery_lib
from kerastrain.loop import stalls
from kerastrain.loop import tuning as tuning_lib
from kerastrain.step import instances
from kerastrain.step import updates

logger = logging.getLogger("kerastrain")
# The data's position at a batch a callback stopped at, as a checkpoint keeps it.
Position = collections.namedtuple("Position", ["passes", "saved_offset"])


class Controller:
    """One `fit`, from the restored step to the last epoch (see the module docstring).

    Args:
        state: the Trainer's `training_state.TrainingState` (its model, compiled step, global step,
            run state and strategy), once built.
        config: the Trainer's `_options.TrainerConfig` (steps_per_loop, stall_timeout,
            on_nonfinite, max_recoveries, spike_factor).
        loop_sizer: the Trainer's `tuning.LoopSizer` (what "auto" measured stays measured).
        tuning: the Trainer's `tuning.TuningOptions`.
        beats: the Trainer's `stalls.Beats`: the epochs' stall watch takes its beats while
            they run (an evaluation's loops beat it too).
        user_actions: the `actions.Action`s given to `fit(actions=...)`.
        user_model: the user's own model object when kerastrain trains a copy and the
            fit has callbacks: it takes the weights at each epoch end before they run, as
            under `model.fit` (a callback may close over that object); None: nothing.
    """

    def __init__(self, state, config, *, loop_sizer, tuning, beats, user_actions=(),
                 user_model=None):
        self.step, self.model, self.global_step = state.step, state.model, state.global_step
        self.run_state, self.mode = state.run, state.mode
        self.strategy_name, self.num_workers = state.built.name, state.built.num_workers
        self.stall_timeout = stalls.check(config.stall_timeout)
        self.nonfinite = dict(on_nonfinite=config.on_nonfinite,
                              max_recoveries=config.max_recoveries,
                              spike_factor=config.spike_factor)
        self.asked_steps_per_loop = config.steps_per_loop
        self.tuning, self.beats = tuning, beats
        self.lengths = lengths_lib.Lengths(
            self.step, self.model, self.mode, steps_per_loop=config.steps_per_loop,
            loop_sizer=loop_sizer, tuning=tuning, num_workers=self.num_workers)
        self.state = state
        self.before_epoch_end = None if user_model is None else functools.partial(
            instances.hand_back, self.model, user_model, keep_functions=True)
        self.user_actions = list(user_actions)
        self.recovery = None  # a `recovery.Recovery` with on_nonfinite="recover"
        self.ended = None     # a callback's stop (`train`), for `finish` to save and record
        self.stopped_at = None  # a stop at a batch: the position then (`_epoch`)
        # What `fit` decides for the rest of its fit (a Controller runs one fit): its
        # `trainer_inputs.FitInputs`, the driver, the callbacks and their list, the epoch's
        # length in steps (None: to the data's end), where the restore left the run (None: at
        # the start).
        self.inputs = self.driver = self.callback_list = self.resumed = None
        self.callbacks, self.steps_per_epoch = (), None

    def fit(self, inputs, workdir, *, epochs, steps_per_epoch, initial_epoch, callbacks,
            verbose, validation_steps=None, validation_freq=1):
        """Train `inputs.train` from where the run stands to `epochs` and return the History.

        A Controller runs one fit: what it decides here (the driver, the callbacks' list, the
        epoch's length, where a restore left the run) is its own for the rest of the fit.

        Args:
            inputs: the fit's `trainer_inputs.FitInputs`: the training data and the validation data
                (`data.distributed.DistributedInput`s; validation may be None).
            workdir: the Trainer's `workdir.WorkDir` (TensorBoard, the export's record).
            epochs, steps_per_epoch, initial_epoch, callbacks, verbose, validation_steps,
                validation_freq: as `model.fit` takes them, checked.
        """
        state, model, train_input = self.state, self.model, inputs.train
        self.inputs, self.callbacks = inputs, callbacks
        self.steps_per_epoch = self.lengths.epoch_length(train_input, steps_per_epoch)
        self.callback_list = callbacks_lib.callback_list(
            callbacks, model=model, verbose=verbose, epochs=epochs,
            steps=self.lengths.steps_known(train_input))
        watch = state.sigterm_watch()
        self.driver = self._new_driver(watch)  # stops after a SIGTERM or a callback's stop
        self.resumed = self.run_state.restore(self.driver, train_input, self.global_step.numpy,
                                              epochs)
        initial_epoch = self.run_state.first_epoch(self.resumed, initial_epoch, epochs)
        first_step = state.steps_taken
        monitor = workdir.monitor(model, first_step, train_input.element_spec)
        self.callback_list.on_train_begin()
        with instances.handing_back(model, state.user_model):  # after on_train_end
            with state.cluster_errors_explained(), state.preemption_agreement() as agree, \
                    watch, monitor, self.run_state.writes_settled():
                listed = self.actions(watch, agree, monitor, validation_steps, validation_freq)
                progress = self.train(listed, range(initial_epoch, epochs))
            if watch.preempted is not None:
                raise watch.preempted  # after the handlers above have let go of SIGTERM
            self.callback_list.on_train_end(progress.logs or {})  # once the last save is written
        self.finish(progress, first_step, state.source, workdir)
        state.follow_workdir()  # a finished backup's run returns to the Trainer's model_dir
        return callbacks_lib.history_of(self.callback_list, state.user_model)

    def let_go_of_the_data(self):
        """Drop what reads the training data (the driver, which holds the iterator, and the
        inputs) once the fit is over, however it ended (`Trainer.fit`): a pipeline kept after
        it goes on prefetching, and freeing a distributed iterator waits for its threads (0.2
        s here, and up to the period of tf.data's autotuning, which grows with the iterator's
        age), and forever for a tf.data service that was stopped (`Trainer.close`)."""
        self.driver = self.inputs = self.ended = None
        if self.recovery is not None:
            self.recovery.driver = None

    def _new_driver(self, sigterm):
        """The driver of this strategy's epochs (`modes`): this task's replicas, or the ps
        workers. It stops scheduling loops once a SIGTERM came (`sigterm`, the fit's
        `preemption.SigtermWatch`) or a callback set `model.stop_training`."""
        run, model = self.run_state, self.model
        return self.mode.driver(
            self.step, stop_requested=lambda: sigterm.requested or model.stop_training,
            callbacks=self.callbacks,
            steps_per_loop=self.asked_steps_per_loop, global_step=self.global_step,
            checkpointer=run.checkpointer, latest_checkpoint=run.latest_checkpoint)

    def actions(self, watch, agree, monitor, validation_steps=None, validation_freq=1):
        """What happens after each loop and epoch, in order (every task runs each; what the
        chief keeps is `io/outputs.py`'s): `watch` is the fit's SIGTERM watch, `agree` the
        workers' agreement on where to stop (or None), `monitor` the chief's `monitor.Monitor`."""
        driver, train_input, steps_per_epoch = self.driver, self.inputs.train, self.steps_per_epoch
        # Batches in an epoch where known: `model.fit` begins no batch past them.
        batches_known = steps_per_epoch * self.step.accumulation if steps_per_epoch else (
            lengths_lib.batches_the_data_holds(train_input))
        steps_per_epoch = steps_per_epoch or lengths_lib.steps_the_data_holds(train_input,
                                                                              self.step)
        results, run = self.step.results, self.run_state
        recovery = self.recovery = recovery_lib.action(
            driver, **self.nonfinite, model=self.model, step=self.step,
            global_step=self.global_step, checkpointer=run.checkpointer,
            writer=monitor.writer if monitor.active else None)

        def save(p, epoch, batch, totals):
            path = run.save(driver, epoch, batch, totals, p.step)
            if recovery is not None:
                recovery.saved(path, p, epoch, batch, totals)
            return path

        listed = [actions_lib.Preemption(watch, lambda p: save(p, p.epoch, p.batch, p.totals)),
                  recovery or actions_lib.StopOnNonFinite(self.model)]
        if self.inputs.validation is not None:
            listed.append(actions_lib.Validation(
                functools.partial(self.state.evaluate, self.inputs.validation, validation_steps,
                                  beat=self.beats),  # the epochs' watch, once it runs
                every=validation_freq, callbacks=self.callback_list, model=self.model))
        # Listed on every task: only the chief's monitor has a writer, but every worker
        # of a multi-worker job must end its loops at the same log steps (a loop that
        # reads on to the data's end alone waits forever for the others' collectives).
        listed.append(actions_lib.Summaries(monitor, results, timed=self.mode.timed_summaries))
        if run.checkpointer is not None:  # every task saves; only the chief keeps files
            listed.append(actions_lib.Checkpoints(run.checkpointer, save, steps_per_epoch))
        if agree is not None:
            listed.append(actions_lib.AgreeOnPreemption(
                agree, lambda p: run.set(driver, p.epoch, p.batch, p.totals)))
        if self.user_actions:
            listed.append(actions_lib.UserActions(self.user_actions))
        listed.append(actions_lib.Callbacks(self.callback_list, self.model, results,
                                            self.step.accumulation, self.before_epoch_end,
                                            batches_known=batches_known))
        return listed

    def train(self, listed, epochs):
        """Run `epochs` (a range) with the actions `listed`, then end them as `model.fit` does
        unless preempted (training goes on elsewhere): an EMA optimizer's averages become the
        weights. A stop a callback asked for is kept for `finish` (`self.ended`)."""
        train_input = self.inputs.train
        progress = self._run(listed, epochs, self.lengths.steps_per_loop(
            self.callbacks, self.steps_per_epoch, train_input))
        if progress.stop != actions_lib.PREEMPTED:
            updates.finalize(self.model, epochs.stop)
        if progress.stop == actions_lib.REQUESTED:  # saved again once on_train_end has run
            # Within its epoch where a batch's stop left some of it (unknown: as a mid-epoch
            # save); else (an epoch end, ps with loops in flight) saved as after that epoch.
            at, known = self.stopped_at, self.lengths.steps_known(train_input)
            self.ended = dict(driver=self.driver, progress=progress, epochs=epochs.stop,
                              within=at if at and (known is None or at["batch"] < known) else None,
                              reason=callbacks_lib.why_stopped(self.callbacks, self.model))
        return progress

    def _run(self, listed, epochs, steps_per_loop):
        """Run the epochs: the driver's loops, the actions after each loop and epoch."""
        p = actions_lib.Progress(epoch=epochs.start, step=int(self.global_step.numpy()),
                                 batch=0, totals=np.zeros(self.step.width, np.float64))
        self._say_tuning(bool(len(epochs)), steps_per_loop)
        # Progress after each loop and epoch end, after every action: a beat (no hang).
        with self.stall_watch() as watch:
            listed = [*listed, actions_lib.Heartbeat(watch)]
            for epoch in epochs:
                logs = p.logs  # the last epoch's
                self._epoch(p, epoch, listed, steps_per_loop)
                if p.batch == 0 and not p.stop and epoch > epochs.start:
                    return self._ran_out(p, epoch, logs)
                if p.last is None and not p.stop:
                    # No loop ran: a stop came before the epoch's first (SIGTERM between epochs
                    # under ps, where nothing is scheduled then). The actions still see it.
                    p.last = driver_lib.LoopResult(np.zeros_like(p.totals), 0)
                    actions_lib.run(listed, p)
                if p.stop == actions_lib.PREEMPTED:
                    return p
                if p.batch == 0:
                    raise ValueError(
                        f"`dataset_fn` produced no batches in epoch {epoch}. Check that the "
                        "dataset is not empty and that each input pipeline gets data.")
                p.logs = self.step.results(p.totals)
                self.driver.epoch_done(self.steps_per_epoch)
                if actions_lib.run(listed, p).stop:
                    return p
            return p

    def _epoch(self, p, epoch, listed, steps_per_loop):
        """One epoch's loops (from where a restore left it), the actions after each; again
        from the restored state when a recovery went back. `p` is the fit's Progress."""
        step, driver, resumed = self.step, self.driver, self.resumed
        self.callback_list.on_epoch_begin(epoch)
        step.start_epoch()
        p.epoch, p.batch, p.logs, p.last = epoch, 0, None, None
        p.totals = np.zeros(step.width, np.float64)
        if resumed is not None and epoch == resumed["epoch"] and resumed["step_in_epoch"]:
            p.totals, p.batch = resumed["totals"].copy(), resumed["step_in_epoch"]
        actions_lib.epoch_begin(listed, p)
        # The callbacks' begin hooks, before each loop (`p` is where it starts).
        before = next((functools.partial(a.loop_begin, p) for a in listed
                       if isinstance(a, actions_lib.Callbacks)), None)
        p.stop = actions_lib.RECOVERING
        while p.stop == actions_lib.RECOVERING:  # again from the restored state
            p.stop = None
            remaining = None if self.steps_per_epoch is None else self.steps_per_epoch - p.batch
            for result in driver.run_epoch(
                    self.inputs.train, remaining, steps_per_loop, p.step,
                    functools.partial(actions_lib.steps_to_boundary, listed), before=before):
                p.last = result
                p.totals = step.accumulate(p.totals, result.totals)
                p.batch += result.steps
                p.step += result.steps
                if actions_lib.run(listed, p).stop:
                    break
        if p.stop == actions_lib.REQUESTED and p.last.in_sync:
            # A callback's stop at a batch: where it and the data stood (`train`).
            self.stopped_at = dict(batch=p.batch, totals=p.totals.copy(),
                                   data=Position(driver.passes, driver.saved_offset))

    @staticmethod
    def _ran_out(p, epoch, logs):
        """Data read once (a generator) ended before this epoch: training stops here, as
        `model.fit` stops, with its warning (which shows at verbose=0)."""
        logger.warning(
            "Your input ran out of data; interrupting training (as model.fit): epoch %d "
            "found no batches. Make sure that your dataset or generator can generate at "
            "least `steps_per_epoch * epochs` batches: a generator yields its batches once, "
            "a keras.utils.PyDataset or a dataset again every epoch.", epoch)
        p.logs, p.stop = logs, actions_lib.RAN_OUT
        return p

    def finish(self, progress, first_step, model_source, workdir):
        """Unless the loss diverged: the stop a callback asked for saved again with the
        weights `on_train_end` left (`run_state.RunState.save_end`); export after training, or
        when the export is missing or stale (a resumed run with nothing left to train keeps
        a current export); then a finished backup goes."""
        if progress.stop == actions_lib.DIVERGED:
            return
        step, run = int(self.global_step.numpy()), self.run_state
        if self.ended is not None:  # a callback ended the run: keep the weights of its end
            run.save_end(**self.ended)
        if step > first_step or run.export_missing(step):
            if run.export(self.model, model_source=model_source, step=step,
                          partitioned=self.step.partitioned):
                workdir.wrote_export()
        workdir.backup_done()

    @contextlib.contextmanager
    def stall_watch(self):
        """The epochs' `stalls.StallWatch`, which takes the `beats` while it runs (each
        evaluation loop beats it too). "auto" watches only where a peer can stall this task
        (multi-worker mirrored, parameter servers): a process alone that is slow is not
        stalled, and nothing of it would be restarted."""
        timeout = self.stall_timeout
        if timeout == "auto" and not self.mode.peers_can_stall:
            timeout = None
        # A stuck worker of a ps cluster can be named, and restarted: within seconds by the
        # mode's worker watch, at the stall bound by the stall watch's probe.
        with stalls.StallWatch(timeout, what=f"training under {self.strategy_name}",
                               probe=self.mode.stall_probe()) as watch, \
                self.mode.worker_watch(), self.beats.to(watch):
            yield watch

    def _say_tuning(self, training, steps_per_loop):
        """The loop's own tuning notes, then the one line of this fit's (none when nothing
        is left to train)."""
        if isinstance(steps_per_loop, tuning_lib.LoopSizer):
            _logging.tuning("steps_per_loop measured in the first loops", "steps_per_loop="
                            "'auto': measured in the first loops (said once measured)")
        else:
            _logging.tuning(f"steps_per_loop {steps_per_loop}", "steps_per_loop: %s",
                            steps_per_loop)
        if self.tuning.unroll_steps:
            _logging.tuning(f"up to {tuning_lib.UNROLL} steps per loop iteration where the "
                            "input allows",
                            "training loop: up to %d steps per iteration (said when used)",
                            tuning_lib.UNROLL)
        _logging.tuning_summary(say=training)
