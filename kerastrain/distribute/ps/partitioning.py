"""Partitioned variables (large embedding tables) for Keras 3 models on parameter servers.

TensorFlow's parameter-server strategy can split a variable into shards on
several parameter servers (a `ShardedVariable`), but a Keras 3 variable holding
one cannot be differentiated or updated by Keras ("no attribute 'handle'"). This
module makes such a model train, one shard at a time:

- **Forward**: a partitioned `Embedding` looks its rows up shard by shard
  (`tf.nn.embedding_lookup` over the shards, each gather placed on its parameter
  server), so a step reads only the rows it needs. Other layers read the whole
  variable, as they need all of it.
- **Gradients** are taken with respect to the shards, so an embedding's gradient
  is one `IndexedSlices` per shard: rows, not the table.
- **Optimizer**: the model's optimizer keeps the state a one-device run would
  have, one slot per model variable, but a partitioned variable's slots are
  partitioned the same way, each shard next to its variable's shard. A second
  instance of the same optimizer, sharing those slots, its step counter and its
  learning rate, applies the updates shard by shard on the parameter servers.
- **Checkpoints** hold every variable and slot whole, under the names a
  one-device run uses, so a checkpoint restores into any number of shards or
  into a model without partitioning.

Everything private about it lives in `kerastrain._compat`.
"""

from __future__ import annotations

import contextlib
import logging
import re

from kerastrain._options import is_int

logger = logging.getLogger("kerastrain")

# name -> (TensorFlow class name, {option: its minimum}); every option is an int
PARTITIONERS = {
    "min_size": ("MinSizePartitioner", {"min_shard_bytes": 1, "max_shards": 1,
                                        "bytes_per_string": 1}),
    "fixed_shards": ("FixedShardsPartitioner", {"num_shards": 1}),
    "max_size": ("MaxSizePartitioner", {"max_shard_bytes": 1, "max_shards": 1,
                                        "bytes_per_string": 1}),
}
_REQUIRED = {"fixed_shards": ("num_shards",), "max_size": ("max_shard_bytes",)}


def check_partitioner(value, key="variable_partitioner") -> dict:
    """Validate a partitioner spec; returns it as a dict. Imports no TensorFlow.

    Accepts a name (`"min_size"`) or a mapping `{"name": "min_size", "min_shard_bytes": ...}`.
    """
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict) or "name" not in value:
        raise ValueError(
            f"`{key}` must be a partitioner name or a mapping with a `name`, e.g. "
            '{"name": "min_size", "min_shard_bytes": 262144, "max_shards": 2}. '
            f"Received: {value!r}")
    name = value["name"]
    if name not in PARTITIONERS:
        raise ValueError(
            f"`{key}.name` must be one of {sorted(PARTITIONERS)}. Received: {name!r}")
    allowed = PARTITIONERS[name][1]
    for option, given in value.items():
        if option == "name":
            continue
        if option not in allowed:
            raise ValueError(
                f"`{key}`: partitioner {name!r} has no option {option!r}; its options are "
                f"{sorted(allowed)}. Received: {value!r}")
        minimum = allowed[option]
        if not is_int(given, minimum):
            raise ValueError(
                f"`{key}.{option}` must be an integer >= {minimum}. Received: {given!r}")
    missing = [o for o in _REQUIRED.get(name, ()) if o not in value]
    if missing:
        raise ValueError(f"`{key}`: partitioner {name!r} needs {missing}. Received: {value!r}")
    return dict(value)


def build_partitioner(spec):
    """The TensorFlow partitioner object for a checked spec (None for None)."""
    if spec is None:
        return None
    import tensorflow as tf
    spec = check_partitioner(spec)
    cls = getattr(tf.distribute.experimental.partitioners, PARTITIONERS[spec["name"]][0])
    return cls(**{k: v for k, v in spec.items() if k != "name"})


def describe(spec) -> str:
    spec = check_partitioner(spec)
    options = ", ".join(f"{k}={v}" for k, v in spec.items() if k != "name")
    return f"{spec['name']}({options})"


def _sharded_class():
    from kerastrain import _compat
    return _compat.sharded_variable_class()


def shards_of(variable):
    """The shard variables of a partitioned Keras variable, or None."""
    value = getattr(variable, "value", variable)
    if isinstance(value, _sharded_class()):
        return list(value.variables)
    return None


class Partitioning:
    """What is partitioned in one model, and the per-shard view of its training."""

    def __init__(self, model):
        from kerastrain import _compat
        self.model = model
        owners = _compat.variable_owners(model)
        self.partitioned = [(v, owners.get(id(v))) for v in model.variables
                            if shards_of(v) is not None]
        self._shards = {id(v): shards_of(v) for v, _ in self.partitioned}
        for v, _ in self.partitioned:
            _compat.checkpoint_whole(v.value)
        self.update_optimizer = None
        self._slots = {}

    def __bool__(self):
        return bool(self.partitioned)

    def summary(self) -> str:
        parts = []
        for v, layer in self.partitioned:
            shards = self._shards[id(v)]
            devices = sorted({_task(s.device) for s in shards})
            rows = "+".join(str(int(s.shape[0])) for s in shards)
            parts.append(f"{v.path} {tuple(v.shape)} in {len(shards)} shards ({rows} rows) "
                         f"on {', '.join(devices)}")
        return "partitioned variables: " + "; ".join(parts)

    # -- checks ---------------------------------------------------------------

    def check(self):
        """Clear errors for layers and optimizers that cannot use partitioned variables."""
        for v, layer in self.partitioned:
            where = f"layer {layer.name!r} ({type(layer).__name__})" if layer is not None else "model"
            problem = None
            if getattr(v, "overwrite_with_gradient", False):
                problem = "it is overwritten with its gradient (overwrite_with_gradient)"
            elif layer is not None and getattr(layer, "lora_enabled", False):
                problem = "the layer has LoRA enabled"
            elif layer is not None and getattr(layer, "quantization_mode", None):
                problem = f"the layer is quantized ({layer.quantization_mode})"
            elif getattr(v, "constraint", None) is not None:
                problem = "it has a constraint, which Keras applies to the whole variable"
            if problem:
                raise ValueError(self._cannot(v, where, problem))
        self._check_optimizer(self.model.optimizer)

    def _check_optimizer(self, optimizer):
        import keras
        name = type(optimizer).__name__
        problem = None
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            problem = "its loss scale (mixed precision) is not kept per shard"
        elif name in _WHOLE_VARIABLE_OPTIMIZERS:
            problem = _WHOLE_VARIABLE_OPTIMIZERS[name]
        elif getattr(optimizer, "use_ema", False):
            problem = "its moving average of the weights (use_ema) is not kept per shard"
        elif getattr(optimizer, "clipnorm", None):
            problem = ("`clipnorm` clips each variable's gradient by its own norm (use "
                       "`global_clipnorm`, the same over shards, or `clipvalue`)")
        if problem:
            raise ValueError(
                f"The optimizer {name} cannot update partitioned variables shard by shard: "
                f"{problem}. Use an optimizer whose update is element by element "
                f"({', '.join(sorted(_PER_ELEMENT_OPTIMIZERS))}), or keep the variables whole "
                f"(no variable_partitioner, or a larger min_shard_bytes). Received: "
                f"{self.summary()}")
        if name not in _PER_ELEMENT_OPTIMIZERS:
            logger.warning(
                "kerastrain updates partitioned variables shard by shard with %s; that equals "
                "updating them whole only if its update is element by element (true of %s)",
                name, ", ".join(sorted(_PER_ELEMENT_OPTIMIZERS)))

    def _cannot(self, variable, where, problem):
        nbytes = _nbytes(variable)
        return (f"Variable {variable.path!r} of {where} is partitioned by the "
                f"variable_partitioner, but {problem}, so it cannot be split into shards. "
                f"Keep it whole: raise `min_shard_bytes` (or `max_shard_bytes`) above its size, "
                f"{nbytes} bytes, e.g. min_shard_bytes={_round_up(nbytes + 1)}.")

    # -- forward --------------------------------------------------------------

    def install(self):
        """Make partitioned layers read shard by shard and name themselves in errors."""
        import keras
        for layer in {id(layer): layer for _, layer in self.partitioned
                      if layer is not None}.values():
            if layer.__dict__.get("_kerastrain_call") is not None:
                continue
            original = layer.call
            lookup = (type(layer).call is keras.layers.Embedding.call)
            variables = [v for v, owner in self.partitioned if owner is layer]
            # On the instance, not the class: other models' layers are untouched, and
            # the export (a copy with whole variables) has plain layers.
            object.__setattr__(layer, "_kerastrain_call", original)
            object.__setattr__(layer, "call",
                               _partitioned_call(layer, original, variables, lookup))

    # -- gradients and updates -----------------------------------------------

    def flat(self, variables):
        """`variables` with each partitioned one replaced by its shards, in order."""
        out = []
        for v in variables:
            out.extend(self._shards.get(id(v)) or [v])
        return out

    def build_optimizers(self, optimizer, trainable_variables):
        """Build `optimizer` (state, partitioned like the variables) and `update_optimizer`,

        which applies gradients for `self.flat(trainable_variables)`.
        """
        from kerastrain import _compat

        slots = self._slots
        shards = self._shards

        def logical_slot(reference_variable, name=None, initializer="zeros"):
            # The model's optimizer: a partitioned variable's slot is partitioned alike.
            reference = reference_variable
            parts = shards.get(id(reference))
            if parts is None:
                slot = original_add(reference, name=name, initializer=initializer)
            else:
                with _compat.partitioned_like(parts):
                    slot = optimizer.add_variable(
                        shape=reference.shape, initializer=initializer, dtype=reference.dtype,
                        name=f"{reference.path.replace('/', '_')}_{name or 'var'}")
                _compat.checkpoint_whole(slot.value)
            slots[(id(reference), name)] = slot
            return slot

        original_add = optimizer.add_variable_from_reference
        with _compat.instance_override(optimizer, "add_variable_from_reference", logical_slot):
            optimizer.build(trainable_variables)

        owner = {}
        for v in trainable_variables:
            for j, shard in enumerate(shards.get(id(v)) or []):
                owner[id(shard)] = (v, j)

        def shared_slot(reference_variable, name=None, initializer="zeros"):
            # The update optimizer: each shard's slot is the model optimizer's slot shard.
            reference = reference_variable
            if id(reference) in owner:
                variable, j = owner[id(reference)]
                return shards_of(slots[(id(variable), name)])[j]
            return slots[(id(reference), name)]

        update = type(optimizer).from_config(optimizer.get_config())
        _compat.share_optimizer_state(update, optimizer)
        created = []

        def record(next_creator, **kwargs):
            created.append(kwargs.get("name"))
            return next_creator(**kwargs)

        import tensorflow as tf
        with _compat.instance_override(update, "add_variable_from_reference", shared_slot), \
                tf.variable_creator_scope(record):
            update.build(self.flat(trainable_variables))
        if created:
            # State beside the per-variable slots would not be shared with the model's
            # optimizer (nor checkpointed): a custom optimizer we have not vetted.
            raise ValueError(
                f"The optimizer {type(optimizer).__name__} creates state besides one slot per "
                f"variable ({', '.join(map(str, created))}), so it cannot update partitioned "
                f"variables shard by shard. Use one of {', '.join(sorted(_PER_ELEMENT_OPTIMIZERS))}"
                f", or keep the variables whole. Received: {self.summary()}")
        self.update_optimizer = update


# Checked in tests against one device: a shard-by-shard update equals the whole one.
# (kerastrain.optimizers' lazy ones update row by row: each shard's rows on its own ps.)
_PER_ELEMENT_OPTIMIZERS = {"SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adamax", "Adadelta",
                           "Lion", "Ftrl", "LazyAdam", "LazyAdamW", "LazyAdagrad", "LazyLion"}
# Their update of a variable depends on all of it (or on state beside its slots).
_WHOLE_VARIABLE_OPTIMIZERS = {
    "Lamb": "its trust ratio uses the norm of the whole variable",
    "Lars": "its trust ratio uses the norm of the whole variable",
    "Adafactor": "its second moments are factored over the whole variable's rows and columns",
    "Muon": "it orthogonalises the whole matrix",
    "Nadam": "its momentum schedule product is state beside the per-variable slots",
}


def _task(device: str) -> str:
    import tensorflow as tf
    spec = tf.DeviceSpec.from_string(device)
    return f"{spec.job}:{spec.task}" if spec.job else device


def _round_up(n: int) -> int:
    power = 1
    while power < n:
        power *= 2
    return power


def _partitioned_call(layer, original, variables, lookup):
    import functools

    @functools.wraps(original)
    def call(inputs, *args, **kwargs):
        try:
            if lookup and not args and not kwargs:
                return _embedding_call(layer, inputs)
            return original(inputs, *args, **kwargs)
        except (AttributeError, TypeError, NotImplementedError) as e:
            if "ShardedVariable" not in str(e) and "handle" not in str(e):
                raise
            names = ", ".join(repr(v.path) for v in variables)
            raise TypeError(
                f"Layer {layer.name!r} ({type(layer).__name__}) cannot run with its partitioned "
                f"variable(s) {names}: it uses them in a way a sharded variable does not "
                f"support. Keep them whole: raise `min_shard_bytes` (or `max_shard_bytes`) "
                f"in the `variable_partitioner` above their size. TensorFlow said: "
                f"{type(e).__name__}: {str(e).splitlines()[0][:300]}") from None
    return call


def _embedding_call(layer, inputs):
    import tensorflow as tf
    if inputs.dtype not in (tf.int32, tf.int64):
        inputs = tf.cast(inputs, tf.int32)
    outputs = tf.nn.embedding_lookup(layer.embeddings.value, inputs)
    return tf.cast(outputs, layer.compute_dtype)


@contextlib.contextmanager
def explain_failures():
    """Turn a layer's failure on a partitioned variable while the model is built into advice.

    Keras runs every layer symbolically when a model is built; a layer that reads a
    variable in a way a `ShardedVariable` does not support (its raw `handle`, say)
    fails there with TensorFlow's bare AttributeError. Keras's message names the
    layer; the partitioned variables created so far say what to keep whole.
    """
    import tensorflow as tf
    created = []

    def record(next_creator, **kwargs):
        variable = next_creator(**kwargs)
        if isinstance(variable, _sharded_class()):
            created.append(variable)
        return variable

    try:
        with tf.variable_creator_scope(record):
            yield
    except (AttributeError, TypeError, NotImplementedError) as e:
        text = str(e)
        if not created or ("ShardedVariable" not in text and "handle" not in text):
            raise
        found = re.search(r"of '([^']+)' \(of type (\w+)\)", text)
        layer = f"Layer {found.group(1)!r} ({found.group(2)})" if found else "A layer"
        last = created[-1]
        nbytes = _nbytes(last)
        text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # Keras colours its messages
        cause = next((line for line in text.splitlines() if "ShardedVariable" in line),
                     text.splitlines()[0] if text else "")
        name = re.sub(r"/part_\d+(:\d+)?$", "", last.variables[0].name)
        raise TypeError(
            f"{layer} cannot run with a partitioned variable: it uses it in a way a sharded "
            f"variable does not support. The partitioned variable it created last is "
            f"{name!r} {tuple(last.shape)}, {nbytes} bytes, in {len(last.variables)} "
            f"shards. Keep it whole: raise `min_shard_bytes` (or `max_shard_bytes`) in the "
            f"`variable_partitioner` above its size, e.g. min_shard_bytes="
            f"{_round_up(nbytes + 1)}. TensorFlow said: {cause.strip()[:300]}") from None


def _nbytes(variable) -> int:
    import numpy as np
    import tensorflow as tf
    return int(np.prod(variable.shape)) * tf.as_dtype(variable.dtype).size
