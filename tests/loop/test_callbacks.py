"""Keras callbacks behave as under model.fit."""

import csv

import keras
import numpy as np
import pytest

import helpers
import kerastrain as kt


def dataset_fn(ctx):
    import tensorflow as tf
    x, y = helpers.arrays(96)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(ctx.get_per_replica_batch_size(16))


def make(strategy="default", **kwargs):
    return kt.Trainer(helpers.build_model, dataset_fn, strategy=strategy, seed=0, verbose=0,
                      **kwargs)


def test_early_stopping_stops_training():
    # min_delta is unreachable, so it stops after patience + 1 epochs, as in model.fit.
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=1, min_delta=10.0)
    history = make().fit(epochs=10, callbacks=[stop])
    assert len(history.history["loss"]) == 2
    assert stop.stopped_epoch == 1


def test_csv_logger_writes_one_row_per_epoch(tmp_path, two_cpus):
    path = tmp_path / "log.csv"
    trainer = make({"name": "mirrored", **two_cpus})
    history = trainer.fit(epochs=3, callbacks=[keras.callbacks.CSVLogger(str(path))],
                          validation_dataset_fn=dataset_fn)
    rows = list(csv.DictReader(path.open()))
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    assert set(rows[0]) == {"epoch", "loss", "accuracy", "val_loss", "val_accuracy"}
    np.testing.assert_allclose([float(r["loss"]) for r in rows], history.history["loss"],
                               rtol=1e-6)


def test_learning_rate_scheduler_sets_rate_each_epoch():
    seen = []
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.01 / (epoch + 1))
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: seen.append(
            float(trainer.model.optimizer.learning_rate.numpy())))
    trainer = make()
    history = trainer.fit(epochs=3, callbacks=[schedule, record])
    assert seen == pytest.approx([0.01, 0.005, 0.01 / 3])
    assert history.history["learning_rate"] == pytest.approx(seen)


def test_user_batch_hooks_see_every_batch_with_auto_loops():
    batches = []

    class Count(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            batches.append((batch, logs["loss"]))

    make().fit(epochs=2, callbacks=[Count()])
    assert [b for b, _ in batches] == list(range(6)) * 2
    assert all(np.isfinite(loss) for _, loss in batches)


class Recorder(keras.callbacks.Callback):
    """Every hook call: its name, batch or epoch index, logs (rounded) and, at a train
    batch's begin, the optimizer's step (a begin hook runs before the batch trains)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def record(self, name, *index, logs=None):
        logs = {k: (np.shape(v) if k == "outputs" else round(float(v), 4))
                for k, v in (logs or {}).items()}
        if name == "train_batch_begin":
            logs["iterations"] = int(self.model.optimizer.iterations.numpy())
        self.calls.append((name, *index, sorted(logs.items())))


for _name in ("train", "test", "predict"):
    for _when in ("begin", "end"):
        setattr(Recorder, f"on_{_name}_{_when}", (lambda n: lambda self, logs=None: self.record(
            n, logs=logs))(f"{_name}_{_when}"))
        setattr(Recorder, f"on_{_name}_batch_{_when}", (
            lambda n: lambda self, i, logs=None: self.record(n, i, logs=logs))(
            f"{_name}_batch_{_when}"))
for _when in ("begin", "end"):
    setattr(Recorder, f"on_epoch_{_when}", (lambda n: lambda self, i, logs=None: self.record(
        n, i, logs=logs))(f"epoch_{_when}"))


def compiled(steps_per_execution):
    model = helpers.build_model()
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"],
                  steps_per_execution=steps_per_execution)
    return model


@pytest.mark.parametrize("steps_per_execution,steps_per_loop", [(1, "auto"), (3, 4)])
def test_every_hook_is_called_as_model_fit_evaluate_and_predict_call_it(
        make_trainer, steps_per_execution, steps_per_loop):
    """Each hook of fit (with validation), evaluate and predict, in Keras's order, with its
    batch indices and logs: the batch hooks around every execution of
    `steps_per_execution` batches (0, N, 2N... and N-1, 2N-1..., also after a last shorter
    one), whatever `steps_per_loop`. They were called once per compiled loop (train), once
    per evaluation (test), and never at a train batch's begin."""
    x, y = helpers.arrays(112)  # 7 batches of 16
    fit = dict(batch_size=16, epochs=2, shuffle=False, validation_data=(x[:48], y[:48]))
    theirs, ours = Recorder(), Recorder()
    keras.utils.set_random_seed(0)
    model = compiled(steps_per_execution)
    model.fit(x, y, verbose=0, callbacks=[theirs], **fit)
    model.evaluate(x, y, batch_size=16, verbose=0, callbacks=[theirs])
    model.predict(x, batch_size=16, verbose=0, callbacks=[theirs])
    keras.utils.set_random_seed(0)
    trainer = make_trainer(model=lambda: compiled(steps_per_execution), strategy="one_device",
                           steps_per_loop=steps_per_loop)
    trainer.fit(x, y, callbacks=[ours], **fit)
    trainer.evaluate(x, y, batch_size=16, callbacks=[ours])
    trainer.predict(x, batch_size=16, callbacks=[ours])
    assert ours.calls == theirs.calls
    if steps_per_execution == 3:
        assert [c[1] for c in ours.calls if c[0] == "train_batch_end"] == [2, 5, 8] * 2
        assert [c[1] for c in ours.calls if c[0] == "predict_batch_begin"] == [0, 3, 6]


def test_batch_hooks_with_gradient_accumulation_are_model_fits(make_trainer):
    """With `gradient_accumulation_steps=2` (a step of two batches) a batch hook runs at each
    batch, as `model.fit` runs a step a batch; 7 batches: no begin hook past the last (one
    ran where the data's end applied the held batch)."""
    def model():
        built = helpers.build_model()
        built.compile(optimizer=keras.optimizers.Adam(gradient_accumulation_steps=2),
                      loss="binary_crossentropy", metrics=["accuracy"])
        return built

    x, y = helpers.arrays(112)
    theirs, ours = Recorder(), Recorder()
    model().fit(x, y, batch_size=16, shuffle=False, verbose=0, callbacks=[theirs])
    make_trainer(model=model).fit(x, y, batch_size=16, shuffle=False, callbacks=[ours])
    def hooks(calls):
        return [call[:2] if isinstance(call[1], int) else call[:1] for call in calls]

    assert hooks(ours.calls) == hooks(theirs.calls)


def test_loops_are_free_when_no_callback_needs_every_batch(make_trainer, tmp_path):
    """The progress bar and Keras's callbacks whose batch hooks do nothing in their
    configuration keep kerastrain's loops (hooks once per loop, with the index of its last
    batch); a callback that acts at batches (here `TerminateOnNaN`) has them end at each."""
    from kerastrain.loop import callbacks as callbacks_lib
    loops = []

    class Loops(kt.Action):
        def __call__(self, progress):
            if not progress.epoch_end:
                loops.append(progress.step)

    class Bar(keras.callbacks.ProgbarLogger):
        def on_train_batch_end(self, batch, logs=None):  # a user's own hook
            pass

    calm = [keras.callbacks.ModelCheckpoint(str(tmp_path / "m.weights.h5"),
                                            save_weights_only=True),
            keras.callbacks.TensorBoard(str(tmp_path / "tb"))]
    assert not any(map(callbacks_lib.needs_every_execution, calm))
    assert not callbacks_lib.needs_every_execution(keras.callbacks.ProgbarLogger())
    assert callbacks_lib.needs_every_execution(Bar())
    make_trainer(dataset_fn, steps_per_loop=4).fit(epochs=1, actions=[Loops()],
                                                   callbacks=calm, verbose=2)
    assert loops == [4, 6]
    loops.clear()
    make_trainer(dataset_fn, steps_per_loop=4).fit(
        epochs=1, actions=[Loops()], callbacks=[keras.callbacks.TerminateOnNaN()])
    assert loops == [1, 2, 3, 4, 5, 6]


def test_keras_callbacks_with_a_batch_frequency_see_every_batch(make_trainer, tmp_path):
    """`ModelCheckpoint(save_freq=1)` saves after every batch, as under `model.fit`: with
    kerastrain's own loop sizes it saw the last batch of each loop only."""
    x, y = helpers.arrays(96)

    def saved(fit, where):
        where.mkdir()
        fit(x, y, batch_size=16, epochs=2, callbacks=[keras.callbacks.ModelCheckpoint(
            str(where / "{epoch}-{batch}.weights.h5"), save_weights_only=True, save_freq=2)])
        return sorted(path.name for path in where.iterdir())

    theirs = saved(lambda *a, **k: helpers.build_model().fit(*a, verbose=0, **k),
                   tmp_path / "keras")
    ours = saved(make_trainer(steps_per_loop=4).fit, tmp_path / "kerastrain")
    assert ours == theirs == [f"{e}-{b}.weights.h5" for e in (1, 2) for b in (2, 4, 6)]


class StopAfterTwo(keras.callbacks.Callback):
    """Sets `model.stop_evaluating` and `model.stop_predicting` at the second batch end."""

    def __init__(self):
        super().__init__()
        self.ends = 0

    def on_test_batch_end(self, batch, logs=None):
        self.ends += 1
        self.model.stop_evaluating = self.ends == 2

    def on_predict_batch_end(self, batch, logs=None):
        self.ends += 1
        self.model.stop_predicting = self.ends == 2


def test_a_callback_stops_evaluate_and_predict_after_a_batch_as_under_keras(make_trainer):
    """`model.stop_evaluating` (ignored before) and `model.stop_predicting` end the loop
    after that batch: the logs of the batches seen, the outputs of those batches."""
    x, y = helpers.arrays(96)
    model = helpers.build_model()
    trainer = make_trainer(strategy="one_device")
    for run, weights in ((model, model), (trainer, trainer.model)):
        logs = run.evaluate(x, y, batch_size=16, callbacks=[StopAfterTwo()], return_dict=True)
        assert logs == pytest.approx(weights.evaluate(x[:32], y[:32], return_dict=True,
                                                      verbose=0), rel=1e-5)
        assert run.predict(x, batch_size=16, callbacks=[StopAfterTwo()]).shape == (32, 1)


def test_stop_training_set_by_a_callback_is_respected():
    class StopAfterFirstEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.model.stop_training = True

    trainer = make()
    history = trainer.fit(epochs=5, callbacks=[StopAfterFirstEpoch()])
    assert len(history.history["loss"]) == 1
    assert trainer.global_step == 6


def nan_arrays():
    x, y = helpers.arrays(96)
    # A NaN label: no clip inside the loss can turn it finite, on any CPU (a NaN input can
    # be clipped away by sigmoid -> clip in binary cross-entropy, depending on the CPU).
    y[40] = np.nan  # in batch 2 of 16
    return x, y


def test_terminate_on_nan_stops(make_trainer):
    def nan_fn(ctx):
        import tensorflow as tf
        return tf.data.Dataset.from_tensor_slices(nan_arrays()).batch(16)

    trainer = make_trainer(nan_fn, strategy="default")
    history = trainer.fit(epochs=5, callbacks=[keras.callbacks.TerminateOnNaN()])
    assert trainer.model.stop_training
    assert len(history.history.get("loss", [])) <= 1


def test_terminate_on_nan_sees_the_batch_as_under_model_fit(make_trainer, capsys):
    """`TerminateOnNaN` gets the end hook of the batch whose loss is NaN, as under
    `model.fit`: `raise_error=True` raises there, and by default training stops after that
    batch (validated, as fit does). kerastrain's own stop on a bad loss ended the epoch
    before the callbacks saw the batch: nothing raised, and fit returned `{'loss': [inf]}`."""
    x, y = nan_arrays()
    fit = dict(batch_size=16, epochs=3, shuffle=False, validation_data=(x[:32], y[:32]))
    with pytest.raises(RuntimeError, match="NaN or Inf loss encountered at batch 2"):
        make_trainer().fit(x, y, callbacks=[keras.callbacks.TerminateOnNaN(raise_error=True)],
                           **fit)
    keras.utils.set_random_seed(0)
    model = helpers.build_model()
    theirs = model.fit(x, y, callbacks=[keras.callbacks.TerminateOnNaN()], verbose=0, **fit)
    said = capsys.readouterr().out
    trainer = make_trainer()
    ours = trainer.fit(x, y, callbacks=[keras.callbacks.TerminateOnNaN()], **fit)
    assert "Batch 2: Invalid loss, terminating training" in said
    assert said in capsys.readouterr().out
    assert sorted(ours.history) == sorted(theirs.history)
    assert len(ours.history["loss"]) == 1 and np.isnan(ours.history["loss"][0])
    assert trainer.global_step == int(model.optimizer.iterations.numpy()) == 3


def test_progress_on_a_pipe_prints_one_line_per_epoch(capfd):
    make().fit(epochs=2, verbose=2)
    out = capfd.readouterr().out
    lines = [line for line in out.splitlines() if "loss" in line]
    assert len(lines) == 2 and all("accuracy" in line for line in lines), out
    make().fit(epochs=2, verbose=0)
    assert "loss" not in capfd.readouterr().out


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_user_actions_see_exactly_the_steps_they_ask_for_and_can_stop_training(strategy,
                                                                             two_cpus):
    """`fit(actions=[...])`: an action with a step cadence sees each of its steps exactly
    (the compiled loops of 5 steps stop there), sees each epoch end with its logs (`val_*`
    included), and `progress.request_stop()` ends training after that loop, as
    `model.stop_training` does."""
    seen = []

    class EveryThree(kt.Action):
        def __init__(self):
            self.every = kt.Every(steps=3)

        def steps_to_boundary(self, step):
            return self.every.steps_to_boundary(step)

        def __call__(self, progress):
            if progress.epoch_end:
                seen.append(("end", progress.epoch, sorted(progress.logs)))
            elif self.every.at_step(progress.step):
                seen.append(("at", progress.step))

    class StopAfterTen(kt.Action):
        def __call__(self, progress):
            if progress.step >= 10:
                progress.request_stop()

    trainer = make(strategy if strategy == "default" else {"name": strategy, **two_cpus},
                   steps_per_loop=5)
    history = trainer.fit(epochs=3, validation_dataset_fn=dataset_fn,  # 6 steps an epoch
                          actions=[EveryThree(), StopAfterTen()])
    logs = ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert seen == [("at", 3), ("at", 6), ("end", 0, logs), ("at", 9), ("at", 12),
                    ("end", 1, logs)], seen
    assert trainer.global_step == 12 and len(history.history["loss"]) == 2
    with pytest.raises(TypeError, match=r"`actions` must be a list of kerastrain.Action "
                                        r"instances .* Received an item of type function"):
        trainer.fit(epochs=1, actions=[lambda progress: None])


def test_one_callback_or_action_needs_no_list_as_in_model_fit():
    """`model.fit(callbacks=EarlyStopping(...))` takes one callback (Keras flattens what it
    is given); so does `Trainer.fit`, and `actions=` takes one action likewise."""
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=1, min_delta=10.0)
    seen = []

    class Ends(kt.Action):
        def __call__(self, progress):
            if progress.epoch_end:
                seen.append(progress.epoch)

    history = make().fit(epochs=10, callbacks=stop, actions=Ends())
    assert len(history.history["loss"]) == 2 and stop.stopped_epoch == 1
    assert seen == [0, 1]
    with pytest.raises(TypeError, match=r"Received an item of type int: 5"):
        make().fit(epochs=1, callbacks=[[stop], 5])


def test_validation_inside_fit_runs_the_callbacks_test_hooks_as_model_fit_does(make_trainer):
    # Keras's fit validates through `evaluate` with the fit's callbacks: on_test_begin, then
    # on_test_end with the validation logs, before on_epoch_end (TensorBoard writes its
    # `evaluation_*_vs_iterations` there). They were not called at all.
    class Record(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.calls = []

        def on_test_begin(self, logs=None):
            self.calls.append("test_begin")

        def on_test_end(self, logs=None):
            self.calls.append(("test_end", {k: round(float(v), 5) for k, v in logs.items()}))

        def on_epoch_end(self, epoch, logs=None):
            self.calls.append(("epoch_end", sorted(logs)))

    x, y = helpers.arrays(64)
    theirs, ours = Record(), Record()
    keras.utils.set_random_seed(0)
    helpers.build_model().fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
                              validation_data=(x[:32], y[:32]), callbacks=[theirs])
    keras.utils.set_random_seed(0)
    make_trainer(strategy="one_device").fit(
        x, y, batch_size=16, epochs=2, shuffle=False, validation_data=(x[:32], y[:32]),
        callbacks=[ours])
    assert ours.calls == theirs.calls
    assert ours.calls[0] == "test_begin"


def test_backup_and_restore_resumes_a_fit_an_error_ended_in_the_same_process(tmp_path):
    """BackupAndRestore as its docstring uses it: a fit an exception ends, then the same fit
    again on the same Trainer: Keras resumes from the backup and runs the epochs left;
    kerastrain ran every epoch again (from the weights the error left)."""
    class Interrupt(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                raise RuntimeError("interrupting")

    x = np.arange(60, dtype="float32").reshape(10, 6) / 60
    y = np.zeros((10, 3), "float32")
    fit = dict(epochs=5, batch_size=2, shuffle=False, verbose=0)
    runs = []
    for use_kerastrain in (False, True):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
        backup = keras.callbacks.BackupAndRestore(str(tmp_path / f"backup{use_kerastrain}"))
        train = kt.Trainer(model, strategy="one_device", verbose=0, tensorboard=False).fit \
            if use_kerastrain else model.fit
        with pytest.raises(RuntimeError, match="interrupting"):
            train(x, y, callbacks=[backup, Interrupt()], **fit)
        runs.append(train(x, y, callbacks=[backup], **fit).history["loss"])
    assert len(runs[1]) == len(runs[0]) == 3
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-6)
