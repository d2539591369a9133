"""The model under its strategy, and everything training reads and writes beside it.

`TrainingState` makes, in the strategy's scope, the model (built from a function, or a copy
of a model instance), the global step, the run's counters and checkpointer
(`run_state.RunState`) and the stop flag a SIGTERM sets; on the first batches' spec it builds
the variables and the compiled step (`modes`: the kind of strategy builds it). The `Trainer`
wires one to the data, the work directory and each fit's `controller.Controller`.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import keras
import tensorflow as tf

from kerastrain import _compat
from kerastrain import _logging
from kerastrain.data import inputs as data_lib
from kerastrain.distribute import strategies
from kerastrain.distribute import user_scope
from kerastrain.loop import callbacks as callbacks_lib
from kerastrain.loop import driver as driver_lib
from kerastrain.loop import modes
from kerastrain.loop import preemption
from kerastrain.loop import run_state
from kerastrain.loop import tuning as tuning_lib
from kerastrain.step import accumulation as accumulation_lib
from kerastrain.step import loops as loops_lib
from kerastrain.step import checks
from kerastrain.step import instances
from kerastrain.step import metrics as metrics_lib
from kerastrain.step import models as models_lib
from kerastrain.step import own_step
from kerastrain.step import precision

logger = logging.getLogger("kerastrain")
# The methods of a model that, overridden, decide what its evaluation batches need.
EVALUATION_STEPS = ("test_step", "compute_loss")


class TrainingState:
    """The model, the global step, the run state and the stop flag of one Trainer.

    Args:
        built: the `strategies.BuiltStrategy` (replaced by a fallback when a model instance
            cannot be copied into it: `built` is then the one in use).
        model: a model function or a model instance (see `models_lib.materialize`).
        detached: the instance's weights and optimizer state read before the strategy
            existed (`instances.detach`), or None.
        seed: seeds Python, NumPy, TensorFlow and Keras before the model is built (None:
            not seeded).
        precision_policy: the mixed precision policy (`TrainerConfig.mixed_precision`).
        workdir: the `workdir.WorkDir` whose checkpoint options and outputs the run uses.
        jit_compile, tuning: as the Trainer's options.
        optimizer, loss, metrics: the Trainer's, overriding what the model was compiled with.
    """

    def __init__(self, built, model, *, detached, precision_policy, workdir, jit_compile,
                 tuning, seed=None, optimizer=None, loss=None, metrics=None):
        if seed is not None:
            keras.utils.set_random_seed(seed)
        self.built, self.source = built, model  # a function can build the model again (export)
        self._jit_compile = jit_compile
        self._tuning = tuning
        self._workdir = workdir  # where the run's state is kept: it follows a BackupAndRestore
        # A model instance is copied from what `detach` read of it.
        compile_overrides = dict(detached=detached, optimizer=optimizer, loss=loss,
                                 metrics=metrics)
        self._policy, self._overrides = precision_policy, compile_overrides
        # On one device a model instance whose variables are there trains as it is, under
        # the default strategy (no copy: a copy from its config may lose what the config
        # does not say, such as a weight two layers share).
        self.built = strategies.default_for_instance(built, model) or built
        self.mode = modes.for_strategy(self.built)
        self.model = self._materialize(model, precision_policy, compile_overrides)
        # Its optimizer's state goes on in the copy (unless the Trainer replaces the optimizer).
        self._detached = detached if optimizer is None else None
        # The user's own model object, when kerastrain trains a copy built in scope: it
        # gets the trained weights whenever fit ends, so code written for model.fit works.
        self.user_model = model if detached is not None and model is not self.model else None
        self._users_object = detached is not None and model is self.model  # trained in place
        precision.ensure_loss_scaling(self.model, precision_policy)
        with self.strategy.scope():
            self.global_step = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="global_step",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
            # Where training stands, saved with every checkpoint (`run_state`).
            self.run = run_state.RunState(
                options=workdir.checkpoint, model_dir=workdir.model_dir,
                outputs=workdir.outputs, background=self.mode.background_checkpoints,
                traced=self.mode.traced_checkpoints,
                every_task_saves=self.mode.every_task_saves)
        # Flipped by a SIGTERM watcher thread; the compiled loop checks it before each
        # step. A plain local variable where this task's loops read it; under ps a
        # parameter server's, read by the workers' loops (`modes`: `stop_flag_in_scope`).
        with self.strategy.scope() if self.mode.stop_flag_in_scope else \
                contextlib.nullcontext():
            self.stop_flag = tf.Variable(False, trainable=False, name="stop_requested")
        self.step = None  # the compiled step, once the data's spec is known
        # The user's object (copied or trained in place) as compiled when the Trainer was
        # made (`check_compile`).
        self._watched = model if detached is not None else None
        self._compiled_as = _compat.compile_token(self._watched)

    def _materialize(self, model, policy, compile_overrides):
        with self.built.strategy.scope(), precision.policy(policy, model):
            return models_lib.materialize(model, self.built, policy=self.mode.step_policy,
                                          **compile_overrides)

    @property
    def strategy(self):
        return self.built.strategy

    @property
    def steps_taken(self) -> int:
        """The global step as a Python int."""
        return int(self.global_step.numpy())

    def ensure_built(self, element_spec, steps=("train_step", "compute_loss")):
        """The model's, optimizer's and metrics' variables for batches of `element_spec`,
        and the compiled step (once); every input is checked against the model (`steps`:
        those of its methods that, overridden, decide what its batches need)."""
        self.check_compile()
        checks.check_compiled(self.model, training="train_step" in steps)
        data_lib.check_against_model(element_spec, self.model, steps)
        if self.step is not None:
            self.take_user_changes()
            return
        model, built = self.model, self.built
        placement = self.mode.step_policy.placement
        placement.check_placed(model)
        with self.strategy.scope():
            partitioned = models_lib.build_state(model, built, element_spec, placement=placement,
                                                 users_object=self._users_object)
            instances.carry_optimizer(model, self._detached)
            self._detached = None  # its copies of the weights and slots are no longer needed
            if not loops_lib.overrides(model, "train_step"):
                metrics_lib.MetricState(model).check_sums(model, element_spec)
        # What code did to the user's object since the Trainer read it (`load_weights`,
        # `model.fit`) is where this first call starts, as in every later call.
        self.take_user_changes()
        models_lib.say_unsynchronized_batchnorm(model, self.strategy)
        jit, why = tuning_lib.resolve_jit_compile(
            self._jit_compile, model, places_variables=built.places_variables,
            measurable=own_step.has_own_step(model)
            or accumulation_lib.steps_of(model.optimizer) == 1)
        _logging.tuning("jit_compile auto: measuring" if jit == tuning_lib.MEASURE
                        else f"jit_compile {jit}", "jit_compile: %s (%s)", jit, why)
        # Where workers must agree on where to stop (collectives would hang otherwise),
        # no per-worker stop inside their loops.
        flag = self.stop_flag if self.mode.stops_on_own_flag else None
        self.step = self.mode.step(
            model, self.global_step, jit_compile=jit is True, stop_flag=flag,
            partitioned=partitioned,
            unroll=tuning_lib.UNROLL if self._tuning.unroll_steps else 1)
        if jit == tuning_lib.MEASURE:
            self.step.jit_trial = tuning_lib.JitTrial(self.step)
        with self.strategy.scope():
            self.run.attach(width=self.step.width, model=model, global_step=self.global_step)

    def take_user_changes(self):
        """What code did to the user's own model object since the Trainer handed it back
        (`model.fit`, `set_weights`, `load_weights`) goes into the copy that trains, as the
        next `model.fit` would start from it (a model function: nothing); also at the
        first build, for what changed since the Trainer read the object."""
        self.check_compile()
        if self.user_model is not None:
            instances.take_changes(self.model, self.user_model)

    def check_compile(self):
        """The user's model object compiled again since kerastrain read it (keras.io's
        transfer learning: unfreeze the base, compile, fit again): from this call on,
        kerastrain trains, evaluates and predicts as the new compile says, from the weights
        the object holds, as `model.fit` would; the compiled step is made again. The
        optimizer's state goes on where the new compile keeps the optimizer object, and
        starts afresh with a new one, as in Keras."""
        user_scope.check_outside("a Trainer call (fit, evaluate, predict)")
        watched = self._watched
        token = _compat.compile_token(watched) if watched is not None else None
        if token is self._compiled_as:
            return
        if self.user_model is not None:
            try:
                detached = instances.Detached(self.user_model)
            except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError):
                raise ValueError(
                    f"The model {watched.name!r} was compiled again before the first `fit` "
                    "under parameter servers, where the object cannot be read until `fit` "
                    "hands it back. Compile it before making the Trainer, or call `fit` "
                    "first. Received: a second `model.compile(...)` on "
                    f"{watched.name!r}") from None
            overrides = dict(self._overrides, detached=detached)
            self.run.wait()
            self.model = self._materialize(self.user_model, self._policy, overrides)
            self._detached = detached if overrides.get("optimizer") is None else None
        self.step = None  # made again for the new loss, metrics and optimizer
        self._compiled_as = token
        logger.info("the model %r was compiled again: kerastrain follows the new compile "
                    "from its current weights, as model.fit would", watched.name)

    def load_checkpoint(self, path: str) -> int:
        """The model's weights and the global step from the checkpoint `path` (see
        `Trainer.load_checkpoint`)."""
        if self.step is None:
            raise RuntimeError("`load_checkpoint` needs the model's variables: call "
                               "`trainer.build(data)` (or `fit`/`evaluate`) first. "
                               f"Received: path={path!r}")
        tf.train.Checkpoint(model=self.model, global_step=self.global_step).read(
            path).expect_partial()
        return self.steps_taken

    def evaluate(self, eval_input, steps, hooks=None, *, beat=None):
        """Exact logs of the model over `eval_input` (at most `steps` batches); `hooks`: the
        callbacks' `callbacks.BatchHooks` of "test", called around its loops, or None."""
        if steps is None and eval_input.cardinality == data_lib.INFINITE:
            raise ValueError("The evaluation data is infinite (it repeats): pass `steps` "
                             "(`validation_steps` in fit). Received: steps=None")
        data_lib.check_against_model(eval_input.element_spec, self.model, EVALUATION_STEPS)
        loop, iterator = self.mode.evaluation(self.step, eval_input)
        self.step.start_epoch()
        if hooks is not None:
            hooks = callbacks_lib.PassHooks(
                hooks, functools.partial(self.step.results, kind="eval"), self.model,
                callbacks_lib.known_batches(eval_input.cardinality, steps))
        totals = driver_lib.run_to_end(loop, iterator, steps, self.step.width,
                                       accumulate=self.step.accumulate, after=beat, hooks=hooks)
        return self.step.results(totals, kind="eval")

    def sigterm_watch(self):
        """A fresh stop state for one fit, and the SIGTERM watch (not yet entered)."""
        self.model.stop_training = False
        self.stop_flag.assign(False)
        # Under multi-worker mirrored, TensorFlow's PreemptionCheckpointHandler owns SIGTERM.
        return preemption.SigtermWatch(self.stop_flag, install=self.mode.owns_sigterm)

    def preemption_agreement(self):
        """Yield `agree(step)` where workers must agree on where to stop, else None."""
        return self.mode.preemption_agreement(self.run.checkpointer, self.run.model_dir)

    @contextlib.contextmanager
    def cluster_errors_explained(self):
        """A lost task (a ps task, a multi-worker peer) becomes one error that says what to
        do."""
        try:
            yield
        except driver_lib.cluster_errors() as e:
            # A peer or a ps task went away during a step, a save or a validation pass.
            explained = self.mode.explain_lost(e, self.run.latest_checkpoint())
            if explained is None:
                raise
            raise explained from None

    def use_backup(self, callbacks):
        """The callbacks but a `BackupAndRestore`, whose backup_dir becomes the place of the
        run (`WorkDir.use_backup`): the run's state follows it there."""
        callbacks = self._workdir.use_backup(callbacks)
        self.follow_workdir()
        return callbacks

    def follow_workdir(self):
        """Keep the run's state where the WorkDir now keeps it, once a `BackupAndRestore`
        moved it (its backup_dir; back to the Trainer's model_dir after the backup goes)."""
        moved = self._workdir.take_move()
        if moved is not None:
            model_dir, outputs, options = moved
            with self.strategy.scope():
                self.run.move(model_dir=model_dir, outputs=outputs, options=options)
