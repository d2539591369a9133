"""MLflow tracking: one MLflow run per kerastrain run, written by the chief beside TensorBoard.

MLflow is an optional extra (`pip install "kerastrain[mlflow]"`) and is imported only when an
`MLflowWriter` opens: nothing else in kerastrain loads it. By default the tracking store is a
SQLite file in `model_dir/mlflow` (artifacts beside it), so a run and its tracking live and move
together; `tracking_uri` points elsewhere (a tracking server, a database, Databricks). The run's
id is kept in `model_dir/mlflow/run.json`: a resumed run continues the same MLflow run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from typing import Mapping

from kerastrain._options import option
from kerastrain.io import files
from kerastrain.io.summaries import MetricWriter

logger = logging.getLogger("kerastrain")

# MLflow's limits (3.x): a param value's length, and the items one `log_batch` call takes.
_PARAM_CHARS, _PARAMS_PER_CALL, _METRICS_PER_CALL = 6000, 100, 1000


def _optional_text(name):
    def check(value):
        if value is not None and not (isinstance(value, str) and value):
            raise ValueError(f"`{name}` must be a non-empty string or None. "
                             f"Received: {name}={value!r}")
    return check


@dataclasses.dataclass(frozen=True)
class MLflowOptions:
    """Where the chief tracks the run in MLflow (each field's doc is in its declaration)."""

    tracking_uri: str | None = option(
        None, "where runs are tracked (http://host:5000, sqlite:///runs.db, databricks); null: a "
              "SQLite store in model_dir/mlflow")
    experiment: str = option("kerastrain", "the MLflow experiment the run belongs to")
    run_name: str | None = option(None, "the MLflow run's name; null: the model_dir's name")
    log_export: bool = option(True, "the chief's export (model.keras, saved_model) as artifacts")
    parent_run_id: str | None = option(
        None, "the MLflow run this one is a child of (`kerastrain tune` sets it: a trial under "
              "its sweep's run); null: none")

    def __post_init__(self):
        _optional_text("tracking_uri")(self.tracking_uri)
        _optional_text("run_name")(self.run_name)
        _optional_text("parent_run_id")(self.parent_run_id)
        if not (isinstance(self.experiment, str) and self.experiment):
            raise ValueError("`experiment` must be a non-empty string. "
                             f"Received: experiment={self.experiment!r}")
        if not isinstance(self.log_export, bool):
            raise ValueError("`log_export` must be True or False. "
                             f"Received: log_export={self.log_export!r}")

    @classmethod
    def coerce(cls, value):
        """Accept True/False/None, a mapping of fields, or an instance."""
        from kerastrain import _options
        return _options.coerce(cls, value, "mlflow")


# The run record on a local disk is read and written with Python's own files: a process that
# trains nothing (`kerastrain tune`'s, holding a sweep's parent run) never loads TensorFlow,
# whose file system `files` uses for URLs.
def _read_record(path):
    if files.is_url(path):
        return files.read_text(path)
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def _write_record(path, text):
    if files.is_url(path):
        files.makedirs(os.path.dirname(path))
        files.write_text(path, text)
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)   # whole, as files.write_text writes


class MLflowWriter(MetricWriter):
    """Scalars as MLflow metrics (each at its step), hyperparameters as params, the export as
    artifacts; one MLflow run per `model_dir`, continued when the run resumes.

    Args:
        tracking_uri, experiment, run_name, log_export, parent_run_id: as `MLflowOptions`.
        params: values logged as the run's params at the start (the recipe's, flattened, under
            `kerastrain run`); TensorBoard's `hparams` are logged too.

    Example:
        trainer = kt.Trainer(build_model, dataset_fn, model_dir="runs/a",
                             writers=[kt.MLflowWriter(params={"learning_rate": 1e-3})])
    """

    def __init__(self, tracking_uri=None, *, experiment="kerastrain", run_name=None,
                 log_export=True, parent_run_id=None, params=None):
        self.options = MLflowOptions(tracking_uri, experiment, run_name, log_export,
                                     parent_run_id)
        if params is not None and not isinstance(params, Mapping):
            raise ValueError("`params` must map names to values (logged as MLflow params). "
                             f"Received: params={params!r}")
        self._params = dict(params or {})
        self._client = None
        self._warned_changed = False
        self.run_id = None
        self.tracking_uri = None

    # -- opening: the store, the experiment, this model_dir's run ---------------------------

    def open(self, run_dir):
        if self._client is not None:
            return
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise ImportError("MLflowWriter needs MLflow, an optional extra: pip install "
                              "'kerastrain[mlflow]' (mlflow-skinny, with SQLAlchemy and Alembic "
                              "for the default store in model_dir)") from None
        local = run_dir is not None and not files.is_url(run_dir)
        store = os.path.join(run_dir, "mlflow") if local else None
        uri = self.options.tracking_uri
        if uri is None:
            if store is None:
                raise ValueError(
                    "MLflowWriter keeps its tracking store in model_dir/mlflow unless given a "
                    f"`tracking_uri`, and this run has no local model_dir. Received: "
                    f"model_dir={run_dir!r}. Give the Trainer a local model_dir, or "
                    "MLflowWriter(tracking_uri='http://host:5000') (or a sqlite:/// path).")
            os.makedirs(store, exist_ok=True)
            uri = "sqlite:///" + os.path.join(store, "mlflow.db")
            # MLflow announces the tables it creates in a new database: here that is the
            # store kerastrain just made, said in its own line below.
            logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
        self.tracking_uri = uri
        self._client = client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(self.options.experiment)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(
            self.options.experiment, artifact_location=os.path.join(store, "artifacts")
            if self.options.tracking_uri is None else None)
        self.run_id = self._continued(run_dir, uri) or self._new_run(run_dir, uri, experiment_id)
        self._log_params(self._params)

    def _record(self, run_dir):
        return None if run_dir is None else files.join(run_dir, "mlflow", "run.json")

    def _continued(self, run_dir, uri):
        """This model_dir's MLflow run in this store, marked running again; else None."""
        record = self._record(run_dir)
        text = record and _read_record(record)
        if not text:
            return None
        saved = json.loads(text)
        if saved.get("tracking_uri") != uri:
            return None
        try:
            run = self._client.get_run(saved["run_id"])
        except Exception:  # deleted from the store, or the store was replaced
            return None
        if run.info.lifecycle_stage != "active":
            return None
        self._client.update_run(run.info.run_id, status="RUNNING")
        logger.info("mlflow: continuing run %r (%s) at %s", run.info.run_name, run.info.run_id,
                    uri)
        return run.info.run_id

    def _new_run(self, run_dir, uri, experiment_id):
        name = self.options.run_name or (
            os.path.basename(run_dir.rstrip("/")) if run_dir else None)
        tags = {"kerastrain.model_dir": run_dir} if run_dir else {}
        if self.options.parent_run_id:   # MLflow's own tag: the UI nests the run under it
            tags["mlflow.parentRunId"] = self.options.parent_run_id
        run = self._client.create_run(experiment_id, run_name=name, tags=tags)
        record = self._record(run_dir)
        if record is not None:
            _write_record(record, json.dumps(
                {"tracking_uri": uri, "run_id": run.info.run_id}) + "\n")
        logger.info("mlflow: run %r (%s) in experiment %r at %s", run.info.run_name,
                    run.info.run_id, self.options.experiment, uri)
        return run.info.run_id

    # -- writing ------------------------------------------------------------------------------

    def _log_params(self, values):
        """Params not logged yet; MLflow never changes a logged param, so a resumed run given
        other values keeps the first ones and says which differ, once."""
        from mlflow.entities import Param
        if not values:
            return
        logged = self._client.get_run(self.run_id).data.params
        new = {str(k): str(v)[:_PARAM_CHARS] for k, v in values.items()}
        changed = sorted(k for k in new if k in logged and logged[k] != new[k])
        if changed and not self._warned_changed:
            self._warned_changed = True
            logger.warning("mlflow: params keep the values they were first logged with (MLflow "
                           "does not change a param); this run differs in %s",
                           ", ".join(f"{k} ({logged[k]}, now {new[k]})" for k in changed[:5])
                           + (f" and {len(changed) - 5} more" if len(changed) > 5 else ""))
        todo = [Param(k, v) for k, v in new.items() if k not in logged]
        for i in range(0, len(todo), _PARAMS_PER_CALL):
            self._client.log_batch(self.run_id, params=todo[i:i + _PARAMS_PER_CALL])

    def write_hparams(self, hparams):
        self._log_params(hparams)

    def write_scalars(self, step, scalars):
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        # MLflow's key characters: letters, digits, _ - . / and spaces.
        metrics = [Metric(re.sub(r"[^\w\-./ ]", "_", str(k)), float(v), now, int(step))
                   for k, v in scalars.items()]
        for i in range(0, len(metrics), _METRICS_PER_CALL):
            self._client.log_batch(self.run_id, metrics=metrics[i:i + _METRICS_PER_CALL])

    def set_tags(self, tags):
        """Tags on the run (unlike params, a tag takes a new value: a sweep's best so far)."""
        for key, value in tags.items():
            self._client.set_tag(self.run_id, str(key), str(value)[:_PARAM_CHARS])

    def write_export(self, directory):
        if self.options.log_export:
            self._client.log_artifacts(self.run_id, directory, artifact_path="export")

    def close(self):
        if self._client is not None and self.run_id is not None:
            self._client.set_terminated(self.run_id, "FINISHED")
            self._client = None
