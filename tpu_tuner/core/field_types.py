"""Whether values typed by a user (a ``decoder:`` shape's ``key=value``, a TOML table, the Python
API's options) have the types a dataclass declares for them, before any arithmetic meets them:
``d_model=abc`` is a one-line refusal, not a ``TypeError`` from a comparison deep in a check."""

from __future__ import annotations

import dataclasses
import math
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from tpu_tuner.core.errors import UserInputError


def wrong_type(cls: type, values: dict[str, Any], localns: dict[str, Any] | None = None) -> str | None:
    """What is wrong with the first of `values` (field name -> value) whose value is not of its
    field's declared type in dataclass `cls` ("d_model must be an integer, not 'abc'"); None
    when all are. Names `cls` does not declare are left to the caller."""
    names = dict(localns or {})
    while True:  # a name imported only for type checking (ProfilerSettings, to spare torch) reads as Any
        try:
            hints = get_type_hints(cls, localns=names)
            break
        except NameError as exc:
            if exc.name is None or exc.name in names:
                raise
            names[exc.name] = Any
    for name, value in values.items():
        if name in hints and not _matches(hints[name], value):
            return f"{name} must be {_describe(hints[name])}, not {value!r}"
    return None


def check_field_types(options: Any, localns: dict[str, Any] | None = None) -> None:
    """A one-line `UserInputError` naming the first field of the dataclass instance `options`
    (its dataclass fields' fields too: a `TuneOptions`' sections) whose value is not of its
    declared type: what the Python API's entry points check before any arithmetic meets them."""
    values = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    wrong = wrong_type(type(options), values, localns)
    if wrong:
        raise UserInputError(f"{type(options).__name__}: {wrong}")
    for value in values.values():
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_field_types(value, localns)


def _matches(hint: Any, value: Any) -> bool:
    origin = get_origin(hint)
    if hint is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(_matches(arm, value) for arm in get_args(hint))
    if origin is Literal:
        return value in get_args(hint)
    if origin in (tuple, list):
        arms = get_args(hint)
        # tuple[X, ...] and list[X]: every item an X (`list[Layout]` had passed anything: `layouts=True`).
        item = arms[0] if (origin is list and arms) or (len(arms) == 2 and arms[1] is Ellipsis) else Any
        return isinstance(value, (tuple, list)) and all(_matches(item, v) for v in value)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is Path:
        return isinstance(value, (str, Path))
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a form not checked here (a callable, a mapping): the field's own code reads it


def _describe(hint: Any) -> str:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(arm) for arm in get_args(hint))
    if origin is Literal:
        return "one of " + ", ".join(map(repr, get_args(hint)))
    if origin in (tuple, list):
        return f"a list, each item {_describe(get_args(hint)[0])}" if get_args(hint) else "a list"
    names = {type(None): "none", bool: "true or false", int: "an integer", float: "a finite number", str: "text"}
    return names.get(hint, "a path" if hint is Path else getattr(hint, "__name__", str(hint)))


__all__ = ["check_field_types", "wrong_type"]
