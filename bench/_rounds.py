"""Interleaved timing shared by the benchmarks: configurations take turns, one epoch each.

This host's speed drifts by 2x over minutes, so configurations are compared
within a round, seconds apart, and ratios are medians of within-round ratios.
CPU seconds of this process (all threads) are recorded too: time stolen by
other tenants does not distort them.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import time


def interleave(runners, rounds, examples_per_epoch):
    """Time `runners[name].epoch()` for `rounds` rounds; return (wall, cpu) lists per name."""
    names = list(runners)
    wall = {name: [] for name in names}
    cpu = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]  # rotate who goes first
        for name in order:
            w0, c0 = time.perf_counter(), time.process_time()
            runners[name].epoch()
            # Each pays for its own garbage: a distributed iterator left in a reference cycle
            # is otherwise freed by whichever configuration's epoch the collector runs in,
            # and freeing one waits for tf.data's threads (up to its autotuning's period, which
            # grows with the iterator's age: seconds). That moved one contender's cost into
            # another's figures (docs/performance.md, the redesign's multi-worker runs).
            gc.collect()
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
        print(f"round {r + 1}: " + ", ".join(
            f"{n.split(' (')[0]} {examples_per_epoch / wall[n][-1]:,.0f}" for n in names),
            flush=True)
    return wall, cpu


def ratio(table, name, base):
    """Median over rounds of base-time / name-time: > 1 means `name` is faster."""
    if base not in table:
        return float("nan")
    return statistics.median(b / a for a, b in zip(table[name], table[base]))


def machine():
    import platform

    import keras
    import tensorflow as tf
    return (f"{platform.machine()}, {os.cpu_count()} cores, TF {tf.__version__}, "
            f"Keras {keras.__version__}")


def report(rounds, rows, wall, cpu, json_path=None):
    """Print the closing line and optionally write everything as JSON."""
    print(f"\n{time.strftime('%Y-%m-%d')} on {machine()}; {rounds} timed epochs each, "
          "interleaved; ratios are medians of within-round ratios")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"rows": rows, "wall": wall, "cpu": cpu, "machine": machine(),
                       "date": time.strftime("%Y-%m-%d")}, f, indent=1)


class FitEpochs:
    """`epoch()` trains one more epoch of the same kerastrain run (fit with `initial_epoch`).

    The first epoch runs at creation, as a warm-up (tracing, first pass), untimed.
    """

    def __init__(self, trainer, **fit_kwargs):
        self.trainer = trainer
        self.fit_kwargs = fit_kwargs
        self.epochs = 0
        self.epoch()

    def epoch(self):
        self.epochs += 1
        self.trainer.fit(epochs=self.epochs, initial_epoch=self.epochs - 1, **self.fit_kwargs)


def in_child_processes(script, values, label, args):
    """Run `script --child V --rounds R --steps S` for each value; return {V: its RESULT JSON}.

    One process per value: a process connects to one TensorFlow cluster only. The
    child prints its rounds and one line `RESULT {json}`.
    """
    import subprocess
    import sys
    results = {}
    for value in values:
        proc = subprocess.run(
            [sys.executable, script, "--child", str(value), "--rounds", str(args.rounds),
             "--steps", str(args.steps)], capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            sys.exit(f"the run for {label(value)} failed:\n{proc.stdout[-2000:]}\n"
                     f"{proc.stderr[-4000:]}")
        print(f"{label(value)}:")
        print("\n".join("  " + line for line in proc.stdout.splitlines()
                        if line.startswith("round")))
        results[value] = json.loads(lines[0][len("RESULT "):])
    return results


def parse_args(description, option, default, help_text, rounds=5, steps=200):
    """Arguments shared by the multi-process benchmarks: `option` picks the child runs."""
    import argparse
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(option, default=default, help=help_text)
    parser.add_argument("--rounds", type=int, default=rounds, help="timed epochs per configuration")
    parser.add_argument("--steps", type=int, default=steps, help="steps per epoch")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args()
