"""tf.data options for the host: how many cores the input may use (`tuned`, a pipeline's private
pool), and in-memory pipelines rebuilt to gather whole batches (`Trainer(tuning=...)`:
`input_threads`, `gather_batches`)."""

from __future__ import annotations

import os

from kerastrain._host import usable_cores  # `pipelines.usable_cores` too
from kerastrain._options import is_int


def input_threads(cores=None) -> int:
    """Threads of a pipeline's private pool: half the cores (the other half runs the model)."""
    cores = cores or usable_cores()
    return max(1, cores // 2)


def check_threads(threads):
    """A pipeline's private pool (`files(threads=...)`): "auto" is 1 thread on hosts of up to
    4 cores, else None (tf.data's shared pool)."""
    if threads == "auto":
        return 1 if usable_cores() <= 4 else None
    if threads is not None and not is_int(threads, 1):
        raise ValueError("`threads` must be 'auto', None or a positive int. "
                         f"Received: threads={threads!r}")
    return threads


def threaded(ds, threads):
    """Prefetch, on a private pool of `threads` threads without autotuning (None: tf.data's)."""
    import tensorflow as tf
    if not threads:
        return ds.prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    options.autotune.enabled = False
    return ds.prefetch(2).with_options(options)


def _ram_bytes():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def tuned(dataset, cores=None, on_gpu=False):
    """`dataset` with kerastrain's tf.data options where it leaves them unset; and a sentence.

    On a host of up to 4 cores, tf.data's shared pool and its autotuning pre-empt the
    threads running the model's matrix multiplications (measured on 2 cores: a
    README-style pipeline at 0.82x a bare loop with tf.data's defaults, 0.94x with a
    private 1-thread pool and autotuning off; docs/performance_history.md). Options the
    pipeline sets itself are kept; none of these changes the order of elements.
    """
    import tensorflow as tf

    cores = cores or usable_cores()
    said = []
    rebuilt = gathered(dataset)
    if rebuilt is not None:
        dataset = rebuilt
        said.append("from_tensor_slices(...).batch(...) read as whole-batch slices")
    current = dataset.options()
    options = tf.data.Options()
    if current.threading.private_threadpool_size is None:
        options.threading.private_threadpool_size = input_threads(cores)
        said.append(f"a private pool of {input_threads(cores)} thread(s)")
    if current.autotune.enabled is None:
        if cores <= 4:
            options.autotune.enabled = False
            said.append(f"autotuning off ({cores} cores)")
        else:
            if current.autotune.cpu_budget is None:
                options.autotune.cpu_budget = input_threads(cores)
            ram = _ram_bytes()
            if ram and current.autotune.ram_budget is None:
                options.autotune.ram_budget = ram // 4
            said.append(f"autotuning within {input_threads(cores)} cores and a quarter of RAM")
    if on_gpu and current.experimental_slack is None:
        # Slack spreads the prefetch thread's wake-ups so that it competes less with the
        # host threads that launch the device's kernels.
        options.experimental_slack = True
        said.append("prefetch slack")
    if not said:
        return dataset, "the pipeline's own tf.data options (it sets them)"
    return dataset.with_options(options), "; ".join(said)


def gathered(dataset):
    """`from_tensor_slices(arrays).batch(b)` rebuilt to slice whole batches; or None.

    The batches are the same tensors in the same order (batch i is rows
    `[i*b, (i+1)*b)` of each component), but tf.data does per-batch instead of
    per-example work, and a contiguous slice shares the arrays' buffer instead of
    copying: on 2 cores, 0.07 -> 0.04 CPU-seconds per pass over 65,536 examples of
    64 floats, which the model's threads get back.
    """
    import tensorflow as tf

    from kerastrain import _compat
    found = _compat.slices_then_batch(dataset)
    if found is None:
        return None
    tensors, spec, batch_size, drop_remainder, prefetch, options = found
    size, drop = tf.get_static_value(batch_size), tf.get_static_value(drop_remainder)
    if size is None or drop is None:
        return None
    size, drop = int(size), bool(drop)
    n = int(tensors[0].shape[0])

    # Every batch is whole when the remainder is dropped or there is none: say so in the
    # shapes, which lets TensorFlow fold the step's shape arithmetic (13 Shape ops of the
    # core MLP's step) into constants.
    whole = drop or n % size == 0

    def batch(i):
        start = i * size
        parts = [t[start:tf.minimum(start + size, n)] for t in tensors]
        if whole:
            for part, t in zip(parts, tensors):
                part.set_shape([size] + t.shape.as_list()[1:])
        return tf.nest.pack_sequence_as(spec, parts)

    rebuilt = tf.data.Dataset.range(n // size if drop else -(-n // size)).map(batch)
    if prefetch is not None:
        rebuilt = rebuilt.prefetch(prefetch)
    return rebuilt.with_options(options)
