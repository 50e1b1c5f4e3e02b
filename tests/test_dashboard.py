"""`tpu-tune dashboard`: collection of run folders, the page, the CSV export and the HTTP server."""

from __future__ import annotations

import html
import http.client
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import FIXTURES, serving
from helpers.common import TRIALS_CSV, TUNED_CONFIG, buckets_dict, plan_dict, write_json, write_ranking_folder

import tpu_tuner
from tpu_tuner.cli import main
from tpu_tuner.dashboard import collect, make_server, render_page
from tpu_tuner.dashboard.analysis import knob_importance, pareto_front
from tpu_tuner.dashboard.collect import COLUMNS
from tpu_tuner.dashboard.plots import step_split
from tpu_tuner.profiling import ProfilerSettings


@pytest.fixture(scope="module")
def profile_json() -> str:
    """A real profile.json of a tiny model (the shape the collector reads)."""
    settings = ProfilerSettings(
        warmup_min_steps=2,
        warmup_max_steps=10,
        timing_min_steps=10,
        timing_min_seconds=0.0,
        timing_max_steps=50,
        profiled_steps=1,
        top_operators=5,
        explained_share_min=0.5,
    )
    return tpu_tuner.profile(FIXTURES / "tiny_mlp_benchmark.py", device="cpu", settings=settings).to_json()


def write_profile(root: Path, text: str, name: str = "tiny_mlp_benchmark-20261120-101010") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "profile.json").write_text(text)
    (folder / "profile.md").write_text("# Profile\n")
    return folder


def write_tune(root: Path, profile_text: str, name: str = "gpt-tune-20261129-092208") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "tuned_config.toml").write_text(TUNED_CONFIG)
    (folder / "trials.csv").write_text(TRIALS_CSV)
    (folder / "profile.json").write_text(profile_text)
    (folder / "report.md").write_text("# Tuning report: gpt\n")
    (folder / "run.json").write_text(json.dumps({"storage": "sqlite:///x.db", "study_name": name}))
    return folder


# ---------------------------------------------------------------- collection


def test_empty_folder_gives_a_page_that_says_what_is_missing(tmp_path) -> None:
    collection = collect(tmp_path)
    assert collection.runs.empty and list(collection.runs.columns) == COLUMNS
    page = render_page(collection)
    assert f"no run folders in {tmp_path}" in page
    assert "No tuning run, profile or bucketing run to list." in page and "No MFU measured yet" in page


def test_profile_and_tuning_run_are_read(tmp_path, profile_json) -> None:
    write_profile(tmp_path, profile_json)
    write_tune(tmp_path, profile_json)
    runs = collect(tmp_path).runs.set_index("run")
    profile_row = runs.loc["tiny_mlp_benchmark-20261120-101010"]
    expected = json.loads(profile_json)
    assert profile_row["kind"] == "profile" and profile_row["status"] == "ok"
    assert profile_row["mfu"] == pytest.approx(expected["mfu"])
    assert profile_row["arithmetic_intensity"] == pytest.approx(expected["verdict"]["arithmetic_intensity"])
    assert profile_row["peak_bytes_per_s"] == pytest.approx(expected["device"]["peak"]["memory_bytes_per_s"])
    tune_row = runs.loc["gpt-tune-20261129-092208"]
    assert (tune_row["model"], tune_row["device"], tune_row["device_name"]) == ("gpt", "cpu", "AMD EPYC")
    assert tune_row["mfu"] == pytest.approx(0.391) and tune_row["baseline_mfu"] == pytest.approx(0.626)
    assert (tune_row["speedup"], tune_row["speedup_ci_low"], tune_row["speedup_ci_high"]) == (1.548, 1.49, 1.60)
    assert tune_row["trials"] == 4 and tune_row["failures"] == 1  # repeat and rejection not measured
    assert tune_row["report"] == "gpt-tune-20261129-092208/report.md"
    assert "autocast=bfloat16" in tune_row["settings"]
    # Dated by their own `created`, not the folder name; newest first.
    assert profile_row["date"] == pd.Timestamp(expected["created"])
    assert collect(tmp_path).runs["date"].is_monotonic_decreasing


def test_corrupt_folders_are_listed_as_unreadable_and_the_rest_renders(tmp_path, profile_json) -> None:
    write_profile(tmp_path, profile_json)
    write_profile(tmp_path, profile_json[: len(profile_json) // 2], name="broken-20261121-000000")
    bad_toml = write_tune(tmp_path, profile_json, name="gpt-tune-20261122-000000")
    (bad_toml / "tuned_config.toml").write_text("[provenance\ncreated = ")
    bad_csv = write_tune(tmp_path, profile_json, name="gpt-tune-20261123-000000")
    (bad_csv / "trials.csv").write_text("just,a\nheader")
    write_json(tmp_path, "gpt-plan-v5p-8-20261124-000000", "plan.json", [1, 2, 3])
    (tmp_path / "notes").mkdir()
    collection = collect(tmp_path)
    runs = collection.runs.set_index("run")
    reasons = runs.loc[runs["status"] == "unreadable", "reason"].to_dict()
    assert set(reasons) == {
        "broken-20261121-000000",
        "gpt-tune-20261122-000000",
        "gpt-tune-20261123-000000",
        "gpt-plan-v5p-8-20261124-000000",
        "notes",
    }
    assert reasons["broken-20261121-000000"].startswith("profile.json: invalid JSON")
    assert reasons["gpt-tune-20261122-000000"].startswith("tuned_config.toml: invalid TOML")
    assert reasons["gpt-tune-20261123-000000"] == "trials.csv: no 'number' and 'state' columns"
    assert reasons["gpt-plan-v5p-8-20261124-000000"] == "plan.json: expected a JSON object, found list"
    assert "not a tpu-tune run folder" in reasons["notes"]
    assert runs.loc["tiny_mlp_benchmark-20261120-101010", "status"] == "ok"

    page = render_page(collection)
    unreadable = re.search(r'<ul id="unreadable">(.*?)</ul>', page).group(1)
    assert unreadable.count("<li") == 5 and "invalid JSON" in unreadable
    assert 'data-run="tiny_mlp_benchmark-20261120-101010"' in page  # the good run is still in the table


def test_partial_tuning_run_is_running_then_incomplete(tmp_path) -> None:
    folder = tmp_path / "gpt-tune-20261129-120000"
    folder.mkdir()
    (folder / "run.json").write_text("{}")
    collection = collect(tmp_path)
    assert collection.runs.loc[0, "status"] == "running" and collection.live
    assert '<meta http-equiv="refresh" content="10">' in render_page(collection, refresh_s=10)
    assert "Still running: gpt-tune-20261129-120000" in render_page(collection)

    old = time.time() - 3600
    os.utime(folder / "run.json", (old, old))
    collection = collect(tmp_path)
    assert collection.runs.loc[0, "status"] == "incomplete" and not collection.live
    assert "stopped before it finished" in collection.runs.loc[0, "reason"]
    assert "http-equiv" not in render_page(collection)


def test_plans_and_buckets_sections(tmp_path) -> None:
    write_json(
        tmp_path,
        "gpt_70b-plan-v5p-8-20261125-000000",
        "plan.json",
        plan_dict("v5p-8", 4, [0.41, 0.52, None], [True, False, False]),
    )
    write_json(
        tmp_path, "gpt_70b-plan-v5p-16-20261125-010000", "plan.json", plan_dict("v5p-16", 8, [0.38, 0.35], [True, True])
    )
    write_json(tmp_path, "tiny_encoder-buckets-20261126-000000", "buckets.json", buckets_dict())
    collection = collect(tmp_path)
    runs = collection.runs.set_index("run")
    # The best *fitting* layout: 0.52 does not fit.
    assert runs.loc["gpt_70b-plan-v5p-8-20261125-000000", "mfu"] == pytest.approx(0.41)
    assert runs.loc["gpt_70b-plan-v5p-8-20261125-000000", "failures"] == 1  # the compiler refused one layout
    assert runs.loc["tiny_encoder-buckets-20261126-000000", "settings"] == "buckets 64, 128, 256"
    page = render_page(collection)
    assert page.count('<section class="plan">') == 2
    assert 'alt="best predicted MFU against slice size"' in page  # two slice sizes of one model
    assert "over HBM by 1 GiB" in page and "chosen bounds 64, 128, 256; padding waste 12.0%" in page
    assert "No planner result" not in page and "No bucketing result" not in page


def test_step_split_adds_up_to_the_step() -> None:
    compute, memory, exposed = step_split(
        {"step_seconds": 1.2, "compute_seconds": 0.8, "memory_seconds": 0.9, "exposed_comm_seconds": 0.1}
    )
    assert (compute, exposed) == (0.8, 0.1) and compute + memory + exposed == pytest.approx(1.2)


def test_pareto_front_and_knob_importance() -> None:
    trials = pd.read_csv(__import__("io").StringIO(TRIALS_CSV))
    front = pareto_front(trials)
    assert list(front["number"]) == [1, 2, 0]  # fastest, then ever more accurate; repeat 3 excluded
    importance = knob_importance(trials)
    assert set(importance) <= {"execution", "matmul_precision", "autocast"} and importance
    assert sum(importance.values()) == pytest.approx(1.0)
    assert knob_importance(trials.head(1)) == {}  # one trial says nothing


# ---------------------------------------------------------------- command line


def test_cli_writes_an_offline_page_and_prints_its_path(tmp_path, profile_json, capsys) -> None:
    write_profile(tmp_path, profile_json)
    write_tune(tmp_path, profile_json)
    assert main(["dashboard", str(tmp_path)]) == 0
    page_path = tmp_path / "dashboard.html"
    assert capsys.readouterr().out.strip() == str(page_path)
    page = page_path.read_text()
    # Single file, no network: every image is embedded, no external script, style or font.
    images = re.findall(r'<img src="([^"]*)"', page)
    assert len(images) == 4 and all(src.startswith("data:image/png;base64,") for src in images)
    assert not re.search(r'(src|href)="(https?:)?//', page) and "<link" not in page
    assert '<a href="gpt-tune-20261129-092208/report.md">' in page
    assert ">39.1%<" in page and "1.55x [1.49–1.60]" in page


def test_csv_export(tmp_path, profile_json, capsys) -> None:
    write_profile(tmp_path, profile_json)
    write_tune(tmp_path, profile_json)
    (tmp_path / "bad-20261101-000000").mkdir()
    (tmp_path / "bad-20261101-000000" / "profile.json").write_text("{")
    out = tmp_path / "runs.csv"
    assert main(["dashboard", str(tmp_path), "--csv", str(out), "--out", str(tmp_path / "page.html")]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    frame = pd.read_csv(out)
    assert list(frame.columns) == COLUMNS and len(frame) == 3
    assert frame.set_index("run").loc["gpt-tune-20261129-092208", "speedup"] == pytest.approx(1.548)
    bad = frame.set_index("run").loc["bad-20261101-000000"]
    assert bad["status"] == "unreadable" and bad["reason"].startswith("profile.json: invalid JSON")


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_bad_results_dir_is_one_line_and_status_2(tmp_path, capsys, kind) -> None:
    target = tmp_path / "nope"
    if kind == "file":
        target.write_text("x")
    assert main(["dashboard", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(target) in err[0]
    assert ("no such results folder" if kind == "missing" else "not a folder") in err[0]


# ---------------------------------------------------------------- server


@pytest.fixture
def served(tmp_path, profile_json):
    root = tmp_path / "results"
    write_tune(root, profile_json)
    (tmp_path / "secret.txt").write_text("outside the results folder")
    (root / "gpt-tune-20261129-092208" / "escape").symlink_to(tmp_path / "secret.txt")
    with serving(root) as server:
        yield server


def raw_get(server, path: str) -> tuple[int, bytes]:
    """GET `path` exactly as written: http.client does not normalise '..' as browsers do."""
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    connection.request("GET", path)
    response = connection.getresponse()
    status, body = response.status, response.read()
    connection.close()
    return status, body


def test_server_binds_loopback_by_default(served) -> None:
    assert served.server_address[0] == "127.0.0.1"


@pytest.mark.parametrize(
    "path",
    [
        "/../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/..%2f..%2fetc%2fpasswd",
        "/gpt-tune-20261129-092208/../../secret.txt",
        "/gpt-tune-20261129-092208/escape",
        "/%2E%2E/secret.txt",
    ],
)
def test_server_refuses_paths_out_of_the_results_folder(served, path) -> None:
    status, body = raw_get(served, path)
    assert status == 403 and b"root:" not in body and b"outside the results folder" not in body


def test_server_serves_the_page_the_csv_and_files_under_the_folder(served) -> None:
    status, body = raw_get(served, "/")
    assert status == 200 and b'data-run="gpt-tune-20261129-092208"' in body
    status, body = raw_get(served, "/gpt-tune-20261129-092208/report.md")
    assert status == 200 and body == b"# Tuning report: gpt\n"
    status, body = raw_get(served, "/dashboard.csv")
    assert status == 200 and body.decode().splitlines()[0] == ",".join(COLUMNS)
    assert raw_get(served, "/gpt-tune-20261129-092208/missing.png")[0] == 404


def test_server_rerenders_when_a_run_appears(served, profile_json) -> None:
    assert b"tiny_mlp_benchmark-20261120-101010" not in raw_get(served, "/")[1]
    write_profile(served.root, profile_json)
    assert b'data-run="tiny_mlp_benchmark-20261120-101010"' in raw_get(served, "/")[1]


def test_other_host_warns(tmp_path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="tpu_tuner.dashboard.serve"):
        server = make_server(tmp_path, host="0.0.0.0", port=0)
    server.server_close()
    assert any("serving on 0.0.0.0" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_serve_stops_cleanly_on_ctrl_c(tmp_path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "tpu_tuner.cli", "-q", "dashboard", str(tmp_path), "--serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert url, line + process.stderr.read()
        connection = http.client.HTTPConnection("127.0.0.1", int(url.group(1)), timeout=30)
        connection.request("GET", "/")
        assert connection.getresponse().status == 200
        connection.close()
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0 and "stopped" in out and "Traceback" not in err


# ---------------------------------------------------------------- rankings of slices (tpu-tune plan --topology A,B)


def test_a_ranking_of_slices_is_read_with_its_plans_and_shown_as_the_cli_prints_it(tmp_path) -> None:
    folder = write_ranking_folder(tmp_path, ["v5p-8", "v5p-16", "tpu7x-8"])
    collection = collect(tmp_path)
    runs = collection.runs.set_index("run")
    assert runs.loc[folder.name, "kind"] == "ranking" and runs.loc[folder.name, "status"] == "ok"
    assert runs.loc[folder.name, "report"] == f"{folder.name}/ranking.md"
    child = f"{folder.name}/gpt_70b-plan-v5p-8-20261202-000000"
    assert runs.loc[child, "kind"] == "plan" and runs.loc[child, "report"] == f"{child}/plan.md"
    assert runs.loc[child, "mfu"] == pytest.approx(0.41) and len(collection.plans) == 3
    page = render_page(collection)
    section = re.search(r'<section class="ranking">(.*?)</section>', page).group(1)
    rows = re.findall(r"<tr class=\"(\w+)\">(.*?)</tr>", section)
    assert [kind for kind, _ in rows] == ["fits", "fits", "nofit"]  # nothing fits on v5p-16: last
    first = re.sub(r"<[^>]+>", "|", rows[0][1])
    assert "v5p-8" in first and "41.0% ± 4.0" in first and "$4.20" in first  # the MFU band as the CLI prints it
    tokens = 1e5 * 3600 / (4 * 4.2)  # plan_dict's 1e5 tokens/s on 4 chips at $4.20 a chip-hour
    assert f'data-v="{tokens!r}"' in rows[0][1]
    assert "no price" in rows[1][1] and "tpu7x-8" in rows[1][1]
    assert "no point fits in HBM: the closest" in rows[2][1]
    assert 'alt="tokens per dollar and tokens/s per chip with their bands' in section
    assert "scaling-book" in section  # each price's source, linked
    assert page.count('<section class="plan">') == 3


def test_a_ranking_stopped_half_way_is_incomplete_and_a_corrupt_one_unreadable(tmp_path) -> None:
    folder = write_ranking_folder(tmp_path, ["v5p-8"])
    old = time.time() - 3600
    for path in [*folder.rglob("*"), folder]:
        os.utime(path, (old, old))
    broken = tmp_path / "gpt-plan-ranking-20261202-010000"
    broken.mkdir()
    (broken / "ranking.json").write_text(json.dumps({"source": "x", "slices": [1], "topologies": [], "prices": {}}))
    runs = collect(tmp_path).runs.set_index("run")
    assert runs.loc[folder.name, "status"] == "incomplete"
    assert runs.loc[folder.name, "reason"] == "1 of 3 slices planned"
    assert runs.loc[broken.name, "reason"] == "ranking.json: 'slices' is not a list of ranked slices"


# ---------------------------------------------------------------- as a person reads it (issue 37)


def _banded_plan(topology: str, chips: float, exposed: float) -> dict:
    data = plan_dict(topology, int(chips), [0.60, 0.52, None], [True, True, False])
    data["topology"]["chips"] = chips
    for plan in data["plans"]:
        plan["band"] = {
            "points": 12.7,
            "source": "quantile of the rows' leave-one-out errors",
            "reasons": ["extrapolated: no calibration row with full remat on v5p"],
        }
        if plan["prediction"]:
            plan["prediction"]["exposed_comm_seconds"] = exposed
    return data


@pytest.mark.parametrize("chips", [16, 16.0])
def test_a_plan_shows_each_prediction_with_its_band_and_whole_chips(tmp_path, chips: float) -> None:
    write_json(tmp_path, "gpt_70b-plan-v5p-32-20261125-000000", "plan.json", _banded_plan("v5p-32", chips, 0.0))
    page = render_page(collect(tmp_path))
    assert "gpt_70b on v5p-32 (16 chips)" in page and "16.0 chips" not in page and "(? chips)" not in page
    assert "60.0% ± 12.7 points</td>" in page and "52.0% ± 12.7 points</td>" in page
    assert 'title="quantile of the rows&#x27; leave-one-out errors; extrapolated: no calibration row' in page


def test_exposed_comm_the_model_hides_reads_as_not_modelled_never_zero(tmp_path) -> None:
    from tpu_tuner.dashboard.planner_sections import NOT_MODELLED

    write_json(tmp_path, "gpt_70b-plan-v5p-32-20261125-000000", "plan.json", _banded_plan("v5p-32", 16, 0.0))
    write_json(tmp_path, "gpt_70b-plan-v5p-8-20261125-010000", "plan.json", _banded_plan("v5p-8", 4, 0.1))
    page = render_page(collect(tmp_path))
    hidden, exposed = (page.split(f"({n} chips)")[1].split("</table>")[0] for n in (16, 4))
    cells = re.findall(r"<td[^>]*>([^<]*)</td><td>[^<]*</td></tr>", hidden)  # exposed comm, then why
    assert cells == ["–", "–", "n/a"] and ">0 s<" not in hidden and ">0 ms<" not in hidden
    assert re.findall(r">(100 ms)</td><td>[^<]*</td></tr>", exposed) == ["100 ms", "100 ms"]
    assert page.count(html.escape(NOT_MODELLED)) == 1  # under the table that has one


def test_an_inline_shape_plan_is_titled_by_its_shape(tmp_path) -> None:
    shape = "decoder:vocab=256,d_model=128,layers=2,heads=4,mlp=256"
    data = plan_dict("v5e-4", 4, [0.31], [True]) | {"workload": "decoder", "preset": None, "source": shape}
    write_json(tmp_path, "decoder-plan-v5e-4-20261126-000000", "plan.json", data)
    page = render_page(collect(tmp_path))
    assert f"<h3>{shape} on v5e-4 (4 chips)" in page


def _runs_for_plots(names: list[str], peaks: list[float]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "run": [f"{n}-tune-2026111{i}-092208" for i, n in enumerate(names)],
            "kind": "tune",
            "status": "ok",
            "model": names,
            "device": "cpu",
            "device_name": "AMD EPYC 7B13",
            "mfu": 0.39,
            "peak_dtype": "bfloat16",
            "date": pd.Timestamp("2026-11-29", tz="UTC"),
            "arithmetic_intensity": 0.5,
            "achieved_flops_per_s": 3e8,
            "peak_flops_per_s": peaks,
            "peak_bytes_per_s": 34.2e9,
        }
    )


def test_best_mfu_model_names_never_overlap() -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from tpu_tuner.dashboard.mfu_plots import mfu_per_model_figure

    names = [
        "gpt",
        "encoder",
        "resnet18",
        "hf_Qwen2.5-0.5B",
        "hf_Llama-3.2-1B-Instruct",
        "tiny_mlp_benchmark",
        "decoder_moe_long_name",
        "latent_attention",
        "conv_net",
    ]
    fig = mfu_per_model_figure(_runs_for_plots(names, [778e9] * len(names)))
    renderer = FigureCanvasAgg(fig).get_renderer()
    boxes = [label.get_window_extent(renderer) for ax in fig.axes for label in ax.get_yticklabels()]
    assert len(boxes) == len(names)
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if a.overlaps(b)]
    assert min(box.x0 for box in boxes) >= 0  # no name cut at the figure's edge


def test_two_rooflines_of_one_host_say_which_runs_they_are_from() -> None:
    from tpu_tuner.dashboard.mfu_plots import roofline_figure

    runs = _runs_for_plots(["gpt", "encoder", "resnet18"], [698e9, 778e9, 778e9])
    legend = [t.get_text() for t in roofline_figure(runs).axes[0].get_legend().get_texts()]
    roofs = [text for text in legend if "FLOP/s" in text]
    assert roofs[0].startswith("cpu: AMD EPYC 7B13\n  698 GFLOP/s") and "probe of gpt-tune-20261110-092208" in roofs[0]
    assert "probe of encoder-tune-20261111-092208\n  and of 1 more run(s)" in roofs[1]
    one_roof = roofline_figure(_runs_for_plots(["gpt", "encoder"], [778e9, 778e9]))
    assert not [t for t in one_roof.axes[0].get_legend().get_texts() if "probe of" in t.get_text()]
