"""report.md's "What each knob contributed" says why a contribution is missing, from what the
verification recorded: the search's best is the baseline, the verification did not finish, the
clock left no room, an agent refused the reverted setting; one knob changed is its own note."""

from __future__ import annotations

import dataclasses

import pytest
from helpers.common import window_result, window_samples

from tpu_tuner.metrics.paired import paired_speedup
from tpu_tuner.outputs.tuning_report import render_report
from tpu_tuner.tuning.verify.verification import NO_TIME, KnobContribution


def _section(result) -> str:
    return render_report(result, {}).split("## What each knob contributed\n")[1].split("\n## ")[0].strip()


def _with(tmp_path, **changes) -> str:
    result = window_result(tmp_path)
    result.verification = dataclasses.replace(result.verification, **changes)
    return _section(result)


def test_the_clock_skipped_the_contributions_of_a_verified_win(tmp_path) -> None:
    text = _with(tmp_path, contributions_left_out={"execution": NO_TIME, "matmul_precision": NO_TIME})
    assert text == f"Not measured for execution, matmul_precision: {NO_TIME}."
    assert "baseline" not in text.split(":")[0]


def test_the_search_best_is_the_baseline(tmp_path) -> None:
    text = _with(tmp_path, best_trial=0, speedup=None, chosen_is_best=False)
    assert text == "Nothing to attribute: the search's best setting is the baseline."


def test_a_verification_that_failed_says_so(tmp_path) -> None:
    text = _with(
        tmp_path, speedup=None, chosen_is_best=False, message="verification failed (worker died); keep the baseline"
    )
    assert text == (
        "Not measured: the interleaved verification did not run to its end (verification failed "
        "(worker died); keep the baseline)."
    )


def test_one_knob_changed_and_a_refused_revert(tmp_path) -> None:
    samples = window_samples()
    one = KnobContribution(
        "matmul_precision", "highest", "medium", paired_speedup(samples["baseline"], samples["best"])
    )
    text = _with(tmp_path, contributions=[one])
    assert "| matmul_precision | highest | medium |" in text
    assert text.endswith("Only this knob changed: its contribution is the verified speedup itself.")
    text = _with(tmp_path, contributions=[one], contributions_left_out={"layout": "compile: fullgraph under DDP"})
    assert "Only this knob" not in text and text.endswith("Not measured for layout: compile: fullgraph under DDP.")


def test_a_result_written_before_the_reason_was_recorded(tmp_path) -> None:
    assert _with(tmp_path).startswith("Not recorded:")


@pytest.mark.parametrize("left_out", [{}, {"execution": NO_TIME}])
def test_the_reason_survives_result_json(tmp_path, left_out: dict[str, str]) -> None:
    import json

    from tpu_tuner.core.plain_data import from_plain, json_default
    from tpu_tuner.tuning.verify.verification import Verification

    v = dataclasses.replace(window_result(tmp_path).verification, contributions_left_out=left_out)
    back = from_plain(Verification, json.loads(json.dumps(dataclasses.asdict(v), default=json_default)))
    assert back.contributions_left_out == left_out
