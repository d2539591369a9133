"""What `model.compile` says is what kerastrain trains: the metric objects as given, the
compile arguments Keras does not record, a second compile, and a model never compiled.

Each case runs `model.fit` on a twin of the model (same seed, same unshuffled batches) and
kerastrain on the model itself, on one device and under a MirroredStrategy of 2 logical CPUs.
"""

import numpy as np
import pytest

import keras

import kerastrain as kt

X = np.random.RandomState(0).randn(64, 6).astype("float32")
Y = (X[:, :1] * 2 + 1).astype("float32")
MIRRORED = {"name": "mirrored", "cpu_devices": 2}
STRATEGIES = pytest.mark.parametrize("strategy", ["one_device", MIRRORED],
                                     ids=["one_device", "mirrored"])
FIT = dict(batch_size=16, epochs=2, shuffle=False, verbose=0)


class ScaledError(keras.metrics.Mean):
    """A metric whose `__init__` takes no arguments (so `from_config` cannot remake it) and
    whose `scale` is set after it is made, outside any config."""

    def __init__(self):
        super().__init__(name="scaled_error")
        self.scale = 1.0

    def update_state(self, y_true, y_pred, sample_weight=None):
        error = keras.ops.mean(keras.ops.abs(y_true - y_pred), axis=-1) * self.scale
        return super().update_state(error, sample_weight=sample_weight)


def regression(metrics=(), seed=1):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=list(metrics))
    return model


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@STRATEGIES
def test_a_metric_object_is_used_as_given_not_remade_from_its_config(strategy):
    metric = ScaledError()
    metric.scale = 3.0  # from_config would make it with 1.0, and a name it cannot take
    twin_metric = ScaledError()
    twin_metric.scale = 3.0
    expected = regression([twin_metric]).fit(X, Y, **FIT).history
    model = regression([metric])
    trainer = kt.Trainer(model, strategy=strategy, verbose=0, checkpoint=False,
                         tensorboard=False)
    got = trainer.fit(X, Y, **FIT).history
    assert sorted(got) == sorted(expected) == ["loss", "scaled_error"]
    for key in expected:
        close(got[key], expected[key])
    # The user's object goes on working after fit, as after model.fit.
    close(model.evaluate(X, Y, verbose=0, return_dict=True)["scaled_error"],
          trainer.evaluate(X, Y)["scaled_error"])


@STRATEGIES
@pytest.mark.parametrize("auto_scale_loss", [True, False])
def test_a_mixed_float16_model_keeps_its_policy_and_its_loss_scaling_choice(
        auto_scale_loss, strategy):
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    model.compile(optimizer="sgd", loss="mse", auto_scale_loss=auto_scale_loss)
    trainer = kt.Trainer(model, strategy=strategy, verbose=0, checkpoint=False,
                         tensorboard=False)
    trainer.fit(X, Y, **FIT)
    assert trainer.model.dtype_policy.name == "mixed_float16"
    for optimizer in (trainer.model.optimizer, model.optimizer):
        assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer) == auto_scale_loss


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED, "central_storage"],
                         ids=["one_device", "mirrored", "central_storage"])
def test_a_model_never_compiled_predicts_and_fit_says_to_compile(strategy):
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    trainer = kt.Trainer(model, strategy=strategy, verbose=0, checkpoint=False,
                         tensorboard=False)
    close(trainer.predict(X[:37], batch_size=8), model.predict(X[:37], verbose=0))
    for call in (lambda: trainer.fit(X, Y, epochs=1), lambda: trainer.evaluate(X, Y)):
        with pytest.raises(ValueError, match=r"not compiled.*compiled=False"):
            call()


class RunningError(keras.metrics.MeanSquaredError):
    """keras's own test metric: `reset_state` keeps the state, so it runs over epochs."""

    def __init__(self):
        super().__init__(name="running_mse")

    def reset_state(self):
        pass


@STRATEGIES
def test_a_metric_whose_reset_keeps_its_state_runs_over_epochs_and_caps_apply(strategy):
    expected = regression([RunningError()]).fit(X, Y, **FIT).history
    trainer = kt.Trainer(regression([RunningError()]), strategy=strategy, verbose=0,
                         checkpoint=False, tensorboard=False)
    got = trainer.fit(X, Y, **FIT).history
    close(got["running_mse"], expected["running_mse"])
    assert got["running_mse"][1] != pytest.approx(got["loss"][1])  # it ran over 2 epochs
    # keras.config's caps for debugging runs bound fit as they bound model.fit.
    keras.config.set_max_epochs(1)
    keras.config.set_max_steps_per_epoch(2)
    try:
        with pytest.warns(UserWarning, match="Limiting epochs to 1"):
            history = trainer.fit(X, Y, **FIT)
    finally:
        keras.config.set_max_epochs(None)
        keras.config.set_max_steps_per_epoch(None)
    assert history.epoch == [0] and trainer.global_step == 2 * 4 + 2


LossOf = __import__("collections").namedtuple("LossOf", ["a", "b"])


@STRATEGIES
@pytest.mark.parametrize("loss,outputs", [
    ({"a": ["mse"], "b": ["mae"]}, "dict"), ([["mse"], ["mae"]], "list"),
    (LossOf("mse", "mae"), "list")], ids=["dict_of_lists", "list_of_lists", "namedtuple"])
def test_losses_in_the_structures_compile_takes_train_as_under_fit(loss, outputs, strategy):
    """Keras takes a loss per output as a dict of lists, a list of lists or a namedtuple;
    `Trainer(model)` raised ("'generator' object does not support item assignment",
    "__new__() missing ... argument") reading them."""
    def model():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((6,))
        a, b = keras.layers.Dense(1, name="a")(inputs), keras.layers.Dense(1, name="b")(inputs)
        m = keras.Model(inputs, {"a": a, "b": b} if outputs == "dict" else [a, b])
        m.compile(keras.optimizers.SGD(0.05), loss=loss)
        return m

    y = {"a": X[:, :1], "b": X[:, 1:2]} if outputs == "dict" else [X[:, :1], X[:, 1:2]]
    expected = model().fit(X, y, **FIT).history["loss"]
    trainer = kt.Trainer(model(), strategy=strategy, verbose=0, checkpoint=False,
                         tensorboard=False)
    close(trainer.fit(X, y, **FIT).history["loss"], expected)


class SplitOutputs(keras.Model):
    """A `compute_loss` override that splits one output into a list, one loss each."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return super().compute_loss(x, y, [y_pred[:, :1], y_pred[:, 1:]], sample_weight,
                                    training)


@STRATEGIES
def test_a_compute_loss_that_splits_an_output_into_a_list_trains_as_under_fit(strategy):
    def model():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((6,))
        m = SplitOutputs(inputs, keras.layers.Dense(2)(inputs))
        m.compile(keras.optimizers.SGD(0.05), loss=["mse", "mae"])
        return m

    y = [X[:, :1], X[:, 1:2]]
    expected = model().fit(X, y, **FIT).history
    got = kt.Trainer(model(), strategy=strategy, verbose=0, checkpoint=False,
                     tensorboard=False).fit(X, y, **FIT).history
    assert sorted(got) == sorted(expected) == ["loss", "mae_loss", "mse_loss"]
    for key in expected:
        close(got[key], expected[key])
