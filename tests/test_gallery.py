"""The gallery (tests/gallery.py) trains under kerastrain as under `model.fit`.

One device and MirroredStrategy (2 logical CPUs): every epoch's loss and metrics equal
Keras `fit`'s within 1e-5 relative, Keras `fit` running under the Trainer's own strategy
object (two MirroredStrategy objects in one process collide in TensorFlow's collective
keys). Parameter servers: one subprocess with a local in-process cluster trains every
example that may train there (finite loss within the example's range) and checks the
refusals of those that may not.
"""

import json
import os

import numpy as np
import pytest

import kerastrain as kt

import gallery

MIRRORED = {"name": "mirrored", "cpu_devices": 2}
RTOL = 1e-5


def max_relative_difference(ours, theirs):
    worst = 0.0
    for key in theirs:
        a, b = np.asarray(ours[key], "float64"), np.asarray(theirs[key], "float64")
        worst = max(worst, float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12))))
    return worst


def run_both(example, strategy, tmp_path):
    """(kerastrain history, model.fit history), same seed, same batches. kerastrain gets a
    compiled model instance, as keras.io code has one (a builder function where a Trainer
    option changes how the model is built), which is then used as after `model.fit`."""
    import keras
    user_model = None if example.trainer_kwargs else example.build()
    try:
        trainer = kt.Trainer(user_model or example.build, strategy=strategy, verbose=0, seed=0,
                             **example.trainer_kwargs)
    except ValueError as e:  # a subclassed model: Keras cannot clone it into the scope
        assert "was created outside the strategy's scope and cannot be rebuilt inside it" in \
            str(e) and "Pass a function that builds and compiles the model" in str(e), e
        assert type(user_model) not in (keras.Sequential, keras.Model) or any(
            type(layer).__module__ == "gallery" for layer in user_model.layers), e
        user_model = None
        trainer = kt.Trainer(example.build, strategy=strategy, verbose=0, seed=0)
    (tmp_path / "ours").mkdir()
    (tmp_path / "theirs").mkdir()
    ours = trainer.fit(epochs=example.epochs, **example.fit_args(str(tmp_path / "ours")))
    if user_model is not None:  # the user's object holds what was trained, and saves
        for a, b in zip(user_model.get_weights(), trainer.model.get_weights()):
            np.testing.assert_array_equal(a, b)
        path = str(tmp_path / "user.keras")
        try:
            user_model.save(path)
            assert os.path.getsize(path) > 0
        except NotImplementedError:  # a subclassed model without get_config: Keras's own
            with pytest.raises(NotImplementedError):  # limit, the same for a fresh model
                example.build().save(str(tmp_path / "fresh.keras"))
        if type(user_model) in (keras.Sequential, keras.Model):  # loads back, as a config
            custom = {k: v for k, v in vars(gallery).items() if isinstance(v, type)
                      and issubclass(v, keras.layers.Layer)}
            loaded = keras.models.load_model(path, compile=False, custom_objects=custom)
            for a, b in zip(loaded.get_weights(), user_model.get_weights()):
                np.testing.assert_array_equal(a, b)
    if example.keras_mirrored or strategy == "one_device":
        with trainer.strategy.scope():
            reference = gallery.build_reference(example)
            if example.keras_by_hand:   # Keras fit under any tf.distribute strategy
                example.keras_by_hand(reference)
    else:  # Keras fails under MirroredStrategy: the single-device result is the reference
        reference = gallery.build_reference(example)
    theirs = reference.fit(epochs=example.epochs, verbose=0,
                           **example.fit_args(str(tmp_path / "theirs")))
    return ours.history, theirs.history


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED], ids=["one_device", "mirrored"])
@pytest.mark.parametrize("name", list(gallery.BY_NAME))
def test_the_gallery_trains_as_under_model_fit(name, strategy, tmp_path):
    example = gallery.BY_NAME[name]
    ours, theirs = run_both(example, strategy, tmp_path)
    assert set(ours) == set(theirs) - set(example.missing_keys), (sorted(ours), sorted(theirs))
    theirs = {k: v for k, v in theirs.items() if k not in example.missing_keys}
    difference = max_relative_difference(ours, theirs)
    print(f"GALLERY {name} {strategy if isinstance(strategy, str) else 'mirrored'} "
          f"max_rel_diff={difference:.3g}")
    for key in theirs:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=RTOL, err_msg=key)
    if name == "callbacks":
        for side in ("ours", "theirs"):
            assert (tmp_path / side / "best.weights.h5").exists()
        ours_csv = (tmp_path / "ours" / "log.csv").read_text().splitlines()
        theirs_csv = (tmp_path / "theirs" / "log.csv").read_text().splitlines()
        assert ours_csv[0].split(",") == theirs_csv[0].split(",")
        assert len(ours_csv) == len(theirs_csv) == 4  # header + 3 epochs: EarlyStopping
        # the rate logged at an epoch end is the one it trained with; then halved
        assert ours["learning_rate"] == pytest.approx([0.05, 0.05, 0.025])
    if name == "backup_and_restore":  # deleted once training ended, as Keras does
        assert not (tmp_path / "ours" / "backup").exists()
        assert not (tmp_path / "theirs" / "backup").exists()


def keras_fit_history(example, directory):
    """`model.fit`'s history of the judged key, on one device."""
    os.makedirs(directory, exist_ok=True)
    reference = gallery.build_reference(example)
    history = reference.fit(epochs=example.epochs, verbose=0, **example.fit_args(directory))
    return history.history[example.ps_key]


@pytest.mark.multiprocess
def test_the_gallery_under_parameter_servers(tmp_path):
    """With one worker (no asynchrony) every example's history equals `model.fit`'s on one
    device (1e-5; the references are computed here while the cluster trains)."""
    import subprocess
    import sys

    import helpers
    out = tmp_path / "ps.json"
    proc = subprocess.Popen([sys.executable, "tests/_gallery_ps_worker.py", str(out)],
                            cwd=helpers.REPO, env=helpers.child_env(TF_CPP_MIN_LOG_LEVEL="2"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        references = {e.name: keras_fit_history(e, str(tmp_path / e.name))
                      for e in gallery.EXAMPLES if e.ps is None}
        output = proc.communicate(timeout=400)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-6000:]
    report = json.loads(out.read_text())
    assert set(report) == set(gallery.BY_NAME)
    for name, outcome in report.items():
        example = gallery.BY_NAME[name]
        if example.ps is not None:
            assert "error" in outcome, (name, outcome)
            assert outcome["type"] == "ValueError", (name, outcome)
            assert __import__("re").search(example.ps, outcome["error"]), (name, outcome)
            assert "Received: strategy='ps'" in outcome["error"], outcome
            continue
        assert "error" not in outcome, (name, outcome)
        difference = max_relative_difference({"k": outcome["loss"]}, {"k": references[name]})
        print(f"GALLERY {name} ps max_rel_diff={difference:.3g}")
        np.testing.assert_allclose(outcome["loss"], references[name], rtol=RTOL, err_msg=name)
        if "user_model" in outcome:  # trained from the user's instance: it holds the result
            assert outcome["user_model"]["weights_equal"], (name, outcome)
            assert outcome["user_model"]["saved_bytes"] > 0, (name, outcome)
    instances = [n for n, o in report.items() if "user_model" in o]
    assert {"custom_layer_add_loss", "multi_io_dict", "batchnorm_convnet"} <= set(instances), \
        instances
    # predict under ps runs on the coordinator, reading the trained variables on the ps
    # (a dict model, a lookup table on the ps, a model with add_loss): as model.predict.
    predicted = {n: o["predict_rel"] for n, o in report.items() if "predict_rel" in o}
    assert set(predicted) == {"multi_io_dict", "string_lookup", "custom_layer_add_loss"}, report
    assert max(predicted.values()) <= 1e-5, predicted
