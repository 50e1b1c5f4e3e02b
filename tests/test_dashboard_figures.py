"""The dashboard as a person reads it (issue 55, item 13): each notice once, a time axis fitted to the
runs, labels legible at the page's width, and the knobs' measured contributions beside the search's
importance."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import matplotlib.dates as mdates
import pandas as pd
from helpers.common import TRIALS_CSV, TUNED_CONFIG, buckets_dict, plan_dict, write_json, write_ranking_folder
from matplotlib.text import Text

import tpu_tuner.dashboard.plots as plots
from tpu_tuner.core.plain_data import json_default
from tpu_tuner.dashboard import collect, render_page
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.metrics.paired import PairedSpeedup
from tpu_tuner.tuning.verify.verification import KnobContribution, Verification

TUNE = "gpt-tune-20261129-092208"
# The page at 1400 px: a scrollbar (up to 17 px), the body's margins (1.5em of 14 px), a <figure>'s
# (40 px each side) and the image's 1 px border leave this much for a plot; a wider PNG is scaled down.
PAGE_PX = 1400
FIGURE_ROOM_PX = PAGE_PX - 17 - 2 * 21 - 2 * 40 - 2
MIN_LABEL_PX = 10


def profile_dict(created: str) -> dict:
    """profile.json with just what the collector reads (a tuning run's baseline profile)."""
    return {
        "created": created,
        "workload": {"name": "gpt"},
        "device": {"kind": "cpu", "name": "AMD EPYC", "peak": {"memory_bytes_per_s": 34.2e9}},
        "mfu": 0.02,
        "peak_dtype": "float32",
        "achieved_flops_per_s": 2e10,
        "peak_flops_per_s": 7.8e11,
        "verdict": {"arithmetic_intensity": 3.0},
        "timing": {"median": 0.76},
    }


def verification_json(contributions: dict[str, tuple[str, str, float]]) -> str:
    """result.json as TuningResult.to_json writes it, as far as the dashboard reads it: the
    verification with each knob's measured contribution (speedup, interval 0.1 either side)."""
    verification = Verification(
        baseline_trial=0,
        best_trial=1,
        chosen=Candidate(),
        chosen_is_best=True,
        speedup=PairedSpeedup(3.0, 2.9, 3.1, 12),
        contributions=[
            KnobContribution(knob, base, best, PairedSpeedup(x, x - 0.1, x + 0.1, 12))
            for knob, (base, best, x) in contributions.items()
        ],
        contributions_left_out={"matmul_precision": "the time budget left no room"},
        verdict="verified",
    )
    return json.dumps({"format": 1, "verification": dataclasses.asdict(verification)}, default=json_default)


def write_tune_run(root: Path, name: str = TUNE, result_json: str | None = None) -> Path:
    """A finished tuning run of 65 s: its baseline profile at 09:23:28, its tuned config at 09:24:33."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "tuned_config.toml").write_text(TUNED_CONFIG)
    (folder / "trials.csv").write_text(TRIALS_CSV)
    (folder / "profile.json").write_text(json.dumps(profile_dict("2026-11-29T09:23:28+00:00")))
    (folder / "report.md").write_text("# Tuning report: gpt\n")
    if result_json is not None:
        (folder / "result.json").write_text(result_json)
    return folder


def test_each_notice_appears_once_and_no_markdown_shows_raw(tmp_path) -> None:
    write_tune_run(tmp_path)
    page = render_page(collect(tmp_path))
    text = html_text(page).lower()
    for notice in ("no planner result", "no bucketing result", "no ranking of several slices"):
        assert text.count(notice) == 1, notice
    assert "`" not in text
    assert '<p class="note"></p>' not in page  # no empty notice either

    (tmp_path / "empty").mkdir()
    text = html_text(render_page(collect(tmp_path / "empty"))).lower()
    assert text.count("no run folders in") == 1 and "`" not in text
    assert text.count("no mfu") == 1


def html_text(page: str) -> str:
    """The page's text as a reader sees it: no tags, no script, no style, no image data."""
    body = re.sub(r"<(script|style)>.*?</\1>", "", page, flags=re.S)
    return re.sub(r"<[^>]+>", " ", body)


def test_mfu_over_time_spans_the_runs_own_minutes_not_a_day(tmp_path, figures) -> None:
    write_tune_run(tmp_path)
    render_page(collect(tmp_path))
    (fig,) = [f for f in figures if f.axes and f.axes[0].get_title() == "CPU runs: MFU over time"]
    low, high = (mdates.num2date(x) for x in fig.axes[0].get_xlim())
    start, end = pd.Timestamp("2026-11-29T09:23:28Z"), pd.Timestamp("2026-11-29T09:24:33Z")
    assert low <= start and high >= end  # the run's span, from its baseline profile to its tuned config
    assert high - low <= pd.Timedelta(minutes=2)  # 65 s of run, not a day


def test_every_label_is_at_least_10_px_at_the_pages_width(tmp_path, figures) -> None:
    write_tune_run(tmp_path)
    write_tune_run(tmp_path, "gpt-tune-20261130-092208", verification_json({"autocast": ("none", "bfloat16", 3.0)}))
    write_json(
        tmp_path, "gpt_70b-plan-v5p-8-20261125-000000", "plan.json", plan_dict("v5p-8", 4, [0.41, 0.5], [True, False])
    )
    write_json(tmp_path, "gpt_70b-plan-v5p-16-20261125-010000", "plan.json", plan_dict("v5p-16", 8, [0.38], [True]))
    many = plan_dict("v5p-64", 32, [0.3 + 0.01 * i for i in range(20)], [True] * 20)  # a wide figure
    write_json(tmp_path, "gpt_70b-plan-v5p-64-20261125-020000", "plan.json", many)
    write_ranking_folder(tmp_path, ["v5p-8", "v5p-16", "tpu7x-8"])
    write_json(tmp_path, "tiny_encoder-buckets-20261126-000000", "buckets.json", buckets_dict())
    render_page(collect(tmp_path))
    assert len(figures) >= 10  # MFU x3, two runs, four plans, the scaling, the ranking, the buckets
    small = []
    for fig in figures:
        natural = fig.get_figwidth() * plots.DPI
        shown = min(natural, FIGURE_ROOM_PX) / natural  # img{max-width:100%} only ever shrinks
        for text in fig.findobj(Text):
            if text.get_visible() and text.get_text().strip():
                px = text.get_fontsize() * plots.DPI / 72 * shown
                if px < MIN_LABEL_PX:
                    small.append(f"{text.get_text()!r}: {px:.1f} px")
    assert not small, f"{len(small)} texts under {MIN_LABEL_PX} px, e.g. {small[:5]}"


def test_measured_contributions_are_shown_where_the_run_has_them(tmp_path, figures) -> None:
    write_tune_run(tmp_path, result_json=verification_json({"autocast": ("none", "bfloat16", 3.0)}))
    write_tune_run(tmp_path, "gpt-tune-20261130-092208")  # no result.json: only the search's importance
    page = render_page(collect(tmp_path))

    measured = re.search(rf'<section class="run" id="run-{TUNE}">(.*?)</section>', page, re.S).group(1)
    row = re.search(r"<tr[^>]*>\s*<td>autocast</td>(.*?)</tr>", measured, re.S).group(1)
    assert "none" in row and "bfloat16" in row and "3.00x" in row and "2.90" in row and "3.10" in row
    assert "speeds the best" in row  # as report.md judges it: the interval lies above 1
    assert "matmul_precision" in measured and "the time budget left no room" in measured
    (knobs,) = [ax for f in figures for ax in f.axes if "measured" in ax.get_title()]
    assert [round(bar.get_width(), 2) for bar in knobs.patches] == [3.0]  # the speedup, not a variance share

    other = re.search(r'<section class="run" id="run-gpt-tune-20261130-092208">(.*?)</section>', page, re.S).group(1)
    assert "share of the variance of the step time across this search" in html_text(other)
    assert "not a speedup" in html_text(other)


def test_an_unreadable_result_json_costs_the_contributions_not_the_run(tmp_path) -> None:
    write_tune_run(tmp_path, result_json='{"verification": ')
    collection = collect(tmp_path)
    assert collection.runs.loc[0, "status"] == "ok"
    page = render_page(collection)
    assert "No measured contribution: result.json: invalid JSON" in page
    assert "share of the variance of the step time" in page  # the importance, said for what it is


def test_each_contribution_is_judged_as_the_report_judges_it(tmp_path) -> None:
    from tpu_tuner.dashboard.contributions import read_contributions

    knobs = {"autocast": ("none", "bfloat16", 3.0), "matmul_precision": ("highest", "medium", 0.85)}
    knobs["layout"] = ("1x1x1", "1x2x1", 1.02)
    record = json.loads(verification_json(knobs))
    record["verification"]["trim"] = {"dropped": ["matmul_precision"], "recommended": True}
    folder = write_tune_run(tmp_path, result_json=json.dumps(record))
    judged = {c.knob: c.judged for c in read_contributions(folder).measured}
    assert judged == {
        "autocast": "speeds the best",
        "matmul_precision": "slows the best: dropped",
        "layout": "not significant: kept",
    }
