"""A recipe says what a ported `model.fit` call says: `callbacks:` and `data.validation_split`
(docs/recipes.md, kerastrain/cli/fit_options.py); a run a callback ended is an end."""

import csv
import inspect
import os
import sys
import textwrap

import pytest

import helpers
from kerastrain.cli import command as cli
from kerastrain.cli import fit_options
from kerastrain.cli import recipes

BASE = helpers.TINY_RECIPE


def validate(tmp_path, capsys, text):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    code = cli.main(["validate", str(path)])
    out = capsys.readouterr()
    return code, out.err


def test_the_lists_of_keras_callbacks_are_keras_own():
    """The names a recipe takes (or refuses) and their arguments are kept in a list, since
    importing Keras starts TensorFlow: they are all of keras.callbacks' callbacks, and each
    takes exactly the arguments listed."""
    import keras
    classes = {name: cls for name, cls in vars(keras.callbacks).items()
               if isinstance(cls, type) and issubclass(cls, keras.callbacks.Callback)}
    assert set(fit_options.KERAS) | set(fit_options.REFUSED) == set(classes)
    assert not set(fit_options.KERAS) & set(fit_options.REFUSED)
    for name, arguments in fit_options.KERAS.items():
        params = inspect.signature(classes[name]).parameters
        named = tuple(n for n, p in params.items() if p.kind != p.VAR_KEYWORD)
        assert arguments == named, name
        required = tuple(n for n in named if params[n].default is params[n].empty)
        assert fit_options.REQUIRED.get(name, ()) == required, name
    assert set(fit_options.WRITES) <= set(fit_options.KERAS)


# (the item under callbacks, the key the message names, words of the message)
WRONG = [
    ("{name: EarlyStoping, monitor: val_loss}", "callbacks[0].name",
     "unknown callback 'EarlyStoping'. Did you mean 'EarlyStopping'?"),
    ("earlystopping", "callbacks[0].name", "Did you mean 'EarlyStopping'?"),
    ("{name: EarlyStopping, patiense: 3}", "callbacks[0].patiense",
     "EarlyStopping takes no argument 'patiense'. Did you mean 'patience'?"),
    ("{name: CSVLogger}", "callbacks[0]", "CSVLogger needs argument(s) filename"),
    ("LambdaCallback", "callbacks[0].name", "it takes Python functions, which a recipe cannot "
                                            "hold: write a callback class"),
    ("{name: nosuchpkg.cbs:Stop}", "callbacks[0].name",
     "importing 'nosuchpkg.cbs' failed with ModuleNotFoundError"),
    ("{name: kerastrain.examples:build_mlp}", "callbacks[0].name",
     "expected a callback class"),
    ("3", "callbacks[0]", "expected a keras.callbacks class name (EarlyStopping, "
                          "ModelCheckpoint, ...), an import path 'package.module:Class', or "
                          "{name: ..., **its arguments}. Received: 3"),
    ("{name: TensorBoard}\ntrainer: {model_dir: runs/x}", "callbacks[0].log_dir",
     "trainer.model_dir/logs is where kerastrain writes its own TensorBoard logs"),
    ("{name: BackupAndRestore, backup_dir: b}\ntrainer: {model_dir: runs/x}", "callbacks[0]",
     "trainer.model_dir's checkpoints already do"),
]


@pytest.mark.parametrize("item,key,words", WRONG, ids=[w[1] + " " + w[0][:20] for w in WRONG])
def test_a_wrong_callback_is_refused_naming_its_key_and_line(tmp_path, capsys, item, key,
                                                            words):
    code, err = validate(tmp_path, capsys, BASE + f"callbacks:\n  - {item}\n")
    assert code == 2 and "Traceback" not in err
    assert f"recipe.yaml:10: {key}: " in err and words in err, err


def test_validation_split_is_a_fraction_and_not_beside_validation_data(tmp_path, capsys):
    code, err = validate(tmp_path, capsys, BASE.replace(
        "  batch_size: 32\n", "  batch_size: 32\n  validation_split: 1.5\n"))
    assert code == 2 and ("data.validation_split: expected a number between 0 and 1 "
                          "(exclusive) or null. Received: 1.5") in err, err
    code, err = validate(tmp_path, capsys, BASE + "  validation_split: 0.2\n  validation: "
                         "{builder: kerastrain.examples:synthetic_data}\n")
    assert code == 2 and "data.validation_split: holds out part of the training data" in err


def test_validate_checks_callbacks_without_starting_tensorflow(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(BASE + "  validation_split: 0.25\ncallbacks:\n"
                           "  - {name: EarlyStopping, patiense: 2}\n  - TerminateOnNaN\n")
    code = (f"import sys\nfrom kerastrain.cli import command as cli\n"
            f"assert cli.main(['validate', {str(path)!r}]) == 2\n"
            "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules\n")
    proc = helpers.run_python(code, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "callbacks[0].patiense: EarlyStopping takes no argument" in proc.stderr


def test_paths_callbacks_write_go_under_model_dir_on_the_chief_and_nowhere_elsewhere(tmp_path):
    class Task:
        def __init__(self, is_chief, model_dir):
            self.is_chief, self.model_dir = is_chief, model_dir

    chief = Task(True, str(tmp_path / "run"))
    assert fit_options._place("logs/h.csv", chief) == str(tmp_path / "run" / "logs" / "h.csv")
    assert os.path.isdir(tmp_path / "run" / "logs")
    assert fit_options._place(str(tmp_path / "abs.csv"), chief) == str(tmp_path / "abs.csv")
    assert fit_options._place("h.csv", Task(True, None)) == "h.csv"  # the working directory
    worker = fit_options._place("logs/h.csv", Task(False, str(tmp_path / "run")))
    assert not worker.startswith(str(tmp_path)) and worker.endswith("logs/h.csv")
    assert os.path.basename(os.path.dirname(os.path.dirname(worker))).startswith(
        "kerastrain-nonchief-")


def test_a_recipes_callbacks_and_validation_split_run_and_its_early_end_is_an_end(
        tmp_path, capsys, monkeypatch):
    """EarlyStopping on the val_loss of the held-out quarter, a CSVLogger under model_dir and
    a class of the user's own: the run stops at epoch 2 of 10; the same command again trains
    nothing and says why, in one line (before: it resumed and trained on)."""
    (tmp_path / "mycallbacks.py").write_text(textwrap.dedent("""\
        import keras
        SEEN = []

        class Count(keras.callbacks.Callback):
            def __init__(self, label):
                super().__init__()
                self.label = label

            def on_epoch_end(self, epoch, logs=None):
                SEEN.append((self.label, epoch, sorted(logs)))
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "recipe.yaml"
    path.write_text(BASE + "  validation_split: 0.25\nstrategy: default\n"
                           "trainer: {epochs: 10, model_dir: run, verbose: 0}\n"
                           "tensorboard: false\ncheckpoints: {export: false}\ncallbacks:\n"
                           "  - {name: EarlyStopping, monitor: val_loss, patience: 1, "
                           "min_delta: 10}\n"
                           "  - {name: CSVLogger, filename: logs/history.csv}\n"
                           "  - {name: 'mycallbacks:Count', label: mine}\n")
    assert cli.main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    assert "kerastrain: done: 2 epochs, step 12," in out, out
    assert ("ended early at epoch 2 of 10, step 12 (EarlyStopping: val_loss did not improve by "
            "more than 10 for 1 epoch)") in out
    rows = list(csv.DictReader((tmp_path / "run" / "logs" / "history.csv").open()))
    assert [r["epoch"] for r in rows] == ["0", "1"] and "val_loss" in rows[0]
    assert [(label, epoch) for label, epoch, _ in sys.modules["mycallbacks"].SEEN] == [
        ("mine", 0), ("mine", 1)]
    # The same command again: nothing to train, one line saying why and what to do.
    assert cli.main(["run", str(path)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    checkpoint = tmp_path / "run" / "checkpoints" / "ckpt-12"
    assert line == (f"kerastrain: nothing left to train: {tmp_path / 'run'} ended early at "
                    "epoch 2 of 10, step 12 (EarlyStopping: val_loss did not improve by more "
                    "than 10 for 1 epoch); to train on from there anyway, --set "
                    f"checkpoints.restore={checkpoint}; to start afresh, choose another "
                    "trainer.model_dir"), line
    assert len(list(csv.DictReader((tmp_path / "run" / "logs" / "history.csv").open()))) == 2
    # The resolved recipe keeps them.
    resolved = recipes.load(tmp_path / "run" / "recipe.yaml")[1]
    assert resolved["callbacks"][0] == {"name": "EarlyStopping", "monitor": "val_loss",
                                        "patience": 1, "min_delta": 10}
    assert resolved["data"]["validation_split"] == 0.25


def test_validation_split_of_data_that_batches_itself_is_refused_in_the_recipes_words(
        tmp_path, capsys):
    path = tmp_path / "recipe.yaml"
    path.write_text(BASE.replace("synthetic_data", "synthetic_dataset_fn").replace(
        "{num_examples: 256, features: 8}", "{num_examples: 256, features: 8, global_batch: 32}")
        + "  validation_split: 0.25\nstrategy: default\ntrainer: {verbose: 0}\n")
    assert cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert ("kerastrain: error: data.validation_split holds out the last fraction of NumPy "
            "arrays (x, y), as model.fit's validation_split does, but "
            "kerastrain.examples:synthetic_dataset_fn returned a dataset_fn(ctx), which makes its "
            "own batches. Give a data.validation builder instead") in err, err
