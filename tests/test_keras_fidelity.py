"""A Keras model trains under kerastrain as under `model.fit`: model losses, overrides, errors.

Each case runs `model.fit` and kerastrain on the same seeded model and the same unshuffled
batches, on one device and under a MirroredStrategy of 2 logical CPUs (Keras `fit` gets the
Trainer's own strategy object: two MirroredStrategy objects in one process collide in
TensorFlow's collective keys).
"""

import logging
import warnings

import numpy as np
import pytest

import keras
import tensorflow as tf
from keras import ops

import kerastrain as kt

X = np.random.RandomState(0).randn(64, 6).astype("float32")
Y = (X[:, :1] * 2 + 1).astype("float32")
MIRRORED = {"name": "mirrored", "cpu_devices": 2}


class ActivityPenalty(keras.layers.Layer):
    """keras.io's custom-layer example: a loss added during `call`."""

    def call(self, inputs):
        self.add_loss(0.1 * ops.mean(ops.square(inputs)))
        return inputs


class LogisticEndpoint(keras.layers.Layer):
    """keras.io's "endpoint layer": it computes the loss itself from targets it receives."""

    def __init__(self, name=None):
        super().__init__(name=name)
        self.loss_fn = keras.losses.MeanSquaredError()

    def call(self, targets, predictions):
        self.add_loss(self.loss_fn(targets, predictions))
        return predictions


class NoTrainingArgument(keras.Model):
    """`compute_loss` overridden with the keras.io signature (no `training=`)."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
        return ops.mean(ops.abs(y - y_pred)) + ops.sum(self.losses)


def build(kind):
    keras.utils.set_random_seed(1)
    if kind == "activity_regularizer":
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(
            4, activity_regularizer=keras.regularizers.L2(10.0)), keras.layers.Dense(1)])
    elif kind == "add_loss":
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4), ActivityPenalty(),
                                  keras.layers.Dense(1)])
    elif kind == "endpoint":
        x, y = keras.Input((6,), name="x"), keras.Input((1,), name="y")
        model = keras.Model({"x": x, "y": y}, LogisticEndpoint()(y, keras.layers.Dense(1)(x)))
        model.compile(optimizer=keras.optimizers.SGD(0.01))  # no loss: the layer adds it
        return model
    elif kind == "compute_loss_override":
        inputs = keras.Input((6,))
        model = NoTrainingArgument(inputs, keras.layers.Dense(1, kernel_regularizer="l2")(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def dataset(kind):
    if kind == "endpoint":
        return tf.data.Dataset.from_tensor_slices(({"x": X, "y": Y}, Y)).batch(16)
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)


KINDS = ["activity_regularizer", "add_loss", "endpoint", "compute_loss_override"]


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED], ids=["one_device", "mirrored"])
@pytest.mark.parametrize("kind", KINDS)
def test_model_losses_and_overrides_train_as_under_fit(kind, strategy):
    trainer = kt.Trainer(lambda: build(kind), dataset(kind), strategy=strategy, verbose=0)
    ours = trainer.fit(epochs=2).history["loss"]
    with trainer.strategy.scope():
        reference = build(kind)
    theirs = reference.fit(dataset(kind), epochs=2, verbose=0, shuffle=False).history["loss"]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    for a, b in zip(trainer.model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_activity_regularizer_changes_the_objective():
    """The issue's measurement: with L2(10.0) on the activations the loss is several times
    the plain MSE (fit 23.33 vs 5.86 when it was dropped)."""
    plain = kt.Trainer(lambda: build("add_loss"), dataset("add_loss"), strategy="one_device",
                       verbose=0).evaluate()["loss"]
    regularized = kt.Trainer(lambda: build("activity_regularizer"),
                             dataset("activity_regularizer"), strategy="one_device",
                             verbose=0).evaluate()["loss"]
    assert regularized > 3 * plain


def test_two_mirrored_trainers_of_different_models_in_one_process():
    """Each MirroredStrategy numbers its collectives from the same start: a second one over
    the same devices crashed a differently shaped model ("Shape mismatch in the collective
    instance")."""
    for units in (3, 5):
        def build_model(units=units):
            model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(units),
                                      keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
            return model
        trainer = kt.Trainer(build_model, dataset("plain"), strategy=MIRRORED, verbose=0)
        assert np.isfinite(trainer.fit(epochs=1).history["loss"][0])


# -- a model instance, under every strategy --------------------------------------------

def _instance():
    import helpers
    keras.utils.set_random_seed(0)
    return helpers.build_model()


# Each strategy without prior use, and with the model used before (Keras caches a predict
# function on the object; fit also builds its optimizer and metrics).
USES = [("default", "unused"), ("default", "fitted"), ("one_device", "unused"),
        ("one_device", "predicted"), (MIRRORED, "unused"), (MIRRORED, "predicted"),
        (MIRRORED, "fitted"), ("central_storage", "fitted")]


@pytest.mark.parametrize("strategy,prior", USES, ids=[
    f"{s if isinstance(s, str) else 'mirrored'}-{p}" for s, p in USES])
def test_the_users_model_instance_holds_the_trained_weights(strategy, prior, tmp_path):
    import helpers
    model = _instance()
    x, y = helpers.arrays(64)
    if prior == "predicted":  # Keras caches its predict function on the object
        model.predict(x[:8], verbose=0)
    elif prior == "fitted":  # ...and its optimizer state and metrics
        model.fit(x[:16], y[:16], batch_size=8, verbose=0)
    initial = model.get_weights()
    trainer = kt.Trainer(model, strategy=strategy, verbose=0)
    trainer.fit((x, y), batch_size=16, epochs=2)
    for mine, trained, before in zip(model.get_weights(), trainer.model.get_weights(), initial):
        np.testing.assert_array_equal(mine, trained)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), initial)) > 0
    # ...and code written for model.fit keeps working on it.
    helpers.check_use_after_fit(helpers.use_after_fit(model, trainer, tmp_path))


def test_an_optimizer_state_that_does_not_fit_the_copy_is_said_and_left(caplog):
    """A user's trained optimizer whose slots do not match those of the optimizer built for
    kerastrain's copy of the model: a warning says the state starts fresh (that warning
    itself raised a NameError), nothing is assigned."""
    import helpers
    from kerastrain.step import instances
    user = _instance()
    x, y = helpers.arrays(16)
    user.fit(x, y, batch_size=8, verbose=0)
    detached = instances.Detached(user)
    copy = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(3),
                             keras.layers.Dense(1)])
    copy.compile(optimizer=type(user.optimizer)(), loss="mse")
    copy.optimizer.build(copy.trainable_variables)
    before = [v.numpy() for v in copy.optimizer.variables]
    logging.getLogger("kerastrain").addHandler(caplog.handler)
    try:
        instances.carry_optimizer(copy, detached)
    finally:
        logging.getLogger("kerastrain").removeHandler(caplog.handler)
    assert "its state does not fit the optimizer built for training here" in caplog.text
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, copy.optimizer.variables))


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED], ids=["one_device", "mirrored"])
def test_what_code_does_to_the_users_object_between_calls_is_where_the_next_call_starts(
        strategy):
    """`trainer.fit; model.fit; trainer.fit` continues from `model.fit`'s result, as three
    `model.fit` calls do; `model.set_weights` between calls is what `trainer.evaluate` and
    `trainer.predict` see. (The next call used the Trainer's copy: the epoch of `model.fit`
    was silently undone, an evaluation after `load_weights` scored the old weights.)"""
    x, y = _binary(48)
    kwargs = dict(batch_size=16, shuffle=False, verbose=0, epochs=1)
    reference, model = _instance(), _instance()
    initial = model.get_weights()
    trainer = kt.Trainer(model, strategy=strategy, verbose=0)
    for fit in (trainer.fit, model.fit, trainer.fit):
        expected = reference.fit(x, y, **kwargs).history["loss"]
        np.testing.assert_allclose(fit(x, y, **kwargs).history["loss"], expected, rtol=1e-5)
    assert int(model.optimizer.iterations.numpy()) == 9 == int(
        reference.optimizer.iterations.numpy())
    model.set_weights(initial)
    assert trainer.evaluate(x, y, batch_size=16)["loss"] == pytest.approx(
        model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)["loss"], rel=1e-5)
    np.testing.assert_allclose(trainer.predict(x, batch_size=16),
                               model.predict(x, batch_size=16, verbose=0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("first", ["fit", "evaluate"])
def test_what_code_does_to_the_users_object_before_the_first_call_is_seen(first, tmp_path):
    """`trainer = Trainer(model)`, then `model.load_weights(...)` (or `model.fit`), then the
    first `trainer.fit` / `evaluate` starts from the loaded weights and optimizer state, as
    `model.fit` would. (The Trainer's copy was read when the Trainer was made: the loaded
    weights were silently ignored.)"""
    x, y = _binary(48)
    kwargs = dict(batch_size=16, shuffle=False, verbose=0, epochs=1)
    trained = _instance()
    trained.fit(x, y, **kwargs)
    trained.save_weights(tmp_path / "trained.weights.h5")
    reference, model = _instance(), _instance()
    trainer = kt.Trainer(model, strategy="one_device", verbose=0)
    for m in (reference, model):
        m.fit(x, y, **kwargs)                            # the optimizer's state, 3 steps
        m.load_weights(tmp_path / "trained.weights.h5")  # and other weights
    if first == "fit":
        expected = reference.fit(x, y, **kwargs).history["loss"]
        np.testing.assert_allclose(trainer.fit(x, y, **kwargs).history["loss"], expected,
                                   rtol=1e-5)
        assert int(model.optimizer.iterations.numpy()) == 6
    else:
        assert trainer.evaluate(x, y, batch_size=16)["loss"] == pytest.approx(
            reference.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)["loss"],
            rel=1e-5)


def test_the_users_model_instance_is_updated_when_training_stops_early():
    """Diverged (a NaN label): the user's object holds the weights of the steps taken."""
    import helpers
    x, y = helpers.arrays(64)
    y[40] = np.nan
    model = _instance()
    trainer = kt.Trainer(model, strategy=MIRRORED, verbose=0)
    trainer.fit((x, y), batch_size=16, epochs=2)
    assert trainer.model is not model
    for mine, trained in zip(model.get_weights(), trainer.model.get_weights()):
        np.testing.assert_array_equal(mine, trained)


PRIORS = ("unused", "both")


@pytest.fixture(scope="module")
def ps_instances(tmp_path_factory):
    """Both cases below, one after another in one process (TensorFlow and the local cluster
    start once; each case is its own model and Trainer): {prior: (result, output)}."""
    import json

    import helpers
    tmp = tmp_path_factory.mktemp("ps_instances")
    jobs = [[{"strategy": {"name": "ps", "num_workers": 2, "num_ps": 1}, "epochs": 2,
              "steps_per_epoch": 6, "data": "infinite", "instance": True, "prior": prior,
              "use_after_fit": str(tmp / f"{prior}-saved")}, str(tmp / prior)]
            for prior in PRIORS]
    for prior in PRIORS:
        (tmp / f"{prior}-saved").mkdir()
    proc = helpers.run_python(["tests/_worker.py", json.dumps(jobs)])
    output = proc.stdout[-3000:] + proc.stderr[-5000:]
    return {prior: (json.loads((tmp / f"{prior}.json").read_text())
                    if (tmp / f"{prior}.json").exists() else None, output)
            for prior in PRIORS}, proc.returncode


@pytest.mark.multiprocess
@pytest.mark.parametrize("prior", PRIORS)
def test_the_users_model_instance_under_parameter_servers(ps_instances, prior):
    """The headline call: `Trainer(model, strategy="ps").fit`, then the user's own object
    predicts, evaluates, trains, saves and loads as after `model.fit`, also when it was
    used before (predict, then fit: Keras's cached functions and optimizer state)."""
    import helpers
    results, code = ps_instances
    result, output = results[prior]
    assert code == 0 and result is not None, output
    assert result["global_step"] == 12
    assert result["user_vs_trained"] == 0.0 and result["user_vs_initial"] > 0
    # A callback closing over the user's object saw it trained at each epoch end.
    assert result["user_vs_trained_at_epoch_ends"] == [0.0, 0.0]
    helpers.check_use_after_fit(result["used_after_fit"])


@pytest.mark.multiprocess
def test_a_model_instance_under_multi_worker_mirrored_gets_a_clear_error(tmp_path,
                                                                        tf_config_cluster):
    """TensorFlow configures collectives before the first operation, and building a model
    runs operations: a model built before the Trainer cannot be used; the error says so."""
    job = {"strategy": "multi_worker_mirrored", "epochs": 2, "instance": True}
    codes, outputs = tf_config_cluster(worker=2).run_workers("tests/_worker.py", job,
                                                             str(tmp_path / "w"))
    assert codes != [0, 0]
    assert "with a function that builds and compiles the model (`Trainer(build_model, ...)`)" \
        in outputs[0], outputs[0][-3000:]


# -- the model's own train_step / test_step ------------------------------------------------

class OwnStep(keras.Model):
    """keras.io's "customizing what happens in fit": its own step, trackers and metrics."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = ops.mean(ops.square(y - y_pred)) + 0.5 * ops.mean(ops.abs(y_pred))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        self.loss_tracker.update_state(ops.mean(ops.square(y - y_pred)) * 100.0)
        self.mae_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_metric]


class ComputeLossStep(keras.Model):
    """keras.io's lower-level variant: compute_loss and the compiled metrics in its step."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def build_own_step(cls):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((6,))
    model = cls(inputs, keras.layers.Dense(1)(keras.layers.Dense(4, activation="relu")(inputs)))
    if cls is OwnStep:
        model.compile(optimizer=keras.optimizers.SGD(0.05))  # the step has its own loss
    else:
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    return model


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED], ids=["one_device", "mirrored"])
@pytest.mark.parametrize("cls", [OwnStep, ComputeLossStep], ids=lambda c: c.__name__)
def test_the_models_own_train_and_test_step_run_as_under_fit(cls, strategy):
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)
    # 2 steps a loop over 4 batches: the third loop finds the data ended and runs no step
    # (its empty logs used to replace the epoch's).
    trainer = kt.Trainer(lambda: build_own_step(cls), data, strategy=strategy, verbose=0,
                         steps_per_loop=2)
    ours = trainer.fit(epochs=3, validation_dataset_fn=data).history
    with trainer.strategy.scope():
        reference = build_own_step(cls)
    theirs = reference.fit(data, epochs=3, validation_data=data, verbose=0).history
    assert set(ours) == set(theirs)
    for key in theirs:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, err_msg=key)
    for a, b in zip(trainer.model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trainer.evaluate(data)["loss"],
                               reference.evaluate(data, verbose=0, return_dict=True)["loss"],
                               rtol=1e-5)


def test_an_unbuilt_second_optimizer_under_parameter_servers_is_refused_with_what_to_do():
    """A GAN's own optimizers must exist before workers run its step (they cannot create
    variables); the model's own train_step itself runs under ps (test_own_step_ps.py)."""
    from kerastrain.loop import modes
    model = build_own_step(OwnStep)
    model.g_optimizer = keras.optimizers.Adam()
    built = type("Built", (), {"is_parameter_server": True, "strategy": None})()
    with pytest.raises(ValueError, match=r"optimizer `g_optimizer` \(Adam\) is not built.*"
                                         r"self.g_optimizer.build\(.*Received: strategy='ps'"):
        modes.ParameterServers(built).step(model, None)


# -- model.fit's arguments -----------------------------------------------------------------

def _binary(n=64):
    import helpers
    return helpers.arrays(n)


def _fit_both(build_model, fit_kwargs, trainer_kwargs=None):
    """History and weights from model.fit and from kerastrain, same seed and arguments."""
    import helpers  # noqa: F401 (path)
    keras.utils.set_random_seed(0)
    reference = build_model()
    theirs = reference.fit(verbose=0, **fit_kwargs).history
    keras.utils.set_random_seed(0)
    trainer = kt.Trainer(build_model(), strategy="one_device", verbose=0,
                         **(trainer_kwargs or {}))
    ours = trainer.fit(**fit_kwargs).history
    return ours, theirs, trainer.model, reference


def _assert_same(ours, theirs, ours_model, their_model):
    assert set(ours) == set(theirs), (sorted(ours), sorted(theirs))
    for key in theirs:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, err_msg=key)
    for a, b in zip(ours_model.get_weights(), their_model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arguments", [
    {},
    {"sample_weight": np.linspace(0.1, 2.0, 64).astype("float32")},
    {"class_weight": {0: 1.0, 1: 3.0}},
    {"validation_split": 0.25},
    {"validation_data": "held_out", "validation_freq": 2},
    # class_weight weighs the training data only, not the split-off validation data.
    {"class_weight": {0: 1.0, 1: 3.0}, "validation_split": 0.25},
    # validation_data wins: nothing is held out, every example trains.
    {"validation_split": 0.25, "validation_data": "held_out"},
], ids=["x_y", "sample_weight", "class_weight", "validation_split", "validation_data_freq",
        "class_weight_and_split", "split_and_validation_data"])
def test_fit_arguments_mean_what_they_mean_in_model_fit(arguments):
    import helpers
    x, y = _binary()
    arguments = dict(arguments)
    if arguments.get("validation_data") == "held_out":
        arguments["validation_data"] = _binary(32)
    fit_kwargs = dict(x=x, y=y, batch_size=16, epochs=4, shuffle=False, **arguments)
    ours, theirs, a, b = _fit_both(helpers.build_model, fit_kwargs)
    _assert_same(ours, theirs, a, b)
    if "validation_freq" in arguments:
        assert len(ours["val_loss"]) == 2  # epochs 2 and 4


def test_numpy_shuffling_is_seeded_and_shuffle_false_keeps_the_order():
    import helpers
    x, y = _binary()
    runs = []
    for shuffle in (True, True, False):
        keras.utils.set_random_seed(0)
        trainer = kt.Trainer(helpers.build_model(), strategy="one_device", seed=3, verbose=0)
        runs.append(trainer.fit(x, y, batch_size=16, epochs=2, shuffle=shuffle).history["loss"])
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_each_fit_call_on_numpy_arrays_draws_new_orders_and_a_rerun_draws_them_again():
    """`model.fit(x, y)` reshuffles at every call; so does `trainer.fit(x, y)`, with orders
    that a rerun of the same calls (a resumed script) meets again. With a learning rate of
    0 the per-batch losses spell out the order of the batches."""
    x, y = _binary()

    def build():
        model = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
        return model

    def batch_losses(trainer):
        seen = []
        trainer.fit(x, y, batch_size=8, epochs=1, callbacks=[keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: seen.append(round(float(logs["loss"]), 6)))])
        return seen

    runs = []
    for _ in range(2):   # the same script twice
        trainer = kt.Trainer(build, strategy="one_device", seed=3, verbose=0)
        runs.append([batch_losses(trainer) for _ in range(3)])
    first, second, third = runs[0]
    assert len(first) == len(x) // 8
    assert first != second and second != third and first != third
    assert runs[0] == runs[1]


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_a_metric_a_layer_updates_in_call_is_logged_as_fit_logs_it(strategy, two_cpus):
    """keras.io's endpoint layer updates its own accuracy in `call`: `fit` logs it, for
    training and validation data, and so does kerastrain (mirrored: against `fit` under the
    Trainer's own strategy)."""
    import gallery
    data = gallery.BY_NAME["endpoint_layer"].fit_args(None)["x"]
    kwargs = dict(x=data, validation_data=data.take(2), epochs=2)
    trainer = kt.Trainer(gallery.endpoint_layer, strategy=strategy, verbose=0, seed=0,
                         strategy_options=two_cpus if strategy == "mirrored" else {})
    ours = trainer.fit(**kwargs).history
    with trainer.strategy.scope():
        reference = gallery.endpoint_layer()
    theirs = reference.fit(verbose=0, **kwargs).history
    assert set(ours) == set(theirs) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    for key in theirs:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, err_msg=key)
    assert 0 < theirs["accuracy"][-1] < 1   # a real rate, not a count


class _MeanSeen(keras.layers.Layer):
    """Updates a metric of its own in `call` and adds a loss, as keras.io's layers do."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seen = keras.metrics.Mean(name="seen")

    def call(self, x):
        self.seen.update_state(x)
        self.add_loss(0.01 * ops.mean(x ** 2))
        return x


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_weight_regularizers_beside_a_metric_a_layer_updates_train_as_under_fit(strategy,
                                                                                 two_cpus):
    """A `kernel_regularizer` in a model whose layer updates a metric in `call` failed to
    trace ("'NoneType' object has no attribute 'dtype'": the regularizer read its weight
    inside the scope that turns the metric's updates into deltas)."""
    x, y = _binary()

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((x.shape[1],)), keras.layers.Dense(3, kernel_regularizer="l2"),
            _MeanSeen(), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    trainer = kt.Trainer(build, strategy=strategy, verbose=0,
                         strategy_options=two_cpus if strategy == "mirrored" else {})
    ours = trainer.fit(x, y, batch_size=16, epochs=2, shuffle=False).history
    with trainer.strategy.scope():
        theirs = build().fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    assert set(ours) == set(theirs) == {"loss", "seen"}
    for key in theirs:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, err_msg=key)


def test_a_short_batch_before_the_end_is_one_step_under_mirrored_as_on_one_device(two_cpus):
    """Batches 2, 2, 1, 2, 2, 1 (two batched parts joined): one device takes 6 steps, and
    so must 2 replicas, each global batch split on its own. TensorFlow's `OFF` auto-shard
    policy (which kerastrain set for one pipeline) regrouped the examples across batches:
    5 steps of other batches, and `predict(steps=4)` of a repeated dataset gave 8 rows."""
    x = np.arange(10, dtype="float32").reshape(-1, 1)

    def data():
        return tf.data.Dataset.from_tensor_slices((x[:5], 2 * x[:5])).batch(2).concatenate(
            tf.data.Dataset.from_tensor_slices((x[5:], 2 * x[5:])).batch(2))

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.001), loss="mse")
        return model

    runs = {}
    for strategy in ("one_device", "mirrored"):
        trainer = kt.Trainer(build, strategy=strategy, verbose=0,
                             strategy_options=two_cpus if strategy == "mirrored" else {})
        history = trainer.fit(data, epochs=2).history
        ids = data().map(lambda a, b: a).repeat()
        runs[strategy] = (trainer.global_step, history["loss"],
                          trainer.predict(ids, steps=4).ravel().tolist())
    assert runs["mirrored"][0] == runs["one_device"][0] == 12
    np.testing.assert_allclose(runs["mirrored"][1], runs["one_device"][1], rtol=1e-5)
    assert runs["mirrored"][2] == pytest.approx(runs["one_device"][2], rel=1e-4, abs=1e-5)
    assert len(runs["mirrored"][2]) == 7  # batches of 2, 2, 1, 2: 7 rows


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED], ids=["one_device", "mirrored"])
def test_one_feature_arrays_of_shape_n_train_a_model_of_input_1_as_under_fit(strategy):
    """keras.io's structured-data models take `Input((1,))` and arrays of shape (n,): Keras's
    functional models add the last dimension. kerastrain refused them ("Did you forget
    `.batch(...)`?"), for NumPy arrays and batched datasets alike."""
    x = np.linspace(-1, 1, 24).astype("float32")
    y = 3 * x + 1

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    theirs = build().fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    trainer = kt.Trainer(build, strategy=strategy, verbose=0)
    ours = trainer.fit(x, y, batch_size=8, epochs=2, shuffle=False).history
    np.testing.assert_allclose(ours["loss"], theirs["loss"], rtol=1e-5)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    assert trainer.evaluate(dataset)["loss"] == pytest.approx(
        trainer.model.evaluate(dataset, verbose=0), rel=1e-5)


class _SeenAndMean(keras.metrics.Metric):
    """A metric whose `result()` is a dict of two values, as Keras allows."""

    def __init__(self, name="seen", **kwargs):
        super().__init__(name=name, **kwargs)
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.count.assign(self.count + ops.cast(ops.shape(y_true)[0], "float32"))
        self.total.assign(self.total + ops.sum(y_pred))

    def result(self):
        return {"examples": self.count * 1.0, "mean_prediction": self.total / self.count}


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED], ids=["one_device", "mirrored"])
def test_a_metric_whose_result_is_a_dict_is_logged_as_fit_logs_it(strategy):
    """Keras logs each entry of a dict-valued `result()`; kerastrain failed ("Failed to
    convert elements of {'examples': ...} to Tensor")."""
    x, y = _binary(40)

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", metrics=[_SeenAndMean()])
        return model

    theirs = build().fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    ours = kt.Trainer(build, strategy=strategy, verbose=0).fit(
        x, y, batch_size=16, epochs=2, shuffle=False).history
    assert set(ours) == set(theirs) == {"loss", "examples", "mean_prediction"}
    for key in theirs:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, err_msg=key)


def test_fit_arguments_that_do_not_apply_get_clear_errors():
    import helpers
    x, y = _binary()
    trainer = kt.Trainer(helpers.build_model, strategy="one_device", verbose=0)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    with pytest.raises(ValueError, match=r"`y` applies to NumPy arrays `x`.*dataset_fn of "
                                         r"form 'dataset'"):
        trainer.fit(dataset, y)
    with pytest.raises(ValueError, match=r"`validation_split` applies to NumPy arrays"):
        trainer.fit(dataset, validation_split=0.2)
    with pytest.raises(ValueError, match=r"cannot give `class_weight` and `sample_weight`"):
        trainer.fit(x, y, sample_weight=np.ones(64), class_weight={0: 1.0})
    with pytest.raises(ValueError, match=r"`class_weight` must be a non-empty dict"):
        trainer.fit(x, y, class_weight=[1.0, 2.0])
    with pytest.raises(ValueError, match=r"`validation_split` must be a float between 0 and 1"):
        trainer.fit(x, y, validation_split=1.5)
    with pytest.raises(ValueError, match=r"`x` and `dataset_fn` name the same thing"):
        trainer.fit((x, y), x=x)
    with pytest.raises(ValueError, match=r"`validation_freq` must be an int >= 1"):
        trainer.fit(x, y, validation_freq=0)
    with pytest.raises(TypeError, match=r"unexpected argument\(s\) \['use_multiprocessing'\]"):
        trainer.fit(x, y, use_multiprocessing=True)


class _CrashAt(keras.callbacks.Callback):
    """Stands for a process that dies at the start of an epoch (an exception out of fit)."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError(f"crash at epoch {epoch}")


def _backup_script(backup_dir, crash_at=None, **backup):
    """A Keras script with BackupAndRestore, run by kerastrain: (history, weights, trainer)."""
    import helpers
    x, y = _binary(96)
    trainer = kt.Trainer(helpers.build_model, strategy="one_device", seed=3, verbose=0)
    callbacks = [keras.callbacks.BackupAndRestore(str(backup_dir), **backup)]
    if crash_at is not None:
        callbacks.append(_CrashAt(crash_at))
    try:
        history = trainer.fit(x, y, epochs=4, batch_size=16, callbacks=callbacks)
        return history.history, trainer.model.get_weights(), trainer
    finally:
        trainer.close()  # the process would end here


def test_backup_and_restore_resumes_a_crashed_script_as_if_it_never_stopped(tmp_path, caplog):
    """The callback's backup_dir holds kerastrain's checkpoints: a script that crashed at
    epoch 2, run again unchanged, ends with the history and weights of a run that never
    stopped; then, as in Keras (delete_checkpoint=True), the backup is gone."""
    whole, whole_weights, _ = _backup_script(tmp_path / "whole")
    assert not (tmp_path / "whole").exists()  # removed once training ended
    backup = tmp_path / "backup"
    with pytest.raises(RuntimeError, match="crash at epoch 2"):
        _backup_script(backup, crash_at=2)
    assert sorted(p.name for p in backup.iterdir()) == ["checkpoints", "config.yaml"], \
        "only checkpoints (no export, no TensorBoard logs) go to a backup_dir"
    with caplog.at_level(logging.INFO, logger="kerastrain"):
        rerun, weights, trainer = _backup_script(backup)
    assert "BackupAndRestore: the run's checkpoints go to backup_dir" in caplog.text
    assert "after epoch 2 of 4" in caplog.text, caplog.text
    assert list(rerun["loss"]) == pytest.approx(whole["loss"][2:], rel=1e-6, abs=1e-7)
    for a, b in zip(weights, whole_weights):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert not backup.exists()
    assert trainer.model_dir is None


def test_backup_and_restore_options_map_onto_checkpoints(tmp_path):
    """save_freq=N saves every N steps, delete_checkpoint=False keeps the state (a rerun
    has nothing left to train, as under Keras), double_checkpoint keeps two; a backup_dir
    other than the Trainer's model_dir is refused, the same one is model_dir itself."""
    import helpers
    history, _, _ = _backup_script(tmp_path / "b", save_freq=5, delete_checkpoint=False,
                                   double_checkpoint=True)
    assert len(history["loss"]) == 4
    kept = sorted(p.name for p in (tmp_path / "b" / "checkpoints").glob("ckpt-*.index"))
    assert kept == ["ckpt-20.index", "ckpt-24.index"], kept  # 6 steps an epoch: 5, 6, 10, ..
    again, _, _ = _backup_script(tmp_path / "b", delete_checkpoint=False)
    assert again == {}
    x, y = _binary()
    trainer = kt.Trainer(helpers.build_model, strategy="one_device", verbose=0,
                         model_dir=str(tmp_path / "run"))
    with pytest.raises(ValueError, match=r"`BackupAndRestore\(backup_dir=...\)` and the Trainer"
                       r"'s `model_dir` are two places.*Received: backup_dir='.*elsewhere', "
                       r"model_dir='.*run'"):
        trainer.fit(x, y, callbacks=[
            keras.callbacks.BackupAndRestore(str(tmp_path / "elsewhere"))])
    trainer.fit(x, y, callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path / "run"))])
    assert (tmp_path / "run" / "export").exists() and (tmp_path / "run" / "checkpoints").exists()
    with pytest.raises(ValueError, match=r"save_freq.*Received: save_freq=0"):
        trainer.fit(x, y, callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path / "run"),
                                                                      save_freq=0)])
    trainer.close()


def test_a_lookup_layer_never_adapted_is_a_clear_error_at_the_trainer():
    """It failed inside TensorFlow ("keys and values cannot be empty tensors"), where
    `model.fit` fails at its first step ("Table not initialized")."""
    def build(layer):
        inputs = keras.Input((1,), dtype="string")
        ids = layer(inputs)
        if isinstance(layer, keras.layers.StringLookup):
            ids = keras.layers.CategoryEncoding(8, output_mode="one_hot")(ids)
        model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Flatten()(
            keras.ops.cast(ids, "float32"))))
        model.compile(optimizer="adam", loss="mse")
        return model
    for layer in (keras.layers.StringLookup(name="ids"),
                  keras.layers.TextVectorization(output_sequence_length=3, name="words")):
        with pytest.raises(ValueError, match=r"has lookup layers with no vocabulary: "
                                             r"StringLookup '\w+' \(a TextVectorization.*Call `layer.adapt\(data\)`"
                                             r".*Received: a model with 1 empty lookup layer"):
            kt.Trainer(build(layer), strategy="one_device")
    adapted = keras.layers.StringLookup()
    adapted.adapt(["a", "b"])
    kt.Trainer(build(adapted), strategy="one_device").close()


@pytest.mark.multiprocess
def test_lookup_tables_under_parameter_servers(tmp_path):
    """An adapted StringLookup instance trains and evaluates under ps, and the user's object
    predicts, evaluates, fits and adapts after (its table was on a device gone: "unknown
    device"); one made in the model function trains too; one made before the Trainer is a
    clear error (it used to hang for ever)."""
    import json

    import helpers
    proc = helpers.run_python(["tests/_lookup_worker.py", str(tmp_path / "r.json")],
                              timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert len(report["instance_loss"]) == 2 and np.isfinite(report["instance_eval"])
    # The user's instance works after the fit and holds what the trained copy holds.
    assert report["predict_gap"] < 1e-6 and report["call_gap"] < 1e-6, report
    assert abs(report["user_eval"] - report["instance_eval"]) < 1e-5, report
    assert len(report["user_fit"]) == 1 and np.isfinite(report["user_fit"][0])
    assert report["vocabulary"][1] == report["vocabulary"][0], report["vocabulary"]
    assert np.isfinite(report["builder_eval"])
    assert "holds a lookup table created before kerastrain connected" in report["stale"] \
        or "was created before kerastrain connected" in report["stale"], report["stale"]


@pytest.mark.parametrize("synchronized", [False, True])
def test_batchnorm_per_replica_is_said_at_the_start_and_synchronized_matches_one_device(
        synchronized, caplog):
    """Under 2 replicas BatchNormalization normalises each replica's half batch (as Keras
    fit does under MirroredStrategy): one line says so; `synchronized=True` uses the whole
    batch, like one device."""
    rng = np.random.RandomState(1)
    x, y = rng.randn(64, 4).astype("float32") * 3, rng.randn(64, 1).astype("float32")

    def build_model():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                                  keras.layers.BatchNormalization(synchronized=synchronized,
                                                                  name="bn"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        return model

    losses = {}
    for strategy in ("one_device", MIRRORED):
        with caplog.at_level(logging.INFO, logger="kerastrain"):
            caplog.clear()
            trainer = kt.Trainer(build_model, strategy=strategy, verbose=0, seed=0)
            losses[str(strategy)] = trainer.fit(x, y, batch_size=16, epochs=2,
                                                shuffle=False).history["loss"]
        said = "BatchNormalization layer(s) 'bn' normalise each of the 2 replicas' share" in \
            caplog.text
        assert said == (strategy != "one_device" and not synchronized), caplog.text
    ours, one = np.asarray(losses[str(MIRRORED)]), np.asarray(losses["one_device"])
    difference = float(np.max(np.abs(ours - one) / one))
    print(f"BATCHNORM synchronized={synchronized} max_rel_diff_vs_one_device={difference:.2g}")
    if synchronized:
        assert difference <= 1e-5
    else:
        assert difference > 1e-4   # per-replica statistics: not one device's numbers


def test_a_partial_last_batch_under_mirrored_with_batchnorm_and_embedding():
    """257 examples in global batches of 256: the last batch has 1 example for 2 replicas.
    It trains (it used to crash) and its loss equals Keras fit's under the same
    MirroredStrategy. Weights after the partial batch differ by design: kerastrain's gradient
    is the global batch's mean (replicas weighted by their examples), Keras divides each
    replica's mean by the replica count, empty replicas included (with full batches both
    are bit-identical).

    The replica with the empty batch changes nothing: under Keras fit, BatchNormalization's
    mean of nothing makes `gamma`'s gradient NaN (so `gamma` is NaN everywhere) and that
    replica's own copy of the moving statistics NaN (measured, Keras 3.15.1); kerastrain
    gives it zero gradients and puts its copy back, so the weights and evaluation stay
    finite. (The moving statistics Keras reads are replica 0's copy: equal in both.)"""
    rng = np.random.RandomState(0)
    ids, y = rng.randint(0, 50, size=(257, 3)), rng.randn(257, 1).astype("float32")

    def build_model():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((3,), dtype="int32")
        x = keras.layers.Flatten()(keras.layers.Embedding(50, 4)(inputs))
        x = keras.layers.BatchNormalization()(keras.layers.Dense(8)(x))
        model = keras.Model(inputs, keras.layers.Dense(1)(x))
        model.compile(optimizer="sgd", loss="mse")
        return model

    data = tf.data.Dataset.from_tensor_slices((ids, y)).batch(256)
    trainer = kt.Trainer(build_model, data, strategy=MIRRORED, verbose=0)
    ours = trainer.fit(epochs=1).history["loss"]
    with trainer.strategy.scope():
        reference = build_model()
    theirs = reference.fit(data, epochs=1, verbose=0).history["loss"]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    embeddings = trainer.model.get_weights()[0]
    np.testing.assert_allclose(embeddings, reference.get_weights()[0], rtol=1e-5, atol=1e-6)
    assert all(np.isfinite(w).all() for w in trainer.model.get_weights())
    norm = [layer for layer in trainer.model.layers
            if isinstance(layer, keras.layers.BatchNormalization)][0]
    theirs_norm = [layer for layer in reference.layers
                   if isinstance(layer, keras.layers.BatchNormalization)][0]
    for ours_v, theirs_v in ((norm.moving_mean, theirs_norm.moving_mean),
                             (norm.moving_variance, theirs_norm.moving_variance)):
        copies = trainer.strategy.experimental_local_results(ours_v.value)
        assert len(copies) == 2 and all(np.isfinite(c.numpy()).all() for c in copies)
        np.testing.assert_allclose(ours_v.numpy(), theirs_v.numpy(), rtol=1e-5, atol=1e-7)
    assert np.isfinite(trainer.evaluate(data)["loss"])


def test_a_subclassed_model_instance_trains_on_one_device_and_is_refused_clearly_elsewhere(
        caplog):
    """Keras cannot clone a subclassed model into a strategy's scope. Under one_device (what
    "auto" picks on a machine with one GPU) the instance's variables are already on that
    device, so it trains as it is under the default strategy (said in the strategy line),
    equal to a builder function under one_device; under mirrored it is a clear error."""
    import gallery
    x, y = gallery.X, gallery.Y
    with caplog.at_level(logging.INFO, logger="kerastrain"):
        user_model = gallery.dropout_subclassed()
        trainer = kt.Trainer(user_model, strategy="one_device", verbose=0, seed=0)
        ours = trainer.fit(x, y, batch_size=16, epochs=2, shuffle=False).history
    assert trainer.strategy_name == "default" and trainer.model is user_model
    assert "one_device was chosen" in caplog.text and "trains it there as it is" in \
        caplog.text, caplog.text
    built = kt.Trainer(gallery.dropout_subclassed, strategy="one_device", verbose=0, seed=0)
    theirs = built.fit(x, y, batch_size=16, epochs=2, shuffle=False).history
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-6)
    for a, b in zip(user_model.get_weights(), built.model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match=r"created outside the strategy's scope and cannot be "
                       r"rebuilt inside it \(Keras cannot clone it from its config\)\. Pass a "
                       r"function that builds and compiles the model"):
        kt.Trainer(gallery.dropout_subclassed(), strategy=MIRRORED, verbose=0)


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED], ids=["one_device", "mirrored"])
@pytest.mark.parametrize("cls", [keras.Model, ComputeLossStep], ids=["fit_step", "own_step"])
def test_metrics_with_one_result_per_class_log_as_under_fit_and_write_one_scalar_each(
        strategy, cls, tmp_path):
    """`F1Score` (average=None) results in one value per class: `model.fit`'s logs hold
    the array, and so do kerastrain's, with Keras's step or the model's own; writers get
    one scalar per class (`f1/0`, `f1/1`), where Keras's TensorBoard callback cannot
    write it. (Both steps raised errors.)"""
    x = np.random.RandomState(2).randn(96, 6).astype("float32")
    y = keras.utils.to_categorical(x[:, 0] + 0.3 * x[:, 1] > 0, 2).astype("float32")

    def model():
        keras.utils.set_random_seed(4)
        inputs = keras.Input((6,))
        m = cls(inputs, keras.layers.Dense(2, activation="softmax")(inputs))
        m.compile(keras.optimizers.Adam(0.05), "categorical_crossentropy",
                  metrics=[keras.metrics.F1Score(name="f1"), keras.metrics.AUC(name="auc")])
        return m

    trainer = kt.Trainer(model, (x, y), strategy=strategy, verbose=0,
                         writers=[kt.CSVWriter(str(tmp_path / "scalars.csv"))])
    ours = trainer.fit(epochs=2, batch_size=32, shuffle=False).history
    with trainer.strategy.scope():
        reference = model()
    theirs = reference.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history
    trainer.close()
    assert set(ours) == set(theirs)
    for key in theirs:
        for a, b in zip(ours[key], theirs[key]):
            assert type(a) is type(b) and np.shape(a) == np.shape(b), (key, a, b)
            np.testing.assert_allclose(a, b, rtol=1e-5, err_msg=key)
    rows = (tmp_path / "scalars.csv").read_text().splitlines()
    names = {row.split(",")[1] for row in rows[1:]}
    assert {"epoch_f1/0", "epoch_f1/1", "epoch_auc", "epoch_loss"} <= names, names
    last = {row.split(",")[1]: float(row.split(",")[2]) for row in rows[1:]}
    np.testing.assert_allclose([last["epoch_f1/0"], last["epoch_f1/1"]], theirs["f1"][-1],
                               rtol=1e-5)


OPTIMIZERS = {
    "clipnorm": lambda: keras.optimizers.SGD(0.05, clipnorm=0.5),
    "global_clipnorm": lambda: keras.optimizers.SGD(0.05, global_clipnorm=0.5),
    "clipvalue": lambda: keras.optimizers.SGD(0.05, clipvalue=0.05),
    "loss_scaled_clipnorm": lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.05, clipnorm=0.5)),
    "ema": lambda: keras.optimizers.Adam(0.01, use_ema=True, ema_momentum=0.9),
}


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED], ids=["one_device", "mirrored"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_clipping_and_ema_optimizers_train_the_weights_of_one_device_fit(name, strategy):
    """Gradient clipping acts on the gradient of the global batch, as on one device (Keras
    3's optimizers clip each replica's part: under 2 replicas the weights differed by 0.4),
    and an EMA optimizer's averages become the weights when fit ends, as model.fit does
    (they differed by 0.07)."""
    rng = np.random.RandomState(0)
    x = rng.rand(128, 8).astype("float32")
    y = (x @ rng.randn(8, 1) * 10).astype("float32")   # large gradients: clipping acts

    def model():
        keras.utils.set_random_seed(1)
        m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
        m.compile(optimizer=OPTIMIZERS[name](), loss="mse")
        return m

    reference = model()
    theirs = reference.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history
    trainer = kt.Trainer(model, (x, y), strategy=strategy, verbose=0)
    ours = trainer.fit(epochs=2, batch_size=32, shuffle=False).history
    np.testing.assert_allclose(ours["loss"], theirs["loss"], rtol=1e-5)
    for a, b in zip(trainer.model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.multiprocess
def test_ema_averages_under_parameter_servers_start_at_the_weights():
    """Keras's first EMA step copies the weights into the averages (momentum 0 at step 0);
    under ps two workers' first steps run at once, and one that read the zero averages could
    write over the other's copy: in 1 of 3 runs the averages (then the weights, at the end)
    held ~5% of the weights, the model's loss ln 2. Started at the weights, no race can
    leave them near zero; without a race training is as before (step 0 copies anyway)."""
    import helpers
    code = """
import numpy as np, keras, kerastrain as kt
def build():
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    m.compile(keras.optimizers.Adam(use_ema=True), "mse")
    return m
x, y = np.ones((32, 4), "float32"), np.ones((32, 1), "float32")
t = kt.Trainer(build, strategy={"name": "ps", "num_workers": 2, "num_ps": 1}, verbose=0)
t.build((x, y), batch_size=8)
o = t.model.optimizer
pairs = list(zip(o._trainable_variables, o._model_variables_moving_average))
print("PAIRS", len(pairs), "GAP", max(float(np.max(np.abs(v.numpy() - a.numpy())))
                                      for v, a in pairs))
"""
    proc = helpers.run_python(code)
    assert "PAIRS 4 GAP 0.0" in proc.stdout, proc.stdout + proc.stderr[-3000:]


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED], ids=["one_device", "mirrored"])
def test_lists_of_arrays_for_several_inputs_and_outputs_train_as_under_fit(strategy):
    """`fit([x_a, x_b], [y_a, y_b])`, keras.io's multi-input and multi-output form: Keras
    reads the lists as tuples. tf.data would stack a list into one tensor: a model's two
    targets became one array of shape (2, n, 1); on one device that failed, under mirrored
    the model trained on the wrong targets without a word (weights 0.015 off)."""
    rng = np.random.RandomState(3)
    xa, xb = rng.rand(100, 4).astype("float32"), rng.rand(100, 3).astype("float32")
    ya, yb = xa[:, :1] + xb[:, :1], xa[:, 1:2] - xb[:, 1:2]

    def model():
        keras.utils.set_random_seed(1)
        a, b = keras.Input((4,)), keras.Input((3,))
        h = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([a, b]))
        m = keras.Model([a, b], [keras.layers.Dense(1, name="p")(h),
                                 keras.layers.Dense(1, name="q")(h)])
        m.compile("adam", loss=["mse", "mae"], loss_weights=[2.0, 1.0], metrics=[["mae"], []])
        return m

    reference = model()
    theirs = reference.fit([xa, xb], [ya, yb], batch_size=32, epochs=2, shuffle=False,
                           validation_data=([xa, xb], [ya, yb]), verbose=0).history
    trainer = kt.Trainer(model, strategy=strategy, verbose=0)
    ours = trainer.fit([xa, xb], [ya, yb], batch_size=32, epochs=2, shuffle=False,
                       validation_data=([xa, xb], [ya, yb])).history
    assert set(ours) == set(theirs)
    for key in theirs:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, err_msg=key)
    for a, b in zip(trainer.model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(trainer.predict([xa, xb]), reference.predict([xa, xb], verbose=0)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("masking", ["ignore_class", "mask_zero"])
def test_a_loss_over_unmasked_entries_is_exact_on_one_device_and_said_under_replicas(
        masking, caplog):
    """A loss that averages over unmasked entries (`ignore_class`, or a Keras mask on the
    outputs from `Embedding(mask_zero=True)`) trains as model.fit on one device; under
    mirrored each replica averages over its own unmasked entries, so the start says that
    it differs slightly from one device (it was silent)."""
    rng = np.random.RandomState(0)
    x = rng.randint(0, 20, size=(96, 7)).astype("int32")
    x[:, 5:] = 0                                     # padding, masked with mask_zero
    y = rng.randint(0, 3, size=(96, 7))
    y[::5, :2] = -1                                  # ignored with ignore_class

    def model():
        keras.utils.set_random_seed(1)
        m = keras.Sequential([keras.Input((7,), dtype="int32"),
                              keras.layers.Embedding(20, 4, mask_zero=masking == "mask_zero"),
                              keras.layers.Dense(3)])
        m.compile("adam", keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=-1 if masking == "ignore_class" else None))
        return m

    targets = y if masking == "ignore_class" else np.maximum(y, 0)
    theirs = model().fit(x, targets, batch_size=32, epochs=2, shuffle=False,
                         verbose=0).history["loss"]
    said = {}
    for strategy in ("one_device", MIRRORED):
        with caplog.at_level(logging.INFO, logger="kerastrain"):
            caplog.clear()
            ours = kt.Trainer(model, strategy=strategy, verbose=0).fit(
                x, targets, batch_size=32, epochs=2, shuffle=False).history["loss"]
        said[str(strategy)] = "the loss averages over unmasked entries only" in caplog.text
        if strategy == "one_device":
            np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    assert said == {"one_device": False, str(MIRRORED): True}


@pytest.mark.parametrize("reduction", ["mean_with_sample_weight", "sum_over_batch_size"])
def test_a_loss_divided_by_the_sample_weights_is_said_under_replicas(reduction, caplog):
    """`reduction="mean_with_sample_weight"` with sample weights: each replica divides by its
    own share's weights, so under mirrored the start says it differs slightly from one
    device (it was silent: 7.5e-5 on the loss, 6e-4 on the weights after 2 epochs); the
    default reduction stays exact and says nothing."""
    rng = np.random.default_rng(0)
    x, y = rng.random((40, 4)).astype("float32"), rng.random((40, 1)).astype("float32")
    weights = rng.random(40).astype("float32")

    def model():
        keras.utils.set_random_seed(1)
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        m.compile(keras.optimizers.SGD(0.01), keras.losses.MeanSquaredError(reduction=reduction))
        return m

    theirs = model().fit(x, y, sample_weight=weights, batch_size=16, epochs=2, shuffle=False,
                         verbose=0).history["loss"]
    with caplog.at_level(logging.INFO, logger="kerastrain"):
        ours = kt.Trainer(model, strategy=MIRRORED, verbose=0).fit(
            x, y, sample_weight=weights, batch_size=16, epochs=2, shuffle=False)
    said = "reduction='mean_with_sample_weight'" in caplog.text
    assert said == (reduction == "mean_with_sample_weight"), caplog.text
    if not said:
        np.testing.assert_allclose(ours.history["loss"], theirs, rtol=1e-6)


class MaxError(keras.metrics.Metric):
    """A metric that keeps a maximum: its updates do not add up over batches."""

    def __init__(self, name="max_error", **kwargs):
        super().__init__(name=name, **kwargs)
        self.worst = self.add_variable(shape=(), initializer="zeros", name="worst")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.worst.assign(ops.maximum(self.worst, ops.max(ops.abs(y_true - y_pred))))

    def result(self):
        return self.worst


class TruePositives(keras.metrics.Metric):
    """keras.io's "writing your own metrics" example (its counts add up)."""

    def __init__(self, name="true_positives", **kwargs):
        super().__init__(name=name, **kwargs)
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        hits = ops.cast(ops.equal(ops.argmax(y_true, -1), ops.argmax(y_pred, -1)), "float32")
        self.count.assign_add(ops.sum(hits))

    def result(self):
        return self.count


def test_a_metric_whose_updates_do_not_add_up_is_refused_and_one_that_adds_is_exact():
    """kerastrain sums each step's metric updates: a metric keeping a maximum was logged as
    the sum of the batches' maxima (9.6 for 2.5) without a word. It is refused, saying
    which variables and what to do; keras.io's own custom metric trains as under fit."""
    rng = np.random.RandomState(0)
    x = rng.rand(96, 4)                                   # float64, as NumPy makes them
    y = keras.utils.to_categorical(x.argmax(axis=1), 4)  # float64 too
    # Keras hands float64 arrays to the model as float32: so does kerastrain now (the
    # metric's `y_true - y_pred` failed on float64 against float32).

    def model(metric):
        keras.utils.set_random_seed(1)
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, activation="softmax")])
        m.compile("adam", "categorical_crossentropy", metrics=[metric()])
        return m

    with pytest.raises(ValueError, match=r"\['max_error/worst'\] do not add up.*assign_add"):
        kt.Trainer(lambda: model(MaxError), (x, y), verbose=0).fit(batch_size=32)
    theirs = model(TruePositives).fit(x, y, batch_size=32, epochs=2, shuffle=False,
                                      verbose=0).history
    ours = kt.Trainer(lambda: model(TruePositives), (x, y), strategy=MIRRORED,
                      verbose=0).fit(batch_size=32, epochs=2, shuffle=False).history
    np.testing.assert_allclose(ours["true_positives"], theirs["true_positives"])
    np.testing.assert_allclose(ours["loss"], theirs["loss"], rtol=1e-5)


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED, "central_storage"],
                         ids=["one_device", "mirrored", "central_storage"])
def test_a_model_trained_by_fit_goes_on_with_its_optimizer_state_as_a_second_fit_would(
        strategy):
    """`model.fit` first, then kerastrain: training goes on from the optimizer's step count
    and Adam's moments, as a second `model.fit` would (a fresh optimizer state left the
    weights 0.0075 away and `optimizer.iterations` at 4 instead of 8)."""
    rng = np.random.RandomState(0)
    x = rng.rand(128, 4).astype("float32")
    y = x.sum(axis=1, keepdims=True)

    def model():
        keras.utils.set_random_seed(1)
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
        m.compile(keras.optimizers.Adam(0.01), "mse")
        return m

    reference, ours = model(), model()
    for m in (reference, ours):
        m.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    reference.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    kt.Trainer(ours, (x, y), strategy=strategy, verbose=0).fit(batch_size=32, shuffle=False)
    assert int(ours.optimizer.iterations.numpy()) == 8
    for a, b in zip(ours.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED], ids=["one_device", "mirrored"])
def test_early_stopping_restores_its_best_weights_into_the_users_model_object(strategy):
    """`EarlyStopping(restore_best_weights=True)` restores them in `on_train_end`: the
    user's own model object must get those, as after `model.fit` (it got the last epoch's,
    0.52 away, while `trainer.model` held the best)."""
    rng = np.random.RandomState(3)
    x, xv = rng.rand(96, 4).astype("float32"), rng.rand(32, 4).astype("float32")
    y, yv = x[:, :1] * 3, -xv[:, :1] * 3      # validation loss rises as training goes on

    def model():
        keras.utils.set_random_seed(1)
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        m.compile(keras.optimizers.SGD(0.1), "mse")
        return m

    def stopping():
        return keras.callbacks.EarlyStopping(monitor="val_loss", patience=2,
                                             restore_best_weights=True)

    reference, ours = model(), model()
    theirs = reference.fit(x, y, batch_size=16, epochs=8, shuffle=False, verbose=0,
                           validation_data=(xv, yv), callbacks=[stopping()]).history
    history = kt.Trainer(ours, strategy=strategy, verbose=0).fit(
        x, y, batch_size=16, epochs=8, shuffle=False, validation_data=(xv, yv),
        callbacks=[stopping()]).history
    assert len(history["loss"]) == len(theirs["loss"]) < 8
    for a, b in zip(ours.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED], ids=["one_device", "mirrored"])
def test_a_callback_closing_over_the_users_model_object_sees_it_trained_at_each_epoch_end(
        strategy):
    """keras.io-style callbacks often use the model variable of the script, not
    `self.model`: under `model.fit` that object is the one training. kerastrain trains a copy
    built in scope; the callback saw the initial weights at every epoch end (loss 5.2 three
    times where `fit`'s went 0.30, 0.19, 0.17)."""
    def model():
        keras.utils.set_random_seed(2)
        m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
        m.compile(keras.optimizers.SGD(0.05), "mse")
        return m

    def watching(m, seen):
        return keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(
            float(m.evaluate(X, Y, batch_size=64, verbose=0))))

    reference, ours = model(), model()
    theirs, seen = [], []
    reference.fit(X, Y, batch_size=16, epochs=3, shuffle=False, verbose=0,
                  callbacks=[watching(reference, theirs)])
    kt.Trainer(ours, strategy=strategy, verbose=0).fit(
        X, Y, batch_size=16, epochs=3, shuffle=False, callbacks=[watching(ours, seen)])
    assert theirs[0] > theirs[-1]
    np.testing.assert_allclose(seen, theirs, rtol=1e-5)


def test_the_history_returned_holds_the_users_model_object_as_fits_does():
    """`history.model.save(...)` after `model.fit` saves the model fit was called on; it was
    kerastrain's copy built in scope (under ps, placed on the cluster)."""
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    trainer = kt.Trainer(model, strategy=MIRRORED, verbose=0)
    assert trainer.model is not model  # a copy was trained (one device trains the object)
    history = trainer.fit(X, Y, batch_size=16)
    assert history.model is model
    assert history.history["loss"] and history.epoch == [0]


def test_callbacks_get_the_epochs_steps_in_their_params_as_under_fit():
    """`self.params["steps"]` (a progress bar's total, a callback's schedule): Keras gives the
    batches of a pass when the data's size is known; kerastrain gave None."""
    seen = {}

    class Params(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen[len(seen)] = dict(self.params)

    def model():
        m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
        m.compile("sgd", "mse")
        return m

    model().fit(X, Y, batch_size=16, epochs=2, validation_split=0.25, verbose=0,
                callbacks=[Params()])
    kt.Trainer(model(), strategy="one_device", verbose=0).fit(
        X, Y, batch_size=16, epochs=2, validation_split=0.25, callbacks=[Params()])
    assert seen[0] == seen[1] == {"verbose": 0, "epochs": 2, "steps": 3}


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
@pytest.mark.parametrize("steps_per_epoch,form", [(4, "dataset"), (7, "arrays")])
def test_finite_data_ending_inside_an_epoch_ends_the_epoch_as_under_fit(
        caplog, strategy, steps_per_epoch, form):
    """10 batches, `steps_per_epoch` 4 or 7, 3 epochs: Keras 3.15 `model.fit` ends an epoch
    where the data's pass ends ("Your input ran out of data"), leaves a pass's rest to the
    next epoch and begins a new pass after an epoch that reached its end (4: 4, 4, 2 steps;
    7: 7, 3, 7). kerastrain read on into the next pass (12 and 21 steps); now the same steps,
    losses and weights, and one warning that says what happened."""
    x = np.random.RandomState(3).rand(160, 4).astype("float32")
    y = x[:, :1] * 3
    data = (dict(x=tf.data.Dataset.from_tensor_slices((x, y)).batch(16)) if form == "dataset"
            else dict(x=x, y=y, batch_size=16, shuffle=False))

    def model():
        keras.utils.set_random_seed(1)
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        m.compile(keras.optimizers.SGD(0.1), "mse")
        return m

    class Batches(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.epochs = []

        def on_epoch_begin(self, epoch, logs=None):
            self.epochs.append(0)

        def on_train_batch_end(self, batch, logs=None):
            self.epochs[-1] += 1

    expected = {4: [4, 4, 2], 7: [7, 3, 7]}[steps_per_epoch]
    reference, seen = model(), Batches()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        history = reference.fit(**data, epochs=3, steps_per_epoch=steps_per_epoch, verbose=0,
                                callbacks=[seen])
    assert seen.epochs == expected
    with caplog.at_level(logging.INFO, logger="kerastrain"):
        trainer = kt.Trainer(model, strategy=strategy, verbose=0)
        ours = trainer.fit(**data, epochs=3, steps_per_epoch=steps_per_epoch, callbacks=[seen])
    assert seen.epochs == expected
    assert trainer.global_step == sum(expected)
    np.testing.assert_allclose(ours.history["loss"], history.history["loss"], rtol=1e-5)
    np.testing.assert_allclose(trainer.model.get_weights()[0], reference.get_weights()[0],
                               rtol=1e-5)
    said = [r for r in caplog.records if "the training data ran out" in r.message]
    assert len(said) == 1 and "the epoch ends here" in said[0].message


class _Peek(keras.layers.Layer):
    """Reads its input's values in `call` (`.numpy()`), as a debugging session does, when
    `read`; a symbolic tensor has no `.numpy()`."""

    def __init__(self, read=True, **kwargs):
        super().__init__(**kwargs)
        self.read, self.seen = read, []

    def call(self, x):
        if self.read:
            self.seen.append(float(np.sum(x.numpy())))
        return x


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_run_eagerly_runs_each_step_eagerly_with_the_compiled_runs_numbers(strategy):
    """`compile(run_eagerly=True)`, Keras's debugging mode: `.numpy()` in a layer's `call`
    works through the Trainer (every replica's step runs eagerly), and fit, evaluate and
    predict give the compiled run's numbers. kerastrain refused the model before."""
    rng = np.random.RandomState(0)
    x, y = rng.rand(40, 3).astype("float32"), rng.rand(40, 1).astype("float32")

    class Model(keras.Model):
        def __init__(self, read):
            super().__init__()
            self.peek, self.dense = _Peek(read, name="peek"), keras.layers.Dense(1)

        def call(self, inputs):
            return self.dense(self.peek(inputs))

    def model(eager):
        keras.utils.set_random_seed(1)
        m = Model(read=eager)
        m.compile(keras.optimizers.SGD(0.1), "mse", metrics=["mae"], run_eagerly=eager)
        return m

    runs = {}
    for eager in (False, True):
        trainer = kt.Trainer(model(eager), strategy=strategy, verbose=0)
        history = trainer.fit(x, y, batch_size=8, epochs=2, validation_data=(x, y)).history
        runs[eager] = (history, trainer.evaluate(x, y), trainer.predict(x, batch_size=8),
                       trainer.model)
    (history, logs, predicted, _), (eager_history, eager_logs, eager_predicted, eager_model) = \
        runs[False], runs[True]
    assert runs[False][3].peek.seen == []
    replicas = 2 if strategy == "mirrored" else 1
    # Built from a batch of zeros, then on every replica 10 training steps, 2 validations
    # of 5 batches, an evaluation of 2 (Keras's batch size 32) and a prediction of 5.
    assert len([v for v in eager_model.peek.seen if v]) == replicas * (10 + 2 * 5 + 2 + 5)
    assert eager_history.keys() == history.keys()
    for key in history:
        np.testing.assert_allclose(eager_history[key], history[key], rtol=1e-6)
    np.testing.assert_allclose(list(eager_logs.values()), list(logs.values()), rtol=1e-6)
    np.testing.assert_allclose(eager_predicted, predicted, rtol=1e-6)


def test_a_model_instance_with_random_layers_keeps_its_random_stream():
    """keras.io's augmentation layers (unseeded RandomFlip, RandomRotation) draw their seed
    when made: the copy kerastrain builds in the strategy's scope drew new ones, so a model
    instance trained differently from the same model under fit (weights 0.004 away on one
    device). The copy now takes the user's seed states."""
    rng = np.random.RandomState(0)
    x, y = rng.rand(32, 8, 8, 3).astype("float32"), rng.randint(0, 2, 32)

    def model():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((8, 8, 3))
        h = keras.layers.RandomRotation(0.1)(keras.layers.RandomFlip("horizontal")(inputs))
        h = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3)(h))
        m = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(h))
        m.compile("adam", "binary_crossentropy")
        return m

    reference, ours = model(), model()
    theirs = reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    history = kt.Trainer(ours, strategy="one_device", verbose=0).fit(
        x, y, batch_size=8, epochs=2, shuffle=False).history
    np.testing.assert_allclose(history["loss"], theirs["loss"], rtol=1e-6)
    for a, b in zip(ours.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED], ids=["one_device", "mirrored"])
def test_an_adapted_normalization_layer_in_a_model_instance_keeps_its_statistics(strategy):
    """keras.io's structured-data recipe: `Normalization().adapt(x)` in the model. Its
    statistics live in variables, but it normalises with tensors made from them when
    adapted or loaded: the copy built in scope normalised with mean 0 and variance 1
    (logs 0.11 and weights 0.019 away from fit). Now equal to fit."""
    rng = np.random.RandomState(0)
    x = (rng.rand(96, 5) * 50 + 10).astype("float32")
    y = (x[:, :1] > 35).astype("float32")

    def model():
        keras.utils.set_random_seed(1)
        norm = keras.layers.Normalization()
        norm.adapt(x)
        inputs = keras.Input((5,))
        h = keras.layers.Dense(8, activation="relu")(norm(inputs))
        m = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(h))
        m.compile("adam", "binary_crossentropy", metrics=["accuracy"])
        return m

    reference, ours = model(), model()
    theirs = reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    history = kt.Trainer(ours, strategy=strategy, verbose=0).fit(
        x, y, batch_size=16, epochs=2, shuffle=False).history
    for key in theirs:
        np.testing.assert_allclose(history[key], theirs[key], rtol=1e-5, err_msg=key)
    for a, b in zip(ours.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_an_adapted_tf_idf_text_vectorization_in_a_model_instance_trains_as_under_fit():
    """`TextVectorization(output_mode="tf_idf")` adapted in a model instance: the copy built
    in scope was given the vocabulary without its IDF weights, and the Trainer failed at
    once ("`idf_weights` must be set if output_mode is 'tf_idf'"). Now equal to fit."""
    rng = np.random.RandomState(0)
    words = np.array("the cat sat on a mat dog ran far away".split())
    texts = np.array([" ".join(rng.choice(words, size=rng.randint(2, 6))) for _ in range(48)])
    y = (np.char.count(texts, "cat") > 0).astype("float32")[:, None]

    def model():
        keras.utils.set_random_seed(1)
        vectorize = keras.layers.TextVectorization(max_tokens=16, output_mode="tf_idf",
                                                   pad_to_max_tokens=True)
        vectorize.adapt(texts)
        inputs = keras.Input((), dtype="string")
        m = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(vectorize(inputs)))
        m.compile("adam", "binary_crossentropy")
        return m

    def data():
        return tf.data.Dataset.from_tensor_slices((texts, y)).batch(16)

    reference, ours = model(), model()
    theirs = reference.fit(data(), epochs=2, verbose=0).history
    history = kt.Trainer(ours, strategy="one_device", verbose=0).fit(data(), epochs=2).history
    np.testing.assert_allclose(history["loss"], theirs["loss"], rtol=1e-6)
    np.testing.assert_allclose(ours.predict(data(), verbose=0),
                               reference.predict(data(), verbose=0), rtol=1e-5, atol=1e-6)


def test_a_model_made_in_a_mirrored_scope_of_the_users_own_trains_and_is_handed_back():
    """keras.io's multi-GPU guide builds and compiles the model in its own
    `MirroredStrategy().scope()`. Given to kerastrain, it trained (kerastrain's copy), then
    handing the weights back failed building the user's optimizer outside its strategy's
    scope ("Need to be inside with strategy.scope()"). Now its weights equal `fit`'s under
    that strategy."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.RandomState(0)
    x = rng.rand(96, 4).astype("float32")
    y = x.sum(axis=1, keepdims=True)

    def model():
        keras.utils.set_random_seed(1)
        with strategy.scope():
            m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1)])
            m.compile("adam", "mse")
        return m

    reference, ours = model(), model()
    theirs = reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    history = kt.Trainer(ours, strategy=MIRRORED, verbose=0).fit(
        x, y, batch_size=16, epochs=2, shuffle=False).history
    np.testing.assert_allclose(history["loss"], theirs["loss"], rtol=1e-5)
    for a, b in zip(ours.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert int(ours.optimizer.iterations.numpy()) == 12


def _transfer_model():
    """keras.io's transfer-learning shape: a frozen base under a new head."""
    keras.utils.set_random_seed(0)
    base = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu")],
                            name="base")
    base.trainable = False
    model = keras.Sequential([base, keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy",
                  metrics=["accuracy"])
    return model


def _fine_tune(model):
    model.layers[0].trainable = True
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mae", metrics=["mse"])


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED], ids=["one_device", "mirrored"])
def test_a_model_compiled_again_is_followed_as_model_fit_follows_it(strategy):
    """keras.io's transfer learning: fit with the base frozen, unfreeze it, compile again
    with another loss and optimizer, fit again. `model.fit` trains the new compile; the
    Trainer refused it (and before that trained the old loss, logged as `loss`, without a
    word). Now each phase equals `model.fit`'s, before the first call and after a fit."""
    x, y = _binary(32)
    fit = dict(batch_size=16, epochs=2, shuffle=False)
    reference, model = _transfer_model(), _transfer_model()
    trainer = kt.Trainer(model, strategy=strategy, verbose=0)
    theirs = [reference.fit(x, y, verbose=0, **fit).history]
    ours = [trainer.fit(x, y, **fit).history]
    for m in (reference, model):
        _fine_tune(m)
    theirs.append(reference.fit(x, y, verbose=0, **fit).history)
    ours.append(trainer.fit(x, y, **fit).history)
    assert sorted(ours[1]) == ["loss", "mse"]
    for a, b in zip(ours, theirs):
        for key in b:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5)
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trainer.evaluate(x, y, batch_size=16)["mse"],
                               reference.evaluate(x, y, batch_size=16, verbose=0,
                                                  return_dict=True)["mse"], rtol=1e-5)
    # Compiled again before the Trainer's first call.
    fresh, reference = _transfer_model(), _transfer_model()
    trainer = kt.Trainer(fresh, strategy=strategy, verbose=0)
    for m in (fresh, reference):
        _fine_tune(m)
    np.testing.assert_allclose(trainer.fit(x, y, **fit).history["loss"],
                               reference.fit(x, y, verbose=0, **fit).history["loss"], rtol=1e-5)
