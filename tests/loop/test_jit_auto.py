"""jit_compile="auto": the step with XLA timed against the step without on the first training
loops, the faster kept (kerastrain.loop.tuning.JitTrial), no step lost or repeated."""

import logging
import re

import numpy as np
import pytest
from helpers import FEATURES, arrays, build_model

from kerastrain.loop import tuning


class _Step:
    """What a `JitTrial` uses of a `Step`: its loops by XLA or not, and its choice."""

    def __init__(self):
        self.jit_compile = False

    def train_loop(self, jit=None):
        return ("xla" if (self.jit_compile if jit is None else jit) else "plain")


def _run_trial(xla, plain, xla_cpu=None, margin=0.9):
    """A trial of 2 pairs of loops, each loop's seconds a step taken in turn from the lists."""
    step = _Step()
    trial = tuning.JitTrial(step, pairs=2, margin=margin, seconds=0.01)
    assert trial.choose(100, sized=False) == (None, 100)  # steps_per_loop still measured
    assert trial.choose(100, sized=True) == (None, 100)   # no step timed without XLA yet
    assert trial.most(3) == 3
    trial.observe(None, 50, 3.0)                           # the first loop traced
    assert trial.choose(100, sized=True) == (None, 100)
    trial.observe(None, 50, 0.05)                          # 1 ms a step without XLA
    assert trial.most(3) == 10                             # a trial loop: 0.01 s of them
    assert trial.compiling and trial.choose(100, sized=True) == (True, 1)
    trial.observe(True, 1, 7.0)                            # compiling: not timed
    assert not trial.compiling
    order, times = [], {True: list(xla), False: list(plain)}
    cpu = {True: list(xla_cpu or xla), False: list(plain)}
    while trial.decided is None:
        jit, n = trial.choose(100, sized=True)
        assert n == 10
        order.append(jit)
        trial.observe(jit, n, n * times[jit].pop(0), n * cpu[jit].pop(0))
    assert order == [True, False, False, True]             # neither always first
    assert trial.choose(100, sized=True) == (None, 100) and trial.most(3) == 3
    return step, trial


def test_trial_keeps_xla_only_when_it_is_clearly_faster(caplog):
    with caplog.at_level(logging.INFO, logger="kerastrain"):
        step, trial = _run_trial(xla=[0.0005, 0.0006], plain=[0.001, 0.0011])
    assert trial.decided is True and step.jit_compile is True
    assert step.train_loop() == "xla"
    assert ("jit_compile: True (auto, measured over 2 loops of up to 10 steps each way: 0.500 "
            "ms a step with XLA, 1.000 ms without (the fastest loop of each): 0.50x wall, "
            "0.50x CPU; XLA is kept at 0.90x or less in both" in caplog.text)
    step, trial = _run_trial(xla=[0.00095] * 2, plain=[0.001] * 2)  # 5% is not enough
    assert trial.decided is False and step.train_loop() == "plain"
    # Faster on the wall clock only by taking more CPU (a busy host's noise): not kept.
    step, trial = _run_trial(xla=[0.0005] * 2, plain=[0.001] * 2, xla_cpu=[0.0011] * 2)
    assert trial.decided is False and step.jit_compile is False
    # A loop slowed by something else (XLA compiling for a pass's last, partial batch):
    # the fastest loop of each decides.
    step, trial = _run_trial(xla=[0.005, 0.0005], plain=[0.001, 0.001])
    assert trial.decided is True
    trial = tuning.JitTrial(_Step())
    with caplog.at_level(logging.WARNING, logger="kerastrain"):
        trial.failed(ValueError("Detected unsupported operations\nmore"))
    assert trial.decided is False and trial.choose(8, sized=True) == (None, 8)
    assert ("jit_compile: False (auto: the step compiled with XLA failed, so it trains "
            "without; no step was lost: ValueError: Detected unsupported operations)"
            in caplog.text)


def test_auto_is_a_rule_where_xla_cannot_run_or_is_not_measured():
    import keras
    model = build_model()
    resolve = tuning.resolve_jit_compile
    assert resolve("auto", model, places_variables=False) == (
        tuning.MEASURE, "auto: measured on the first training loops, with XLA against "
                        "without; XLA is kept if it is at least 10% faster (said when measured)")
    assert resolve("auto", model, places_variables=True)[0] is False
    assert resolve("auto", model, places_variables=False, measurable=False) == (
        False, "auto: off, not measured with gradient accumulation")
    assert resolve(True, model, places_variables=False) == (True, "requested")
    model.jit_compile = False
    assert resolve(None, model, places_variables=False)[0] is False

    class NoXla(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.supports_jit = False

        def call(self, x):
            return x
    odd = keras.Sequential([keras.Input((FEATURES,)), NoXla(), keras.layers.Dense(1)])
    assert resolve("auto", odd, places_variables=False)[0] is False


def _dataset_fn(ctx):
    import tensorflow as tf
    x, y = arrays(96)
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(96, seed=3).batch(8)


def _weights(trainer):
    return [np.asarray(w) for w in trainer.model.get_weights()]


@pytest.mark.parametrize("data", ["dataset_fn", "numpy"])
def test_auto_trains_every_step_once_with_both_loops(make_trainer, data, caplog):
    """The trial's loops train for real: the same steps as without XLA, within XLA's
    rounding, each batch once (the global step and Keras's count agree)."""
    runs = {}
    for jit in (False, "auto"):
        trainer = make_trainer(_dataset_fn if data == "dataset_fn" else None,
                               strategy="one_device", seed=0, jit_compile=jit,
                               steps_per_loop=3)
        with caplog.at_level(logging.INFO, logger="kerastrain"):
            fit = (trainer.fit(epochs=10) if data == "dataset_fn" else
                   trainer.fit(arrays(96), batch_size=8, epochs=10))
        runs[jit] = fit.history["loss"], _weights(trainer)
        assert int(trainer.model.optimizer.iterations.numpy()) == 120
        assert trainer.global_step == 120
    step = trainer._state.step
    assert step.jit_trial.decided is not None and set(step._train) == {False, True}
    assert re.search(r"\(auto, measured over 4 loops of up to \d+ steps each way", caplog.text), \
        caplog.text[-600:]
    np.testing.assert_allclose(runs["auto"][0], runs[False][0], rtol=1e-5)
    for a, b in zip(runs["auto"][1], runs[False][1]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def _host_square_model():
    """A model whose layer runs a NumPy function: XLA cannot compile it, though the layer
    says nothing (Keras's `supports_jit` is True)."""
    import keras
    import tensorflow as tf

    class HostSquare(keras.layers.Layer):
        def call(self, x):
            ones = tf.numpy_function(np.ones_like, [x], tf.float32)
            return x * tf.ensure_shape(ones, x.shape)  # the gradient flows through x

    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(4),
                              HostSquare(), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


@pytest.mark.parametrize("data", ["dataset_fn", "numpy"])
def test_a_step_xla_cannot_compile_trains_without_and_loses_no_batch(make_trainer, data,
                                                                     caplog):
    """The XLA loop fails on its first batch: the trial ends (off, a warning) and the data
    is read again from where that loop began, so training equals `jit_compile=False`'s to
    the last bit, though a tf.data iterator had handed that batch over."""
    runs = {}
    for jit in (False, "auto"):
        trainer = make_trainer(_dataset_fn if data == "dataset_fn" else None,
                               model=_host_square_model, strategy="one_device", seed=0,
                               jit_compile=jit, steps_per_loop=5)
        with caplog.at_level(logging.WARNING, logger="kerastrain"):
            fit = (trainer.fit(epochs=2) if data == "dataset_fn" else
                   trainer.fit(arrays(96), batch_size=8, epochs=2))
        runs[jit] = fit.history["loss"], _weights(trainer)
        assert trainer.global_step == 24
    assert ("jit_compile: False (auto: the step compiled with XLA failed, so it trains "
            "without; no step was lost: InvalidArgumentError: Detected unsupported operations "
            "when trying to compile graph") in caplog.text
    assert "PyFunc" in caplog.text
    assert trainer._state.step.jit_trial.decided is False
    assert runs["auto"][0] == runs[False][0]
    for a, b in zip(runs["auto"][1], runs[False][1]):
        np.testing.assert_array_equal(a, b)


def _own_step_model():
    """A model with its own `train_step`, as keras.io's "Customizing what happens in fit"."""
    import keras
    import tensorflow as tf

    class Own(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(y=y, y_pred=self(x, training=True))
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(grads, self.trainable_variables)
            return {"loss": loss}

    inputs = keras.Input((FEATURES,))
    model = Own(inputs, keras.layers.Dense(1)(keras.layers.Dense(4)(inputs)))
    model.compile(optimizer="adam", loss="mse")
    return model


def test_a_models_own_train_step_is_compiled_with_xla_as_fit_compiles_it(make_trainer):
    """`jit_compile=True` compiles the model's own `train_step` with XLA, as Keras's fit does
    (it was ignored: the log said True); "auto" measures it both ways."""
    runs = {}
    for jit in (False, True, "auto"):
        trainer = make_trainer(_dataset_fn, model=_own_step_model, strategy="one_device",
                               seed=0, jit_compile=jit, steps_per_loop=3)
        runs[jit] = trainer.fit(epochs=10).history["loss"]
        assert trainer.global_step == 120
        step = trainer._state.step
        compiled = step._jit_train_step
        assert (compiled is not None
                and compiled.experimental_get_tracing_count() > 0) == (jit is not False)
    assert set(step._train) == {False, True} and step.jit_trial.decided is not None
    np.testing.assert_allclose(runs[True], runs[False], rtol=1e-5)
    np.testing.assert_allclose(runs["auto"], runs[False], rtol=1e-5)


def test_auto_measures_and_decides_beside_recoveries_from_a_bad_batch(make_trainer):
    """A recovery marks a batch to skip for the rest of the run: the trial went on being
    skipped after it, so "auto" never decided. It now pauses only while a recovery replays
    its range one step at a time; the same steps train as without XLA."""
    x, y = arrays(96)
    y[40] = np.nan  # batch 5 of every pass: a recovery each epoch
    runs = {}
    for jit in (False, "auto"):
        trainer = make_trainer(None, strategy="one_device", seed=0, jit_compile=jit,
                               steps_per_loop=3, on_nonfinite="recover", max_recoveries=10)
        runs[jit] = trainer.fit((x, y), batch_size=8, epochs=10, shuffle=False).history["loss"]
        assert trainer.global_step == 110  # 11 of 12 batches an epoch
    assert trainer._state.step.jit_trial.decided is not None
    np.testing.assert_allclose(runs["auto"], runs[False], rtol=1e-4)


def test_the_trial_keeps_the_loop_size_callbacks_see(make_trainer):
    """A callback that watches every batch gets every batch while "auto" measures, and
    every `steps_per_execution` batches where the model is compiled so (as in `model.fit`,
    whatever `steps_per_loop`): the trial lengthens only loops kerastrain sizes."""
    import keras

    class Count(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.batches = []

        def on_train_batch_end(self, batch, logs=None):
            self.batches.append(batch)
    def every_four():
        model = build_model()
        model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"],
                      steps_per_execution=4)
        return model

    for model, expected in ((build_model, list(range(12)) * 10),
                            (every_four, [3, 7, 11] * 10)):
        count = Count()
        trainer = make_trainer(None, model=model, strategy="one_device", seed=0,
                               jit_compile="auto")
        trainer.fit(arrays(96), batch_size=8, epochs=10, callbacks=[count])
        assert count.batches == expected
        assert trainer._state.step.jit_trial.decided is not None
