"""benchmarks/chip/chip_call.sh, one call of a chip session: the command gets SIGINT at its limit
(in the foreground, so Python sees it and a run writes its results), nothing of its process group
outlives the call, and the files it wrote under /tmp/runs come back in $OUT/NAME.tgz."""

from __future__ import annotations

import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "chip" / "chip_call.sh"

CHILD = """
import pathlib, subprocess, sys, time
run = pathlib.Path('/tmp/runs') / sys.argv[1]
run.mkdir(parents=True, exist_ok=True)
subprocess.Popen(['sleep', '300', sys.argv[1]])  # a trial worker left behind
try:
    time.sleep(60)
except KeyboardInterrupt:
    (run / 'result.json').write_text('{"interrupted": true}')
    raise SystemExit(3)
"""


@pytest.mark.skipif(not Path("/proc").exists(), reason="reads /proc for the process left behind")
def test_a_call_interrupts_its_command_kills_its_group_and_archives_its_files(tmp_path: Path) -> None:
    name = f"chip-call-test-{os.getpid()}"
    started = time.monotonic()
    done = subprocess.run(
        ["bash", str(SCRIPT), name, "2", "python3", "-c", CHILD, name],
        cwd=SCRIPT.parents[2],
        env={**os.environ, "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - started < 30
    # 124: it ran to its limit (timeout's word); the result file says Python saw the SIGINT.
    assert done.returncode == 124 and f"chip_call: {name} exited with status 124" in done.stdout
    with tarfile.open(tmp_path / f"{name}.tgz") as archive:
        names = archive.getnames()
    assert f"tmp/runs/{name}/result.json" in names and f"tmp/runs/{name}.log" in names
    left = subprocess.run(["pgrep", "-f", f"sleep 300 {name}"], capture_output=True, text=True)
    assert left.stdout.strip() == ""  # the worker left behind was killed with the group
