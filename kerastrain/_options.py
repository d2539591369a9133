"""Accepting option groups as True/False/None, a dict of fields, or the dataclass itself."""

from __future__ import annotations

import dataclasses
from typing import Mapping


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
