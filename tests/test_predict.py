"""`Trainer.predict` and `Trainer.evaluate` take what `model.predict` / `model.evaluate` take and
give what they give: NumPy outputs in input order, under every strategy."""

import numpy as np
import pytest

import keras
import tensorflow as tf

import kerastrain as kt

MIRRORED = {"name": "mirrored", "cpu_devices": 2}
RNG = np.random.RandomState(0)
X = RNG.randn(37, 6).astype("float32")  # 37: a partial last batch of every batch size below
Y = (X[:, :1] > 0).astype("float32")


def two_outputs():
    keras.utils.set_random_seed(2)
    a, b = keras.Input((6,), name="a"), keras.Input((3,), name="b")
    h = keras.layers.Dense(5, activation="relu")(keras.layers.Concatenate()([a, b]))
    model = keras.Model({"a": a, "b": b}, {"score": keras.layers.Dense(1, name="score")(h),
                                           "probs": keras.layers.Dense(
                                               3, activation="softmax", name="probs")(h)})
    model.compile(optimizer="sgd", loss={"score": "mse", "probs": "categorical_crossentropy"})
    return model


def inputs():
    return {"a": X, "b": X[:, :3] * 2}


def _close(ours, theirs):
    assert tf.nest.map_structure(np.shape, ours) == tf.nest.map_structure(np.shape, theirs)
    tf.nest.map_structure(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                          ours, theirs)


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED], ids=["one_device", "mirrored"])
def test_predict_returns_numpy_outputs_in_input_order_as_model_predict(strategy):
    """Dict inputs and outputs; 37 examples in batches of 8 and of 6, and a dataset with a
    last batch of 1 example for 2 replicas: none lost, none duplicated, in order."""
    trainer = kt.Trainer(two_outputs, strategy=strategy, verbose=0)
    with trainer.strategy.scope():
        reference = two_outputs()
    reference.set_weights(trainer.model.get_weights())
    theirs = reference.predict(inputs(), batch_size=8, verbose=0)
    _close(trainer.predict(inputs(), batch_size=8), theirs)
    _close(trainer.predict(inputs(), batch_size=6), theirs)
    _close(trainer.predict(inputs()), theirs)  # default batch_size 32, as in Keras
    # A dataset of (x, y) batches: the targets are ignored, as by model.predict.
    ds = tf.data.Dataset.from_tensor_slices((inputs(), Y)).batch(12)  # 12, 12, 12, 1
    _close(trainer.predict(ds), theirs)
    _close(trainer.predict(lambda: ds.map(lambda x, y: x)), theirs)
    # `steps` batches at most: the first 24 examples.
    _close(trainer.predict(ds, steps=2), tf.nest.map_structure(lambda a: a[:24], theirs))


class Doubled(keras.Model):
    """A model whose `predict_step` post-processes its outputs, as keras.io shows."""

    def predict_step(self, data):
        return {"doubled": 2.0 * self(data, training=False), "argmax": keras.ops.argmax(
            self(data, training=False), axis=-1)}


def doubled():
    keras.utils.set_random_seed(3)
    inputs_ = keras.Input((6,))
    model = Doubled(inputs_, keras.layers.Dense(3)(inputs_))
    model.compile(optimizer="sgd", loss="mse")
    return model


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED], ids=["one_device", "mirrored"])
def test_predict_runs_the_models_own_predict_step_and_calls_callbacks(strategy):
    trainer = kt.Trainer(doubled, strategy=strategy, verbose=0)
    with trainer.strategy.scope():
        reference = doubled()
    reference.set_weights(trainer.model.get_weights())
    ds = tf.data.Dataset.from_tensor_slices(X).batch(10)  # x alone
    seen = {"ours": [], "keras": []}

    def recorder(who):
        return keras.callbacks.LambdaCallback(on_predict_batch_end=lambda batch, logs: seen[
            who].append((batch, {k: np.shape(v) for k, v in logs.items()})))
    ours = trainer.predict(ds, callbacks=[recorder("ours")])
    _close(ours, reference.predict(ds, verbose=0, callbacks=[recorder("keras")]))
    assert ours["argmax"].dtype == reference.predict(ds, verbose=0)["argmax"].dtype
    # Keras flattens the {"outputs": ...} logs of a dict output; the same batches and shapes.
    assert seen["ours"] == seen["keras"]
    assert [b for b, _ in seen["ours"]] == [0, 1, 2, 3]


def test_predict_after_fit_uses_the_trained_weights_and_stop_predicting_stops():
    trainer = kt.Trainer(two_outputs, strategy="one_device", verbose=0)
    before = trainer.predict(inputs())["score"]
    trainer.fit((inputs(), {"score": Y, "probs": np.eye(3, dtype="float32")[(X[:, 0] > 0).astype(int)]}),
                batch_size=8, epochs=2)
    after = trainer.predict(inputs())["score"]
    np.testing.assert_allclose(after, trainer.model.predict(inputs(), verbose=0)["score"],
                               rtol=1e-6)
    assert np.max(np.abs(after - before)) > 0

    class StopAfterTwo(keras.callbacks.Callback):
        def on_predict_batch_end(self, batch, logs=None):
            self.model.stop_predicting = batch == 1
    assert trainer.predict(inputs(), batch_size=8, callbacks=[StopAfterTwo()])["score"].shape \
        == (16, 1)


def test_predict_mistakes_get_clear_errors():
    trainer = kt.Trainer(two_outputs, strategy="one_device", verbose=0)
    ds = tf.data.Dataset.from_tensor_slices(inputs()).batch(8)
    with pytest.raises(ValueError, match=r"`batch_size` applies to NumPy input only.*"
                                         r"Received: batch_size=4 with x of form 'dataset'"):
        trainer.predict(ds, batch_size=4)
    with pytest.raises(ValueError, match=r"infinite \(it repeats\): pass `steps`.*steps=None"):
        trainer.predict(ds.repeat())
    with pytest.raises(ValueError, match=r"`steps` must be an int >= 1.*steps=0"):
        trainer.predict(ds, steps=0)
    with pytest.raises(TypeError, match=r"`callbacks` must be a list of keras.callbacks"):
        trainer.predict(ds, callbacks=[print])


# -- evaluate takes model.evaluate's arguments -------------------------------------------

def binary():
    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="sgd", loss="binary_crossentropy",
                  metrics=["accuracy", keras.metrics.AUC(name="auc")])
    return model


def test_evaluate_takes_model_evaluates_arguments():
    trainer = kt.Trainer(binary, strategy="one_device", verbose=0)
    reference = binary()
    reference.set_weights(trainer.model.get_weights())
    sw = np.linspace(0.5, 2.0, len(X)).astype("float32")
    for kwargs in ({}, {"sample_weight": sw}, {"batch_size": 5}, {"steps": 2, "batch_size": 8}):
        theirs = reference.evaluate(X, Y, verbose=0, return_dict=True, **kwargs)
        ours = trainer.evaluate(X, Y, **kwargs)
        assert sorted(ours) == sorted(theirs)
        np.testing.assert_allclose([ours[k] for k in theirs], list(theirs.values()), rtol=1e-5)
    theirs = reference.evaluate(X, Y, verbose=0)  # return_dict=False: Keras's list
    np.testing.assert_allclose(trainer.evaluate(x=X, y=Y, return_dict=False), theirs, rtol=1e-5)
    seen = []
    trainer.evaluate(X, Y, verbose=1, callbacks=[keras.callbacks.LambdaCallback(
        on_test_begin=lambda logs: seen.append("begin"),
        on_test_end=lambda logs: seen.append(sorted(logs)))])
    assert seen == ["begin", ["accuracy", "auc", "loss"]]
    with pytest.raises(TypeError, match=r"`return_dict` must be True or False"):
        trainer.evaluate(X, Y, return_dict="yes")
    with pytest.raises(ValueError, match=r"`y` applies to NumPy arrays `x`"):
        trainer.evaluate(tf.data.Dataset.from_tensor_slices((X, Y)).batch(8), Y)
