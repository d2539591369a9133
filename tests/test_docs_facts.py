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
