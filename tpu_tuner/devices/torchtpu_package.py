"""torch-tpu's installed package read without importing it (importing it imports torch): its
version and folder, its public API table, the process-group backends its sources register, names in
its shared libraries, and the string constants of a function's source. devices/torchtpu_api.py
checks the adapter's names with these."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import mmap
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGE = "torch_tpu"
DISTRIBUTION = "torch-tpu"


def installed_version() -> str | None:
    """torch-tpu's installed version, read from its metadata (no import)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def package_folder() -> Path | None:
    """Where torch_tpu is installed, found without importing it (importing it imports torch)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def public_table(folder: Path) -> dict[str, set[str]]:
    """The public API table's names by public module, parsed from
    ``_internal/public_api.py`` (its ``_PUBLIC_MODULES = {module: ModuleSpec(exports={...})}``)."""
    path = folder / "_internal" / "public_api.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "_PUBLIC_MODULES"
            and isinstance(node.value, ast.Dict)
        ):
            table: dict[str, set[str]] = {}
            for key, value in zip(node.value.keys, node.value.values):
                if not (isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Call)):
                    continue
                exports = next((k.value for k in value.keywords if k.arg == "exports"), None)
                if isinstance(exports, ast.Dict):
                    table[key.value] = {
                        k.value for k in exports.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
                    }
            return table
    raise ValueError(f"{path}: no _PUBLIC_MODULES table (the layout of torch-tpu's public API table changed)")


def registered_process_group_backends(folder: Path) -> set[str]:
    """Names passed as the first argument of ``register_backend(...)`` in the package's sources."""
    names: set[str] = set()
    for path in folder.rglob("*.py"):
        if "register_backend" not in (text := path.read_text(errors="replace")):
            continue
        try:
            tree = ast.parse(text, filename=str(path))
        except SyntaxError:  # a file this Python cannot parse holds no registration we can read
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "register_backend"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names.add(str(node.args[0].value))
    return names


def strings_in_libraries(folder: Path, wanted: tuple[str, ...]) -> set[str]:
    """Which of `wanted` occur as bytes in the package's shared libraries (C++-only names)."""
    found: set[str] = set()
    for path in folder.rglob("*.so*"):
        if len(found) == len(wanted):
            break
        if not path.is_file() or path.stat().st_size == 0:  # mmap refuses an empty file
            continue
        with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            found |= {name for name in wanted if name not in found and data.find(name.encode()) >= 0}
    return found


def string_constants(function: Any) -> set[str]:
    """The string constants in `function`'s source: the option keys a compile backend's ``__call__``
    reads, the variables ``set_tpu_launch_env`` reads and sets."""
    source = inspect.getsource(function)
    tree = ast.parse(inspect.cleandoc("\n" + source) if source.startswith((" ", "\t")) else source)
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
