"""YAML recipes and the `kerastrain run / validate` command line (docs/recipes.md)."""

import dataclasses
import glob
import os
import re

import pytest
import yaml

import helpers
from kerastrain.cli import command as cli
from kerastrain.cli import config, template
from kerastrain.cli import recipes
from kerastrain.cli import training

# Search spaces for `kerastrain tune` (`*.space.yaml`) are no recipes: tests/cli/test_tune.py.
RECIPES = sorted(p for p in glob.glob(os.path.join(helpers.REPO, "recipes", "*.yaml"))
                 if not p.endswith(".space.yaml"))

BASE = helpers.TINY_RECIPE


def validate(tmp_path, capsys, text, sets=(), name="recipe.yaml"):
    path = tmp_path / name
    path.write_text(text)
    code = cli.main(["validate", str(path), *[a for s in sets for a in ("--set", s)]])
    out = capsys.readouterr()
    return code, out.out, out.err


def line_of(text, marker):
    return next(i for i, line in enumerate(text.splitlines(), 1) if marker in line)


# (name, extra YAML appended to BASE (or a whole file if it has no `model:`), --set overrides,
#  the dotted key the message must name, a marker on the offending line or None for --set)
BROKEN = [
    ("key typo", "trainer:\n  epochz: 3\n", (), "trainer.epochz", "epochz",
     "unknown key. Did you mean 'epochs'?"),
    ("wrong type", "trainer:\n  epochs: three\n", (), "trainer.epochs", "epochs",
     "expected an int >= 0. Received: 'three'"),
    ("negative epochs", "trainer:\n  epochs: -2\n", (), "trainer.epochs", "epochs",
     "expected an int >= 0. Received: -2"),
    ("unknown strategy", "strategy: mirorred\n", (), "strategy.name", "mirorred",
     "Did you mean 'mirrored'?"),
    ("unknown strategy option", "strategy: {name: mirrored, cpu_device: 2}\n", (),
     "strategy.cpu_device", "cpu_device", "Did you mean 'cpu_devices'?"),
    ("unresolvable module", BASE.replace("kerastrain.examples:build_mlp", "nosuchpkg.nets:mlp"),
     (), "model.builder", "nosuchpkg", "importing 'nosuchpkg.nets' failed with "
                                       "ModuleNotFoundError"),
    ("missing function", BASE.replace("build_mlp", "build_mlpp"), (), "model.builder",
     "build_mlpp", "it has no 'build_mlpp' (did you mean 'build_mlp'?)"),
    ("not an import path", BASE.replace("kerastrain.examples:build_mlp", "build_mlp"), (),
     "model.builder", "build_mlp", "expected an import path 'package.module:function'"),
    ("bad YAML syntax", "trainer: {epochs: 3\nstrategy: auto\n", (), "", "strategy",
     "not valid YAML"),
    ("empty file", "", (), "", None, "the file is empty"),
    ("missing section", "model:\n  builder: kerastrain.examples:build_mlp\n", (), "data", None,
     "data: missing"),
    ("key given twice", "trainer:\n  epochs: 1\n  epochs: 2\n", (), "trainer.epochs",
     "epochs: 2", "given twice"),
    ("YAML 1.1 boolean", "trainer:\n  jit_compile: no\n", (), "trainer.jit_compile",
     "jit_compile", "expected true, false, auto or null. Received: 'no'"),
    ("builder argument typo", BASE.replace("num_examples: 256", "num_exampels: 256"), (),
     "data.train.args.num_exampels", "num_exampels",
     "kerastrain.examples:synthetic_data takes no argument 'num_exampels'. Did you mean "
     "'num_examples'?"),
    ("optimizer typo", "", ("model.compile.optimizer=adamm",), "model.compile.optimizer", None,
     "did you mean 'adam'?"),
    ("checkpoint option", "checkpoints:\n  max_to_keep: 0\n", (), "checkpoints.max_to_keep",
     "max_to_keep", "must be an int >= 1"),
    ("--set unknown key", "", ("trainer.epochz=1",), "trainer.epochz", None,
     "unknown key. Did you mean 'epochs'?"),
    ("--set unparsable value", "", ("trainer.epochs=[1, 2",), "trainer.epochs", None,
     "cannot parse the value '[1, 2'"),
    ("--set without =", "", ("trainer.epochs",), "", None, "expected --set key.path=value"),
    ("--set wrong type", "", ("data.batch_size=big",), "data.batch_size", None,
     "expected an int >= 1 or null. Received: 'big'"),
]


@pytest.mark.parametrize("name,extra,sets,key,marker,message", BROKEN,
                         ids=[case[0] for case in BROKEN])
def test_broken_recipes_exit_2_naming_key_and_line(tmp_path, capsys, name, extra, sets, key,
                                                   marker, message):
    text = extra if name == "empty file" or "model:" in extra else BASE + extra
    code, out, err = validate(tmp_path, capsys, text, sets)
    assert code == 2, err
    assert "Traceback" not in err and out == ""
    assert message in err, err
    if sets:
        assert f"--set {sets[0]}" in err, err
    elif marker is not None:
        assert f"recipe.yaml:{line_of(text, marker)}: " in err, err
    else:
        assert "recipe.yaml" in err
    if key:
        assert f": {key}: " in err, err


def test_all_errors_in_a_file_are_reported_at_once(tmp_path, capsys):
    text = BASE + "trainer:\n  epochs: -1\n  seed: x\nstrategy: {name: mirrored, bogus: 1}\n" \
                  "checkpoints: {every_step: 3}\n"
    code, _, err = validate(tmp_path, capsys, text)
    assert code == 2
    assert "4 problems in the recipe" in err
    for key in ("trainer.epochs", "trainer.seed", "strategy.bogus", "checkpoints.every_step"):
        assert f": {key}: " in err, err


def test_include_cycle_and_a_missing_include(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text("include: b.yaml\n" + BASE)
    (tmp_path / "b.yaml").write_text("include: a.yaml\n")
    assert cli.main(["validate", str(tmp_path / "a.yaml")]) == 2
    err = capsys.readouterr().err
    assert "include cycle: a.yaml -> b.yaml -> a.yaml" in err and "Traceback" not in err
    code, _, err = validate(tmp_path, capsys, "include: nowhere.yaml\n" + BASE)
    assert code == 2 and "recipe.yaml:1: include: included file 'nowhere.yaml' does not exist" \
        in err


def test_includes_merge_and_the_including_file_wins(tmp_path):
    (tmp_path / "base.yaml").write_text(BASE + "trainer: {epochs: 5, seed: 3}\n")
    (tmp_path / "child.yaml").write_text(
        "include: base.yaml\ntrainer: {epochs: 2}\nstrategy: {name: mirrored, cpu_devices: 2}\n")
    recipe, tree = recipes.load(tmp_path / "child.yaml", ["data.batch_size=64"])
    assert recipe.trainer.epochs == 2 and recipe.trainer.seed == 3
    assert recipe.strategy == {"name": "mirrored", "cpu_devices": 2}
    assert recipe.data.batch_size == 64 and tree["data"]["batch_size"] == 64


def test_yaml_scalars_follow_yaml_1_2(tmp_path):
    text = BASE.replace("  args: {features: 8, hidden: 8}\n", "  args: {features: 8, hidden: 8}\n"
                        "  compile:\n    optimizer: {name: adam, learning_rate: 1e-3}\n")
    recipe, _ = recipes.load(_write_text(tmp_path, text + "  shard: off\n"), [])
    assert recipe.data.shard == "off"   # not False
    assert recipe.model.compile.optimizer["learning_rate"] == 0.001   # not the string '1e-3'


def test_template_validates_and_names_every_key(tmp_path, capsys):
    assert cli.main(["run", "--print-config"]) == 0
    text = capsys.readouterr().out
    assert text == template.template()
    recipe, _ = recipes.load(_write_text(tmp_path, text), [])
    assert recipe.trainer.epochs == 1
    for section, spec in config.schema().items():
        assert f"\n{section}:" in "\n" + text
        for key in (spec.section or {}):
            assert re.search(rf"^\s+{key}:", text, re.M), key


def test_schema_and_template_take_defaults_and_docs_from_the_option_dataclasses(monkeypatch):
    from kerastrain.io import checkpoints
    epochs = config.TrainerConfig.__dataclass_fields__["epochs"]
    keep = checkpoints.CheckpointOptions.__dataclass_fields__["max_to_keep"]
    monkeypatch.setattr(epochs, "default", 7)
    monkeypatch.setattr(epochs, "metadata", dict(epochs.metadata, doc="how many epochs, changed"))
    monkeypatch.setattr(keep, "default", 9)
    assert config.schema()["trainer"].section["epochs"].default == 7
    assert config.schema()["trainer"].section["epochs"].doc == "how many epochs, changed"
    text = template.template()
    assert re.search(r"^  epochs: 7 +# how many epochs, changed$", text, re.M)
    assert re.search(r"^  max_to_keep: 9 +#", text, re.M)


def _write_text(tmp_path, text):
    path = tmp_path / "t.yaml"
    path.write_text(text)
    return path


def test_validate_does_not_start_tensorflow():
    code = ("import sys\nfrom kerastrain.cli import command as cli\n"
            "assert cli.main(['validate', 'recipes/quickstart.yaml']) == 0\n"
            "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules\n")
    proc = helpers.run_python(code, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "model:\n  builder: kerastrain.examples:build_mlp" in proc.stdout
    assert "is valid" in proc.stderr


# -- the shipped recipes -----------------------------------------------------------------

def test_every_shipped_recipe_validates():
    names = {os.path.basename(p) for p in RECIPES}
    assert {"quickstart.yaml", "mirrored.yaml", "multi_worker.yaml", "parameter_server.yaml",
            "digits.yaml", "files.yaml", "embeddings.yaml"} <= names
    for path in RECIPES:
        recipes.load(path, [])
        text = open(path).read()
        assert text.startswith("#") and text.count("#") >= 4, f"{path}: say why values are set"


SHORTEN = {
    "digits.yaml": ["trainer.epochs=2"],
    "files.yaml": ["data.train.args.num_examples=2048", "data.validation.args.num_examples=512",
                   "trainer.steps_per_epoch=4"],
    "parameter_server.yaml": ["data.train.args.num_examples=2048", "trainer.steps_per_loop=2"],
    "embeddings.yaml": ["data.train.args.num_examples=2048", "trainer.steps_per_loop=2"],
}


# Recipes without a cluster run here, as `cli.main` (the test process has the two logical CPUs
# mirrored.yaml asks for, and scikit-learn for digits.yaml): a process and a TensorFlow start
# fewer each. Those that start servers or isolate the network run as their own process.
IN_THIS_PROCESS = {"mirrored.yaml", "files.yaml", "digits.yaml"}


# quickstart.yaml runs whole, as the README's first command, in test_project.py
# (`test_the_readme_main_command_says_only_true_things_on_a_new_model_dir`), which checks
# what this test checks of a run: one process fewer.
@pytest.mark.multiprocess
@pytest.mark.parametrize("path", [p for p in RECIPES if os.path.basename(p) != "quickstart.yaml"],
                         ids=os.path.basename)
def test_every_shipped_recipe_runs_shortened(path, tmp_path, capsys):
    name = os.path.basename(path)
    sets = ["trainer.epochs=1", f"trainer.model_dir={tmp_path / 'run'}",
            "data.train.args.num_examples=1024", "data.validation.args.num_examples=512",
            "trainer.verbose=0"]
    if name in SHORTEN:
        sets = [s for s in sets if "num_examples" not in s] + SHORTEN[name]
    if name == "files.yaml":
        sets += [f"data.train.args.directory={tmp_path / 'records'}",
                 f"data.validation.args.directory={tmp_path / 'validation-records'}"]
    args = ["run", path] + [a for s in sets for a in ("--set", s)]
    if name in IN_THIS_PROCESS:
        code = cli.main(args)
        out, err = capsys.readouterr()
    else:
        proc = helpers.run_python(["-m", "kerastrain.cli", *args], timeout=300)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    assert code == 0, out[-2000:] + err[-4000:]
    summary = [line for line in out.splitlines() if line.startswith("kerastrain: done:")]
    assert summary and "loss" in summary[0], out[-2000:]
    # The resolved recipe, with the overrides, is next to the checkpoints.
    resolved = yaml.safe_load((tmp_path / "run" / "recipe.yaml").read_text())
    epochs = 2 if name == "digits.yaml" else 1
    assert resolved["trainer"]["epochs"] == epochs
    assert f"{epochs} epoch" in summary[0]
    assert os.path.isdir(tmp_path / "run" / "checkpoints")


def test_set_changes_the_run_and_the_resolved_recipe_shows_it(tmp_path, capsys):
    # 6 batches of 256: epochs of 3 steps (finite data ends an epoch early, as in fit).
    sets = ["trainer.epochs=1", "trainer.steps_per_epoch=3", f"trainer.model_dir={tmp_path}",
            "data.train.args.num_examples=1536", "data.validation.args.num_examples=256",
            "trainer.verbose=0", "strategy=default"]
    code = cli.main(["run", os.path.join(helpers.REPO, "recipes", "quickstart.yaml"),
                     *[a for s in sets for a in ("--set", s)]])
    assert code == 0
    out = capsys.readouterr().out
    assert "kerastrain: done: 1 epoch, step 3," in out
    text = (tmp_path / "recipe.yaml").read_text()
    assert text.startswith("# resolved from ") and "--set trainer.epochs=1" in text
    resolved = yaml.safe_load(text)
    assert resolved["trainer"]["epochs"] == 1 and resolved["trainer"]["steps_per_epoch"] == 3
    assert resolved["strategy"] == {"name": "default"}
    # Defaults filled in, the options sections too; and the file is a recipe as it is.
    from kerastrain.io.checkpoints import CheckpointOptions
    from kerastrain.io.monitor import TensorBoardOptions
    assert set(resolved["checkpoints"]) == {f.name for f in dataclasses.fields(CheckpointOptions)}
    assert set(resolved["tensorboard"]) == {f.name for f in dataclasses.fields(TensorBoardOptions)}
    assert resolved["tuning"]["input_options"] is True and resolved["mlflow"] is False
    assert cli.main(["validate", str(tmp_path / "recipe.yaml")]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == resolved
    recipe, _ = recipes.load(str(tmp_path / "recipe.yaml"), [], imports=False)
    assert training._with_hparams(recipe.tensorboard, recipe)["hparams"]["trainer.epochs"] == 1
    # A rerun with another setting keeps the earlier record instead of overwriting it.
    assert cli.main(["run", os.path.join(helpers.REPO, "recipes", "quickstart.yaml"),
                     *[a for s in sets + ["trainer.epochs=2"] for a in ("--set", s)]]) == 0
    assert "kerastrain: done: 1 epoch, step 6," in capsys.readouterr().out
    assert yaml.safe_load((tmp_path / "recipe.yaml").read_text())["trainer"]["epochs"] == 2
    assert yaml.safe_load((tmp_path / "recipe.yaml.previous-1").read_text())["trainer"][
        "epochs"] == 1


def test_digits_recipe_reaches_its_stated_accuracy(tmp_path):
    recipe, _ = recipes.load(os.path.join(helpers.REPO, "recipes", "digits.yaml"),
                             [f"trainer.model_dir={tmp_path}", "trainer.verbose=0"])
    trainer, history = training.run(recipe)
    assert len(history.history["val_accuracy"]) == 50
    assert history.history["val_accuracy"][-1] >= 0.95, history.history["val_accuracy"][-5:]


# -- hostile input: every limit fails fast, naming the file (and line), exit 2 ------------------

def validate_in_child(args, timeout=30):
    """`kerastrain validate ARGS` in a child with a time and memory limit: a regression that
    reads forever fails this test instead of hanging or exhausting the machine."""
    import resource
    import subprocess
    import sys

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    env = helpers.child_env()
    return subprocess.run([sys.executable, "-m", "kerastrain.cli", "validate", *map(str, args)],
                          env=env, cwd=helpers.REPO, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit_memory)


@pytest.mark.parametrize("target,kind", [("/dev/zero", "a character device"),
                                         ("fifo", "a named pipe (FIFO)"),
                                         ("subdir", "a directory")])
def test_include_of_a_device_fifo_or_directory_is_refused_without_opening_it(tmp_path, target,
                                                                               kind):
    os.mkfifo(tmp_path / "fifo")   # nobody ever writes: opening it for reading would wait
    (tmp_path / "subdir").mkdir()
    (tmp_path / "recipe.yaml").write_text(f"include: {target}\n" + BASE)
    proc = validate_in_child([tmp_path / "recipe.yaml"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert (f"recipe.yaml:1: include: included file {target!r}: expected a regular file, but "
            f"it is {kind}") in proc.stderr, proc.stderr


def test_a_fifo_given_as_the_recipe_is_refused(tmp_path):
    os.mkfifo(tmp_path / "fifo.yaml")
    proc = validate_in_child([tmp_path / "fifo.yaml"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "fifo.yaml: expected a regular file, but it is a named pipe (FIFO)" in proc.stderr


def test_a_recipe_over_the_size_limit_is_refused_before_it_is_read(tmp_path, capsys):
    big = "#" * (recipes.MAX_BYTES - len(BASE)) + "\n"   # one byte too many with BASE
    code, out, err = validate(tmp_path, capsys, big + BASE)
    assert code == 2 and out == "", err
    assert (f"recipe.yaml: expected at most 1.0 MiB of recipe text (included files counted), "
            f"but it is 1.0 MiB ({recipes.MAX_BYTES + 1:,} bytes)") in err, err
    # Included files count against the same limit: two halves do not make a way around it.
    half = "#" * (recipes.MAX_BYTES // 2) + "\n"
    (tmp_path / "a.yaml").write_text(half + "trainer: {epochs: 1}\n")
    (tmp_path / "b.yaml").write_text(half + "trainer: {seed: 1}\n")
    code, _, err = validate(tmp_path, capsys, "include: [a.yaml, b.yaml]\n" + BASE)
    assert code == 2 and "included file 'b.yaml': expected at most 1.0 MiB" in err, err
    assert "bytes were left after the files read before it" in err, err


def test_nul_bytes_and_non_utf8_are_reported_with_file_and_line(tmp_path, capsys):
    path = tmp_path / "recipe.yaml"
    path.write_bytes(BASE.encode() + b"trainer:\n  epochs: 1\x00\n")
    assert cli.main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "recipe.yaml:10: expected text, but column 12 holds NUL (U+0000)" in err, err
    path.write_bytes(BASE.encode() + b"trainer:\n  model_dir: caf\xe9\n")  # Latin-1, not UTF-8
    assert cli.main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "recipe.yaml:10: expected UTF-8 text, but byte 0xe9" in err and "Traceback" not in err
    # In an included file, the included file is the one named.
    (tmp_path / "child.yaml").write_text("include: recipe.yaml\n")
    assert cli.main(["validate", str(tmp_path / "child.yaml")]) == 2
    assert "recipe.yaml:10: expected UTF-8 text" in capsys.readouterr().err


def billion_laughs(levels=9):
    lines = ['lol0: &lol0 "lol"']
    for i in range(1, levels + 1):
        lines.append(f"lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"   # 10**9 strings once expanded, 700 bytes of text


def test_billion_laughs_stops_at_the_first_alias_over_the_budget(tmp_path):
    import time

    (tmp_path / "recipe.yaml").write_text(BASE + billion_laughs())
    # In a child first: a regression (expanding the aliases) fails on its memory limit.
    proc = validate_in_child([tmp_path / "recipe.yaml"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    # Values are counted as PyYAML composes, so the refusal is exact: lol5's aliases of lol4
    # (11,111 values each) run out of the 100,000 after the ~12,350 that lol0..lol4 hold.
    line = 8 + 6
    assert (f"recipe.yaml:{line}: expected at most 100,000 values in the recipe (included files "
            "counted, each alias counted as the copy it makes), but the alias *lol4 here "
            "expands to 11,111 values with ") in proc.stderr, proc.stderr
    start = time.perf_counter()
    with pytest.raises(config.RecipeError, match=r"alias \*lol4"):
        recipes.load(tmp_path / "recipe.yaml")
    assert time.perf_counter() - start < 1.0
    # The budget is for the whole recipe: aliases in included files count too.
    (tmp_path / "child.yaml").write_text("include: recipe.yaml\n")
    with pytest.raises(config.RecipeError, match=r"recipe.yaml:14: .*alias \*lol4"):
        recipes.load(tmp_path / "child.yaml")


def test_aliases_within_the_budget_are_copies(tmp_path, monkeypatch):
    text = BASE.replace("  train:\n", "  train: &train\n") + "  validation: *train\n"
    recipe, tree = recipes.load(_write_text(tmp_path, text), ["data.validation.args.seed=1"])
    assert recipe.data.validation.builder == recipe.data.train.builder
    assert tree["data"]["validation"]["args"] == {"num_examples": 256, "features": 8, "seed": 1}
    assert tree["data"]["train"]["args"] == {"num_examples": 256, "features": 8}
    # A recipe of exactly MAX_VALUES values is fine; one more is not (a smaller budget here:
    # pure-Python YAML composes 100,000 values in about a second).
    monkeypatch.setattr(recipes, "MAX_VALUES", 1000)
    n = recipes.MAX_VALUES - 1 - 2 * 4   # root mapping, 4 keys and values, the list
    lists = ("a: {}\nb: {}\nc: {}\nd: [" + ", ".join(["0"] * n) + "]\n")
    recipes.parse_yaml(lists, "ok.yaml")
    with pytest.raises(config.RecipeError, match=r"big.yaml:4: expected at most 1,000 values"):
        recipes.parse_yaml(lists.replace("[", "[0, "), "big.yaml")


def test_yaml_merge_keys_merge_with_the_mappings_own_keys_winning(tmp_path, capsys):
    text = ("x-data: &data\n  builder: kerastrain.examples:synthetic_data\n"
            "  args: {num_examples: 64, features: 8}\n"
            "x-more: &more {args: {num_examples: 1}}\n"
            + BASE.replace("  train:\n    builder: kerastrain.examples:synthetic_data\n"
                           "    args: {num_examples: 256, features: 8}\n",
                           "  train:\n    <<: [*data, *more]\n"))
    recipe, tree = recipes.load(_write_text(tmp_path, text))
    # The earlier mapping of a merge list wins, as in YAML's merge-key spec.
    assert tree["data"]["train"] == {"builder": "kerastrain.examples:synthetic_data",
                                     "args": {"num_examples": 64, "features": 8}}
    assert recipe.data.train.args == {"num_examples": 64, "features": 8}
    # The mapping's own key wins over a merged one.
    text = BASE.replace("  batch_size: 32\n", "  <<: {batch_size: 8}\n  batch_size: 32\n")
    assert recipes.load(_write_text(tmp_path, text))[0].data.batch_size == 32
    code, _, err = validate(tmp_path, capsys, BASE + "x-n: &n 3\nstrategy:\n  <<: *n\n")
    assert code == 2 and "a merge key `<<` takes a mapping" in err and "Received: '3'" in err
    code, _, err = validate(tmp_path, capsys, "base: 1\n" + BASE)
    assert code == 2 and "under a top-level key starting with 'x-'" in err, err


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path, capsys):
    code, _, err = validate(tmp_path, capsys, BASE + "model2: &m [1, [2, *m]]\n")
    assert code == 2 and "Traceback" not in err, err
    assert "recipe.yaml:9: the alias *m is inside the node it names, so it would never end" in err


def test_deep_nesting_is_refused_naming_file_and_line(tmp_path, capsys, monkeypatch):
    code, _, err = validate(tmp_path, capsys, BASE + "trainer:\n  seed: " + "[" * 5000 +
                            "]" * 5000 + "\n")
    assert code == 2 and "Traceback" not in err, err
    assert ("recipe.yaml:10: expected at most 64 levels of nested mappings and lists, but this "
            "value is at level 65") in err, err
    # Nesting made by aliases counts too: the root, 30 lists, then x (40 lists and a scalar).
    text = BASE + "x: &x " + "[" * 40 + "1" + "]" * 40 + "\ny: " + "[" * 30 + "*x" + "]" * 30
    code, _, err = validate(tmp_path, capsys, text + "\n")
    assert code == 2 and "recipe.yaml:10: expected at most 64 levels" in err, err
    assert "the alias *x here reaches level 72" in err, err
    # A --set key path is bounded the same way.
    code, _, err = validate(tmp_path, capsys, BASE, ["model.args" + ".a" * 100 + "=1"])
    assert code == 2 and "expected a key path of at most 64 parts. Received: 102 parts" in err
    # Should anything reach Python's recursion limit anyway, the file is still named.
    monkeypatch.setattr(recipes, "MAX_DEPTH", 10 ** 6)
    code, _, err = validate(tmp_path, capsys, BASE + "x: " + "[" * 5000 + "]" * 5000 + "\n")
    assert code == 2 and "Traceback" not in err, err
    assert "recipe.yaml: nested too deeply to read (Python's recursion limit" in err, err


def diamonds(tmp_path, levels):
    """d0 includes b1 and c1, which both include d1, which includes b2 and c2, ... d{levels}."""
    for k in range(levels):
        (tmp_path / f"d{k}.yaml").write_text(f"include: [b{k + 1}.yaml, c{k + 1}.yaml]\n"
                                             f"model: {{args: {{d{k}: {k}}}}}\n")
        for side in "bc":
            (tmp_path / f"{side}{k + 1}.yaml").write_text(
                f"include: d{k + 1}.yaml\nmodel: {{args: {{{side}{k + 1}: {k}}}}}\n")
    (tmp_path / f"d{levels}.yaml").write_text(BASE)
    return tmp_path / "d0.yaml"


def test_diamond_includes_read_each_file_once(tmp_path, monkeypatch):
    reads = []
    real_read = recipes._read
    monkeypatch.setattr(recipes, "_read", lambda path, *a: reads.append(path) or real_read(
        path, *a))
    tree, _ = recipes.load_file(diamonds(tmp_path, 8))   # 2**8 paths reach d8.yaml
    assert len(reads) == len(set(reads)) == 3 * 8 + 1
    args = tree["model"]["args"]
    assert args["d0"] == 0 and args["b8"] == args["c8"] == 7 and args["hidden"] == 8


def test_twenty_levels_of_diamonds_stop_at_the_include_depth(tmp_path):
    # 2**20 paths; in a child so that a regression fails on its time limit, not the suite.
    proc = validate_in_child([diamonds(tmp_path, 20)])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert ("d8.yaml:1: include: included file 'b9.yaml': expected includes nested at most 16 "
            "deep, but this one is 17 deep: d0.yaml -> b1.yaml -> d1.yaml -> ") in proc.stderr, \
        proc.stderr
    assert proc.stderr.rstrip().endswith("d8.yaml -> b9.yaml"), proc.stderr


def test_more_files_than_the_limit_are_refused(tmp_path, capsys):
    names = [f"part{i}.yaml" for i in range(recipes.MAX_FILES)]
    for name in names:
        (tmp_path / name).write_text("trainer: {epochs: 1}\n")
    code, _, err = validate(tmp_path, capsys, "include:\n" + "".join(f"  - {n}\n" for n in names)
                            + BASE)
    assert code == 2, err
    assert (f"recipe.yaml:{recipes.MAX_FILES + 1}: include: included file 'part63.yaml': "
            "expected at most 64 files in one recipe (it and all it includes), but this is one "
            "more") in err, err
    code, _, err = validate(tmp_path, capsys, f"include: [{', '.join(names[:-1])}]\n" + BASE)
    assert code == 0, err


def test_validate_no_import_runs_none_of_the_recipes_code(tmp_path, capsys, monkeypatch):
    import sys

    marker = tmp_path / "module-ran"
    (tmp_path / "untrusted_builders.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nraise RuntimeError('boom')\n"
        "def build(): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = BASE.replace("kerastrain.examples:build_mlp", "untrusted_builders:build")
    (tmp_path / "recipe.yaml").write_text(text)
    assert cli.main(["validate", "--no-import", str(tmp_path / "recipe.yaml")]) == 0
    err = capsys.readouterr().err
    assert not marker.exists() and "untrusted_builders" not in sys.modules
    assert ("is valid, except what needs importing: not imported (--no-import), so not checked "
            "to exist or take their args: model.builder untrusted_builders:build; "
            "data.train.builder kerastrain.examples:synthetic_data") in err, err
    # Everything that needs no import is still checked, import paths' form included.
    (tmp_path / "recipe.yaml").write_text(text + "  validation: {builder: not-a-path}\n"
                                                 "trainer: {epoch: 1}\n")
    assert cli.main(["validate", "--no-import", str(tmp_path / "recipe.yaml")]) == 2
    err = capsys.readouterr().err
    assert "trainer.epoch: unknown key" in err and "expected an import path" in err, err
    # Without --no-import the module is imported: its code runs (and here fails).
    (tmp_path / "recipe.yaml").write_text(text)
    assert cli.main(["validate", str(tmp_path / "recipe.yaml")]) == 2
    assert marker.exists()
    assert "importing 'untrusted_builders' failed with RuntimeError: boom" in \
        capsys.readouterr().err


def test_validate_help_says_it_imports_the_recipes_modules(capsys):
    with pytest.raises(SystemExit):
        cli.main(["validate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "validate IMPORTS THE RECIPE'S MODULES, which runs their code" in out
    assert "For a recipe you do not trust, use --no-import" in out
    assert "--no-import do not import the recipe's modules (no code of theirs runs)" in out


@pytest.mark.parametrize("command", ["run", "validate", "launch", "export", "quickstart", "info",
                                     "bench"])
def test_each_commands_help_shows_examples_of_that_command(capsys, command):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    examples = capsys.readouterr().out.split("examples:", 1)[1]
    lines = [line.split()[:2] for line in examples.splitlines() if "kerastrain" in line]
    assert lines and all(["kerastrain", command] == words for words in lines if
                         words[0] == "kerastrain"), examples
