"""The tests' own layering (docs/testing.md, "Shared helpers" and "Private names in tests"): a test
module imports what it shares with others from the tests/helpers package (common, fuzz_strategies,
netns, postgres_server, tiny_planner) or tests/conftest.py, never from another test module; and
it reaches the package through public names, but for the private seams listed here with the reason
each needs one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
HERE = Path(__file__).resolve()  # its own examples below are not imports

# Test modules another test module may still import, with why (each one a debt with its end named).
TEST_MODULE_IMPORTS: dict[tuple[str, str], str] = {}

# Private names of the package a test may import: (test file, module, name) -> why there is no public name.
PRIVATE_SEAMS: dict[tuple[str, str, str], str] = {}

PRIVATE_IMPORT_IN_TEXT = re.compile(r"from (tpu_tuner[\w.]*) import ([\w ,]+)")


def imports_of_test_modules(path: Path) -> list[tuple[str, str]]:
    """(file, module) for each import of a test module (`test_*`) in the Python file `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        found += [(path.name, name) for name in names if name.split(".")[0].startswith("test_")]
    return found


def private_imports(path: Path) -> list[tuple[str, str, str]]:
    """(file, module, name) for each private name (`_x`) imported from tpu_tuner in `path`, in its
    code or in the code it hands a child process as a string."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tpu_tuner"):
            found += [(path.name, node.module or "", a.name) for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for module, names in PRIVATE_IMPORT_IN_TEXT.findall(node.value):
                for name in (part.split(" as ")[0].strip() for part in names.split(",")):
                    if name.startswith("_"):
                        found.append((path.name, module, name))
    return found


def test_no_test_module_imports_another() -> None:
    found = [hit for path in sorted(TESTS.glob("*.py")) if path != HERE for hit in imports_of_test_modules(path)]
    assert [hit for hit in found if hit not in TEST_MODULE_IMPORTS] == [], "import it from the tests/helpers package"


def test_tests_import_no_private_name_but_the_listed_seams() -> None:
    found = {hit for path in sorted(TESTS.glob("test_*.py")) if path != HERE for hit in private_imports(path)}
    assert sorted(found - PRIVATE_SEAMS.keys()) == [], "use or give it a public name, or list it with why"


def test_the_checks_find_an_import_of_a_test_module_and_a_private_name(tmp_path: Path) -> None:
    code = (
        "import test_a\nfrom test_b import helper\nfrom helpers import shared\n"
        "from tpu_tuner.core import _hidden, public\n"
        'SCRIPT = "from tpu_tuner.runner.hosts import _is_here as m, open_host"\n'
    )
    (tmp_path / "test_x.py").write_text(code)
    assert imports_of_test_modules(tmp_path / "test_x.py") == [("test_x.py", "test_a"), ("test_x.py", "test_b")]
    assert private_imports(tmp_path / "test_x.py") == [
        ("test_x.py", "tpu_tuner.core", "_hidden"),
        ("test_x.py", "tpu_tuner.runner.hosts", "_is_here"),
    ]
