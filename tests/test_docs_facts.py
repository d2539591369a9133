"""The docs' numbers and lists that come from the code agree with the code.

A count written in prose ("a gallery of 20 models"), the recipe schema table, the fields a
section row lists and the table of shipped recipes each drift silently when the code moves on;
each is read here from the docs and compared with what the code holds.
"""

import dataclasses
import re
from pathlib import Path

import gallery
import helpers
from kerastrain.cli import config

REPO = Path(helpers.REPO)
PROSE = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _schema_table():
    """docs/recipes.md's schema table: key -> the row's text."""
    text = (REPO / "docs" / "recipes.md").read_text()
    table = text.split("| key | type (default) | meaning |", 1)[1].split("\n\n", 1)[0]
    return dict(re.findall(r"^\| `([\w.]+)` \|(.*)$", table, flags=re.M))


def _schema_keys(section, prefix=""):
    """Every key path of the schema and of its sections."""
    for name, key in section.items():
        path = f"{prefix}{name}"
        yield path
        if key.section is not None:
            yield from _schema_keys(key.section, path + ".")


def test_every_count_of_the_gallery_is_its_size():
    counts = []
    for path in PROSE:
        for found in re.finditer(r"(\d+) (?:small )?(?:keras\.io-style )?models(?: in the style "
                                 r"of keras\.io)?", path.read_text()):
            if "keras.io" in found.group(0):
                counts.append((path.name, int(found.group(1))))
    assert {name for name, _ in counts} >= {"README.md", "getting_started.md",
                                           "keras_compatibility.md"}
    assert all(count == len(gallery.EXAMPLES) for _, count in counts), (
        f"the gallery holds {len(gallery.EXAMPLES)} models; the docs say {counts}")


def test_the_schema_table_lists_every_recipe_key_and_no_other():
    rows = set(_schema_table())
    keys = set(_schema_keys(config.schema()))
    sections = {path for path in keys if any(k.startswith(path + ".") for k in keys)}
    leaves = keys - sections
    # A row for a key, or for the section holding it (`data.train`: `{builder, args}`).
    missing = {leaf for leaf in leaves
               if not any(leaf == row or leaf.startswith(row + ".") for row in rows)}
    assert not missing, f"docs/recipes.md's schema table leaves out {sorted(missing)}"
    assert rows - keys == {"include"}, f"rows for keys the schema lacks: {rows - keys}"


def test_each_options_row_lists_exactly_its_options_fields():
    rows = _schema_table()
    for section, cls in config._option_classes().items():
        listed = set(re.findall(r"`(\w+)`", rows[section].split("|")[-2]))
        fields = {f.name for f in dataclasses.fields(cls)}
        assert fields <= listed, f"{section}: the row does not name {sorted(fields - listed)}"


def test_the_recipes_table_lists_every_shipped_recipe():
    text = (REPO / "docs" / "recipes.md").read_text()
    table = text.split("| recipe | what it shows |", 1)[1].split("\n\n", 1)[0]
    listed = set(re.findall(r"^\| `([\w.]+\.yaml)` \|", table, flags=re.M))
    shipped = {path.name for path in (REPO / "recipes").glob("*.yaml")}
    assert listed == shipped


def _defined(path):
    """Top-level names of a module and `Class.method` names of its classes."""
    import ast
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(f"{node.name}.{n.name}" for n in node.body
                         if isinstance(n, ast.FunctionDef))
    return names


def test_the_walk_of_one_epoch_names_six_files_and_what_each_holds():
    """docs/architecture.md's walk of one epoch: six files, and each name it gives for a file
    (`Controller.fit`, `SyncDriver.run_epoch`...) or a module (`fit_args.of_fit_call`) is
    defined there: a rename or a move that leaves the walk behind fails here."""
    text = (REPO / "docs" / "architecture.md").read_text()
    walk = text.split("Following one epoch of a synchronous `fit` opens six files", 1)[1]
    walk = walk.split("A reader who wants more", 1)[0]
    items = re.findall(r"^\d\. `([\w/]+\.py)`: (.*?)(?=^\d\. |\Z)", walk, flags=re.M | re.S)
    assert len(items) == 6, items
    package = REPO / "kerastrain"
    modules = {p.stem: p for p in package.rglob("*.py")}
    assert all((package / path).exists() for path, _ in items), items
    walked = set().union(*(_defined(package / path) for path, _ in items))
    for path, words in items:
        here = _defined(package / path)
        for name in re.findall(r"`([A-Za-z_][\w.]*)`", words):
            head, _, rest = name.partition(".")
            if head in modules and rest:
                assert rest in _defined(modules[head]), (path, name)
            elif head[0].isupper():  # the file's, or (a class named in passing) the walk's
                assert name in here or (not rest and name in walked), (path, name)
