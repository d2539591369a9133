"""`Trainer.predict`: the model's `predict_step` over batches, outputs as NumPy in input order.

Where the batches run:

- one device, mirrored: each global batch is split over the replicas in order (replica 0 takes the first examples) and every replica runs
  `model.predict_step` on its part; the parts are put back together replica by
  replica, so outputs come in input order, a partial last batch included (a
  replica may get no examples). A `dataset_fn(ctx)` of per-replica batches gives
  its outputs step by step, replica by replica.
- multi-worker mirrored, parameter servers and central storage: this task
  predicts every batch itself, on its own copy of the inputs, reading the trained
  variables (under parameter servers, the coordinator reads them from the ps
  tasks). Nothing is split across workers, so every task returns all the outputs
  and no collective or scheduled function is involved. Central storage is here
  because its distributed datasets drop a last batch its replicas cannot split.
"""

from __future__ import annotations

import itertools

import numpy as np
import tensorflow as tf

from kerastrain._tracing import compiled, runs_eagerly
from kerastrain.data import numpy_data
from kerastrain.data import preprocessing
from kerastrain.data import inputs as data_lib

DEFAULT_BATCH_SIZE = 32  # as in Keras's `predict(x)`


def check_options(*, batch_size, steps):
    from kerastrain._options import check_int
    check_int("batch_size", batch_size, minimum=1, optional=True)
    check_int("steps", steps, minimum=1, optional=True)


def _pack(x):
    """Keras's packing of arrays `x` for predict: a tuple or list of inputs becomes `(x,)`."""
    return (tuple(x),) if isinstance(x, (tuple, list)) else x


def global_dataset(x, *, batch_size, argument="x"):
    """A `tf.data.Dataset` of global batches of `x` (arrays, a dataset or a function of one);
    None for a `dataset_fn(ctx)`."""
    if data_lib.array_leaves(x) is not None and not callable(x):
        batch_size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        if not data_lib.dense_arrays(x):  # ragged, sparse or None: Keras's own slicing
            from kerastrain import _compat
            return _compat.arrays_dataset((x,), batch_size=batch_size, shuffle=False)
        dataset = tf.data.Dataset.from_tensor_slices(numpy_data.keras_arrays(_pack(x)))
        return dataset.batch(batch_size)
    form = data_lib.input_form(x, argument)
    if batch_size is not None:
        raise ValueError(
            "`batch_size` applies to NumPy input only; a dataset or dataset_fn batches its own "
            f"data. Received: batch_size={batch_size!r} with {argument} of form {form!r}")
    if form == "dataset":
        return x
    if form == "python":  # predicted by this process, under every strategy
        return data_lib.python_dataset(x, argument=argument)
    if form == "global_fn":
        return _checked(x(), argument)
    return None


def _checked(dataset, argument):
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"`{argument}` must return a tf.data.Dataset. Received: an object of "
                        f"type {type(dataset).__name__}")
    return dataset


def _check_finite(dataset, steps, argument):
    if steps is None and data_lib.cardinality(dataset) == data_lib.INFINITE:
        raise ValueError(f"The data given as `{argument}` is infinite (it repeats): pass "
                         "`steps`, the number of batches to predict. Received: steps=None")


class Predictor:
    """Compiled predict steps of one model under one strategy (see the module docstring)."""

    @classmethod
    def of(cls, previous, built, model, preprocess=None, *, policy):
        """`previous` (a Predictor, or None) where it predicts with `model`, else a new one
        (a second compile made a new model)."""
        if previous is not None and previous.model is model:
            return previous
        return cls(built, model, preprocess, policy=policy)

    def __init__(self, built, model, preprocess=None, *, policy):
        self.built = built
        self.model = model
        self.preprocess = preprocess  # a keras-hub task's `preprocess_samples`, or None
        self.policy = policy  # the kind's `data.policy.InputPolicy`
        # Where this task predicts every batch itself, whole.
        self.local = policy.predicts_here
        self._step = None

    def batches(self, x, *, batch_size, steps, argument="x"):
        """An iterable of what one compiled step takes, the number of batches if known, and
        the element spec of a (global or per-replica) batch."""
        strategy = self.built.strategy
        if self.preprocess is not None:  # as the task's own predict maps it over the batches
            x, batch_size = preprocessing.mapped(x, self.preprocess, argument=argument,
                                                 batch_size=batch_size), None
        dataset = global_dataset(x, batch_size=batch_size, argument=argument)
        if dataset is None:  # a dataset_fn(ctx)
            if self.local:
                dataset = _checked(x(tf.distribute.InputContext(1, 0, 1)), argument)
            else:
                probe = _checked(x(tf.distribute.InputContext(
                    1, 0, strategy.num_replicas_in_sync)), argument)
                _check_finite(probe, steps, argument)
                return strategy.distribute_datasets_from_function(
                    lambda ctx: _checked(x(ctx), argument)), _known(probe, steps), \
                    probe.element_spec
        _check_finite(dataset, steps, argument)
        data_lib.check_no_absent(dataset.element_spec, argument, self.built, self.policy)
        if self.local:
            return dataset, _known(dataset, steps), dataset.element_spec
        # Every replica of this one task reads this one dataset: TensorFlow's default policy
        # shards nothing for one worker and splits each batch on its own (`OFF` regrouped
        # examples across batches: `steps=4` predicted 8 rows of a dataset of 7).
        return strategy.experimental_distribute_dataset(dataset), _known(dataset, steps), \
            dataset.element_spec

    def step(self):
        """`fn(batch) -> outputs`, the replicas' outputs concatenated in replica order."""
        if self._step is None:
            model, strategy = self.model, self.built.strategy
            if self.local:
                def one(batch):
                    return model.predict_step(batch)
            else:
                def one(batch):
                    outputs = strategy.run(model.predict_step, args=(batch,))
                    return tf.nest.map_structure(
                        lambda v: tf.concat(strategy.experimental_local_results(v), axis=0),
                        outputs)
            self._step = compiled(one, eager=runs_eagerly(model), reduce_retracing=True,
                                  autograph=False)
        return self._step

    def predict(self, x, *, batch_size, steps, callbacks, verbose):
        """`model.predict(x, ...)`'s outputs (`callbacks` checked, `verbose` resolved)."""
        from kerastrain.loop import callbacks as callbacks_lib
        check_options(batch_size=batch_size, steps=steps)
        batches, known, spec = self.batches(x, batch_size=batch_size, steps=steps)
        self.ensure_built(spec)
        return self.run(batches, steps, callbacks_lib.callback_list(
            callbacks, model=self.model, history=False, verbose=verbose, epochs=1, steps=known))

    def run(self, batches, steps, callback_list):
        """Predict up to `steps` of `batches` with `callback_list`'s `on_predict_*` hooks;
        the outputs joined (`concatenate`). As `model.predict` with
        `compile(steps_per_execution=N)`: the batch hooks around each N batches,
        `on_predict_batch_begin(i)` (i = 0, N, 2N, ...) and `on_predict_batch_end(i + N - 1,
        {"outputs": their outputs joined})`; `model.stop_predicting` stops after an end."""
        from kerastrain.loop import callbacks as callbacks_lib
        step, outputs = self.step(), []
        every = callbacks_lib.steps_per_execution(self.model)
        self.model.stop_predicting = False
        callback_list.on_predict_begin()
        batches = iter(itertools.islice(batches, steps))
        for begin in itertools.count(0, every):
            group = list(itertools.islice(batches, every))
            if not group:
                break
            callback_list.on_predict_batch_begin(begin)
            parts = [to_numpy(step(batch)) for batch in group]
            outputs.extend(parts)
            callback_list.on_predict_batch_end(begin + every - 1, {
                "outputs": parts[0] if len(parts) == 1 else concatenate(parts)})
            if self.model.stop_predicting:
                break
        callback_list.on_predict_end()
        return concatenate(outputs)

    def ensure_built(self, element_spec):
        """Build a model whose variables do not exist yet, from zeros shaped like a batch,
        in the strategy's scope (a compiled step under mirrored may not create them)."""
        if self.model.built:
            return
        from kerastrain import _compat
        x = _compat.zeros_batch(data_lib.split_batch(element_spec)[0])
        with self.built.strategy.scope():
            self.model(x, training=False)


def _known(dataset, steps):
    n = data_lib.cardinality(dataset)
    if n < 0:
        return steps
    return n if steps is None else min(n, steps)


def concatenate(batches):
    """The batches' outputs (nested like the model's outputs) joined along the batch axis."""
    if not batches:
        raise ValueError("`predict` got no batches: the data is empty. Received: 0 batches")

    def join(*parts):  # ragged outputs stay a tf.RaggedTensor, as `model.predict` returns
        if isinstance(parts[0], tf.RaggedTensor):
            return tf.concat(parts, axis=0)
        return np.concatenate(parts, axis=0)
    return tf.nest.map_structure(join, *batches)


def to_numpy(outputs):
    return tf.nest.map_structure(
        lambda t: t if isinstance(t, tf.RaggedTensor) else np.asarray(t), outputs)
