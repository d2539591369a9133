"""Trainer: builds the strategy and model, decides when to train and evaluate, drives callbacks."""

from __future__ import annotations

import dataclasses
import gc
import logging

import keras

from kerastrain import _logging
from kerastrain._options import TrainerConfig, check_arguments, check_int
from kerastrain.data import fit_args
from kerastrain.data import inputs as data_lib
from kerastrain.data import service as service_lib
from kerastrain.data import sharding
from kerastrain.data import trainer_inputs as inputs_lib
from kerastrain.distribute import strategies
from kerastrain.io import checkpoints
from kerastrain.io import monitor as monitor_lib
from kerastrain.io import outputs as outputs_lib
from kerastrain.io import summaries
from kerastrain.loop import actions as actions_lib
from kerastrain.loop import callbacks as callbacks_lib
from kerastrain.loop import controller as controller_lib
from kerastrain.loop import evaluating
from kerastrain.loop import modes
from kerastrain.loop import predicting
from kerastrain.loop import stalls
from kerastrain.loop import training_state as state_lib
from kerastrain.loop import tuning as tuning_lib
from kerastrain.loop import workdir as workdir_lib
from kerastrain.step import instances

logger = logging.getLogger("kerastrain")
# The loop options' defaults, written once in their dataclass (a recipe's `trainer:`).
_DEFAULT = TrainerConfig()


class _LastFit:
    """What the last `fit` of a `Trainer` came to, beside its History: read by scripts and by
    the command line's summary line."""

    @property
    def recoveries(self) -> int:
        """Recoveries from a bad loss in the last `fit` (`on_nonfinite="recover"`)."""
        return getattr(self._controller and self._controller.recovery, "count", 0)

    @property
    def ended(self):
        """Why the last `fit` ended, when a callback ended it (`model.stop_training`:
        EarlyStopping...): a `kerastrain.loop.run_state.Ended` (epoch, epochs, step, reason,
        checkpoint), set by the `fit` that stopped, or by a `fit` that restored such a run
        from `model_dir` and so trained nothing; else None."""
        return self._state.run.ended


class Trainer(_LastFit):
    """Trains a Keras model under any `tf.distribute` strategy, chosen by name.

    Args:
        model: a compiled `keras.Model`, or a zero-argument function returning one
            (called inside the strategy's scope; preferred).
        dataset_fn: the training data, in any form (see `docs/data.md`): a function
            `InputContext -> tf.data.Dataset` of per-replica batches; a zero-argument
            function or a `tf.data.Dataset` of global batches; or NumPy arrays
            `(x, y)` / `(x, y, sample_weight)`. Batches are `(x, y)` or
            `(x, y, sample_weight)`. May instead be given to `fit`.
        strategy: a name (`"auto"`, `"default"`, `"one_device"`, `"mirrored"`,
            `"central_storage"`, `"multi_worker_mirrored"`, `"ps"`) or a mapping
            `{"name": ..., **options}`.
        strategy_options: options for the strategy, as keywords.
        model_dir: where the run's outputs go (None: nowhere).
        seed: seeds Python, NumPy, TensorFlow and Keras before the model is built.
        steps_per_loop: steps run by one compiled call, or `"auto"`.
        optimizer, loss, metrics: override what the model was compiled with. The
            optimizer and the metrics may be given as functions returning them,
            called inside the strategy's scope.
        verbose: 0, 1, 2 or `"auto"` as in `model.fit` (non-chief tasks: 0).
        jit_compile, mixed_precision: XLA for each step (None: the model's compile setting,
            `"auto"`, True, False); a Keras dtype policy (None, `"mixed_float16"`,
            `"mixed_bfloat16"`; needs a model function).
        tuning: what kerastrain tunes for speed by itself without changing results
            (`kerastrain.loop.tuning.TuningOptions`): True (all), False (none), or a dict.
        tensorboard: with a `model_dir`, the chief writes TensorBoard logs to
            `model_dir/logs/{train,validation}`. True (defaults), False, a dict of
            `TensorBoardOptions` fields, or a `TensorBoardOptions`.
        writers: more `kerastrain.io.summaries.MetricWriter`s (CSV, logging...)
            that receive the same scalars, on the chief only.
        checkpoint: with a `model_dir`, the chief keeps checkpoints in
            `model_dir/checkpoints` (every epoch end by default), `fit` resumes from
            the latest, and `model_dir/export` gets the trained model. True, False,
            a dict of `CheckpointOptions` fields, or a `CheckpointOptions`.
        shard: how kerastrain shards global-batch data and NumPy input across
            workers: `"auto"` (by file when there are at least as many files as
            workers, else by data), `"file"`, `"data"` or `"off"`. A
            `dataset_fn(ctx)` shards itself. Under parameter servers training data is
            not sharded: each loop trains the batches the coordinator names, every
            batch once per pass; `"off"` opts out (each worker reads its own shard).
        on_nonfinite, max_recoveries, spike_factor: what a NaN, infinite or (with
            `spike_factor`) spiking loss does: `"stop"` training, or `"recover"`.
        stall_timeout: how long a task may make no progress before it says who stalled
            and exits with 75: seconds, `"auto"` or None.
        The options from `model_dir` to here (but the overrides) are
        `kerastrain.TrainerConfig`'s, where each is documented in full, defaulted and
        checked once (a recipe's `trainer:` section is the same dataclass).
        data_service: read the training data through the tf.data service
            (`kerastrain.data.service`): None (off), `"local"` (an in-process dispatcher and
            workers), `"grpc://host:port"`, or a mapping of `ServiceOptions` fields.

    Example:
        >>> trainer = Trainer(build_model, dataset_fn, strategy="mirrored", seed=0)
        >>> history = trainer.fit(epochs=2, steps_per_epoch=100)
        >>> history.history["loss"]
    """

    def __init__(self, model, dataset_fn=None, *, strategy="auto", strategy_options=None,
                 optimizer=None, loss=None, metrics=None, tensorboard=True, writers=None,
                 checkpoint=True, shard="auto", tuning=True, data_service=None,
                 model_dir=_DEFAULT.model_dir, seed=_DEFAULT.seed, verbose=_DEFAULT.verbose,
                 steps_per_loop=_DEFAULT.steps_per_loop, jit_compile=_DEFAULT.jit_compile,
                 mixed_precision=_DEFAULT.mixed_precision, on_nonfinite=_DEFAULT.on_nonfinite,
                 max_recoveries=_DEFAULT.max_recoveries, spike_factor=_DEFAULT.spike_factor,
                 stall_timeout=_DEFAULT.stall_timeout):
        if dataset_fn is not None:
            data_lib.input_form(dataset_fn)
        shard = sharding.check_policy(shard)
        _check_writers(writers)
        # Absolute, or a URL (`s3://` without tensorflow-io: refused now, not in an hour).
        model_dir = outputs_lib.normalize_model_dir(model_dir)
        self._config = TrainerConfig(  # checks each option, as a recipe's `trainer:` is
            model_dir=model_dir, seed=seed, steps_per_loop=steps_per_loop, verbose=verbose,
            jit_compile=jit_compile, mixed_precision=mixed_precision, on_nonfinite=on_nonfinite,
            max_recoveries=max_recoveries, spike_factor=spike_factor, stall_timeout=stall_timeout)
        service_options = service_lib.ServiceOptions.coerce(data_service)
        self._tuning = tuning_lib.TuningOptions.coerce(tuning)
        self._loop_sizer = tuning_lib.LoopSizer(fallback=modes.AUTO_STEPS_PER_LOOP)
        _logging.ensure_visible()
        # Read before the strategy exists: a connected ps cluster makes them unreadable here.
        detached, optimizer = instances.detach(model), instances.detach_optimizer(optimizer)
        # Checks names and options before TensorFlow does anything heavy.
        with stalls.connecting(stalls.check(stall_timeout), bool(stalls.cluster_workers())):
            built = strategies.build_strategy(strategy, strategy_options)
        modes.check_options(built, self._config, service_options)
        self._service = service_options and service_lib.Service(service_options)
        self._controller = None  # the last fit's `controller.Controller` (its recoveries)
        self._beats = stalls.Beats()  # progress, for the stall watch of the fit that runs
        self._dataset_fn = dataset_fn
        self._workdir = workdir_lib.WorkDir(
            model_dir, is_chief=built.is_chief,
            checkpoint=checkpoints.CheckpointOptions.coerce(checkpoint),
            tensorboard=monitor_lib.TensorBoardOptions.coerce(tensorboard), writers=writers)
        self._state = state_lib.TrainingState(
            built, model, detached=detached, seed=seed, precision_policy=mixed_precision,
            workdir=self._workdir, jit_compile=jit_compile, tuning=self._tuning,
            optimizer=optimizer, loss=loss, metrics=metrics)
        self._built = self._state.built  # a model instance's copy may fall back to another
        self._inputs = inputs_lib.TrainerInputs(
            self._built, policy=self._state.mode.input_policy(), shard=shard, seed=seed,
            tuning=self._tuning, service=self._service, model=self._state.user_model or self.model)
        self._evaluation = evaluating.Evaluation(self._state, self._inputs, self._beats)
        self._predictor = None
        self._workdir.claim(_settings(self, shard=shard))

    # -- public properties ----------------------------------------------------

    @property
    def model(self):
        return self._state.model

    @property
    def model_dir(self) -> str | None:
        """Where the run's outputs go (None: nowhere; a `BackupAndRestore`'s backup_dir)."""
        return self._workdir.model_dir

    @property
    def strategy(self):
        return self._built.strategy

    @property
    def strategy_name(self) -> str:
        """The strategy's kerastrain name (what `"auto"` resolved to, e.g. `"mirrored"`)."""
        return self._built.name

    @property
    def global_step(self) -> int:
        """Optimizer steps taken, exact under every strategy (a Python int)."""
        return self._state.steps_taken

    @property
    def steps_per_loop(self) -> int:
        """Steps per compiled call: as given, or what "auto" resolved to (measured on the
        first loops under synchronous strategies; 100 until then and elsewhere)."""
        if self._config.steps_per_loop != "auto":
            return self._config.steps_per_loop
        return self._loop_sizer.size or modes.AUTO_STEPS_PER_LOOP

    @property
    def is_chief(self) -> bool:
        return self._built.is_chief

    def write_text(self, name: str, text: str):
        """Write a text file into `model_dir` on the chief only (e.g. the resolved recipe):
        its path, or None on other tasks and without a `model_dir`. A different file of that
        name is kept as `name.previous-N`, never overwritten."""
        return self._workdir.outputs.write_text(name, text)

    def close(self):
        """Flush writers and release the model_dir lock (also done at interpreter exit)."""
        self._workdir.close()
        if self._service is not None:
            # An iterator that reads from the service on threads of its own and is left in a
            # reference cycle is freed first: freeing it waits for those threads, and they
            # wait forever for a stopped service.
            gc.collect()
            self._service.close()

    def build(self, data, *, batch_size=None):
        """Create the model's, optimizer's and metrics' variables for batches of `data`.

        `fit` and `evaluate` do this on first use; call it to restore a checkpoint
        (`load_checkpoint`) before either.
        """
        self._state.ensure_built(
            self._inputs.get(data, "dataset_fn", "evaluation", batch_size).element_spec)

    def load_checkpoint(self, path: str) -> int:
        """Load the model's weights and the global step from the checkpoint `path`.

        The optimizer state is loaded too where the checkpoint holds it. Returns
        the checkpoint's global step.

        Raises:
            RuntimeError: the model is not built yet (call `build` or `fit` first).
        """
        return self._state.load_checkpoint(path)

    def _resolve_verbose(self, verbose):
        return callbacks_lib.resolve_verbose(verbose, default=self._config.verbose,
                                             speaks=self._workdir.outputs.speaks)

    # -- training -------------------------------------------------------------

    def fit(self, dataset_fn=None, y=None, *, epochs=_DEFAULT.epochs,
            steps_per_epoch=_DEFAULT.steps_per_epoch, validation_dataset_fn=None,
            validation_steps=_DEFAULT.validation_steps, callbacks=None, verbose=None,
            initial_epoch=0, batch_size=None, validation_freq=1, actions=None, **keras_args):
        """Train for `epochs` epochs and return a `keras.callbacks.History`.

        Args:
            dataset_fn: overrides the Trainer's `dataset_fn`: any input form (a `dataset_fn(ctx)`,
                a function or a dataset of global batches, NumPy `x` or `(x, y[, sample_weight])`).
            y: targets, when `dataset_fn` is the NumPy inputs `x`.
            epochs, initial_epoch, batch_size, steps_per_epoch, validation_steps,
                validation_freq, verbose: as in `model.fit` (`batch_size`, the global
                batch of NumPy input, default 32; `steps_per_epoch=None`: to the
                end of finite data, required under ps for infinite data).
            validation_dataset_fn: validation data in any input form, evaluated at
                epoch ends and logged with a `val_` prefix (`validation_data` too).
            callbacks: Keras callbacks, each hook called as `model.fit` calls it.
            actions: `kerastrain.Action`s called after each compiled loop and at each
                epoch end, with the steps they ask to see exactly (`Action`'s docstring).
            **keras_args: `x`, `sample_weight`, `class_weight`, `validation_data`,
                `validation_split`, `shuffle`, `validation_batch_size`, as in `model.fit`.

        Raises:
            ValueError: missing data, infinite data without `steps_per_epoch`, or a
                `model.fit` argument that does not apply to this input."""
        epochs, steps_per_epoch = _check_counts(epochs, steps_per_epoch, validation_steps,
                                                validation_freq, initial_epoch=initial_epoch)
        data = fit_args.of_fit_call(dataset_fn, y, validation_dataset_fn, keras_args,
                                    default=self._dataset_fn)
        actions = actions_lib.check_user_actions(actions)  # refused before anything is used
        callbacks = self._state.use_backup(callbacks_lib.check_callbacks(callbacks))
        inputs = self._inputs.of_fit(data, batch_size)
        self._state.ensure_built(inputs.train.element_spec)
        self._controller = self._new_controller(callbacks, actions)  # the rest is its
        try:
            return self._controller.fit(
                inputs, self._workdir, epochs=epochs, steps_per_epoch=steps_per_epoch,
                initial_epoch=initial_epoch, callbacks=callbacks,
                validation_steps=validation_steps, validation_freq=validation_freq,
                verbose=self._resolve_verbose(verbose))
        finally:
            self._controller.let_go_of_the_data()  # however the fit ended

    def _new_controller(self, callbacks=(), actions=None):
        """This fit's `controller.Controller` (the model and its step are built)."""
        return controller_lib.Controller(self._state, self._config, loop_sizer=self._loop_sizer,
                              tuning=self._tuning, beats=self._beats, user_actions=actions or (),
                              user_model=self._state.user_model if callbacks else None)

    # -- evaluation -----------------------------------------------------------

    def evaluate(self, dataset_fn=None, y=None, *, batch_size=None, steps=None,
                 sample_weight=None, return_dict=True, verbose=0, callbacks=None, x=None):
        """Evaluate the model exactly over the data and return `{"loss": ..., ...}` floats.

        Takes `model.evaluate`'s arguments: `dataset_fn` (or `x`) in any input form,
        `y` and `sample_weight` beside NumPy `x`, `batch_size`, `steps`, `verbose`,
        `callbacks` (every hook as `model.evaluate` calls it; `model.stop_evaluating`
        stops) and `return_dict` (default True here;
        False gives Keras's list, or a scalar for the loss alone). `dataset_fn`
        defaults to the last `validation_dataset_fn` given to `fit`, then to the
        training `dataset_fn`. Under parameter servers the coordinator evaluates the
        whole dataset itself, reading variables from the ps tasks, so every example
        counts exactly once.
        """
        return self._evaluation.evaluate(
            dataset_fn, x, y, sample_weight, training_data=self._dataset_fn,
            batch_size=batch_size, steps=steps, return_dict=return_dict, callbacks=callbacks,
            verbose=self._resolve_verbose(verbose))

    # -- prediction -----------------------------------------------------------

    def predict(self, x, *, batch_size=None, steps=None, verbose=None, callbacks=None):
        """The model's outputs for `x`, NumPy arrays nested like its outputs, in input order.

        As `model.predict`: `x` is NumPy inputs (`batch_size` default 32), a dataset
        or a function returning one (batches of `x`, or `(x, y[, sample_weight])`
        whose targets Keras's `predict_step` ignores), or a `dataset_fn(ctx)`;
        `steps` batches at most; callbacks get `on_predict_*` with each batch's
        outputs, and `model.stop_predicting` stops. A model's own `predict_step`
        runs. Under multi-worker mirrored, parameter servers and central storage this
        task predicts all of `x` itself, reading the trained variables
        (`kerastrain.loop.predicting`).

        Example:
            >>> probabilities = trainer.predict(x_test, batch_size=256)
        """
        callbacks = callbacks_lib.check_callbacks(callbacks)
        self._state.take_user_changes()  # a new compile may have made a new model
        self._predictor = predicting.Predictor.of(self._predictor, self._built, self.model,
                                                  preprocess=self._inputs.preprocess,
                                                  policy=self._inputs.policy)
        with self._state.cluster_errors_explained():
            return self._predictor.predict(x, batch_size=batch_size, steps=steps,
                                           callbacks=callbacks,
                                           verbose=self._resolve_verbose(verbose))


def _check_counts(epochs, steps_per_epoch, validation_steps, validation_freq, *, initial_epoch):
    """fit's counts (those a recipe's `trainer:` has by their `TrainerConfig` fields):
    `(epochs, steps_per_epoch)` as Keras's debugging caps leave them."""
    check_arguments(TrainerConfig, epochs=epochs, steps_per_epoch=steps_per_epoch,
                    validation_steps=validation_steps)
    check_int("initial_epoch", initial_epoch, minimum=0)
    check_int("validation_freq", validation_freq, minimum=1)
    return _debugging_caps(epochs, steps_per_epoch)


def _debugging_caps(epochs, steps_per_epoch):
    """`keras.config.set_max_epochs` / `set_max_steps_per_epoch` (Keras's caps for quick
    debugging runs) bound `fit` as they bound `model.fit`, with its warnings."""
    import warnings

    most_epochs = getattr(keras.config, "max_epochs", lambda: None)()
    if most_epochs and most_epochs < epochs:
        warnings.warn(f"Limiting epochs to {most_epochs}")
        epochs = most_epochs
    most_steps = getattr(keras.config, "max_steps_per_epoch", lambda: None)()
    if most_steps and (not steps_per_epoch or most_steps < steps_per_epoch):
        warnings.warn(f"Limiting steps_per_epoch to {most_steps}")
        steps_per_epoch = most_steps
    return epochs, steps_per_epoch


def _check_writers(writers):
    for w in writers or []:
        if not isinstance(w, summaries.MetricWriter):
            raise TypeError("`writers` must be kerastrain.io.summaries.MetricWriter instances. "
                            f"Received an item of type {type(w).__name__}: {w!r}")


def _type_name(obj):
    return None if obj is None else type(obj).__name__


def _settings(trainer, *, shard):
    """What the run resolved to, written to `model_dir/config.yaml` and TensorBoard."""
    built, config = trainer._built, trainer._config
    return {
        "strategy": built.name, "strategy_reason": built.reason,
        "strategy_options": built.options,
        "replicas": built.strategy.num_replicas_in_sync, "workers": built.num_workers,
        "seed": config.seed, "steps_per_loop": config.steps_per_loop,
        "model_dir": trainer.model_dir, "shard": shard, "mixed_precision": config.mixed_precision,
        "tuning": dataclasses.asdict(trainer._tuning),
        "model": trainer.model.name,
        "optimizer": _type_name(getattr(trainer.model, "optimizer", None)),  # None: uncompiled
        "checkpoint": None if trainer._workdir.checkpoint is None else dataclasses.asdict(
            trainer._workdir.checkpoint),
        "tensorboard": None if trainer._workdir.tensorboard is None else dataclasses.asdict(
            trainer._workdir.tensorboard),
        "on_nonfinite": config.on_nonfinite, "max_recoveries": config.max_recoveries,
        "spike_factor": config.spike_factor,
        "data_service": trainer._service and dataclasses.asdict(trainer._service.options),
    }
