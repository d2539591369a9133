"""One object per kind of strategy: what differs between them, asked by the Trainer.

Keras keeps one trainer per backend; kerastrain keeps one mode per kind of strategy, so the
Trainer wires the same pieces in the same order and never tests which strategy it runs:

- `Synchronous`: one task's replicas (default, one device, mirrored, central storage). Loops
  run here; their length may be measured; SIGTERM is this process's own; its loops read
  the data (through the tf.data service too).
- `MultiWorker` (multi-worker mirrored): the same loops on every worker in step. Workers must
  agree where loops stop, so none stops on its own flag and none measures its own loop
  length; TensorFlow's `PreemptionCheckpointHandler` owns SIGTERM; a lost peer is one error.
  NumPy orders share a seed; each task predicts alone; the tf.data service is refused.
- `ParameterServers`: loops scheduled on workers by a `ClusterCoordinator`
  (`ps.driver.PSDriver`); a loop at most one worker's share of an epoch; results arrive after
  joins (running summaries are not timed); evaluation runs on the chief; a stall names the
  worker that does not answer. Workers build their input from graphs, take batches in turn
  and may train the exact positions the coordinator hands out.

Each mode's `input_policy()` is what the data layer follows (`data.policy.InputPolicy`).

Each builds its step (`step`: the parameter servers' is `kerastrain.step.ps.steps`) and says,
in step terms, what the step side does differently (`step_policy`, a `step.policy.StepPolicy`).
`for_strategy(built)` picks the mode of a `strategies.BuiltStrategy`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging

from kerastrain.loop import callbacks as callbacks_lib
from kerastrain.data import inputs as data_lib
from kerastrain.data import policy as input_policies
from kerastrain.data import service as service_lib
from kerastrain.data.ps import workers as ps_data
from kerastrain.distribute.ps import inputs as ps_inputs
from kerastrain.loop import driver as driver_lib
from kerastrain.loop import preemption
from kerastrain.loop import stalls
from kerastrain.loop import tuning as tuning_lib
from kerastrain.loop.ps import driver as ps_driver
from kerastrain.loop.ps import liveness
from kerastrain.step import loops as loops_lib
from kerastrain.step import own_step
from kerastrain.step import policy as step_policies
from kerastrain.step.ps import placement as ps_placement
from kerastrain.step.ps import steps as ps_steps

logger = logging.getLogger("kerastrain")

AUTO_STEPS_PER_LOOP = 100  # long enough to amortise a call, short enough for progress


def check_options(built, config, service_options):
    """Options the strategy `built` cannot honour (`jit_compile=True` where variables are
    placed, recovery under multi-worker mirrored, the tf.data service where it cannot
    serve): a clear error before the model is built."""
    tuning_lib.check_jit_compile(config.jit_compile, built)
    mode = for_strategy(built)
    mode.check_options(config)
    service_lib.check_strategy(service_options, built, mode.input_policy())


class Synchronous:
    """This task's replicas run every loop (see the module docstring)."""

    def __init__(self, built):
        self.built = built

    def check_options(self, config):
        """Options of the `TrainerConfig` this kind cannot honour (none here)."""

    # -- the step -------------------------------------------------------------------------

    step_policy = step_policies.StepPolicy()

    def step(self, model, global_step, **options):
        """The compiled step of `model` (`own_step.step_for`, which says the `options`)."""
        return own_step.step_for(self.built, model, global_step, policy=self.step_policy,
                                 **options)

    # -- stopping -----------------------------------------------------------------------

    stops_on_own_flag = True  # a loop ends early when this task's stop flag is set
    stop_flag_in_scope = False  # the flag is a variable of this task's own
    owns_sigterm = True       # the SIGTERM handler is kerastrain's (`preemption.SigtermWatch`)
    # Checkpoints may be written in the background: the values are copied to this host and
    # only the chief keeps files (the chief rule: `io/outputs.py`).
    background_checkpoints = True
    # Foreground saves through one traced function (`_compat.TracedCheckpointWrite`).
    traced_checkpoints = False
    # Every task takes part in each save and export (tasks but the chief into a removed
    # scratch directory), so none exports alone.
    every_task_saves = False

    @contextlib.contextmanager
    def preemption_agreement(self, checkpointer, model_dir):
        """Yield `agree(step)` where workers must agree on a step to stop at, else None."""
        yield None

    def explain_lost(self, error, latest_checkpoint):
        """The error to raise for a lost cluster task (None: raise the original)."""
        return None

    # -- loops ----------------------------------------------------------------------------

    def auto_steps_per_loop(self, steps_per_epoch, *, sizer, measure):
        """`steps_per_loop="auto"` where no callback needs every execution: measured on the
        first loops (`sizer`, a `tuning.LoopSizer`) when `measure`, else a constant."""
        return sizer if measure else AUTO_STEPS_PER_LOOP

    def driver(self, step, *, stop_requested, callbacks, steps_per_loop, global_step,
               checkpointer, latest_checkpoint):
        """The driver of this strategy's epochs (`latest_checkpoint()`: the path a lost task's
        error names). When a callback needs the batch hooks of every execution and a step
        reads several batches, one batch per loop (as `model.fit` runs a step a batch)."""
        watched = any(map(callbacks_lib.needs_every_execution, callbacks))
        batches = step.batch_loop() if watched else None
        return driver_lib.SyncDriver(step.train_loop(), loops_lib.skip_loop(), step.accumulation,
                                     batch_loop=batches, reset=step.reset_held,
                                     jit_trial=step.jit_trial)

    def epoch_length(self, cardinality, accumulation):
        """Steps of an epoch asked with `steps_per_epoch=None`, from the data's `cardinality`
        (batches, or `data.UNKNOWN`): None, the epoch ends where the data does."""
        return None

    timed_summaries = True  # a loop's result arrives when it ends: throughput is timed

    def evaluation(self, step, eval_input):
        """`(loop, iterator)` of an evaluation pass."""
        return step.eval_loop(), iter(eval_input.distributed())

    # -- stalls ---------------------------------------------------------------------------

    peers_can_stall = False  # "auto" stall_timeout watches only where a peer can stall

    def stall_probe(self):
        """`() -> workers that answer no request`, or None where none can be named."""
        return None

    def worker_watch(self):
        """A context that names workers answering no request while it is active (a
        `liveness.WorkerWatch`), where a coordinator depends on them; else nothing."""
        return contextlib.nullcontext()

    # -- input ----------------------------------------------------------------------------

    def input_policy(self):
        """How the data is read (`data.policy.InputPolicy`): one pipeline per worker, read
        by this task's loops; the default strategy reads the dataset as it is, None inputs
        too. CentralStorageStrategy's distributed datasets drop a last batch its replicas
        cannot split (measured, TF 2.21: 13 examples in batches of 6 lose the 13th), so its
        predictions run here, on the variables' own device."""
        name = self.built.name
        return input_policies.InputPolicy(pipelines=max(self.built.num_workers, 1),
                                      predicts_here=name == "central_storage",
                                      absent_inputs=name == "default")


class MultiWorker(Synchronous):
    """Multi-worker mirrored: every worker runs the same loops (see the module docstring)."""

    stops_on_own_flag = False
    owns_sigterm = False
    peers_can_stall = True
    background_checkpoints = False  # every worker takes part in a save
    every_task_saves = True  # on-read variables are read collectively
    step_policy = step_policies.StepPolicy(
        logs_mean_spans_tasks=True,
        eager_refused=("multi-worker mirrored runs every step on every worker in step, "
                       "through collectives kerastrain runs compiled only"))

    def check_options(self, config):
        # A recovery must restore the same state on every task.
        if config.on_nonfinite == "recover":
            raise ValueError(
                "`on_nonfinite='recover'` is not available under multi-worker mirrored yet: "
                "every worker would have to restore the chief's checkpoint at the same step. "
                "Use on_nonfinite='stop' and rerun from the last checkpoint. Received: "
                "on_nonfinite='recover'")

    @contextlib.contextmanager
    def preemption_agreement(self, checkpointer, model_dir):
        if checkpointer is None or not model_dir:
            yield None
            return
        agree, release = preemption.multi_worker_handler(self.built.strategy.cluster_resolver,
                                                         checkpointer)
        try:
            yield agree
        finally:
            release()

    def explain_lost(self, error, latest_checkpoint):
        return driver_lib.lost_peer(error, latest_checkpoint)

    def auto_steps_per_loop(self, steps_per_epoch, *, sizer, measure):
        # Workers must agree on their loops, and a measurement each could differ.
        return AUTO_STEPS_PER_LOOP

    def input_policy(self):
        # Every worker shuffles NumPy data alike, or its shard would not be exact; each
        # predicts all of it alone; a shared service job does not end on every worker at
        # the same step, as their collectives need.
        return dataclasses.replace(super().input_policy(), shared_order_seed=True,
                                   predicts_here=True, service=None)


class ParameterServers(Synchronous):
    """A `ClusterCoordinator` schedules loops on workers (see the module docstring)."""

    peers_can_stall = True
    timed_summaries = False  # results arrive after a join
    # TensorFlow keeps the asynchronous copy on each variable's own task: the write would
    # read the parameter servers while training goes on, and fail with them.
    background_checkpoints = False
    # An eager save over several tasks registers a new function with every worker each time.
    traced_checkpoints = True
    # The workers' loops read the stop flag: on a parameter server, as the model's variables.
    # On the coordinator, each worker step called into the coordinator's own server to
    # read it, the path of a rare "Unable to parse request" (a device name corrupted in the
    # request, "String field 'tensorflow.eager.Operation.device' contains invalid UTF-8").
    stop_flag_in_scope = True
    step_policy = step_policies.StepPolicy(
        eager_refused=("a parameter-server coordinator schedules each loop on a remote worker "
                       "as a tf.function, which cannot run eagerly"),
        stateful_refused="its workers train batches in no set order, all on one state",
        placement=ps_placement.ServerPlacement())

    def step(self, model, global_step, **options):
        return ps_steps.step_for(self.built, model, global_step, policy=self.step_policy,
                                 **options)

    def explain_lost(self, error, latest_checkpoint):
        return driver_lib.lost_cluster(error, latest_checkpoint)

    def auto_steps_per_loop(self, steps_per_epoch, *, sizer, measure):
        workers = self.built.num_workers
        if steps_per_epoch and workers > 1:
            # One loop at most one worker's share, or one worker may take the epoch.
            return min(AUTO_STEPS_PER_LOOP, -(-steps_per_epoch // workers))
        return AUTO_STEPS_PER_LOOP

    def epoch_length(self, cardinality, accumulation):
        if cardinality == data_lib.UNKNOWN:
            raise ValueError(
                "Under parameter-server training the coordinator schedules a fixed number "
                "of steps per epoch, and the size of this dataset is unknown (e.g. after "
                "`filter`): pass `steps_per_epoch`. Received: steps_per_epoch=None")
        # Worker i reads shard i; one epoch is as many steps as the shards have batches
        # together, whichever worker takes them (k batches a step when the optimizer
        # accumulates k).
        k = accumulation
        steps = -(-cardinality // k)
        logger.info("steps_per_epoch=None under parameter servers: one epoch is %d steps "
                    "(the data's batches%s), spread over %d workers", steps,
                    f" / {k} accumulated per step" if k > 1 else "", self.built.num_workers)
        return steps

    def driver(self, step, *, stop_requested, callbacks, steps_per_loop, global_step,
               checkpointer, latest_checkpoint):
        workers = self.built.num_workers
        return ps_driver.PSDriver(
            step.train_loop(), self.built.coordinator, global_step,
            stop_requested=stop_requested,
            join_at=None if checkpointer is None else (
                lambda s: checkpointer.due(s, epoch_end=False)),
            max_in_flight=2 * max(workers, 1),
            on_lost=lambda error: self.explain_lost(error, latest_checkpoint()),
            positions_loop=step.positions_loop, width=step.width,
            accumulation=step.accumulation, pass_loop=step.pass_loop(), workers=workers)

    def evaluation(self, step, eval_input):
        return step.eval_loop_local(), iter(eval_input.local_dataset())

    def input_policy(self):
        # A coordinator schedules loops on workers, which build their datasets from graphs
        # and take batches in turn; the coordinator evaluates and predicts from its own
        # pipeline; a dataset object must have been made after connecting to the cluster.
        return input_policies.InputPolicy(
            pipelines=max(self.built.num_workers, 1), built_on_workers=True, in_turn=True,
            visits=True, evaluates_here=True, predicts_here=True, service=input_policies.WORKERS,
            check_dataset=ps_inputs.check_made_after_connecting,
            worker_input=ps_data.WorkerInput)

    def stall_probe(self):
        workers = stalls.cluster_workers()
        if not workers:
            return None
        return functools.partial(stalls.unanswering_workers, workers)

    def worker_watch(self):
        # TF_CONFIG's workers (none in an in-process cluster: they cannot freeze alone).
        return liveness.WorkerWatch(stalls.cluster_workers(), self.built.options.get(
            "frozen_worker_timeout", liveness.DEFAULT_SECS))


def for_strategy(built):
    """The mode of a `strategies.BuiltStrategy`."""
    if built.is_parameter_server:
        return ParameterServers(built)
    if built.is_multi_worker:
        return MultiWorker(built)
    return Synchronous(built)
