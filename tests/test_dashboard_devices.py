"""The dashboard of chip runs (issue 69, item 6): every row names its device, every MFU says whose
peak it is of, and a chip's MFU and a host's never share a figure. On tests/fixtures/dashboard_runs:
a real tuning run on a TPU v5e chip, a real profile and bucketing run on this host."""

from __future__ import annotations

import json
import re
import shutil

import pandas as pd
import pytest
from conftest import FIXTURES
from helpers.common import buckets_dict, write_json
from matplotlib.figure import Figure
from matplotlib.text import Text

import tpu_tuner.dashboard.plots as plots
from tpu_tuner.dashboard import collect, render_page
from tpu_tuner.dashboard.device_labels import MFU_AXIS, device_label, kind_title, peak_basis

DASHBOARD_RUNS = FIXTURES / "dashboard_runs"
CHIP, HOST, BUCKETS = "llama-tune-20261207-000235", "gpt-20261207-030146", "encoder-buckets-20261207-030503"
XEON = "Intel(R) Xeon(R) Processor @ 2.60GHz"


@pytest.mark.parametrize(
    ("kind", "name", "label"),
    [
        ("tpu", "TPU v5e", "tpu: TPU v5e"),
        ("cpu", XEON, f"cpu: {XEON}"),
        ("cpu", None, "cpu"),  # a bucketing result written before it kept the device's name
        ("cpu", "cpu", "cpu"),
        (None, "TPU v5e", "TPU v5e"),
        (float("nan"), float("nan"), "unknown device"),
    ],
)
def test_a_device_is_named_by_kind_and_name(kind, name, label) -> None:
    assert device_label(kind, name) == label


@pytest.mark.parametrize(
    ("device", "basis"),
    [
        ({"kind": "tpu", "peak": {"source": "torch_tpu hardware table"}, "probe": None}, "spec"),
        ({"kind": "cuda", "peak": {"source": "NVIDIA datasheet, H100 (dense)"}}, "spec"),
        ({"kind": "cpu", "peak": {"source": "measured roofline probe"}, "probe": {"repeats": 3}}, "measured"),
        ({"kind": "cpu", "peak": {"source": "measured"}}, "measured"),  # a profile written before it kept the probe
        ({"kind": "tpu"}, None),
    ],
)
def test_a_peak_is_a_spec_or_a_measurement(device, basis) -> None:
    assert peak_basis(device) == basis


def test_each_run_records_its_device_and_the_peak_its_mfu_is_of() -> None:
    runs = collect(DASHBOARD_RUNS).runs.set_index("run")
    chip, host, buckets = runs.loc[CHIP], runs.loc[HOST], runs.loc[BUCKETS]
    assert (chip["device"], chip["device_name"], chip["peak_dtype"]) == ("tpu", "TPU v5e", "bfloat16")
    assert (chip["peak_flops_per_s"], chip["peak_basis"]) == (197e12, "spec")
    assert chip["peak_source"] == "torch_tpu hardware table (get_bf16_flops_per_device)"
    assert chip["mfu"] == pytest.approx(0.1172081659004346)  # tuned_config.toml's, as the chip measured it
    assert (host["device"], host["device_name"], host["peak_dtype"], host["peak_basis"]) == (
        "cpu",
        XEON,
        "float32",
        "measured",
    )
    assert host["peak_source"].startswith("measured roofline probe")
    assert (buckets["device"], buckets["device_name"]) == ("cpu", XEON)


def test_every_row_names_its_device_and_each_mfu_its_peak() -> None:
    page = render_page(collect(DASHBOARD_RUNS))
    table = re.search(r'<table id="runs".*?</table>', page, re.S).group(0)
    rows = dict(re.findall(r'<tr data-run="([^"]+)" data-device-kind="\w+">(.*?)</tr>', table, re.S))
    assert set(rows) == {CHIP, HOST, BUCKETS}
    devices = {run: re.search(r'<td class="device">([^<]*)</td>', row).group(1) for run, row in rows.items()}
    assert devices == {CHIP: "tpu: TPU v5e", HOST: f"cpu: {XEON}", BUCKETS: f"cpu: {XEON}"}
    assert 'title="MFU of tpu: TPU v5e&#x27;s 197 TFLOP/s bfloat16, spec peak (torch_tpu hardware table' in rows[CHIP]
    assert ">11.7%</td>" in rows[CHIP] and ">197 TFLOP/s bfloat16, spec</td>" in rows[CHIP]
    assert ">153 GFLOP/s float32, measured</td>" in rows[HOST]
    assert "a bucketing run measures compile and step times, not MFU" in rows[BUCKETS]
    assert f"<h3>encoder on cpu: {XEON} " in page  # the bucketing section names it too


def test_a_run_without_its_peak_says_so(tmp_path) -> None:
    shutil.copytree(DASHBOARD_RUNS / CHIP, tmp_path / CHIP)
    (tmp_path / CHIP / "profile.json").unlink()  # a tuning run that kept no baseline profile
    write_json(tmp_path, "tiny_encoder-buckets-20261126-000000", "buckets.json", buckets_dict())
    page = render_page(collect(tmp_path))
    assert ">11.7%</td>" in page and ">not recorded</td>" in page
    assert "MFU of tpu: TPU v5e&#x27;s peak (its figure is not recorded in this run folder)" in page
    assert '<td class="device">cpu</td>' in page  # buckets.json written before device_name


def _mfu_figures(figures: list[Figure]) -> dict[str, Figure]:
    return {
        f.axes[0].get_title(): f
        for f in figures
        if f.axes and MFU_AXIS in f.axes[0].get_ylabel() + f.axes[0].get_xlabel()
    }


def test_a_chips_mfu_and_a_hosts_never_share_a_figure(figures) -> None:
    render_page(collect(DASHBOARD_RUNS))
    drawn = _mfu_figures(figures)
    assert sorted(drawn) == [
        "CPU runs: MFU over time",
        "CPU runs: best MFU per model",
        "TPU runs: MFU over time",
        "TPU runs: best MFU per model",
    ]
    for title, fig in drawn.items():
        ax = fig.axes[0]
        named = [t.get_text() for t in ax.get_yticklabels()] if "best" in title else []
        named += [t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else []
        assert named, title
        device = "TPU v5e" if title.startswith("TPU") else XEON
        assert all(text.endswith(f" on {device}") for text in named), (title, named)
    # Each bar says the peak it is a share of.
    (bar,) = [t.get_text() for t in drawn["TPU runs: best MFU per model"].axes[0].texts]
    assert bar == "11.7% of 197 TFLOP/s bfloat16"
    (bar,) = [t.get_text() for t in drawn["CPU runs: best MFU per model"].axes[0].texts]
    assert bar == "4.8% of 153 GFLOP/s float32"


def test_a_kinds_two_figures_fit_side_by_side_with_labels_of_10_px(figures) -> None:
    """A page of 1400 px has 1163 px for two figures beside each other (mfu_plots.OVER_TIME_IN), also
    where a long model name on a long host name widens the bars' labels."""
    from tpu_tuner.dashboard.mfu_plots import mfu_per_model_figure

    runs = collect(DASHBOARD_RUNS).runs
    host = runs[runs["run"] == HOST]
    longest = mfu_per_model_figure(pd.concat([host, host.assign(model="hf_Llama-3.2-1B-Instruct", run="long")]))
    render_page(collect(DASHBOARD_RUNS))
    drawn = _mfu_figures(figures)
    pairs = [
        [fig for title, fig in drawn.items() if title.startswith("TPU")],
        [fig for title, fig in drawn.items() if title.startswith("CPU")],
        [drawn["CPU runs: MFU over time"], longest],
    ]
    for pair in pairs:
        assert len(pair) == 2 and sum(fig.get_figwidth() * plots.DPI for fig in pair) <= 1163
    for fig in [*drawn.values(), longest]:
        for text in fig.findobj(Text):
            if text.get_visible() and text.get_text().strip():
                assert text.get_fontsize() * plots.DPI / 72 >= 10, text.get_text()


def test_kind_title_names_each_peak_and_counts_the_rest() -> None:
    rows = pd.DataFrame(
        {
            "device_name": ["TPU v5e", "TPU v5p", "TPU v6e", "TPU v5e"],
            "peak_flops_per_s": [197e12, 459e12, 918e12, 197e12],
            "peak_dtype": "bfloat16",
            "peak_basis": "spec",
        }
    )
    assert kind_title("tpu", rows) == (
        "TPU runs: MFU of each chip's own spec peak (TPU v5e: 197 TFLOP/s bfloat16; TPU v5p: 459 TFLOP/s "
        "bfloat16; 1 more in the runs table)"
    )
    mixed = rows.assign(peak_basis=["spec", "measured", "spec", "spec"])
    assert kind_title("tpu", mixed, limit=5).startswith("TPU runs: MFU of each chip's own peak (")


def test_the_csv_says_whose_peak_each_mfu_is_of(tmp_path) -> None:
    from tpu_tuner.cli import main

    assert (
        main(["dashboard", str(DASHBOARD_RUNS), "--csv", str(tmp_path / "runs.csv"), "--out", str(tmp_path / "p.html")])
        == 0
    )
    frame = pd.read_csv(tmp_path / "runs.csv").set_index("run")
    assert frame.loc[CHIP, "peak_basis"] == "spec" and frame.loc[HOST, "peak_basis"] == "measured"
    assert frame.loc[CHIP, "peak_flops_per_s"] == 197e12
    assert frame.loc[HOST, "peak_flops_per_s"] == pytest.approx(
        json.loads((DASHBOARD_RUNS / HOST / "profile.json").read_text())["peak_flops_per_s"]
    )


def test_a_tuning_rows_peak_is_the_one_its_tuned_mfu_is_of(tmp_path) -> None:
    """The run's one peak (a CPU trial may re-measure it above the profile's) is recorded with the
    tuned MFU, and the row says it; a config written before it keeps the profile's."""
    folder = shutil.copytree(DASHBOARD_RUNS / CHIP, tmp_path / CHIP)
    config = folder / "tuned_config.toml"
    before = collect(tmp_path).runs.set_index("run").loc[CHIP, "peak_flops_per_s"]
    assert before == 197e12  # the profile's, as the shipped config records none
    text = config.read_text().replace("[provenance.tuned]\n", "[provenance.tuned]\npeak_flops_per_s = 2.5e14\n", 1)
    config.write_text(text)
    assert collect(tmp_path).runs.set_index("run").loc[CHIP, "peak_flops_per_s"] == 2.5e14
