"""Start-up benchmark: the CPU a short `kerastrain run` costs, from one source tree or several.

Each round runs, for every tree in turn, a fresh `python -m kerastrain.cli run` of the
quickstart recipe for 4 steps of one epoch (the suite's and a restarted task's typical
process: start, trace, a few steps, checkpoint, export) and reads its CPU time (user +
system, `os.wait4`) and wall time. Pass `--tree NAME=PATH` for each source tree to compare,
e.g. a `git worktree` of an older commit beside this one; medians over interleaved rounds.

    python bench/startup.py [--rounds 5] [--tree new=. --tree old=/tmp/kt-old]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_once(tree: str, work: str) -> tuple[float, float]:
    model_dir = os.path.join(work, "run")
    shutil.rmtree(model_dir, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=tree, TF_CPP_MIN_LOG_LEVEL="2")
    command = [sys.executable, "-m", "kerastrain.cli", "run",
               os.path.join(tree, "recipes", "quickstart.yaml"),
               "--set", "trainer.epochs=1", "--set", "trainer.steps_per_epoch=4",
               "--set", f"trainer.model_dir={model_dir}"]
    start = time.monotonic()
    process = subprocess.Popen(command, env=env, cwd=work, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.monotonic() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{tree}: kerastrain run exited {process.returncode}:\n"
                         f"{process.stderr.read()[-2000:]}")
    return usage.ru_utime + usage.ru_stime, wall


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tree", action="append", default=None, metavar="NAME=PATH",
                        help="a source tree to run (repeatable; default: this one)")
    args = parser.parse_args(argv)
    trees = dict(t.split("=", 1) for t in (args.tree or [f"this={REPO}"]))
    trees = {name: os.path.abspath(path) for name, path in trees.items()}
    results = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="kt-startup-") as work:
        for r in range(args.rounds):
            for name, tree in trees.items():
                results[name].append(run_once(tree, work))
                cpu, wall = results[name][-1]
                print(f"round {r + 1} {name}: {cpu:.2f} CPU-s, {wall:.2f} s", flush=True)
    print(f"\nmedians over {args.rounds} interleaved rounds (4 steps of the quickstart recipe):")
    first = None
    for name, rows in results.items():
        cpu = statistics.median(c for c, _ in rows)
        wall = statistics.median(w for _, w in rows)
        first = first or cpu
        print(f"  {name:>10}: {cpu:6.2f} CPU-s  {wall:6.2f} s wall  ({cpu / first:.2f}x the "
              f"first tree's CPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
