"""The tune command's terminal lines: a rejection's reason printed once, then counted, each
reason's count printed when the search is over."""

from __future__ import annotations

import pytest

from tpu_tuner.cli.tune_progress import ProgressLines
from tpu_tuner.tuning.run.progress import Progress

LONG = "precision: matmul precision 'high' is identical to 'highest' on CPU (no TF32)"
OTHER = "compile: inductor on CPU needs a C++ compiler and none is on PATH"


def _rejected(number: int, reason: str) -> Progress:
    return Progress(
        "trial", f"rejected setting {number} ({reason})", number, 20, 0.19, float(number), rejected_by=reason
    )


def test_repeated_rejections_are_counted_and_summarised_once(capsys: pytest.CaptureFixture[str]) -> None:
    show = ProgressLines()
    for event in [
        _rejected(1, LONG),
        _rejected(2, LONG),
        Progress("trial", "running eager", 3, 20, 0.19, 3.0),
        _rejected(4, OTHER),
        _rejected(5, LONG),
        Progress("learn", "a cause", elapsed=5.0),
        _rejected(6, LONG),
        Progress("verify", "re-measuring", elapsed=7.0),
        Progress("done", "results in x", elapsed=9.0),
    ]:
        show(event)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == [
        f"rejected setting 1 ({LONG})",
        "running eager",
        f"rejected setting 4 ({OTHER})",
        "a cause",
        f"rejected 4 settings unmeasured ({LONG}); each is in report.md and trials.csv",
        "re-measuring",
        "results in x",
    ]
    assert lines[4].startswith("[search |     7 s]")
    assert sum(LONG in line for line in lines) == 2


def test_a_trial_line_shows_the_best_and_the_time_left(capsys: pytest.CaptureFixture[str]) -> None:
    ProgressLines()(Progress("trial", "eager: 190 ms", 5, 36, 0.19, 61.0, time_left=174.0))
    assert capsys.readouterr().out == "[budget 5/36 | best 190 ms amortised |    61 s, 2.9 min left] eager: 190 ms\n"


def test_a_trial_line_leads_with_the_number_report_md_gives_the_trial(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 55: rejected settings reused the next trial's position ("trial 11/48" three times) and
    the terminal's numbers were not report.md's; each line now leads with the trial's own number."""
    show = ProgressLines()
    for number in (11, 12):
        show(Progress("trial", "rejected unmeasured: x", 9, 48, 0.19, 61.0, rejected_by=f"r{number}", number=number))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" |")[0] for line in lines] == ["[trial 11", "[trial 12"]
    assert all("| budget 9/48 |" in line for line in lines)
