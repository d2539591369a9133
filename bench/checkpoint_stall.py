"""What a checkpoint costs a running job: training with checkpoints written in the foreground,
in the background (TensorFlow's asynchronous save, kerastrain's default) and with none.

A ~100 MB model (an MLP of 25 M float32 parameters, 1024-4096-4096-1024, Adam: each
checkpoint holds the weights and both slots, ~300 MB) trains `--steps` steps per timed fit
with a checkpoint every `--every` steps (`at_epoch_end` off, so only those). Three Trainers
in one process, each its own model_dir, take turns one fit each (bench/_rounds.py): the
training time lost per checkpoint is (fit time - the no-checkpoint fit's time) / checkpoints
per fit, median over rounds. A timed fit ends only once its last checkpoint is whole (as
every `fit` does), so the background figure includes the wait for one write.

Also printed: the time training is blocked per checkpoint (inside the save call: the copy,
and a wait for the previous write if it is still going; and the end-of-fit wait, once a fit,
shared among its checkpoints), which is what is lost where the writer thread has a core of its
own; and the part inside the save calls alone, what each checkpoint of a long fit costs. `--train-threads 1` gives
training one core of the two (TensorFlow's op thread pools), as on a GPU host whose cores are
mostly idle: the writer then runs beside training instead of taking CPU from it.

    python bench/checkpoint_stall.py [--rounds 5] [--steps 40] [--every 10] [--train-threads N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from _rounds import interleave, machine  # noqa: E402

BATCH, WIDTH = 64, 1024


def build():
    import keras
    model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(4096, activation="relu"),
                              keras.layers.Dense(4096, activation="relu"),
                              keras.layers.Dense(WIDTH)])
    model.compile(optimizer="adam", loss="mse")
    return model


class Run:
    """One Trainer; `epoch()` trains `steps` more steps: `fit(epochs=1)` again, which (as
    Keras's `fit`) trains one more epoch."""

    def __init__(self, root, name, checkpoint, steps):
        import numpy as np
        import tensorflow as tf

        import kerastrain as kt
        x = np.random.RandomState(0).rand(BATCH * steps, WIDTH).astype("float32")

        def dataset_fn(ctx):
            return tf.data.Dataset.from_tensor_slices((x, x)).batch(BATCH).repeat()
        self.steps = steps
        self.trainer = kt.Trainer(build, dataset_fn, strategy="default", verbose=0, seed=0,
                                  model_dir=os.path.join(root, name), tensorboard=False,
                                  checkpoint=checkpoint, steps_per_loop=1)
        self.trainer.fit(epochs=1, steps_per_epoch=steps)   # traces, builds the slots, warms
        self.blocked = []  # per timed fit: seconds training waited on checkpointing
        self.in_save = []  # of which inside the save calls (the rest: the end-of-fit wait)
        checkpointer = self.trainer._state.run.checkpointer
        if checkpointer is not None:
            self._time_blocking(checkpointer)

    def _time_blocking(self, checkpointer):
        import time
        inside = []

        def timed(method, name):
            def call(*args):
                if inside:  # `save` waits for the previous write itself
                    return method(*args)
                inside.append(1)
                start = time.perf_counter()
                try:
                    return method(*args)
                finally:
                    inside.clear()
                    self._blocked[name] += time.perf_counter() - start
            return call
        checkpointer.save = timed(checkpointer.save, "save")
        checkpointer.wait = timed(checkpointer.wait, "wait")

    def epoch(self):
        self._blocked = {"save": 0.0, "wait": 0.0}
        self.trainer.fit(epochs=1, steps_per_epoch=self.steps)
        self.blocked.append(sum(self._blocked.values()))
        self.in_save.append(self._blocked["save"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--train-threads", type=int, default=0,
                        help="TensorFlow's intra- and inter-op threads (0: its default)")
    args = parser.parse_args()
    if args.train_threads:
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(args.train_threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.train_threads)
    root = tempfile.mkdtemp(prefix="kerastrain-ckpt-stall-")
    saves = args.steps // args.every
    common = {"at_epoch_end": False, "export": False, "max_to_keep": 2}
    try:
        runs = {
            "no checkpoints": Run(root, "none", False, args.steps),
            "foreground": Run(root, "fg", dict(common, every_steps=args.every,
                                               background=False), args.steps),
            "background": Run(root, "bg", dict(common, every_steps=args.every,
                                               background=True), args.steps),
        }
        model = runs["background"].trainer.model
        params = model.count_params()
        assert runs["background"].trainer._state.run.checkpointer.background
        wall, cpu = interleave(runs, args.rounds, args.steps * BATCH)
        base = wall["no checkpoints"]
        print(f"\nmodel: {params:,} parameters ({params * 4 / 1e6:,.0f} MB; checkpoint with "
              f"Adam's slots ~{params * 12 / 1e6:,.0f} MB); {args.steps} steps per fit, a "
              f"checkpoint every {args.every}: {saves} per fit")
        for name in runs:
            median = statistics.median(wall[name])
            line = f"{name:<16} fit median {median:6.2f} s"
            if name != "no checkpoints":
                lost = statistics.median((w - b) / saves for w, b in zip(wall[name], base))
                blocked = statistics.median(runs[name].blocked) / saves
                in_save = statistics.median(runs[name].in_save) / saves
                line += (f"; lost per checkpoint {lost:5.2f} s; training blocked per "
                         f"checkpoint {blocked:5.3f} s ({in_save:5.3f} s in the save call, "
                         "the rest the end-of-fit wait for the last write)")
            print(line)
        print(f"background / foreground fit time: "
              f"{statistics.median(b / f for b, f in zip(wall['background'], wall['foreground'])):.3f}")
        import time
        threads = f"; training threads {args.train_threads}" if args.train_threads else ""
        print(f"\n{time.strftime('%Y-%m-%d')} on {machine()}; {args.rounds} interleaved rounds"
              f"{threads}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
