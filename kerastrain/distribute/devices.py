"""This process's devices: the host CPU split into logical devices, its GPUs, and whether a
model's variables all live on one device."""

from __future__ import annotations


def configure_cpu_devices(n: int) -> None:
    """Split the host CPU into `n` logical devices (before TensorFlow initialises).

    Raises:
        RuntimeError: TensorFlow already runs with a different number of CPU devices.
    """
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
        return
    except RuntimeError:
        pass  # Already initialised: fine if the layout is the one asked for.
    current = len(_this_process(tf.config.list_logical_devices("CPU")))
    if current != n:
        raise RuntimeError(
            f"`cpu_devices={n}` must be set before TensorFlow initialises its devices, but "
            f"TensorFlow already runs with {current} logical CPU device(s). Create the Trainer "
            f"(or call kerastrain.configure_cpu_devices({n})) before running any TensorFlow "
            f"operation, or start a new Python process. Received: cpu_devices={n}")


def _this_process(devices):
    """Of TensorFlow's logical devices, this process's own.

    Once this process started or joined a parameter-server cluster (an in-process local
    cluster included), TensorFlow lists every task's devices as logical devices
    (`/job:worker/replica:0/task:1/device:CPU:0`...), and a MirroredStrategy over them
    failed: "In-graph multi-worker training with MirroredStrategy is not supported in
    eager mode". Without a cluster every name has one prefix and nothing runs here.
    """
    if len({d.name.rsplit("/device:", 1)[0] for d in devices}) <= 1:
        return devices
    import tensorflow as tf
    own = tf.constant(0).device.rsplit("/device:", 1)[0]   # where eager ops run: this task
    return [d for d in devices if d.name.startswith(own + "/")]


def gpus():
    """This process's logical GPU devices."""
    import tensorflow as tf
    return _this_process(tf.config.list_logical_devices("GPU"))


def local_devices():
    """All GPUs, else every logical CPU device (this process's own)."""
    import tensorflow as tf
    found = gpus()
    if found:
        return [d.name for d in found]
    return [d.name for d in _this_process(tf.config.list_logical_devices("CPU"))]


def on_one_device(model, device) -> bool:
    """Whether every variable of `model` lives on `device` (type and index)."""
    import tensorflow as tf
    there = tf.DeviceSpec.from_string(device)
    for v in model.variables:
        here = tf.DeviceSpec.from_string(getattr(v, "value", v).device or "")
        if (here.device_type, here.device_index or 0) != (there.device_type,
                                                          there.device_index or 0):
            return False
    return True
