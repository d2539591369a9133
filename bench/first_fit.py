"""What a fresh Trainer's first `fit` costs, with and without `tuning.unroll_steps`.

Wall and CPU of a whole first `fit` (tracing, graph optimization and the steps) of the core
MLP (64 features, 256 hidden, Adam, batch 256, NumPy input, one device), for a short and a
long fit, the two settings taking turns in one process; medians of the rounds.

    python bench/first_fit.py [--rounds 3] [--steps 50,3000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", default="50,3000")
    args = parser.parse_args()
    import keras
    import numpy as np

    import kerastrain as kt

    def build():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss=keras.losses.BinaryCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        return model

    lengths = [int(s) for s in args.steps.split(",")]
    rng = np.random.default_rng(0)
    x = rng.random((256 * max(lengths), 64), dtype=np.float32)
    y = (rng.random((len(x), 1)) > 0.5).astype("float32")
    found = {}
    for _ in range(args.rounds):
        for steps in lengths:
            for unroll in (False, True):
                trainer = kt.Trainer(build, strategy="one_device", seed=1, verbose=0,
                                     tuning={"unroll_steps": unroll})
                wall, cpu = time.perf_counter(), time.process_time()
                trainer.fit(x, y, batch_size=256, epochs=1, steps_per_epoch=steps)
                found.setdefault((steps, unroll), []).append(
                    (time.perf_counter() - wall, time.process_time() - cpu))
    print(f"{'steps':>6} {'unroll_steps':>12} {'wall s':>8} {'cpu s':>8}   medians of {args.rounds}")
    for (steps, unroll), runs in sorted(found.items()):
        print(f"{steps:>6} {str(unroll):>12} {statistics.median(w for w, _ in runs):8.2f} "
              f"{statistics.median(c for _, c in runs):8.2f}")


if __name__ == "__main__":
    main()
