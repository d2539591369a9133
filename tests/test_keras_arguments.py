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


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED, {**MIRRORED, "name": "central_storage"}],
                         ids=["one_device", "mirrored", "central_storage"])
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
    # Per-replica batches from a dataset_fn(ctx): TensorFlow hands them to the replicas in
    # turn and the outputs come back step by step, replica by replica: the input order again,
    # a last step with 1 example on one replica and none on the other included.
    _close(trainer.predict(lambda ctx: tf.data.Dataset.from_tensor_slices(inputs()).batch(
        ctx.get_per_replica_batch_size(12))), theirs)


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
    # Python batches are read by Keras's own adapter, which says what a batch must be.
    for call in (trainer.predict, trainer.evaluate):
        with pytest.raises(ValueError, match=r"the generator must return a tuple.*Received: "
                                             r"(x|dataset_fn) of type generator"):
            call(row for row in X)


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


# -- every argument of model.fit: accepted with its meaning, or a clear error ----------------

def _fit_errors():
    """(fit kwargs, the error's type and what it must say) for what kerastrain refuses."""
    ds = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8)
    two_y = [Y, Y]
    return {
        "x": ({"x": (row for row in X)}, ValueError,
              r"the generator must return a tuple.*Received: (x|dataset_fn) of type generator"),
        "y": ({"x": ds, "y": Y}, ValueError,
              r"`y` applies to NumPy arrays `x`.*Put it in the dataset, or pass arrays\. "
              r"Received: y with x of form 'dataset'"),
        "batch_size": ({"x": ds, "batch_size": 8}, ValueError,
                       r"`batch_size` applies to NumPy input only.*Received: batch_size=8"),
        "epochs": ({"x": X, "y": Y, "epochs": -1}, ValueError,
                   r"`epochs` must be an int >= 0\. Received: epochs=-1"),
        "verbose": ({"x": X, "y": Y, "verbose": 3}, ValueError,
                    r"`verbose` must be 0, 1, 2 or 'auto'\. Received: verbose=3"),
        "callbacks": ({"x": X, "y": Y, "callbacks": [print]}, TypeError,
                      r"`callbacks` must be a list of keras.callbacks.Callback instances.*"
                      r"Received an item of type builtin_function_or_method"),
        "validation_split": ({"x": ds, "validation_split": 0.2}, ValueError,
                             r"`validation_split` applies to NumPy arrays `x`.*Received: "
                             r"validation_split with x of form 'dataset'"),
        "validation_data": ({"x": X, "y": Y, "validation_data": [1, 2, 3]}, TypeError,
                            r"`validation_dataset_fn` got list data that is not a tuple "
                            r"`\(x, y\)`.*Received: validation_dataset_fn of type list"),
        "shuffle": ({"x": X, "y": Y, "shuffle": "batch"}, ValueError,
                    r"`shuffle` must be True or False.*Pass True, or shuffle a dataset in its "
                    r"pipeline\. Received: shuffle='batch'"),
        "class_weight": ({"x": X, "y": two_y, "class_weight": {0: 1.0, 1: 2.0}}, ValueError,
                         r"`class_weight` is only supported for models with a single output.*"
                         r"Received: y of type list"),
        "sample_weight": ({"x": X, "y": Y, "sample_weight": np.ones(len(X)),
                           "class_weight": {0: 1.0}}, ValueError,
                          r"cannot give `class_weight` and `sample_weight` at the same time.*"
                          r"fold the class weights into the sample weights"),
        "initial_epoch": ({"x": X, "y": Y, "initial_epoch": -2}, ValueError,
                          r"`initial_epoch` must be an int >= 0\. Received: initial_epoch=-2"),
        "steps_per_epoch": ({"x": ds.repeat()}, ValueError,
                            r"infinite \(it repeats\), so an epoch has no end: pass "
                            r"`steps_per_epoch`\. Received: steps_per_epoch=None"),
        "validation_steps": ({"x": X, "y": Y, "validation_data": ds.repeat()}, ValueError,
                             r"evaluation data is infinite.*pass `steps` \(`validation_steps` "
                             r"in fit\)\. Received: steps=None"),
        "validation_batch_size": ({"x": X, "y": Y, "validation_data": ds,
                                   "validation_batch_size": 4}, ValueError,
                                  r"`validation_batch_size` applies to NumPy validation data.*"
                                  r"Received: validation_batch_size=4 with validation data of "
                                  r"form 'dataset'"),
        "validation_freq": ({"x": X, "y": Y, "validation_freq": 0}, ValueError,
                            r"`validation_freq` must be an int >= 1.*validation_freq=0"),
    }


def test_every_argument_of_model_fit_is_taken_or_refused_with_what_to_do():
    """Acceptance 5: each argument of the installed `keras.Model.fit` is taken by
    `Trainer.fit` with model.fit's meaning (tests/test_keras_fidelity.py,
    tests/test_gallery.py), and each value kerastrain does not support is refused with what
    was wrong, the value received and what to do. A new argument in Keras fails here."""
    import inspect
    names = [p for p in inspect.signature(keras.Model.fit).parameters if p != "self"]
    errors = _fit_errors()
    assert sorted(names) == sorted(errors), "model.fit's arguments changed: cover them"
    trainer = kt.Trainer(binary, strategy="one_device", verbose=0)
    accepted = inspect.signature(kt.Trainer.fit).parameters
    for name in names:
        assert name in accepted or name in __import__(
            "kerastrain.data.fit_args").data.fit_args.KERAS_FIT_DATA_ARGS or name == "x", name
        kwargs, error, message = errors[name]
        with pytest.raises(error, match=message):
            trainer.fit(**kwargs)


def test_a_bool_is_not_taken_for_a_verbosity_and_jit_compile_takes_only_its_choices():
    # Python counts True as 1: without a strict check, verbose=True passed for a progress bar.
    with pytest.raises(ValueError, match=r"`verbose` must be 0, 1, 2 or 'auto'\. "
                                         r"Received: verbose=True"):
        kt.Trainer(binary, strategy="one_device", verbose=True)
    trainer = kt.Trainer(binary, strategy="one_device", verbose=0)
    with pytest.raises(ValueError, match=r"Received: verbose=False"):
        trainer.fit(X, Y, verbose=False)
    with pytest.raises(ValueError, match=r"`jit_compile` must be None, 'auto', True or False\. "
                                         r"Received: jit_compile=1"):
        kt.Trainer(binary, strategy="one_device", jit_compile=1)


def test_validation_batch_size_and_a_zero_validation_split_mean_what_they_mean_in_fit():
    trainer = kt.Trainer(binary, strategy="one_device", verbose=0)
    reference = binary()
    reference.set_weights(trainer.model.get_weights())
    kwargs = dict(x=X, y=Y, batch_size=8, epochs=2, shuffle=False, validation_split=0.0,
                  validation_data=(X[:10], Y[:10]), validation_batch_size=3)
    ours = trainer.fit(**kwargs).history
    theirs = reference.fit(verbose=0, **kwargs).history
    for key in theirs:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, err_msg=key)
