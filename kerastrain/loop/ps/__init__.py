"""Parameter servers only, the loop side: the driver whose loops a `ClusterCoordinator`
schedules on the workers (`driver`), where its data stands (`position`), and the watch that
names a worker answering no request (`liveness`, which loads no TensorFlow: `launch` reads
its line)."""
