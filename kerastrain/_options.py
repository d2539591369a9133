"""Options: one dataclass field declares an option's default, check and doc.

The recipe schema and its commented template (`kerastrain.cli.config`) are generated
from these fields, and `Trainer` and `fit` check their arguments by the same fields
(`check_arguments`), so an option's default and allowed values are written in one place;
a recipe error and a Python error word the same check in YAML's and Python's words.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping


def option(default=None, doc: str = "", *, check=None, example=None, section=None):
    """A dataclass field with its recipe doc and, for recipe keys, a check.

    Args:
        default: the option's default (its one and only statement).
        doc: one line for the template's comment and error messages.
        check: `value -> value`, raising `Bad(expected)` (from the check builders below:
            `ints`, `choice`, `number`...; recipe sections whose dataclass does not check
            itself in `__post_init__`).
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
    if not _listed(value, choices):
        raise ValueError(f"`{name}` must be {_or_list([repr(c) for c in choices])}. "
                         f"Received: {name}={value!r}")


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


# -- checks shared by recipe keys and Python arguments -----------------------------------------
# Each builder returns `check(value) -> value`, raising `Bad` with what was expected, in a
# recipe's words (null, true) and in Python's (None, True).

class Bad(Exception):
    """A value a check refuses: `expected` in YAML's words, `python` in Python's."""

    def __init__(self, expected: str, python: str | None = None):
        super().__init__(expected)
        self.expected = expected
        self.python = python if python is not None else _python_words(expected)


def _python_words(text: str) -> str:
    import re
    words = {"null": "None", "true": "True", "false": "False"}
    return re.sub(r"\b(null|true|false)\b", lambda m: words[m.group(1)], text)


def _listed(value, choices) -> bool:
    """`value` is one of `choices`; a bool only where one is listed (Python counts True as 1)."""
    return any(value == c and isinstance(value, bool) == isinstance(c, bool)
               for c in choices if c is not None) or (value is None and None in choices)


def _or_list(names) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def ints(minimum=None, optional=False):
    """An int (never a bool) >= `minimum`; with `optional`, also null."""
    def check(value):
        if (value is None and optional) or is_int(value, minimum):
            return value
        raise Bad(f"an int{'' if minimum is None else f' >= {minimum}'}"
                  f"{' or null' if optional else ''}")
    return check


def choice(*choices, extra=None, recipe=None):
    """One of `choices`, or what the check `extra` accepts. `recipe` words the choices for
    a recipe's error where YAML spells them otherwise."""
    def check(value):
        if _listed(value, choices):
            return value
        if extra is not None:
            try:
                return extra(value)
            except Bad:
                pass
        more = " or an int >= 1" if extra else ""
        listed = ", ".join("null" if c is None else repr(c) for c in choices)
        raise Bad(recipe or f"one of {listed}{more}",
                  _or_list([repr(c) for c in choices]) + more)
    return check


def strings(optional=False):
    """A non-empty string; with `optional`, also null."""
    def check(value):
        if (value is None and optional) or (isinstance(value, str) and value):
            return value
        raise Bad("a non-empty string" + (" or null" if optional else ""))
    return check


def numbers(above=None, optional=False):
    """A finite number (never a bool) over `above`; with `optional`, also null."""
    def check(value):
        if (value is None and optional) or is_number(value, above=above):
            return value
        raise Bad("a number" + ("" if above is None else f" > {above:g}")
                  + (" or null" if optional else ""))
    return check


def _jit_compile(value):
    return choice(None, "auto", True, False, recipe="true, false, auto or null")(value)


def _stall_timeout(value):
    if value is None or value == "auto" or is_number(value, above=0):
        return value
    raise Bad("'auto', a number of seconds > 0, or null (never)")


def _model_dir(value):
    value = strings(optional=True)(value)
    if value is not None:
        from kerastrain import _schemes  # pure Python: TensorFlow is not asked here
        advice = _schemes.scheme_advice(value, ask_tensorflow=False)
        if advice:
            raise Bad("a local path or a URL whose file system TensorFlow implements "
                      f"('{_schemes.scheme(value)}://': {advice})")
    return value


def check_arguments(cls, **values):
    """Check Python arguments by the checks of `cls`'s fields of the same names.

    Raises:
        ValueError: "`name` must be <what the field accepts>. Received: name=value".
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name, value in values.items():
        try:
            fields[name].metadata["check"](value)
        except Bad as e:
            raise ValueError(f"`{name}` must be {e.python}. Received: {name}={value!r}") from None


# -- the training loop's options: `Trainer`'s and `fit`'s arguments, a recipe's `trainer:` -----

@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """The training loop's options: `Trainer(...)`'s and `fit(...)`'s, a recipe's `trainer:`.

    Each field states its default, its check and a recipe's one-line doc; `Trainer` keeps
    one (checked when made). In full:

    Attributes:
        epochs, steps_per_epoch, validation_steps: as in `model.fit` (`fit`'s arguments).
        steps_per_loop: steps run by one compiled call, or `"auto"` (measured on the first
            loops under synchronous strategies).
        seed: seeds Python, NumPy, TensorFlow and Keras before the model is built.
        model_dir: where the run's outputs go (None: nowhere); a URL as given, a local path
            made absolute.
        verbose: 0, 1, 2 or `"auto"` as in `model.fit` (non-chief tasks: 0).
        jit_compile: compile each step with XLA. None follows the model's compile setting,
            which Keras resolves to False on CPU-only machines; `"auto"`: measured on the
            first training loops, XLA kept if its step is at least 10% faster, off under
            strategies that place variables and with gradient accumulation
            (`kerastrain.loop.tuning.JitTrial`); True is allowed with the `default` and
            `one_device` strategies only.
        mixed_precision: None, `"mixed_float16"` (with dynamic loss scaling) or
            `"mixed_bfloat16"`: the Keras dtype policy the model is built under
            (`kerastrain.step.precision`); needs a model function.
        on_nonfinite: what a NaN or infinite loss does: `"stop"` ends training (the
            default), `"recover"` restores the last good state (the newest checkpoint, else
            the epoch start kept in memory), skips the batch that caused it and goes on
            (`kerastrain.loop.recovery`, docs/reliability.md).
        max_recoveries: with `"recover"`, recoveries allowed in one `fit`; the next bad
            loss raises `kerastrain.loop.recovery.TooManyRecoveries`.
        spike_factor: with `"recover"`, also recover from a loop whose mean loss is over
            this many times the running median of the loops before (None: off).
        stall_timeout: a task whose training makes no progress for this long (a frozen or
            partitioned peer, a lost ps, a deadlock) writes who stalled and its Python
            stacks, and exits with 75 (`kerastrain.loop.stalls`): seconds, `"auto"` (under
            multi-worker mirrored and parameter servers, where a peer can stall this task:
            the larger of 5 minutes and 20 x the slowest loop, 10 minutes before the
            first), or None (never).
    """

    epochs: int = option(1, "epochs to train", check=ints(0))
    steps_per_epoch: int | None = option(None, "null: to the end of the data",
                                         check=ints(1, optional=True))
    validation_steps: int | None = option(None, "null: all the validation data",
                                          check=ints(1, optional=True))
    steps_per_loop: int | str = option("auto", "steps per compiled call",
                                       check=choice("auto", extra=ints(1)))
    seed: int | None = option(None, "seeds Python, NumPy, TensorFlow and Keras",
                              check=ints(0, optional=True))
    model_dir: str | None = option(None, "checkpoints, logs, export and the resolved recipe go "
                                         "here; reruns resume (a path, or a URL such as gs://)",
                                   check=_model_dir)
    verbose: int | str = option("auto", "0 silent, 1 progress bar, 2 one line per epoch",
                                check=choice(0, 1, 2, "auto"))
    jit_compile: bool | str | None = option(
        None, "XLA for each step; null follows the model's compile setting; auto: measured on "
              "the first loops, kept if at least 10% faster (one replica only)",
        check=_jit_compile)
    mixed_precision: str | None = option(
        None, "null, mixed_float16 (with loss scaling) or mixed_bfloat16",
        check=choice(None, "mixed_float16", "mixed_bfloat16"))
    on_nonfinite: str = option(
        "stop", "a NaN/inf loss: stop, or recover (restore the last good checkpoint or epoch "
                "start, skip the bad batch, go on)", check=choice("stop", "recover"))
    max_recoveries: int = option(3, "with recover: recoveries per run before it gives up",
                                 check=ints(1))
    spike_factor: float | None = option(
        None, "with recover: also a loop loss over k x the running median (null: off)",
        check=numbers(above=1, optional=True))
    stall_timeout: float | str | None = option(
        "auto", "a task with no training progress for this long writes who stalled and its "
                "stacks, and exits 75 (auto: multi-worker and ps only, max(5 min, 20 x the slowest "
                "loop); null: never)",
        check=_stall_timeout)

    def __post_init__(self):
        """Made in Python (the Trainer keeps one), each value is checked by its field."""
        check_arguments(type(self), **{f.name: getattr(self, f.name)
                                       for f in dataclasses.fields(self)})
        if self.spike_factor is not None and self.on_nonfinite != "recover":
            raise ValueError("`spike_factor` acts only with on_nonfinite='recover': set it, or "
                             f"remove spike_factor. Received: spike_factor={self.spike_factor!r}"
                             f", on_nonfinite={self.on_nonfinite!r}")
