"""Tiny models and data shared by in-process tests and subprocess workers."""

import json
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np

FEATURES = 6
GLOBAL_BATCH = 16
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def arrays(n=96, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.randn(n, FEATURES).astype("float32")
    y = (x[:, :2].sum(axis=1, keepdims=True) > 0).astype("float32")
    return x, y


def numpy_orders(n, seed):
    """The documented order of kerastrain's shuffled NumPy input (docs/data.md), written
    out independently: a dataset whose k-th iteration yields pass k's permutation of
    range(n). Call after `tf.random.set_seed(seed)` (as a Trainer with `seed` does)."""
    import tensorflow as tf
    keys = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).take(1)
    return keys.map(lambda key: tf.random.experimental.stateless_shuffle(
        tf.range(n, dtype=tf.int64), seed=tf.stack([key, tf.constant(n, tf.int64)])))


def build_model(optimizer="adam", l2=0.0):
    import keras
    reg = keras.regularizers.L2(l2) if l2 else None
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(8, activation="relu", kernel_regularizer=reg),
        keras.layers.Dense(1, activation="sigmoid"),
    ])
    model.compile(optimizer=optimizer, loss="binary_crossentropy", metrics=["accuracy"])
    return model


def build_counting_model():
    """`build_model` behind a layer that counts the examples it trains on, the keras.io way
    (a non-trainable weight, `assign_add` in `call`)."""
    import keras

    class Count(keras.layers.Layer):
        def build(self, input_shape):
            self.count = self.add_weight(shape=(), initializer="zeros", trainable=False,
                                         name="count")

        def call(self, x, training=None):
            if training:
                self.count.assign_add(keras.ops.cast(keras.ops.shape(x)[0], "float32"))
            return x

    inner = build_model()
    model = keras.Sequential([keras.Input((FEATURES,)), Count(name="count")] + inner.layers)
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return model


def global_batch_dataset_fn(n=96, global_batch=GLOBAL_BATCH, seed=0):
    """A dataset_fn whose k-th global batch holds the same examples under every strategy.

    Each input pipeline takes its contiguous slice of every global batch, then
    splits it into per-replica batches, so replica r of pipeline p always sees
    the same examples as a single device would in that position.
    """
    def dataset_fn(ctx):
        import tensorflow as tf
        x, y = arrays(n, seed)
        per_pipeline = global_batch // ctx.num_input_pipelines
        per_replica = ctx.get_per_replica_batch_size(global_batch)
        start = ctx.input_pipeline_id * per_pipeline
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
        ds = ds.map(lambda a, b: (a[start:start + per_pipeline], b[start:start + per_pipeline]))
        return ds.unbatch().batch(per_replica)
    return dataset_fn


def as_interrupted(model_dir):
    """A callback's `model.stop_training` ends a run for good (`checkpoints/ended.json`: a
    rerun trains nothing). Tests that stop a run so to resume it elsewhere forget that record:
    the checkpoint of the stop holds exactly where training stood, as an interruption's."""
    path = os.path.join(str(model_dir), "checkpoints", "ended.json")
    if os.path.exists(path):
        os.remove(path)


# The smallest recipe that validates and trains (an 8-feature MLP on synthetic data): the CLI
# tests append or replace what each one is about.
TINY_RECIPE = """\
model:
  builder: kerastrain.examples:build_mlp
  args: {features: 8, hidden: 8}
data:
  train:
    builder: kerastrain.examples:synthetic_data
    args: {num_examples: 256, features: 8}
  batch_size: 32
"""


def child_env(tests=False, **extra):
    """The environment of a Python process a test starts: the repo importable (and `tests/`
    when `tests`), `tests/_site` first (its sitecustomize keeps scikit-learn unloaded unless
    KERASTRAIN_TEST_SKLEARN=1), unbuffered output, no TF_CONFIG, then `extra`."""
    paths = [REPO, *([os.path.join(REPO, "tests")] if tests else []),
             os.path.join(REPO, "tests", "_site")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def run_jobs(run, argv):
    """A test worker's entry: `argv[1]` is one job (a JSON object, result to `argv[2]`) or a
    JSON list of [job, result path] pairs run in turn in this process, each announced on
    stderr as `@@ job N` so a test can read each job's own log."""
    jobs = json.loads(argv[1])
    if isinstance(jobs, dict):
        run(jobs, argv[2])
        return
    for index, (job, out) in enumerate(jobs):
        print(f"@@ job {index}", file=sys.stderr, flush=True)
        run(job, out)


def run_python(code_or_args, env=None, timeout=420):
    """Run a Python process with the repo importable; return CompletedProcess."""
    full_env = child_env(**{"TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
    args = code_or_args if isinstance(code_or_args, list) else ["-c", code_or_args]
    return subprocess.run([sys.executable, *args], env=full_env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def tf_config(cluster, task_type, index):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


class LocalCluster:
    """A TF_CONFIG cluster of local processes: a free loopback port for each task of `tasks`
    (e.g. `chief=1, worker=2, ps=1`), each task started with its own TF_CONFIG.

    Tests get one from the `tf_config_cluster` fixture, which kills what it started when the
    test ends.
    """

    def __init__(self, **tasks):
        from kerastrain.distribute.cluster import free_port
        self.spec = {job: [f"127.0.0.1:{free_port()}" for _ in range(count)]
                     for job, count in tasks.items()}
        self.processes = []

    def tf_config(self, task_type, index):
        return tf_config(self.spec, task_type, index)

    def env(self, task_type, index, **extra):
        """`child_env` for that task: its TF_CONFIG, TensorFlow's C++ log quiet, then `extra`."""
        return child_env(**{"TF_CONFIG": self.tf_config(task_type, index),
                            "TF_CPP_MIN_LOG_LEVEL": "2", **extra})

    def start(self, task_type, index, args, *, env=None, **popen):
        """Start `python ARGS` as that task, in the repo; its output (stderr with stdout
        unless `popen` says otherwise) is piped."""
        options = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, **popen}
        process = subprocess.Popen([sys.executable, *args], cwd=REPO, text=True,
                                   env=self.env(task_type, index, **(env or {})), **options)
        self.processes.append(process)
        return process

    def serve(self, task_type, index, **popen):
        """Start a ps or worker task that serves until the chief has finished."""
        return self.start(task_type, index, ["-m", "kerastrain.distribute.cluster"], **popen)

    def run_workers(self, script, job, out_prefix, env=None, timeout=300):
        """Run `script JOB OUT_PREFIX{i}` on every worker; (return codes, outputs), one each."""
        procs = [self.start("worker", i, [script, json.dumps(job), f"{out_prefix}{i}"], env=env)
                 for i in range(len(self.spec["worker"]))]
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
        return [p.returncode for p in procs], outputs

    def kill(self):
        """End every process this cluster started (a hung task must not outlive its test)."""
        for process in self.processes:
            process.kill()
            process.wait()
            for stream in (process.stdout, process.stderr):
                if stream:
                    stream.close()


class Child:
    """A Python child process (repo and tests importable) whose output is read as it comes.

    `prefix` runs it through another command (e.g. into another network namespace).
    """

    def __init__(self, args, env=None, prefix=()):
        full_env = child_env(tests=True, **{"TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
        self.process = subprocess.Popen(
            [*prefix, sys.executable, *args], env=full_env, cwd=REPO, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines = []
        self._new = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            with self._new:
                self.lines.append(line.rstrip("\n"))
                self._new.notify_all()

    def wait_for(self, pattern, timeout=240):
        """The match of the first line (old or new) matching `pattern`."""
        deadline = time.monotonic() + timeout
        with self._new:
            while True:
                for line in self.lines:
                    match = re.search(pattern, line)
                    if match:
                        return match
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(f"no line matching {pattern!r}:\n" +
                                         "\n".join(self.lines[-60:]))
                self._new.wait(min(left, 1.0))

    def finish(self, timeout=300):
        """Wait for the process (killed after `timeout` s); its exit code."""
        try:
            code = self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
            self._reader.join(timeout=10)
        return code

    @property
    def text(self):
        return "\n".join(self.lines)


def sigterm_worker(job, out_prefix, delay, start_timeout=120, stop_timeout=120):
    """Run `tests/_worker.py JOB OUT_PREFIX`, and `delay` s after training has begun (its
    `started_marker` file exists) send it SIGTERM.

    Returns (exit code, stderr, the step it says it stopped after or None, `rerun()` that
    runs the same job again to its end and returns the CompletedProcess).
    """
    import signal
    env = child_env(TF_CPP_MIN_LOG_LEVEL="2")
    args = [sys.executable, "tests/_worker.py", json.dumps(job), str(out_prefix)]
    proc = subprocess.Popen(args, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + start_timeout
    while not os.path.exists(job["started_marker"]):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    stderr = proc.communicate(timeout=stop_timeout)[1]
    found = re.search(r"SIGTERM: stopped after step (\d+)", stderr)

    def rerun():
        return subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=300)
    return proc.returncode, stderr, int(found.group(1)) if found else None, rerun


def read_scalars(run_dir):
    """{tag: [(step, value), ...]} read back with TensorBoard's own event reader."""
    import tensorflow as tf
    from tensorboard.backend.event_processing import event_accumulator
    acc = event_accumulator.EventAccumulator(run_dir, size_guidance={"tensors": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        events = acc.Tensors(tag)
        if events and events[0].tensor_proto.dtype == tf.float32.as_datatype_enum:
            # TensorBoard's Scalars tab shows only what carries the scalars plugin's metadata.
            assert acc.SummaryMetadata(tag).plugin_data.plugin_name == "scalars", tag
            out[tag] = [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in events]
    return out


def use_after_fit(model, trainer, directory):
    """What code written for `model.fit` does next with the user's own `model` after
    `trainer.fit`, `trainer = Trainer(model)`: predict, evaluate, fit, save, load.

    Returns a dict of findings (floats and bools) that tests compare.
    """
    import keras
    x, y = arrays(32, seed=5)
    found = {}
    ours = model.predict(x, verbose=0)
    found["predict_vs_trained"] = float(np.max(np.abs(ours - trainer.predict(x))))
    found["iterations_vs_trained"] = int(model.optimizer.iterations.numpy()) - int(
        trainer.model.optimizer.iterations.numpy())
    found["evaluate_loss"] = float(model.evaluate(x, y, verbose=0)[0])
    path = os.path.join(str(directory), "user.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    found["loaded_vs_saved"] = float(np.max(np.abs(loaded.predict(x, verbose=0) - ours)))
    found["loaded_iterations"] = int(loaded.optimizer.iterations.numpy())
    before = [w.copy() for w in model.get_weights()]
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    found["fit_loss_finite"] = bool(np.isfinite(history.history["loss"][0]))
    found["fit_changed_weights"] = max(float(np.max(np.abs(a - b))) for a, b in zip(
        model.get_weights(), before)) > 0
    return found


def check_use_after_fit(found):
    assert found["predict_vs_trained"] <= 1e-5, found
    assert found["iterations_vs_trained"] == 0, found
    assert np.isfinite(found["evaluate_loss"]), found
    assert found["loaded_vs_saved"] <= 1e-6, found
    assert found["loaded_iterations"] > 0, found
    assert found["fit_loss_finite"] and found["fit_changed_weights"], found
