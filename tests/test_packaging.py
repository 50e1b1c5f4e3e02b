"""The built wheel ships the declarative definitions, so an installed tpu-tune finds them."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_contains_agents_and_search_spaces(tmp_path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("tpu_tune-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "tpu_tuner/builtin/agents/profiler.toml" in names
    packages = {n.rsplit("/", 1)[0] for n in names if n.endswith("__init__.py")}
    source_packages = {str(p.parent.relative_to(REPO)) for p in (REPO / "tpu_tuner").rglob("__init__.py")}
    assert source_packages <= packages, source_packages - packages  # no subpackage left out of the wheel
    shipped_spaces = {n for n in names if n.startswith("tpu_tuner/builtin/search_spaces/") and n.endswith(".toml")}
    repo_spaces = {f"tpu_tuner/builtin/search_spaces/{p.name}" for p in (REPO / "search_spaces").glob("*.toml")}
    assert shipped_spaces == repo_spaces
