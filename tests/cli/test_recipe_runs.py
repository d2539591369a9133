"""A recipe's first run (issue 51): where its builders are imported from, what the user sees when
their code or a value fails, and that `run` checks every key before TensorFlow starts."""

import json
import os
import re
import sys

import pytest

import helpers
from kerastrain.cli import command as cli
from kerastrain.cli import recipes
from kerastrain.cli import training

BASE = helpers.TINY_RECIPE.replace("num_examples: 256", "num_examples: 64") + (
    "trainer: {verbose: 0}\ncheckpoints: false\ntensorboard: false\n")


def error_lines(err):
    return [line for line in err.splitlines() if line.startswith("kerastrain: error:")]


@pytest.fixture
def as_the_kerastrain_command(monkeypatch):
    """sys.path as the installed `kerastrain` script has it (its own folder first, not the
    working directory, unlike `python -m`), restored after the test, as are the modules that
    the test's recipes import."""
    here = os.getcwd()
    monkeypatch.setattr(sys, "path", [p for p in sys.path
                                      if os.path.abspath(p or os.curdir) != here])
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("issue51_"):
            del sys.modules[name]


# -- 1. builders beside the recipe, or in the working directory -------------------------------

def test_builders_are_imported_from_the_working_directory_then_the_recipes_folder(
        tmp_path, monkeypatch, capsys, as_the_kerastrain_command):
    project = tmp_path / "project"
    (project / "conf").mkdir(parents=True)
    # The model builder beside the recipe, the data builder in the working directory.
    (project / "conf" / "issue51_model.py").write_text(
        "from kerastrain import examples\n"
        "def build(hidden):\n    return examples.build_mlp(features=8, hidden=hidden)\n")
    (project / "issue51_data.py").write_text(
        "from kerastrain import examples\n"
        "def load(n):\n    return examples.synthetic_data(num_examples=n, features=8)\n")
    recipe = BASE.replace("kerastrain.examples:build_mlp", "issue51_model:build").replace(
        "{features: 8, hidden: 8}", "{hidden: 4}").replace(
        "kerastrain.examples:synthetic_data", "issue51_data:load").replace(
        "{num_examples: 64, features: 8}", "{n: 64}")
    (project / "conf" / "recipe.yaml").write_text(recipe)
    monkeypatch.chdir(project)

    assert cli.main(["validate", "conf/recipe.yaml"]) == 0, capsys.readouterr().err
    # The working directory first (as `python -m`), then the recipe's folder.
    assert sys.path[:2] == [str(project), str(project / "conf")]
    # The launcher checks the recipe as `validate` does; its tasks run `kerastrain run` in the
    # launcher's working directory.
    assert cli.main(["launch", "conf/recipe.yaml", "--workers", "1", "--dry-run"]) == 0
    assert "-m kerastrain.cli run conf/recipe.yaml" in capsys.readouterr().out
    assert cli.main(["run", "conf/recipe.yaml"]) == 0
    assert "kerastrain: done: 1 epoch" in capsys.readouterr().out

    # A module found nowhere: the error says where it was looked for.
    (project / "conf" / "recipe.yaml").write_text(recipe.replace("issue51_model", "issue51_no"))
    assert cli.main(["validate", "conf/recipe.yaml"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert ("importing 'issue51_no' failed with ModuleNotFoundError: No module named 'issue51_no' "
            "(a recipe's modules are imported from the working directory first, then from the "
            "recipe file's folder, then from the installed packages") in err, err


# -- 2. a builder's failure, or a value's: one line naming the key ------------------------------

def test_a_builder_or_value_that_fails_is_one_line_naming_its_key(tmp_path, capsys):
    path = tmp_path / "recipe.yaml"
    shown = str(path)  # as the recipe loader shows a file outside the working directory
    # A builder argument of the wrong type: Keras refuses it inside the builder.
    path.write_text(BASE.replace("hidden: 8", 'hidden: "8"'))
    assert cli.main(["validate", str(path)]) == 0  # what only running the builder reveals
    capsys.readouterr()
    assert cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" not in err and error_lines(err) == [
        f"kerastrain: error: {shown}:2: model.builder (kerastrain.examples:build_mlp) failed: "
        "ValueError: Received an invalid value for `units`, expected a positive integer. "
        "Received: units=8 -- it was called with model.args {'features': 8, 'hidden': '8'} "
        f"({shown}:3); fix the args or the builder (-v shows the traceback)"], err
    # -v: the traceback of the user's code, then the same line.
    assert cli.main(["run", str(path), "-v"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "in build_mlp" in err, err
    assert err.rstrip().splitlines()[-1].startswith(f"kerastrain: error: {shown}:2: model.builder")

    # A value Keras refuses: the optimizer's arguments.
    path.write_text(BASE.replace(
        "  args: {features: 8, hidden: 8}\n",
        "  args: {features: 8, hidden: 8}\n  compile: {optimizer: {name: adam, betaa: 0.9}}\n"))
    assert cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" not in err and error_lines(err) == [
        f"kerastrain: error: {shown}:4: model.compile.optimizer ({{'name': 'adam', 'betaa': 0.9}})"
        " failed: ValueError: Argument(s) not recognized: {'betaa': 0.9} -- fix this value "
        "(a name Keras knows, with arguments it takes) (-v shows the traceback)"], err
    # A metric's name Keras does not know: said by its key, not later by `compile` as if the
    # data did not fit the model.
    path.write_text(BASE.replace(
        "  args: {features: 8, hidden: 8}\n",
        "  args: {features: 8, hidden: 8}\n  compile: {metrics: [acc, acuracy]}\n"))
    assert cli.main(["run", str(path)]) == 2
    assert error_lines(capsys.readouterr().err) == [
        f"kerastrain: error: {shown}:4: model.compile.metrics (['acc', 'acuracy']) failed: "
        "ValueError: Could not interpret metric identifier: acuracy -- fix this value (a name "
        "Keras knows, with arguments it takes) (-v shows the traceback)"]


def test_a_data_builder_that_raises_is_reported_by_its_key_not_a_traceback(capsys, monkeypatch):
    # The digits recipe where scikit-learn is not installed: an ImportError from the builder.
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    path = os.path.relpath(os.path.join(helpers.REPO, "recipes", "digits.yaml"))
    text = open(path).read()
    code = cli.main(["run", path, "--set", "trainer.model_dir=null", "--set", "trainer.epochs=1"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback (most recent call last)" not in err and error_lines(err) == [
        f"kerastrain: error: {path}:{text.splitlines().index('  train:') + 2}: "
        "data.train.builder (kerastrain.examples:digits) failed: ImportError: The digits data "
        "comes with scikit-learn: pip install 'kerastrain[digits]' (or scikit-learn) -- it was "
        "called with data.train.args {'split': 'train', 'validation_fraction': 0.25, 'seed': 0} "
        f"({path}:{text.splitlines().index('  train:') + 3}); install what it imports "
        "(-v shows the traceback)"], err


def test_only_what_the_users_code_raised_is_reported_as_its_keys():
    def builder():
        raise KeyError("column")

    with pytest.raises(KeyError) as raised:
        training._blame("data.train.builder", ("m:f", ("data.train.args", {})), builder)
    positions = {("data", "train", "builder"): "r.yaml:5"}
    assert str(training.blamed(raised.value, positions)).startswith(
        "r.yaml:5: data.train.builder (m:f) failed: KeyError: 'column' -- it was called with "
        "data.train.args {}")
    # kerastrain translating it (`raise ... from`) still blames the key...
    try:
        try:
            raise raised.value
        except KeyError as e:
            raise ValueError("advice") from e
    except ValueError as e:
        assert training.blamed(e).key == "data.train.builder"
    # ...but kerastrain's own failure while handling it is not dressed up as the user's.
    try:
        try:
            raise raised.value
        except KeyError:
            raise TypeError("a kerastrain bug")
    except TypeError as e:
        assert training.blamed(e) is None
    assert training.blamed(TypeError("unmarked")) is None


def test_kerastrains_own_failure_during_a_run_is_not_blamed_on_the_recipe(
        tmp_path, monkeypatch):
    (tmp_path / "recipe.yaml").write_text(BASE)

    def broken(*args, **kwargs):
        raise KeyError("internal")

    monkeypatch.setattr(training, "summary_line", broken)
    with pytest.raises(KeyError, match="internal"):
        cli.main(["run", str(tmp_path / "recipe.yaml")])


# -- 3. `run` checks every key before TensorFlow starts -----------------------------------------

def test_run_with_a_typo_fails_before_tensorflow_starts(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(BASE.replace("verbose: 0", "verbos: 0"))
    code = ("import json, os, sys\nfrom kerastrain.cli import command as cli\n"
            f"code = cli.main(['run', {str(path)!r}])\n"
            "loaded = sorted(m for m in ('tensorflow', 'keras') if m in sys.modules)\n"
            # A valid recipe's check leaves the process one thread (no NumPy yet): a local
            # cluster's network isolation comes after it, and Linux moves one thread only.
            "cli._checked_tree(cli.arguments.parser().parse_args(['run', "
            "'recipes/parameter_server.yaml']))\n"
            "print(json.dumps({'code': code, 'loaded': loaded, "
            "'threads': len(os.listdir('/proc/self/task'))}))\n")
    proc = helpers.run_python(code, timeout=60)
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result == {"code": 2, "loaded": [], "threads": 1}, proc.stderr[-3000:]
    assert "devices" not in proc.stderr, proc.stderr
    assert "Traceback (most recent call last)" not in proc.stderr, proc.stderr
    assert re.search(r"recipe\.yaml:9: trainer\.verbos: unknown key\. Did you mean 'verbose'\?",
                     proc.stderr), proc.stderr
