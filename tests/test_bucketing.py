"""Shape bucketing: the exact optimiser, the baselines, the runtime padding helper, length files
and the `tpu-tune buckets` command."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FIXTURES

from tpu_tuner.bucketing import (
    BucketCostModel,
    LengthHistogram,
    bucket_for,
    evaluate,
    optimal_buckets,
    pad_to_bucket,
    read_lengths,
)
from tpu_tuner.core.errors import UserInputError
from tpu_tuner.model.buckets.bucket_choice import Strategy, baselines, oracle_seconds
from tpu_tuner.model.buckets.bucket_cost import fit_cost_model


def _random_case(rng: np.random.Generator) -> tuple[LengthHistogram, BucketCostModel, int, int, int]:
    hist = LengthHistogram.from_sample(rng.integers(1, 70, rng.integers(2, 40)))
    model = BucketCostModel(
        float(rng.uniform(0, 5)),
        (float(rng.uniform(0, 0.01)), float(rng.uniform(0, 1e-3)), float(rng.uniform(0, 1e-5))),
    )
    return hist, model, int(rng.integers(1, 5)), int(rng.choice([1, 4, 8])), int(rng.integers(10, 5000))


def _brute_force(hist: LengthHistogram, model: BucketCostModel, max_buckets: int, align: int, steps: int) -> float:
    candidates = sorted(set(((hist.lengths + align - 1) // align * align).tolist()))
    return min(
        evaluate(Strategy("b", (*chosen, candidates[-1])), hist, model, steps).total_seconds
        for size in range(max_buckets)
        for chosen in itertools.combinations(candidates[:-1], size)
    )


def test_the_optimiser_equals_brute_force_on_small_cases() -> None:
    rng = np.random.default_rng(7)
    for _ in range(60):
        hist, model, max_buckets, align, steps = _random_case(rng)
        strategy = optimal_buckets(hist, model, steps, max_buckets, align)
        assert len(strategy.bounds) <= max_buckets and all(b % align == 0 for b in strategy.bounds)
        got = evaluate(strategy, hist, model, steps).total_seconds
        assert got == pytest.approx(_brute_force(hist, model, max_buckets, align, steps), rel=1e-9)


def test_the_optimiser_never_loses_to_a_baseline_under_the_model() -> None:
    """With limits that admit every baseline (as many buckets as lengths, any alignment)."""
    rng = np.random.default_rng(11)
    for _ in range(40):
        hist, model, _, _, steps = _random_case(rng)
        best = evaluate(optimal_buckets(hist, model, steps, len(hist.lengths), 1), hist, model, steps).total_seconds
        for baseline in baselines(hist):
            assert best <= evaluate(baseline, hist, model, steps).total_seconds * (1 + 1e-12)
        assert best >= oracle_seconds(hist, model, steps)  # the oracle is a lower bound


def test_compile_cost_decides_how_many_buckets() -> None:
    hist = LengthHistogram.from_sample(np.arange(1, 513))
    cheap = optimal_buckets(hist, BucketCostModel(0.001, (0.0, 1e-3, 0.0)), 10_000, 64, 8)
    dear = optimal_buckets(hist, BucketCostModel(1e6, (0.0, 1e-3, 0.0)), 10_000, 64, 8)
    assert len(cheap.bounds) == 64 and dear.bounds == (512,)


def test_the_optimiser_takes_100k_samples_with_10k_distinct_lengths() -> None:
    sample = np.random.default_rng(0).integers(1, 10_001, 100_000)
    hist = LengthHistogram.from_sample(sample)
    assert len(hist.lengths) == 10_000
    strategy = optimal_buckets(hist, BucketCostModel(20.0, (0.002, 1e-5, 1e-9)), 20_000, 8, 1)
    assert len(strategy.bounds) <= 8 and strategy.bounds[-1] == 10_000


def test_baselines_cover_every_length() -> None:
    hist = LengthHistogram.from_sample([3, 100, 129, 1000])
    by_name = {s.name: s.bounds for s in baselines(hist)}
    assert by_name["powers of two"] == (4, 8, 16, 32, 64, 128, 256, 512, 1024)
    assert by_name["multiples of 128"] == (128, 256, 384, 512, 640, 768, 896, 1024)
    assert by_name["pad to max"] == (1000,) and by_name["no bucketing"] == (3, 100, 129, 1000)
    evaluation = evaluate(Strategy("x", (128, 1024)), hist, BucketCostModel(1.0, (0.0, 1.0, 0.0)), 4, max_buckets=1)
    assert evaluation.compiled_shapes == 2 and not evaluation.within_limits
    assert evaluation.padding_waste == pytest.approx(1 - 1232 / (128 + 128 + 1024 + 1024))


def test_the_step_time_fit_recovers_a_known_curve() -> None:
    truth = (0.004, 2e-5, 3e-8)
    points = [(n, truth[0] + truth[1] * n + truth[2] * n * n) for n in (16, 64, 256, 512, 1024)]
    model = fit_cost_model(points, [(16, 10.0), (64, 12.0), (1024, 30.0)])
    assert model.coefficients == pytest.approx(truth, rel=1e-6)
    assert model.fit_max_relative_error < 1e-9 and model.compile_seconds == 12.0


def test_padding_pads_to_the_bucket_with_a_mask() -> None:
    rows = [torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6, 7, 8])]
    padded, mask = pad_to_bucket(rows, [4, 8, 16], pad_value=0)
    assert padded.tolist() == [[1, 2, 3, 0, 0, 0, 0, 0], [4, 5, 6, 7, 8, 0, 0, 0]]
    assert mask.tolist() == [[True] * 3 + [False] * 5, [True] * 5 + [False] * 3]
    stacked = torch.arange(12).view(2, 6)
    padded, mask = pad_to_bucket(stacked, [8], lengths=[6, 2])
    assert padded.tolist() == [[0, 1, 2, 3, 4, 5, 0, 0], [6, 7, 0, 0, 0, 0, 0, 0]] and mask.sum().item() == 8
    assert bucket_for(8, [16, 8]) == 8 and bucket_for(9, [8, 16]) == 16


def test_padding_never_truncates() -> None:
    with pytest.raises(ValueError, match="never truncate"):
        pad_to_bucket([torch.zeros(9)], [4, 8])


def test_length_files(tmp_path) -> None:
    (tmp_path / "plain.txt").write_text("12\n\n7\n300\n")
    assert read_lengths(tmp_path / "plain.txt").tolist() == [12, 7, 300]
    (tmp_path / "table.csv").write_text("id,length\na,5\nb,17\n")
    assert read_lengths(tmp_path / "table.csv").tolist() == [5, 17]
    for name, text, problem in [
        ("empty.txt", "\n", "empty"),
        ("bad.txt", "12\nabc\n", "line 2: 'abc'"),
        ("zero.txt", "0\n", "line 1"),
        ("frac.txt", "2.5\n", "line 1"),
        ("nocol.csv", "id,name\n1,x\n", "no length column"),
    ]:
        (tmp_path / name).write_text(text)
        with pytest.raises(UserInputError, match=problem) as caught:
            read_lengths(tmp_path / name)
        assert name in str(caught.value)


def test_held_out_lengths_get_the_chosen_bounds_beside_strategies_made_from_them() -> None:
    from tpu_tuner.bucketing.heldout import covering, held_out

    model = BucketCostModel(2.0, (0.01, 1e-4, 0.0))
    chosen = Strategy("optimal (DP)", (16, 64), "exact")
    held = LengthHistogram.from_sample([5, 20, 20, 60, 70, 129])
    covered, added = covering(chosen, held, 8)
    assert added == [72, 136] and covered.bounds == (16, 64, 72, 136) and "2 bound(s)" in covered.note
    assert covering(chosen, LengthHistogram.from_sample([3, 64]), 8) == (chosen, [])
    result = held_out(chosen, held, Path("/data/held.csv"), model, 1000, 8, 8)
    assert result.source == "held.csv" and result.samples == 6 and result.distinct_lengths == 5
    names = [e.strategy.name for e in result.table]
    assert names == ["optimal (DP)", "no bucketing", "pad to max", "powers of two", "multiples of 128"]
    assert result.table[1].strategy.bounds == (5, 20, 60, 70, 129)  # one shape per held-out length
    powers = next(e for e in result.table if e.strategy.name == "powers of two")
    assert result.predicted_ratio() == pytest.approx(result.table[0].total_seconds / powers.total_seconds)


@pytest.mark.parametrize("flag", ["--lengths", "--heldout-lengths"])
def test_a_missing_length_file_exits_2_with_one_line(tmp_path, flag: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tpu_tuner.cli", "buckets", str(FIXTURES / "tiny_encoder.py"), flag, "nowhere.txt"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("tpu-tune: error: nowhere.txt: no such") and line.endswith("lengths file")


def test_bad_lengths_file_exits_2_with_one_line(tmp_path) -> None:
    bad = tmp_path / "lengths.txt"
    bad.write_text("10\n-3\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpu_tuner.cli",
            "buckets",
            str(FIXTURES / "tiny_encoder.py"),
            "--lengths",
            str(bad),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "lengths.txt" in lines[0] and "line 2" in lines[0]


# Slow (25-45 s): the default run covers the command through test_run_outputs' CLI-and-API test. Timed:
# it times compiles and steps at each probe length, and beside another test it took 149 s (43 s alone).
@pytest.mark.slow
@pytest.mark.timed
def test_buckets_command_end_to_end(tmp_path) -> None:
    # Held-out lengths the buckets were not chosen on, one past the sample's longest (64).
    heldout, out = tmp_path / "heldout.txt", tmp_path / "out"
    heldout.write_text("\n".join(map(str, [4, 6, 6, 10, 14, 14, 22, 33, 45, 45, 70])) + "\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpu_tuner.cli",
            "buckets",
            str(FIXTURES / "tiny_encoder.py"),
            "--compile-backend",
            "aot_eager",
            "--steps",
            "1000",
            "--max-buckets",
            "3",
            "--replay",
            "12",
            "--heldout-lengths",
            str(heldout),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = out.iterdir()
    data = json.loads((run_dir / "buckets.json").read_text())
    chosen = data["chosen_buckets"]
    assert 1 <= len(chosen) <= 3 and chosen[-1] >= 64 and all(b % 8 == 0 for b in chosen)
    names = [row["strategy"]["name"] for row in data["table"]]
    assert names == ["optimal (DP)", "no bucketing", "pad to max", "powers of two", "multiples of 128"]
    assert len(data["cost_model"]["fit_points"]) >= 3 and data["cost_model"]["compile_seconds"] > 0
    # The replays ran on the held-out stream, under the chosen bounds (a bound added for 70) and
    # the strategies made from the held-out lengths; the sample's table keeps its predictions only.
    held = data["heldout"]
    assert held["samples"] == 11 and held["added_bounds"] == [72]
    assert [row["strategy"]["name"] for row in held["table"]] == names
    assert held["table"][0]["strategy"]["bounds"][-1] == 72 and held["table"][1]["strategy"]["bounds"][-1] == 70
    replayed = {r["strategy"]: r for r in data["replays"]}
    assert "optimal (DP)" in replayed and replayed["pad to max"]["compiled_shapes"] == 1
    assert all(r["compile_seconds"] > 0 and r["stream_steps"] == 12 for r in replayed.values())
    assert "held-out lengths (heldout.txt)" in data["replay_note"]
    assert "held-out lengths heldout.txt: 11 lengths" in result.stdout and "measured vs powers of two" in result.stdout
    config = tomllib.loads((run_dir / "bucket_config.toml").read_text())
    assert config["bucketing"]["buckets"] == chosen
    assert "## Held-out lengths" in (run_dir / "buckets.md").read_text()
    for name in ("buckets.md", "length_histogram.png", "strategy_totals.png"):
        assert (run_dir / name).stat().st_size > 0
    assert (run_dir / "workers.log").is_file()  # the workers' own output, kept off the terminal
    assert "chosen buckets:" in result.stdout


@pytest.mark.slow  # a whole run end to end, no clock (--time-budget none): .ci/run's full pass
# Timed: the bucket cost model is fitted to the steps measured at each length; on a host busy with
# other work the slope drowned in noise once, one bucket won, and its expectation was the plain step.
@pytest.mark.timed
def test_tune_includes_the_best_buckets_when_inputs_vary(tmp_path) -> None:
    """The main study: a workload with a length sample gets each trial's best bucketing in its
    objective, and the chosen setting's buckets in the tuned config and report."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpu_tuner.cli",
            "tune",
            str(FIXTURES / "tiny_encoder.py"),
            "--trials",
            "2",
            "--time-budget",
            "none",
            "--verify-rounds",
            "3",
            "--steps",
            "2000",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    import pandas as pd

    trials = pd.read_csv(run_dir / "trials.csv")
    measured = trials[trials["state"] == "COMPLETE"]
    assert measured["buckets"].notna().all()
    for _, row in measured.iterrows():
        bounds = json.loads(row["buckets"])
        assert bounds[-1] >= 64 and len(bounds) <= 8
        # The objective is the bucketed expectation, not the step at the reference length.
        assert row["amortised_step_s"] != pytest.approx(row["step_median_s"] + row["compile_s"] / 2000, rel=1e-6)
    config = tomllib.loads((run_dir / "tuned_config.toml").read_text())
    assert config["bucketing"]["buckets"][-1] >= 64
    assert "Shape buckets" in (run_dir / "report.md").read_text()
