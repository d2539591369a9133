"""YAML recipes: a strict loader that remembers lines, includes, `--set` overrides, and `run`.

Loading is YAML with a safe loader and YAML 1.2 scalars: only `true`/`false`
are booleans (so `shard: off` stays the string "off"), `1e-3` is a float, and a
key given twice is an error rather than silently the last one.
"""

from __future__ import annotations

import copy
import inspect
import logging
import os
import re
import stat
import time

import yaml

from kerastrain.cli import config as config_lib
from kerastrain.cli.config import Problem, RecipeError

logger = logging.getLogger("kerastrain")

# What one `load` may read, all its included files together (docs/recipes.md, "Limits").
# A real recipe is a few KiB; PyYAML's pure-Python reader takes seconds per MiB here, so a
# hostile file fails within a second or two instead of hanging the command.
MAX_BYTES = 1 << 20
# Values (scalars, lists, mappings) after YAML aliases are expanded, counted as PyYAML
# composes, so that a "billion laughs" of nested aliases stops at its first big alias.
MAX_VALUES = 100_000
# Levels of nested mappings and lists, aliases expanded: Python recursion stays far from its limit.
MAX_DEPTH = 64
# Files in one recipe (it and all it includes, each read once however often it is included)
# and how deep includes nest. Real recipes use one or two levels.
MAX_FILES = 64
MAX_INCLUDE_DEPTH = 16

_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema booleans, ints and floats, and bounded aliases.

    PyYAML composes an alias as the anchored node itself, so the composed graph is as
    small as the text; it is `_construct` that copies each alias where it is used. So the
    cost is counted here, as the nodes are composed: each node costs one value, each
    alias the values of the node it names, and its nesting adds the node's height.
    """

    def __init__(self, text, source="<string>", budget=None):
        super().__init__(text)
        self.source = source
        self.budget = budget or _Budget()
        self.depth = 0
        self.sizes = {}     # composed node -> values it expands to; absent while still open
        self.heights = {}   # composed node -> levels of nesting it expands to

    def _refuse(self, mark, message):
        raise RecipeError([Problem("", _where(self.source, mark.line + 1), message)])

    def _spend(self, values, mark, what):
        if values > self.budget.values:
            self._refuse(mark, f"expected at most {MAX_VALUES:,} values in the recipe (included "
                               f"files counted, each alias counted as the copy it makes), but "
                               f"{what}; keep data in files and pass their paths as builder args")
        self.budget.values -= values

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)  # undefined: PyYAML's own error below
            if target is not None:
                if target not in self.sizes:
                    self._refuse(event.start_mark, f"the alias *{event.anchor} is inside the "
                                                   "node it names, so it would never end")
                if self.depth + self.heights[target] > MAX_DEPTH:
                    self._refuse(event.start_mark, (
                        f"expected at most {MAX_DEPTH} levels of nested mappings and lists, but "
                        f"the alias *{event.anchor} here reaches level "
                        f"{self.depth + self.heights[target]}"))
                self._spend(self.sizes[target], event.start_mark,
                            f"the alias *{event.anchor} here expands to "
                            f"{self.sizes[target]:,} values with {self.budget.values:,} left")
            return super().compose_node(parent, index)
        mark = self.peek_event().start_mark
        if self.depth >= MAX_DEPTH:
            self._refuse(mark, f"expected at most {MAX_DEPTH} levels of nested mappings and "
                               f"lists, but this value is at level {self.depth + 1}")
        left = self.budget.values
        self._spend(1, mark, "the recipe holds more from this line on")
        self.depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        children = (node.value if isinstance(node, yaml.SequenceNode) else
                    [n for pair in node.value for n in pair]
                    if isinstance(node, yaml.MappingNode) else ())
        self.heights[node] = 1 + max((self.heights[c] for c in children), default=0)
        self.sizes[node] = left - self.budget.values
        return node


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_BOOL, _INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))
_Loader.add_implicit_resolver(_INT, re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F]+)$"),
                              list("-+0123456789"))
_Loader.add_implicit_resolver(_FLOAT, re.compile(
    r"^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9_]+)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def _where(path, line):
    return f"{path}:{line}"


class _Budget:
    """What one recipe load may still read, shared by the file and everything it includes."""

    def __init__(self):
        self.bytes = MAX_BYTES
        self.values = MAX_VALUES
        self.files = 0
        # Real path -> (tree, positions). A file included along several paths (a diamond) is
        # read once: without this, 20 levels of diamonds were read 2**20 times.
        self.loaded = {}


def _mib(n):
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


def _kind(mode):
    """What a non-regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _read(path, budget, refuse):
    """The text of a regular file of at most `budget.bytes` bytes, else `refuse(message)`."""
    # stat first: opening a FIFO waits for a writer and /dev/zero never ends, and opening
    # some devices has effects of its own, so neither is opened at all.
    try:
        info = os.stat(path)
    except OSError as e:
        refuse(f"cannot read the file: {e.strerror}")
    if not stat.S_ISREG(info.st_mode):
        refuse(f"expected a regular file, but it is {_kind(info.st_mode)}")
    if info.st_size > budget.bytes:
        refuse(f"expected at most {_mib(MAX_BYTES)} of recipe text (included files counted), "
               f"but it is {_mib(info.st_size)} ({info.st_size:,} bytes)"
               + ("" if budget.bytes == MAX_BYTES else
                  f" and only {budget.bytes:,} bytes were left after the files read before it"))
    try:
        # O_NONBLOCK and a second check on the open file: the path may have been replaced
        # by a FIFO since the stat, and opening that must not wait either.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        refuse(f"cannot read the file: {e.strerror}")
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if not stat.S_ISREG(mode):
            refuse(f"expected a regular file, but it is {_kind(mode)}")
        data = f.read(budget.bytes + 1)
    if len(data) > budget.bytes:  # it grew since the stat
        refuse(f"expected at most {_mib(MAX_BYTES)} of recipe text (included files counted), "
               "but it is larger")
    budget.bytes -= len(data)
    return data


def _decode(data, source):
    """UTF-8 text, or RecipeError naming the file, line and byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise RecipeError([Problem("", _where(source, line), (
            f"expected UTF-8 text, but byte 0x{data[e.start]:02x} (at byte {e.start:,}) is not "
            "UTF-8; is this a binary file? Save the recipe as UTF-8"))]) from None


_UNREADABLE = object()


def _scalar(loader, node, dotted, source, problems):
    """A key or scalar value, or _UNREADABLE with a problem at its line."""
    try:
        return loader.construct_object(node, deep=True)
    except ValueError as e:  # e.g. an int of more digits than Python converts (4,300)
        problems.append(Problem(dotted, _where(source, node.start_mark.line + 1),
                                f"cannot read this value: {e}"))
        return _UNREADABLE


_MERGE = "tag:yaml.org,2002:merge"


def _merged_in(loader, node, path, source, positions, problems):
    """The keys a mapping takes from YAML merge keys (`<<: *base` or `<<: [*a, *b]`).

    As in YAML's merge-key spec, the mapping's own keys win, and an earlier mapping
    in a list wins over a later one.
    """
    out = {}
    for key_node, value_node in node.value:
        if key_node.tag != _MERGE:
            continue
        sources = (value_node.value if isinstance(value_node, yaml.SequenceNode)
                   else [value_node])
        for source_node in reversed(sources):
            if not isinstance(source_node, yaml.MappingNode):
                problems.append(Problem(
                    ".".join(map(str, path + ("<<",))),
                    _where(source, key_node.start_mark.line + 1),
                    "a merge key `<<` takes a mapping (`<<: *name`) or a list of them. "
                    f"Received: {source_node.value!r}"))
                continue
            out.update(_construct(loader, source_node, path, source, positions, problems))
    return out


def _construct(loader, node, path, source, positions, problems):
    """Python data from a composed YAML node, recording each key's file and line.

    Each alias becomes a copy here; `_Loader` has checked that the copies fit the budget.
    """
    positions[path] = _where(source, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out = _merged_in(loader, node, path, source, positions, problems)
        explicit = set()
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                continue
            key = _scalar(loader, key_node, ".".join(map(str, path)), source, problems)
            if key is _UNREADABLE:
                continue
            if not isinstance(key, str):
                problems.append(Problem(".".join(map(str, path + (key,))),
                                        _where(source, key_node.start_mark.line + 1),
                                        f"keys must be strings. Received: {key!r}"))
                continue
            if key in explicit:
                problems.append(Problem(".".join(map(str, path + (key,))),
                                        _where(source, key_node.start_mark.line + 1),
                                        "given twice in the same mapping; keep one"))
            explicit.add(key)
            out[key] = _construct(loader, value_node, path + (key,), source, positions, problems)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(loader, item, path + (i,), source, positions, problems)
                for i, item in enumerate(node.value)]
    return _scalar(loader, node, ".".join(map(str, path)), source, problems)


def parse_yaml(text, source, budget=None):
    """(data, positions) from YAML text; RecipeError with the line for bad syntax.

    `budget` (shared by a file and its includes) bounds the values after alias expansion.
    """
    positions, problems = {}, []
    loader = None
    try:
        loader = _Loader(text, source, budget)  # checks every character first: NUL fails here
        node = loader.get_single_node()
        if node is None:
            raise RecipeError([Problem("", source, "the file is empty; a recipe needs at least "
                                                   "`model:` and `data:` sections")])
        data = _construct(loader, node, (), source, positions, problems)
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        name = "NUL" if e.character == 0 else "a control character"
        raise RecipeError([Problem("", _where(source, line), (
            f"expected text, but column {column} holds {name} (U+{e.character:04X}), which "
            "YAML does not allow; is this a binary file?"))]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = _where(source, mark.line + 1) if mark is not None else source
        problem = getattr(e, "problem", None) or str(e)
        raise RecipeError([Problem("", where, f"not valid YAML: {problem}")]) from None
    except RecursionError:
        # Python's own limit, should anything nest deeper than the checks below allow.
        raise RecipeError([Problem("", source, (
            "nested too deeply to read (Python's recursion limit was reached); recipes nest "
            "a few levels"))]) from None
    finally:
        if loader is not None:
            loader.dispose()
    if problems:
        raise RecipeError(problems)
    return data, positions


def _merge(base, override):
    """Deep-merge mappings: `override` wins; lists and scalars are replaced."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_file(path, _stack=(), _budget=None, _included_at=None):
    """(tree, positions) of a recipe file with its `include:`s merged in (the file wins).

    Raises:
        RecipeError: the file (or one it includes) cannot be read, is not a regular file, is
            over the limits (docs/recipes.md, "Limits"), or is not valid YAML; each problem
            names the file and, where there is one, the line.
    """
    budget = _budget or _Budget()
    path = os.path.abspath(path)
    shown = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
    real = os.path.realpath(path)
    chain = " -> ".join(os.path.basename(p) for p in _stack + (real,))
    if real in _stack:
        raise RecipeError([Problem("include", shown, f"include cycle: {chain}")])
    if real in budget.loaded:
        return budget.loaded[real]

    def refuse(message):
        if _included_at is None:
            raise RecipeError([Problem("", shown, message)])
        name, where = _included_at
        raise RecipeError([Problem("include", where, f"included file {name!r}: {message}")])

    if len(_stack) > MAX_INCLUDE_DEPTH:
        refuse(f"expected includes nested at most {MAX_INCLUDE_DEPTH} deep, but this one is "
               f"{len(_stack)} deep: {chain}")
    budget.files += 1
    if budget.files > MAX_FILES:
        refuse(f"expected at most {MAX_FILES} files in one recipe (it and all it includes), "
               "but this is one more")
    text = _decode(_read(path, budget, refuse), shown)
    tree, positions = parse_yaml(text, shown, budget)
    if not isinstance(tree, dict) or "include" not in tree:
        budget.loaded[real] = tree, positions
        return tree, positions
    includes = tree.pop("include")
    where = positions.get(("include",), shown)
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise RecipeError([Problem("include", where, "expected a file name or a list of file "
                                                     f"names. Received: {includes!r}")])
    merged, merged_positions = {}, {}
    for i, name in enumerate(includes):
        at = positions.get(("include", i), where)   # the line of this item in a list
        included = os.path.join(os.path.dirname(path), name)
        if not os.path.exists(included):
            raise RecipeError([Problem("include", at,
                                       f"included file {name!r} does not exist (looked for "
                                       f"{included})")])
        base, base_positions = load_file(included, _stack + (real,), budget, (name, at))
        if not isinstance(base, dict):
            raise RecipeError([Problem("include", at, f"included file {name!r} is not a "
                                                      "mapping")])
        merged = _merge(merged, base)
        merged_positions.update(base_positions)
    merged_positions.update(positions)
    # Shared by every file that includes this one: _merge and callers copy, never mutate.
    budget.loaded[real] = _merge(merged, tree), merged_positions
    return budget.loaded[real]


def apply_overrides(tree, positions, overrides):
    """Apply `--set key.path=value` overrides (values parsed as YAML) to a copy of `tree`."""
    tree = copy.deepcopy(tree) if isinstance(tree, dict) else {}
    problems = []
    for item in overrides or ():
        where = f"--set {item}"
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            problems.append(Problem("", where, "expected --set key.path=value, e.g. "
                                               "--set trainer.epochs=3"))
            continue
        path = tuple(part.strip() for part in key.split("."))
        if not all(path):
            problems.append(Problem(key, where, "empty part in the key path"))
            continue
        if len(path) > MAX_DEPTH:
            problems.append(Problem(key[:80] + "...", where[:80] + "...", (
                f"expected a key path of at most {MAX_DEPTH} parts. Received: {len(path)} parts")))
            continue
        try:
            value, _ = parse_yaml(text, where) if text.strip() else (None, {})
        except RecipeError as e:
            problems.append(Problem(key, where, f"cannot parse the value {text!r}: "
                                                f"{e.problems[0].message}"))
            continue
        node = tree
        for depth, part in enumerate(path[:-1]):
            if not isinstance(node.get(part), dict):
                if part in node and node[part] is not None and not isinstance(node[part], str):
                    problems.append(Problem(".".join(path[:depth + 1]), where,
                                            f"is not a mapping, so {key!r} cannot be set"))
                    break
                # A string (e.g. `strategy: mirrored`) becomes {name: ...} to take options.
                node[part] = {"name": node[part]} if isinstance(node.get(part), str) else {}
            node = node[part]
        else:
            node[path[-1]] = value
            positions[path] = where
    if problems:
        raise RecipeError(problems)
    return tree


def load(path, overrides=(), *, imports=True):
    """Load, include, override and validate a recipe: (Recipe, resolved tree).

    `imports=False` does not import the modules the recipe names (their code would run);
    see `config.validate`.
    """
    tree, positions = load_file(path)
    tree = apply_overrides(tree, positions, overrides)
    recipe = config_lib.validate(tree, positions, imports=imports)
    return recipe, config_lib.to_tree(recipe)


def dump(tree) -> str:
    return yaml.safe_dump(tree, sort_keys=False, default_flow_style=False)


# -- running ---------------------------------------------------------------------------------

def call_builder(section, batch_size):
    """Call a data builder with its args, plus `batch_size` if it takes one."""
    fn = config_lib.resolve(section.builder)
    kwargs = dict(section.args)
    try:
        accepts_batch = "batch_size" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        accepts_batch = False
    if batch_size is not None and accepts_batch and "batch_size" not in kwargs:
        kwargs["batch_size"] = batch_size
    return fn(**kwargs)


def _optimizer(spec):
    import keras

    if spec is None:
        return None
    options = dict(spec) if isinstance(spec, dict) else {"name": spec}
    name = options.pop("name")
    lr = options.pop("learning_rate", None)
    if isinstance(lr, dict):
        lr = dict(lr)
        schedule = config_lib.SCHEDULES[lr.pop("schedule")]
        lr = getattr(keras.optimizers.schedules, schedule)(**lr)
    if lr is not None:
        options["learning_rate"] = lr
    if ":" in name:
        cls = config_lib.resolve(name)
    elif name.lower() in config_lib.LAZY_OPTIMIZERS:
        from kerastrain import optimizers
        cls = optimizers.LAZY_OPTIMIZERS[name.lower()]
    else:
        cls = type(keras.optimizers.get(name.lower()))
    return cls(**options)


def _keras_object(spec, kind):
    import keras
    if spec is None or isinstance(spec, str):
        return spec
    options = dict(spec)
    name = options.pop("name")
    getter = keras.losses.get if kind == "loss" else keras.metrics.get
    return type(getter(name))(**options) if options else getter(name)


def task_role(recipe) -> str:
    """What this process does for the recipe, from TF_CONFIG: "train", "server" or "evaluator".

    Raises:
        ValueError: a malformed TF_CONFIG, or one that does not fit the recipe's strategy.
    """
    from kerastrain.distribute import cluster
    from kerastrain.distribute import strategies

    name, options = strategies.normalize(dict(recipe.strategy))
    cluster.use_slurm(name, options)
    config = cluster.read_tf_config()
    if config is None:
        return "train"
    if config.task_type == "evaluator":
        return "evaluator"
    if config.num_ps:
        if name not in ("ps", "auto"):
            raise ValueError(
                f"TF_CONFIG describes a parameter-server cluster ({config.num_ps} ps task(s)) but "
                f"the recipe's strategy is {name!r}. Use strategy 'ps' (or 'auto'), or remove the "
                "ps tasks from the cluster.")
        if "chief" not in config.cluster:
            raise ValueError(
                "A parameter-server cluster needs a `chief` task, the coordinator that runs the "
                f"training loop. Received: cluster jobs {sorted(config.cluster)}. Add "
                '"chief": ["host:port"] to TF_CONFIG (kerastrain launch --ps adds one).')
        return "train" if config.task_type == "chief" else "server"
    if name == "ps":
        raise ValueError(
            "The recipe's strategy is 'ps' but TF_CONFIG has no `ps` tasks. Received: cluster "
            f"jobs {sorted(config.cluster)}. Add ps tasks, or use 'multi_worker_mirrored'.")
    return "train"


def build_trainer(recipe):
    """A `Trainer` for the recipe (the Python API does all the work)."""
    from kerastrain.trainer import Trainer

    model_builder = config_lib.resolve(recipe.model.builder)
    model_args = dict(recipe.model.args)
    t = recipe.trainer
    compile_config = recipe.model.compile
    # Optimizer and metrics are made inside the strategy's scope by the Trainer:
    # making them here would start TensorFlow before the strategy is chosen.
    metrics = None if compile_config.metrics is None else (
        lambda: [_keras_object(m, "metric") for m in compile_config.metrics])
    optimizer = None if compile_config.optimizer is None else (
        lambda: _optimizer(compile_config.optimizer))
    return Trainer(
        lambda: model_builder(**model_args), strategy=dict(recipe.strategy),
        model_dir=t.model_dir, seed=t.seed, steps_per_loop=t.steps_per_loop,
        optimizer=optimizer,
        loss=_keras_object(compile_config.loss, "loss"), metrics=metrics, verbose=t.verbose,
        jit_compile=t.jit_compile, tensorboard=_with_hparams(recipe.tensorboard, recipe),
        checkpoint=recipe.checkpoints, shard=recipe.data.shard, data_service=recipe.data.service,
        mixed_precision=t.mixed_precision, tuning=recipe.tuning, on_nonfinite=t.on_nonfinite,
        max_recoveries=t.max_recoveries, spike_factor=t.spike_factor,
        stall_timeout=t.stall_timeout, writers=_mlflow_writers(recipe))


def hparams(recipe) -> dict:
    """The recipe's values flattened for TensorBoard's HParams table: `trainer.epochs: 3`,
    `strategy.name: mirrored`; a list as its JSON text; unset (null) values left out."""
    import dataclasses
    import json
    from collections.abc import Mapping

    from kerastrain._options import is_number
    flat = {}

    def walk(prefix, value):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        if isinstance(value, Mapping):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        elif isinstance(value, (str, bool)) or is_number(value):
            flat[prefix] = value
        elif value is not None:
            flat[prefix] = json.dumps(value, default=str)
    walk("", recipe)
    return flat


def _mlflow_writers(recipe):
    """An MLflow writer when the recipe asks for one (`mlflow:`), logging its values."""
    if not recipe.mlflow:
        return None
    from kerastrain.io.tracking import MLflowWriter
    options = recipe.mlflow if isinstance(recipe.mlflow, dict) else {}
    return [MLflowWriter(**options, params=hparams(recipe))]


def _with_hparams(tensorboard, recipe):
    """The recipe's `tensorboard:` options, with the recipe's values as its HParams unless it
    names its own (`tensorboard: {hparams: {...}}`) or switches TensorBoard off."""
    if tensorboard is False:
        return False
    options = dict(tensorboard) if isinstance(tensorboard, dict) else {}
    options.setdefault("hparams", hparams(recipe))
    return options


def run(recipe, resolved_text=None):
    """Train as the recipe says. Returns (trainer, history)."""
    started = time.perf_counter()
    trainer = build_trainer(recipe)
    if resolved_text is not None:
        trainer.write_text("recipe.yaml", resolved_text)
    data = recipe.data
    train = call_builder(data.train, data.batch_size)
    validation = None if data.validation is None else call_builder(
        data.validation, data.batch_size)
    numpy_batch = numpy_batch_size(train, data.batch_size)
    t = recipe.trainer
    history = trainer.fit(train, epochs=t.epochs, steps_per_epoch=t.steps_per_epoch,
                          validation_dataset_fn=validation, validation_steps=t.validation_steps,
                          batch_size=numpy_batch)
    summary = summary_line(history, trainer, time.perf_counter() - started)
    if trainer.is_chief:
        print(summary, flush=True)
    return trainer, history


def numpy_batch_size(data, batch_size):
    """`data.batch_size` is fit's batch size only for NumPy data; other forms batch themselves."""
    from kerastrain.data import inputs as data_lib
    return batch_size if data_lib.input_form(data) == "numpy" else None


def summary_line(history, trainer, seconds):
    if not history.epoch:
        return (f"kerastrain: nothing left to train: {trainer.model_dir} already holds step "
                f"{trainer.global_step}, as far as trainer.epochs goes; raise it (e.g. --set "
                "trainer.epochs=...) to go on, or choose another trainer.model_dir")
    last = {k: v[-1] for k, v in history.history.items() if v}
    from kerastrain.io import summaries
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in summaries.scalars(last).items())
    epochs = len(history.epoch)
    where = (f"outputs in {trainer.model_dir} (checkpoints/, logs/, export/, recipe.yaml)"
             if trainer.model_dir else "no model_dir: nothing written")
    return (f"kerastrain: done: {epochs} epoch{'s' if epochs != 1 else ''}, step "
            f"{trainer.global_step}, {seconds:.1f} s; {metrics or 'no metrics'}; {where}")
