"""A validated recipe run: the Trainer it describes, its data builders, `fit` and its summary."""

from __future__ import annotations

import inspect
import time

from kerastrain.cli import config as config_lib
from kerastrain.cli import fit_options


# -- what the user's code raised, told by the recipe key that ran it -------------------------

_BLAMED = "_kerastrain_recipe_key"


class RecipeRunError(Exception):
    """A recipe key's code (a builder it names) or value (an optimizer, a loss, metrics)
    failed when the run used it: one message naming the key, where it is set, what was raised
    and what it was called with. `error` is what was raised (its traceback: `kerastrain run -v`).
    """

    def __init__(self, error, key, called, positions=None):
        self.error, self.key = error, key
        path = tuple(key.split("."))
        where = config_lib.position(positions or {}, path)
        text = str(error).strip()
        parts = [f"{where}: " if where else "", key, f" ({called[0]})" if called[0] else "",
                 f" failed: {type(error).__name__}" + (f": {text}" if text else "")]
        if called[1] is not None:  # the builder's arguments: (their key, their value)
            args_key, args = called[1]
            at = config_lib.position(positions or {}, tuple(args_key.split(".")))
            parts.append(f" -- it was called with {args_key} {args!r}" +
                         (f" ({at})" if at and at != where else "") + (
                             "; install what it imports" if isinstance(error, ImportError)
                             else "; fix the args or the builder"))
        else:
            parts.append(" -- fix this value (a name Keras knows, with arguments it takes)")
        super().__init__("".join(parts))


def _blame(key, called, fn, *args, **kwargs):
    """`fn(*args, **kwargs)`, the user's code (or Keras given a recipe's value) that `key` names.

    What it raises is marked with the key and passes on unchanged, so that kerastrain handles
    it exactly as before; `blamed` finds the mark where the command line reports the failure.
    `called`: (the import path or value, (args key, args) or None), for the message.
    """
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        if getattr(e, _BLAMED, None) is None:
            try:
                setattr(e, _BLAMED, (key, called))
            except AttributeError:  # an exception class that takes no attributes
                pass
        raise


# TensorFlow's errors for a lost or late peer: a cluster's fault, not the builder's.
_CLUSTER_FAULTS = ("UnavailableError", "AbortedError", "CancelledError", "DeadlineExceededError")


def blamed(error, positions=None):
    """A `RecipeRunError` for `error` if the user's code for a recipe key raised it (or raised
    what kerastrain turned into it: `raise ... from`), else None: kerastrain's own failure."""
    if type(error).__name__ in _CLUSTER_FAULTS:
        return None  # a peer lost while the builder ran: the cluster's fault, as it was
    seen = set()
    cause = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        mark = getattr(cause, _BLAMED, None)
        if mark is not None:
            return RecipeRunError(error, mark[0], mark[1], positions)
        cause = cause.__cause__ or (cause.__context__ if cause.__suppress_context__ else None)
    return None


def call_builder(section, batch_size, key="data.train"):
    """Call a data builder with its args, plus `batch_size` if it takes one. What it raises is
    marked as `key`'s (`blamed`)."""
    fn = config_lib.resolve(section.builder)
    kwargs = dict(section.args)
    try:
        accepts_batch = "batch_size" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        accepts_batch = False
    if batch_size is not None and accepts_batch and "batch_size" not in kwargs:
        kwargs["batch_size"] = batch_size
    return _blame(f"{key}.builder", (section.builder, (f"{key}.args", kwargs)), fn, **kwargs)


def _optimizer(spec):
    import keras

    if spec is None:
        return None
    options = dict(spec) if isinstance(spec, dict) else {"name": spec}
    name = options.pop("name")
    lr = options.pop("learning_rate", None)
    if isinstance(lr, dict):
        lr = dict(lr)
        schedule = config_lib.SCHEDULES[lr.pop("schedule")]
        lr = getattr(keras.optimizers.schedules, schedule)(**lr)
    if lr is not None:
        options["learning_rate"] = lr
    if ":" in name:
        cls = config_lib.resolve(name)
    elif name.lower() in config_lib.LAZY_OPTIMIZERS:
        from kerastrain import optimizers
        cls = optimizers.LAZY_OPTIMIZERS[name.lower()]
    else:
        cls = type(keras.optimizers.get(name.lower()))
    return cls(**options)


# Names `compile` reads itself, choosing by the data (keras/src/trainers/compile_utils.py).
_COMPILE_CHOOSES = {"loss": ("crossentropy", "ce"), "metric": ("accuracy", "acc")}


def _keras_object(spec, kind):
    """A loss or metric of the recipe; a name is passed as given, once Keras knows it (so that
    a misspelt one fails here, by its recipe key, and not later in `compile`)."""
    import keras
    if spec is None:
        return spec
    getter = keras.losses.get if kind == "loss" else keras.metrics.get
    if isinstance(spec, str):
        if spec.lower() not in _COMPILE_CHOOSES[kind]:
            getter(spec)
        return spec
    options = dict(spec)
    name = options.pop("name")
    return type(getter(name))(**options) if options else getter(name)


def task_role(recipe) -> str:
    """What this process does for the recipe, from TF_CONFIG: "train", "server" or "evaluator".

    Raises:
        ValueError: a malformed TF_CONFIG, or one that does not fit the recipe's strategy.
    """
    from kerastrain.distribute import cluster
    from kerastrain.distribute import strategies

    name, options = strategies.normalize(dict(recipe.strategy))
    cluster.use_slurm(name, options)
    config = cluster.read_tf_config()
    if config is None:
        return "train"
    if config.task_type == "evaluator":
        return "evaluator"
    if config.num_ps:
        if name not in ("ps", "auto"):
            raise ValueError(
                f"TF_CONFIG describes a parameter-server cluster ({config.num_ps} ps task(s)) but "
                f"the recipe's strategy is {name!r}. Use strategy 'ps' (or 'auto'), or remove the "
                "ps tasks from the cluster.")
        if "chief" not in config.cluster:
            raise ValueError(
                "A parameter-server cluster needs a `chief` task, the coordinator that runs the "
                f"training loop. Received: cluster jobs {sorted(config.cluster)}. Add "
                '"chief": ["host:port"] to TF_CONFIG (kerastrain launch --ps adds one).')
        return "train" if config.task_type == "chief" else "server"
    if name == "ps":
        raise ValueError(
            "The recipe's strategy is 'ps' but TF_CONFIG has no `ps` tasks. Received: cluster "
            f"jobs {sorted(config.cluster)}. Add ps tasks, or use 'multi_worker_mirrored'.")
    return "train"


def build_trainer(recipe):
    """A `Trainer` for the recipe (the Python API does all the work)."""
    from kerastrain.trainer import Trainer

    model_builder = config_lib.resolve(recipe.model.builder)
    model_args = dict(recipe.model.args)
    t = recipe.trainer
    compile_config = recipe.model.compile
    # Optimizer and metrics are made inside the strategy's scope by the Trainer:
    # making them here would start TensorFlow before the strategy is chosen.
    metrics = None if compile_config.metrics is None else (
        lambda: _blame("model.compile.metrics", (list(compile_config.metrics), None),
                       lambda: [_keras_object(m, "metric") for m in compile_config.metrics]))
    optimizer = None if compile_config.optimizer is None else (
        lambda: _blame("model.compile.optimizer", (compile_config.optimizer, None), _optimizer,
                       compile_config.optimizer))
    loss = _blame("model.compile.loss", (compile_config.loss, None), _keras_object,
                  compile_config.loss, "loss")
    called = (recipe.model.builder, ("model.args", model_args))
    return Trainer(
        lambda: _blame("model.builder", called, model_builder, **model_args),
        strategy=dict(recipe.strategy),
        model_dir=t.model_dir, seed=t.seed, steps_per_loop=t.steps_per_loop,
        optimizer=optimizer,
        loss=loss, metrics=metrics, verbose=t.verbose,
        jit_compile=t.jit_compile, tensorboard=_with_hparams(recipe.tensorboard, recipe),
        checkpoint=recipe.checkpoints, shard=recipe.data.shard, data_service=recipe.data.service,
        mixed_precision=t.mixed_precision, tuning=recipe.tuning, on_nonfinite=t.on_nonfinite,
        max_recoveries=t.max_recoveries, spike_factor=t.spike_factor,
        stall_timeout=t.stall_timeout, writers=_mlflow_writers(recipe))


def hparams(recipe) -> dict:
    """The recipe's values flattened for TensorBoard's HParams table: `trainer.epochs: 3`,
    `strategy.name: mirrored`; a list as its JSON text; unset (null) values left out."""
    import dataclasses
    import json
    from collections.abc import Mapping

    from kerastrain._options import is_number
    flat = {}

    def walk(prefix, value):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        if isinstance(value, Mapping):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        elif isinstance(value, (str, bool)) or is_number(value):
            flat[prefix] = value
        elif value is not None:
            flat[prefix] = json.dumps(value, default=str)
    walk("", recipe)
    return flat


def _mlflow_writers(recipe):
    """An MLflow writer when the recipe asks for one (`mlflow:`), logging its values."""
    if not recipe.mlflow:
        return None
    from kerastrain.io.tracking import MLflowWriter
    options = recipe.mlflow if isinstance(recipe.mlflow, dict) else {}
    return [MLflowWriter(**options, params=hparams(recipe))]


def _with_hparams(tensorboard, recipe):
    """The recipe's `tensorboard:` options, with the recipe's values as its HParams unless it
    names its own (`tensorboard: {hparams: {...}}`) or switches TensorBoard off."""
    if tensorboard is False:
        return False
    options = dict(tensorboard) if isinstance(tensorboard, dict) else {}
    if options.get("hparams") is None:   # `hparams: null` (a resolved recipe.yaml): the default
        options["hparams"] = hparams(recipe)
    return options


def run(recipe, resolved_text=None):
    """Train as the recipe says. Returns (trainer, history)."""
    started = time.perf_counter()
    trainer = build_trainer(recipe)
    if resolved_text is not None:
        trainer.write_text("recipe.yaml", resolved_text)
    data = recipe.data
    train = call_builder(data.train, data.batch_size)
    validation = None if data.validation is None else call_builder(
        data.validation, data.batch_size, key="data.validation")
    numpy_batch = numpy_batch_size(train, data.batch_size)
    fit_options.check_split_applies(data, train)
    t = recipe.trainer
    history = trainer.fit(train, epochs=t.epochs, steps_per_epoch=t.steps_per_epoch,
                          validation_dataset_fn=validation, validation_steps=t.validation_steps,
                          batch_size=numpy_batch, validation_split=data.validation_split,
                          callbacks=fit_options.build_callbacks(recipe.callbacks, trainer,
                                                                config_lib.resolve))
    summary = summary_line(history, trainer, time.perf_counter() - started)
    from kerastrain.io import outputs
    outputs.Outputs(trainer.model_dir, trainer.is_chief).say(summary)  # the chief's line
    return trainer, history


def numpy_batch_size(data, batch_size):
    """`data.batch_size` is fit's batch size only for NumPy data; other forms batch themselves."""
    from kerastrain.data import inputs as data_lib
    return batch_size if data_lib.input_form(data) == "numpy" else None


def summary_line(history, trainer, seconds):
    ended = trainer.ended  # a callback ended the run (EarlyStopping...): this fit, or before
    if not history.epoch and ended is not None:
        checkpoint = f"{trainer.model_dir}/checkpoints/{ended.checkpoint}"
        return (f"kerastrain: nothing left to train: {trainer.model_dir} {ended}; to train on "
                f"from there anyway, --set checkpoints.restore={checkpoint}; to start afresh, "
                "choose another trainer.model_dir")
    if not history.epoch:
        return (f"kerastrain: nothing left to train: {trainer.model_dir} already holds step "
                f"{trainer.global_step}, as far as trainer.epochs goes; raise it (e.g. --set "
                "trainer.epochs=...) to go on, or choose another trainer.model_dir")
    last = {k: v[-1] for k, v in history.history.items() if v}
    from kerastrain.io import summaries
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in summaries.scalars(last).items())
    epochs = len(history.epoch)
    where = (f"outputs in {trainer.model_dir} (checkpoints/, logs/, export/, recipe.yaml)"
             if trainer.model_dir else "no model_dir: nothing written")
    return (f"kerastrain: done: {epochs} epoch{'s' if epochs != 1 else ''}, step "
            f"{trainer.global_step}, {seconds:.1f} s; {metrics or 'no metrics'}; "
            f"{f'{ended}; ' if ended else ''}{where}")
