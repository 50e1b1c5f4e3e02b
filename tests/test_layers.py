"""The package's layering (docs/design.md, "Layers"), enforced: every import of every module,
module-level and inside functions (``if TYPE_CHECKING:`` blocks excepted), runs down the layers
or stays in its own package, and no imports close a cycle; inside a package not even with the
imports made for types only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tpu_tuner"

# Layer of each subpackage (or top-level module) of tpu_tuner. A module may import its own
# package and any package of a lower layer; packages that share a layer never import each other.
LAYERS = {
    "builtin": 0,
    "core": 0,
    "model": 1,
    "metrics": 2,
    "devices": 3,
    "parallel": 4,
    "knobs": 5,
    "execution": 6,
    "profiling": 7,
    "runner": 8,
    "studies": 9,
    "tuning": 10,
    "planner": 10,
    "bucketing": 10,
    "outputs": 11,
    "dashboard": 12,
    "api": 13,
    "plan_api": 13,
    "cli": 14,
    "": 15,  # the package face, tpu_tuner/__init__.py
}


# The rooms of a package, each with its layer inside it (docs/design.md, "Layers"): a room imports
# its own modules and rooms of a lower layer; rooms that share a layer never import each other.
ROOMS = {"model": {"meshes": 0, "buckets": 0, "decoders": 1, "workloads": 2}}


def _modules(package: Path) -> dict[str, Path]:
    modules = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_names(module: str, path: Path, types_too: bool = False) -> set[str]:
    """Every dotted name `module` imports (relative imports resolved), TYPE_CHECKING excepted
    unless `types_too`."""
    names: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text())]
    while stack:
        for child in ast.iter_child_nodes(stack.pop()):
            if isinstance(child, ast.If) and _is_type_checking(child) and not types_too:
                stack.extend(child.orelse)
                continue
            stack.append(child)
            if isinstance(child, ast.Import):
                names.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                if child.level:
                    base = base[: len(base) - child.level + 1]
                    prefix = ".".join([*base, *([child.module] if child.module else [])])
                else:
                    prefix = child.module or ""
                names.add(prefix)
                names.update(f"{prefix}.{alias.name}" for alias in child.names)
    return names


def import_graph(package: Path = PACKAGE, types_too: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (with `types_too`, for types only as well)."""
    modules = _modules(package)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    return {
        module: {
            target
            for name in _imported_names(module, path, types_too)
            if (target := resolve(name)) and target != module
        }
        for module, path in modules.items()
    }


def _package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that run up a layer or across to another package of the same layer."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            own, other = _package_of(module), _package_of(target)
            if own == other:
                continue
            if LAYERS[other] >= LAYERS[own]:
                found.append(f"{module} (layer {LAYERS[own]}) imports {target} (layer {LAYERS[other]})")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _room_of(module: str) -> tuple[str, str | None]:
    """(package, room) of a module, a room's face in its room; room None for a package without
    rooms, the package's face, or a module beside the rooms."""
    parts = module.split(".")
    package = _package_of(module)
    room = parts[2] if len(parts) > 2 else None
    return package, room if room in ROOMS.get(package, {}) else None


def room_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports between two rooms of one package that run up or across its rooms' layers."""
    found = []
    for module, targets in sorted(graph.items()):
        (package, own), rooms = _room_of(module), ROOMS.get(_package_of(module), {})
        for target in sorted(targets):
            (other_package, other) = _room_of(target)
            if own is None or other is None or other_package != package or own == other:
                continue
            if rooms[other] >= rooms[own]:
                found.append(f"{module} (room {own}) imports {target} (room {other})")
    return found


def folder_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles among the modules of one package (`tpu_tuner.X` and its rooms), counting only the
    imports that stay inside it."""
    inside = {
        module: {t for t in targets if _package_of(t) == _package_of(module)} for module, targets in graph.items()
    }
    return cycles(inside)


def test_every_package_has_a_layer() -> None:
    unknown = {_package_of(module) for module in import_graph()} - set(LAYERS)
    assert not unknown, f"packages with no layer in LAYERS (and docs/design.md): {sorted(unknown)}"


def test_imports_only_run_down_the_layers() -> None:
    violations = layer_violations(import_graph())
    assert not violations, "\n".join(violations)


def test_every_module_of_a_package_with_rooms_is_in_one() -> None:
    # A module beside the rooms, or a room with no layer, would be outside the rule.
    astray = [
        module
        for module, path in _modules(PACKAGE).items()
        if _package_of(module) in ROOMS and path != PACKAGE / _package_of(module) / "__init__.py"
        if _room_of(module)[1] is None
    ]
    assert not astray, f"in no room of ROOMS: {astray}"


def test_imports_only_run_down_the_rooms() -> None:
    violations = room_violations(import_graph())
    assert not violations, "\n".join(violations)


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "\n".join(" <-> ".join(component) for component in found)


def test_no_circle_inside_a_folder() -> None:
    # With the imports made for types only: such a circle runs nowhere, but a reader following the
    # names still goes round it, and it is the first step to one that runs (issue 71 item 4).
    found = folder_circles(import_graph(types_too=True))
    assert not found, f"{len(found)} circles:\n" + "\n".join(" <-> ".join(component) for component in found)


def test_the_folder_check_counts_a_circle_closed_by_a_type_only_import(tmp_path: Path) -> None:
    package = tmp_path / "tpu_tuner"
    for_types = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tpu_tuner.knobs.reader import R\n"
    for name, text in {
        "__init__.py": "",
        "core/__init__.py": "",
        "knobs/__init__.py": "",
        "knobs/record.py": for_types,
        "knobs/reader.py": "from tpu_tuner.knobs.record import Record\nfrom tpu_tuner.core import units\n",
        "core/units.py": for_types,
    }.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    assert cycles(import_graph(package)) == []  # at run time there is none
    # knobs' two modules circle; core <-> knobs is no circle inside a folder (and an upward import
    # that runs is test_imports_only_run_down_the_layers's).
    assert folder_circles(import_graph(package, types_too=True)) == [
        ["tpu_tuner.knobs.reader", "tpu_tuner.knobs.record"]
    ]


def test_the_room_check_catches_an_import_up_or_across_the_rooms(tmp_path: Path) -> None:
    package = tmp_path / "tpu_tuner"
    for name, text in {
        "__init__.py": "",
        "model/__init__.py": "",
        "model/meshes/__init__.py": "",
        "model/meshes/layouts.py": "from tpu_tuner.model.buckets.lengths import read_lengths\n",
        "model/buckets/__init__.py": "",
        "model/buckets/lengths.py": "",
        "model/workloads/__init__.py": "",
        "model/workloads/loader.py": "from tpu_tuner.model.meshes.layouts import Layout\n",
    }.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    assert room_violations(import_graph(package)) == [
        "tpu_tuner.model.meshes.layouts (room meshes) imports tpu_tuner.model.buckets.lengths (room buckets)"
    ]


def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path: Path) -> None:
    package = tmp_path / "tpu_tuner"
    for name, text in {
        "__init__.py": "",
        "core/__init__.py": "",
        "knobs/__init__.py": "",
        "core/units.py": "def f():\n    from tpu_tuner.knobs.base import Knob\n",
        "knobs/base.py": "from tpu_tuner.core import units\n",
        "knobs/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tpu_tuner.cli import main\n",
    }.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    graph = import_graph(package)
    assert layer_violations(graph) == ["tpu_tuner.core.units (layer 0) imports tpu_tuner.knobs.base (layer 5)"]
    assert cycles(graph) == [["tpu_tuner.core.units", "tpu_tuner.knobs.base"]]


@pytest.mark.parametrize("limit", [400])
def test_no_module_over_the_line_limit(limit: int) -> None:
    long = {
        module: n for module, path in _modules(PACKAGE).items() if (n := len(path.read_text().splitlines())) > limit
    }
    assert not long, f"modules over {limit} lines: {long}"


# An ignore names its error code and says why after it, on its line (docs/testing.md, "Gates").
REASONED_IGNORE = re.compile(r"# type: ignore\[[a-z-]+(, [a-z-]+)*\]  # \S")


def unreasoned_ignores(package: Path) -> list[str]:
    """`path:line` of each `type: ignore` without an error code and a reason on its line."""
    return [
        f"{path.relative_to(package.parent)}:{number}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "# type: ignore" in line and not REASONED_IGNORE.search(line)
    ]


def test_every_type_ignore_names_its_code_and_says_why(tmp_path: Path) -> None:
    assert unreasoned_ignores(PACKAGE) == []
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("a = f()  # type: ignore[misc]\nb = g()  # type: ignore[misc]  # why\n")
    assert unreasoned_ignores(tmp_path / "pkg") == ["pkg/m.py:1"]
