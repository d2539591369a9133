"""Checkpoint benchmark: kerastrain's save/restore against bare tf.train.Checkpoint write/read.

A ~50 M-parameter MLP trained one step with Adam (so the checkpoint holds the
weights and both Adam slots: ~150 M floats, ~600 MB). kerastrain saves through
its Checkpointer (CheckpointManager, training state, keep-3 bookkeeping) and
restores with its fallback logic; the baseline writes and reads a
`tf.train.Checkpoint` of the same model and optimizer. Interleaved for
`--rounds` rounds; medians and medians of within-round ratios.

    python bench/checkpoint.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_big():
    import keras
    model = keras.Sequential([
        keras.Input((2048,)),
        keras.layers.Dense(4096, activation="relu"),
        keras.layers.Dense(4096, activation="relu"),
        keras.layers.Dense(4096, activation="relu"),
        keras.layers.Dense(2048),
    ])
    model.compile(optimizer="adam", loss="mse")
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import keras
    import numpy as np
    import tensorflow as tf

    import kerastrain as kt

    def dataset_fn(ctx):
        x = np.zeros((8, 2048), "float32")
        return tf.data.Dataset.from_tensor_slices((x, x)).batch(8)

    root = tempfile.mkdtemp(prefix="kerastrain-ckpt-bench-")
    try:
        trainer = kt.Trainer(build_big, dataset_fn, strategy="default", verbose=0,
                             model_dir=os.path.join(root, "run"), tensorboard=False,
                             checkpoint={"at_epoch_end": False, "export": False,
                                         "background": False})  # the whole write is timed
        trainer.fit(epochs=1, steps_per_epoch=1)  # builds optimizer slots
        model = trainer.model
        params = model.count_params()
        variables = len(model.variables) + len(model.optimizer.variables)
        floats = sum(int(np.prod(v.shape)) for v in model.variables + model.optimizer.variables)
        ckpt = trainer._state.run.checkpointer
        bare = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
        bare_prefix = os.path.join(root, "bare", "ckpt")
        times = {k: [] for k in ("kerastrain save", "bare write", "kerastrain restore",
                                 "bare read")}
        def kt_save(step):
            return ckpt.save(step)

        def bare_write(step):
            bare.write(bare_prefix)

        def kt_restore(step):
            return ckpt.restore()

        def bare_read(step):
            bare.read(bare_prefix).assert_existing_objects_matched()

        pairs = [(("kerastrain save", kt_save), ("bare write", bare_write)),
                 (("kerastrain restore", kt_restore), ("bare read", bare_read))]
        path = None
        for r in range(args.rounds):
            step = 1000 + r
            for pair in pairs:
                # Alternate who goes first, so neither always meets a warmer cache.
                for name, fn in (pair if r % 2 == 0 else pair[::-1]):
                    t = time.perf_counter()
                    out = fn(step)
                    times[name].append(time.perf_counter() - t)
                    if name == "kerastrain save":
                        path = out
                    elif name == "kerastrain restore":
                        assert out == path, (out, path)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()),
                  flush=True)
        size = sum(os.path.getsize(os.path.join(os.path.dirname(path), f))
                   for f in os.listdir(os.path.dirname(path))
                   if f.startswith(os.path.basename(path) + "."))

        def ratio(a, b):
            return statistics.median(x / y for x, y in zip(times[a], times[b]))

        print(f"\nmodel: {params:,} parameters; checkpoint: {variables} variables, "
              f"{floats:,} floats, {size / 2**20:,.0f} MiB")
        for k, v in times.items():
            print(f"{k:<20} median {statistics.median(v):.2f}s")
        print(f"save    kerastrain / bare write: {ratio('kerastrain save', 'bare write'):.3f}x")
        print(f"restore kerastrain / bare read:  {ratio('kerastrain restore', 'bare read'):.3f}x")
        print(f"\n{time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores, "
              f"TF {tf.__version__}, Keras {keras.__version__}; {args.rounds} interleaved rounds")
        trainer.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
