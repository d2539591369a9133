"""tf.data service benchmark: an expensive map in the trainer's pipeline, or on a service worker.

What stands in for "service workers on other machines" on one 2-core host: the trainer
and the service get disjoint CPUs. This process (the trainer, in every configuration)
pins itself to CPU 0 before TensorFlow starts; the dispatcher and one service worker are
separate processes (`python -m kerastrain.data.service dispatcher|worker`) pinned to CPU 1
(`os.sched_setaffinity`). TensorFlow sizes its thread pools from the affinity mask
(`--check-threads`: one "tf_Compute" inter-op thread pinned to one CPU, two unpinned;
`os.cpu_count()` still says 2). So the local pipeline has only the trainer's CPU for map
and training, as a trainer host would, and the service adds exactly one CPU. Everything
runs in a private network namespace (loopback only). Other tenants of the host are not
pinned: one of their threads on CPU 0 or 1 halves that side's wall-clock rate, so CPU
seconds per batch are printed too.

Workload (issue 17): `--examples` (65,536) examples of 64 float32 features, global batch
64 (1,024 steps an epoch; an epoch is one pass, i.e. one service job), an MLP
(64 -> H -> H -> 1, `--hidden`) on one device. The source is a range of batch indices
(one split per batch). The map is a chain of 64x256 @ 256x256 matmuls + tanh per batch
(`--matmuls`; 24 is 1-2.5 ms of one CPU here, depending on the host's load). For each
(matmuls, H), six configurations take turns, one epoch each (bench/_rounds.py):

- no map: training on the pipeline without the map: the step alone (T per batch);
- local: training, the map in the trainer's own pipeline (on CPU 0 with the training);
- service: training with `data_service="grpc://127.0.0.1:PORT"`: the map on the worker;
- pipeline alone / map alone: the pipeline read in this process without / with the map,
  no training (M, the map's cost, is their difference, within each round);
- service alone: the pipeline read through the service, no training.

Printed: ms per batch (medians over rounds), service / local (the median of within-round
ratios: > 1 means the service is faster), and CPU ms per batch: the trainer process in
local (M + T) and in service (T + c, c what reading from the service costs it), and the
service processes in service (M + w, w the service's own cost). "CPU-bound ratio" =
local CPU / max(T + c, M + w): service / local on a host where each side has its CPU to
itself. With one worker CPU the service can win only when T > w and M > c.

    python bench/service.py [--repeats 5] [--matmuls 24 72] [--hidden 64 512]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

N, FEATURES, BATCH = 65536, 64, 64
TRAINER_CPU, SERVICE_CPU = 0, 1


def start_service(python=sys.executable):
    """A dispatcher and one worker, separate processes pinned to SERVICE_CPU; their address."""
    from kerastrain.distribute import cluster
    port = cluster.free_port()
    env = dict(os.environ, PYTHONPATH=REPO)

    def spawn(*args):
        return subprocess.Popen(
            [python, "-m", "kerastrain.data.service", *args], env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, preexec_fn=lambda: os.sched_setaffinity(0, {SERVICE_CPU}))
    processes = [spawn("dispatcher", "--port", str(port))]
    processes.append(spawn("worker", "--dispatcher", f"127.0.0.1:{port}",
                           "--port", str(cluster.free_port())))
    return f"grpc://127.0.0.1:{port}", processes


def data(matmuls, n=N):
    """A function making the training dataset: batches, then the map of `matmuls` matmuls."""
    import numpy as np
    import tensorflow as tf
    rng = np.random.RandomState(0)
    x = rng.randn(n, FEATURES).astype("float32")
    y = (x[:, :1] > 0).astype("float32")
    w = tf.constant(rng.randn(256, 256).astype("float32") / 16)
    xs, ys = tf.constant(x), tf.constant(y)

    def heavy(a, b):
        h = tf.tile(a, [1, 4])
        for _ in range(matmuls):
            h = tf.tanh(h @ w)
        return a + 0.0 * tf.reduce_mean(h), b

    def batch(i):  # the source is batch indices: the service's splits are whole batches
        return xs[i * BATCH:(i + 1) * BATCH], ys[i * BATCH:(i + 1) * BATCH]

    def make():
        dataset = tf.data.Dataset.range(n // BATCH).map(batch)
        return dataset.map(heavy) if matmuls else dataset
    return make


def model_fn(hidden):
    def build():
        import keras
        m = keras.Sequential([keras.Input((FEATURES,)),
                              keras.layers.Dense(hidden, activation="relu"),
                              keras.layers.Dense(hidden, activation="relu"),
                              keras.layers.Dense(1)])
        m.compile(optimizer="adam", loss=keras.losses.BinaryCrossentropy(from_logits=True))
        return m
    return build


def map_cost(make, passes=3):
    """Milliseconds per batch of the pipeline alone on this process's CPU (median of passes)."""
    times = []
    for _ in range(passes):
        started = time.perf_counter()
        n = sum(1 for _ in make())
        times.append(1000 * (time.perf_counter() - started) / n)
    return statistics.median(times)


class PipelineEpoch:
    """`epoch()` reads one pass of a pipeline in this process, with no training.

    The pipeline is built once; `per_pass` (if any) is applied to it every pass (a
    new service job a pass, as kerastrain reads through the service).
    """

    def __init__(self, make, per_pass=None):
        self.dataset, self.per_pass = make(), per_pass
        self.epoch()  # warm-up, untimed

    def epoch(self):
        dataset = self.per_pass(self.dataset) if self.per_pass else self.dataset
        for _ in dataset:
            pass


def process_cpu(pids):
    """CPU seconds (user + system) the processes `pids` have used so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


class ServiceCpu:
    """A runner whose epochs also record the service processes' CPU seconds."""

    def __init__(self, runner, pids):
        self.runner, self.pids, self.cpu = runner, pids, []

    def epoch(self):
        before = process_cpu(self.pids)
        self.runner.epoch()
        self.cpu.append(process_cpu(self.pids) - before)


def through_service(address):
    """A pipeline read through the service as kerastrain reads it (one job a pass)."""
    from kerastrain import _compat
    from kerastrain.data import service
    return lambda dataset: dataset.apply(_compat.service_distribute(
        "distributed_epoch", address, task_refresh_ms=service.TASK_REFRESH_MS))


def workload(address, pids, matmuls, hidden, repeats, n=N):
    """Interleaved rounds of the configurations; returns the printed row's numbers."""
    import _rounds

    import kerastrain as kt
    make, plain = data(matmuls, n), data(0, n)
    build = model_fn(hidden)
    trainers = {
        "no map": (kt.Trainer(build, strategy="one_device", seed=0, verbose=0), plain),
        "local": (kt.Trainer(build, strategy="one_device", seed=0, verbose=0), make),
        "service": (kt.Trainer(build, strategy="one_device", seed=0, verbose=0,
                               data_service=address), make),
    }
    # Datasets, not functions: kerastrain builds (traces) a dataset once; a function it
    # calls again every pass through the service (a new shuffle seed each pass).
    runners = {name: _rounds.FitEpochs(trainer, dataset_fn=fn()) for name, (trainer, fn) in
               trainers.items()}
    runners["service"] = ServiceCpu(runners["service"], pids)
    runners["pipeline alone"] = PipelineEpoch(plain)
    runners["map alone"] = PipelineEpoch(make)
    runners["service alone"] = PipelineEpoch(make, through_service(address))
    wall, cpu = _rounds.interleave(runners, repeats, n // BATCH)
    for trainer, _ in trainers.values():
        trainer.close()
    steps = n // BATCH
    per_batch = {name: 1000 * statistics.median(times) / steps for name, times in wall.items()}
    # The map's own cost: the same pass with and without it, within each round.
    map_ms = 1000 * statistics.median(
        a - b for a, b in zip(wall["map alone"], wall["pipeline alone"])) / steps
    return {"matmuls": matmuls, "hidden": hidden, "map_ms": map_ms,
            "step_ms": per_batch["no map"], "ms": per_batch,
            "ratio": _rounds.ratio(wall, "service", "local"),
            "cpu_ms": {name: 1000 * statistics.median(c) / steps for name, c in cpu.items()},
            "service_cpu_ms": 1000 * statistics.median(runners["service"].cpu) / steps}


def check_threads():
    """TensorFlow's inter-op pool ("tf_Compute" threads) in this process: one per allowed CPU."""
    import tensorflow as tf
    tf.constant([[1.0]]) @ tf.constant([[2.0]])
    names = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/comm") as f:
            names.append(f.read().strip())
    print(f"affinity {sorted(os.sched_getaffinity(0))}: {names.count('tf_Compute')} tf_Compute "
          f"thread(s), os.cpu_count()={os.cpu_count()}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="rounds (timed epochs each)")
    parser.add_argument("--matmuls", type=int, nargs="+", default=[24, 72],
                        help="the map's cost: matmuls per batch (24: 1-2.5 ms here)")
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 512],
                        help="the model's width (its step's cost)")
    parser.add_argument("--examples", type=int, default=N,
                        help="examples a pass (an epoch; one service job): passes of "
                             f"{N // BATCH} batches by default")
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--check-threads", action="store_true",
                        help="print TensorFlow's thread pool under the pinning, then exit")
    args = parser.parse_args()
    import kerastrain as kt
    kt.isolate_network()  # before TensorFlow: the servers below listen on every interface
    os.sched_setaffinity(0, {TRAINER_CPU})  # before TensorFlow starts its thread pools
    if args.check_threads:
        return check_threads()
    address, processes = start_service()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still stop the service
    rows = []
    try:
        for hidden in args.hidden:
            for matmuls in args.matmuls:
                print(f"-- map of {matmuls} matmuls, MLP width {hidden}", flush=True)
                rows.append(workload(address, [p.pid for p in processes], matmuls, hidden,
                                     args.repeats, args.examples))
    finally:
        for process in processes:
            process.kill()
    print("\nms per batch, medians over rounds. Wall: local, service, service alone (the "
          "pipeline read through the service, no training). CPU: the trainer process in local "
          "(M+T) and service (T+c), the service processes in service (M+w).")
    print(f"{'map M':>6s} {'width':>5s} {'step T':>6s} | {'local':>6s} {'service':>7s} "
          f"{'alone':>6s} | {'service/local':>13s} | {'CPU local':>9s} {'T+c':>5s} {'M+w':>5s} "
          "| CPU-bound ratio")
    for r in rows:
        ms, c = r["ms"], r["cpu_ms"]
        bound = c["local"] / max(c["service"], r["service_cpu_ms"])
        print(f"{r['map_ms']:6.2f} {r['hidden']:5d} {r['step_ms']:6.2f} | {ms['local']:6.2f} "
              f"{ms['service']:7.2f} {ms['service alone']:6.2f} | {r['ratio']:12.2f}x | "
              f"{c['local']:9.2f} {c['service']:5.2f} {r['service_cpu_ms']:5.2f} | {bound:.2f}x")
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "date": time.strftime("%Y-%m-%d"),
                       "repeats": args.repeats}, f, indent=1)
    print(f"\n{time.strftime('%Y-%m-%d')}; trainer on CPU {TRAINER_CPU}, dispatcher and one "
          f"service worker on CPU {SERVICE_CPU}; {args.repeats} rounds; medians")


if __name__ == "__main__":
    main()
