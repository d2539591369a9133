"""`kerastrain.data.files`: a dataset over record files on disk that shards by file."""

from __future__ import annotations

import logging
import os

from kerastrain._options import is_int
from kerastrain.data import pipelines as pipeline_lib

logger = logging.getLogger("kerastrain")


def files(pattern, parse_fn=None, *, batch_size=None, drop_remainder=False, reader="tfrecord",
          compression=None, shuffle_files=True, shuffle_buffer=0, seed=0, parallel_reads=None,
          threads="auto", batch_within_files=False):
    """A dataset over files on disk that kerastrain (and TensorFlow) can shard by file.

    Records are interleaved from several files at once. With `batch_size`,
    records are batched first and `parse_fn` receives a batch of records, so
    parsing is vectorised (`tf.io.parse_example`); without it `parse_fn` gets
    one record.

    Args:
        pattern: a glob pattern or a list of paths/patterns.
        parse_fn: maps a record (or a batch of records) to `(x, y)` or
            `(x, y, sample_weight)`.
        batch_size: the global batch size, or None to leave batching to you.
        drop_remainder: drop a last partial batch.
        reader: "tfrecord" or "text".
        compression: "GZIP", "ZLIB" or None.
        shuffle_files: shuffle the file order each pass (with `seed`, so every
            worker agrees on it).
        shuffle_buffer: if > 0, shuffle records within a buffer of this size.
        seed: seed of both shuffles.
        parallel_reads: None reads up to 4 files in turn on one thread (local
            disks); N > 1 reads N files on N threads in chunks of 64 records (remote
            storage, where each read waits on the network). Per-record parallel
            reads are avoided: on a 2-core host they ran at 13k records/s against
            367k sequentially.
        threads: an int gives the pipeline a private pool of that many threads
            and turns autotuning off, so that on a small host input threads do not
            pre-empt the model's; None leaves tf.data's shared, autotuned pool;
            "auto" (default) is 1 on hosts with up to 4 cores, else None. Measured on
            2 cores: 0.72x -> 1.03x of in-memory training (docs/performance.md).
        batch_within_files: faster reading for those who accept other batches: each
            batch holds records of one file (a file's last batch may be short, one per
            file and pass, unless `drop_remainder`), files take turns batch by batch,
            and batches are parsed in parallel in the order they are ready
            (`deterministic=False`), so the order varies from run to run. Off by
            default: then batches mix files and every run reads the same order.

    Returns:
        a `tf.data.Dataset`: pass it, or a function returning it, as data.

    Example:
        >>> ds = kerastrain.data.files("data/train-*.tfrecord", parse, batch_size=256)
        >>> trainer.fit(lambda: ds, epochs=2)
    """
    import tensorflow as tf

    readers = {"tfrecord": tf.data.TFRecordDataset, "text": tf.data.TextLineDataset}
    _check_files_options(readers, reader, parallel_reads, batch_within_files, batch_size)
    threads = pipeline_lib.check_threads(threads)
    patterns = [pattern] if isinstance(pattern, (str, bytes, os.PathLike)) else list(pattern)
    names = sorted({name for p in patterns for name in tf.io.gfile.glob(os.fspath(p))})
    if not names:
        raise ValueError(f"No files match `pattern`. Received: pattern={pattern!r}")
    ds = tf.data.Dataset.from_tensor_slices(names)
    if shuffle_files:
        ds = ds.shuffle(len(names), seed=seed, reshuffle_each_iteration=True)
    make_reader = readers[reader]
    if batch_within_files:
        return _batched_within_files(ds, len(names), make_reader, compression, parse_fn,
                                     batch_size, drop_remainder, shuffle_buffer, seed,
                                     parallel_reads, threads)
    if parallel_reads is None or parallel_reads == 1:
        ds = ds.interleave(lambda f: make_reader(f, compression_type=compression),
                           cycle_length=min(len(names), 4 if parallel_reads is None else 1))
    else:
        ds = ds.interleave(lambda f: make_reader(f, compression_type=compression).batch(64),
                           cycle_length=parallel_reads, num_parallel_calls=parallel_reads,
                           deterministic=True).unbatch()
    if shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if batch_size is not None:
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    if parse_fn is not None:
        if threads:
            ds = ds.map(parse_fn)  # on the pipeline's own thread
        else:
            ds = ds.map(parse_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return pipeline_lib.threaded(ds, threads)


def _check_files_options(readers, reader, parallel_reads, batch_within_files, batch_size):
    if reader not in readers:
        raise ValueError(f"`reader` must be one of {sorted(readers)}. Received: reader={reader!r}")
    if parallel_reads is not None and not is_int(parallel_reads, 1):
        raise ValueError("`parallel_reads` must be None or a positive int. "
                         f"Received: parallel_reads={parallel_reads!r}")
    if not isinstance(batch_within_files, bool):
        raise ValueError("`batch_within_files` must be True or False. "
                         f"Received: batch_within_files={batch_within_files!r}")
    if batch_within_files and batch_size is None:
        raise ValueError("`batch_within_files=True` makes each batch from one file's records, "
                         "so it needs `batch_size`. Received: batch_size=None")


def _batched_within_files(names, num_files, make_reader, compression, parse_fn, batch_size,
                          drop_remainder, shuffle_buffer, seed, parallel_reads, threads):
    """`files(..., batch_within_files=True)`: batch each file's records, then interleave the
    batches: the per-record interleave, the cross-file batching and the ordered parse, about a
    third of the files' CPU (docs/performance.md), are what this leaves out."""
    import tensorflow as tf

    def batches(name):
        records = make_reader(name, compression_type=compression)
        if shuffle_buffer:
            records = records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        return records.batch(batch_size, drop_remainder=drop_remainder)

    cycle = min(num_files, parallel_reads or 4)
    # On the pipeline's own thread (`threads`) there is nothing to run in parallel: batches
    # come in turn; on tf.data's pool, in the order they are ready.
    parallel = {} if threads else {"deterministic": False}
    ds = names.interleave(batches, cycle_length=cycle,
                          num_parallel_calls=None if threads else cycle, **parallel)
    if parse_fn is not None:
        ds = ds.map(parse_fn, num_parallel_calls=None if threads else tf.data.AUTOTUNE,
                    **parallel)
    global _SAID_WITHIN_FILES
    if not _SAID_WITHIN_FILES:   # once a process: a dataset_fn is called for every pipeline
        _SAID_WITHIN_FILES = True
        logger.info("data.files: batch_within_files: each batch holds one file's records, "
                    "files take turns batch by batch%s (faster reading; batches no longer "
                    "mix files)", "" if threads else
                    ", in the order they are ready: the order differs from run to run")
    return pipeline_lib.threaded(ds, threads)


_SAID_WITHIN_FILES = False
