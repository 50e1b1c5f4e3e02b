"""Dataclasses back from their JSON form: the inverse of `dataclasses.asdict` followed by JSON.

Files such as profile.json and result.json are written with `asdict` + `json.dumps`; reading one
back must rebuild the nested dataclasses (a Profile holds a DeviceInfo holding a DevicePeak, ...),
the tuples JSON turned into lists, and the Paths it turned into strings. The field types say what
to build, so one function serves every result type instead of a hand-written reader per class.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints


def from_plain(cls: Any, data: Any, names: dict[str, Any] | None = None) -> Any:
    """Rebuild a `cls` (a dataclass, or a type such as ``list[Foo]``) from `data`, its JSON form.

    `names` resolves annotations that the class's module imports only for type checking. Keys a
    dataclass does not declare are ignored (a file written by a newer version still loads);
    missing required keys raise TypeError. A nested class with its own ``from_dict`` (Candidate,
    which validates its settings) is built by it.
    """
    return _build(cls, data, names or {}, top=True)


def _build(tp: Any, data: Any, names: dict[str, Any], top: bool = False) -> Any:
    if tp is Any or data is None:
        return data
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [arg for arg in get_args(tp) if arg is not type(None)]
        errors = []
        for option in options:
            try:
                return _build(option, data, names)
            except (TypeError, ValueError, KeyError) as exc:
                errors.append(f"{exc}")
        raise TypeError(f"{data!r} fits none of {tp}: {'; '.join(errors)}")
    if origin is Literal or isinstance(tp, typing.TypeVar):
        return data
    args = get_args(tp)
    if origin in (list, collections.abc.Sequence, set, frozenset):
        items = [_build(args[0] if args else Any, item, names) for item in data]
        return items if origin in (list, collections.abc.Sequence) else origin(items)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], item, names) for item in data)
        if not args:
            return tuple(data)
        return tuple(_build(arg, item, names) for arg, item in zip(args, data, strict=True))
    if origin in (dict, collections.abc.Mapping):
        value_type = args[1] if len(args) == 2 else Any
        return {key: _build(value_type, value, names) for key, value in data.items()}
    from_dict = getattr(tp, "from_dict", None) if isinstance(tp, type) and not top and isinstance(data, dict) else None
    if callable(from_dict):
        return from_dict(data)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(data, dict):
            raise TypeError(f"{tp.__name__}: expected an object, found {type(data).__name__}")
        hints = get_type_hints(tp, localns=names)
        init = {f.name for f in dataclasses.fields(tp) if f.init}
        return tp(**{key: _build(hints[key], value, names) for key, value in data.items() if key in init})
    if tp is Path:
        return Path(data)
    if tp is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)
    if isinstance(tp, type) and not isinstance(data, tp):
        raise TypeError(f"expected {tp.__name__}, found {type(data).__name__} {data!r}")
    return data


def json_default(value: Any) -> Any:
    """`json.dumps`'s ``default=``: an object with ``to_dict`` (a Candidate, which is no dataclass
    and so survives `asdict` as an object) as that dict, a Path or anything else as its text."""
    to_dict = getattr(value, "to_dict", None)
    return to_dict() if callable(to_dict) else str(value)
