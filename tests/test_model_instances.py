"""A model instance given to the Trainer: on one device it trains as it is (no copy), under
replicas its copy has exactly its weights, or the Trainer says why it cannot have them."""

import numpy as np
import pytest

import keras

import kerastrain as kt

MIRRORED = {"name": "mirrored", "cpu_devices": 2}
TOKENS = np.random.RandomState(0).randint(0, 10, (32, 4))
NEXT = np.random.RandomState(1).randint(0, 10, (32,))
FIT = dict(batch_size=8, epochs=2, shuffle=False)


class TiedOutput(keras.layers.Layer):
    """Logits from the embedding's own matrix (keras-hub's GPT-2 ties them so); no config."""

    def __init__(self, embedding, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding

    def call(self, x):
        return keras.ops.matmul(x, keras.ops.transpose(self.embedding.embeddings))


def tied_model():
    keras.utils.set_random_seed(3)
    tokens = keras.Input((4,), dtype="int32")
    embedding = keras.layers.Embedding(10, 5)
    pooled = keras.ops.mean(embedding(tokens), axis=1)
    model = keras.Model(tokens, TiedOutput(embedding)(pooled))
    model.compile(optimizer=keras.optimizers.SGD(0.5),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_a_model_sharing_a_weight_trains_as_it_is_on_one_device():
    reference, model = tied_model(), tied_model()
    expected = reference.fit(TOKENS, NEXT, verbose=0, **FIT).history["loss"]
    trainer = kt.Trainer(model, strategy="one_device", verbose=0, checkpoint=False,
                         tensorboard=False)
    np.testing.assert_allclose(trainer.fit(TOKENS, NEXT, **FIT).history["loss"], expected,
                               rtol=1e-6)
    assert trainer.model is model and len(model.weights) == 1
    np.testing.assert_allclose(model.get_weights()[0], reference.get_weights()[0], rtol=1e-6)


def test_a_model_sharing_a_weight_is_refused_clearly_under_replicas():
    with pytest.raises(ValueError, match=r"cannot be rebuilt inside it|tied embedding"):
        kt.Trainer(tied_model(), strategy=MIRRORED, verbose=0, checkpoint=False,
                   tensorboard=False)


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED, "central_storage"],
                         ids=["one_device", "mirrored", "central_storage"])
def test_a_sequential_of_layers_built_beforehand_trains_with_their_weights(strategy):
    def model():
        keras.utils.set_random_seed(4)
        dense = keras.layers.Dense(2)
        dense.build((None, 6))  # built, in a Sequential without an Input
        sequential = keras.Sequential([dense])
        sequential.compile(keras.optimizers.SGD(0.1), "mse")
        return sequential

    x = np.random.RandomState(5).randn(32, 6).astype("float32")
    y = x[:, :2] * 2
    reference, ours = model(), model()
    expected = reference.fit(x, y, verbose=0, **FIT).history["loss"]
    trainer = kt.Trainer(ours, strategy=strategy, verbose=0, checkpoint=False,
                         tensorboard=False)
    np.testing.assert_allclose(trainer.fit(x, y, **FIT).history["loss"], expected, rtol=1e-5)
    np.testing.assert_allclose(trainer.predict(x), reference.predict(x, verbose=0), rtol=1e-5)


def test_a_trainer_inside_the_users_own_strategy_scope_is_refused_saying_the_name(two_cpus):
    import tensorflow as tf
    model = tied_model()
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        with pytest.raises(RuntimeError, match=r"inside a `tf.distribute` strategy's scope "
                                               r"\(OneDeviceStrategy\).*strategy='one_device'"):
            kt.Trainer(model, strategy="one_device", verbose=0, checkpoint=False)
    trainer = kt.Trainer(model, strategy="one_device", verbose=0, checkpoint=False,
                         tensorboard=False)
    with tf.distribute.OneDeviceStrategy("/cpu:1").scope():
        with pytest.raises(RuntimeError, match=r"a Trainer call \(fit, evaluate, predict\) was "
                                               r"called inside"):
            trainer.fit(TOKENS, NEXT, epochs=1)


def test_a_stateful_rnn_keeps_its_last_states_on_one_device_and_is_refused_under_replicas():
    """`LSTM(stateful=True)`: after `model.fit` the layer holds the last batch's states;
    the user's object held zeros after kerastrain's fit (its copy had trained)."""
    x = np.random.RandomState(0).randn(8, 3, 2).astype("float32")
    y = np.ones((8, 1), "float32")

    def model():
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((3, 2), batch_size=4),
                              keras.layers.LSTM(3, stateful=True), keras.layers.Dense(1)])
        m.compile("sgd", "mse")
        return m

    reference, ours = model(), model()
    reference.fit(x, y, batch_size=4, shuffle=False, verbose=0)
    kt.Trainer(ours, strategy="one_device", verbose=0, checkpoint=False,
               tensorboard=False).fit(x, y, batch_size=4, shuffle=False)
    for a, b in zip(ours.layers[0].states, reference.layers[0].states):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
    assert np.any(ours.layers[0].states[0].numpy())
    with pytest.raises(ValueError, match=r"stateful recurrent layers \(lstm.*Train it on one "
                                         r"device"):
        kt.Trainer(model(), strategy=MIRRORED, verbose=0, checkpoint=False)
    # Under parameter servers (the check alone: a cluster costs a process).
    import types
    from kerastrain.loop import modes
    from kerastrain.step import checks
    ps = types.SimpleNamespace(name="ps", is_parameter_server=True,
                               strategy=types.SimpleNamespace(num_replicas_in_sync=1))
    with pytest.raises(ValueError, match=r"under 'ps' its workers train batches in no set order"):
        checks.check_stateful(model(), ps, modes.for_strategy(ps).step_policy)
