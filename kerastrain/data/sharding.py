"""The sharding policy: read a pipeline's graph, decide file / data / off, say so in one sentence.

TensorFlow shards a distributed dataset itself (`AutoShardPolicy`), but its
`AUTO` policy decides silently, warns on every worker when it falls back, and
fails at run time with "not enough files". kerastrain makes the decision up
front from the dataset's own graph (which files it reads, which batch size it
ends with), hands TensorFlow an explicit `FILE`, `DATA` or `OFF`, and logs one
plain sentence. The sharding itself stays TensorFlow's.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

POLICIES = ("auto", "file", "data", "off")

# The dataset ops TensorFlow's FILE sharding recognises as file readers.
_READERS = {
    "TFRecordDataset": "TFRecord",
    "TextLineDataset": "text",
    "FixedLengthRecordDataset": "fixed-length record",
    "ArrayRecordDataset": "ArrayRecord",
    "RecordIODataset": "RecordIO",
    "SSTableDataset": "SSTable",
}
# Between a file-name list and its reader: these keep the list a list of names.
_FILE_LIST_PASS_THROUGH = ("ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3",
                           "ShuffleAndRepeatDataset", "ShuffleAndRepeatDatasetV2",
                           "RepeatDataset", "PrefetchDataset", "CacheDataset", "CacheDatasetV2",
                           "TakeDataset", "SkipDataset", "OptionsDataset")
_BATCH_OPS = ("BatchDataset", "BatchDatasetV2", "ParallelBatchDataset", "PaddedBatchDataset",
              "PaddedBatchDatasetV2")
# After the final batch, these leave the batch size alone.
_BATCH_PASS_THROUGH = ("MapDataset", "ParallelMapDataset", "ParallelMapDatasetV2",
                       "PrefetchDataset", "OptionsDataset", "ModelDataset", "CacheDataset",
                       "CacheDatasetV2", "RepeatDataset", "TakeDataset", "SkipDataset",
                       "FilterDataset", "ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3",
                       "MaxIntraOpParallelismDataset", "PrivateThreadPoolDataset",
                       "ExperimentalMaxIntraOpParallelismDataset",
                       "ExperimentalPrivateThreadPoolDataset", "AssertCardinalityDataset",
                       "IgnoreErrorsDataset", "FinalizeDataset")


@dataclasses.dataclass(frozen=True)
class FileSource:
    """The files a pipeline reads, as found in its graph."""
    count: int
    reader: str          # "TFRecord", "text", ...


@dataclasses.dataclass(frozen=True)
class Plan:
    """What kerastrain decided for one input.

    Attributes:
        policy: "file", "data" or "off" (what TensorFlow is told), or "user"
            (a `dataset_fn(ctx)` shards itself) or "none" (one input pipeline).
        pipelines: input pipelines (workers that read data).
        sentence: the one line logged.
    """
    policy: str
    pipelines: int
    sentence: str


def check_policy(shard, argument="shard"):
    if shard not in POLICIES:
        raise ValueError(f"`{argument}` must be one of {', '.join(map(repr, POLICIES))}. "
                         f"Received: {argument}={shard!r}")
    return shard


def _base(op):
    return op[:-2] if op.endswith(("V2", "V3", "V4", "V5")) else op


def _reader_of(op):
    return _READERS.get(_base(op)) or _READERS.get(op)


def _input_name(name):
    return name.lstrip("^").split(":")[0]


def _const_value(node):
    import tensorflow as tf
    if node is None or node.op != "Const":
        return None
    return tf.make_ndarray(node.attr["value"].tensor)


def _string_count(node):
    """How many strings a constant holds, or None if it is not a string constant."""
    import tensorflow as tf
    if node is None or node.op != "Const" or node.attr["dtype"].type != tf.string.as_datatype_enum:
        return None
    dims = [d.size for d in node.attr["value"].tensor.tensor_shape.dim]
    return int(np.prod(dims)) if dims else 1


class PipelineGraph:
    """A dataset's graph, serialised once and read for its file list and its final batch size."""

    def __init__(self, dataset):
        self.dataset = dataset

    @functools.cached_property
    def graph(self):
        """The GraphDef, or None when it cannot be serialised (e.g. a py_function)."""
        import tensorflow as tf

        from kerastrain import _compat
        try:
            serialized = _compat.serialize_dataset(self.dataset, external_state="ignore")
            return tf.compat.v1.GraphDef.FromString(serialized.numpy())
        except (tf.errors.OpError, ValueError, TypeError):
            return None

    @functools.cached_property
    def nodes(self):
        return {n.name: n for n in self.graph.node} if self.graph is not None else {}

    def _input(self, node, index=0):
        return self.nodes.get(_input_name(node.input[index]))

    def file_source(self) -> FileSource | None:
        """The one list of files the pipeline reads, or None if there is not exactly one.

        Recognises the shapes TensorFlow's FILE sharding shards: a reader over a
        constant list of names (`TFRecordDataset(files)`), and a reader inside the
        function of `interleave`/`flat_map` over a dataset of names, possibly
        shuffled (`Dataset.list_files(...)`, `from_tensor_slices(files).interleave(...)`).
        """
        if self.graph is None:
            return None
        functions = {f.signature.name: f for f in self.graph.library.function}
        reads_cache = {}

        def function_reads(name, seen=()):
            if name in reads_cache:
                return reads_cache[name]
            fn = functions.get(name)
            found = None
            if fn is not None and name not in seen:
                for node in fn.node_def:
                    found = _reader_of(node.op) or next(
                        (function_reads(a.func.name, seen + (name,))
                         for a in node.attr.values() if a.func.name), None)
                    if found:
                        break
            reads_cache[name] = found
            return found

        def names_behind(node):
            # Walk up a dataset of file names to the constant that lists them.
            while node is not None and node.op in _FILE_LIST_PASS_THROUGH:
                node = self._input(node)
            if node is None or node.op not in ("TensorSliceDataset", "TensorDataset"):
                return None
            count = _string_count(self._input(node))
            return None if count is None else 1 if node.op == "TensorDataset" else count

        sources = []
        for node in self.graph.node:
            reader = _reader_of(node.op)
            if reader:
                count = _string_count(self._input(node))
                if count is not None:
                    sources.append(FileSource(count, reader))
                continue
            for attr in node.attr.values():
                reader = attr.func.name and function_reads(attr.func.name)
                if reader and node.input:
                    count = names_behind(self._input(node))
                    if count is not None:
                        sources.append(FileSource(count, reader))
                    break
        return sources[0] if len(sources) == 1 else None

    def batch_size(self) -> int | None:
        """The batch size of the dataset's final `batch`, or None when it cannot be told."""
        import tensorflow as tf

        first = tf.nest.flatten(self.dataset.element_spec)[0]
        if getattr(first, "shape", None) is not None and first.shape.rank and first.shape[0]:
            return int(first.shape[0])  # static (drop_remainder): no need to serialise
        if self.graph is None:
            return None
        sink = next((n for n in self.graph.node if n.op == "_Retval"), None)
        node = self._input(sink) if sink is not None and sink.input else None
        while node is not None and node.op in _BATCH_PASS_THROUGH:
            node = self._input(node)
        if node is None or node.op not in _BATCH_OPS:
            return None
        value = _const_value(self._input(node, 1))
        return None if value is None else int(value)


def file_source(dataset) -> FileSource | None:
    return PipelineGraph(dataset).file_source()


def batch_size(dataset) -> int | None:
    return PipelineGraph(dataset).batch_size()


def _each(count, pipelines):
    low, high = count // pipelines, -(-count // pipelines)
    return f"{low}" if low == high else f"{low} or {high}"


def decide(shard, *, form, pipelines, source, in_turn, global_batch, replicas):
    """Decide the policy for one input; raise the clear error for an impossible request.

    Args:
        shard: the requested policy ("auto", "file", "data", "off").
        form: "context_fn", "global_fn", "dataset" or "numpy".
        pipelines: the number of input pipelines (workers reading data).
        source: the `FileSource` found in the pipeline, or None.
        in_turn: whether workers train whole batches in turn, as a coordinator schedules
            them (`policy.InputPolicy.in_turn`: parameter servers).
        global_batch: the global batch size if known.
        replicas: replicas per step across all workers, or per worker (`in_turn`).
    """
    workers = "workers" if pipelines != 1 else "worker"
    split = ""
    if global_batch and replicas > 1 and not in_turn:
        split = (f"; each global batch of {global_batch} is split into {replicas} per-replica "
                 f"batches of {_each(global_batch, replicas)}")
    if form == "context_fn":
        return Plan("user", pipelines,
                    f"dataset_fn(ctx) is called once per input pipeline ({pipelines} in all) and "
                    "shards its own data: kerastrain leaves sharding to it")
    files = (f"{source.count} {source.reader} file{'s' if source.count != 1 else ''}"
             if source else None)
    if pipelines == 1:
        read = f" from {files}" if files else ""
        return Plan("none", 1, f"one input pipeline reads all the data{read}: no sharding{split}")
    if shard == "file":
        if source is None:
            raise ValueError(
                "`shard='file'` needs a pipeline that reads a list of files (e.g. "
                "`kerastrain.data.files(...)`, `tf.data.TFRecordDataset(files)` or "
                "`Dataset.list_files(...).interleave(...)`), and none was found in this one. "
                "Use shard='data' to shard by examples instead. Received: shard='file'")
        if source.count < pipelines:
            raise ValueError(
                f"`shard='file'` cannot give each of the {pipelines} {workers} a file: the data "
                f"has {files}. Use shard='data' (every worker reads all files and keeps its "
                "share of the examples), or split the data into at least "
                f"{pipelines} files. Received: shard='file'")
    if shard == "off":
        return Plan("off", pipelines,
                    f"shard='off': each of the {pipelines} workers reads all the data, so every "
                    f"example is seen {pipelines} times per epoch{split}")
    if shard == "file" or (shard == "auto" and source is not None and source.count >= pipelines):
        return Plan("file", pipelines,
                    f"sharding {files} across {pipelines} workers by file: "
                    f"{_each(source.count, pipelines)} files each{split}")
    if shard == "auto":
        why = (f"the data has {files}, fewer than the {pipelines} workers" if source
               else "the pipeline reads no list of files kerastrain can shard")
        why = f" ({why})"
    else:
        why = ""
    if in_turn:
        how = f"worker i takes batches i, i+{pipelines}, i+{2 * pipelines}, ... of the data"
    else:
        how = "each worker keeps its replicas' share of every global batch"
    return Plan("data", pipelines,
                f"sharding by data across {pipelines} workers{why}: {how}{split}")
