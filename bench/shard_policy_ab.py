"""A/B: a global-batch dataset under mirrored (2 logical CPUs), TensorFlow's default auto-shard
policy (now) against OFF (before 5a65fcc), 3 epochs each in turn, order alternating."""
import os, time, statistics
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import kerastrain as kt
kt.configure_cpu_devices(2)
import tensorflow as tf
from kerastrain import examples
from kerastrain.data import distributed
x, y = examples.synthetic_binary(65536, 64)
def data():
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(256)
orig = distributed._with_policy
def off(dataset, policy):
    return orig(dataset, "off" if policy == "none" else policy)
trainers = {}
for name in ("default policy (now)", "OFF (before)"):
    distributed._with_policy = orig if name.startswith("default") else off
    t = kt.Trainer(examples.build_mlp, strategy={"name": "mirrored", "cpu_devices": 2}, verbose=0,
                   checkpoint=False, tensorboard=False, seed=0)
    t.fit(data, epochs=1)  # warm-up: trace, steps_per_loop measured
    trainers[name] = t
wall = {k: [] for k in trainers}; cpu = {k: [] for k in trainers}
for r in range(12):
    for name, t in (list(trainers.items()) if r % 2 == 0 else list(trainers.items())[::-1]):
        w, c = time.perf_counter(), time.process_time()
        t.fit(data, epochs=3)
        wall[name].append(time.perf_counter() - w); cpu[name].append(time.process_time() - c)
for name in trainers:
    print(f"{name}: {3 * 65536 / statistics.median(wall[name]):,.0f} ex/s, CPU {statistics.median(cpu[name]):.2f} s per 3 epochs")
ratios = [a / b for a, b in zip(wall["OFF (before)"], wall["default policy (now)"])]
cratios = [a / b for a, b in zip(cpu["OFF (before)"], cpu["default policy (now)"])]
print(f"now x before (median of within-round ratios): wall {statistics.median(ratios):.3f}, CPU {statistics.median(cratios):.3f}")
