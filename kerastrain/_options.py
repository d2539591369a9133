"""Option dataclasses: one field declares an option's default, check and doc; coercion.

The recipe schema and its commented template (`kerastrain.cli.config`) are generated
from these fields, so an option's default is written in exactly one place.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping


def option(default=None, doc: str = "", *, check=None, example=None, section=None):
    """A dataclass field with its recipe doc and, for recipe keys, a check.

    Args:
        default: the option's default (its one and only statement).
        doc: one line for the template's comment and error messages.
        check: `value -> value`, raising `config._Bad(expected)` (recipe sections whose
            dataclass does not check itself in `__post_init__`).
        example: a value the template shows for a required option (no default).
        section: the option dataclass of a nested recipe section.
    """
    metadata = {"doc": doc, "check": check, "example": example, "section": section}
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default),
                                 metadata=metadata)
    if default is REQUIRED:
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


REQUIRED = object()  # `option(REQUIRED, ...)`: no default, the recipe must give it


def default_of(field):
    """A dataclass field's default (REQUIRED when it has none)."""
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return REQUIRED


def is_int(value, minimum=None) -> bool:
    """An integer (Python's or NumPy's, never a bool) of at least `minimum`.

    The one test behind every integer option; each caller words its own error, which
    says what the number means.
    """
    import numbers
    return (isinstance(value, numbers.Integral) and not isinstance(value, bool)
            and (minimum is None or value >= minimum))


def is_number(value, *, above=None, minimum=None) -> bool:
    """A finite real number (never a bool), over `above` and at least `minimum`."""
    import math
    import numbers
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value) and (above is None or value > above)
            and (minimum is None or value >= minimum))


def check_choice(name: str, value, choices):
    """Raise a ValueError naming `name` and the value unless it is one of `choices`.

    A bool is a choice only where one is listed (Python counts True as 1, so `verbose=True`
    would otherwise pass for 1).
    """
    listed = any(value == c and isinstance(value, bool) == isinstance(c, bool)
                 for c in choices if c is not None) or (value is None and None in choices)
    if not listed:
        names = [repr(c) for c in choices]
        wanted = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
        raise ValueError(f"`{name}` must be {wanted}. Received: {name}={value!r}")


def check_int(name: str, value, *, minimum=None, optional=False, also=None):
    """Raise a ValueError naming `name` and the value unless it is an int >= `minimum`.

    `optional` also accepts None; `also` names another accepted value for the message
    (the caller has already let it through).
    """
    if optional and value is None:
        return
    if not is_int(value, minimum):
        wanted = "an int" + ("" if minimum is None else f" >= {minimum}")
        alternatives = [a for a in (also, "None" if optional else None) if a]
        if alternatives:
            wanted += " or " + " or ".join(alternatives)
        raise ValueError(f"`{name}` must be {wanted}. Received: {name}={value!r}")


def coerce(cls, value, argument: str):
    """Return an instance of the frozen dataclass `cls`, or None when switched off.

    Raises:
        ValueError: unknown fields (or a field's own check fails).
        TypeError: a value of another kind.
    """
    if value is True:
        return cls()
    if value is False or value is None:
        return None
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - fields)
        if unknown:
            raise ValueError(f"Unknown {argument} option(s) {unknown}. Valid: {sorted(fields)}. "
                             f"Received: {argument}={dict(value)!r}")
        return cls(**value)
    raise TypeError(f"`{argument}` must be True, False, a dict of options or {cls.__name__}. "
                    f"Received: {argument}={value!r}")
