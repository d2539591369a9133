"""Metric writers: where scalars, texts and histograms go (TensorBoard, logging, CSV, several)."""

from __future__ import annotations

import csv
import logging
from typing import TYPE_CHECKING, Mapping

from kerastrain.io import files

if TYPE_CHECKING:  # NumPy starts threads on import: the recipe checks that run before a
    import numpy as np  # network isolation import this module, so it loads when used

logger = logging.getLogger("kerastrain")

VALIDATION_PREFIX = "val_"


def scalars(logs: Mapping) -> dict:
    """`logs` with every value a float: a metric result with several values (`F1Score`
    per class) becomes one scalar per value, `name/0`, `name/1`... (`name/0_1` for a
    matrix), where Keras's TensorBoard callback would fail on it."""
    import numpy as np

    flat = {}
    for name, value in logs.items():
        array = np.asarray(value)
        if array.size == 1:
            flat[name] = float(array.reshape(()))
            continue
        for index in np.ndindex(array.shape):
            flat[f"{name}/{'_'.join(map(str, index))}"] = float(array[index])
    return flat


class MetricWriter:
    """Where scalars go. Subclass and override what you need; the rest does nothing.

    Keys starting with `val_` are validation values; a writer may route them
    apart (TensorBoard writes them to the `validation` run without the prefix).
    """

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        pass

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        pass

    def write_histograms(self, step: int, arrays: Mapping[str, np.ndarray]) -> None:
        pass

    def write_graph(self, graph) -> None:
        """A `tf.Graph` of the model's forward pass, once per fit (TensorBoard's Graphs tab)."""

    def write_hparams(self, hparams: Mapping[str, bool | int | float | str]) -> None:
        """The run's hyperparameters, once per fit (TensorBoard's HParams table)."""

    def open(self, run_dir: str | None) -> None:
        """Called once before the first write with the run's `model_dir` (None without
        one), for writers that keep state with the run (MLflow's run id)."""

    def write_export(self, directory: str) -> None:
        """The chief's export (`model.keras`, `saved_model`) was written to `directory`."""

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.flush()


class MultiWriter(MetricWriter):
    """Writes everything to each of `writers`, in order."""

    def __init__(self, writers):
        self.writers = list(writers)

    def write_scalars(self, step, scalars):
        for w in self.writers:
            w.write_scalars(step, scalars)

    def write_texts(self, step, texts):
        for w in self.writers:
            w.write_texts(step, texts)

    def write_histograms(self, step, arrays):
        for w in self.writers:
            w.write_histograms(step, arrays)

    def write_graph(self, graph):
        for w in self.writers:
            w.write_graph(graph)

    def write_hparams(self, hparams):
        for w in self.writers:
            w.write_hparams(hparams)

    def open(self, run_dir):
        for w in self.writers:
            w.open(run_dir)

    def write_export(self, directory):
        for w in self.writers:
            w.write_export(directory)

    def flush(self):
        for w in self.writers:
            w.flush()

    def close(self):
        for w in self.writers:
            w.close()


def _split(scalars):
    train, validation = {}, {}
    for key, value in scalars.items():
        if key.startswith(VALIDATION_PREFIX):
            validation[key[len(VALIDATION_PREFIX):]] = value
        else:
            train[key] = value
    return train, validation


class TensorBoardWriter(MetricWriter):
    """Event files in `logdir/train` and `logdir/validation`, Keras's layout (two runs).

    Scalars are kept until `flush` (or `MAX_PENDING` of them) and then written in one
    compiled call per run, each at its own step: TensorFlow's event writer shows
    nothing before a flush anyway, and one call per logged step cost 3% of a short
    epoch of the core benchmark. (Their event wall times are those of the flush.)
    """

    MAX_PENDING = 1024

    def __init__(self, logdir: str):
        self.logdir = logdir
        self._writers = {}
        self._compiled = {}
        self._pending = {}  # run -> [(step, tag, value)]

    def _writer(self, run):
        import tensorflow as tf
        if run not in self._writers:
            path = files.join(self.logdir, run)
            with files.disk_full_guard("TensorBoard events", path):
                self._writers[run] = tf.summary.create_file_writer(path)
        return self._writers[run]

    @property
    def train_dir(self):
        return files.join(self.logdir, "train")

    def write_hparams(self, hparams):
        """A session in `logdir` itself, TensorBoard's layout for the HParams table: each
        `model_dir` is one row, its `train` and `validation` scalars the metric columns."""
        import tensorflow as tf
        from tensorboard.plugins.hparams import api as hp
        if "" not in self._writers:
            with files.disk_full_guard("TensorBoard events", self.logdir):
                self._writers[""] = tf.summary.create_file_writer(self.logdir)
        with self._writers[""].as_default():
            hp.hparams(dict(hparams))
        self._writers[""].flush()

    def _scalar_writer(self, run):
        """One compiled call per run, for any set of tags.

        Eager `tf.summary.scalar` ops cost ~0.5 ms each, which made logging 3% of an
        epoch of the core benchmark. Tags go in as a string tensor (written as
        `tf.summary.scalar` writes them, with the scalars plugin's metadata), so a new
        set of tags does not trace a new function: one function per tag set made
        TensorFlow warn about retracing on parameter-server runs, which log rarely.
        """
        import tensorflow as tf
        if run not in self._compiled:
            from tensorboard.plugins.scalar import metadata as scalar_metadata
            writer = self._writer(run)
            plugin = scalar_metadata.create_summary_metadata(
                display_name=None, description=None).SerializeToString()

            @tf.function(reduce_retracing=True)
            def write(steps, tags, values):
                with writer.as_default():
                    for i in tf.range(tf.size(tags)):
                        tf.summary.write(tags[i], values[i], step=steps[i], metadata=plugin)
            from kerastrain import _compat
            self._compiled[run] = _compat.quiet_retracing(write)  # one per writer, by design
        return self._compiled[run]

    def write_scalars(self, step, scalars):
        for run, values in zip(("train", "validation"), _split(scalars)):
            if values:
                self._pending.setdefault(run, []).extend(
                    (int(step), tag, float(v)) for tag, v in values.items())
        if sum(len(rows) for rows in self._pending.values()) >= self.MAX_PENDING:
            self._write_pending()

    def _write_pending(self):
        import tensorflow as tf
        pending, self._pending = self._pending, {}
        for run, rows in pending.items():
            if rows:
                steps, tags, values = zip(*rows)
                self._scalar_writer(run)(tf.constant(steps, tf.int64),
                                         tf.constant(tags, tf.string),
                                         tf.constant(values, tf.float32))

    def write_texts(self, step, texts):
        import tensorflow as tf
        with self._writer("train").as_default(step=step):
            for tag, text in texts.items():
                tf.summary.text(tag, text)

    def write_histograms(self, step, arrays):
        import tensorflow as tf
        with self._writer("train").as_default(step=step):
            for tag, value in arrays.items():
                tf.summary.histogram(tag, value)

    def write_graph(self, graph):
        import tensorflow as tf
        with self._writer("train").as_default(step=0):
            tf.summary.graph(graph)

    def flush(self):
        self._write_pending()
        for run, w in self._writers.items():
            with files.disk_full_guard("TensorBoard events", files.join(self.logdir, run)):
                w.flush()

    def close(self):
        self._write_pending()
        writers, self._writers, self._compiled = self._writers, {}, {}
        for run, w in writers.items():
            with files.disk_full_guard("TensorBoard events", files.join(self.logdir, run)):
                w.close()


class LoggingWriter(MetricWriter):
    """One `kerastrain` log line per write: `step 200: loss=0.3412 accuracy=0.8750`."""

    def __init__(self, level=logging.INFO):
        self.level = level

    def write_scalars(self, step, scalars):
        text = " ".join(f"{k}={v:.4g}" for k, v in scalars.items())
        logger.log(self.level, "step %d: %s", step, text)


class CSVWriter(MetricWriter):
    """Long-format rows `step,name,value` appended to one file (a local path or a URL)."""

    def __init__(self, path: str):
        self.path = path
        self._file = None

    def write_scalars(self, step, scalars):
        if self._file is None:
            import tensorflow as tf
            new = not files.exists(self.path)
            self._file = tf.io.gfile.GFile(self.path, "a")
            if new:
                self._file.write("step,name,value\n")
        w = csv.writer(self._file)
        for name, value in scalars.items():
            w.writerow([step, name, repr(float(value))])

    def flush(self):
        if self._file is not None:
            with files.disk_full_guard("CSV rows", self.path):
                self._file.flush()

    def close(self):
        if self._file is not None:
            file, self._file = self._file, None
            with files.disk_full_guard("CSV rows", self.path):
                file.close()
