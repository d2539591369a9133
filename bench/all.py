"""The whole speed table (issue 16) in one command: every input form and strategy vs its baseline.

Each section runs in its own process (mirrored needs the CPU split before
TensorFlow starts; ps its own local cluster), with configurations taking turns
one epoch each (bench/_rounds.py); ratios are medians of within-round ratios.
Workload: the core MLP (64 features, 2 x 256 hidden, Adam), global batch 256,
65,536 synthetic examples (`kerastrain.examples`).

Sections:
  readme    the README's dataset_fn(ctx) (`from_tensor_slices(...).batch(...).prefetch`):
            kerastrain defaults vs a bare in-memory loop (ceiling), vs model.fit defaults on
            the same pipeline, vs model.fit with steps_per_execution = kerastrain's loop size
  numpy     NumPy arrays: kerastrain vs the ceiling and model.fit(x, y, batch_size=256)
  files     a global tf.data of TFRecord files (`kt.data.files`) vs the same model from memory
  mirrored  2 logical CPUs: vs a bare strategy.run loop (same steps per call), vs Keras fit
  ps        local cluster of 2 workers + 1 ps: vs a bare ClusterCoordinator loop
  outputs   TensorBoard logging on/off (wall and CPU); checkpoint save/restore vs bare
            tf.train.Checkpoint (bench/checkpoint.py)
  precision mixed_bfloat16 vs float32, kerastrain on the README pipeline (no target: on CPUs
            without bfloat16 instructions its matrix multiplications are emulated)

`--real-models` also runs the real-model benchmarks after the table, each printing its own:
bench/real_models.py (keras.io convnet, Transformer and recommender against `fit` defaults,
the best `fit` and a bare loop, on one_device, mirrored and ps), bench/multi_worker.py (two
local workers under multi-worker mirrored) and bench/jit_auto.py (what `jit_compile="auto"`
chooses, against XLA on and off).

    python bench/all.py [--quick] [--only readme,numpy] [--real-models] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from _rounds import FitEpochs, interleave, machine, ratio  # noqa: E402

N, FEATURES, BATCH = 65536, 64, 256
SECTIONS = ("readme", "numpy", "files", "mirrored", "ps", "outputs", "precision")


# -- what the sections time ------------------------------------------------------------

def arrays():
    from kerastrain import examples
    return examples.synthetic_binary(N, FEATURES)


def readme_dataset_fn(x, y):
    """The README's dataset_fn: what a Keras user writes."""
    def dataset_fn(ctx):
        import tensorflow as tf
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(
            ctx.get_per_replica_batch_size(BATCH)).prefetch(tf.data.AUTOTUNE)
    return dataset_fn


def kerastrain_run(data, **options):
    import kerastrain as kt
    from kerastrain import examples
    return FitEpochs(kt.Trainer(examples.build_mlp, data, seed=0, verbose=0, **options))


class Ceiling:
    """Bare loop: batches already in memory as one tensor, one tf.function call per epoch."""

    def __init__(self, x, y):
        import keras
        import tensorflow as tf

        from kerastrain import examples
        keras.utils.set_random_seed(0)
        model = examples.build_mlp()
        loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
        optimizer = model.optimizer
        optimizer.build(model.trainable_variables)
        steps = N // BATCH
        xb = tf.constant(x[:steps * BATCH].reshape(steps, BATCH, FEATURES))
        yb = tf.constant(y[:steps * BATCH].reshape(steps, BATCH, 1))

        @tf.function
        def epoch():
            for i in tf.range(steps):
                with tf.GradientTape() as tape:
                    loss = loss_fn(yb[i], model(xb[i], training=True))
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply(grads, model.trainable_variables)

        self.epoch = epoch
        self.epoch()


class ModelFit:
    """Keras `model.fit` on `data` (a dataset, or (x, y) arrays with batch 256)."""

    def __init__(self, data, steps_per_execution=1, strategy=None):
        import contextlib

        import keras

        from kerastrain import examples
        keras.utils.set_random_seed(0)
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            self.model = examples.build_mlp()
            if steps_per_execution != 1:
                self.model.compile(
                    optimizer=keras.optimizers.Adam(1e-3),
                    loss=keras.losses.BinaryCrossentropy(from_logits=True),
                    metrics=[keras.metrics.BinaryAccuracy(threshold=0.0, name="accuracy")],
                    steps_per_execution=steps_per_execution)
        self.data = data
        self.epoch()

    def epoch(self):
        if isinstance(self.data, tuple):
            self.model.fit(*self.data, batch_size=BATCH, epochs=1, verbose=0)
        else:
            self.model.fit(self.data, epochs=1, verbose=0)


def _global(dataset_fn):
    import tensorflow as tf
    return dataset_fn(tf.distribute.InputContext())


def section_readme(rounds):
    x, y = arrays()
    fn = readme_dataset_fn(x, y)
    kt_run = kerastrain_run(fn)
    loop = kt_run.trainer.steps_per_loop  # what "auto" resolved to
    runners = {"kerastrain defaults": kt_run, "ceiling": Ceiling(x, y),
               "model.fit defaults": ModelFit(_global(fn)),
               f"model.fit steps_per_execution={loop}": ModelFit(_global(fn), loop)}
    wall, cpu = interleave(runners, rounds, N)
    k = "kerastrain defaults"
    return [row("readme", "x ceiling", wall, cpu, k, "ceiling", 0.9),
            row("readme", "x model.fit defaults", wall, cpu, k, "model.fit defaults", 1.6),
            row("readme", f"x model.fit steps_per_execution={loop}", wall, cpu, k,
                f"model.fit steps_per_execution={loop}", 1.1)], wall


def section_numpy(rounds):
    x, y = arrays()
    runners = {"kerastrain defaults": FitEpochs(_numpy_trainer(), dataset_fn=(x, y),
                                                batch_size=BATCH),
               "ceiling": Ceiling(x, y), "model.fit defaults": ModelFit((x, y))}
    wall, cpu = interleave(runners, rounds, N)
    k = "kerastrain defaults"
    return [row("numpy", "x ceiling", wall, cpu, k, "ceiling", 0.95),
            row("numpy", "x model.fit defaults", wall, cpu, k, "model.fit defaults", 2.2)], wall


def _numpy_trainer():
    import kerastrain as kt
    from kerastrain import examples
    return kt.Trainer(examples.build_mlp, seed=0, verbose=0)


def section_files(rounds):
    import tempfile

    import kerastrain as kt
    from kerastrain import examples
    x, y = arrays()
    directory = tempfile.mkdtemp(prefix="kerastrain-bench-files-")
    examples.write_tfrecords(directory, x, y, num_files=8)
    files = kt.data.files(os.path.join(directory, "*.tfrecord"), examples.example_parser(),
                          batch_size=BATCH)
    # Memory read two ways: kerastrain's default (slices read inside the compiled loop)
    # and through tf.data, as the files are (no target: it says what the files cost).
    runners = {"kerastrain, TFRecord files": kerastrain_run(lambda: files),
               "kerastrain, memory": kerastrain_run(readme_dataset_fn(x, y)),
               "kerastrain, memory via tf.data": kerastrain_run(
                   readme_dataset_fn(x, y), tuning={"in_step_batches": False})}
    wall, cpu = interleave(runners, rounds, N)
    return [row("files", "files x memory", wall, cpu, "kerastrain, TFRecord files",
                "kerastrain, memory", 0.9),
            row("files", "files x memory via tf.data", wall, cpu,
                "kerastrain, TFRecord files", "kerastrain, memory via tf.data", float("nan"))], wall


class BareMirrored:
    """A bare `strategy.run` loop, `steps` steps per tf.function call, the user's pipeline."""

    def __init__(self, strategy, dataset_fn, steps):
        import keras
        import tensorflow as tf

        from kerastrain import examples
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = examples.build_mlp()
            model.optimizer.build(model.trainable_variables)
        loss_fn = keras.losses.BinaryCrossentropy(from_logits=True, reduction="sum")
        data = strategy.distribute_datasets_from_function(dataset_fn)

        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True)) / BATCH
            grads = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply(grads, model.trainable_variables)

        @tf.function
        def loop(iterator):
            for _ in tf.range(steps):
                optional = iterator.get_next_as_optional()
                if not optional.has_value():
                    break
                strategy.run(step, args=optional.get_value())

        def epoch():
            iterator = iter(data)
            for _ in range(-(-(N // BATCH) // steps)):
                loop(iterator)
        self.epoch = epoch
        self.epoch()


def section_mirrored(rounds):
    import kerastrain as kt
    x, y = arrays()
    fn = readme_dataset_fn(x, y)
    spec = {"name": "mirrored", "cpu_devices": 2}
    kt_run = kerastrain_run(fn, strategy=spec)
    loop = kt_run.trainer.steps_per_loop
    strategy = kt_run.trainer.strategy
    runners = {"kerastrain defaults": kt_run,
               f"bare strategy.run loop, {loop} steps per call": BareMirrored(strategy, fn, loop),
               "Keras model.fit": ModelFit(_global(fn), strategy=strategy)}
    wall, cpu = interleave(runners, rounds, N)
    k = "kerastrain defaults"
    assert kt.build_strategy(spec).strategy is strategy  # one MirroredStrategy per device set
    return [row("mirrored", "x bare strategy.run loop", wall, cpu, k,
                f"bare strategy.run loop, {loop} steps per call", 0.9),
            row("mirrored", "x Keras model.fit", wall, cpu, k, "Keras model.fit", 1.3)], wall


class BareCoordinator:
    """A bare ClusterCoordinator loop scheduling a `steps`-step function per closure."""

    def __init__(self, built, dataset_fn, steps, loop):
        import keras
        import tensorflow as tf

        from kerastrain import examples
        keras.utils.set_random_seed(0)
        strategy, coordinator = built.strategy, built.coordinator
        with strategy.scope():
            model = examples.build_mlp()
            model.optimizer.build(model.trainable_variables)
        loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

        @tf.function
        def per_worker():
            return dataset_fn(tf.distribute.InputContext()).repeat()
        iterator = iter(coordinator.create_per_worker_dataset(per_worker))

        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply(grads, model.trainable_variables)

        @tf.function
        def many(it):
            for _ in tf.range(loop):
                strategy.run(step, args=next(it))

        def epoch():
            for _ in range(steps // loop):
                coordinator.schedule(many, args=(iterator,))
            coordinator.join()
        self.epoch = epoch
        self.epoch()


def section_ps(rounds, steps):
    import kerastrain as kt
    from kerastrain import examples
    spec = {"name": "ps", "num_workers": 2, "num_ps": 1}
    built = kt.build_strategy(spec)
    fn = examples.synthetic_dataset_fn(N, FEATURES, BATCH, repeat=True)
    trainer = kt.Trainer(examples.build_mlp, fn, strategy=spec, seed=0, verbose=0)
    kt_run = FitEpochs(trainer, steps_per_epoch=steps)
    loop = trainer.steps_per_loop
    runners = {"kerastrain defaults": kt_run,
               f"bare ClusterCoordinator, {loop} steps per closure":
                   BareCoordinator(built, fn, steps, loop)}
    wall, cpu = interleave(runners, rounds, steps)
    return [row("ps", "x bare ClusterCoordinator loop", wall, cpu, "kerastrain defaults",
                f"bare ClusterCoordinator, {loop} steps per closure", 0.9, per_epoch=steps,
                unit="steps/s")], wall


def section_outputs(rounds, checkpoint_rounds):
    import tempfile
    x, y = arrays()
    fn = readme_dataset_fn(x, y)
    # Logging only: each epoch is one fit call, which would also checkpoint and export.
    # One loop size for both (each Trainer would measure its own, a few steps apart).
    runners = {"kerastrain defaults": kerastrain_run(fn, steps_per_loop=100),
               "kerastrain + TensorBoard": kerastrain_run(
                   fn, steps_per_loop=100, model_dir=tempfile.mkdtemp(prefix="kerastrain-bench-"),
                   checkpoint=False)}
    wall, cpu = interleave(runners, rounds, N)
    cost = {"wall": statistics.median(a / b for a, b in zip(
        wall["kerastrain + TensorBoard"], wall["kerastrain defaults"])),
        "cpu": statistics.median(a / b for a, b in zip(
            cpu["kerastrain + TensorBoard"], cpu["kerastrain defaults"]))}
    rows = [{"section": "outputs", "measure": "TensorBoard logging: epoch time x (lower is better)",
             "wall": cost["wall"], "cpu": cost["cpu"], "target": 1.02, "lower_is_better": True}]
    proc = subprocess.run([sys.executable, os.path.join(HERE, "checkpoint.py"), "--rounds",
                           str(checkpoint_rounds)], capture_output=True, text=True)
    for what, key in (("save", "save    kerastrain / bare write:"),
                      ("restore", "restore kerastrain / bare read:")):
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(key)), None)
        value = float(line.split(":")[1].strip().rstrip("x")) if line else float("nan")
        rows.append({"section": "outputs", "measure": f"checkpoint {what} x bare tf.train."
                     "Checkpoint (lower is better)", "wall": value, "cpu": float("nan"),
                     "target": 1.1, "lower_is_better": True})
    return rows, wall


def section_precision(rounds):
    x, y = arrays()
    fn = readme_dataset_fn(x, y)
    runners = {"float32": kerastrain_run(fn, steps_per_loop=100),
               "mixed_bfloat16": kerastrain_run(fn, steps_per_loop=100,
                                                mixed_precision="mixed_bfloat16")}
    wall, cpu = interleave(runners, rounds, N)
    return [row("precision", "mixed_bfloat16 x float32 (speed; no target)", wall, cpu,
                "mixed_bfloat16", "float32", float("nan"))], wall


def row(section, measure, wall, cpu, name, base, target, per_epoch=N, unit="examples/s"):
    return {"section": section, "measure": measure, "wall": ratio(wall, name, base),
            "cpu": ratio(cpu, name, base), "target": target, "lower_is_better": False,
            unit: {n: per_epoch / statistics.median(t) for n, t in wall.items()}}


# -- the parent: one child per section, one table ---------------------------------------

def run_section(name, args):
    rounds = args.rounds or (3 if args.quick else 12)
    if name == "readme":
        return section_readme(rounds)
    if name == "numpy":
        return section_numpy(rounds)
    if name == "files":
        return section_files(rounds)
    if name == "mirrored":
        return section_mirrored(rounds)
    if name == "ps":
        return section_ps(rounds, 200 if args.quick else 400)
    if name == "precision":
        return section_precision(rounds)
    return section_outputs(2 * rounds, 2 if args.quick else 5)


def child(name, args):
    rows, _ = run_section(name, args)
    print("RESULT " + json.dumps(rows), flush=True)


def print_table(rows):
    print(f"\n{'section':<10}{'measure':<58}{'wall':>7}{'CPU':>7}{'target':>8}  met")
    for r in rows:
        if r.get("failed"):
            print(f"{r['section']:<10}{'FAILED: ' + r['failed'][:56]:<58}")
            continue
        better = (r["wall"] <= r["target"]) if r["lower_is_better"] else (r["wall"] >= r["target"])
        target = ("<=" if r["lower_is_better"] else ">=") + f"{r['target']:.2f}"
        met = "yes" if better else "NO"
        if r["target"] != r["target"]:  # NaN: no target
            target, met = "-", "-"
        print(f"{r['section']:<10}{r['measure']:<58}{r['wall']:>7.2f}{r['cpu']:>7.2f}"
              f"{target:>8}  {met}")
    print(f"{'gpu':<10}{'NCCL / hierarchical copy, prefetch to GPU':<58}{'not measured (no GPU)':>22}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds per section (<= ~3 min)")
    parser.add_argument("--rounds", type=int, default=None, help="timed epochs per configuration")
    parser.add_argument("--only", default=None, help=f"comma-separated sections of {SECTIONS}")
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--real-models", action="store_true",
                        help="then run bench/real_models.py, multi_worker.py and jit_auto.py too")
    parser.add_argument("--section", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.section:
        child(args.section, args)
        return
    sections = SECTIONS if not args.only else [s.strip() for s in args.only.split(",")]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {list(SECTIONS)}")
    started, rows = time.perf_counter(), []
    for name in sections:
        command = [sys.executable, __file__, "--section", name] + (["--quick"] if args.quick
                                                                    else [])
        if args.rounds:
            command += ["--rounds", str(args.rounds)]
        proc = subprocess.run(command, capture_output=True, text=True)
        result = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        print(f"[{name}] {time.perf_counter() - started:.0f}s", flush=True)
        if proc.returncode or not result:
            rows.append({"section": name, "failed": (proc.stderr.strip().splitlines() or
                                                      ["no result"])[-1]})
            print(proc.stderr[-3000:], file=sys.stderr)
            continue
        rows.extend(json.loads(result[0][len("RESULT "):]))
    print_table(rows)
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')} on {machine()}; "
          f"{'quick' if args.quick else 'full'} run in {time.perf_counter() - started:.0f}s; "
          "ratios are medians of within-round ratios (wall and process CPU time)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "machine": machine()}, f, indent=1)
    if args.real_models:
        _real_models(args)


def _real_models(args):
    """The real-model benchmarks, each in turn with the same `--quick` / `--rounds`; their
    tables go straight to this output. Returns only when all have finished."""
    extra = (["--quick"] if args.quick else []) + (["--rounds", str(args.rounds)]
                                                   if args.rounds else [])
    for script in ("real_models.py", "multi_worker.py", "jit_auto.py"):
        print(f"\n## bench/{script}\n", flush=True)
        done = subprocess.run([sys.executable, os.path.join(HERE, script), *extra])
        if done.returncode:
            print(f"bench/{script} failed (exit code {done.returncode})", file=sys.stderr)


if __name__ == "__main__":
    main()
