"""Multi-worker mirrored: kerastrain vs a bare MultiWorkerMirroredStrategy loop vs Keras `fit`.

A cluster of 2 local worker processes on 127.0.0.1 (`TF_CONFIG`, worker 0 the chief), one
replica (the CPU) each, so each global batch is split into 2 per-replica batches.

Workload (bench/real_models.py, synthetic data from a fixed seed, the same in both workers):
  convnet      keras.io's MNIST convnet with BatchNormalization (see real_models.py); Adam,
               sparse cross-entropy, accuracy. 8,192 images, global batch 128 (64 a worker),
               64 steps an epoch. `--workload transformer|recommender` picks real_models.py's
               other workloads (not measured here).

Contenders, all in the same pair of processes (a process holds one MultiWorkerMirroredStrategy:
the Trainer builds it, first thing, and the other two build their models in
`trainer.strategy.scope()`). Each is built and trains one untimed warm-up epoch; once all are
built each trains one more untimed epoch (building a contender seeds, which clears TensorFlow's
kernel caches: see real_models.py); then they take turns one epoch each for `--rounds` rounds,
in the same order in both workers (their collectives must match), the first contender rotating
(bench/_rounds.py). All train the same model on the same 64 global batches of 128 an epoch:
  kerastrain    `kt.Trainer(build_model, (x, y), strategy="multi_worker_mirrored", seed=0,
                verbose=0)`, defaults, `fit(batch_size=128)` one epoch at a time (`initial_epoch`).
                NumPy input sharded by data by kerastrain: every worker reads the seeded
                permutation of each epoch, keeps its replica's half of every global batch.
  bare loop     the ceiling, real_models.BareLoop: a `tf.function` running the whole epoch per
                call, `strategy.run` over `experimental_distribute_dataset` of
                `from_tensor_slices((x, y)).batch(128)` (TensorFlow's AUTO policy, which for
                in-memory data falls back to sharding by data: each worker keeps its half of
                every global batch), `optimizer.apply`.
  bare loop + 2 reductions
                the bare loop with the two cross-worker reductions kerastrain's exact step
                makes at each step (the global example count, the totals vector): what they
                cost, measured.
  fit defaults  real_models.ModelFit: `model.fit(x, y, batch_size=128, epochs=1, verbose=0)`,
                compiled with defaults in the strategy's scope; Keras makes its own tf.data
                pipeline of the arrays (AutoShardPolicy.DATA) and distributes it. If Keras
                cannot run it under MultiWorkerMirroredStrategy, the exception (type and first
                line) is recorded in the table in place of figures and the others go on. With
                Keras 3.15.1 / TF 2.21 it fails before training, alike on both workers:
                `_maybe_symbolic_build` calls `strategy.reduce("MEAN", first batch)`, and the
                collective reduce cannot convert the PerReplica batch ("ValueError: Attempt to
                convert a value (PerReplica:{...}) with an unsupported type ... to a Tensor";
                keras-team/keras#20585, tensorflow/tensorflow#72388).
Differences left in on purpose: the bare loop updates no metric and does not shuffle (fit and
kerastrain shuffle the arrays each epoch and update accuracy); kerastrain chooses its own steps
per compiled call (`steps_per_loop="auto"`, printed), fit runs one step per call (its default).

How to read the figures: examples/s are global (both workers' replicas together) per wall
second of worker 0, medians over rounds; "CPU s / epoch" is worker 0's process CPU time (all
its threads) per epoch, which time stolen by other tenants does not inflate. Ratios are
medians of within-round ratios, > 1: kerastrain faster (wall), or cheaper (CPU). Only worker
0 is timed; worker 1 runs the same epochs in lockstep (every step all-reduces).

`--quick` checks that it runs (its figures mean nothing): 1,024 images, 2 rounds. The cluster
runs in a private network namespace with loopback only when Linux allows one (TensorFlow's
servers listen on every interface); the launcher kills both workers if either fails or after
`--timeout` seconds.

    python bench/multi_worker.py [--rounds 5] [--quick] [--workload convnet] [--timeout S]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import kerastrain as kt  # noqa: E402  (names import on first use: nothing heavy yet)

if "--child" not in sys.argv:
    # The launcher: its workers inherit its network namespace. TensorFlow's servers listen on
    # every interface and run any graph sent to them; loopback only, which must come before
    # anything starts threads (NumPy, TensorFlow), so before the imports below.
    kt.isolate_network()

from _rounds import ratio  # noqa: E402  (standard library only)

KT, FIT, BARE, REDUCING = "kerastrain", "fit defaults", "bare loop", "bare loop + 2 reductions"
WORKLOADS = ("convnet", "transformer", "recommender")


# -- a worker: the three contenders in one MultiWorkerMirroredStrategy ---------------------

def _one_line(error):
    """`Type: message` on one line: TensorFlow's and Keras's messages span many lines."""
    import re

    import tensorflow as tf

    from real_models import _why
    if isinstance(error, tf.errors.OpError):
        return _why(error)  # the line that says what went wrong, not where it was traced
    text = " ".join(str(error).split())
    # A value printed in the message (a PerReplica of tensors) says nothing: elide it.
    text = re.sub(r"\((PerReplica|Mirrored):\{.*?\}\)", r"(\1:{...})", text)
    text = re.sub(r"<tf\.Tensor: .*?>", "<tf.Tensor ...>", text)
    return f"{type(error).__name__}: {text}"[:300]


def _raised_in(error):
    """`file:line (function)` of the innermost Keras frame of the traceback, and of the last."""
    import traceback
    frames = traceback.extract_tb(error.__traceback__)
    keras_frames = [f for f in frames if "/keras/src/" in f.filename
                    and "traceback_utils" not in f.filename]
    chosen = ([keras_frames[-1]] if keras_frames else []) + [frames[-1]]
    where = [f"{f.filename.split('site-packages/')[-1]}:{f.lineno} ({f.name})" for f in chosen]
    return " -> ".join(dict.fromkeys(where))


class Guarded:
    """A contender that may fail (Keras fit under MWMS): the error is kept, not raised.

    Once failed, `epoch()` does nothing (its times are dropped from the result).
    """

    def __init__(self, make):
        self.runner, self.error, self.where, self.traceback = None, None, None, None
        try:
            self.runner = make()  # trains its warm-up epoch
        except Exception as e:  # noqa: BLE001  (whatever Keras raises, reported in the table)
            self._failed(e)

    def _failed(self, error):
        import traceback
        self.error = _one_line(error)
        self.where = _raised_in(error)
        self.traceback = "".join(traceback.format_tb(error.__traceback__))[-4000:]
        print(f"setting: {FIT}: FAILED {self.error} (raised in {self.where})", flush=True)

    def epoch(self):
        if self.error is None:
            try:
                self.runner.epoch()
            except Exception as e:  # noqa: BLE001
                self._failed(e)


class BareLoopReducing:
    """The bare loop plus the two cross-worker reductions kerastrain's exact step makes at each
    step: the global example count (a scalar all-reduce, which weights each replica's loss by
    its share of a partial batch) and the step's totals vector (loss sum, examples; a
    `strategy.reduce`), summed over the call. What those two collectives cost the bare loop
    is what they cost kerastrain (the reason measured, not guessed)."""

    def __init__(self, workload, x, y, strategy):
        import keras
        import tensorflow as tf
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = workload.build()
            optimizer = model.optimizer
            optimizer.build(model.trainable_variables)
        loss_fn = model.loss
        steps, batch = workload.n // workload.batch, workload.batch
        self.steps_per_call = steps

        def step(xb, yb):
            context = tf.distribute.get_replica_context()
            n = tf.cast(tf.shape(yb)[0], tf.float32)
            global_n = context.all_reduce("sum", n)
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
                objective = loss * n / global_n
            grads = tape.gradient(objective, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return tf.stack([loss * n, n])

        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
        distributed = strategy.experimental_distribute_dataset(dataset)

        @tf.function
        def loop(iterator):
            totals = tf.zeros([2])
            for _ in tf.range(steps):
                totals += strategy.reduce("SUM", strategy.run(step, args=next(iterator)),
                                          axis=None)
            return totals
        self.epoch = lambda: loop(iter(distributed))
        self.epoch()


def child(index, args):
    import keras  # importing Keras does not start TensorFlow's devices

    keras.config.disable_traceback_filtering()  # a failure of fit names the Keras line

    from _rounds import FitEpochs, interleave, machine
    from real_models import WORKLOAD_CLASSES, BareLoop, ModelFit

    workload = WORKLOAD_CLASSES[args.workload](args.quick)
    x, y = workload.data()  # NumPy: runs no TensorFlow operation
    # First TensorFlow thing in the process: the Trainer builds the MultiWorkerMirroredStrategy.
    trainer = kt.Trainer(workload.build, (x, y), strategy="multi_worker_mirrored", seed=0,
                         verbose=0)
    strategy = trainer.strategy
    runners = {KT: FitEpochs(trainer, batch_size=workload.batch)}
    settings = {KT: f"defaults (steps_per_loop={trainer.steps_per_loop})"}
    bare = BareLoop(workload, x, y, strategy)
    runners[BARE] = bare
    settings[BARE] = f"{bare.steps_per_call} steps per tf.function call over strategy.run"
    runners[REDUCING] = BareLoopReducing(workload, x, y, strategy)
    settings[REDUCING] = "the bare loop + a scalar all-reduce and a strategy.reduce per step"
    fit = Guarded(lambda: ModelFit(workload, x, y, strategy))
    errors, details = {}, {}
    if fit.error is None:
        runners[FIT] = fit
        settings[FIT] = "compile defaults (steps_per_execution=1)"
    else:
        errors[FIT] = fit.error
    for name, setting in settings.items():
        print(f"setting: {name}: {setting}", flush=True)
    for runner in runners.values():  # the second untimed epoch (see the docstring)
        runner.epoch()
    wall, cpu = interleave(runners, args.rounds, workload.n)
    if fit.error is not None and FIT not in errors:  # failed during the rounds
        errors[FIT] = fit.error
        del wall[FIT], cpu[FIT]
    if fit.error is not None:
        details[FIT] = {"raised_in": fit.where, "traceback": fit.traceback}
    if index == 0:
        print("RESULT " + json.dumps({
            "workload": workload.name, "examples_per_epoch": workload.n,
            "batch": workload.batch, "replicas": strategy.num_replicas_in_sync,
            "rounds": args.rounds, "wall": wall, "cpu": cpu, "settings": settings,
            "errors": errors, "error_details": details, "machine": machine()}), flush=True)


# -- the launcher: two workers, one table --------------------------------------------------

def _die_with_parent():
    """In a worker, before exec: SIGKILL when the launcher dies (Linux), however it dies."""
    import ctypes
    import signal
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001  (not Linux: the launcher's finally still kills them)
        pass


def launch(args):
    """Run the 2 workers; return worker 0's RESULT dict. Both are gone when this returns."""
    import signal

    from kerastrain.distribute.cluster import free_port

    # free_port: bindable now, below the ephemeral range, and reserved against other local
    # clusters on this machine (a plain bind to port 0 could hand a port out twice).
    workers = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    command = [sys.executable, os.path.abspath(__file__), "--workload", args.workload,
               "--rounds", str(args.rounds)] + (["--quick"] if args.quick else [])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("multi_worker.py: terminated"))
    procs, logs, result, lines = [], [], None, []
    try:
        for i in range(2):
            env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_CONFIG": json.dumps(
                {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})}
            log = tempfile.TemporaryFile("w+")  # stderr (and worker 1's stdout): read on failure
            logs.append(log)
            procs.append(subprocess.Popen(
                command + ["--child", str(i)], env=env, text=True, stderr=log,
                stdout=subprocess.PIPE if i == 0 else log, preexec_fn=_die_with_parent))

        def pump():  # worker 0's progress, echoed as it comes
            for line in procs[0].stdout:
                lines.append(line)
                if line.startswith(("round", "setting")):
                    print(f"  {line.rstrip()}", flush=True)
        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        deadline = time.monotonic() + args.timeout
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                break  # one failed: the other would wait for it in a collective
            if time.monotonic() > deadline:
                print(f"multi_worker.py: timed out after {args.timeout:.0f} s", file=sys.stderr)
                break
            time.sleep(0.5)
        # Worker 0 may have printed its result while worker 1 is still leaving.
        if all(p.poll() is not None for p in procs):
            reader.join(timeout=10)
        for line in lines:
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
        codes = [p.poll() for p in procs]
        if result is None or codes != [0, 0]:
            for i, (p, log) in enumerate(zip(procs, logs)):
                log.seek(0)
                print(f"--- worker {i}: exit code {p.poll()}, last output:\n"
                      f"{log.read()[-3000:]}", file=sys.stderr)
            if result is None:
                sys.exit("multi_worker.py: no result from worker 0")
            print(f"multi_worker.py: note: worker exit codes {codes} after the result",
                  file=sys.stderr)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for log in logs:
            log.close()
    return result


def _f(value, spec):
    return "-" if value is None or value != value else format(value, spec)


def print_table(r, seconds):
    n, wall, cpu = r["examples_per_epoch"], r["wall"], r["cpu"]
    print(f"\n### {r['workload']}, multi-worker mirrored: 2 local workers x 1 CPU replica, "
          f"global batch {r['batch']}, {n:,} examples an epoch\n")
    print("| contender | setting | examples/s (wall) | CPU s / epoch (worker 0) "
          "| kerastrain x it (wall / CPU) |")
    print("|---|---|---:|---:|---|")
    for name in (KT, BARE, REDUCING, FIT):
        setting = r["settings"].get(name, "")
        if name in r["errors"]:
            error = r["errors"][name].replace("|", "\\|")
            print(f"| {name} | FAILED: {error[:160]} | - | - | - |")
            continue
        if name not in wall:
            continue
        kx = ("-" if name == KT else
              f"{_f(ratio(wall, KT, name), '.2f')} / {_f(ratio(cpu, KT, name), '.2f')}")
        print(f"| {name} | {setting} | {_f(n / statistics.median(wall[name]), ',.0f')} "
              f"| {_f(statistics.median(cpu[name]), '.2f')} | {kx} |")
    for name, detail in r.get("error_details", {}).items():
        print(f"\n{name} under MultiWorkerMirroredStrategy: {r['errors'][name]} "
              f"(raised in {detail['raised_in']})")
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')} on {r['machine']} (2 worker processes share "
          f"it); run in {seconds:.0f} s; {r['rounds']} timed epochs per contender, interleaved "
          "(bench/_rounds.py); ratios: medians of within-round ratios, > 1: kerastrain faster "
          "(wall) / cheaper (CPU)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None,
                        help="timed epochs per contender (default 5; 2 with --quick)")
    parser.add_argument("--quick", action="store_true", help="1,024 images, 2 rounds: does it run")
    parser.add_argument("--workload", choices=WORKLOADS, default="convnet")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds before both workers are killed (default 600 with --quick, "
                             "else 600 + 240 per round)")
    parser.add_argument("--json", default=None, help="also write every figure here")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.rounds = args.rounds or (2 if args.quick else 5)
    if args.child is not None:
        child(args.child, args)
        return
    args.timeout = args.timeout or (600 if args.quick else 600 + 240 * args.rounds)
    started = time.perf_counter()
    result = launch(args)
    print_table(result, time.perf_counter() - started)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
