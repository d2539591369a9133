"""Core throughput benchmark: kerastrain defaults vs model.fit vs a bare tf.function ceiling.

Workload (issue 2): 65,536 synthetic examples of 64 float32 features, binary
target, Dense(256, relu) -> Dense(256, relu) -> Dense(1), Adam, global batch 256.
Every configuration is built and trained for one warm-up epoch first; then the
configurations take turns, one epoch each, for `--rounds` rounds (3 timed epochs
each at the default). This machine's speed drifts by 2x over minutes (shared
host), so epochs of different configurations are compared within a round,
seconds apart: ratios are medians over rounds of within-round ratios.

Also reported: examples per CPU-second of this process (all threads), which
time stolen by other tenants does not distort.

    python bench/core.py [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _rounds import FitEpochs, interleave, report  # noqa: E402
from _rounds import ratio as rounds_ratio  # noqa: E402

N, FEATURES, BATCH = 65536, 64, 256


class KerastrainDefaults(FitEpochs):
    options = {}

    def __init__(self, x, y):
        import kerastrain as kt
        from kerastrain import examples
        super().__init__(kt.Trainer(examples.build_mlp,
                                    examples.synthetic_dataset_fn(N, FEATURES, BATCH),
                                    seed=0, verbose=0, **self.options))


class KerastrainTensorBoard(KerastrainDefaults):
    """Defaults plus a model_dir: TensorBoard logs at the default cadence (100 steps)."""

    def __init__(self, x, y):
        import tempfile
        # Logging only: the bench calls fit once per epoch, and with checkpoints each
        # call would also save and export, which is not what this row measures.
        self.options = {"model_dir": tempfile.mkdtemp(prefix="kerastrain-bench-"),
                        "checkpoint": False}
        super().__init__(x, y)


class KerastrainJit(KerastrainDefaults):
    # Not a default (Keras keeps XLA off on CPU-only machines); shown for reference.
    options = {"jit_compile": True}


class ModelFit:
    steps_per_execution = 1

    def __init__(self, x, y):
        import keras
        from kerastrain import examples
        keras.utils.set_random_seed(0)
        self.model = examples.build_mlp()
        if self.steps_per_execution != 1:
            self.model.compile(
                optimizer=keras.optimizers.Adam(1e-3),
                loss=keras.losses.BinaryCrossentropy(from_logits=True),
                metrics=[keras.metrics.BinaryAccuracy(threshold=0.0, name="accuracy")],
                steps_per_execution=self.steps_per_execution)
        self.x, self.y = x, y
        self.epoch()

    def epoch(self):
        self.model.fit(self.x, self.y, batch_size=BATCH, epochs=1, verbose=0)


class ModelFit32(ModelFit):
    steps_per_execution = 32


class ModelFit32SameData(ModelFit32):
    """model.fit fed the very dataset kerastrain reads, for a like-for-like input path."""

    def __init__(self, x, y):
        import tensorflow as tf
        from kerastrain import examples
        self.dataset = examples.synthetic_dataset_fn(N, FEATURES, BATCH)(
            tf.distribute.InputContext(1, 0, 1))
        super().__init__(x, y)

    def epoch(self):
        self.model.fit(self.dataset, epochs=1, verbose=0)


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


CONFIGS = {
    "kerastrain defaults": KerastrainDefaults,
    "kerastrain + TensorBoard logging": KerastrainTensorBoard,
    "model.fit defaults": ModelFit,
    "model.fit steps_per_execution=32": ModelFit32,
    "model.fit spe=32, kerastrain's data": ModelFit32SameData,
    "bare tf.function loop (ceiling)": Ceiling,
    "kerastrain jit_compile=True": KerastrainJit,
}
CEILING, FIT = "bare tf.function loop (ceiling)", "model.fit defaults"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed epochs per configuration")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--only", default=None,
                        help="comma-separated configuration names to run (default: all)")
    args = parser.parse_args()
    global CONFIGS
    if args.only:
        wanted = [n.strip() for n in args.only.split(",")]
        unknown = [n for n in wanted if n not in CONFIGS]
        if unknown:
            parser.error(f"unknown configuration(s) {unknown}; choose from {list(CONFIGS)}")
        CONFIGS = {n: CONFIGS[n] for n in wanted}
    from kerastrain import examples
    x, y = examples.synthetic_binary(N, FEATURES)
    runners = {name: cls(x, y) for name, cls in CONFIGS.items()}
    wall, cpu = interleave(runners, args.rounds, N)

    def ratio(name, base, table):
        return rounds_ratio(table, name, base)

    print(f"\n{'configuration':<34}{'ex/s':>9}{'x ceiling':>10}{'x fit':>7}"
          f"{'ex/cpu-s':>10}{'x ceiling':>10}{'x fit':>7}")
    rows = {}
    for name in CONFIGS:
        rows[name] = {
            "examples_per_s": N / statistics.median(wall[name]),
            "x_ceiling": ratio(name, CEILING, wall), "x_model_fit": ratio(name, FIT, wall),
            "examples_per_cpu_s": N / statistics.median(cpu[name]),
            "cpu_x_ceiling": ratio(name, CEILING, cpu), "cpu_x_model_fit": ratio(name, FIT, cpu),
        }
        r = rows[name]
        print(f"{name:<34}{r['examples_per_s']:>9,.0f}{r['x_ceiling']:>10.2f}"
              f"{r['x_model_fit']:>7.2f}{r['examples_per_cpu_s']:>10,.0f}"
              f"{r['cpu_x_ceiling']:>10.2f}{r['cpu_x_model_fit']:>7.2f}")
    if {"kerastrain + TensorBoard logging", "kerastrain defaults"} <= set(wall):
        pairs = list(zip(wall["kerastrain + TensorBoard logging"], wall["kerastrain defaults"]))
        cpu_pairs = list(zip(cpu["kerastrain + TensorBoard logging"], cpu["kerastrain defaults"]))
        print(f"\nTensorBoard logging at the default cadence: epoch time x"
              f"{statistics.median(a / b for a, b in pairs):.3f} (wall), "
              f"x{statistics.median(a / b for a, b in cpu_pairs):.3f} (CPU), medians of "
              "within-round ratios")
    report(args.rounds, rows, wall, cpu, args.json)


if __name__ == "__main__":
    main()
