"""YAML recipes: a strict loader that remembers lines, includes and `--set` overrides.

Loading is YAML with a safe loader and YAML 1.2 scalars: only `true`/`false`
are booleans (so `shard: off` stays the string "off"), `1e-3` is a float, and a
key given twice is an error rather than silently the last one.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import stat
import sys

import yaml

from kerastrain.cli import config as config_lib
from kerastrain.cli.config import Problem, RecipeError
# Running a recipe lives in `training.py`; `kt.recipes.run` and its helpers stay reachable here.
from kerastrain.cli.training import (build_trainer, call_builder, hparams,  # noqa: F401
                                     numpy_batch_size, run, summary_line, task_role)

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


def read(path, overrides=()):
    """(tree, positions) of a recipe with its includes and `--set` overrides applied,
    unvalidated: nothing of the user's is imported."""
    tree, positions = load_file(path)
    return apply_overrides(tree, positions, overrides), positions


def import_from(path):
    """Make the modules a recipe names importable as the docs say (docs/recipes.md, "Where
    builders are imported from"): from the working directory first, as `python -m` does, then
    from the folder of the recipe file `path`, then from the installed packages.

    Each folder not already on `sys.path` goes in front of the installed packages, and stays
    (a builder may import its neighbours when it is called, as under `python -m`). For the
    command line: a Python program keeps its own `sys.path`.
    """
    at = 0
    for folder in (os.getcwd(), os.path.dirname(os.path.abspath(path))):
        present = [i for i, entry in enumerate(sys.path)
                   if os.path.abspath(entry or os.curdir) == folder]
        if present:
            at = present[0] + 1
        else:
            sys.path.insert(at, folder)
            at += 1


def check(tree, positions, *, imports=True):
    """Validate a tree that `read` returned: (Recipe, resolved tree). With `imports`, the
    modules it names are imported to check them (from `sys.path`: the command line puts the
    recipe's folders on it first, `import_from`); see `config.validate`."""
    recipe = config_lib.validate(tree, positions, imports=imports)
    return recipe, config_lib.to_tree(recipe)


def load(path, overrides=(), *, imports=True):
    """Load, include, override and validate a recipe: (Recipe, resolved tree).

    `imports=False` does not import the modules the recipe names (their code would run);
    see `config.validate`.
    """
    tree, positions = read(path, overrides)
    return check(tree, positions, imports=imports)


def dump(tree) -> str:
    return yaml.safe_dump(tree, sort_keys=False, default_flow_style=False)
