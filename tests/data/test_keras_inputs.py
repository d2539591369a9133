"""What `model.fit` takes beyond tensors and arrays: generators, keras.utils.PyDataset, ragged and
sparse tensors, an optional input given None (docs/data.md, "Keras's other inputs")."""

import types

import numpy as np
import pytest

import helpers
import kerastrain as kt
from kerastrain.data import inputs as data_lib

STRATEGIES = ["one_device", "mirrored"]


def _strategy(name, two_cpus):
    return {"name": name, **(two_cpus if name == "mirrored" else {})}


def _batches(n=4, size=5):
    x, y = helpers.arrays(n * size)
    return [(x[i * size:(i + 1) * size], y[i * size:(i + 1) * size]) for i in range(n)]


class _Batches:
    """A keras.utils.PyDataset of `_batches()`, counting its epoch hooks."""

    def __new__(cls, **kwargs):
        import keras

        class Batches(keras.utils.PyDataset):
            def __init__(self, **kw):
                super().__init__(**kw)
                self.items, self.ends = _batches(), 0

            def __len__(self):
                return len(self.items)

            def __getitem__(self, i):
                return self.items[i]

            def on_epoch_end(self):
                self.ends += 1
        return Batches(**kwargs)


@pytest.mark.parametrize("name", STRATEGIES)
def test_generators_and_py_datasets_train_as_their_batches_do(name, two_cpus, make_trainer):
    """The same batches as a generator, a PyDataset (2 worker threads) and a dataset: the
    same losses and weights (batches of 5 over 2 replicas: split 3 + 2)."""
    import tensorflow as tf

    def dataset():
        return tf.data.Dataset.from_generator(
            lambda: iter(_batches()), output_signature=(tf.TensorSpec([None, 6]),
                                                        tf.TensorSpec([None, 1])))
    results = []
    for data in [dataset(), (b for b in _batches()), _Batches(workers=2)]:
        trainer = make_trainer(strategy=_strategy(name, two_cpus), seed=1)
        history = trainer.fit(data, epochs=1, shuffle=False)
        results.append((history.history["loss"], trainer.model.get_weights()))
    for loss, weights in results[1:]:
        np.testing.assert_allclose(loss, results[0][0], rtol=1e-6)
        for a, b in zip(weights, results[0][1]):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", STRATEGIES)
def test_a_py_dataset_is_read_every_epoch_and_a_generator_once(name, two_cpus, make_trainer,
                                                               caplog):
    trainer = make_trainer(strategy=_strategy(name, two_cpus), seed=1)
    py_dataset = _Batches()
    history = trainer.fit(py_dataset, epochs=3, validation_data=_Batches())
    assert len(history.history["val_loss"]) == 3 and py_dataset.ends == 3
    assert set(trainer.evaluate(_Batches())) == {"loss", "accuracy"}
    assert trainer.predict(_Batches()).shape == (20, 1)
    assert trainer.predict((x,) for x, _ in _batches()).shape == (20, 1)
    with caplog.at_level("WARNING", logger="kerastrain"):
        history = trainer.fit((b for b in _batches()), epochs=3)
    assert len(history.history["loss"]) == 1  # as model.fit: the input ran out
    assert "Your input ran out of data" in caplog.text

    def infinite():
        while True:
            yield from _batches()
    history = trainer.fit(infinite(), epochs=2, steps_per_epoch=6,
                          validation_data=infinite(), validation_steps=3)
    assert len(history.history["val_loss"]) == 2


def test_python_batches_are_refused_where_other_processes_would_read_them():
    import tensorflow as tf
    from kerastrain.loop import modes

    def policy(built):  # as the Trainer hands its kind's input policy down
        return modes.for_strategy(built).input_policy()
    dataset = data_lib.python_dataset(b for b in _batches())
    for built in [types.SimpleNamespace(is_parameter_server=True, num_workers=2, name="ps"),
                  types.SimpleNamespace(is_parameter_server=False, num_workers=2,
                                        name="multi_worker_mirrored", is_multi_worker=True)]:
        with pytest.raises(ValueError, match=rf"`x` is a generator.*under `{built.name}` with 2 "
                                             r"worker.*Build the input with tf.data"):
            data_lib.check_python_readable(built, dataset, "x", policy(built))
    one = types.SimpleNamespace(is_parameter_server=False, num_workers=1, name="mirrored",
                                is_multi_worker=False)
    data_lib.check_python_readable(one, dataset, "x", policy(one))
    ps = one.__class__(is_parameter_server=True, num_workers=2, name="ps")
    data_lib.check_python_readable(ps, tf.data.Dataset.range(2), "x", policy(ps))


@pytest.mark.parametrize("name", STRATEGIES)
def test_ragged_sparse_and_none_inputs_train(name, two_cpus, make_trainer):
    import keras
    import scipy.sparse
    import tensorflow as tf

    def ragged_model():
        model = keras.Sequential([keras.Input((None,), ragged=True, dtype="int32"),
                                  keras.layers.Embedding(10, 4), keras.layers.GlobalAveragePooling1D(),
                                  keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        return model
    x = tf.ragged.constant([[1], [2, 3], [4, 5, 6], [7]])
    trainer = make_trainer(model=ragged_model, strategy=_strategy(name, two_cpus), seed=0)
    trainer.fit(x, np.ones((4, 1), "float32"), batch_size=3, epochs=2)
    assert trainer.predict(x, batch_size=3).shape == (4, 1)

    def optional_model():
        a, b = keras.Input((6,), name="a"), keras.Input((6,), name="b", optional=True)

        class AddIfGiven(keras.layers.Layer):
            def call(self, a, b=None):
                return a if b is None else a + b
        model = keras.Model({"a": a, "b": b}, keras.layers.Dense(1)(AddIfGiven()(a, b)))
        model.compile("sgd", "mse")
        return model
    xs, ys = helpers.arrays(10)
    keras.utils.set_random_seed(0)
    model = optional_model()
    trainer = make_trainer(model=model, strategy=_strategy(name, two_cpus))
    if name == "one_device":  # the instance trains as it is, reading the data as Keras does
        keras.utils.set_random_seed(0)
        expected = optional_model().fit({"a": xs, "b": None}, ys, batch_size=5, shuffle=False,
                                        epochs=2, verbose=0).history["loss"]
        got = trainer.fit({"a": xs, "b": None}, ys, batch_size=5, shuffle=False, epochs=2)
        np.testing.assert_allclose(got.history["loss"], expected, rtol=1e-6)
        assert trainer.predict({"a": xs, "b": None}, batch_size=5).shape == (10, 1)
    else:  # not yet through distributed iterators: refused with the cause
        for data in [({"a": xs, "b": None}, ys),
                     (({"a": xs[i:i + 5], "b": None}, ys[i:i + 5]) for i in (0, 5))]:
            with pytest.raises(ValueError, match=r"optional input.*the value None, which trains "
                                                 r"on one device.*Feed the input"):
                trainer.fit(*data) if isinstance(data, tuple) else trainer.fit(data)

    def sparse_model():
        model = keras.Sequential([keras.Input((6,), sparse=True), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        return model
    trainer = make_trainer(model=sparse_model, strategy=_strategy(name, two_cpus), seed=0)
    history = trainer.fit((scipy.sparse.random(5, 6, density=0.3, format="coo",
                                               dtype="float32", random_state=i), ys[:5])
                          for i in range(3))
    assert np.isfinite(history.history["loss"]).all()
