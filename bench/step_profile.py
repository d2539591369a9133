"""Where a step's time goes: kerastrain against the bare loop, op by op, on one device.

For a workload of bench/real_models.py (default: the recommender, whose steps are short
enough for per-step overheads to show), three contenders train whole epochs: kerastrain's
defaults (NumPy input shuffled each epoch, as `model.fit` shuffles it), kerastrain with
`shuffle=False` and a loop as long as the epoch (what is left besides the shuffle), and
the bare loop of bench/real_models.py (a `tf.function` over pre-batched in-memory tensors,
unshuffled, no metrics). First their epochs are timed, interleaved (medians, wall and CPU,
and the median of within-round ratios); then each is traced with the TensorFlow profiler
(`--traces` times) and the trace's framework op statistics (the xprof converter of
tensorboard-plugin-profile, `pip install "kerastrain[profile]"`) are summed per op type:
per step, how many ops ran and their self time, and the executor's idle time.

    python bench/step_profile.py [--workload recommender] [--epochs 3] [--rounds 9]
        [--traces 3] [--top 12]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import real_models  # noqa: E402
from _rounds import machine  # noqa: E402


def contenders(workload, epochs):
    import logging

    import kerastrain as kt
    logging.getLogger("kerastrain").setLevel(logging.WARNING)
    x, y = workload.data()
    steps = workload.n // workload.batch
    shuffled = kt.Trainer(workload.build, (x, y), strategy="one_device", seed=0, verbose=0)
    plain = kt.Trainer(workload.build, (x, y), strategy="one_device", seed=0, verbose=0,
                       steps_per_loop=steps)
    bare = real_models.BareLoop(workload, x, y, None)
    return {
        "kerastrain": lambda: shuffled.fit(batch_size=workload.batch, epochs=epochs),
        "kerastrain, unshuffled, one loop an epoch": lambda: plain.fit(
            batch_size=workload.batch, epochs=epochs, shuffle=False),
        "bare loop": lambda: [bare.epoch() for _ in range(epochs)],
    }


def timed(runs, rounds):
    wall, cpu = collections.defaultdict(list), collections.defaultdict(list)
    for _ in range(rounds):
        for name, run in runs.items():
            w0, c0 = time.perf_counter(), time.process_time()
            run()
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
    return wall, cpu


def op_stats(run, directory):
    """{op type: [occurrences, self microseconds]} of one traced call of `run`."""
    import tensorflow as tf
    from xprof.convert import raw_to_tool_data

    tf.profiler.experimental.start(directory)
    run()
    tf.profiler.experimental.stop()
    path = sorted(glob.glob(f"{directory}/**/*.xplane.pb", recursive=True))[-1]
    data, _ = raw_to_tool_data.xspace_to_tool_data([path], "framework_op_stats", {})
    table = json.loads(data)[0]
    columns = [c["id"] for c in table["cols"]]
    stats = collections.defaultdict(lambda: [0, 0.0])
    for row in table["rows"]:
        cell = dict(zip(columns, [c.get("v") if c else None for c in row["c"]]))
        stats[cell["type"]][0] += cell["occurrences"]
        stats[cell["type"]][1] += cell["total_self_time"]
    return stats


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="recommender", choices=real_models.WORKLOADS)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per timed or traced call")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--traces", type=int, default=3, help="0: time the epochs only")
    parser.add_argument("--top", type=int, default=12, help="op types shown")
    args = parser.parse_args()
    workload = real_models.WORKLOAD_CLASSES[args.workload](quick=False)
    runs = contenders(workload, args.epochs)
    for run in runs.values():  # trace and warm up
        run()
        run()
    wall, cpu = timed(runs, args.rounds)
    base = "bare loop"
    print(f"{args.workload}, one device: ms per epoch (median of {args.rounds}), "
          "x bare loop (median of within-round ratios), wall / CPU")
    for name in runs:
        print(f"  {name:42s} {statistics.median(wall[name]) / args.epochs * 1e3:7.1f} / "
              f"{statistics.median(cpu[name]) / args.epochs * 1e3:7.1f} ms   "
              f"{statistics.median(b / a for a, b in zip(wall[name], wall[base])):.3f} / "
              f"{statistics.median(b / a for a, b in zip(cpu[name], cpu[base])):.3f}")
    if not args.traces:  # timings only
        print(f"\n{time.strftime('%Y-%m-%d')} on {machine()}")
        return
    totals = {name: collections.defaultdict(lambda: [0, 0.0]) for name in runs}
    with tempfile.TemporaryDirectory() as directory:
        for trace in range(args.traces):
            for i, (name, run) in enumerate(runs.items()):
                for op, (count, micros) in op_stats(
                        run, os.path.join(directory, f"{trace}-{i}")).items():
                    totals[name][op][0] += count
                    totals[name][op][1] += micros
    steps = args.traces * args.epochs * (workload.n // workload.batch)
    print(f"\nper step (traced: {args.traces} x {args.epochs} epochs of "
          f"{workload.n // workload.batch} steps): ops, op self time, executor idle time")
    for name, stats in totals.items():
        ops = {op: v for op, v in stats.items() if op != "IDLE"}
        print(f"  {name:42s} {sum(c for c, _ in ops.values()) / steps:5.1f} ops  "
              f"{sum(m for _, m in ops.values()) / steps:7.1f} us  "
              f"idle {stats['IDLE'][1] / steps:7.1f} us")
    kinds = sorted(set().union(*totals.values()) - {"IDLE"},
                   key=lambda op: -max(abs(totals[n][op][1] - totals[base][op][1])
                                       for n in runs))
    print("\nop types by the difference from the bare loop (per step: count x, self us)")
    for op in kinds[:args.top]:
        print(f"  {op:28s}" + "  ".join(
            f"{totals[n][op][0] / steps:5.2f}x {totals[n][op][1] / steps:7.1f}"
            for n in runs))
    print(f"  (columns: {', '.join(runs)})")
    print(f"\n{time.strftime('%Y-%m-%d')} on {machine()}")


if __name__ == "__main__":
    main()
