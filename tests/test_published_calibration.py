"""The calibration rows built from benchmarks/planner/published_runs.toml
(benchmarks/planner/published_calibration.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tpu_tuner.model.decoders.decoder_shape import read_shape
from tpu_tuner.planner.calibration.fitting import RERUNS_FILE, noise_floor
from tpu_tuner.planner.compiler.remat import parse_remat
from tpu_tuner.planner.prediction.band import conformal_quantile
from tpu_tuner.planner.topology import parse_topology

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks" / "planner"))
from published_calibration import load_runs, published_rows, why_not


def test_every_expressible_current_run_is_a_row_and_every_other_says_why() -> None:
    rows, excluded = published_rows()
    runs = load_runs()
    assert len(rows) + len(excluded) == len(runs) and len(rows) >= 20
    reasons = dict(excluded)
    assert all(r["id"] in reasons for r in runs if r["superseded_by"])
    # Gemma 4 E2B / E4B: per-layer inputs, KV-shared layers (E2B: with double-wide MLPs there).
    e2b = read_shape(next(row for row in rows if row.id == "gemma4-e2b-tpu7x-4x4x4").spec)[0]
    assert (e2b.per_layer_input, e2b.kv_shared_layers, e2b.double_wide_mlp, e2b.global_every) == (256, 20, True, 5)
    e4b = read_shape(next(row for row in rows if row.id == "gemma4-e4b-tpu7x-4x4x4").spec)[0]
    assert (e4b.per_layer_input, e4b.kv_shared_layers, e4b.double_wide_mlp, e4b.global_every) == (256, 18, False, 6)
    gemma3 = next(row for row in rows if row.id == "gemma3-12b-v6e-256-seq32k")  # 5 local : 1 global
    assert "sliding_window=1024,global_every=6" in gemma3.spec
    by_id = {row.id: row for row in rows}
    assert by_id["llama3.1-70b-v6e-32"].weight_dtype == "bfloat16"  # MaxText's weight_dtype
    assert by_id["llama3.1-70b-tpu7x-4x4x4-fp8"].quantization == "fp8"  # MaxText's fp8_full
    for row in rows:
        shape, _, _ = read_shape(row.spec)  # every spec is a valid decoder shape
        topology = parse_topology(row.topology)
        assert row.layout.devices == topology.chips * topology.chip.devices_per_chip * row.slices
        assert row.global_batch == row.per_device_batch * row.layout.devices
        assert parse_remat(row.remat).family == row.remat_family and shape.max_seq_len >= row.seq


def test_rows_carry_the_recipe_as_published() -> None:
    rows = {r.id: r for r in published_rows()[0]}
    v4 = rows["v4-synthetic-22b-v4-128"]  # 2023 synthetic shape at the published batch, one device per chip
    assert "head_dim=256" in v4.spec and "activation=relu" in v4.spec and "gated=false" in v4.spec
    assert "tied_embeddings=true" in v4.spec and v4.per_device_batch == 16 and v4.global_batch == 16 * 64
    # March / April 2023: base.yml's max_target_length 1024, TFLOP/s without attention (issue 29)
    assert v4.seq == 1024 and v4.attention == "none"
    assert rows["v4-synthetic-52b-v4-384"].topology == "v4:4x4x12" and rows["v4-synthetic-52b-v4-384"].seq == 1024
    assert rows["v5e-synthetic-16b-v5e-256"].attention == "full"  # October 2023: attention counted in full
    assert (
        rows["v5p-synthetic-32b-v5p-128"].per_device_batch == 8 and rows["v5p-synthetic-32b-v5p-128"].remat == "minimal"
    )
    tpu7x = rows["llama3.1-70b-tpu7x-4x4x4"]
    assert tpu7x.topology == "tpu7x:4x4x4" and tpu7x.mu_dtype == "bfloat16" and tpu7x.attention == "causal"
    assert rows["llama3.1-8b-v6e-256"].attention == "full"  # convention B: attention counted in full
    assert (
        rows["mixtral-8x7b-v6e-256-pdb8-full"].remat == "full"
        and "experts=8" in rows["mixtral-8x7b-v6e-256-pdb8-full"].spec
    )
    # gpt-oss-120b on TPU7x (MaxText's gpt-oss-120b.yml at 998b3e3 and the recipe's flags): 128 experts
    # top 4, dropless, biased router and experts, clamped SwiGLU, window 128 / global with sinks and
    # q/k/v/o biases, float32 weights, data 2 x fsdp 64, the layer input and mlpwo offloaded.
    gpt_oss = rows["gpt-oss-120b-tpu7x-4x4x4"]
    shape, _, _ = read_shape(gpt_oss.spec)
    assert (shape.experts, shape.top_k, shape.moe_routing, shape.router, shape.activation) == (
        128,
        4,
        "dropless",
        "topk_softmax",
        "clamped_swiglu",
    )
    assert shape.router_bias and shape.expert_bias and shape.attention_sinks and shape.qkv_bias and shape.out_bias
    assert (shape.sliding_window, shape.global_every, shape.d_model, shape.layers, shape.vocab) == (
        128,
        2,
        2880,
        36,
        201088,
    )
    assert (gpt_oss.weight_dtype, gpt_oss.topology, gpt_oss.global_batch) == ("float32", "tpu7x:4x4x4", 1280)
    assert (gpt_oss.layout.data, gpt_oss.layout.fsdp, gpt_oss.layout.tensor) == (2, 64, 1)
    assert gpt_oss.remat == "custom:decoder_layer_input=offload,mlpwo=offload" and gpt_oss.attention == "causal"
    assert rows["gpt-oss-120b-tpu7x-4x8x8"].layout.data == 8
    assert {r.optimizer for r in rows.values() if r.id != "custom-moe-700b-v6e-256"} == {"adamw"}


def test_the_700b_sgd_moe_is_compiled_as_published() -> None:
    # MaxText's custom_moe_700b (benchmarks/maxtext_trillium_model_configs.py at 3662540): opt_type
    # sgd, remat_policy custom offloading the layer input and q/k/v/out projections, dropping MoE.
    row = {r.id: r for r in published_rows()[0]}["custom-moe-700b-v6e-256"]
    assert row.optimizer == "sgd" and row.weight_dtype == "bfloat16"
    assert (
        row.remat
        == (
            "custom:decoder_layer_input=offload,query_proj=offload,key_proj=offload,value_proj=offload,out_proj=offload"
        )
        and row.remat_family == "offload"
    )
    assert (
        "d_model=8192,layers=56,heads=128,kv_heads=8,head_dim=256,mlp=32768" in row.spec
        and "experts=16,top_k=2,moe_every=1,capacity_factor=1.5" in row.spec
    )
    assert row.layout.fsdp == 16 and row.layout.expert == 16 and row.layout.devices == 256
    assert row.global_batch == 256 and row.seq == 8192 and row.topology == "v6e-256"
    # Only MFU is published, in convention B (attention counted in full).
    assert row.published_mfu == 0.381 and row.attention == "full"


def test_runs_the_planner_cannot_express_are_refused() -> None:
    base = {r["id"]: r for r in load_runs()}["llama3.1-8b-v6e-8"]
    assert why_not(base) is None
    assert "superseded" in why_not({**base, "superseded_by": "x"})
    assert why_not({**base, "quantization": "fp8_full"}) is None  # compiled quantized (--quantization fp8)
    assert "'fp8'" in why_not({**base, "quantization": "fp8"})  # MaxText's GPU fp8: no TPU program
    assert "2 slices but dcn_data x dcn_fsdp = 1" in why_not({**base, "slices": 2})
    assert why_not({**base, "slices": 2, "dcn_data": 2}) is None  # multi-slice: --slices 2, data over DCN
    assert why_not({**base, "experts": 16, "top_k": 2, "capacity_factor": -1.0}) is None  # dropless
    gpt_oss = {r["id"]: r for r in load_runs()}["gpt-oss-120b-tpu7x-4x4x4"]
    assert why_not(gpt_oss) is None  # its clamped SwiGLU and biased router and experts are shape keys
    # ["sigmoid", "linear"] is the clamped SwiGLU of MaxText's gpt_oss block only: elsewhere a plain sigmoid GLU.
    assert "MLP activations ['sigmoid', 'linear']" in why_not({**base, "mlp_activations": ["sigmoid", "linear"]})
    assert why_not({**base, "opt_type": "sgd"}) is None
    assert why_not({**base, "opt_type": "muon"}) == "optimizer muon: the planner compiles adamw or sgd"


def test_the_noise_floor_is_the_published_reruns() -> None:
    runs = {r["id"]: r for r in load_runs()}
    differences = [(r["mfu"] - runs[r["superseded_by"]]["mfu"]) * 100 for r in runs.values() if r["superseded_by"]]
    shipped = json.loads(RERUNS_FILE.read_text())
    assert [d["difference_points"] for d in shipped] == pytest.approx(differences, abs=0.01)
    assert noise_floor() == pytest.approx(conformal_quantile([abs(d) for d in differences]), abs=0.01)


def test_a_convention_without_attention_takes_out_the_planners_causal_attention_term() -> None:
    from plan_calibration import attention_not_counted

    from tpu_tuner.metrics.flops import transformer_model_flops
    from tpu_tuner.model.decoders.transformer_dims import TransformerDims

    rows = {r.id: r for r in published_rows()[0]}
    v4 = rows["v4-synthetic-22b-v4-128"]
    # per device a step: pdb 16 sequences of 1024 tokens, 48 layers of 24 heads of 256
    causal = transformer_model_flops(0, TransformerDims(48, 24, 256, True), 16, 1024, True, "causal")
    assert attention_not_counted(v4) == pytest.approx(causal.attention_per_step)
    assert attention_not_counted(v4) == pytest.approx(6 * 48 * 24 * 256 * 1024**2 * 16)
    assert attention_not_counted(rows["llama3.1-70b-tpu7x-4x4x4"]) == 0.0
