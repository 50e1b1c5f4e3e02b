"""Files a reader polls (the dashboard reads run folders while runs write them) are written whole
or not at all, through one helper (`core.run_folder.write_atomic`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tpu_tuner.core import run_folder
from tpu_tuner.core.run_folder import write_atomic
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.tuned_config import TunedConfig
from tpu_tuner.studies import run_file

PACKAGE = Path(__file__).resolve().parents[1] / "tpu_tuner"


def test_write_atomic_replaces_the_whole_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text("old")
    old_umask = os.umask(0o022)
    try:
        write_atomic(path, '{"status": "done"}')
    finally:
        os.umask(old_umask)
    assert path.read_text() == '{"status": "done"}'
    assert path.stat().st_mode & 0o777 == 0o644  # the umask's, not mkstemp's 0600
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]
    write_atomic(path, b"\x89PNG")
    assert path.read_bytes() == b"\x89PNG"


def test_a_failed_write_keeps_the_old_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tuned_config.toml"
    path.write_text("old = 1\n")

    def fail(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(run_folder.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, "new = 2\n")
    assert path.read_text() == "old = 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["tuned_config.toml"]


def test_run_folder_writers_go_through_write_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tuned_config.toml and run.json land by `os.replace` from a temporary in the same folder."""
    replaced: list[tuple[Path, Path]] = []
    real = os.replace

    def record(src: str, dst: str) -> None:
        replaced.append((Path(src), Path(dst)))
        real(src, dst)

    monkeypatch.setattr(run_folder.os, "replace", record)
    TunedConfig(Candidate(), "cpu").save(tmp_path / run_folder.TUNED_CONFIG)
    run_file.write(tmp_path, {"status": "running"})
    assert [dst.name for _, dst in replaced] == [run_folder.TUNED_CONFIG, run_folder.RUN_JSON]
    assert all(src.parent == dst.parent == tmp_path for src, dst in replaced)


def test_no_other_writer_of_run_folder_files() -> None:
    """The modules that write run folders call `write_atomic`, never `write_text` or a `to_csv` to
    a path, and no copy of the temporary-and-replace mechanism is left."""
    writers = [
        PACKAGE / "outputs" / "write.py",
        PACKAGE / "outputs" / "ranking_report.py",
        PACKAGE / "knobs" / "tuned_config.py",
        PACKAGE / "studies" / "run_file.py",
        PACKAGE / "dashboard" / "page.py",
        PACKAGE / "devices" / "roofline.py",
    ]
    for module in writers:
        text = module.read_text()
        assert not re.search(r"\.write_text\(|\.to_csv\((?!index=)[^)]|\.replace\(path\)", text), module
        assert "write_atomic(" in text, module
