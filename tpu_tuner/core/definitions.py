"""Load declarative definitions (TOML) from agents/ and search_spaces/ by name or path.

A name such as ``profiler`` is looked up among the built-in definitions, which pyproject.toml
ships inside the package as ``tpu_tuner.builtin.agents`` / ``tpu_tuner.builtin.search_spaces``;
a path (anything ending in .toml or containing a slash) is read as it is.

Definitions are strict (docs in agents/README.md): each kind declares its schema as frozen
dataclasses, one per table, next to the code that reads it, and `load_schema` builds one from the
parsed TOML, refusing unknown tables and keys, missing required ones and values of the wrong type
with a one-line `DefinitionError` naming the file and the key path, e.g.
``agents/precision.toml: unknown key [validate].skip_hihg_on_cpu (known: skip_high_on_cpu, ...)``.
A typo is then an error when the file is loaded, never a setting silently left at its default.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import tomllib
import types
import typing
from collections.abc import Mapping
from contextlib import suppress
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

from tpu_tuner.core.errors import DefinitionError

DefinitionKind = Literal["agents", "search_spaces"]
Schema = TypeVar("Schema")
KeyPath = tuple[str | int, ...]


@dataclasses.dataclass(frozen=True)
class AgentHeader:
    """Every agent definition's [agent] table: which agent the file configures, in words."""

    name: str
    description: str


@dataclasses.dataclass(frozen=True)
class SpaceHeader:
    """A search space's optional [space] table."""

    name: str = ""
    description: str = ""


@dataclasses.dataclass(frozen=True)
class SpaceFile:
    """A search space file's top level. Each [[param]] entry is checked by
    `tpu_tuner.tuning.search.search_space`, which knows the knobs; this catches a typo in the tables."""

    param: tuple[dict[str, Any], ...] = ()
    space: SpaceHeader = SpaceHeader()


def builtin_folder(kind: DefinitionKind) -> Traversable:
    """The folder of built-in definitions: installed package data, else the source checkout.

    Run from a checkout (the repository root on sys.path), ``tpu_tuner`` is imported from the
    source folder, where the mapped ``tpu_tuner.builtin.*`` packages do not exist; the
    top-level folders beside the package are then the built-ins.
    """
    try:
        return importlib.resources.files(f"tpu_tuner.builtin.{kind}")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent.parent / kind


def builtin_names(kind: DefinitionKind) -> list[str]:
    """Names of the built-in definitions of `kind`."""
    folder = builtin_folder(kind)
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_definition(kind: DefinitionKind, name_or_path: str | Path) -> dict[str, Any]:
    """The parsed TOML of a built-in definition or a file; `DefinitionError` when it is bad.

    A search space's top level (its tables, the keys of [space]) is checked here; agent
    definitions are checked against their schema by `load_agent_definition`."""
    data, where = read_definition(kind, name_or_path)
    if kind == "search_spaces":
        load_schema(SpaceFile, data, where)
    return data


def read_definition(kind: DefinitionKind, name_or_path: str | Path) -> tuple[dict[str, Any], str]:
    """The parsed TOML, unchecked, and the name errors give the file (the path as given, or
    ``agents/NAME.toml`` for a built-in)."""
    text_name = str(name_or_path)
    if text_name.endswith(".toml") or "/" in text_name:
        path = Path(text_name)
        if not path.is_file():
            raise DefinitionError("file not found", path)
        try:
            text = path.read_text()
        except UnicodeDecodeError as exc:
            raise DefinitionError(f"not UTF-8 text: {exc}", path) from exc
        return _parse(text, path), text_name
    resource = builtin_folder(kind) / f"{text_name}.toml"
    if not resource.is_file():
        known = ", ".join(builtin_names(kind))
        raise DefinitionError(f"no built-in {kind.replace('_', ' ')} definition {text_name!r}; known: {known}")
    where = f"{kind}/{text_name}.toml"
    return _parse(resource.read_text(), where), where


def load_agent_definition(
    schema: type[Schema], agent: str, name_or_path: str | Path | None = None, *, overrides: bool = False
) -> Schema:
    """Agent `agent`'s definition as `schema`: the built-in ``agents/<agent>.toml``, or a file.

    A file is a whole definition, unless `overrides` is set: then it gives only the keys it
    changes and the built-in definition the rest (the profiler's ``--agent`` file). Either way
    every key it names must be one the schema knows, of the schema's type, and its [agent].name,
    when given, must be `agent`."""
    source = agent if name_or_path is None else name_or_path
    data, where = read_definition("agents", source)
    if overrides and str(source) != agent:  # a file, even one named agents/<agent>.toml, or another name
        base, base_where = read_definition("agents", agent)
        load_schema(schema, base, base_where)  # a broken built-in is named as such
        data = _merged(base, data)
    _check_agent_name(data, agent, where)
    return load_schema(schema, data, where)


def load_schema(schema: type[Schema], data: Mapping[str, Any], where: str | Path) -> Schema:
    """`schema`, a dataclass whose fields are the tables and keys, built from parsed TOML.

    A field whose type is a dataclass is a table; a field without a default is required.
    Supported key types: bool, int, float (an integer is accepted), str, ``tuple[T, ...]``
    (a TOML array), ``dict[str, T]`` (a table of free keys), unions of these and `Any`.
    Unknown tables and keys, missing required ones and wrong types raise `DefinitionError`."""
    return _build(schema, data, str(where), ())


def _parse(text: str, where: str | Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DefinitionError(f"invalid TOML: {exc}", where) from exc


def _check_agent_name(data: Mapping[str, Any], agent: str, where: str) -> None:
    """Refuse another agent's definition by its name, before its tables are reported unknown."""
    header = data.get("agent")
    name = header.get("name") if isinstance(header, dict) else None
    if isinstance(name, str) and name != agent:
        raise DefinitionError(
            f"[agent].name is {name!r}: this file defines the {name} agent, not the {agent} agent", where
        )


def _merged(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `override`'s keys replacing its own, table by table."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def _build(schema: type[Schema], data: Mapping[str, Any], where: str, path: KeyPath) -> Schema:
    if not dataclasses.is_dataclass(schema):
        raise TypeError(f"a definition schema must be a dataclass, not {schema!r}")
    fields = {field.name: field for field in dataclasses.fields(schema)}
    types_ = typing.get_type_hints(schema)
    for key in data:
        if key not in fields:
            what = "table" if not path and isinstance(data[key], dict) else "key"
            raise DefinitionError(
                f"unknown {what} {_key_path((*path, key), table=what == 'table')} (known: {', '.join(fields)})", where
            )
    values = {}
    for name, field in fields.items():
        is_table = dataclasses.is_dataclass(types_[name]) or typing.get_origin(types_[name]) is dict
        if name not in data:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise DefinitionError(
                    f"missing {'table' if is_table else 'key'} {_key_path((*path, name), table=is_table)}", where
                )
            continue
        values[name] = _convert(types_[name], data[name], where, (*path, name))
    return schema(**values)


def _convert(kind: Any, value: Any, where: str, path: KeyPath) -> Any:
    """`value` checked against the type `kind` (TOML arrays become tuples)."""
    origin = typing.get_origin(kind)
    if kind is Any:
        return value
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        if isinstance(value, dict):
            return _build(kind, value, where, path)
    elif origin in (Union, types.UnionType):
        for option in typing.get_args(kind):
            with suppress(DefinitionError):
                return _convert(option, value, where, path)
    elif origin is tuple:
        item = typing.get_args(kind)[0]
        if isinstance(value, list):
            return tuple(_convert(item, entry, where, (*path, index)) for index, entry in enumerate(value))
    elif origin is dict:
        item = typing.get_args(kind)[1]
        if isinstance(value, dict):
            return {key: _convert(item, entry, where, (*path, key)) for key, entry in value.items()}
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind in (bool, int, str):
        # bool is an int in Python; TOML keeps them apart, and so does a definition.
        if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
            return value
    else:
        raise TypeError(f"unsupported type {kind!r} in a definition schema")
    shown = _key_path(path, table=dataclasses.is_dataclass(kind))
    raise DefinitionError(f"{shown} must be {_describe(kind)}, not {value!r}", where)


def _describe(kind: Any) -> str:
    if dataclasses.is_dataclass(kind) or typing.get_origin(kind) is dict:
        return "a table"
    if typing.get_origin(kind) in (Union, types.UnionType):
        return " or ".join(_describe(option) for option in typing.get_args(kind))
    if typing.get_origin(kind) is tuple:
        return f"an array ({_describe(typing.get_args(kind)[0])} each)"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(kind, str(kind))


def _key_path(path: KeyPath, *, table: bool = False) -> str:
    """How TOML users name a key: ``[validate].skip_high_on_cpu``, ``[seeds].cpu[0]``; a top-level
    table is ``[table]``, a top-level key its bare name."""
    head, rest = path[0], path[1:]
    if not rest:
        return f"[{head}]" if table else str(head)
    return f"[{head}]" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in rest)
