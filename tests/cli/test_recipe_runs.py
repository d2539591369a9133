"""A recipe's first run (issue 51): where its builders are imported from, and that `run` checks
every key before TensorFlow starts."""

import json
import os
import re
import sys

import pytest

import helpers
from kerastrain.cli import command as cli

BASE = """\
model:
  builder: kerastrain.examples:build_mlp
  args: {features: 8, hidden: 8}
data:
  train:
    builder: kerastrain.examples:synthetic_data
    args: {num_examples: 64, features: 8}
  batch_size: 32
trainer: {verbose: 0}
checkpoints: false
tensorboard: false
"""


@pytest.fixture
def as_the_kerastrain_command(monkeypatch, tmp_path):
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
