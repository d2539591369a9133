"""The user's own model instance: what kerastrain reads of it before the strategy exists,
its optimizer's state carried into the copy that trains, and the trained values handed back.

A model instance made outside the strategy's scope is trained as a copy made in scope
(`models.materialize`); the user's object must then work as after `model.fit`: `predict`,
`evaluate`, `fit`, `save`, also under parameter servers, whose connection leaves every
variable made before it on a device that is gone.
"""

from __future__ import annotations

import contextlib
import logging

import keras
import numpy as np
import tensorflow as tf

from kerastrain import _compat

logger = logging.getLogger("kerastrain")


class FromConfig:
    """An optimizer or metric read as (class, config), to be made again in a scope
    (`original`: the object itself, used where no copy is needed)."""

    def __init__(self, obj):
        self.cls, self.config, self.original = type(obj), obj.get_config(), obj

    def make(self):
        return self.cls.from_config(self.config)


class Detached:
    """What kerastrain needs of a user's model instance, read before the strategy exists.

    Connecting to a parameter-server cluster moves this process's eager work off
    `/job:localhost`, where the instance's variables live; after that they (and the
    optimizer's learning rate, which `get_config` reads) cannot be read. So the
    weights and the compile arguments (the optimizer as a config) are read
    first, and the model is rebuilt in scope from them.
    """

    def __init__(self, model):
        self.weights = model.get_weights()
        # The random layers' seed states (Dropout, RandomFlip... unseeded: drawn when the
        # layer was made): the copy goes on with the user's random stream, not a new one.
        weights = {id(v) for v in model.weights}
        self.states = [v.numpy() for v in model.variables if id(v) not in weights]
        # Lookup tables are not variables: read their vocabularies (and TF-IDF weights), and
        # the layers' configs (TextVectorization's reads its table), while they can be read.
        lookups = _compat.lookup_layers(model)
        _check_vocabularies(model, lookups)
        self.lookups = [_compat.lookup_contents(layer) for layer in lookups]
        self.layer_configs = {}
        for layer in model.layers:
            try:
                self.layer_configs[id(layer)] = layer.get_config()
            except NotImplementedError:  # no config: no copy (`models.clone_compiled` says so)
                pass
        args = _compat.compile_args(model) if getattr(model, "compiled", False) else None
        self.compile_args = None if args is None else {
            k: _as_config(v) for k, v in args.items()}
        # A model trained before (by `model.fit`) has its optimizer's state: step count,
        # learning rate, slots. The copy's fresh optimizer goes on from it (`carry_optimizer`).
        self.optimizer = getattr(model, "optimizer", None)
        self.optimizer_state = [v.numpy() for v in self.optimizer.variables] \
            if self.optimizer is not None and self.optimizer.built else None


def _as_config(obj):
    # An optimizer is copied from its config (its learning rate, a variable, is read now);
    # a metric object is kept and given new storage in scope (`models._fresh`).
    if isinstance(obj, keras.optimizers.Optimizer):
        return FromConfig(obj)
    if isinstance(obj, (list, tuple, dict)):
        return same_structure(obj, _as_config)
    return obj


def same_structure(obj, fn):
    """`obj` (a list, tuple, namedtuple or dict, as `compile` takes its losses and metrics,
    which Keras may keep in its own tracked lists and dicts) with `fn` applied to each item."""
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(fn(o) for o in obj))
    if isinstance(obj, tuple):
        return tuple(fn(o) for o in obj)
    if isinstance(obj, list):  # also TensorFlow's ListWrapper, which takes no generator
        return [fn(o) for o in obj]
    return {k: fn(v) for k, v in obj.items()}


def detach(model):
    """`Detached(model)` for a model instance; None for a model function."""
    return Detached(model) if isinstance(model, keras.Model) else None


def detach_optimizer(optimizer):
    """An optimizer object given beside the model (`Trainer(optimizer=Adam(1e-3))`), read
    before the strategy exists, as a model instance is: its learning rate is a variable that
    a parameter-server cluster, once connected, makes unreadable here."""
    return FromConfig(optimizer) if isinstance(optimizer, keras.optimizers.Optimizer) \
        else optimizer


@contextlib.contextmanager
def handing_back(trained, user_model):
    """However training ends (done, preempted, diverged, an error), the user's own model
    object (None: there is none) holds the weights trained so far."""
    try:
        yield
    finally:
        if user_model is not None:
            hand_back(trained, user_model)


def hand_back(trained, user_model, *, keep_functions=False):
    """Put what `trained` holds into the user's own model object, so that everything code
    written for `model.fit` does next works on it: `predict`, `evaluate`, `fit`, `save`.

    - Its variables (weights and random seeds' states) and its optimizer's (step count,
      learning rate, slots; built first if the user's never was) take `trained`'s values;
      Keras's gradient accumulators, which kerastrain's copy has not, are emptied.
    - Under parameter servers the user's variables, optimizer and metrics made before this
      process connected to the cluster sit on a device that is gone ("Client for target
      /job:localhost... not found"): they get new storage here; so do its lookup layers'
      tables (StringLookup's, TextVectorization's: "unknown device"), with the same vocabulary.
    - Keras's cached train / test / predict functions were traced for those devices and the
      old values: they are dropped, and Keras traces them again on next use. With
      `keep_functions` (an epoch end: callbacks may use the user's object, as under
      `model.fit`) they are dropped only if a variable got new storage.
    """
    moved = []
    values = _values_if_paired(user_model.variables, trained.variables)
    if values is not None:
        assign(user_model.variables, values, moved)
    else:  # a partitioned model's variables are shards: its weights pair up
        assign(user_model.weights, trained.get_weights(), moved)
    mine, theirs = user_model.optimizer, getattr(trained, "optimizer", None)
    if mine is not None:
        _compat.rekey_optimizer(mine)  # its model's variables may have new storage now
    if mine is not None and theirs is not None and getattr(theirs, "built", False):
        _rehome_unreadable(mine.variables, moved)
        if not mine.built:
            # A model made in a strategy's scope of the user's own (keras.io's multi-GPU
            # guide) has an optimizer that builds only in that scope.
            with _compat.optimizer_strategy_scope(mine):
                mine.build(user_model.trainable_variables)
            moved.append(mine)
        pairs = _optimizer_pairs(mine, theirs, theirs.variables)
        if pairs is not None:
            assign(*pairs, moved)
    _rehome_unreadable(user_model.metrics_variables + _compiled_metric_variables(user_model),
                       moved)
    _rehome_lookup_tables(user_model, trained, moved)
    if moved or not keep_functions:
        user_model.train_function = user_model.test_function = user_model.predict_function = None


def _compiled_metric_variables(model):
    """The variables of the metric objects given to `compile` (`AUC()`...): made with them,
    they are not in `metrics_variables` until Keras builds its compiled metrics on first use."""
    args = _compat.compile_args(model) or {}
    given = keras.tree.flatten([args.get("metrics"), args.get("weighted_metrics")])
    return [v for m in given if isinstance(m, keras.metrics.Metric) for v in m.variables]


def _rehome_lookup_tables(user_model, trained, moved):
    """A lookup table (StringLookup's, IntegerLookup's, TextVectorization's) is a TensorFlow
    resource, not a variable: the user's, made before this process connected to a
    parameter-server cluster, is on a device that is gone ("unknown device"). Each such
    table is made again here, holding what `trained`'s copy of it holds (the vocabulary
    `Detached` read, which training does not change); its layer is added to `moved`."""
    mine, theirs = _compat.lookup_layers(user_model), _compat.lookup_layers(trained)
    if len(mine) != len(theirs):
        return
    for layer, source in zip(mine, theirs):
        try:
            layer.lookup_table.size().numpy()
        except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError):
            _compat.set_lookup_contents(layer, _compat.lookup_contents(source))
            _compat.renew_adapt_state(layer)  # its token counts were on that device too
            moved.append(layer)


def carry_optimizer(model, detached):
    """Put the user's optimizer state into the optimizer kerastrain built for its copy of
    the model (call in scope, once built), so that training goes on as a second
    `model.fit` would: Adam's moments and step count, not fresh ones. Nothing when the
    model was not copied, its optimizer never built, or another optimizer was given."""
    if detached is None or detached.optimizer_state is None or model.optimizer is None or \
            model.optimizer is detached.optimizer or \
            type(model.optimizer) is not type(detached.optimizer):
        return
    pairs = _optimizer_pairs(model.optimizer, detached.optimizer, detached.optimizer_state)
    if pairs is None:
        logger.warning(
            "the model's optimizer had trained before (%d variables), and its state does not "
            "fit the optimizer built for training here (%d variables): training starts with "
            "a fresh optimizer state, unlike a second model.fit",
            len(detached.optimizer_state), len(model.optimizer.variables))
        return
    assign(*pairs, [])


def _optimizer_pairs(mine, theirs, state):
    """(`mine`'s variables, the value each takes from `state`), `state` being the variables
    or values of optimizer `theirs` in its variables' order; None when they do not pair up.

    kerastrain's own accumulation builds no Keras gradient accumulators
    (`accumulation.keras_accumulation_off`), whereas an optimizer Keras built (the user's)
    has one per trainable variable, among its variables. Between kerastrain's updates they
    hold nothing: where only one side has them, they are left out of the pairing, and
    `mine`'s are emptied.
    """
    variables, state = list(mine.variables), list(state)
    own = {id(v) for v in _compat.gradient_accumulators(mine)}
    other = {id(v) for v in _compat.gradient_accumulators(theirs)}
    emptied = []
    if bool(own) != bool(other):
        emptied = [v for v in variables if id(v) in own]
        variables = [v for v in variables if id(v) not in own]
        state = [s for v, s in zip(theirs.variables, state) if id(v) not in other]
    values = _values_if_paired(variables, state)
    if values is None:
        return None
    return variables + emptied, values + [np.zeros(v.shape, v.dtype) for v in emptied]


def _values_if_paired(mine, theirs):
    """`theirs`' values (variables or arrays) when the two lists pair up one to one by
    shape, else None."""
    if len(mine) != len(theirs) or any(tuple(a.shape) != tuple(b.shape)
                                       for a, b in zip(mine, theirs)):
        return None
    try:
        return [v if isinstance(v, (np.ndarray, np.generic)) else v.numpy() for v in theirs]
    except (AttributeError, TypeError, ValueError):  # e.g. a partitioned variable's shards
        return None


def assign(variables, values, moved):
    """Assign each value; a variable that cannot take it (its device is gone) gets new
    storage, and is added to `moved`."""
    for variable, value in zip(variables, values):
        value = np.asarray(value)
        if not _set(variable, value):
            _compat.replace_storage([variable], [value])
            moved.append(variable)


def _set(variable, value) -> bool:
    try:
        variable.assign(value)
        return True
    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError):
        return False


def value_or_zeros(variable):
    """A variable's value, or zeros where this process cannot read it (made before it joined
    a parameter-server cluster): a metric's state, which starts each epoch afresh anyway."""
    try:
        return variable.numpy()
    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError):
        return np.zeros(variable.shape, variable.dtype)


def _rehome_unreadable(variables, moved):
    """New storage, holding zeros, for variables on a device that is gone (metric states,
    an optimizer's count: their values there cannot be read); added to `moved`."""
    for variable in variables:
        try:
            variable.numpy()
        except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError):
            _compat.replace_storage([variable], [np.zeros(variable.shape, variable.dtype)])
            moved.append(variable)


def _check_vocabularies(model, lookups):
    """A lookup layer with no vocabulary (never adapted, none given) cannot be copied, and
    `model.fit` fails on it too ("Table not initialized"): a clear error first."""
    empty = [f"{type(layer).__name__} {layer.name!r}" for layer in lookups
             if not layer.get_vocabulary(include_special_tokens=False)]
    if empty:
        raise ValueError(
            f"The model {model.name!r} has lookup layers with no vocabulary: "
            f"{', '.join(empty)} (a TextVectorization holds one such layer). Call "
            "`layer.adapt(data)`, or pass `vocabulary=...`, before making the Trainer: the "
            "copy kerastrain trains is made from the model as it is now, and model.fit fails "
            "on such a layer too (\"Table not initialized\"). Received: a model with "
            f"{len(empty)} empty lookup layer(s)")


def take_changes(trained, user_model):
    """Put the user's own object's weights and optimizer state into `trained` where they
    differ from it: code between two Trainer calls changed the object the user sees
    (`model.fit`, `set_weights`, `load_weights`), and the next call trains, evaluates or
    predicts from it, as Keras would. Nothing while the object cannot be read (under
    parameter servers, until the first `fit` hands it back). Returns whether it changed."""
    mine, theirs = getattr(trained, "optimizer", None), getattr(user_model, "optimizer", None)
    try:
        pairs = [(trained.variables, _values_if_paired(trained.variables, user_model.variables))]
        if mine is not None and theirs is not None and type(mine) is type(theirs) and \
                getattr(mine, "built", False) and getattr(theirs, "built", False):
            pairs.append(_optimizer_pairs(mine, theirs, theirs.variables) or (None, None))
    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError):
        return False  # on a device that is gone: not handed back yet
    changed = False
    for variables, values in pairs:
        if values is not None and any(
                not _same(v.numpy(), value) for v, value in zip(variables, values)):
            assign(variables, values, [])
            changed = True
    if changed:
        logger.info("the model object %r changed since kerastrain last read it (model.fit, "
                    "set_weights, load_weights...): training goes on from its weights and "
                    "optimizer state, as model.fit would", user_model.name)
    return changed


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    return np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")  # NaN equals NaN: unchanged
