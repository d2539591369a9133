"""Same model, seed and global batches: same weights and epoch loss under every strategy."""

import json

import numpy as np
import pytest

import helpers
import kerastrain as kt

EPOCHS = 2
N = 96  # 6 global batches of 16


def train(strategy, n=N):
    trainer = kt.Trainer(helpers.build_model, helpers.global_batch_dataset_fn(n),
                         strategy=strategy, seed=0, verbose=0)
    history = trainer.fit(epochs=EPOCHS)
    return trainer, history.history


@pytest.fixture(scope="module")
def reference():
    trainer, history = train("one_device")
    return trainer.model.get_weights(), history, trainer.global_step


def assert_same(weights, history, reference):
    ref_weights, ref_history, _ = reference
    for w, r in zip(weights, ref_weights):
        np.testing.assert_allclose(w, r, atol=1e-5, rtol=0)
    np.testing.assert_allclose(history["loss"], ref_history["loss"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(history["accuracy"], ref_history["accuracy"], atol=1e-6, rtol=0)


def test_one_device_matches_keras_model_fit(reference):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = helpers.build_model()
    x, y = helpers.arrays(N)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(helpers.GLOBAL_BATCH)
    history = model.fit(ds, epochs=EPOCHS, verbose=0, shuffle=False)
    ref_weights, ref_history, global_step = reference
    for w, r in zip(model.get_weights(), ref_weights):
        np.testing.assert_allclose(w, r, atol=1e-5, rtol=0)
    np.testing.assert_allclose(history.history["loss"], ref_history["loss"], atol=1e-5)
    assert global_step == EPOCHS * N // helpers.GLOBAL_BATCH


@pytest.mark.parametrize("name", ["mirrored", "central_storage"])
def test_two_logical_cpus_match_one_device(name, two_cpus, reference):
    trainer, history = train({"name": name, **two_cpus})
    assert trainer.strategy.num_replicas_in_sync == 2
    assert_same(trainer.model.get_weights(), history, reference)
    assert trainer.global_step == reference[2]


@pytest.mark.multiprocess
def test_multi_worker_mirrored_two_processes_match_one_device(tmp_path, reference,
                                                              tf_config_cluster):
    job = {"strategy": "multi_worker_mirrored", "epochs": EPOCHS, "predict": True}
    codes, outputs = tf_config_cluster(worker=2).run_workers("tests/_worker.py", job,
                                                             str(tmp_path / "w"))
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    for i in range(2):
        result = json.loads((tmp_path / f"w{i}.json").read_text())
        weights = list(np.load(tmp_path / f"w{i}.npz").values())
        assert_same(weights, result["history"], reference)
        assert result["global_step"] == reference[2]
        assert result["is_chief"] == (i == 0)
        # Trainer.predict on each worker: every example, in order, as model.predict gives.
        model = helpers.build_model()
        model.set_weights(reference[0])
        np.testing.assert_allclose(result["predict"], model.predict(helpers.arrays(N)[0],
                                   verbose=0), rtol=1e-5, atol=1e-6)
