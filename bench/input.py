"""Input benchmark: the core workload read from 8 TFRecord files vs the same from memory.

Workload (issue 3): the core benchmark's 65,536 examples of 64 float32 features
and its MLP, global batch 256, written once to 8 TFRecord files of
`tf.train.Example`s, then trained on with kerastrain's defaults from:

- memory, dataset_fn: `examples.synthetic_dataset_fn` (tensors in memory, the
  core benchmark's input);
- memory, NumPy: `trainer.fit((x, y), batch_size=256)`;
- files: `kerastrain.data.files(pattern, parse, batch_size=256)` (parallel
  interleaved reads, file order shuffled each epoch, vectorised parsing), with tf.data's
  shared pool (`threads=None`), and batched within files (`batch_within_files=True`).

Configurations take turns one epoch each (see bench/_rounds.py).

    python bench/input.py [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _rounds import FitEpochs, interleave, ratio, report  # noqa: E402

N, FEATURES, BATCH = 65536, 64, 256
MEMORY = "memory (dataset_fn)"


def run(data, **fit_kwargs):
    import kerastrain as kt
    from kerastrain import examples
    return FitEpochs(kt.Trainer(examples.build_mlp, data, seed=0, verbose=0), **fit_kwargs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed epochs per configuration")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()

    import kerastrain as kt
    from kerastrain import examples

    x, y = examples.synthetic_binary(N, FEATURES)
    directory = tempfile.mkdtemp(prefix="kerastrain-bench-records-")
    try:
        t0 = time.perf_counter()
        examples.write_tfrecords(directory, x, y, num_files=8)
        size = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))
        print(f"wrote 8 TFRecord files, {size / 2**20:.1f} MiB, in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        pattern = os.path.join(directory, "*.tfrecord")
        parse = examples.example_parser(FEATURES, 1)
        runners = {
            MEMORY: run(examples.synthetic_dataset_fn(N, FEATURES, BATCH)),
            "memory (NumPy arrays)": run((x, y), batch_size=BATCH),
            "8 TFRecord files": run(lambda: kt.data.files(pattern, parse, batch_size=BATCH)),
            # tf.data's shared, autotuned thread pool instead of the small-host default.
            "8 TFRecord files, threads=None": run(
                lambda: kt.data.files(pattern, parse, batch_size=BATCH, threads=None)),
            # The faster mode: batches made within files (other batches, same records).
            "8 files, batch_within_files": run(lambda: kt.data.files(
                pattern, parse, batch_size=BATCH, batch_within_files=True)),
        }
        wall, cpu = interleave(runners, args.rounds, N)
    finally:
        shutil.rmtree(directory, ignore_errors=True)

    print(f"\n{'configuration':<30}{'ex/s':>9}{'x memory':>10}{'ex/cpu-s':>10}{'x memory':>10}")
    rows = {}
    for name in runners:
        rows[name] = {"examples_per_s": N / statistics.median(wall[name]),
                      "x_memory": ratio(wall, name, MEMORY),
                      "examples_per_cpu_s": N / statistics.median(cpu[name]),
                      "cpu_x_memory": ratio(cpu, name, MEMORY)}
        r = rows[name]
        print(f"{name:<30}{r['examples_per_s']:>9,.0f}{r['x_memory']:>10.2f}"
              f"{r['examples_per_cpu_s']:>10,.0f}{r['cpu_x_memory']:>10.2f}")
    report(args.rounds, rows, wall, cpu, args.json)


if __name__ == "__main__":
    main()
