"""benchmarks/planner/published_runs.toml: published MaxText / tpu-recipes training runs with their recipes.

The file is data for the planner's calibration (docs/published-runs.md says where each row comes
from); these tests keep it well-formed: every row has the whole recipe with sane values, the
layout multiplies out to the slice, the MFU follows from the published figure, every source is a
GitHub file at a commit, and the runs held out for checking the planner stay out.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

import pytest

FILE = Path(__file__).resolve().parent.parent / "benchmarks" / "planner" / "published_runs.toml"
DATA = tomllib.loads(FILE.read_text())
RUNS = DATA["run"]
INCOMPLETE = DATA["incomplete"]

MIN_RUNS = 48  # what was found (docs/published-runs.md); superseded re-measurements included
MIN_CURRENT_RUNS = 42  # rows whose figure is the source's current one (superseded_by == "")

PEAK = {"v4": 275.0, "v5e": 197.0, "v5p": 459.0, "v6e": 918.0, "tpu7x": 2307.0}
DEVICES_PER_CHIP = {"v4": 1, "v5e": 1, "v5p": 1, "v6e": 1, "tpu7x": 2}
ICI = [
    "ici_data",
    "ici_fsdp",
    "ici_fsdp_transpose",
    "ici_tensor",
    "ici_expert",
    "ici_sequence",
    "ici_context",
    "ici_pipeline",
]
DCN = ["dcn_data", "dcn_fsdp", "dcn_tensor", "dcn_expert", "dcn_pipeline"]
REMAT_NAMED = {
    "full",
    "minimal",
    "custom",
    "none",
    "minimal_with_context",
    "minimal_offloaded",
    "save_qkv_proj",
    "qkv_proj_offloaded",
    "save_dot_except_mlp",
    "save_dot_except_mlpwi",
    "save_dot_with_context_except_mlp",
    "save_out_proj",
}
CALIBRATION = {
    "v5p-synthetic-32b-v5p-128",
    "v5p-synthetic-128b-v5p-256",
    "v5e-synthetic-16b-v5e-256",
    "llama3.1-8b-v6e-256",
    "llama3.1-70b-v6e-256",
    "mixtral-8x7b-v6e-256-pdb12",
    "llama3.1-70b-tpu7x-4x4x4",
}
HEX40 = re.compile(r"^[0-9a-f]{40}$")
BLOB = re.compile(
    r"^https://github\.com/AI-Hypercomputer/(maxtext|tpu-recipes)/blob/([0-9a-f]{40})/[^\s#]+(#L\d+(-L\d+)?)?$"
)

REQUIRED: dict[str, type | tuple[type, ...]] = {
    "id": str,
    "model": str,
    "synthetic": bool,
    "d_model": int,
    "layers": int,
    "heads": int,
    "kv_heads": int,
    "head_dim": int,
    "mlp": int,
    "moe_mlp": int,
    "mlp_activations": list,
    "vocab": int,
    "experts": int,
    "top_k": int,
    "shared_experts": int,
    "moe_layer_interval": int,
    "capacity_factor": float,
    "moe_impl": str,
    "tied_embeddings": bool,
    "attention": str,
    "attention_pattern": str,
    "attention_window": int,
    "generation": str,
    "topology": str,
    "slices": int,
    "chips": int,
    "devices_per_chip": int,
    "devices": int,
    **{axis: int for axis in ICI + DCN},
    "layout_as_written": str,
    "remat": str,
    "remat_tensors": dict,
    "per_device_batch": float,
    "global_batch": float,
    "seq": int,
    "opt_type": str,
    "mu_dtype": str,
    "weight_dtype": str,
    "dtype": str,
    "quantization": str,
    "step_s": float,
    "tflops_per_device": float,
    "tflops_per_chip": float,
    "mfu": float,
    "mfu_as_published": bool,
    "mfu_basis": str,
    "mfu_published_elsewhere": float,
    "mfu_source_url": str,
    "figures_published": list,
    "peak_tflops_per_chip": float,
    "flops_convention": str,
    "flops_check": float,
    "in_calibration": bool,
    "superseded_by": str,
    "source_url": str,
    "source_commit": str,
    "source_file": str,
    "source_repo": str,
    "published_commit": str,
    "date": str,
    "config_url": str,
    "config_commit": str,
    "model_config_url": str,
    "notes": str,
}


def ids(rows):
    return [r["id"] for r in rows]


def test_enough_rows_and_unique_ids():
    assert len(RUNS) >= MIN_RUNS
    assert sum(1 for r in RUNS if not r["superseded_by"]) >= MIN_CURRENT_RUNS
    all_ids = ids(RUNS) + ids(INCOMPLETE)
    assert len(all_ids) == len(set(all_ids))


def test_coverage_across_generations_remat_and_moe():
    current = [r for r in RUNS if not r["superseded_by"]]
    assert {r["generation"] for r in current} == set(PEAK)
    assert {"full", "minimal", "custom"} <= {r["remat"] for r in current}
    tensor_choices = {v for r in current for v in r["remat_tensors"].values()}
    assert {"remat", "device", "offload"} <= tensor_choices
    assert any(r["experts"] > 0 for r in current) and any(r["experts"] == 0 for r in current)
    assert len({r["seq"] for r in current}) >= 5


@pytest.mark.parametrize("row", RUNS, ids=ids(RUNS))
def test_row_has_every_key_with_its_type(row):
    for key, kind in REQUIRED.items():
        assert key in row, key
        value = row[key]
        if kind is float:
            assert isinstance(value, (int, float)) and not isinstance(value, bool), key
        else:
            assert isinstance(value, kind), key


@pytest.mark.parametrize("row", RUNS, ids=ids(RUNS))
def test_model_shape_is_sane(row):
    assert row["d_model"] > 0 and row["layers"] > 0 and row["vocab"] > 0 and row["mlp"] > 0
    assert row["heads"] >= row["kv_heads"] >= 1 and row["heads"] % row["kv_heads"] == 0
    assert row["head_dim"] in (64, 128, 256)
    assert 1 <= len(row["mlp_activations"]) <= 2
    if row["experts"]:
        assert 1 <= row["top_k"] <= row["experts"] and row["moe_mlp"] > 0 and row["moe_layer_interval"] >= 1
        assert row["capacity_factor"] == -1.0 or row["capacity_factor"] >= 1.0  # -1: dropless
        assert row["moe_impl"]
    else:
        assert row["top_k"] == row["moe_mlp"] == row["shared_experts"] == row["moe_layer_interval"] == 0
        assert row["capacity_factor"] == 0.0 and row["moe_impl"] == ""
    assert row["attention_window"] >= 0


@pytest.mark.parametrize("row", RUNS, ids=ids(RUNS))
def test_layout_multiplies_out_to_the_slice(row):
    gen = row["generation"]
    assert gen in PEAK
    assert row["devices_per_chip"] == DEVICES_PER_CHIP[gen]
    assert all(row[axis] >= 1 for axis in ICI + DCN)
    ici = math.prod(row[axis] for axis in ICI)
    dcn = math.prod(row[axis] for axis in DCN)
    assert row["devices"] == ici * dcn
    assert row["chips"] * row["devices_per_chip"] == row["devices"]
    assert dcn == row["slices"]  # multi-slice runs put the slices on DCN data parallelism
    # the topology names the slice: v4/v5p count TensorCores (two per chip), v5e/v6e chips, TPU7x a torus
    per_slice = row["chips"] // row["slices"]
    topo = row["topology"]
    if gen in ("v4", "v5p"):
        assert topo == f"{gen}-{2 * per_slice}"
    elif gen in ("v5e", "v6e"):
        assert topo == f"{gen}-{per_slice}"
    else:
        dims = [int(d) for d in topo.removeprefix("tpu7x-").split("x")]
        assert math.prod(dims) == per_slice
    assert row["global_batch"] == pytest.approx(row["per_device_batch"] * row["devices"])


@pytest.mark.parametrize("row", RUNS, ids=ids(RUNS))
def test_recipe_fields(row):
    assert row["remat"] in REMAT_NAMED
    if row["remat"] == "custom":
        assert row["remat_tensors"], "a custom policy names its tensors"
        assert set(row["remat_tensors"].values()) <= {"remat", "device", "offload"}
        assert "decoder_layer_input" in row["remat_tensors"]
    else:
        assert row["remat_tensors"] == {}
    assert row["per_device_batch"] > 0 and row["seq"] >= 1024
    assert row["dtype"] == "bfloat16"
    assert row["weight_dtype"] in ("float32", "bfloat16")
    assert row["opt_type"] in ("adamw", "adam_pax", "adam", "sgd")
    assert row["opt_type"] != "adam" or row["date"] < "2023-06-01"  # optax.adam: MaxText's train.py of early 2023
    if row["opt_type"] == "sgd":
        assert row["mu_dtype"].startswith("n/a")
    else:
        assert row["mu_dtype"] in ("float32", "bfloat16")
    assert row["quantization"] in ("none", "fp8_full")
    # MaxText's layers ran dot-product attention until 5b0e28e (2023-09-06) brought flash attention
    assert row["attention"].startswith("flash") or (
        row["attention"].startswith("dot-product") and row["date"] < "2023-09-06"
    )


@pytest.mark.parametrize("row", RUNS, ids=ids(RUNS))
def test_figures_and_mfu(row):
    figs = set(row["figures_published"])
    assert figs and figs <= {"step_s", "tflops_per_device", "tflops_per_chip", "mfu"}
    assert (row["step_s"] > 0) == ("step_s" in figs)
    assert row["peak_tflops_per_chip"] == PEAK[row["generation"]]
    assert 0.0 < row["mfu"] < 1.0
    assert row["tflops_per_chip"] == pytest.approx(row["tflops_per_device"] * row["devices_per_chip"], rel=1e-3)
    assert row["mfu_as_published"] == ("mfu" in figs)
    if row["mfu_as_published"]:
        # a published MFU agrees with the published TFLOP/s where both are given (tables round TFLOP/s)
        if figs & {"tflops_per_device", "tflops_per_chip"}:
            assert row["mfu"] == pytest.approx(row["tflops_per_chip"] / row["peak_tflops_per_chip"], abs=0.004)
    else:
        assert figs & {"tflops_per_device", "tflops_per_chip"}
        assert row["mfu"] == pytest.approx(row["tflops_per_chip"] / row["peak_tflops_per_chip"], abs=5e-5)
    if row["mfu_published_elsewhere"]:
        assert BLOB.match(row["mfu_source_url"])
        assert row["mfu_published_elsewhere"] == pytest.approx(row["mfu"], abs=0.001)
    assert row["flops_convention"] in DATA["schema"]["flops_conventions"]
    # MaxText's own tables count FLOPs as its train.py did that day: no attention term before
    # 0e65013 (2023-06-02), attention in full until 64ee4e9 (2023-11-08), then causal-halved.
    spans = {"A0": ("2000", "2023-06-02"), "A1": ("2023-06-02", "2023-11-08"), "A": ("2023-11-08", "2024-05-08")}
    if row["flops_convention"] in spans:
        first, until = spans[row["flops_convention"]]
        assert first <= row["date"] < until, (row["id"], row["flops_convention"], row["date"])
    # where the recipe's model FLOPs were recomputed, they reproduce the published TFLOP/s x step time
    assert row["flops_check"] == 0.0 or abs(row["flops_check"] - 1.0) < 0.002


@pytest.mark.parametrize("row", RUNS, ids=ids(RUNS))
def test_sources_are_files_at_commits(row):
    match = BLOB.match(row["source_url"])
    assert match, row["source_url"]
    assert match.group(2) == row["source_commit"]
    assert row["source_url"].split(row["source_commit"] + "/", 1)[1] == row["source_file"]
    assert row["source_repo"] == f"AI-Hypercomputer/{match.group(1)}"
    for key in ("source_commit", "published_commit", "config_commit"):
        assert HEX40.match(row[key]), key
    assert BLOB.match(row["config_url"]) and row["config_commit"] in row["config_url"]
    assert BLOB.match(row["model_config_url"])
    assert re.match(r"^20\d\d-\d\d-\d\d$", row["date"])
    assert "/work/" not in row["source_url"] + row["config_url"] + row["model_config_url"]


def test_superseded_rows_point_at_a_current_row_of_the_same_recipe():
    by_id = {r["id"]: r for r in RUNS}
    for row in RUNS:
        if row["superseded_by"]:
            newer = by_id[row["superseded_by"]]
            assert not newer["superseded_by"]
            for key in ("model", "topology", "per_device_batch", "seq", "remat", "remat_tensors", "ici_fsdp"):
                assert row[key] == newer[key], (row["id"], key)
            assert row["date"] <= newer["date"]


def test_calibration_rows_are_the_seven():
    assert {r["id"] for r in RUNS if r["in_calibration"]} == CALIBRATION


def test_kept_aside_runs_are_absent():
    held_out = re.compile(r"llama-?2-?70b|gpt-?3-?175b|405b|deepseek-?v3|deepseek3|671b", re.IGNORECASE)
    for row in RUNS + INCOMPLETE:
        assert not held_out.search(row["id"]), row["id"]
        assert not held_out.search(row["model"]), row["id"]
    synthetic = [r for r in RUNS if r["synthetic"]]
    # MaxText's synthetic-scale tables (v5e / v5p, 16B ... 1024B): only the three already in calibration
    assert {r["id"] for r in synthetic if r["generation"] in ("v5e", "v5p")} == {
        "v5p-synthetic-32b-v5p-128",
        "v5p-synthetic-128b-v5p-256",
        "v5e-synthetic-16b-v5e-256",
    }
    # v4's 22B / 52B configs (the brief's megacore-era example): single-slice rows only
    v4 = [r for r in synthetic if r["generation"] == "v4"]
    assert len(v4) <= 2 and all(r["slices"] == 1 for r in v4)
    assert {r["generation"] for r in synthetic} <= {"v4", "v5e", "v5p"}


@pytest.mark.parametrize("row", INCOMPLETE, ids=ids(INCOMPLETE))
def test_incomplete_rows_say_what_is_missing(row):
    for key in ("id", "model", "generation", "topology", "figure", "source_url", "source_commit", "missing", "notes"):
        assert key in row, key
    assert row["generation"] in PEAK
    assert isinstance(row["missing"], list) and row["missing"] and all(isinstance(m, str) and m for m in row["missing"])
    match = BLOB.match(row["source_url"])
    assert match and match.group(2) == row["source_commit"]
