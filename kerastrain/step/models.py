"""Getting a compiled Keras model whose variables live where the strategy wants them."""

from __future__ import annotations

import contextlib
import logging

import keras
import tensorflow as tf

from kerastrain import _compat
from kerastrain.step import checks
from kerastrain.step import instances
from kerastrain.step import precision

logger = logging.getLogger("kerastrain")

_DEFAULT_OPTIMIZER = "rmsprop"  # what keras.Model.compile uses when none is given


class NotClonable(ValueError):
    """A model instance made outside the strategy's scope that Keras cannot clone into it."""


def _created_in_scope(strategy, variable) -> bool:
    return strategy.extended.variable_created_in_scope(getattr(variable, "value", variable))


def _fresh(obj):
    """An optimizer or metric instance whose variables are made in scope: a copy of an
    optimizer (one optimizer cannot serve two models); a metric itself, its variables
    given new storage here (`from_config(get_config())` is a round trip `model.fit` never
    makes, and many user metrics do not survive it: an `__init__` without `name`, an
    attribute set outside the config)."""
    if isinstance(obj, instances.FromConfig):
        return obj.make()
    if isinstance(obj, keras.optimizers.Optimizer):
        return obj.__class__.from_config(obj.get_config())
    if isinstance(obj, keras.metrics.Metric):
        _compat.replace_storage(obj.variables, [instances.value_or_zeros(v) for v in obj.variables])
        return obj
    if isinstance(obj, (list, tuple, dict)):
        return instances.same_structure(obj, _fresh)
    return obj


def materialize(model, built, *, policy, detached=None, optimizer=None, loss=None,
                metrics=None):
    """Return a compiled `keras.Model` built under `built.strategy`'s scope.

    Call inside `strategy.scope()`. `detached` is `instances.detach(model)`, read before the
    strategy was built; a model instance made outside the scope is rebuilt from it.
    `policy`: the kind of strategy's `policy.StepPolicy` (its placement, what it refuses).

    Raises:
        TypeError: `model` is neither a keras.Model nor a function returning one.
        ValueError: the model cannot be rebuilt in scope, or is not compiled.
    """
    strategy = built.strategy
    if isinstance(model, keras.Model):
        instance = model
        # Every strategy but the default one owns where variables go (one_device too:
        # Adam's slots are made colocated with the weights, inside its scope).
        needs_scope = built.name != "default"
        if needs_scope and instance.variables and not all(
                _created_in_scope(strategy, v) for v in instance.variables):
            with policy.placement.explained():
                instance = _rebuild(instance, detached or instances.Detached(instance))
        elif needs_scope and getattr(instance, "optimizer", None) is not None and not all(
                _created_in_scope(strategy, v) for v in instance.optimizer.variables):
            _recompile(instance, (detached or instances.Detached(instance)).compile_args or {}, fresh=True)
    elif callable(model):
        with policy.placement.explained():
            instance = model()
        _check_built_by_function(instance, model, built)
    else:
        raise TypeError(
            "`model` must be a compiled keras.Model or a zero-argument function returning one. "
            f"Received: model={model!r} of type {type(model).__name__}")

    # A function for the optimizer or the metrics is called here, in scope, so that
    # their variables are placed by the strategy (recipes pass them this way).
    if callable(optimizer) and not isinstance(optimizer, keras.optimizers.Optimizer):
        optimizer = optimizer()
    if callable(metrics) and not isinstance(metrics, keras.metrics.Metric):
        metrics = metrics()
    overrides = {k: v for k, v in (("optimizer", optimizer), ("loss", loss),
                                   ("metrics", metrics)) if v is not None}
    if overrides:
        args = dict(_compat.compile_args(instance) or {}) if getattr(
            instance, "compiled", False) else {}
        args.update(overrides)
        args.setdefault("optimizer", _DEFAULT_OPTIMIZER)
        _recompile(instance, args, fresh=built.name != "default")
    # A model never compiled may still predict, as with Keras; `fit` and `evaluate` ask
    # for a compiled one (`check_compiled`).
    from kerastrain.step import loops
    own_step = loops.overrides(instance, "train_step")
    checks.check_eager(instance, built, policy)
    checks.check_stateful(instance, built, policy)
    if getattr(instance, "optimizer", None) is not None and own_step:
        _check_accumulation(instance.optimizer, built.name)
    return instance


def _check_built_by_function(instance, model, built):
    """What the model function `model` returned is a Keras model the strategy can train."""
    if not isinstance(instance, keras.Model):
        raise TypeError(
            "The model function must return a keras.Model. "
            f"Received: an object of type {type(instance).__name__} from {model!r}")
    if built.name in ("mirrored", "multi_worker_mirrored") and not all(
            _created_in_scope(built.strategy, v) for v in instance.trainable_variables):
        # Replicas would each update a weight that is not theirs (Keras failed with a bare
        # AssertionError deep in the step); weights only read (an adapted Normalization's)
        # may come from outside.
        raise ValueError(
            "The model function returned a model whose weights were made outside the "
            "strategy's scope (a model built before the Trainer, e.g. a global the function "
            "returns): the replicas cannot share them. Build the model inside the function, "
            "or pass the model itself (`Trainer(model, ...)`), which kerastrain copies into "
            f"the scope. Received: model {instance.name!r} from {model!r}")


def _own_step_with_parts_built(model) -> bool:
    """A model with its own `train_step` whose layers are all built (keras.io's GAN: two
    built sub-models, no `call`): nothing is left to build by calling it. `model.fit`
    without a strategy defers building to the step's tracing (under any strategy it
    fails the same way); here the optimizer is built below, in the scope."""
    if getattr(type(model), "train_step") is getattr(keras.Model, "train_step"):
        return False
    return _compat.sublayers_built(model)


def build_state(model, built, element_spec, *, placement, users_object=False):
    """Create the model's, metrics' and optimizer's variables from the data's shapes.

    Call inside `strategy.scope()`. `placement`: the kind of strategy's `Placement` (under
    parameter servers, variables the strategy partitioned are set up for training shard by
    shard: `kerastrain.step.ps.placement`). `users_object`: `model` is the user's own object,
    trained in place (not a copy).

    Returns:
        The `Partitioning` of the model, or None when no variable is partitioned.

    Raises:
        ValueError: the model cannot run on batches of `element_spec`.
        TypeError: a layer cannot run with its partitioned variable.
    """
    from kerastrain.step import accumulation
    from kerastrain.step import loops

    optimizer = model.optimizer
    # kerastrain's own step accumulates gradients itself: no Keras accumulators to build,
    # but on the user's own object, whose `model.fit` needs them afterwards (they stay empty).
    if optimizer is None or loops.overrides(model, "train_step") or (
            users_object and placement.keras_accumulators_in_place):
        return _build_state(model, built, element_spec, placement)
    with accumulation.keras_accumulation_off(optimizer):
        return _build_state(model, built, element_spec, placement)


def _build_state(model, built, element_spec, placement):
    from kerastrain.data import inputs as data_lib

    optimizer = model.optimizer
    with placement.explained():  # outside the `try`: its advice is not about the data
        try:
            with placement.holding_optimizer_build(optimizer):
                _build_variables(model, element_spec)
        except (ValueError, TypeError) as e:
            raise ValueError(
                "The model cannot run on the batches the dataset yields. Received: "
                f"element_spec={data_lib.describe(element_spec)}. Keras said: {e}") from None
        except RuntimeError:
            # Keras could not call the model to build it (keras.io's GAN has no `call`).
            if not _own_step_with_parts_built(model):
                raise
    build_step_optimizers(model, built, element_spec)
    partitioned = placement.build_optimizer(model, optimizer)
    _read_rows_if_lazy(model, optimizer)
    return partitioned


class Placement:
    """Where a model's variables are made and how they are built: here, where the strategy's
    scope puts them on this task's devices (every kind of strategy but parameter servers,
    whose `kerastrain.step.ps.placement.ServerPlacement` overrides each method)."""

    # A user's object trained in place gets Keras's gradient accumulators (they stay empty),
    # which its own `model.fit` needs afterwards.
    keras_accumulators_in_place = True

    def explained(self):
        """Around building the model: failures turned into advice (none here)."""
        return contextlib.nullcontext()

    def check_placed(self, model):
        """Before the model's state is built: what it holds can be reached (all of it here)."""

    def holding_optimizer_build(self, optimizer):
        """Around Keras's symbolic build, which builds the optimizer at its end (here too)."""
        return contextlib.nullcontext()

    def build_optimizer(self, model, optimizer):
        """Build `optimizer` for the model's trainable variables (unless built). Returns the
        model's `Partitioning`, or None when no variable is partitioned (none here)."""
        if optimizer is not None and not optimizer.built:
            optimizer.build(model.trainable_variables)
        return None


def _build_variables(model, element_spec):
    """The model's, its compiled metrics' and loss's variables, from shapes; eagerly from a
    batch of zeros where the model runs eagerly and a symbolic build fails (a `call` that
    reads values, `.numpy()`: Keras's debugging mode, `_compat.eager_build`)."""
    try:
        _compat.symbolic_build(model, element_spec)
    except RuntimeError:
        if not getattr(model, "run_eagerly", False):
            raise
        logger.info("run_eagerly: the model cannot be built symbolically; it runs once on a "
                    "batch of zeros to build its variables")
        _compat.eager_build(model, element_spec)


def build_step_optimizers(model, built, element_spec):
    """Build the optimizers a model's own `train_step` applies besides `model.optimizer`
    (keras.io's GAN: `compile(d_optimizer=..., g_optimizer=...)`, each left to build itself
    in its first `apply`), as Keras would on one device.

    Under a strategy an optimizer cannot create its slots inside the compiled step (Keras
    `fit` under MirroredStrategy fails there too; a parameter-server worker cannot create
    variables at all). So the step is traced once, never run, with each unbuilt optimizer's
    `apply` recording the variables it is given; each is then built with those variables,
    here, inside the strategy's scope. Call inside `strategy.scope()`.
    """
    from kerastrain.step import loops

    if not loops.overrides(model, "train_step"):
        return
    unbuilt = {name: value for name, value in sorted(vars(model).items())
               if isinstance(value, keras.optimizers.Optimizer) and not value.built
               and value is not model.optimizer}
    if not unbuilt:
        return
    updated = {}

    def recorder(name):
        def apply(grads, trainable_variables=None):
            if trainable_variables is not None:
                updated.setdefault(name, list(trainable_variables))
        return apply

    with contextlib.ExitStack() as stack:
        for name, optimizer in unbuilt.items():
            stack.enter_context(_compat.instance_override(optimizer, "apply", recorder(name)))
        strategy = built.strategy

        @tf.function(autograph=False)  # as Keras traces a train_step: unconverted
        def dry_run(data):
            strategy.run(model.train_step, args=(data,))
        try:
            dry_run.get_concrete_function(element_spec)
        except Exception as e:  # noqa: BLE001 - the real step then runs as it would have
            logger.debug("could not trace the model's train_step to find what its unbuilt "
                         "optimizer(s) %s update (%s: %s); they build on first use",
                         sorted(unbuilt), type(e).__name__, e)
            return
    for name, optimizer in unbuilt.items():
        if name in updated:
            optimizer.build(updated[name])
            logger.info("optimizer `%s` (%s) built for the %d variable(s) the model's "
                        "train_step updates with it", name, type(optimizer).__name__,
                        len(updated[name]))


def say_unsynchronized_batchnorm(model, strategy):
    """One line when BatchNormalization layers normalise per replica: under a strategy of
    several replicas each normalises its share of the batch with that share's statistics,
    as under Keras `fit` with the same strategy, which a one-device run does not."""
    replicas = strategy.num_replicas_in_sync
    if replicas < 2:
        return
    names = [layer.name for layer in model._flatten_layers(include_self=False)
             if isinstance(layer, keras.layers.BatchNormalization)
             and not getattr(layer, "synchronized", False)]
    if names:
        logger.info("BatchNormalization layer(s) %s normalise each of the %d replicas' share "
                    "of a batch with that share's statistics (as Keras fit does under this "
                    "strategy), so results differ slightly from one device's; "
                    "BatchNormalization(synchronized=True) uses the whole batch's",
                    ", ".join(map(repr, names)), replicas)


def _read_rows_if_lazy(model, optimizer):
    # A lazy optimizer writes rows in place; a whole-table read per step (Keras's
    # Embedding) would then copy the table each step (kerastrain.optimizers.read_rows).
    from kerastrain import optimizers
    if optimizer is not None and optimizers.is_lazy(optimizer):
        changed = optimizers.read_rows(model)
        if changed:
            logger.info("lazy optimizer %s: embedding layer(s) %s read only the rows they look "
                        "up", type(optimizer).__name__, ", ".join(map(repr, changed)))


def _check_accumulation(optimizer, strategy_name):
    """A model's own `train_step` calls `optimizer.apply`, where Keras applies accumulated
    gradients inside a `cond`; tf.distribute strategies synchronise there (`merge_call`),
    which TensorFlow does not support. (kerastrain's own step accumulates itself.)"""
    steps = getattr(optimizer, "gradient_accumulation_steps", None)
    if steps and strategy_name not in ("default", "one_device"):
        raise ValueError(
            f"`gradient_accumulation_steps` with a model that overrides `train_step` works "
            f"with the 'default' and 'one_device' strategies only: Keras applies the "
            f"accumulated gradients inside a conditional in `optimizer.apply`, and under "
            f"{strategy_name!r} TensorFlow cannot synchronise replicas there (\"merge_call "
            f"called while defining a new graph\"). Multiply the global batch size by {steps} "
            f"instead, which gives the same gradient, or let kerastrain's own step (which "
            f"accumulates under every strategy) train the model: move the step's logic into "
            f"`compute_loss`. Received: {type(optimizer).__name__}(gradient_accumulation_steps="
            f"{steps}) under {strategy_name!r}")


def _recompile(model, args, *, fresh):
    args = dict(args)
    if isinstance(args.get("optimizer"), instances.FromConfig) and not fresh:
        args["optimizer"] = args["optimizer"].original  # the user's object, as compile takes it
    if fresh:
        # Optimizer and metric objects hold variables made when they were created;
        # copies made here get them inside the strategy's scope.
        args["optimizer"] = _fresh(args.get("optimizer") or _DEFAULT_OPTIMIZER)
        for key in ("metrics", "weighted_metrics"):
            if args.get(key) is not None:
                args[key] = _fresh(args[key])
    model.compile(**args)


def _rebuild(model, detached):
    """Clone a model made outside the scope; give it the weights and compile settings
    read from it before the strategy was built."""
    configs = detached.layer_configs
    clone = clone_compiled(model, (
        f"The model {model.name!r} was created outside the strategy's scope and cannot be "
        "rebuilt inside it"), compile_args=detached.compile_args,
        clone_function=lambda layer: layer.__class__.from_config(
            configs[id(layer)] if id(layer) in configs else layer.get_config()))
    if len(clone.weights) != len(detached.weights):
        # A Sequential without an Input whose layers were built beforehand: its layers'
        # copies are not built until told how.
        for layer, copy in zip(model.layers, clone.layers):
            config = layer.get_build_config() if layer.built else None
            if config and not copy.built:
                copy.build_from_config(config)
    mine = [tuple(v.shape) for v in clone.weights]
    theirs = [tuple(w.shape) for w in detached.weights]
    if mine != theirs:
        raise NotClonable(
            f"The model {model.name!r} was created outside the strategy's scope, and its copy "
            f"made from its config does not have its weights ({len(mine)} against "
            f"{len(theirs)}: a weight two layers share, as a tied embedding, is made twice by "
            "a copy; LoRA or quantized layers are made anew). Pass a function that builds and "
            "compiles the model instead, e.g. `Trainer(build_model, ...)`, or train on one "
            "device, where the model trains as it is. Received: weight shapes "
            f"{mine[:4]}... of the copy, {theirs[:4]}... of the model")
    clone.set_weights(detached.weights)
    weights = {id(v) for v in clone.weights}
    states = [v for v in clone.variables if id(v) not in weights]
    if len(states) == len(detached.states) and all(
            tuple(v.shape) == a.shape for v, a in zip(states, detached.states)):
        instances.assign(states, detached.states, [])
    _normalize_with_its_variables(clone)
    # In scope: each table is made again where the strategy wants it (per worker under ps).
    for layer, contents in zip(_compat.lookup_layers(clone), detached.lookups):
        _compat.set_lookup_contents(layer, contents)
    return clone


def clone_compiled(model, why, compile_args=None, clone_function=None):
    """`keras.models.clone_model(model)`, compiled as `model` is (with fresh optimizer state).

    `compile_args` (optimizer and metrics possibly as configs) default to `model`'s own.

    Raises:
        ValueError: Keras cannot clone the model from its config; `why` starts the message.
    """
    compiled = getattr(model, "compiled", False)
    try:
        # clone_model also compiles the clone from the original's serialised compile
        # config, which reads the optimizer's learning-rate variable (unreadable once a
        # ps cluster is connected) and fails for unregistered custom losses; the clone is
        # compiled below from the arguments kerastrain holds, so skip that step.
        model.compiled = False
        # Under the model's own dtype policy: a model made under mixed_float16 keeps it
        # (its copy was float32, so `compile` gave it no loss scaling, without a word).
        with precision.global_policy(model.dtype_policy):
            clone = keras.models.clone_model(model, clone_function=clone_function)
    except Exception as e:  # clone_model raises several types for unclonable models
        cause = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise NotClonable(
            f"{why} (Keras cannot clone it from its config). Pass a function that "
            "builds and compiles the model instead, e.g. `Trainer(build_model, ...)`; kerastrain "
            f"calls it wherever it needs the model built. Cause: {type(e).__name__}: {cause}"
        ) from None
    finally:
        model.compiled = compiled
    args = compile_args if compile_args is not None else _compat.compile_args(model)
    if args is not None and compiled:
        _recompile(clone, args, fresh=True)
    return clone


def unpartitioned_copy(model, source=None):
    """The same model with whole variables on this machine, compiled alike, for export.

    Built from `source` when it is a model function, else cloned from the model's
    config; then every variable gets the partitioned model's value.
    """
    if tf.distribute.has_strategy():
        raise RuntimeError("unpartitioned_copy must be called outside a strategy scope")
    if callable(source) and not isinstance(source, keras.Model):
        copy = source()
    else:
        copy = clone_compiled(model, (
            f"The model {model.name!r} has partitioned variables, so kerastrain exports a copy "
            "with whole variables, but it cannot make one"))
    if len(copy.weights) != len(model.weights):
        copy.build_from_config(model.get_build_config())
    mine, theirs = copy.weights, model.weights
    if [tuple(v.shape) for v in mine] != [tuple(v.shape) for v in theirs]:
        raise ValueError(
            f"The rebuilt model {copy.name!r} does not have the trained model's variables "
            "(a model function must build the same model each time). Received shapes "
            f"{[tuple(v.shape) for v in mine]}, expected {[tuple(v.shape) for v in theirs]}")
    for target, variable in zip(mine, theirs):
        target.assign(tf.convert_to_tensor(variable.value))
    _normalize_with_its_variables(copy)
    return copy


def _normalize_with_its_variables(model):
    """An adapted Normalization keeps its statistics in variables but normalises with
    tensors made from them (`finalize_state`, which Keras's loading calls and
    `set_weights` / `assign` do not): make them again from the variables given."""
    for layer in _compat.all_layers(model):
        if isinstance(layer, keras.layers.Normalization):
            layer.finalize_state()
