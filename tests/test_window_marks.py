"""Issue 69, item 5: one figure per setting. Once a window (the race, the verification) has timed a
setting again and its figure disagrees with the search's beyond both spreads, the trial's row in
trials.csv, report.md's trials table and the plots show the window's figure or mark the search's,
never both unmarked. The run here: the search read a disturbed baseline at 447 ms (p10 55.7, p90
1020), the window timed it at ~45 ms; the tuned setting agreed at ~18.9 ms both ways."""

from __future__ import annotations

import io
from typing import Any

import pandas as pd
import pytest
from helpers.common import WINDOW_FLOPS, WINDOW_PEAK, window_result

from tpu_tuner.studies.records import FIGURE_NOTE, SUPERSEDED, WINDOW_MFU, WINDOW_STEP_S
from tpu_tuner.tuning.verify.race import RaceEntry
from tpu_tuner.tuning.verify.window_marks import mark_against_race


def test_the_trials_frame_marks_the_search_figure_the_window_superseded(tmp_path) -> None:
    frame = window_result(tmp_path).trials_dataframe().set_index("number")
    baseline, tuned = frame.loc[0], frame.loc[1]
    assert bool(baseline[SUPERSEDED]) and baseline[WINDOW_STEP_S] == pytest.approx(0.045, rel=0.05)
    assert baseline[WINDOW_MFU] == pytest.approx(WINDOW_FLOPS / baseline[WINDOW_STEP_S] / WINDOW_PEAK)
    assert baseline[FIGURE_NOTE].startswith("search figure superseded: the verification window timed")
    assert "0.10x the search's 447 ms" in baseline[FIGURE_NOTE]
    # The search's own figure stays in its column, now marked; the agreeing setting is not marked.
    assert baseline["step_median_s"] == pytest.approx(0.447)
    assert not bool(tuned[SUPERSEDED]) and tuned[WINDOW_STEP_S] == pytest.approx(0.0189, rel=0.05)
    assert "within the search's spread" in tuned[FIGURE_NOTE]


def test_without_a_window_nothing_is_marked(tmp_path) -> None:
    result = window_result(tmp_path)
    result.verification.samples = {}
    frame = result.trials_dataframe()
    assert frame[SUPERSEDED].isna().all() and frame[WINDOW_STEP_S].isna().all()


def test_trials_csv_and_the_report_carry_the_mark(tmp_path) -> None:
    from tpu_tuner.outputs.tuning_report import render_report

    result = window_result(tmp_path)
    csv = pd.read_csv(io.StringIO(result.trials_dataframe().to_csv(index=False))).set_index("number")
    assert bool(csv.loc[0, SUPERSEDED]) and csv.loc[0, WINDOW_STEP_S] == pytest.approx(0.045, rel=0.05)
    rows = [line for line in render_report(result, {}).split("## Trials")[1].splitlines() if line.startswith("| 0 |")]
    (row,) = rows
    assert "447 ms -> 4" in row and "search figure superseded" in row  # 447 ms, marked, then the window's
    assert "4.0% -> 40." in row  # the MFU of each


def test_the_plots_mark_the_superseded_figure(tmp_path, monkeypatch) -> None:
    from tpu_tuner.outputs import tuning_plots
    from tpu_tuner.outputs.superseded_marks import SUPERSEDED_LABEL

    legends: dict[str, list[str]] = {}

    def keep(fig, path, dpi):
        legend = fig.axes[0].get_legend()
        legends[path.name] = [t.get_text() for t in legend.get_texts()] if legend else []
        return path

    monkeypatch.setattr(tuning_plots, "save_figure", keep)
    tuning_plots.write_plots(window_result(tmp_path))
    assert len(legends) == 3
    assert all(SUPERSEDED_LABEL in texts for texts in legends.values()), legends


@pytest.mark.parametrize(("interleaved", "superseded"), [(0.150, True), (0.110, False), (0.080, True)])
def test_a_raced_setting_is_marked_beyond_the_search_agreement_ratio(interleaved: float, superseded: bool) -> None:
    mark = mark_against_race(RaceEntry(3, "inductor", 0.100, interleaved, 1.5))
    assert mark.superseded is superseded and mark.step_s == interleaved and mark.mfu is None
    assert mark.note.startswith("search figure superseded") is superseded


def test_the_dashboards_run_figure_marks_what_trials_csv_marks(tmp_path, monkeypatch) -> None:
    """The dashboard reads trials.csv (as written, booleans as text) and marks the same row."""
    import tpu_tuner.dashboard.plots as plots
    from tpu_tuner.dashboard.run_figure import run_detail
    from tpu_tuner.outputs.superseded_marks import SUPERSEDED_LABEL

    trials = pd.read_csv(io.StringIO(window_result(tmp_path).trials_dataframe().to_csv(index=False)))
    figures = []
    monkeypatch.setattr(plots, "to_data_uri", lambda fig: figures.append(fig) or "data:")
    run_detail(trials)
    history, mfu = figures[0].axes[:2]
    assert SUPERSEDED_LABEL in [t.get_text() for t in history.get_legend().get_texts()]
    bars = {round(p.get_x() + p.get_width() / 2): p.get_height() for p in mfu.patches}
    assert bars[0] == pytest.approx(trials.loc[0, WINDOW_MFU] * 100)  # the baseline's bar is the window's MFU


def test_a_window_the_verdict_calls_off_the_search_is_marked_though_the_spreads_overlap() -> None:
    """A CPU run's verdict said "best: 1.56 s in the window against 1.05 s in the search", while its
    trials.csv said "within the search's spread" (wide, overlapping spreads): one run, two words."""
    from conftest import steady_measurement

    from tpu_tuner.tuning.verify.window_marks import mark_against_window

    def step(median: float, p10: float, p90: float) -> Any:
        return steady_measurement({}, median, step_p10=p10, step_p90=p90)

    mark = mark_against_window(step(1.045, 0.9, 1.7), step(1.564, 1.5, 1.6), "the verification window")
    assert mark.superseded and "1.50x the search's" in mark.note and "more than 1.2x apart" in mark.note
    assert not mark_against_window(step(1.5, 1.4, 1.6), step(1.55, 1.5, 1.6), "w").superseded
