"""Parameter-server benchmark: kerastrain vs tf_keras `model.fit` (the Keras 2 path Keras 3 dropped).

Workload (issue 7): the core MLP (64 features, 2 x 256 hidden, Adam), global
batch 256, synthetic data repeated on every worker, on a local in-process cluster
of N workers and 1 ps on 127.0.0.1, for N = 1, 2, 4. In one process per N, both
frameworks train on the same cluster (the same `ParameterServerStrategy`), taking
turns one epoch of `--steps` steps each (see bench/_rounds.py); ratios are
medians of within-round ratios. Configurations:

- kerastrain defaults (`steps_per_loop="auto"`: 100 steps per scheduled closure);
- tf_keras `model.fit` with `steps_per_execution=100` (the same amortisation);
- tf_keras `model.fit` with its default `steps_per_execution=1`.

Needs `pip install tf_keras` (matching the TensorFlow version).

    python bench/ps.py [--workers 1,2,4] [--rounds 5] [--steps 200] [--json out.json]
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

FEATURES, HIDDEN, BATCH = 64, 256, 256
KERASTRAIN = "kerastrain defaults"


def kerastrain_run(strategy_spec, steps):
    import kerastrain as kt
    from kerastrain import examples
    return FitEpochs(kt.Trainer(
        examples.build_mlp, examples.synthetic_dataset_fn(65536, FEATURES, BATCH, repeat=True),
        strategy=strategy_spec, seed=0, verbose=0), steps_per_epoch=steps)


class TfKeras:
    steps_per_execution = 100

    def __init__(self, strategy, steps):
        import tensorflow as tf
        import tf_keras

        from kerastrain import examples
        tf_keras.utils.set_random_seed(0)
        with strategy.scope():
            self.model = tf_keras.Sequential([
                tf_keras.Input((FEATURES,)),
                tf_keras.layers.Dense(HIDDEN, activation="relu"),
                tf_keras.layers.Dense(HIDDEN, activation="relu"),
                tf_keras.layers.Dense(1),
            ])
            self.model.compile(
                optimizer=tf_keras.optimizers.Adam(1e-3),
                loss=tf_keras.losses.BinaryCrossentropy(from_logits=True),
                metrics=[tf_keras.metrics.BinaryAccuracy(threshold=0.0, name="accuracy")],
                steps_per_execution=self.steps_per_execution)
        dataset_fn = examples.synthetic_dataset_fn(65536, FEATURES, BATCH, repeat=True)
        self.data = tf_keras.utils.experimental.DatasetCreator(
            lambda ctx: dataset_fn(ctx or tf.distribute.InputContext()))
        self.steps = steps
        self.epoch()

    def epoch(self):
        self.model.fit(self.data, epochs=1, steps_per_epoch=self.steps, verbose=0)


class TfKerasDefault(TfKeras):
    steps_per_execution = 1


def child(workers, rounds, steps):
    """Time both frameworks on one local cluster of `workers` workers; print JSON."""
    import kerastrain as kt
    spec = {"name": "ps", "num_workers": workers, "num_ps": 1}
    built = kt.build_strategy(spec)
    runners = {
        KERASTRAIN: kerastrain_run(spec, steps),
        "tf_keras fit, steps_per_execution=100": TfKeras(built.strategy, steps),
        "tf_keras fit, steps_per_execution=1": TfKerasDefault(built.strategy, steps),
    }
    wall, cpu = interleave(runners, rounds, steps)  # "examples" here: steps per epoch
    print("RESULT " + json.dumps({"wall": wall, "cpu": cpu}), flush=True)


def main():
    args = parse_args(__doc__.splitlines()[0], "--workers", "1,2,4", "cluster sizes, comma-separated")
    if args.child is not None:
        child(args.child, args.rounds, args.steps)
        return
    results = in_child_processes(
        __file__, [int(v) for v in args.workers.split(",")], lambda w: f"{w} worker(s)", args)
    print(f"\n{'workers':<9}{'configuration':<40}{'steps/s':>9}{'x tf_keras':>12}"
          f"{'x tf_keras spe=1':>18}")
    rows = []
    for workers, r in results.items():
        for name, times in r["wall"].items():
            row = {"workers": workers, "configuration": name,
                   "steps_per_s": args.steps / statistics.median(times),
                   "vs_tf_keras_spe100": ratio(r["wall"], name,
                                               "tf_keras fit, steps_per_execution=100"),
                   "vs_tf_keras_spe1": ratio(r["wall"], name,
                                             "tf_keras fit, steps_per_execution=1")}
            rows.append(row)
            print(f"{workers:<9}{name:<40}{row['steps_per_s']:>9.1f}"
                  f"{row['vs_tf_keras_spe100']:>12.2f}{row['vs_tf_keras_spe1']:>18.2f}")
    print(f"\n{machine()}; {args.rounds} timed epochs of {args.steps} steps each, interleaved; "
          "ratios are medians of within-round ratios")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "results": results, "machine": machine()}, f, indent=1)


if __name__ == "__main__":
    main()
