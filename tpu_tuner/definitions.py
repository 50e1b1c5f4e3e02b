"""Load declarative definitions (TOML) from agents/ and search_spaces/ by name or path.

A name such as ``profiler`` is looked up among the built-in definitions, which pyproject.toml
ships inside the package as ``tpu_tuner.builtin.agents`` / ``tpu_tuner.builtin.search_spaces``;
a path (anything ending in .toml or containing a slash) is read as it is.
"""

from __future__ import annotations

import importlib.resources
import tomllib
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal

from tpu_tuner.errors import DefinitionError

DefinitionKind = Literal["agents", "search_spaces"]


def builtin_folder(kind: DefinitionKind) -> Traversable:
    """The folder of built-in definitions: installed package data, else the source checkout.

    Run from a checkout (the repository root on sys.path), ``tpu_tuner`` is imported from the
    source folder, where the mapped ``tpu_tuner.builtin.*`` packages do not exist; the
    top-level folders beside the package are then the built-ins.
    """
    try:
        return importlib.resources.files(f"tpu_tuner.builtin.{kind}")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / kind


def builtin_names(kind: DefinitionKind) -> list[str]:
    """Names of the built-in definitions of `kind`."""
    folder = builtin_folder(kind)
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_definition(kind: DefinitionKind, name_or_path: str | Path) -> dict[str, Any]:
    """The parsed TOML of a built-in definition or a file; `DefinitionError` when it is bad."""
    text_name = str(name_or_path)
    if text_name.endswith(".toml") or "/" in text_name:
        path = Path(text_name)
        if not path.is_file():
            raise DefinitionError("file not found", path)
        return _parse(path.read_text(), path)
    resource = builtin_folder(kind) / f"{text_name}.toml"
    if not resource.is_file():
        known = ", ".join(builtin_names(kind))
        raise DefinitionError(f"no built-in {kind.replace('_', ' ')} definition {text_name!r}; known: {known}")
    return _parse(resource.read_text(), f"{kind}/{text_name}.toml")


def _parse(text: str, where: str | Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DefinitionError(f"invalid TOML: {exc}", where) from exc


def take_section(data: dict[str, Any], section: str, defaults: dict[str, Any], where: str) -> dict[str, Any]:
    """`defaults` updated from ``data[section]``; unknown keys and wrong types are errors."""
    values = dict(defaults)
    for key, value in data.get(section, {}).items():
        if key not in defaults:
            raise DefinitionError(f"unknown setting [{section}].{key}; known: {', '.join(defaults)}", where)
        expected = type(defaults[key])
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or isinstance(value, bool) != isinstance(defaults[key], bool):
            raise DefinitionError(f"[{section}].{key} must be {expected.__name__}, got {value!r}", where)
        values[key] = value
    return values
