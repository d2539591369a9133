"""Partitioned embedding tables on parameter servers: kerastrain vs tf_keras `model.fit`.

Workload (issue 8): ids (global batch 256, 8 ids per example) -> Embedding(ROWS, 32)
-> Flatten -> Dense(64, relu) -> Dense(1), Adam, on a local in-process cluster of
1 worker and 2 ps on 127.0.0.1, the table split in 2 shards (one per ps) by
`min_size(min_shard_bytes=256 KiB, max_shards=2)`. Both frameworks train on the
same cluster with the same `ParameterServerStrategy` and partitioner, in one
process per table size, taking turns one epoch each (bench/_rounds.py):

- kerastrain defaults (`steps_per_loop="auto"`);
- tf_keras `model.fit` with `steps_per_execution=100` (the same amortisation).

Bytes moved: every byte between the worker and the ps tasks crosses the loopback
interface (gRPC over TCP, even in one process), so the benchmark reads the `lo`
byte counter of /proc/net/dev around each epoch and divides by the steps. It is
run for a table of 100,000 rows and one 10x larger: a step touches at most
2,048 rows either way, so bytes per step should not grow with the table.

Needs `pip install tf_keras` (matching the TensorFlow version) and Linux.

    python bench/embeddings.py [--rows 100000,1000000] [--rounds 5] [--steps 200] [--json f]
"""

from __future__ import annotations

import json
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _rounds import (FitEpochs, in_child_processes, interleave, machine,  # noqa: E402
                     parse_args, ratio)

DIM, IDS, BATCH, HIDDEN = 32, 8, 256, 64
SPLIT = {"name": "min_size", "min_shard_bytes": 256 << 10, "max_shards": 2}
KERASTRAIN = "kerastrain defaults"
TF_KERAS = "tf_keras fit, steps_per_execution=100"


def loopback_bytes() -> int:
    """Bytes received on the loopback interface so far (each byte is sent once, received once)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[0])
    raise RuntimeError("no loopback interface in /proc/net/dev")


def dataset_fn(rows):
    """Random ids (uniform over the table) and a target that depends on them, repeated."""
    def make(ctx=None):
        import tensorflow as tf
        seed = 0 if ctx is None else ctx.input_pipeline_id
        ids = tf.random.stateless_uniform((64 * BATCH, IDS), seed=(seed, 1), maxval=rows,
                                          dtype=tf.int32)
        y = tf.cast(ids[:, :1] % 7, tf.float32) / 7.0
        return tf.data.Dataset.from_tensor_slices((ids, y)).batch(BATCH).repeat()
    return make


def build_model(keras, rows, optimizer=None):
    """The ranking MLP over an `Embedding(rows, DIM)`; `optimizer()` makes its optimizer
    (default Adam(1e-3))."""
    model = keras.Sequential([
        keras.Input((IDS,), dtype="int32"),
        keras.layers.Embedding(rows, DIM),
        keras.layers.Flatten(),
        keras.layers.Dense(HIDDEN, activation="relu"),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer=optimizer() if optimizer else keras.optimizers.Adam(1e-3), loss="mse",
                  **({"steps_per_execution": 100} if keras.__name__ == "tf_keras" else {}))
    return model


class Counted:
    """An epoch runner that also records loopback bytes per epoch."""

    def __init__(self, runner):
        self.runner = runner
        self.bytes = []

    def epoch(self):
        before = loopback_bytes()
        self.runner.epoch()
        self.bytes.append(loopback_bytes() - before)


class TfKeras:
    def __init__(self, strategy, rows, steps):
        import tensorflow as tf
        import tf_keras
        tf_keras.utils.set_random_seed(0)
        with strategy.scope():
            self.model = build_model(tf_keras, rows)
        make = dataset_fn(rows)
        self.data = tf_keras.utils.experimental.DatasetCreator(
            lambda ctx: make(ctx or tf.distribute.InputContext()))
        self.steps = steps
        self.epoch()  # warm-up: tracing and the first pass, untimed

    def epoch(self):
        self.model.fit(self.data, epochs=1, steps_per_epoch=self.steps, verbose=0)


def child(rows, rounds, steps):
    import keras

    import kerastrain as kt
    from kerastrain.distribute.ps import partitioning
    spec = {"name": "ps", "num_workers": 1, "num_ps": 2, "variable_partitioner": SPLIT}
    built = kt.build_strategy(spec)
    trainer = kt.Trainer(lambda: build_model(keras, rows), dataset_fn(rows), strategy=spec,
                         seed=0, verbose=0)
    runners = {KERASTRAIN: Counted(FitEpochs(trainer, steps_per_epoch=steps)),
               TF_KERAS: Counted(TfKeras(built.strategy, rows, steps))}
    table = trainer.model.layers[0].embeddings
    shards = [int(s.shape[0]) for s in partitioning.shards_of(table)]
    tf_table = runners[TF_KERAS].runner.model.layers[0].embeddings
    tf_shards = [int(s.shape[0]) for s in getattr(tf_table, "variables", [tf_table])]
    wall, cpu = interleave(runners, rounds, steps)
    per_step = {name: [b / steps for b in r.bytes] for name, r in runners.items()}
    print("RESULT " + json.dumps({"wall": wall, "cpu": cpu, "bytes_per_step": per_step,
                                  "shards": shards, "tf_keras_shards": tf_shards}), flush=True)


def main():
    args = parse_args(__doc__.splitlines()[0], "--rows", "100000,1000000", "table sizes, comma-separated")
    if args.child is not None:
        child(args.child, args.rounds, args.steps)
        return
    results = in_child_processes(
        __file__, [int(v) for v in args.rows.split(",")], lambda r: f"{r:,} rows", args)
    print(f"\n{'rows':>10}  {'configuration':<40}{'shards':>15}{'steps/s':>9}{'x tf_keras':>12}"
          f"{'KB/step':>10}")
    rows_out = []
    for rows, r in results.items():
        for name, times in r["wall"].items():
            shards = r["shards"] if name == KERASTRAIN else r["tf_keras_shards"]
            row = {"rows": rows, "configuration": name, "shards": shards,
                   "steps_per_s": args.steps / statistics.median(times),
                   "vs_tf_keras": ratio(r["wall"], name, TF_KERAS),
                   "cpu_vs_tf_keras": ratio(r["cpu"], name, TF_KERAS),
                   "kb_per_step": statistics.median(r["bytes_per_step"][name]) / 1024}
            rows_out.append(row)
            print(f"{rows:>10,}  {name:<40}{'+'.join(map(str, shards)):>15}"
                  f"{row['steps_per_s']:>9.1f}{row['vs_tf_keras']:>12.2f}"
                  f"{row['kb_per_step']:>10.1f}")
    print(f"\n{machine()}; {args.rounds} timed epochs of {args.steps} steps each, interleaved; "
          "ratios are medians of within-round ratios; KB/step: median loopback bytes per step")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows_out, "results": results, "machine": machine()}, f, indent=1)


if __name__ == "__main__":
    main()
