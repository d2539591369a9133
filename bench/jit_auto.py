"""`jit_compile="auto"`: does the measured choice pick the faster of XLA and no XLA?

For each workload (one device), three Trainers train the same model on the same data:
`jit_compile=False`, `True` and `"auto"`. Each trains untimed epochs until the "auto" one
has decided (its trial: the first loops, XLA and not taking turns, `tuning.JitTrial`), then
one more untimed epoch each, then they take turns one epoch each for `--rounds` rounds
(bench/_rounds.py). Printed per workload: what "auto" chose and the times its trial
measured, then medians of within-round ratios: auto over False, auto over True (> 1: auto
faster), wall and CPU. Right when auto is about as fast as the faster of the two.

Workloads: the core MLP (bench/core.py's: 65,536 examples of 64 features, global batch
256, a `dataset_fn`); a residual MLP of eight LayerNorm-GELU blocks of width 64 (32,768
examples of 32 features, batch 128, NumPy input: many small ops, which XLA fuses); and
bench/real_models.py's convnet and Transformer (NumPy input).

    python bench/jit_auto.py [--only mlp,resmlp,convnet,transformer] [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from _rounds import FitEpochs, interleave, machine, ratio  # noqa: E402

WORKLOADS = ("mlp", "resmlp", "convnet", "transformer")


def build_resmlp():
    """Residual blocks of LayerNorm -> Dense(64, gelu), eight of them: many small ops a step,
    which XLA fuses (keras.io's tabular models and Transformer feed-forward stacks are
    built of such blocks)."""
    import keras
    inputs = keras.Input((32,))
    h = keras.layers.Dense(64)(inputs)
    for _ in range(8):
        r = keras.layers.LayerNormalization()(h)
        h = keras.layers.Add()([h, keras.layers.Dense(64, activation="gelu")(r)])
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile(optimizer="adam", loss="mse")
    return model
CHOICES = {"auto": "auto", "off": False, "xla": True}


def contenders(name, quick):
    """`(examples per epoch, {label: FitEpochs})` of one workload."""
    import kerastrain as kt
    from kerastrain import examples
    if name == "mlp":
        n, batch = (8192 if quick else 65536), 256
        make = lambda jit: kt.Trainer(examples.build_mlp,  # noqa: E731
                                      examples.synthetic_dataset_fn(n, 64, batch), seed=0,
                                      verbose=0, strategy="one_device", jit_compile=jit)
        fit_kwargs = {}
    elif name == "resmlp":
        import numpy as np
        n, rng = (4096 if quick else 32768), np.random.RandomState(0)
        x = rng.rand(n, 32).astype("float32")
        y = (x[:, :4].sum(axis=1, keepdims=True) + 0.1 * rng.randn(n, 1)).astype("float32")
        make = lambda jit: kt.Trainer(build_resmlp, (x, y), seed=0, verbose=0,  # noqa: E731
                                      strategy="one_device", jit_compile=jit)
        fit_kwargs = {"batch_size": 128}
    else:
        import real_models
        workload = real_models.WORKLOAD_CLASSES[name](quick)
        x, y = workload.data()
        n = workload.n
        make = lambda jit: kt.Trainer(workload.build, (x, y), seed=0, verbose=0,  # noqa: E731
                                      strategy="one_device", jit_compile=jit)
        fit_kwargs = {"batch_size": workload.batch}
    runners = {}
    for label, jit in CHOICES.items():
        runners[label] = FitEpochs(make(jit), **fit_kwargs)
    trial = runners["auto"].trainer._state.step.jit_trial
    for _ in range(20):  # the trial's loops run in the first epochs
        if trial.decided is not None:
            break
        runners["auto"].epoch()
    return n, runners, trial


def run(name, rounds, quick):
    started = time.perf_counter()
    n, runners, trial = contenders(name, quick)
    if trial.decided is None:
        print(f"{name}: the trial did not finish in 20 epochs")
        return None
    times = {k: min(v) * 1e3 for k, v in trial.per_step.items()}  # as the trial compares
    print(f"{name}: auto chose jit_compile={trial.decided} (trial: {times[True]:.3f} ms a step "
          f"with XLA, {times[False]:.3f} ms without, {times[True] / times[False]:.2f}x)",
          flush=True)
    for runner in runners.values():  # built and warm: one more untimed epoch each
        runner.epoch()
    wall, cpu = interleave(runners, rounds, n)
    row = {"workload": name, "chose": trial.decided, "trial_ms": times,
           "examples_per_s": {k: n / statistics.median(v) for k, v in wall.items()},
           "auto_over_off": (ratio(wall, "auto", "off"), ratio(cpu, "auto", "off")),
           "auto_over_xla": (ratio(wall, "auto", "xla"), ratio(cpu, "auto", "xla")),
           "seconds": time.perf_counter() - started}
    for runner in runners.values():
        runner.trainer.close()
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small data: checks it runs")
    args = parser.parse_args()
    rows = [row for name in args.only.split(",") if (row := run(name, args.rounds, args.quick))]
    print("\n| workload | auto chose | trial: XLA / no XLA per step | examples/s off / xla / "
          "auto | auto x off (wall / CPU) | auto x xla (wall / CPU) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        eps = r["examples_per_s"]
        print(f"| {r['workload']} | {'XLA' if r['chose'] else 'no XLA'} | "
              f"{r['trial_ms'][True]:.3f} / {r['trial_ms'][False]:.3f} ms | "
              f"{eps['off']:,.0f} / {eps['xla']:,.0f} / {eps['auto']:,.0f} | "
              f"{r['auto_over_off'][0]:.2f} / {r['auto_over_off'][1]:.2f} | "
              f"{r['auto_over_xla'][0]:.2f} / {r['auto_over_xla'][1]:.2f} |")
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')} on {machine()}; {args.rounds} rounds; ratios: "
          "medians of within-round ratios, > 1 when auto is faster")


if __name__ == "__main__":
    main()
