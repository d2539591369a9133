"""on_nonfinite="recover": a poisoned batch is skipped and training ends as if it was never there."""

import json
import logging

import numpy as np
import pytest

import helpers
import kerastrain as kt
from kerastrain.cli import config, template
from kerastrain.cli import training
from kerastrain.loop import recovery
from helpers import read_scalars

BATCHES, BATCH, POISONED = 12, 16, 6  # batch 6 of each pass has NaN labels


def data(poison="nan", drop=False):
    """Global batches of 16 in a fixed order; batch 6 poisoned (NaN labels, or inputs
    x 1000: a finite loss spike), or left out (`drop`)."""
    x, y = helpers.arrays(BATCHES * BATCH)
    bad = slice(POISONED * BATCH, (POISONED + 1) * BATCH)
    x, y = x.copy(), y.copy()
    if poison == "nan":
        y[bad] = np.nan
    elif poison == "spike":
        x[bad] *= 1000.0
    if drop:
        keep = np.r_[0:bad.start, bad.stop:len(x)]
        x, y = x[keep], y[keep]

    def dataset():
        import tensorflow as tf
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    return dataset


def train(strategy, dataset, epochs=2, steps_per_loop=4, **options):
    t = kt.Trainer(helpers.build_model, dataset, strategy=strategy, seed=0, verbose=0,
                   steps_per_loop=steps_per_loop, **options)
    history = t.fit(epochs=epochs)
    return t, history


def max_diff(a, b):
    """Largest difference between two trainers' weights and optimizer variables."""
    pairs = list(zip(a.model.get_weights(), b.model.get_weights())) + [
        (np.asarray(u), np.asarray(v)) for u, v in zip(a.model.optimizer.variables,
                                                      b.model.optimizer.variables)]
    return max(float(np.max(np.abs(u - v))) for u, v in pairs)


def read_texts(run_dir):
    from tensorboard.backend.event_processing import event_accumulator
    acc = event_accumulator.EventAccumulator(run_dir, size_guidance={"tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]
            if acc.SummaryMetadata(tag).plugin_data.plugin_name == "text"}


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_recover_skips_the_poisoned_batch_and_equals_a_run_without_it(
        strategy, two_cpus, tmp_path, caplog):
    options = {"name": strategy, **(two_cpus if strategy == "mirrored" else {})}
    with caplog.at_level(logging.INFO, logger="kerastrain"):
        t, history = train(options, data(), model_dir=str(tmp_path), on_nonfinite="recover",
                           checkpoint={"every_steps": 4})
    clean, clean_history = train(options, data(poison=None, drop=True))
    # Weights and every optimizer slot, as if batch 6 of each pass had never existed.
    assert max_diff(t, clean) <= 1e-6
    assert t.global_step == clean.global_step == 2 * (BATCHES - 1)
    assert history.history["loss"] == pytest.approx(clean_history.history["loss"], rel=1e-6)
    assert t.recoveries == 2  # the batch is in both passes
    # The loop of steps 5-8 held it: replayed one step at a time from ckpt-4, found, skipped.
    ckpt = tmp_path / "checkpoints"
    assert (f"recovered from a non-finite loss (nan) at step 7 (epoch 1): restored checkpoint "
            f"{ckpt / 'ckpt-4'} (step 4), skipped 1 batch (batch 6 of data pass 1); recovery 1 "
            "of at most 3") in caplog.text
    assert f"restored checkpoint {ckpt / 'ckpt-16'} (step 16), skipped 1 batch (batch 6 of " \
           "data pass 2); recovery 2 of at most 3" in caplog.text
    assert read_scalars(str(tmp_path / "logs" / "train"))["recoveries"] == [(7, 1.0), (18, 2.0)]
    texts = read_texts(str(tmp_path / "logs" / "train"))["recovery"]
    assert [s for s, _ in texts] == [7, 18] and "skipped 1 batch" in texts[0][1]
    assert (tmp_path / "export" / "model.keras").exists()  # a run that recovered is exported


def test_recover_without_model_dir_goes_back_to_the_epoch_start(caplog):
    with caplog.at_level(logging.WARNING, logger="kerastrain"):
        t, _ = train("one_device", data(), on_nonfinite="recover")
    clean, _ = train("one_device", data(poison=None, drop=True))
    assert max_diff(t, clean) <= 1e-6
    assert ("restored the state of step 11 kept in memory at the epoch start, skipped 1 batch "
            "(batch 6 of data pass 2); recovery 2 of at most 3") in caplog.text


def test_a_loss_spike_is_skipped_with_spike_factor(caplog):
    # Inputs x 1000: a finite but huge cross-entropy that would wreck the weights. Loops
    # of one step, so that the median holds the 5 loops a spike needs before it.
    with caplog.at_level(logging.WARNING, logger="kerastrain"):
        t, _ = train("one_device", data("spike"), epochs=1, steps_per_loop=1,
                     on_nonfinite="recover", spike_factor=5)
    clean, _ = train("one_device", data(poison=None, drop=True), epochs=1)
    assert max_diff(t, clean) <= 1e-6
    assert "recovered from a loss spike (" in caplog.text and "x the running median" in caplog.text
    # Without it the spike is trained on: the weights differ.
    spiked, _ = train("one_device", data("spike"), epochs=1, on_nonfinite="recover")
    assert spiked.recoveries == 0 and max_diff(spiked, clean) > 1e-3


def test_more_bad_losses_than_max_recoveries_raise_and_leave_the_last_good_state():
    t = kt.Trainer(helpers.build_model, data(), strategy="one_device", seed=0, verbose=0,
                   steps_per_loop=1, on_nonfinite="recover", max_recoveries=1)
    with pytest.raises(recovery.TooManyRecoveries) as raised:
        t.fit(epochs=2)
    message = str(raised.value)
    assert message.startswith("Gave up: a non-finite loss (nan) at step 18 (epoch 2), after 1 "
                              "recoveries in this fit; the model holds the state of step 11")
    assert "lower the learning rate" in message and "Received: max_recoveries=1" in message
    assert t.global_step == 11
    assert all(np.isfinite(w).all() for w in t.model.get_weights())


def test_options_are_checked_with_the_value_received():
    cases = [({"on_nonfinite": "skip"}, "Received: on_nonfinite='skip'"),
             ({"on_nonfinite": "recover", "max_recoveries": 0}, "Received: max_recoveries=0"),
             ({"on_nonfinite": "recover", "spike_factor": 1}, "Received: spike_factor=1"),
             ({"spike_factor": 10.0}, "acts only with on_nonfinite='recover'")]
    for options, expected in cases:
        with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            kt.Trainer(helpers.build_model, strategy="default", **options)
    tree = {"model": {"builder": "kerastrain.examples:build_mlp"},
            "data": {"train": {"builder": "kerastrain.examples:synthetic_data"}},
            "trainer": {"on_nonfinite": "restart", "max_recoveries": 0, "spike_factor": 0.5}}
    with pytest.raises(config.RecipeError) as raised:
        config.validate(tree)
    text = str(raised.value)
    for line in ("trainer.on_nonfinite: expected one of 'stop', 'recover'. Received: 'restart'",
                 "trainer.max_recoveries: expected an int >= 1. Received: 0",
                 "trainer.spike_factor: expected a number > 1 or null. Received: 0.5"):
        assert line in text, text
    written = template.template()
    assert "  on_nonfinite: stop " in written and "  max_recoveries: 3 " in written
    tree["trainer"] = {"spike_factor": 10}
    with pytest.raises(config.RecipeError, match="trainer.spike_factor: acts only with "
                                                 "trainer.on_nonfinite: recover"):
        config.validate(tree)
    tree["trainer"] = {"on_nonfinite": "recover", "max_recoveries": 5, "spike_factor": 10}
    built = training.build_trainer(config.validate(tree))
    assert (built._config.on_nonfinite, built._config.max_recoveries,
            built._config.spike_factor) == ("recover", 5, 10)


@pytest.mark.multiprocess
def test_ps_recover_finishes_skips_and_keeps_the_loss_finite(tmp_path):
    proc = helpers.run_python(["tests/_recover_worker.py", str(tmp_path)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["recoveries"] == 1 and result["weights_finite"]
    assert result["global_step"] == 24  # the steps asked for, bad ones retrained
    assert all(np.isfinite(result["history"]["loss"]))
    assert "recovered from a non-finite loss (nan) at step " in proc.stderr
    # Exact visits: the data position goes on past the skipped batches.
    assert "skipped the " in proc.stderr and " batches scheduled since then (parameter-server " \
        "loops are not replayed" in proc.stderr
    assert [v for _, v in read_scalars(str(tmp_path / "run" / "logs" / "train"))[
        "recoveries"]] == [1.0]


def test_reshuffled_numpy_passes_skip_the_batch_that_holds_the_bad_example(caplog):
    """One poisoned example in NumPy input reshuffled every pass: the batch skipped in each
    epoch is the one holding it in that pass's order (`numpy_data.NumpyData`: a permutation
    keyed from the seed each pass), so recovery re-reads the pass in the same order."""
    import tensorflow as tf
    x, y = helpers.arrays(96)
    y = y.copy()
    y[50] = np.nan
    t = kt.Trainer(helpers.build_model, strategy="one_device", seed=0, verbose=0,
                   steps_per_loop=6, on_nonfinite="recover")
    with caplog.at_level(logging.WARNING, logger="kerastrain"):
        t.fit(x, y, epochs=2, batch_size=BATCH)
    tf.random.set_seed(0)
    orders = helpers.numpy_orders(96, 0)
    expected = [list(next(iter(orders)).numpy()).index(50) // BATCH for _ in range(2)]
    assert t.recoveries == 2 and t.global_step == 10, caplog.text
    for batch, data_pass in zip(expected, (1, 2)):
        assert f"skipped 1 batch (batch {batch} of data pass {data_pass})" in caplog.text
    assert all(np.isfinite(w).all() for w in t.model.get_weights())
