"""Gradient accumulation (`gradient_accumulation_steps` on the optimizer) under every strategy.

k batches of B examples make one update equal to one batch of k x B, and the iteration
counts Keras keeps (the schedule's, Adam's) are Keras's. Multi-process strategies (multi-worker
mirrored, parameter servers) run in `_accumulation_worker.py` processes, which import this file's
`data`, `builder` and `StopAfter`.
"""

import json

import numpy as np
import pytest

import keras

import helpers
import kerastrain as kt

MIRRORED = {"name": "mirrored", "cpu_devices": 2}


def data(n, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.randn(n, 8).astype("float32")
    return x, (x[:, :1] > 0).astype("float32")


def builder(steps, *, batchnorm=False, schedule=False):
    def build():
        keras.utils.set_random_seed(1)
        layers = [keras.Input((8,)),
                  keras.layers.Dense(16, activation="relu",
                                     kernel_regularizer=keras.regularizers.L2(0.01))]
        if batchnorm:
            layers.append(keras.layers.BatchNormalization())
        model = keras.Sequential(layers + [keras.layers.Dense(1)])
        rate = (keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=3, decay_rate=0.5)
                if schedule else 0.05)
        model.compile(optimizer=keras.optimizers.Adam(rate, gradient_accumulation_steps=steps),
                      loss=keras.losses.BinaryCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        return model
    return build


class StopAfter(keras.callbacks.Callback):
    """Stops a fit after `steps` batch hooks: one per batch under synchronous strategies
    (as in fit), one per step (k batches) under ps."""

    def __init__(self, steps):
        super().__init__()
        self.steps = steps

    def on_train_batch_end(self, batch, logs=None):
        self.steps -= 1
        if self.steps <= 0:
            self.model.stop_training = True


def max_difference(a, b):
    return max(float(np.abs(p - q).max()) for p, q in zip(a.get_weights(), b.get_weights()))


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED])
def test_four_batches_of_64_make_the_update_of_one_batch_of_256(strategy):
    """258 examples: each epoch is one update from 4 x 64 and one from the last 2 examples
    (the data ends inside the group), as with batches of 256; the loop's length does not
    matter (3 steps per loop cut groups of batches nowhere)."""
    x, y = data(258)
    accumulated = kt.Trainer(builder(4), strategy=strategy, verbose=0, steps_per_loop=3)
    history = accumulated.fit(x, y, batch_size=64, epochs=2, shuffle=False).history
    whole = kt.Trainer(builder(None), strategy=strategy, verbose=0)
    reference = whole.fit(x, y, batch_size=256, epochs=2, shuffle=False).history
    assert max_difference(accumulated.model, whole.model) < 1e-5
    # A step is an update: 2 an epoch, and Keras's counter says the same.
    assert accumulated.global_step == whole.global_step == 4
    assert int(accumulated.model.optimizer.iterations) == 4
    np.testing.assert_allclose(history["loss"], reference["loss"], rtol=1e-6)
    assert history["accuracy"] == reference["accuracy"]


@pytest.mark.parametrize("strategy, batchnorm", [("one_device", True), (MIRRORED, False)])
def test_accumulation_equals_keras_fit_with_its_counts(strategy, batchnorm):
    """Keras's own accumulation on one device (Adam, a decaying schedule) and kerastrain's
    agree: weights, the schedule (read at each group's last batch), Adam's step (updates).
    With BatchNormalization (statistics of each batch) on one device only: under mirrored
    each replica normalises its half of a batch."""
    x, y = data(512)
    reference = builder(4, batchnorm=batchnorm, schedule=True)()
    expected = reference.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0).history
    trainer = kt.Trainer(builder(4, batchnorm=batchnorm, schedule=True), strategy=strategy,
                         verbose=0)
    history = trainer.fit(x, y, batch_size=64, epochs=2, shuffle=False).history
    assert max_difference(trainer.model, reference) < 1e-5
    np.testing.assert_allclose(history["loss"], expected["loss"], rtol=1e-5)
    optimizer = trainer.model.optimizer
    assert int(optimizer.iterations) == int(reference.optimizer.iterations) == 4
    assert int(optimizer._iterations.numpy()) == int(reference.optimizer._iterations.numpy()) == 16
    # No Keras accumulators were built: kerastrain accumulates, Keras's would stay zero.
    assert not getattr(optimizer, "_accumulated_gradients", None)


def test_batch_statistics_make_accumulated_batches_differ_from_one_big_batch():
    """BatchNormalization normalises each batch of 64 by its own statistics: 4 x 64 is not one
    batch of 256 for such a model (in Keras neither), only for models without batch statistics."""
    x, y = data(256)
    small = kt.Trainer(builder(4, batchnorm=True), strategy="one_device", verbose=0)
    small.fit(x, y, batch_size=64, epochs=1, shuffle=False)
    big = kt.Trainer(builder(None, batchnorm=True), strategy="one_device", verbose=0)
    big.fit(x, y, batch_size=256, epochs=1, shuffle=False)
    assert max_difference(small.model, big.model) > 1e-4


def test_resuming_mid_epoch_skips_whole_groups_of_batches(tmp_path):
    """A checkpoint after 1 of 3 updates (4 batches each) resumes at batch 4: the resumed run
    ends where an uninterrupted one does."""
    x, y = data(384)

    class StopAfterOneStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):  # called for every batch, as in fit
            self.model.stop_training = batch == 3

    first = kt.Trainer(builder(4), strategy=MIRRORED, verbose=0, steps_per_loop=1,
                       model_dir=str(tmp_path / "run"), checkpoint={"every_steps": 1})
    first.fit(x, y, batch_size=32, epochs=1, shuffle=False, callbacks=[StopAfterOneStep()])
    assert first.global_step == 1
    helpers.as_interrupted(tmp_path / "run")
    resumed = kt.Trainer(builder(4), strategy=MIRRORED, verbose=0,
                         model_dir=str(tmp_path / "run"))
    resumed.fit(x, y, batch_size=32, epochs=1, shuffle=False)
    straight = kt.Trainer(builder(4), strategy=MIRRORED, verbose=0)
    straight.fit(x, y, batch_size=32, epochs=1, shuffle=False)
    assert resumed.global_step == straight.global_step == 3
    assert max_difference(resumed.model, straight.model) < 1e-6


class KernelWatch(keras.callbacks.Callback):
    """A user's per-batch callback: the output kernel and the logs at every batch end."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_end(self, batch, logs=None):
        kernel = np.array(self.model.layers[-1].kernel.numpy())
        self.seen.append((batch, kernel, dict(logs or {})))


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED])
def test_a_per_batch_callback_sees_the_model_fit_shows_it(strategy):
    """Under `model.fit` with 4 batches per update, a callback sees the kernel change at
    batches 3 and 7 only (Keras applies at every 4th); kerastrain runs one batch per loop
    for such a callback and applies at the same batches: same indices, kernels and logs.
    10 batches an epoch: the last group (2 batches) is applied where the data ends."""
    x, y = data(160)
    reference = builder(4)()
    theirs = KernelWatch()
    reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[theirs])
    ours = KernelWatch()
    trainer = kt.Trainer(builder(4), strategy=strategy, verbose=0)
    history = trainer.fit(x, y, batch_size=16, epochs=1, shuffle=False, callbacks=[ours])
    first_epoch = theirs.seen[:10]
    assert history.history["loss"][0] == pytest.approx(first_epoch[9][2]["loss"], rel=1e-5)
    assert [b for b, _, _ in ours.seen] == [b for b, _, _ in first_epoch] == list(range(10))
    changed = [i for i in range(1, 10) if not np.array_equal(ours.seen[i][1], ours.seen[i - 1][1])]
    assert changed == [3, 7], changed
    for (_, mine, my_logs), (_, keras_kernel, keras_logs) in zip(ours.seen[:8], first_epoch):
        np.testing.assert_allclose(mine, keras_kernel, rtol=1e-5, atol=1e-6)
        assert my_logs["loss"] == pytest.approx(keras_logs["loss"], rel=1e-5)
    assert trainer.global_step == 3  # two groups of 4 and one of 2


def _model_fit_states(n, epochs, batch=64):
    """What `model.fit` alone leaves: the optimizer's variables after each run of `epochs`
    (a list: `epochs` = (1, 2, 1) runs fit three times), and the weights at the end."""
    x, y = data(n)
    reference, states = builder(4)(), []
    for run in epochs:
        reference.fit(x, y, batch_size=batch, epochs=run, shuffle=False, verbose=0)
        states.append([np.array(v.numpy()) for v in reference.optimizer.variables])
    return states, reference.get_weights()


def _check_optimizer(variables, expected):
    """The user's optimizer holds the state `model.fit` would leave (Keras's accumulators
    among it, empty between updates), variable by variable."""
    assert len(variables) == len(expected)
    for got, want in zip(variables, expected):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("strategy, prior", [
    ("one_device", False), ("one_device", True), (MIRRORED, False), (MIRRORED, True),
    ("default", False), ("default", True)], ids=[
        "one_device", "one_device-fitted", "mirrored", "mirrored-fitted", "in_place",
        "in_place-fitted"])
def test_the_users_model_object_goes_on_with_model_fit_as_after_model_fit(strategy, prior):
    """`Trainer(model).fit` between (or before) `model.fit` calls on the user's own object:
    the object ends with the optimizer state `model.fit` would leave (Keras's batch count,
    learning rate, Adam's moments, its accumulators: kerastrain's copy has none), and a
    later `model.fit` goes on as after `model.fit` alone; an earlier one's state is carried
    into the copy. It was left untrained (iterations 0, empty slots). Under "default" and "one_device" the
    object itself trains: its optimizer still gets Keras's accumulators, which a later
    `model.fit` needs."""
    x, y = data(512)
    runs = (1, 2, 1) if prior else (2, 1)
    states, weights = _model_fit_states(512, runs)
    model = builder(4)()
    if prior:
        model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    trainer = kt.Trainer(model, strategy=strategy, verbose=0)
    trainer.fit(x, y, batch_size=64, epochs=2, shuffle=False)
    assert (trainer.model is model) == (strategy in ("default", "one_device"))  # as it is
    _check_optimizer([v.numpy() for v in model.optimizer.variables], states[-2])
    assert int(model.optimizer.iterations) == (6 if prior else 4)  # 2 updates an epoch
    model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    _check_optimizer([v.numpy() for v in model.optimizer.variables], states[-1])
    assert max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), weights)) < 1e-5


def test_a_group_a_model_fit_left_unfinished_is_dropped_and_said(caplog):
    """7 batches of 4 per update: `model.fit` ends holding 3 batches' gradients in Keras's
    accumulators. kerastrain's own accumulation cannot take them: a warning says they are
    dropped, and the count goes back to the group's start (4 batches, 1 update) so that
    Adam's step goes on from the updates made."""
    import logging
    x, y = data(448)
    model = builder(4)()
    model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    assert int(model.optimizer._iterations.numpy()) == 7
    trainer = kt.Trainer(model, strategy="one_device", verbose=0)
    logging.getLogger("kerastrain").addHandler(caplog.handler)
    try:
        trainer.fit(x[:256], y[:256], batch_size=64, epochs=1, shuffle=False)
    finally:
        logging.getLogger("kerastrain").removeHandler(caplog.handler)
    assert "held the gradients of 3 batch(es) of an unfinished group" in caplog.text
    assert int(model.optimizer._iterations.numpy()) == 8 and int(model.optimizer.iterations) == 2
    assert all(not np.any(v.numpy()) for v in model.optimizer._accumulated_gradients)


def _reference(n, epochs):
    """Weights and logs of one device trained on batches of 256, no accumulation."""
    x, y = data(n)
    trainer = kt.Trainer(builder(None), strategy="one_device", verbose=0)
    history = trainer.fit(x, y, batch_size=256, epochs=epochs, shuffle=False).history
    return trainer.model.get_weights(), history


def _check(result, weights, history, steps):
    assert result["global_step"] == result["iterations"] == steps
    got = [np.asarray(w) for w in result["weights"]]
    assert max(float(np.abs(a - b).max()) for a, b in zip(got, weights)) < 1e-5
    np.testing.assert_allclose(result["history"]["loss"], history["loss"], rtol=1e-5)


@pytest.mark.multiprocess
def test_accumulation_under_multi_worker_mirrored_and_parameter_servers(tmp_path,
                                                                       tf_config_cluster):
    """4 x 64 equals one batch of 256 on 2 multi-worker mirrored workers (258 examples: a
    partial group) and under parameter servers (one worker, so no asynchrony; 512 examples:
    workers read repeated data, so every group is whole). Both clusters run at once.

    Under ps, a second job trains the user's own object, fitted by `model.fit` before: the
    copy goes on from its step count, and the object ends with the optimizer state
    `model.fit` would leave (its learning rate was 0.0: the variable made before the
    cluster connected got new storage and never the trained value), so a later `model.fit`
    goes on as after `model.fit` alone."""
    import subprocess
    import sys
    ps_job = {"strategy": {"name": "ps", "num_workers": 1, "num_ps": 1}, "n": 512, "k": 4,
              "batch": 64, "epochs": 2, "steps_per_loop": 1}
    ps_jobs = [[ps_job, str(tmp_path / "ps")],
               [dict(ps_job, instance=True), str(tmp_path / "ps_instance")]]
    env = helpers.child_env(TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    ps = subprocess.Popen([sys.executable, "tests/_accumulation_worker.py", json.dumps(ps_jobs)],
                          cwd=helpers.REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        mwm_job = {"strategy": "multi_worker_mirrored", "n": 258, "k": 4, "batch": 64,
                   "epochs": 2}
        codes, outputs = tf_config_cluster(worker=2).run_workers(
            "tests/_accumulation_worker.py", mwm_job, str(tmp_path / "w"))
        ps_output = ps.communicate(timeout=300)[0]
    finally:
        ps.kill()
    assert codes == [0, 0], "\n".join(o[-4000:] for o in outputs)
    assert ps.returncode == 0, ps_output[-4000:]
    weights, history = _reference(258, 2)
    for i in range(2):
        _check(json.loads((tmp_path / f"w{i}.json").read_text()), weights, history, 4)
    weights, history = _reference(512, 2)
    _check(json.loads((tmp_path / "ps.json").read_text()), weights, history, 4)
    instance = json.loads((tmp_path / "ps_instance.json").read_text())
    states, weights = _model_fit_states(512, (1, 2, 1))
    assert instance["global_step"] == 4 and instance["iterations"] == 6
    _check_optimizer(instance["user_optimizer"], states[1])
    assert max(float(np.abs(np.asarray(a) - b).max())
               for a, b in zip(instance["user_weights_after_fit"], weights)) < 1e-5


def _leg(strategy, k, model_dir, stop_after=None, epochs=3):
    """One run of a chain in this process: resume from model_dir, train, save every step."""
    x, y = data(256)
    helpers.as_interrupted(model_dir)  # the leg before stopped to resume here
    trainer = kt.Trainer(builder(k), strategy=strategy, verbose=0, steps_per_loop=1,
                         model_dir=str(model_dir), checkpoint={"every_steps": 1})
    trainer.fit(x, y, batch_size=16, epochs=epochs, shuffle=False,
                callbacks=[StopAfter(stop_after)] if stop_after else None)
    trainer.close()
    return trainer


@pytest.mark.multiprocess
def test_a_checkpoint_resumes_under_any_other_strategy_at_the_same_batch(tmp_path, caplog):
    """Every strategy keeps the data position in batches, so a run stopped mid-epoch under
    one strategy resumes under another at the batch where it stood. With 4 batches a step:
    one_device -> ps -> mirrored; with 1: ps -> mirrored -> one_device (ps with one worker:
    no asynchrony). Each chain ends with the weights of one run that never stopped. The
    two ps legs run one after another in one process (each its own Trainer)."""
    import subprocess
    import sys
    chains = {4: tmp_path / "k4", None: tmp_path / "k1"}
    _leg("one_device", 4, chains[4], stop_after=4)      # 1 step: 4 of the pass's 16 batches
    ps_jobs = {4: {"stop_after": 5}, None: {"stop_after": 5}}  # k=4: into epoch 2; k=1: epoch 1
    env = helpers.child_env(tests=True, TF_CPP_MIN_LOG_LEVEL="2")
    for k, job in ps_jobs.items():
        job.update(strategy={"name": "ps", "num_workers": 1, "num_ps": 1}, n=256, k=k,
                   batch=16, epochs=3, steps_per_loop=1, model_dir=str(chains[k]))
    proc = subprocess.Popen(
        [sys.executable, "tests/_accumulation_worker.py",
         json.dumps([[job, str(tmp_path / f"ps{k}")] for k, job in ps_jobs.items()])],
        cwd=helpers.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output = proc.communicate(timeout=300)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-4000:]
    logs = output.split("@@ job ")[1:]
    assert [int(log.split("\n", 1)[0]) for log in logs] == [0, 1], output[-4000:]
    outputs = dict(zip(ps_jobs, logs))
    assert "the data continues at pass 1, batch 4 of 16" in outputs[4]
    with caplog.at_level("INFO", logger="kerastrain"):
        resumed_4 = _leg(MIRRORED, 4, chains[4])                  # ps stopped at step 6
        _leg(MIRRORED, None, chains[None], stop_after=20)         # ps stopped at step 5
        resumed_1 = _leg("one_device", None, chains[None])
    assert "step 6, 2 steps into epoch 2 of 3" in caplog.text, caplog.text
    assert "step 25, 9 steps into epoch 2 of 3" in caplog.text, caplog.text
    for k, resumed in ((4, resumed_4), (None, resumed_1)):
        x, y = data(256)
        straight = kt.Trainer(builder(k), strategy="one_device", verbose=0)
        straight.fit(x, y, batch_size=16, epochs=3, shuffle=False)
        assert resumed.global_step == straight.global_step == 48 // (k or 1)
        assert max_difference(resumed.model, straight.model) < 1e-5, k
