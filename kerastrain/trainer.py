"""Trainer: builds the strategy and model, decides when to train and evaluate, drives callbacks."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys

import numpy as np

from kerastrain import _logging
from kerastrain import callbacks as callbacks_lib
from kerastrain import checkpoints
from kerastrain import data as data_lib
from kerastrain import loops as loops_lib
from kerastrain import models as models_lib
from kerastrain import outputs as outputs_lib
from kerastrain import partitioning
from kerastrain import preemption
from kerastrain import runners
from kerastrain import sharding
from kerastrain import strategies
from kerastrain import summaries

logger = logging.getLogger("kerastrain")

_AUTO_STEPS_PER_LOOP = 100  # long enough to amortise a call, short enough for progress


class Trainer:
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
        jit_compile: compile each step with XLA. None follows the model's compile
            setting, which Keras resolves to False on CPU-only machines; True is
            allowed with the `default` and `one_device` strategies only.
        tensorboard: with a `model_dir`, the chief writes TensorBoard logs to
            `model_dir/logs/{train,validation}`. True (defaults), False, a dict of
            `TensorBoardOptions` fields, or a `TensorBoardOptions`.
        writers: more `kerastrain.summaries.MetricWriter`s (CSV, logging...)
            that receive the same scalars, on the chief only.
        checkpoint: with a `model_dir`, the chief keeps checkpoints in
            `model_dir/checkpoints` (every epoch end by default), `fit` resumes from
            the latest, and `model_dir/export` gets the trained model. True, False,
            a dict of `CheckpointOptions` fields, or a `CheckpointOptions`.
        shard: how kerastrain shards global-batch data and NumPy input across
            workers: `"auto"` (by file when there are at least as many files as
            workers, else by data), `"file"`, `"data"` or `"off"`. A
            `dataset_fn(ctx)` shards itself.

    Example:
        >>> trainer = Trainer(build_model, dataset_fn, strategy="mirrored", seed=0)
        >>> history = trainer.fit(epochs=2, steps_per_epoch=100)
        >>> history.history["loss"]
    """

    def __init__(self, model, dataset_fn=None, *, strategy="auto", strategy_options=None,
                 model_dir=None, seed=None, steps_per_loop="auto", optimizer=None, loss=None,
                 metrics=None, verbose="auto", jit_compile=None, tensorboard=True, writers=None,
                 checkpoint=True, shard="auto"):
        if dataset_fn is not None:
            data_lib.input_form(dataset_fn)
        self._shard = sharding.check_policy(shard)
        if steps_per_loop != "auto" and (isinstance(steps_per_loop, bool) or not isinstance(
                steps_per_loop, int) or steps_per_loop < 1):
            raise ValueError("`steps_per_loop` must be a positive int or 'auto'. "
                             f"Received: steps_per_loop={steps_per_loop!r}")
        if verbose not in (0, 1, 2, "auto"):
            raise ValueError(f"`verbose` must be 0, 1, 2 or 'auto'. Received: verbose={verbose!r}")
        if jit_compile not in (None, True, False):
            raise ValueError("`jit_compile` must be None, True or False. "
                             f"Received: jit_compile={jit_compile!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"`seed` must be an int or None. Received: seed={seed!r}")
        # A URL stays as given; a local path becomes absolute; `s3://` without
        # tensorflow-io is refused here, not after an hour of training.
        self.model_dir = outputs_lib.normalize_model_dir(model_dir)
        _logging.ensure_visible()
        # Checks names and options before TensorFlow does anything heavy.
        self._built = strategies.build_strategy(strategy, strategy_options)
        if jit_compile and self._built.places_variables:
            raise ValueError(
                f"`jit_compile=True` works with the 'default' and 'one_device' strategies; under "
                f"{self._built.name!r} a step holds cross-device or remote-variable operations "
                "XLA cannot compile. Remove it. Received: jit_compile=True")
        self._jit_compile = jit_compile
        self._tb_options = summaries.TensorBoardOptions.coerce(tensorboard)
        writers = list(writers or [])
        for w in writers:
            if not isinstance(w, summaries.MetricWriter):
                raise TypeError("`writers` must be kerastrain.summaries.MetricWriter instances. "
                                f"Received an item of type {type(w).__name__}: {w!r}")
        self._extra_writers = writers
        self._writer = None
        self._tb_writer = None
        self._ckpt_options = checkpoints.CheckpointOptions.coerce(checkpoint)
        self._checkpointer = None
        self._restored = False
        self._seed = seed
        self._steps_per_loop = steps_per_loop
        self._verbose = verbose
        self._dataset_fn = dataset_fn
        self._eval_dataset_fn = None
        if seed is not None:
            import keras
            keras.utils.set_random_seed(seed)

        import tensorflow as tf
        self._model_source = model  # a function can build the model again (export)
        with self._built.strategy.scope():
            self._model = models_lib.materialize(
                model, self._built, optimizer=optimizer, loss=loss, metrics=metrics)
            self._global_step = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="global_step",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
            # Where training stands, saved with every checkpoint: the epoch in
            # progress, steps into it, and the data position (passes begun over the
            # training data, batches into the current pass).
            self._state = {name: tf.Variable(0, dtype=tf.int64, trainable=False, name=name)
                           for name in ("epoch", "step_in_epoch", "data_pass", "data_offset")}
        self._loops = None
        self._inputs = {}
        self._watch = None
        self._release_preemption = None
        # Flipped by a SIGTERM watcher thread; the compiled loop checks it before each
        # step. A plain local variable: only this task's loop reads it.
        self._stop_flag = tf.Variable(False, trainable=False, name="stop_requested")
        self._outputs = outputs_lib.Outputs(self.model_dir, self.is_chief)
        self._lock = self._outputs.claim()
        self._settings = {
            "strategy": self._built.name, "strategy_reason": self._built.reason,
            "strategy_options": self._built.options,
            "replicas": self.strategy.num_replicas_in_sync, "workers": self._built.num_workers,
            "seed": seed, "steps_per_loop": steps_per_loop, "model_dir": self.model_dir,
            "shard": shard,
            "model": self._model.name,
            "optimizer": type(self._model.optimizer).__name__,
            "checkpoint": None if self._ckpt_options is None else dataclasses.asdict(
                self._ckpt_options),
            "tensorboard": None if self._tb_options is None else dataclasses.asdict(
                self._tb_options),
        }

    # -- public properties ----------------------------------------------------

    @property
    def model(self):
        return self._model

    @property
    def strategy(self):
        return self._built.strategy

    @property
    def global_step(self) -> int:
        """Optimizer steps taken, exact under every strategy (a Python int)."""
        return int(self._global_step.numpy())

    @property
    def is_chief(self) -> bool:
        return self._built.is_chief

    def write_text(self, name: str, text: str):
        """Write a text file into `model_dir` on the chief only (e.g. the resolved recipe).

        Returns its path, or None on other tasks and without a `model_dir`. A
        different file of that name is kept as `name.previous-N`, never overwritten.
        """
        return self._outputs.write_text(name, text)

    # -- set-up helpers -------------------------------------------------------

    def _input(self, data, argument, role, batch_size=None):
        key = (id(data), argument, batch_size)
        if key not in self._inputs or self._inputs[key][0] is not data:
            self._inputs[key] = (data, data_lib.DistributedInput(
                self._built, data, argument=argument,
                shard=self._shard, batch_size=batch_size, seed=self._seed, role=role))
        return self._inputs[key][1]

    def _ensure_built(self, element_spec):
        if self._loops is not None:
            return
        data_lib.check_against_model(element_spec, self._model)
        with self.strategy.scope():
            partitioned = models_lib.build_state(self._model, self._built, element_spec)
        jit = self._jit_compile
        if jit is None:
            jit = bool(getattr(self._model, "jit_compile", False)) and not self._built.places_variables
        # Under multi-worker mirrored, workers must agree on where to stop (collectives
        # would hang otherwise), so no per-worker stop inside their loops.
        flag = None if self._built.is_multi_worker else self._stop_flag
        self._loops = loops_lib.Loops(self._built, self._model, self._global_step,
                                      jit_compile=jit, stop_flag=flag, partitioned=partitioned)
        import tensorflow as tf
        with self.strategy.scope():
            self._epoch_totals = tf.Variable(np.zeros(self._loops.metrics.width), dtype=tf.float64,
                                             trainable=False, name="epoch_totals")
        options = self._ckpt_options
        if options and (self.model_dir or options.restore not in ("latest", "none")):
            directory = os.path.join(self.model_dir, "checkpoints") if self.model_dir else None
            self._checkpointer = checkpoints.Checkpointer(
                directory, options, is_chief=self.is_chief, model=self._model,
                optimizer=self._model.optimizer, global_step=self._global_step,
                epoch_totals=self._epoch_totals, **self._state)

    def close(self):
        """Flush writers and release the model_dir lock (also done at interpreter exit)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._lock is not None:
            self._lock.release()

    def _maybe_restore(self):
        """On the first fit, restore the latest checkpoint; return where training stood."""
        if self._restored or self._checkpointer is None:
            return None
        self._restored = True
        path = self._checkpointer.restore()
        if path is None:
            return None
        info = {k: int(v.numpy()) for k, v in self._state.items()}
        info["totals"] = np.asarray(self._epoch_totals.numpy(), np.float64)
        logger.info("resumed from %s: step %d, epoch %d%s", path, self.global_step,
                    info["epoch"] + 1, f", {info['step_in_epoch']} steps into it"
                    if info["step_in_epoch"] else " (at its start)")
        return info

    def _set_state(self, epoch, batch, totals, runner):
        for name, value in (("epoch", epoch), ("step_in_epoch", batch),
                            ("data_pass", runner.passes), ("data_offset", runner.offset)):
            self._state[name].assign(value)
        self._epoch_totals.assign(totals)

    def _save(self, step, epoch, batch, totals, runner):
        self._set_state(epoch, batch, totals, runner)
        self._checkpointer.save(step)

    def _preemption_handler(self, ckpt):
        """Under multi-worker mirrored with checkpoints: `agree(step)`, else None."""
        if ckpt is None or not self._built.is_multi_worker or not self.model_dir:
            return None
        agree, self._release_preemption = preemption.multi_worker_handler(
            self.strategy.cluster_resolver, ckpt)
        return agree

    def _preempt(self, step, epoch, batch, totals, runner):
        """SIGTERM: save at exactly the step reached; the caller raises what this returns."""
        path = None
        if self._checkpointer is not None:
            self._save(step, epoch, batch, totals, runner)
            path = self._checkpointer.last_path
        logger.warning("SIGTERM: stopped after step %d%s; exiting with code %d so the job can be "
                       "restarted", step, f", checkpoint {path}" if path else
                       " (no model_dir: nothing saved)", preemption.EXIT_CODE)
        return preemption.Preempted(step, path)

    def _export(self):
        """The chief exports to model_dir/export; other workers take part in a removed temp dir."""
        if not (self._ckpt_options and self._ckpt_options.export and self.model_dir):
            return None
        if self.is_chief:
            model = self._model
            if self._loops is not None and self._loops.partitioned:
                # One machine serves it: the same model with whole variables.
                model = partitioning.unpartitioned_copy(self._model, self._model_source)
            paths = checkpoints.export(model, self._outputs.path("export"),
                                       step=self.global_step)
            logger.info("exported %s and %s", paths["keras"], paths["saved_model"])
            return paths
        if self._built.is_multi_worker:
            with outputs_lib.scratch_dir() as scratch:
                checkpoints.export(self._model, scratch)
        return None

    def _export_missing(self):
        """Whether the export is not that of this step (an earlier export failed, e.g. disk full).

        Not under multi-worker mirrored: every worker must take part in an export,
        and they would have to agree on reading the chief's files.
        """
        if not (self._ckpt_options and self._ckpt_options.export and self._outputs.enabled) \
                or self._built.is_multi_worker or self.global_step == 0:
            return False
        return not checkpoints.export_is_current(self._outputs.path("export"), self.global_step)

    def _resolve_verbose(self, verbose):
        verbose = self._verbose if verbose is None else verbose
        interactive = getattr(sys.stdout, "isatty", lambda: False)() or "ipykernel" in sys.modules
        if verbose == "auto":
            if not self.is_chief:
                return 0
            return 1 if interactive else 2
        if verbose == 1 and not interactive:
            return 2  # a progress bar on a pipe is one line per update: keep logs readable
        return verbose

    def _metric_writer(self):
        """The chief's writers (TensorBoard under model_dir/logs, plus the user's); else None."""
        if not self.is_chief:
            return None
        if self._writer is None:
            writers = list(self._extra_writers)
            logdir = self._outputs.dir("logs") if self._tb_options else None
            if logdir:
                self._tb_writer = summaries.TensorBoardWriter(logdir)
                writers.insert(0, self._tb_writer)
            if writers:
                self._writer = writers[0] if len(writers) == 1 else summaries.MultiWriter(writers)
        return self._writer

    def _monitor(self):
        import yaml

        from kerastrain import _compat
        writer = self._metric_writer()
        optimizer = self._model.optimizer
        schedule = _compat.learning_rate_schedule(optimizer)

        def learning_rate(step):
            # The rate the step just taken used: the schedule at its iteration.
            if schedule is not None:
                return float(schedule(max(step - 1, 0)))
            return float(np.asarray(optimizer.learning_rate))

        def weights():
            return {v.path: np.asarray(v.numpy()) for v in self._model.weights}

        tb = self._tb_writer.train_dir if self._tb_writer is not None else None
        return summaries.Monitor(writer, self._tb_options, learning_rate_fn=learning_rate,
                                 weights_fn=weights, train_logdir=tb), yaml.safe_dump(
                                     self._settings, sort_keys=False)

    def _forward_graph(self, element_spec):
        import tensorflow as tf
        x_spec = element_spec[0]
        try:
            return tf.function(lambda x: self._model(x, training=False)).get_concrete_function(
                x_spec).graph
        except Exception as e:  # the graph is a nicety; never fail training for it
            logger.warning("could not trace the model's graph for TensorBoard: %s", e)
            return None

    def _resolve_steps_per_loop(self, callbacks):
        if self._steps_per_loop != "auto":
            return self._steps_per_loop
        if any(callbacks_lib.wants_every_batch(cb) for cb in callbacks):
            return 1  # a user's batch hooks see every batch, as under model.fit
        return _AUTO_STEPS_PER_LOOP

    # -- training -------------------------------------------------------------

    def fit(self, dataset_fn=None, *, epochs=1, steps_per_epoch=None, validation_dataset_fn=None,
            validation_steps=None, callbacks=None, verbose=None, initial_epoch=0,
            batch_size=None):
        """Train for `epochs` epochs and return a `keras.callbacks.History`.

        Args:
            dataset_fn: overrides the Trainer's `dataset_fn`: any input form
                (a `dataset_fn(ctx)`, a zero-argument function or a dataset of
                global batches, or NumPy arrays `(x, y[, sample_weight])`).
            epochs: epochs to train (epoch indices `initial_epoch .. epochs-1`).
            steps_per_epoch: steps per epoch; None runs each epoch to the end of
                the data (required for infinite data and under parameter servers
                unless the data is finite).
            validation_dataset_fn, validation_steps: evaluated at each epoch end,
                logged with a `val_` prefix.
            callbacks: Keras callbacks. Batch hooks run once per compiled loop of
                `steps_per_loop` steps (every step when a user callback defines
                batch hooks and `steps_per_loop="auto"`).
            verbose: overrides the Trainer's `verbose`.
            initial_epoch: epoch to start from, as in `model.fit`.
            batch_size: the global batch size of NumPy input (default 32, as in
                Keras); also used for NumPy validation data.

        Raises:
            ValueError: missing data, or infinite data without `steps_per_epoch`.
        """
        dataset_fn = dataset_fn if dataset_fn is not None else self._dataset_fn
        if dataset_fn is None:
            raise ValueError("No training data: pass `dataset_fn` to `Trainer(...)` or to "
                             "`fit(...)`. Received: dataset_fn=None")
        _check_count("epochs", epochs, minimum=0)
        _check_count("initial_epoch", initial_epoch, minimum=0)
        if steps_per_epoch is not None:
            _check_count("steps_per_epoch", steps_per_epoch, minimum=1)
        if validation_steps is not None:
            _check_count("validation_steps", validation_steps, minimum=1)
        callbacks = callbacks_lib.check_callbacks(callbacks)
        train_input = self._input(dataset_fn, "dataset_fn", "training", batch_size)
        steps_per_epoch = self._epoch_length(train_input, steps_per_epoch)
        val_input = None
        if validation_dataset_fn is not None:
            # `batch_size` is for NumPy data; a validation dataset batches itself.
            numpy = data_lib.input_form(validation_dataset_fn, "validation_dataset_fn") == "numpy"
            val_input = self._input(validation_dataset_fn, "validation_dataset_fn", "validation",
                                    batch_size if numpy else None)
            self._eval_dataset_fn = validation_dataset_fn
        self._ensure_built(train_input.element_spec)

        verbose = self._resolve_verbose(verbose)
        steps_per_loop = self._resolve_steps_per_loop(callbacks)
        cbs = callbacks_lib.callback_list(callbacks, model=self._model, verbose=verbose,
                                          epochs=epochs, steps=steps_per_epoch)
        batch_logs_wanted = bool(callbacks) or verbose != 0
        model = self._model
        model.stop_training = False
        runner = (runners.PSRunner(self) if self._built.is_parameter_server
                  else runners.SyncRunner(self))
        resumed = self._maybe_restore()
        if resumed is not None:
            initial_epoch = max(initial_epoch, resumed["epoch"])
            runner.fast_forward(train_input, resumed["data_pass"], resumed["data_offset"])
        monitor, settings_text = self._monitor()
        # The settings this run resolved to, next to what it wrote (chief only).
        self._outputs.replace_text("config.yaml", settings_text)
        ckpt = self._checkpointer
        every = ckpt.options.every_steps if ckpt else None

        def boundary(at):
            # Loops stop where something must happen: a log line, a profile, a save.
            found = [b for b in (monitor.steps_to_boundary(at),
                                 every - at % every if every else None) if b]
            return min(found) if found else None

        step = first_step = self.global_step
        monitor.start(step, texts={"config": "```\n" + settings_text + "```"},
                      graph=self._forward_graph(train_input.element_spec)
                      if monitor.active and monitor.options.write_graph else None)
        metrics = self._loops.metrics
        self._stop_flag.assign(False)
        # Under multi-worker mirrored, TensorFlow's PreemptionCheckpointHandler owns SIGTERM.
        watch = preemption.SigtermWatch(self._stop_flag, install=not self._built.is_multi_worker)
        self._watch = watch
        cbs.on_train_begin()
        logs, diverged, preempted = {}, False, None
        try:
            agreed_stop = self._preemption_handler(ckpt)
            with watch, monitor:
                for epoch in range(initial_epoch, epochs):
                    cbs.on_epoch_begin(epoch)
                    totals = np.zeros(metrics.width, np.float64)
                    batch = 0
                    if resumed is not None and epoch == resumed["epoch"] and resumed["step_in_epoch"]:
                        totals, batch = resumed["totals"].copy(), resumed["step_in_epoch"]
                    remaining = None if steps_per_epoch is None else steps_per_epoch - batch
                    for totals_part, ran in runner.train_epoch(
                            train_input, remaining, steps_per_loop, step, boundary):
                        totals += totals_part
                        batch += ran
                        step += ran
                        if watch.requested:
                            preempted = self._preempt(step, epoch, batch, totals, runner)
                            break
                        if not np.isfinite(totals_part[0]):
                            diverged = True
                            logger.error(
                                "the loss became %s by step %d (epoch %d); training stopped. Nothing "
                                "was saved after the last finite step, so the latest checkpoint is "
                                "the last good one.", totals_part[0], step, epoch + 1)
                            model.stop_training = True
                            break
                        monitor.after_loop(step, float(totals_part[1]),
                                           lambda: metrics.results(totals),
                                           timed=not self._built.is_parameter_server)
                        if ran and batch_logs_wanted:
                            cbs.on_train_batch_end(batch - 1, metrics.results(totals))
                        if ckpt is not None and runner.in_sync and ckpt.due(
                                step, epoch_end=False) and (
                                steps_per_epoch is None or batch < steps_per_epoch):
                            self._save(step, epoch, batch, totals, runner)
                        if agreed_stop is not None:
                            # All workers call this after every loop; after a SIGTERM on any
                            # of them, all save this same step and raise Preempted.
                            self._set_state(epoch, batch, totals, runner)
                            agreed_stop(step)
                        if model.stop_training:
                            break
                    if preempted is not None:
                        break
                    if batch == 0:
                        raise ValueError(
                            f"`dataset_fn` produced no batches in epoch {epoch}. Check that the "
                            "dataset is not empty and that each input pipeline gets data.")
                    logs = metrics.results(totals)
                    if diverged:
                        cbs.on_epoch_end(epoch, logs)
                        break
                    if val_input is not None:
                        val_logs = self._evaluate_input(val_input, validation_steps)
                        logs.update({f"val_{k}": v for k, v in val_logs.items()})
                    monitor.epoch_end(epoch, step, logs)
                    runner.epoch_done(steps_per_epoch)
                    if ckpt is not None and ckpt.due(step, epoch_end=True):
                        self._save(step, epoch + 1, 0, np.zeros_like(totals), runner)
                    cbs.on_epoch_end(epoch, logs)
                    if model.stop_training:
                        break
        except runners.cluster_errors() as e:
            if not self._built.is_parameter_server:
                raise
            # A ps task went away during a step, a save or a validation pass.
            raise runners.lost_cluster(self, e) from None
        finally:
            self._watch = None
            release, self._release_preemption = self._release_preemption, None
            if release is not None:
                release()
        if preempted is not None:
            raise preempted
        cbs.on_train_end(logs)
        if not diverged and (step > first_step or self._export_missing()):
            self._export()  # (a resumed run with nothing left to train keeps a whole export)
        return callbacks_lib.history_of(cbs)

    def _epoch_length(self, train_input, steps_per_epoch):
        if steps_per_epoch is not None:
            return steps_per_epoch
        n = train_input.cardinality
        if n == data_lib.INFINITE:
            raise ValueError(
                "The training data is infinite (it repeats), so an epoch has no end: pass "
                "`steps_per_epoch`. Received: steps_per_epoch=None")
        if self._built.is_parameter_server:
            if n == data_lib.UNKNOWN:
                raise ValueError(
                    "Under parameter-server training the coordinator schedules a fixed number "
                    "of steps per epoch, and the size of this dataset is unknown (e.g. after "
                    "`filter`): pass `steps_per_epoch`. Received: steps_per_epoch=None")
            # Worker i reads shard i; one epoch is as many steps as the shards have
            # batches together, whichever worker takes them.
            logger.info("steps_per_epoch=None under parameter servers: one epoch is %d steps "
                        "(the data's batches), spread over %d workers", n, self._built.num_workers)
            return n
        return None

    # -- evaluation -----------------------------------------------------------

    def evaluate(self, dataset_fn=None, *, steps=None, batch_size=None):
        """Evaluate the model exactly over the data and return `{"loss": ..., ...}` floats.

        `dataset_fn` defaults to the last `validation_dataset_fn` given to `fit`,
        then to the training `dataset_fn`. Under parameter servers the
        coordinator evaluates the whole dataset itself, reading variables from
        the ps tasks, so every example counts exactly once.
        """
        for candidate in (dataset_fn, self._eval_dataset_fn, self._dataset_fn):
            if candidate is not None:
                dataset_fn = candidate
                break
        if dataset_fn is None:
            raise ValueError("No evaluation data: pass `dataset_fn`. Received: dataset_fn=None")
        if steps is not None:
            _check_count("steps", steps, minimum=1)
        eval_input = self._input(dataset_fn, "dataset_fn", "evaluation", batch_size)
        self._ensure_built(eval_input.element_spec)
        return self._evaluate_input(eval_input, steps)

    def _evaluate_input(self, eval_input, steps):
        import tensorflow as tf

        if steps is None and eval_input.cardinality == data_lib.INFINITE:
            raise ValueError("The evaluation data is infinite (it repeats): pass `steps` "
                             "(`validation_steps` in fit). Received: steps=None")
        if self._built.is_parameter_server:
            iterator = iter(eval_input.local_dataset())
            loop = self._loops.eval_loop_local()
        else:
            iterator = iter(eval_input.distributed())
            loop = self._loops.eval_loop()
        totals = np.zeros(self._loops.metrics.width, np.float64)
        remaining = steps
        chunk = 1000
        while remaining is None or remaining > 0:
            n = chunk if remaining is None else min(chunk, remaining)
            part, ran = loop(iterator, tf.constant(n, tf.int32))
            totals += np.asarray(part, np.float64)
            ran = int(ran)
            if remaining is not None:
                remaining -= ran
            if ran < n:
                break
        return self._loops.metrics.results(totals)


def _check_count(name, value, *, minimum):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}. Received: {name}={value!r}")
