"""Attention patterns read from any Hugging Face config (model/decoders/attention_pattern.py): windows,
chunks, per-layer kinds, periods, Qwen2's max_window_layers and sinks, from real config classes
built in-process (no network); the model FLOPs that follow them on both planning routes, the plan's
attention line, and the warning for an attention-looking field the reader does not know
(docs/planner.md, "Attention patterns from the config"). No compiles."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tpu_tuner.metrics.flops import transformer_model_flops  # noqa: E402
from tpu_tuner.model.decoders.attention_pattern import (  # noqa: E402
    AttentionPattern,
    describe_layers,
    read_attention,
    warn_unread,
)
from tpu_tuner.model.decoders.decoder import decoder_module  # noqa: E402
from tpu_tuner.model.decoders.decoder_shape import DecoderShape  # noqa: E402
from tpu_tuner.model.decoders.hf_decoder import NotExpressible, attention_pattern  # noqa: E402
from tpu_tuner.model.decoders.transformer_dims import TransformerDims  # noqa: E402
from tpu_tuner.model.workloads.structure import read_dims  # noqa: E402
from tpu_tuner.outputs.plan_report import render_terminal  # noqa: E402
from tpu_tuner.planner.compiler.compile_request import StepSettings  # noqa: E402
from tpu_tuner.planner.plans import plan as plan_module  # noqa: E402
from tpu_tuner.planner.plans.hf_plan import planned_workload  # noqa: E402
from tpu_tuner.planner.plans.plan_options import PlanOptions, PlanTarget  # noqa: E402
from tpu_tuner.planner.plans.plan_problem import PlanProblem  # noqa: E402
from tpu_tuner.planner.plans.plan_result import result_of  # noqa: E402
from tpu_tuner.planner.prediction.predict import CostModel  # noqa: E402
from tpu_tuner.planner.topology import parse_topology  # noqa: E402

W, G = (4096, 0), (0, 0)  # a local layer of window 4096, a global layer
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=256)


@pytest.fixture(scope="module")
def config_classes() -> None:
    """transformers imports its config machinery on the first config built: once, in the set-up."""
    _config("llama")


def _config(model_type: str, **settings):
    return transformers.AutoConfig.for_model(model_type, **settings)


@pytest.mark.parametrize(
    "model_type, settings, layers, sinks",
    [
        ("gemma2", dict(num_hidden_layers=4), [W, G, W, G], False),
        ("gemma3_text", dict(num_hidden_layers=7), [W] * 5 + [G, W], False),
        ("cohere2", dict(num_hidden_layers=8), [W, W, W, G] * 2, False),
        # Qwen2: a window only where use_sliding_window, and only from layer max_window_layers on.
        ("qwen2", dict(num_hidden_layers=4), [G] * 4, False),
        ("qwen2", dict(num_hidden_layers=4, use_sliding_window=True, max_window_layers=2), [G, G, W, W], False),
        ("mistral", dict(num_hidden_layers=3), [W] * 3, False),
        ("mistral", dict(num_hidden_layers=3, sliding_window=None), [G] * 3, False),
        ("gpt_oss", dict(num_hidden_layers=4), [(128, 0), G] * 2, True),
        ("llama4_text", dict(num_hidden_layers=8), [(0, 8192)] * 3 + [G] + [(0, 8192)] * 3 + [G], False),
        ("gpt_neo", dict(num_layers=4, attention_types=[[["global", "local"], 2]]), [G, (256, 0)] * 2, False),
        ("llama", dict(num_hidden_layers=2), [G, G], False),
    ],
)
def test_real_config_classes_read_as_transformers_builds_their_layers(
    model_type, settings, layers, sinks, config_classes
) -> None:
    config = _config(model_type, max_position_embeddings=131072, **settings)
    pattern = read_attention(config)
    assert list(pattern.layers) == layers and pattern.sinks is sinks
    # Llama 4's interleave_moe_layer_step and the like are not attention: nothing left unread.
    assert pattern.unread == ()


@pytest.mark.parametrize(
    "fields, layers",
    [
        (dict(sliding_window=8, sliding_window_pattern=3), [(8, 0), (8, 0), G] * 2),
        (dict(sliding_window=8, sliding_window_pattern="LG"), [(8, 0), G] * 3),  # EXAONE 4's letters
        (dict(sliding_window=8, global_attn_every_n_layers=2), [(8, 0), G] * 3),
        (dict(sliding_window=8, use_sliding_window=False, max_window_layers=2), [G] * 6),
        (dict(sliding_window=8, use_sliding_window=True, max_window_layers=4), [G] * 4 + [(8, 0)] * 2),
        (dict(attention_chunk_size=16), [(0, 16)] * 6),
        (dict(attention_window=[8, 8, 8, 8, 8, 8]), [(8, 0)] * 6),
        (dict(local_attention=32, layer_types=["full_attention", "sliding_attention"] * 3), [G, (32, 0)] * 3),
        # A window as long as every sequence the config allows is global attention.
        (dict(sliding_window=4096, max_position_embeddings=4096), [G] * 6),
    ],
)
def test_fields_of_any_model_type_give_each_layers_window_or_chunk(fields, layers) -> None:
    pattern = read_attention({"model_type": "anything", "num_hidden_layers": 6, **fields})
    assert list(pattern.layers) == layers and pattern.unread == ()


def test_the_line_says_what_each_layer_group_runs() -> None:
    assert describe_layers([W, W, W, G] * 12) == "36 layers sliding window 4096, 12 layers global (every 4th)"
    assert describe_layers([G] * 48) == "48 layers global"
    assert (
        describe_layers([G] * 28 + [W] * 8)
        == "28 layers global (layers 0-27), 8 layers sliding window 4096 (layers 28-35)"
    )
    assert describe_layers([(0, 8192)] * 3 + [G]) == "3 layers chunked attention 8192, 1 layer global (every 4th)"
    gpt_oss = read_attention(_config("gpt_oss", num_hidden_layers=2))
    assert (
        gpt_oss.describe()
        == "1 layer sliding window 128, 1 layer global (every 2nd); a learned sink per head in every layer"
    )


def test_the_decoder_takes_a_periodic_pattern_and_refuses_another() -> None:
    assert attention_pattern(_config("cohere2", num_hidden_layers=8, max_position_embeddings=8192)) == {
        "sliding_window": 4096,
        "global_every": 4,
    }
    assert AttentionPattern((W, W, W)).periodic() == (4096, 0, 0)
    assert AttentionPattern((G, G)).periodic() == (0, 0, 0)
    irregular = _config(
        "gemma2", num_hidden_layers=3, layer_types=["full_attention", "sliding_attention", "sliding_attention"]
    )
    with pytest.raises(NotExpressible, match="not every N-th layer global"):
        attention_pattern(irregular)
    with pytest.raises(ValueError, match="different windows"):
        AttentionPattern((W, (8, 0), G)).periodic()


def test_model_flops_count_local_layers_by_their_window() -> None:
    """A small shape by hand: 4 layers, 3 local of window 4 and 1 global, 2 heads of 8, seq 16,
    batch 1, N = 0 (attention only): 12 H Q per pair, pairs 16 x 4 local and 16 x 16 global
    (the "full" convention), against 4 x 16 x 16 pairs when every layer was global."""
    pattern = read_attention({"num_hidden_layers": 4, "sliding_window": 4, "sliding_window_pattern": 4})
    dims = TransformerDims(4, 2, 8, True, pattern.spans(2, 8))
    flops = transformer_model_flops(0, dims, 1, 16, True, "full")
    assert flops.per_step == 12 * 2 * 8 * (3 * 16 * 4 + 16 * 16)
    everything_global = transformer_model_flops(0, dataclasses.replace(dims, spans=()), 1, 16, True, "full")
    assert everything_global.per_step == 12 * 2 * 8 * 4 * 16 * 16


def test_the_torchax_route_counts_the_configs_windows(tmp_path) -> None:
    """olmo3 is not mapped: traced, its model FLOPs still follow its 3 local : 1 global layers."""
    source = "hf:olmo3?num_hidden_layers=8,sliding_window=32,max_position_embeddings=256," + ",".join(
        f"{k}={v}" for k, v in TINY.items()
    )
    workload = planned_workload(source)
    assert "traced through torchax" in workload.notes[0]
    spans = workload.transformer.spans
    assert [(s.window, s.chunk) for s in spans] == [(32, 0), (32, 0), (32, 0), G] * 2
    assert {(s.heads, s.head_dim) for s in spans} == {(4, 16)}
    local = transformer_model_flops(0, workload.transformer, 1, 256, True, "full").per_step
    assert local == 12 * 4 * 16 * (6 * 256 * 32 + 2 * 256 * 256)


def _problem(spans: bool):
    shape = DecoderShape(vocab=256, d_model=64, layers=8, heads=4, kv_heads=2, mlp=128, max_seq_len=64)
    if spans:
        shape = dataclasses.replace(shape, sliding_window=16, global_every=4)
    module = decoder_module(shape, "tiny", 1, 64)
    with torch.device("meta"):
        dims = read_dims(module.build_model(), shape.heads)
    return PlanProblem(
        source="decoder:...",
        workload="tiny",
        preset=None,
        topology=parse_topology("v5e-4").as_compiled(4, 16 * 2**30),
        step=StepSettings(4, 64),
        dims=dims,
        gated=True,
        matmul_parameters=1,
        parameters=1,
        model_flops=1e9,
        attention="full",
        fast=True,
        cost_model=CostModel(),
        placements={},
        spans=module.TRANSFORMER["spans"],
    )


def test_the_plan_prints_and_stores_the_attention_of_each_layer_group(monkeypatch) -> None:
    result = result_of(_problem(spans=True), [], [], "full", time.perf_counter())
    line = "6 layers sliding window 16, 2 layers global (every 4th)"
    assert result.attention == line and json.loads(json.dumps(result.to_dict()))["attention"] == line
    assert f"attention: {line}" in render_terminal(result)
    assert result_of(_problem(spans=False), [], [], "full", time.perf_counter()).attention == "8 layers global"
    # The progress lines (the CLI prints them) say it before anything compiles.
    monkeypatch.setattr(plan_module, "CompilePool", lambda *args: contextlib.nullcontext())
    monkeypatch.setattr(plan_module, "build_problem", lambda *args: _problem(spans=True))
    monkeypatch.setattr(plan_module, "enumerated", lambda *args: None)
    lines: list[str] = []
    plan_module.plan("decoder:...", PlanOptions(PlanTarget("v5e-4")), lines.append)
    assert lines == [f"attention: {line}"]


def test_an_attention_field_the_reader_does_not_know_is_a_warning_naming_it(caplog, tmp_path) -> None:
    pattern = read_attention(
        {"model_type": "x", "num_hidden_layers": 2, "local_window_tokens": 512, "chunk_size_feed_forward": 4}
    )
    assert pattern.layers == (G, G) and pattern.unread == ("local_window_tokens = 512",)
    with caplog.at_level(logging.WARNING, logger="tpu_tuner.model.decoders.attention_pattern"):
        warn_unread(pattern, "x")
    assert "local_window_tokens = 512" in caplog.text and "treats that attention as global" in caplog.text
    # Empty values, fields the reader reads, and names that are not attention stay quiet.
    quiet = {"num_hidden_layers": 1, "global_window": None, "shared_expert_sink": True, "sliding_window": 8}
    assert read_attention(quiet).unread == ()
    # Through the plan's own reading of a config folder: an unknown field and an unknown layer kind.
    config = _config("olmo3", num_hidden_layers=2, sliding_window=None, **TINY).to_dict()
    config |= {"attention_sink_size": 4, "layer_types": ["full_attention", "linear_attention"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tpu_tuner.model.decoders.attention_pattern"):
        planned_workload(f"hf:{tmp_path}")
    assert "attention_sink_size = 4" in caplog.text and "layer_types[1] = 'linear_attention'" in caplog.text
