"""CPU cost of one pass of shuffled NumPy batch indices: the per-example tf.data shuffle
kerastrain used before vs the per-pass permutation it uses now (`numpy_data.NumpyData.indices`).

Usage: python bench/numpy_order.py [--examples 65536] [--batch 256] [--rounds 7]
Prints, per pipeline, the median CPU and wall seconds of one pass (indices and the gather of
64 float32 features), the two taking turns in each round.
"""

import argparse
import resource
import statistics
import time

import numpy as np


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=65536)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    import tensorflow as tf

    from kerastrain.data import numpy_data as data_lib

    n, b = args.examples, args.batch
    x = np.random.rand(n, 64).astype("float32")
    y = np.random.rand(n, 1).astype("float32")
    numpy_data = data_lib.NumpyData((x, y), b, shuffle=True, seed=0)

    def per_example_shuffle():
        ds = tf.data.Dataset.range(n).shuffle(n, seed=0, reshuffle_each_iteration=True).batch(b)
        return ds.map(numpy_data.gather)

    def per_pass_permutation():
        return numpy_data.indices().map(numpy_data.gather)

    pipelines = {"Dataset.range(n).shuffle(n) (before)": per_example_shuffle(),
                 "per-pass permutation (now)": per_pass_permutation()}
    times = {name: ([], []) for name in pipelines}
    for _ in range(args.rounds):
        for name, ds in pipelines.items():
            c0, t0 = cpu_seconds(), time.perf_counter()
            for _ in ds:
                pass
            times[name][0].append(cpu_seconds() - c0)
            times[name][1].append(time.perf_counter() - t0)
    print(f"{n} examples, batches of {b}, {args.rounds} rounds: median seconds per pass")
    for name, (cpu, wall) in times.items():
        print(f"  {name:40s} CPU {statistics.median(cpu):.3f}  wall {statistics.median(wall):.3f}")


if __name__ == "__main__":
    main()
