"""Partial last batches, sample weights and regularization: reduced values equal one device's."""

import numpy as np
import pytest

import helpers
import kerastrain as kt


def per_replica_dataset_fn(n, global_batch, weighted=False):
    """Plain user-style dataset_fn: per-replica batches, last one partial."""
    def dataset_fn(ctx):
        import tensorflow as tf
        x, y = helpers.arrays(n)
        parts = (x, y, np.linspace(0.5, 2.0, n).astype("float32")) if weighted else (x, y)
        return tf.data.Dataset.from_tensor_slices(parts).batch(
            ctx.get_per_replica_batch_size(global_batch))
    return dataset_fn


@pytest.mark.parametrize("weighted", [False, True])
def test_partial_last_batch_epoch_loss_and_accuracy_equal_single_device(two_cpus, weighted,
                                                                        make_trainer):
    # 100 examples in per-replica batches of 8: 13 batches, the last holding 4, so the
    # final step of the 2-replica run has one partial and one empty replica batch.
    fn = per_replica_dataset_fn(100, 16, weighted)
    logs = {}
    for name in ("one_device", "mirrored"):
        strategy = {"name": name, **(two_cpus if name == "mirrored" else {})}
        trainer = make_trainer(fn, model=lambda: helpers.build_model(l2=0.01),
                               strategy=strategy, seed=0)
        history = trainer.fit(epochs=2).history
        logs[name] = (history, trainer.evaluate(), trainer.model.get_weights())
    (h1, e1, w1), (h2, e2, w2) = logs["one_device"], logs["mirrored"]
    np.testing.assert_allclose(h2["loss"], h1["loss"], atol=1e-5)
    np.testing.assert_allclose(h2["accuracy"], h1["accuracy"], atol=1e-6)
    assert e2 == pytest.approx(e1, abs=1e-5)
    for a, b in zip(w1, w2):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_evaluate_equals_keras_evaluate_on_partial_batches(two_cpus, make_trainer):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = helpers.build_model(l2=0.01)
    x, y = helpers.arrays(100)
    sw = np.linspace(0.5, 2.0, 100).astype("float32")
    expected = model.evaluate(tf.data.Dataset.from_tensor_slices((x, y, sw)).batch(16),
                              verbose=0, return_dict=True)
    # A model made outside the scope is rebuilt inside it, weights and compile settings kept.
    trainer = make_trainer(model=model, strategy={"name": "mirrored", **two_cpus})
    assert trainer.model is not model
    results = trainer.evaluate(per_replica_dataset_fn(100, 16, weighted=True))
    assert set(results) == {"loss", "accuracy"}
    assert results["loss"] == pytest.approx(expected["loss"], abs=1e-5)
    assert results["accuracy"] == pytest.approx(expected["compile_metrics"]["accuracy"]
                                                if "compile_metrics" in expected
                                                else expected["accuracy"], abs=1e-6)


def test_steps_per_loop_does_not_change_results(make_trainer):
    fn = per_replica_dataset_fn(100, 16)
    runs = []
    for steps_per_loop in (1, 3, "auto"):
        trainer = make_trainer(fn, strategy="one_device", seed=0, steps_per_loop=steps_per_loop)
        runs.append((trainer.fit(epochs=2).history["loss"], trainer.global_step))
    for loss, step in runs[1:]:
        np.testing.assert_allclose(loss, runs[0][0], atol=1e-6)
        assert step == runs[0][1] == 14


def test_steps_per_epoch_continues_the_data_across_epochs(make_trainer):
    # 7 batches per pass; 5 steps per epoch: epoch 2 reads batches 6, 7 and ends with the
    # pass (as model.fit's); epoch 3 starts a new pass.
    trainer = make_trainer(per_replica_dataset_fn(100, 16), strategy="default", seed=0,
                           steps_per_loop=2)
    history = trainer.fit(epochs=3, steps_per_epoch=5)
    assert trainer.global_step == 5 + 2 + 5
    assert len(history.history["loss"]) == 3


def test_learning_rate_schedule_sees_the_true_step(make_trainer):
    import keras
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([10], [0.1, 0.001])
    trainer = make_trainer(per_replica_dataset_fn(96, 16), strategy="default",
                           optimizer=keras.optimizers.SGD(schedule))
    trainer.fit(epochs=2)  # 12 steps
    assert trainer.global_step == 12
    assert int(trainer.model.optimizer.iterations.numpy()) == 12
    assert float(trainer.model.optimizer.learning_rate.numpy()) == pytest.approx(0.001)


def test_jit_compile_gives_the_same_training(make_trainer):
    fn = per_replica_dataset_fn(100, 16)
    runs = []
    for jit in (False, True):
        trainer = make_trainer(fn, strategy="one_device", seed=0, jit_compile=jit)
        runs.append((trainer.fit(epochs=2).history["loss"], trainer.model.get_weights()))
    np.testing.assert_allclose(runs[1][0], runs[0][0], atol=1e-5)
    for a, b in zip(runs[1][1], runs[0][1]):
        np.testing.assert_allclose(a, b, atol=1e-5)
    with pytest.raises(ValueError, match="`jit_compile=True` works with the 'default' and "
                                         "'one_device' strategies"):
        kt.Trainer(helpers.build_model, fn, strategy={"name": "mirrored", "cpu_devices": 2},
                   jit_compile=True)
