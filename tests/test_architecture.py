"""The package keeps the shape docs/architecture.md describes: layers, sizes, no back-references."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "kerastrain"


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def module_name(path):
    """kerastrain/io/files.py -> kerastrain.io.files; a package's __init__ -> the package."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_kerastrain_modules(tree):
    """Every kerastrain module a module imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("kerastrain."))
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module + ".").startswith("kerastrain."):
            # `from kerastrain.io import files` imports a module; `from kerastrain.io.files
            # import DiskFull` a name of one: both spellings are kept, non-modules drop out.
            found.update(f"{node.module}.{a.name}" for a in node.names)
            if node.module != "kerastrain":
                found.add(node.module)
    return found


def _lines_matching(patterns, allowed_in):
    """`file:line: text` of each line of the package matching a pattern, but in `allowed_in`
    (a module or a subpackage, relative to the package: "trainer.py", "_compat")."""
    allowed = PACKAGE / allowed_in
    return [f"{path.name}:{number}: {line.strip()}" for path, _ in modules()
            if path != allowed and allowed not in path.parents
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if any(re.search(pattern, line) for pattern in patterns)]


def test_no_module_but_the_trainer_reaches_into_a_trainers_privates():
    offenders = _lines_matching([r"\btrainer\._\w"], allowed_in="trainer.py")
    assert not offenders, offenders


def test_the_import_graph_has_no_circle():
    names = {module_name(p): t for p, t in modules()}
    graph = {name: imported_kerastrain_modules(tree) & set(names) - {name}
             for name, tree in names.items()}
    circles = []

    def visit(node, path):
        for nxt in sorted(graph[node]):
            if nxt in path:
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, path + [nxt])
        done.add(node)

    done = set()
    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    assert not circles, circles


# From the bottom up: each subpackage imports only those below it (top-level modules, such as
# the trainer, _compat and _options, sit outside the layers).
LAYERS = ("distribute", "data", "step", "io", "loop", "cli")


def test_subpackages_import_only_the_layers_below_them():
    upward = []
    for path, tree in modules():
        name = module_name(path).split(".")
        if len(name) < 3 and not (PACKAGE / name[-1]).is_dir():
            continue   # a top-level module
        layer = name[1]
        for imported in imported_kerastrain_modules(tree):
            target = imported.split(".")[1]
            if target in LAYERS and target != layer and \
                    LAYERS.index(target) > LAYERS.index(layer):
                upward.append(f"{module_name(path)} -> {imported}")
    assert not upward, upward


def function_lengths():
    for path, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{path.name}:{node.name}", node.end_lineno - node.lineno + 1


def test_functions_stay_short_and_fit_reads_in_one_screen():
    lengths = dict(function_lengths())
    assert lengths["trainer.py:fit"] <= 60
    assert not {k: n for k, n in lengths.items() if n > 80}


# Issue 33's limits: a class of at most 300 lines, a module of at most 500, no exceptions
# (since 2026-11-27: the last over them were split along their seams, not trimmed).
CLASS_LINES, MODULE_LINES = 300, 500


def test_no_class_is_over_300_lines_and_no_module_over_500():
    over = {}
    for path, tree in modules():
        name = path.relative_to(PACKAGE).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MODULE_LINES:
            over[name] = lines
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and \
                    node.end_lineno - node.lineno + 1 > CLASS_LINES:
                over[f"{name}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert not over, f"over the limits (lines): {over}"


def test_writers_and_public_names_are_exported():
    import kerastrain
    for name in ("LoggingWriter", "CSVWriter", "MultiWriter", "MetricWriter", "TensorBoardWriter"):
        assert name in kerastrain.__all__
        assert getattr(kerastrain, name).__module__ == "kerastrain.io.summaries"


def test_every_public_name_and_module_resolves_wherever_its_module_lives():
    """`kerastrain/__init__.py` maps public names onto the subpackages: a module moved
    without its entry there would break `kt.<name>` for users, and only on first use."""
    import kerastrain
    for name in kerastrain.__all__:
        assert getattr(kerastrain, name) is not None, name
    for name, module in kerastrain._SUBMODULES.items():
        assert getattr(kerastrain, name).__name__ == module
    assert kerastrain.data.files.__module__ == "kerastrain.data.record_files"
    assert issubclass(kerastrain.DiskFull, OSError)
    assert issubclass(kerastrain.Preempted, SystemExit)


def test_no_name_is_defined_twice_in_one_class_or_module():
    """A second `def` of one name silently replaces the first (a merge left two once)."""
    twice = []
    for path, tree in modules():
        for scope in [tree] + [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            seen = set()
            for node in scope.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    decorated = any(getattr(d, "attr", None) in ("setter", "deleter", "register")
                                    for d in node.decorator_list)
                    if node.name in seen and not decorated:
                        twice.append(f"{path.name}:{node.lineno} {node.name}")
                    seen.add(node.name)
    assert not twice, twice


# What TensorFlow and Keras keep private, by the way kerastrain reaches it. Only the modules of
# `_compat/` may: one package to read (and to fix) when a release moves something.
_PRIVATE = (r"tf\.__internal__", r"\btensorflow\.python\b", r"\bkeras\.src\b",
            r"\._address\b", r"\bpywrap_tfe\b", r"\bcontext\.context\(\)")


def test_private_tensorflow_and_keras_apis_are_reached_only_from_compat():
    offenders = _lines_matching(_PRIVATE, allowed_in="_compat")
    assert not offenders, offenders


# Whether a value is an int or a number (bools excluded, as Python counts them as ints) is
# tested in one place, `_options.is_int` / `is_number` / `check_int`; each caller words its
# own error. An inline copy is how an option came to accept True or inf in one place only.
_INLINE_NUMBER_CHECKS = (r"isinstance\([^()]*, bool\) or not isinstance",
                         r"isinstance\([^()]*\) and not isinstance\([^()]*, bool\)")


def test_ints_and_numbers_are_checked_in_one_place():
    offenders = _lines_matching(_INLINE_NUMBER_CHECKS, allowed_in="_options.py")
    assert not offenders, offenders
    from kerastrain import _options
    import numpy as np
    assert [_options.is_int(v, 1) for v in (1, np.int64(3), True, 0, 1.0, "2")] == [
        True, True, False, False, False, False]
    assert [_options.is_number(v, above=0) for v in (0.5, 2, np.float32(1), 0, -1, True,
                                                     float("inf"), float("nan"), "1")] == [
        True, True, True, False, False, False, False, False, False]
    assert _options.is_number(1, minimum=1) and not _options.is_number(0.9, minimum=1)


# The modules `kerastrain validate`, `export`, `launch` and `--help` run on: they load no
# TensorFlow or Keras (seconds of start-up, and none of it needed to check a recipe).
TENSORFLOW_FREE = ("kerastrain.cli.command", "kerastrain.cli.config", "kerastrain.cli.recipes",
                   "kerastrain.cli.arguments", "kerastrain.cli.training",
                   "kerastrain.cli.launch", "kerastrain.cli.tasks", "kerastrain.cli.isolation",
                   "kerastrain.cli.frozen", "kerastrain.cli.interrupts", "kerastrain.cli.faults",
                   "kerastrain.cli.outages", "kerastrain.cli.elastic",
                   "kerastrain.cli.manifests",
                   "kerastrain.loop.stalls", "kerastrain.io.files", "kerastrain._options",
                   "kerastrain.distribute.cluster", "kerastrain.distribute.network",
                   "kerastrain.io.locks", "kerastrain.cli.hosts", "kerastrain.cli.ray_cluster",
                   "kerastrain.cli.script", "kerastrain.loop.ps.liveness",
                   "kerastrain.cli.tune.space", "kerastrain.cli.tune.study",
                   "kerastrain.cli.tune.trials")


def test_the_command_lines_modules_import_without_tensorflow():
    import json
    import subprocess
    import sys
    code = ("import json, sys\n"
            f"for name in {TENSORFLOW_FREE!r}: __import__(name)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'keras', 'numpy'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(PACKAGE.parent), check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


def _top_level_imports(tree):
    """The import statements that run when the module loads (those under TYPE_CHECKING do not)."""
    found, body = [], list(tree.body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.ClassDef)):
            body += node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
            body += [s for handler in getattr(node, "handlers", []) for s in handler.body]
    return found


def modules_loading_tensorflow():
    """The modules that import TensorFlow or Keras when they load: themselves, or through the
    kerastrain modules (and packages) they import at the top."""
    trees = {module_name(p): t for p, t in modules()}
    loading, needs = set(), {}
    for name, tree in trees.items():
        top = _top_level_imports(tree)
        imported = imported_kerastrain_modules(ast.Module(body=top, type_ignores=[]))
        imported |= {name}
        needs[name] = {".".join(m.split(".")[:i]) for m in imported
                       for i in range(2, m.count(".") + 2)} & set(trees) - {name}
        if any(root in ("tensorflow", "keras") for node in top for root in
               ([a.name.split(".")[0] for a in node.names] if isinstance(node, ast.Import)
                else [(node.module or "").split(".")[0]])):
            loading.add(name)
    while grown := {n for n, deps in needs.items() if deps & loading} - loading:
        loading |= grown
    return loading


# A module that loads TensorFlow anyway imports tensorflow, keras and numpy at its top. Inside
# functions they are for modules that must load without TensorFlow (docs/architecture.md's rules).
def test_a_module_that_loads_tensorflow_anyway_imports_it_at_the_top():
    loading = modules_loading_tensorflow()
    assert {"kerastrain.trainer", "kerastrain._compat.data"} <= loading
    assert not loading & set(TENSORFLOW_FREE), loading & set(TENSORFLOW_FREE)
    local = []
    for path, tree in modules():
        if module_name(path) not in loading:
            continue
        top = set(map(id, _top_level_imports(tree)))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if id(node) not in top and any(
                    n.split(".")[0] in ("tensorflow", "keras", "numpy")
                    and not any(re.search(p, n) for p in _PRIVATE) for n in names):
                local.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert not local, local


def test_a_recipe_option_and_its_python_argument_have_one_default():
    """`trainer:` keys of a recipe are Trainer/fit arguments: each default is written once,
    in TrainerConfig; the signatures read it from there (`=_DEFAULT.<name>`, fit's
    `verbose=None` meaning "the trainer's"), so they cannot drift apart."""
    import dataclasses

    from kerastrain.cli import config
    tree = ast.parse((PACKAGE / "trainer.py").read_text())
    defaults = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in ("__init__", "fit"):
            for arg, default in zip(node.args.kwonlyargs, node.args.kw_defaults):
                defaults.setdefault(arg.arg, []).append(ast.unparse(default))
    unmatched = []
    for field in dataclasses.fields(config.TrainerConfig):
        found = defaults.get(field.name)
        if not found:
            unmatched.append(f"{field.name}: in no signature")
        for default in found or ():
            if default != f"_DEFAULT.{field.name}" and not (
                    field.name == "verbose" and default == "None"):
                unmatched.append(f"{field.name}: the signature says {default}")
    assert not unmatched, unmatched
    from kerastrain import trainer
    assert trainer._DEFAULT == config.TrainerConfig()


def test_the_trainer_and_fit_check_each_option_by_its_recipe_field():
    """One source for what an option accepts: for every `trainer:` key, a value its
    `TrainerConfig` field refuses is refused by `Trainer(...)` or `fit(...)` with the words
    of that field's check (`model_dir` alone is checked by `files.normalize_model_dir`,
    which also takes `os.PathLike` objects, that no recipe can hold)."""
    import dataclasses

    import keras
    import pytest

    from kerastrain import _options, trainer

    def refused(field):
        for probe in (-1, 0, "x", True, 0.5, 1.5, [1]):
            try:
                field.metadata["check"](probe)
            except _options.Bad as e:
                return probe, e.python
        raise AssertionError(f"no probe value is refused by {field.name}")

    def build():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    fit_args = {"epochs", "steps_per_epoch", "validation_steps"}
    fitted = trainer.Trainer(build, strategy="one_device", checkpoint=False, tensorboard=False)
    for field in dataclasses.fields(_options.TrainerConfig):
        if field.name == "model_dir":
            continue
        value, words = refused(field)
        expected = f"`{field.name}` must be {words}. Received: {field.name}={value!r}"
        with pytest.raises(ValueError) as raised:
            if field.name in fit_args:
                fitted.fit(([[0.0, 0.0]], [[0.0]]), **{field.name: value})
            else:
                trainer.Trainer(build, strategy="one_device", **{field.name: value})
        assert str(raised.value) == expected, (field.name, str(raised.value))


def test_the_trainer_asks_its_mode_instead_of_testing_the_strategy():
    """What differs between kinds of strategy lives in `kerastrain.loop.modes`; the
    Trainer and its training state only hand the strategy's kind on to the run state."""
    tests = [line.strip() for module in ("trainer.py", "loop/training_state.py")
             for line in (PACKAGE / module).read_text().splitlines()
             if re.search(r"\bis_(parameter_server|multi_worker)\b", line)]
    assert tests == [], tests


def test_optional_extras_are_imported_by_one_module_each_and_only_when_used():
    """Without an extra installed nothing imports it: MLflow only in io/tracking.py, Ray
    only in cli/ray_cluster.py and Optuna only in cli/tune/study.py, each inside functions
    (never when the module loads)."""
    package = PACKAGE
    importers = {}
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for extra in {n.split(".")[0] for n in names} & {"mlflow", "ray", "optuna"}:
                importers.setdefault(extra, {}).setdefault(
                    path.relative_to(package).as_posix(), []).append(node.col_offset)
    assert set(importers["mlflow"]) == {"io/tracking.py"}
    assert set(importers["ray"]) == {"cli/ray_cluster.py"}
    assert set(importers["optuna"]) == {"cli/tune/study.py"}
    assert all(offset > 0 for found in importers.values() for offsets in found.values()
               for offset in offsets)   # never at module level


def _branches_on(names, *, allowed):
    """`file:line` of each condition (if, while, a conditional expression, and/or) that reads
    one of `names`, outside the `allowed` modules and folders."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if any(where == a or where.startswith(a + "/") for a in allowed):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            tests = [node.test] if isinstance(node, (ast.If, ast.While, ast.IfExp)) else \
                node.values if isinstance(node, ast.BoolOp) else []
            for test in tests:
                read = {n.attr if isinstance(n, ast.Attribute) else n.id
                        for n in ast.walk(test) if isinstance(n, (ast.Attribute, ast.Name))}
                if read & names:
                    found.append(f"{where}:{test.lineno}")
    return sorted(set(found))


def test_only_the_kind_objects_branch_on_the_kind_of_strategy():
    """What differs between one host, multi-worker and parameter servers is asked of the kind
    object (`loop/modes.py`: its input policy, its step, its driver), never tested elsewhere
    (`distribute/` builds the strategies and may)."""
    assert _branches_on({"is_parameter_server", "is_multi_worker"},
                        allowed={"loop/modes.py", "distribute"}) == []


def test_one_module_decides_what_the_chief_does_differently():
    """The chief rule (`io/outputs.py`): every task asks `Outputs` where its outputs go, whether
    it keeps files and whether it speaks; no other module branches on being the chief."""
    assert _branches_on({"is_chief", "_is_chief"}, allowed={"io/outputs.py", "distribute"}) == []
