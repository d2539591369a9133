"""Lazy optimizers: step time and bytes written per step as an embedding table grows.

Workload (issue 17): ids (batch 256, 8 ids per example, uniform over the table)
-> Embedding(ROWS, 32) -> Flatten -> Dense(64, relu) -> Dense(1), mse, on one
device, trained by a kerastrain Trainer (default `steps_per_loop="auto"`) with
`keras.optimizers.Adam(1e-3)` and with `kerastrain.optimizers.LazyAdam(1e-3)`,
every optimizer and table size taking turns one epoch each in one process
(bench/_rounds.py).

Bytes written per step are estimated, not measured: a Keras Adam step writes
the whole table and both moments (3 x ROWS x 32 x 4 bytes); a lazy step writes
the touched rows of each (3 x unique ids x 128 bytes), the unique ids counted on
the data. A batch touches at most 2,048 rows whatever the table's size, so the
lazy figures should stay flat from 20,000 to 2,000,000 rows while Adam's grow
with the table.

    python bench/lazy.py [--rows 20000,200000,2000000] [--rounds 5] [--steps 20] [--json f]
"""

from __future__ import annotations

import json
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _rounds import FitEpochs, interleave, machine, parse_args  # noqa: E402
from embeddings import DIM, build_model, dataset_fn  # noqa: E402  (the same workload)

SLOTS = 2
ADAM, LAZY = "keras Adam", "LazyAdam"


def unique_ids_per_step(rows, steps):
    import numpy as np
    batches = dataset_fn(rows)().take(steps).as_numpy_iterator()
    return statistics.median(len(np.unique(x)) for x, _ in batches)


def within_rounds(times, base):
    """Median over rounds of times[r] / base[r]: epochs run seconds apart on a drifting host."""
    return statistics.median(a / b for a, b in zip(times, base))


def runners_for(rows, steps):
    import keras

    import kerastrain as kt
    from kerastrain import optimizers
    runners = {}
    for name, optimizer in ((ADAM, lambda: keras.optimizers.Adam(1e-3)),
                            (LAZY, lambda: optimizers.LazyAdam(1e-3))):
        trainer = kt.Trainer(lambda optimizer=optimizer: build_model(keras, rows, optimizer),
                             dataset_fn(rows), strategy="one_device", seed=0, verbose=0)
        runners[(rows, name)] = FitEpochs(trainer, steps_per_epoch=steps)
    return runners


def main():
    args = parse_args(__doc__.splitlines()[0], "--rows", "20000,200000,2000000",
                      "table sizes, comma-separated", rounds=5, steps=20)
    sizes = [int(v) for v in args.rows.split(",")]
    runners = {}
    for rows in sizes:
        runners.update({f"{name} ({rows:,} rows)": runner
                        for (_, name), runner in runners_for(rows, args.steps).items()})
    # Every size and optimizer takes its turn in each round, so growth ratios compare
    # epochs run seconds apart on this drifting host.
    wall, cpu = interleave(runners, args.rounds, args.steps)
    row_bytes = DIM * 4 * (1 + SLOTS)
    print(f"\n{'rows':>10}  {'optimizer':<12}{'ms/step':>9}{'cpu ms':>8}{'time x':>8}"
          f"{'cpu x':>7}{'x Adam':>8}{'MB written':>12}{'bytes x':>9}")
    rows_out = []
    for name in (ADAM, LAZY):
        base = f"{name} ({sizes[0]:,} rows)"
        base_bytes = None
        for rows in sizes:
            key = f"{name} ({rows:,} rows)"
            written = rows * row_bytes if name == ADAM else (
                unique_ids_per_step(rows, args.steps) * row_bytes)
            base_bytes = base_bytes or written
            row = {"rows": rows, "optimizer": name,
                   "ms_per_step": 1000 * statistics.median(wall[key]) / args.steps,
                   "cpu_ms_per_step": 1000 * statistics.median(cpu[key]) / args.steps,
                   "time_vs_smallest": within_rounds(wall[key], wall[base]),
                   "cpu_vs_smallest": within_rounds(cpu[key], cpu[base]),
                   "faster_than_adam": within_rounds(wall[f"{ADAM} ({rows:,} rows)"], wall[key]),
                   "mb_written_per_step": written / 1e6,
                   "bytes_vs_smallest": written / base_bytes}
            rows_out.append(row)
            print(f"{rows:>10,}  {name:<12}{row['ms_per_step']:>9.1f}{row['cpu_ms_per_step']:>8.1f}"
                  f"{row['time_vs_smallest']:>8.2f}{row['cpu_vs_smallest']:>7.2f}"
                  f"{row['faster_than_adam']:>8.2f}{row['mb_written_per_step']:>12.3f}"
                  f"{row['bytes_vs_smallest']:>9.2f}")
    print(f"\n{machine()}; {args.rounds} timed epochs of {args.steps} steps each, every size "
          "and optimizer interleaved in one process. time x / cpu x: wall / process CPU time "
          "over the smallest table's, x Adam: Keras Adam's wall time over this one's, each the "
          "median of within-round ratios; MB written per step: estimated, rows x 128 B x "
          "(1 + 2 slots)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows_out, "wall": wall, "cpu": cpu, "machine": machine()}, f,
                      indent=1)


if __name__ == "__main__":
    main()
