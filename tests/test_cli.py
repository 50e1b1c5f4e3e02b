"""`tpu-tune profile` end to end, and one-line errors with exit status 2 for bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import FIXTURES

from tpu_tuner.cli import main


def _fast_agent(tmp_path):
    agent = tmp_path / "fast.toml"
    agent.write_text("[timing]\nmin_steps = 10\nmin_seconds = 0\n[operators]\nprofiled_steps = 1\ntop = 5\n")
    return agent


@pytest.mark.parametrize(
    ("file", "problem"),
    [
        ("does_not_exist.py", "file not found"),
        ("syntax_error.py", "syntax error"),
        ("import_error.py", "error while importing"),
        ("no_workload.py", "no workload found"),
        ("bad_forward.py", "first step failed"),
    ],
)
def test_bad_input_is_one_line_and_status_2(tmp_path, capsys, file: str, problem: str) -> None:
    status = main(
        ["-q", "profile", str(FIXTURES / file), "--out", str(tmp_path), "--agent", str(_fast_agent(tmp_path))]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and err[0].startswith("tpu-tune: error: ")
    assert file in err[0] and problem in err[0]
    assert not any(p.is_dir() for p in tmp_path.iterdir())  # no half-written run folder


def test_console_script_exit_status_and_no_traceback(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tpu_tuner.cli", "profile", str(FIXTURES / "syntax_error.py")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "syntax error at line 3" in result.stderr


def test_debug_shows_the_traceback(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tpu_tuner.cli", "--debug", "profile", str(FIXTURES / "no_workload.py")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode != 0 and "Traceback" in result.stderr


# A command whose run logs as libraries do: a third party's INFO line (matplotlib's font cache on a
# cold start), tpu-tune's own INFO line and a warning.
_LOGGING_RUN = """\
import logging, sys
import tpu_tuner.cli.devices as command
def run(args):
    logging.getLogger("matplotlib.font_manager").info("generated new fontManager")
    logging.getLogger("tpu_tuner.tuning.search.failure_learning").info("probe queued: trial 3's setting")
    logging.getLogger("tpu_tuner.tuning.verify.verification").warning("racing the search's leaders failed")
    return 0
command.run = run
from tpu_tuner.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    ("flags", "shown"),
    [
        ([], {"racing"}),
        (["-v"], {"probe queued", "racing"}),
        (["-q"], set()),
        (["--debug"], {"fontManager", "probe queued", "racing"}),
    ],
)
def test_the_terminal_gets_library_logs_only_when_asked(flags: list[str], shown: set[str]) -> None:
    """By default only warnings reach stderr; -v adds tpu-tune's INFO lines (never a third
    party's), -q leaves errors alone, --debug shows everything."""
    done = subprocess.run(
        [sys.executable, "-c", _LOGGING_RUN, *flags, "devices"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert {word for word in ("fontManager", "probe queued", "racing") if word in done.stderr} == shown
