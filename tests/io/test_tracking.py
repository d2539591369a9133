"""MLflow tracking, read back with MLflow's own client from the store the run wrote."""

import os

import numpy as np
import pytest

import helpers
import kerastrain as kt

pytest.importorskip("mlflow", reason="MLflow is an optional extra: pip install -e '.[test]' "
                                     "installs it (as CI does)")


def client_for(model_dir):
    from mlflow.tracking import MlflowClient
    return MlflowClient(tracking_uri="sqlite:///" + os.path.join(model_dir, "mlflow", "mlflow.db"))


def the_run(client, experiment="kerastrain"):
    [run] = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return run


def steps_and_values(client, run_id, key):
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key),
                                             key=lambda m: (m.step, m.timestamp))]


def test_one_mlflow_run_per_model_dir_holds_params_metrics_and_the_export_and_resumes(tmp_path):
    model_dir = str(tmp_path / "exp-a")

    def trainer(**params):
        return kt.Trainer(helpers.build_model, helpers.arrays(), model_dir=model_dir, verbose=0,
                          tensorboard={"log_every_steps": 3},
                          writers=[kt.MLflowWriter(params=params)])

    first = trainer(learning_rate=0.001, units=8)
    history = first.fit(epochs=2, batch_size=16)    # 6 steps an epoch
    first.close()
    client = client_for(model_dir)
    run = the_run(client)
    assert run.info.run_name == "exp-a" and run.info.status == "FINISHED"
    assert run.data.params == {"learning_rate": "0.001", "units": "8"}
    assert run.data.tags["kerastrain.model_dir"] == model_dir
    # Per step (every 3) and per epoch, the values TensorBoard gets.
    assert [s for s, _ in steps_and_values(client, run.info.run_id, "loss")] == [3, 6, 9, 12]
    assert [v for _, v in steps_and_values(client, run.info.run_id, "epoch_loss")] == \
        pytest.approx(history.history["loss"], rel=1e-6)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "export")}
    assert {"export/model.keras", "export/saved_model"} <= artifacts

    # A resumed run continues the same MLflow run; a param given anew keeps its first value.
    second = trainer(learning_rate=0.01, units=8, dropout=0.5)
    second.fit(epochs=3, batch_size=16)
    second.close()
    again = the_run(client)
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    assert again.data.params == {"learning_rate": "0.001", "units": "8", "dropout": "0.5"}
    epochs = steps_and_values(client, run.info.run_id, "epoch_loss")
    assert [s for s, _ in epochs] == [0, 1, 2]


def test_mlflow_mistakes_are_clear(tmp_path):
    with pytest.raises(ValueError, match=r"`experiment` must be a non-empty string. "
                                         r"Received: experiment=''"):
        kt.MLflowWriter(experiment="")
    with pytest.raises(ValueError, match=r"Received: params=\[1, 2\]"):
        kt.MLflowWriter(params=[1, 2])
    writer = kt.MLflowWriter()
    trainer = kt.Trainer(helpers.build_model, helpers.arrays(), verbose=0, writers=[writer])
    with pytest.raises(ValueError, match=r"keeps its tracking store in model_dir/mlflow unless "
                                         r"given a `tracking_uri`.*Received: model_dir=None"):
        trainer.fit(epochs=1, batch_size=32)


def test_a_tracking_uri_elsewhere_gets_the_run_and_model_dir_keeps_only_its_id(tmp_path):
    uri = "sqlite:///" + str(tmp_path / "central.db")
    trainer = kt.Trainer(helpers.build_model, helpers.arrays(), model_dir=str(tmp_path / "run"),
                         verbose=0, tensorboard=False,
                         writers=[kt.MLflowWriter(uri, experiment="team", run_name="try-1",
                                                  log_export=False)])
    trainer.fit(epochs=1, batch_size=32)
    trainer.close()
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=uri)
    run = the_run(client, "team")
    assert run.info.run_name == "try-1"
    assert not client.list_artifacts(run.info.run_id)   # log_export=False
    assert sorted(os.listdir(tmp_path / "run" / "mlflow")) == ["run.json"]
    assert np.isfinite(steps_and_values(client, run.info.run_id, "epoch_loss")[0][1])


def test_a_recipe_with_mlflow_logs_its_values_as_params(tmp_path, capsys, caplog):
    from kerastrain.cli import command as cli
    sets = ["trainer.epochs=1", "trainer.steps_per_epoch=2", "trainer.verbose=0",
            f"trainer.model_dir={tmp_path / 'run'}", "data.train.args.num_examples=256",
            "data.validation.args.num_examples=64", "strategy=default",
            "mlflow.experiment=recipes"]
    with caplog.at_level("INFO"):
        assert cli.main(["run", os.path.join(helpers.REPO, "recipes", "quickstart.yaml"),
                         *[a for s in sets for a in ("--set", s)]]) == 0, capsys.readouterr()
    client = client_for(str(tmp_path / "run"))
    run = the_run(client, "recipes")
    assert run.data.params["trainer.epochs"] == "1"
    assert run.data.params["model.compile.optimizer.name"] == "adam"
    assert run.data.params["mlflow.experiment"] == "recipes"
    assert [s for s, _ in steps_and_values(client, run.info.run_id, "val_epoch_loss")] == [0]
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"mlflow: run 'run' ({run.info.run_id}) in experiment 'recipes'")
               for m in said), said
    assert not any("Creating initial MLflow database tables" in m for m in said)
