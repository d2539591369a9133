"""tf.data service benchmark: a CPU-heavy map per batch, in the trainer's pipeline or on the service.

Workload (issue 17): 16,384 examples of 64 float32 features, global batch 64 (256
steps a pass), a small MLP on one device. The source is a range of batch indices
(so the service's splits are whole batches, not single examples: a split per example
costs a dispatcher round trip each). The map costs about 2 ms of CPU per batch (a
chain of 64x256 @ 256x256 matmuls, plain TensorFlow ops, so it runs on a service
worker in any process). Configurations, one `fit` epoch each, taking turns:

- local pipeline: the map runs in the trainer's own input pipeline;
- service: `data_service={"dispatcher": "local", "workers": 2}` runs it on two
  in-process tf.data service workers.

    python bench/service.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

N, FEATURES, BATCH, MATMULS = 16384, 64, 64, 24


def data(matmuls=MATMULS):
    import numpy as np
    import tensorflow as tf
    rng = np.random.RandomState(0)
    x = rng.randn(N, FEATURES).astype("float32")
    y = (x[:, :1] > 0).astype("float32")
    w = tf.constant(rng.randn(256, 256).astype("float32") / 16)

    def heavy(a, b):
        h = tf.tile(a, [1, 4])
        for _ in range(matmuls):  # 24: about 2 ms a batch on this machine (measured below)
            h = tf.tanh(h @ w)
        return a + 0.0 * tf.reduce_mean(h), b
    xs, ys = tf.constant(x), tf.constant(y)

    def batch(i):  # the source is batch indices: the service's splits are whole batches
        return xs[i * BATCH:(i + 1) * BATCH], ys[i * BATCH:(i + 1) * BATCH]
    return lambda: tf.data.Dataset.range(N // BATCH).map(batch).map(heavy)


def model():
    import keras
    m = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(1)])
    m.compile(optimizer="adam", loss=keras.losses.BinaryCrossentropy(from_logits=True))
    return m


def map_cost(make):
    """Milliseconds of CPU per batch of the map alone (one pass, sequential)."""
    ds = make()
    started = time.perf_counter()
    n = sum(1 for _ in ds)
    return 1000 * (time.perf_counter() - started) / n


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--matmuls", type=int, default=MATMULS, help="the map's cost")
    args = parser.parse_args()
    import kerastrain as kt
    make = data(args.matmuls)
    print(f"map alone: {map_cost(make):.2f} ms per batch", flush=True)
    trainers = {
        "local pipeline": kt.Trainer(model, strategy="one_device", seed=0, verbose=0),
        "service (2 local workers)": kt.Trainer(model, strategy="one_device", seed=0, verbose=0,
                                                data_service={"workers": 2}),
    }
    for trainer in trainers.values():
        trainer.fit(make, epochs=1)  # warm-up: tracing, the service's first job
    rates = {name: [] for name in trainers}
    for _ in range(args.repeats):
        for name, trainer in trainers.items():
            started = time.perf_counter()
            before = trainer.global_step
            trainer.fit(make, epochs=1)
            rates[name].append((trainer.global_step - before) / (time.perf_counter() - started))
    for name, values in rates.items():
        print(f"{name:28s} median {statistics.median(values):7.1f} steps/s  "
              f"({', '.join(f'{v:.0f}' for v in values)})")
    base, svc = (statistics.median(v) for v in rates.values())
    print(f"service / local: {svc / base:.2f}x  (os.cpu_count()={os.cpu_count()})")
    for trainer in trainers.values():
        trainer.close()


if __name__ == "__main__":
    main()
