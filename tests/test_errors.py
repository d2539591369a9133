"""Every user mistake gets one clear error: what was wrong, the value received, what to do."""

import json

import keras
import pytest

import helpers
import kerastrain as kt
from kerastrain.distribute import cluster
from kerastrain.distribute import strategies


def dataset_fn(ctx):
    import tensorflow as tf
    x, y = helpers.arrays(32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16)


def test_unknown_strategy_lists_valid_names_and_a_close_match():
    with pytest.raises(ValueError) as e:
        kt.Trainer(helpers.build_model, dataset_fn, strategy="mirored")
    msg = str(e.value)
    assert "Did you mean 'mirrored'?" in msg and "strategy='mirored'" in msg
    assert "multi_worker_mirrored" in msg and "central_storage" in msg


def test_unknown_and_mistyped_strategy_options():
    with pytest.raises(ValueError, match=r"Unknown option 'device' for strategy 'mirrored'.*"
                                         r"Did you mean 'devices'"):
        strategies.normalize({"name": "mirrored", "device": "/gpu:0"})
    with pytest.raises(ValueError, match=r"`cross_device_ops` must be one of .*nccl.*"
                                         r"Received: cross_device_ops='ring'"):
        strategies.normalize("mirrored", {"cross_device_ops": "ring"})
    with pytest.raises(ValueError, match=r"`num_workers` must be an int >= 1. Received: num_workers=0"):
        strategies.normalize("parameter_server", {"num_workers": 0})
    with pytest.raises(TypeError, match="kerastrain builds the tf.distribute strategy itself. "
                                        "Received: strategy=<object"):
        strategies.normalize(object())
    # keras.io's multi-GPU guide builds its own: the error names the strategy to ask for.
    import tensorflow as tf
    with pytest.raises(TypeError, match=r"\(for a OneDeviceStrategy: strategy='one_device', its "
                                        r"devices or cluster as options\)\. Received: "):
        strategies.normalize(tf.distribute.OneDeviceStrategy("/cpu:0"))


def test_ps_on_infinite_data_without_steps_per_epoch(tmp_path):
    code = """
import kerastrain as kt, tensorflow as tf, sys
sys.path.insert(0, "tests"); import helpers
def fn(ctx):
    x, y = helpers.arrays(32)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8)
t = kt.Trainer(helpers.build_model, strategy={"name": "ps", "num_workers": 1}, verbose=0)
try:
    t.fit(fn, epochs=1)
except ValueError as e:
    print("ERROR:", e)
"""
    proc = helpers.run_python(code)
    assert "ERROR: The training data is infinite" in proc.stdout, proc.stderr[-3000:]
    assert "pass `steps_per_epoch`. Received: steps_per_epoch=None" in proc.stdout


def test_dataset_with_wrong_structure():
    def only_x(ctx):
        import tensorflow as tf
        return tf.data.Dataset.from_tensor_slices(helpers.arrays(32)[0]).batch(8)

    trainer = kt.Trainer(helpers.build_model, strategy="default", verbose=0)
    with pytest.raises(ValueError, match=r"The batches hold inputs \(x\) only, but the model "
                                         r"was compiled with a loss.*element_spec=Tensor"):
        trainer.fit(only_x)  # x-only batches are for models with their own losses
    # Validation and evaluation data too (Keras: "None values not supported", deep in the loss).
    x, y = helpers.arrays(32)
    for x_only in [(x,), only_x]:
        with pytest.raises(ValueError, match=r"The batches hold inputs \(x\) only"):
            trainer.fit(x, y, batch_size=8, validation_data=x_only)
    with pytest.raises(ValueError, match=r"The batches hold inputs \(x\) only"):
        trainer.evaluate(x, batch_size=8)

    def four(ctx):
        import tensorflow as tf
        x, y = helpers.arrays(32)
        return tf.data.Dataset.from_tensor_slices((x, y, y, y)).batch(8)

    with pytest.raises(ValueError, match=r"must yield batches of \(x, y\), \(x, y, "
                                         r"sample_weight\) or x alone.*a tuple of 4"):
        trainer.fit(four)

    def four(ctx):
        import tensorflow as tf
        x, y = helpers.arrays(32)
        return tf.data.Dataset.from_tensor_slices((x, y, y, y)).batch(8)

    with pytest.raises(ValueError, match=r"must yield batches of \(x, y\), \(x, y, "
                                         r"sample_weight\) or x alone"):
        trainer.fit(four)

    def unbatched(ctx):
        import tensorflow as tf
        return tf.data.Dataset.from_tensor_slices(helpers.arrays(32))

    with pytest.raises(ValueError, match=r"Did you forget `.batch\(...\)`"):
        trainer.fit(unbatched)
    with pytest.raises(TypeError, match=r"not data kerastrain can read. Pass one of: a function "
                                        r"`dataset_fn\(ctx\)`.*Received: dataset_fn=42"):
        trainer.fit(42)


def test_model_not_compiled_and_no_loss():
    def uncompiled():
        return keras.Sequential([keras.Input((helpers.FEATURES,)), keras.layers.Dense(1)])

    # Refused where Keras refuses it, at fit (predict needs no compile).
    trainer = kt.Trainer(uncompiled, dataset_fn, strategy="default", verbose=0)
    with pytest.raises(ValueError, match=r"not compiled, so kerastrain does not know what to "
                                         r"minimise.*Trainer\(..., optimizer='adam', loss='mse'\)"):
        trainer.fit(epochs=1)
    # ...and `loss=` fixes it.
    trainer = kt.Trainer(uncompiled, dataset_fn, strategy="default", loss="mse", verbose=0)
    assert trainer.fit(epochs=1).history["loss"][0] > 0


@pytest.mark.parametrize("name,ps,multi_worker", [("ps", True, False),
                                                   ("multi_worker_mirrored", False, True)])
def test_run_eagerly_is_refused_where_steps_cannot_run_eagerly(name, ps, multi_worker):
    """`compile(run_eagerly=True)` runs steps eagerly on this task's replicas (one device,
    mirrored, central storage); a parameter-server coordinator schedules tf.functions on
    remote workers, and multi-worker steps are compiled collectives: refused, saying so,
    not quietly compiled."""
    import types
    from kerastrain.loop import modes
    from kerastrain.step import checks
    model = keras.Sequential([keras.Input((helpers.FEATURES,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    built = types.SimpleNamespace(name=name, is_parameter_server=ps,
                                  is_multi_worker=multi_worker)
    policy = modes.for_strategy(built).step_policy
    with pytest.raises(ValueError, match=(
            rf"`run_eagerly=True` .*which the '{name}' strategy cannot honour.*'one_device' or "
            rf"'mirrored'.*Received: run_eagerly=True for model 'sequential.*under "
            rf"strategy='{name}'")):
        checks.check_eager(model, built, policy)
    model.compile(optimizer="sgd", loss="mse")
    checks.check_eager(model, built, policy)  # compiled steps: nothing to refuse


def test_cpu_devices_after_tensorflow_initialised():
    import tensorflow as tf
    tf.constant(1.0)  # conftest made 2 logical CPUs; TensorFlow is now running
    with pytest.raises(RuntimeError) as e:
        kt.Trainer(helpers.build_model, dataset_fn, strategy={"name": "mirrored", "cpu_devices": 3})
    msg = str(e.value)
    assert "already runs with 2 logical CPU device(s)" in msg
    assert "start a new Python process" in msg and "cpu_devices=3" in msg


def test_subclassed_model_outside_scope_asks_for_a_factory(two_cpus):
    class Tiny(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

    model = Tiny()
    model(helpers.arrays(4)[0])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match=r"created outside the strategy's scope and cannot be "
                                         r"rebuilt.*Pass a function that builds"):
        kt.Trainer(model, dataset_fn, strategy={"name": "mirrored", **two_cpus})


def test_a_model_function_returning_a_model_built_outside_the_scope_is_refused(two_cpus):
    # A builder returning a model made before the Trainer (a global, a closure): under
    # mirrored the replicas cannot share its weights, and Keras failed with a bare
    # AssertionError deep in the step. Weights only read (an adapted Normalization made
    # outside) still train, as they always did.
    outside = helpers.build_model()
    with pytest.raises(ValueError, match=r"returned a model whose weights were made outside "
                                         r"the strategy's scope.*Build the model inside"):
        kt.Trainer(lambda: outside, dataset_fn, strategy={"name": "mirrored", **two_cpus},
                   verbose=0).fit()
    x, y = helpers.arrays(32)
    norm = keras.layers.Normalization()
    norm.adapt(x)

    def with_outside_norm():
        model = keras.Sequential([keras.Input((x.shape[1],)), norm, keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        return model

    history = kt.Trainer(with_outside_norm, strategy={"name": "mirrored", **two_cpus},
                         verbose=0).fit(x, y, batch_size=8)
    assert len(history.history["loss"]) == 1


def test_bad_arguments_show_the_value():
    with pytest.raises(ValueError, match=r"steps_per_loop=0"):
        kt.Trainer(helpers.build_model, dataset_fn, strategy="default", steps_per_loop=0)
    trainer = kt.Trainer(helpers.build_model, dataset_fn, strategy="default", verbose=0)
    with pytest.raises(ValueError, match=r"`epochs` must be an int >= 0. Received: epochs=-1"):
        trainer.fit(epochs=-1)
    with pytest.raises(ValueError, match="No training data"):
        kt.Trainer(helpers.build_model, strategy="default").fit()
    with pytest.raises(TypeError, match="`model` must be a compiled keras.Model"):
        kt.Trainer("model.keras", dataset_fn)
    x, y = helpers.arrays(32)
    with pytest.raises(ValueError, match=r"`class_weight` must be a non-empty dict \{class "
                                         r"index: weight \(a number\)\}.*Received: "
                                         r"class_weight=\{0: 'a'\}"):
        trainer.fit(x, y, class_weight={0: "a"})  # NumPy's "could not convert string" before


@pytest.mark.parametrize("raw, fragment", [
    ("{not json", "not valid JSON"),
    (json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}),
     "must name a job of the cluster"),
    (json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}),
     "must be between 0 and 0"),
    (json.dumps({"cluster": {"wrker": ["a:1"]}, "task": {"type": "wrker", "index": 0}}),
     "unknown job names ['wrker']"),
])
def test_malformed_tf_config(raw, fragment):
    with pytest.raises(ValueError) as e:
        cluster.read_tf_config({"TF_CONFIG": raw})
    assert fragment in str(e.value)


def test_tf_config_roles():
    c = cluster.read_tf_config({"TF_CONFIG": json.dumps(
        {"cluster": {"worker": ["a:1", "b:2"], "ps": ["c:3"], "chief": ["d:4"]},
         "task": {"type": "worker", "index": 0}})})
    assert (c.num_workers, c.num_ps, c.is_chief) == (3, 1, False)
    assert cluster.read_tf_config({}) is None


def _serve_with_chief_answering(answers, **kwargs):
    """serve() on a fake clock (one tick per poll) while the chief answers `answers`."""
    answers, times = iter(answers), iter(range(10_000))
    original = cluster._knock
    cluster._knock = lambda address, timeout=1.0: next(answers)
    try:
        # serve() starts a real server on the ps address: a free port, not a fixed one that
        # another process on the machine may hold.
        config = cluster.ClusterConfig({"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
                                        "ps": [f"127.0.0.1:{cluster.free_port()}"]}, "ps", 0)
        return cluster.serve(config, clock=lambda: next(times), sleep=lambda s: None,
                             **kwargs)
    finally:
        cluster._knock = original


def test_serve_stops_when_the_chief_has_finished_not_when_it_is_silent_for_a_while():
    # Up twice, then refused three times (its host says nothing listens): finished.
    assert _serve_with_chief_answering(["up", "up", "refused", "refused", "refused"]) == \
        "chief-finished"
    # Silent (a partition, a frozen chief) for less than silent_seconds, then up again, then
    # finished: a network blip does not end the job's servers; silence that lasts does.
    blip = ["up"] + ["silent"] * 20 + ["up", "refused", "refused", "refused"]
    assert _serve_with_chief_answering(blip, silent_seconds=30) == "chief-finished"
    assert _serve_with_chief_answering(["up"] + ["silent"] * 40, silent_seconds=30) == \
        "chief-unreachable"


@pytest.mark.parametrize("spec, gpus, cpu_devices, expected", [
    (None, 0, None, "default"),
    (None, 0, 2, "mirrored"),
    (None, 1, None, "one_device"),
    (None, 4, None, "mirrored"),
    ({"worker": ["a:1", "b:2"]}, 0, None, "multi_worker_mirrored"),
    ({"worker": ["a:1"], "chief": ["c:3"]}, 0, None, "multi_worker_mirrored"),
    ({"worker": ["a:1"]}, 2, None, "mirrored"),
    ({"worker": ["a:1"], "ps": ["p:1"], "chief": ["c:3"]}, 8, None, "ps"),
])
def test_auto_strategy_rule(spec, gpus, cpu_devices, expected):
    config = None if spec is None else cluster.ClusterConfig(
        spec, "chief" if "chief" in spec else "worker", 0)
    name, reason = strategies.choose_auto(config, gpus, cpu_devices)
    assert name == expected and reason.startswith("auto: ")


def test_auto_builds_what_it_chose_and_logs_why(caplog, two_cpus):
    import logging
    with caplog.at_level(logging.INFO, logger="kerastrain"):
        built = strategies.build_strategy("auto", two_cpus)
    assert built.name == "mirrored" and built.strategy.num_replicas_in_sync == 2
    assert "strategy: mirrored (auto: no GPU, CPU split into 2 logical devices)" in caplog.text


def test_gradient_accumulation_in_a_models_own_step_under_a_distribution_strategy_is_refused():
    """Keras accumulates inside `optimizer.apply`, in a conditional replicas cannot synchronise
    in; kerastrain's own step accumulates under every strategy (tests/step/test_accumulation.py)."""
    class OwnStep(keras.Model):
        def train_step(self, data):
            return super().train_step(data)

    def build(own):
        inputs = keras.Input((helpers.FEATURES,))
        outputs = keras.layers.Dense(1, activation="sigmoid")(inputs)
        model = OwnStep(inputs, outputs) if own else keras.Model(inputs, outputs)
        model.compile(optimizer=keras.optimizers.Adam(gradient_accumulation_steps=4),
                      loss="binary_crossentropy")
        return model
    with pytest.raises(ValueError) as e:
        kt.Trainer(lambda: build(True), dataset_fn, strategy="central_storage", verbose=0)
    message = str(e.value)
    assert "with a model that overrides `train_step` works with the 'default' and " \
        "'one_device' strategies only" in message
    assert "Multiply the global batch size by 4" in message
    assert "Adam(gradient_accumulation_steps=4) under 'central_storage'" in message
    # kerastrain's own step trains it there: the 2 batches of an epoch make one update.
    trainer = kt.Trainer(lambda: build(False), dataset_fn, strategy="central_storage", verbose=0)
    trainer.fit(epochs=2)
    assert trainer.global_step == int(trainer.model.optimizer.iterations) == 2


def test_an_iterator_that_is_no_generator_is_refused_saying_how_to_feed_it():
    """`model.fit` takes a keras.utils.PyDataset or a generator (tests/data/test_keras_inputs.py),
    and refuses other iterators, as kerastrain does: the error says what to wrap it in."""
    x, y = helpers.arrays(32)
    with pytest.raises(TypeError, match=r"not a generator.*wrap it in a generator.*Received: "):
        kt.Trainer(helpers.build_model, iter([(x, y)]), strategy="default", verbose=0)


def test_x_only_evaluation_data_is_for_a_model_whose_own_test_step_takes_it():
    # A model overriding test_step alone decides what its evaluation batches hold: x-only
    # validation and evaluation data are its to take, though it trains on (x, y).
    class OwnTest(keras.Sequential):
        def test_step(self, data):
            return {"mean_output": keras.ops.mean(self(data, training=False))}

    def build():
        model = OwnTest([keras.Input((6,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        return model

    x, y = helpers.arrays(32)
    trainer = kt.Trainer(build, strategy="one_device", verbose=0)
    history = trainer.fit(x, y, batch_size=8, validation_data=(x,))
    assert "val_mean_output" in history.history
    assert "mean_output" in trainer.evaluate(x, batch_size=8)
