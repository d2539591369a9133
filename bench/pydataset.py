"""A `keras.utils.PyDataset` and a Python generator as `fit`'s input: kerastrain against
`model.fit`, the same model and the same Python batches, epochs interleaved.

Both read the Python object through Keras's own adapters (`workers`, `use_multiprocessing`
as given), so what is compared is everything after: kerastrain's loop against Keras's.
Four contenders, each its own model (same seed): `model.fit` and `kerastrain` on a
PyDataset, `model.fit` and `kerastrain` on a generator (one pass an epoch, made anew).
The model is the core MLP (64 features, 256 hidden, Adam, batches of 256) on one device.

    python bench/pydataset.py [--rounds 7] [--batches 200] [--workers 1]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import _rounds  # noqa: E402

BATCH, FEATURES = 256, 64


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=200, help="batches an epoch")
    parser.add_argument("--workers", type=int, default=1, help="the PyDataset's workers")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import keras
    import numpy as np

    import kerastrain as kt

    rng = np.random.default_rng(0)
    x = rng.random((BATCH * args.batches, FEATURES), dtype=np.float32)
    y = (rng.random((len(x), 1)) > 0.5).astype("float32")

    class Batches(keras.utils.PyDataset):
        def __init__(self):
            super().__init__(workers=args.workers)

        def __len__(self):
            return args.batches

        def __getitem__(self, i):
            return x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]

    def generator():
        for i in range(args.batches):
            yield x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]

    def build():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((FEATURES,)),
                                  keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss=keras.losses.BinaryCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        return model

    class KerasFit:
        def __init__(self, data):
            self.model, self.data = build(), data

        def epoch(self):
            self.model.fit(self.data(), epochs=1, verbose=0)

    class Kerastrain:
        def __init__(self, data):
            self.trainer = kt.Trainer(build(), strategy="one_device", verbose=0,
                                      checkpoint=False, tensorboard=False)
            self.data = data

        def epoch(self):
            self.trainer.fit(self.data(), epochs=1)

    dataset = Batches()
    runners = {
        "model.fit (PyDataset)": KerasFit(lambda: dataset),
        "kerastrain (PyDataset)": Kerastrain(lambda: dataset),
        "model.fit (generator)": KerasFit(generator),
        "kerastrain (generator)": Kerastrain(generator),
    }
    for runner in runners.values():  # tracing and the first pass, untimed
        runner.epoch()
    examples = BATCH * args.batches
    wall, cpu = _rounds.interleave(runners, args.rounds, examples)
    # What was timed trained every batch of every epoch (model.fit on a fresh generator
    # trains one batch more an epoch in Keras 3.15.1: a peeked batch, read twice).
    steps = {name: int(r.model.optimizer.iterations.numpy()) if isinstance(r, KerasFit)
             else r.trainer.global_step for name, r in runners.items()}
    print("optimizer steps:", steps)
    assert all(n == args.batches * (args.rounds + 1) for name, n in steps.items()
               if name != "model.fit (generator)"), steps
    import statistics
    rows = []
    for kind in ("PyDataset", "generator"):
        ours, theirs = f"kerastrain ({kind})", f"model.fit ({kind})"
        row = {"input": kind, "kerastrain examples/s": examples / statistics.median(wall[ours]),
               "model.fit examples/s": examples / statistics.median(wall[theirs]),
               "wall ratio": _rounds.ratio(wall, ours, theirs),
               "cpu ratio": _rounds.ratio(cpu, ours, theirs)}
        rows.append(row)
        print(f"{kind}: kerastrain {row['kerastrain examples/s']:,.0f} examples/s, model.fit "
              f"{row['model.fit examples/s']:,.0f}; kerastrain x model.fit (wall / CPU): "
              f"{row['wall ratio']:.2f} / {row['cpu ratio']:.2f}")
    _rounds.report(args.rounds, rows, wall, cpu, args.json)


if __name__ == "__main__":
    main()
