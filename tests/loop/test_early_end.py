"""A run a callback ended (EarlyStopping...) is an end: saved as it ended, and a rerun on the
same model_dir trains nothing and says why (docs/checkpoints.md, "Resume rules")."""

import json
import logging
import os
import signal

import keras
import numpy as np
import pytest

import helpers
import kerastrain as kt


def never_improves(**kwargs):
    """Stops after epoch 2: `min_delta` is out of reach, so epoch 1 (0-based) is no
    improvement; its best weights are epoch 0's."""
    return keras.callbacks.EarlyStopping(monitor="loss", patience=1, min_delta=10.0, **kwargs)


def make(make_trainer, model_dir, **options):
    """A Trainer on `model_dir` with checkpoints (no export: slow, and not the point here)."""
    options = {"checkpoint": {"export": False}, **options}
    return make_trainer(helpers.global_batch_dataset_fn(), seed=0, model_dir=model_dir,
                        strategy="default", **options)


def test_a_run_early_stopping_ended_keeps_its_restored_weights_and_a_rerun_trains_nothing(
        tmp_path, make_trainer, caplog):
    snapshots = []
    first = make(make_trainer, tmp_path)
    keep = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: snapshots.append(first.model.get_weights()))
    history = first.fit(epochs=10, callbacks=[never_improves(restore_best_weights=True), keep])
    assert history.epoch == [0, 1] and first.global_step == 12
    ended = first.ended
    assert (ended.epoch, ended.epochs, ended.step, ended.checkpoint) == (2, 10, 12, "ckpt-12")
    assert ended.reason == "EarlyStopping: loss did not improve by more than 10 for 1 epoch"
    assert json.loads((tmp_path / "checkpoints" / "ended.json").read_text())["epoch"] == 2
    # The weights of the end are those on_train_end restored (epoch 0's), not epoch 1's.
    final = first.model.get_weights()
    for a, b in zip(final, snapshots[0]):
        np.testing.assert_array_equal(a, b)
    assert not all(np.array_equal(a, b) for a, b in zip(final, snapshots[1]))
    first.close()

    for epochs in (10, 30):  # the same command, or more epochs: an end is an end
        again = make(make_trainer, tmp_path)
        with caplog.at_level(logging.INFO, logger="kerastrain"):
            history = again.fit(epochs=epochs, callbacks=[never_improves()])
        assert history.epoch == [] and history.history == {}
        assert again.global_step == 12 and again.ended == ended
        for a, b in zip(again.model.get_weights(), final):
            np.testing.assert_array_equal(a, b)
        again.close()
    assert ("where the run ended early at epoch 2 of 10, step 12 (EarlyStopping: loss did not "
            "improve by more than 10 for 1 epoch): nothing left to train") in caplog.text
    assert "restore that checkpoint explicitly" in caplog.text


class StopAtBatch(keras.callbacks.Callback):
    """A user's own stop: `model.stop_training` in a batch hook of the first epoch."""

    def on_train_batch_end(self, batch, logs=None):
        if batch == 2:
            self.model.stop_training = True


def test_a_users_callback_stop_mid_epoch_is_an_end_and_an_explicit_restore_trains_on(
        tmp_path, make_trainer):
    first = make(make_trainer, tmp_path)
    assert first.fit(epochs=3, callbacks=[StopAtBatch()]).epoch == [0]
    ended = first.ended
    # Stopped in epoch 1 of 3, after 3 of its 6 steps.
    assert (ended.epoch, ended.epochs, ended.step) == (1, 3, 3)
    assert ended.reason == "a callback set model.stop_training; callbacks: StopAtBatch"
    first.close()
    again = make(make_trainer, tmp_path)
    assert again.fit(epochs=3).epoch == [] and again.global_step == 3
    again.close()
    # Restoring that checkpoint by name is the opt-in to train on, from exactly where the
    # stop came (the epoch's other 3 steps first), as if nothing had stopped.
    on = make(make_trainer, tmp_path,
              checkpoint={"restore": str(tmp_path / "checkpoints" / ended.checkpoint),
                          "export": False})
    assert on.fit(epochs=3).epoch == [0, 1, 2] and on.global_step == 18
    assert on.ended is None
    on.close()
    # The record named an older checkpoint: a rerun resumes from the newest, as always.
    rerun = make(make_trainer, tmp_path)
    assert rerun.fit(epochs=4).epoch == [3] and rerun.ended is None
    rerun.close()


def test_an_unreadable_record_and_no_model_dir_train_as_before(tmp_path, make_trainer):
    first = make(make_trainer, tmp_path)
    first.fit(epochs=3, callbacks=[StopAtBatch()])
    first.close()
    (tmp_path / "checkpoints" / "ended.json").write_text("{not json")
    again = make(make_trainer, tmp_path)
    # Resumed (mid-epoch, where the stop came) as before there was a record.
    assert again.fit(epochs=2).epoch == [0, 1] and again.global_step == 12
    assert again.ended is None
    again.close()
    # Without a model_dir nothing persists: a second fit trains again, as model.fit does.
    alone = make_trainer(helpers.global_batch_dataset_fn(), seed=0, strategy="default")
    for step in (3, 6):
        assert alone.fit(epochs=3, callbacks=[StopAtBatch()]).epoch == [0]
        assert alone.ended.step == step and alone.ended.checkpoint == ""


def test_a_sigterm_before_a_callbacks_stop_is_no_end(tmp_path, make_trainer):
    """A SIGTERM stops the run before the callback would have: it resumes later."""

    class TerminateThenStop(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            if batch == 4:
                self.model.stop_training = True

    first = make(make_trainer, tmp_path, steps_per_loop=1)
    with pytest.raises(kt.Preempted):
        first.fit(epochs=2, callbacks=[TerminateThenStop()])
    assert first.ended is None
    first.close()
    assert not (tmp_path / "checkpoints" / "ended.json").exists()
    again = make(make_trainer, tmp_path)
    again.fit(epochs=2)
    assert again.global_step == 12 and again.ended is None
