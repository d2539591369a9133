"""Core throughput benchmark: kerastrain defaults vs model.fit vs a bare tf.function ceiling.

Workload (issue 2): 65,536 synthetic examples of 64 float32 features, binary
target, Dense(256, relu) -> Dense(256, relu) -> Dense(1), Adam, global batch 256,
one warm-up epoch then 3 timed epochs per configuration. Configurations run
interleaved in one process for `--repeats` rounds; the figure is the median of
all timed epochs, in examples/second.

    python bench/core.py [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

N, FEATURES, BATCH, TIMED = 65536, 64, 256, 3


class EpochTimer:
    def __init__(self):
        import keras

        timer = self

        class _Callback(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                timer.start = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                timer.seconds.append(time.perf_counter() - timer.start)

        self.seconds = []
        self.callback = _Callback()


def run_kerastrain(x, y, **options):
    import kerastrain as kt
    from kerastrain import examples
    timer = EpochTimer()
    trainer = kt.Trainer(examples.build_mlp, examples.synthetic_dataset_fn(N, FEATURES, BATCH),
                         seed=0, verbose=0, **options)
    trainer.fit(epochs=1 + TIMED, callbacks=[timer.callback])
    return timer.seconds[1:]


def run_model_fit(x, y, steps_per_execution=1):
    import keras
    from kerastrain import examples
    keras.utils.set_random_seed(0)
    model = examples.build_mlp()
    if steps_per_execution != 1:
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.BinaryCrossentropy(from_logits=True),
                      metrics=[keras.metrics.BinaryAccuracy(threshold=0.0, name="accuracy")],
                      steps_per_execution=steps_per_execution)
    timer = EpochTimer()
    model.fit(x, y, batch_size=BATCH, epochs=1 + TIMED, verbose=0, callbacks=[timer.callback])
    return timer.seconds[1:]


def run_ceiling(x, y):
    """Bare loop: batches already in memory as one tensor, one tf.function call per epoch."""
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

    seconds = []
    for e in range(1 + TIMED):
        start = time.perf_counter()
        epoch()
        seconds.append(time.perf_counter() - start)
    return seconds[1:]


CONFIGS = {
    "kerastrain defaults": run_kerastrain,
    "model.fit defaults": run_model_fit,
    "model.fit steps_per_execution=32": lambda x, y: run_model_fit(x, y, 32),
    "bare tf.function loop (ceiling)": run_ceiling,
    # Not a default (Keras keeps XLA off on CPU-only machines); shown for reference.
    "kerastrain jit_compile=True": lambda x, y: run_kerastrain(x, y, jit_compile=True),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    import keras
    import tensorflow as tf
    from kerastrain import examples
    x, y = examples.synthetic_binary(N, FEATURES)
    seconds = {name: [] for name in CONFIGS}
    for r in range(args.repeats):
        for name, fn in CONFIGS.items():
            seconds[name].extend(fn(x, y))
            print(f"round {r + 1}: {name}: {N / statistics.median(seconds[name][-TIMED:]):,.0f} ex/s",
                  flush=True)
    rates = {name: N / statistics.median(s) for name, s in seconds.items()}
    # This machine's speed drifts by 2x over minutes (shared host), so also compare
    # configurations within each round, where they ran seconds apart.
    per_round = {name: [N / statistics.median(s[r * TIMED:(r + 1) * TIMED])
                        for r in range(args.repeats)] for name, s in seconds.items()}
    ceiling_name, fit_name = "bare tf.function loop (ceiling)", "model.fit defaults"

    def round_ratio(name, base):
        return statistics.median(a / b for a, b in zip(per_round[name], per_round[base]))

    print(f"\n{'configuration':<36}{'examples/s':>12}{'x ceiling':>11}{'x model.fit':>13}")
    for name, rate in rates.items():
        print(f"{name:<36}{rate:>12,.0f}{round_ratio(name, ceiling_name):>11.2f}"
              f"{round_ratio(name, fit_name):>13.2f}")
    print("(examples/s: median of all timed epochs; ratios: median over rounds of the ratio "
          "within a round)")
    machine = f"{platform.machine()}, {os.cpu_count()} cores, TF {tf.__version__}, Keras {keras.__version__}"
    print(f"\n{time.strftime('%Y-%m-%d')} on {machine}; median of {args.repeats}x{TIMED} timed epochs")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rates": rates, "per_round": per_round, "machine": machine, "date": time.strftime("%Y-%m-%d"),
                       "seconds": seconds}, f, indent=1)


if __name__ == "__main__":
    main()
