"""A multi-worker mirrored task that trains nothing: one all-reduce, then ends as the command
line ends a run (`cluster.end_together`, unless argv[1] is "plain"), worker:1 lingering 3 s
afterwards (an export to a slow disk, say). Prints when it ends."""

import json
import sys
import time

import tensorflow as tf

from kerastrain.distribute import cluster

strategy = tf.distribute.MultiWorkerMirroredStrategy()
total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
assert float(total) == 2.0
config = cluster.read_tf_config()
if json.loads(sys.argv[1]) != "plain":
    cluster.end_together(config)
if config.task_index == 1:
    time.sleep(3)
print(f"ended at {time.time():.3f}", flush=True)
