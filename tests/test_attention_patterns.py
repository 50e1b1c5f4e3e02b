"""Attention as today's models define it: sliding windows and chunks in a layer pattern, sinks,
wider global heads, and the layer grouping the planner scans (docs/planner.md, "Attention patterns")."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from helpers.tiny_planner import run_planner_python

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.metrics.flops import count_step, matmul_parameters, score_pairs, transformer_model_flops
from tpu_tuner.model.decoders.attention import attention_mask, local_attention
from tpu_tuner.model.decoders.decoder import Decoder, LayerGroup, decoder_module
from tpu_tuner.model.decoders.decoder_shape import DecoderShape, read_shape
from tpu_tuner.model.decoders.transformer_dims import TransformerDims
from tpu_tuner.model.workloads.structure import read_dims

BASE = "decoder:vocab=256,d_model=64,heads=4,kv_heads=2,mlp=128,max_seq_len=64"


def _shape(extra: str | dict):
    if isinstance(extra, dict):  # keys the inline syntax cannot write (a list)
        return DecoderShape(vocab=256, d_model=64, heads=4, kv_heads=2, mlp=128, max_seq_len=64, **extra)
    return read_shape(f"{BASE},{extra}")[0]


@pytest.mark.parametrize(
    "extra, groups",
    [
        ("layers=4", (0, 1, 4)),  # uniform: the blocks themselves
        ("layers=12,sliding_window=8,global_every=6", (0, 6, 2)),  # Gemma 3: 5 local : 1 global
        ("layers=14,sliding_window=8,global_every=6", (0, 6, 2)),  # two more: a partial pattern after the repeats
        (dict(layers=6, experts=4, top_k=2, dense_layers=(0, 1, 2)), (3, 1, 3)),  # DeepSeek-V3: dense layers lead
        ("layers=8,attention_chunk=8,global_every=4,experts=4,top_k=1,moe_every=2", (0, 4, 2)),  # Llama 4 Maverick
    ],
)
def test_layers_group_into_leading_blocks_and_repeats_of_their_pattern(extra, groups) -> None:
    shape = _shape(extra)
    assert shape.layer_groups() == groups
    model = Decoder(shape)
    leading, period, repeats = groups
    assert len(model.layers) == repeats and len(model.leading or ()) == leading
    assert all(isinstance(unit, LayerGroup) == (period > 1) for unit in model.layers)
    # The blocks in order are the shape's layers, each built as its kind says.
    kinds = [
        (
            b.attention.window == 0 and b.attention.chunk == 0,
            type(b.feed_forward).__name__ == "MixtureOfExperts",
            b.kv_shared,
        )
        for b in model.blocks()
    ]
    assert kinds == [shape.layer_kind(i) for i in range(shape.layers)]
    dims = read_dims(model, shape.heads)
    assert (dims.shape.n_layers, dims.scanned) == (shape.layers, repeats)
    assert dims.unscanned == shape.layers - repeats * period


def test_a_pattern_builds_local_and_global_layers_as_the_model_defines_them() -> None:
    shape = _shape(
        "layers=6,sliding_window=16,global_every=3,global_head_dim=32,global_kv_heads=1,"
        "global_shared_kv=true,attention_sinks=true"
    )
    local, global_ = Decoder(shape).blocks()[1:3]
    assert (local.attention.window, local.attention.head_dim, local.attention.kv_heads) == (16, 16, 2)
    assert (global_.attention.window, global_.attention.head_dim, global_.attention.kv_heads) == (0, 32, 1)
    assert global_.attention.wv is None and local.attention.wv is not None  # keys serve as values
    assert global_.attention.sinks.shape == (4,) and local.attention.sinks.shape == (4,)
    nope = Decoder(_shape("layers=4,attention_chunk=8,global_every=4,global_rope=false")).blocks()
    assert [b.attention.rope for b in nope] == [True, True, True, False]


@pytest.mark.parametrize("window, chunk", [(5, 0), (0, 4)])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_local_attention_is_masked_softmax_attention_with_exact_gradients(window, chunk, with_sinks) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 12, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    sinks = torch.randn(3, dtype=torch.float64, requires_grad=True) if with_sinks else None
    inputs = (q, k, v) + ((sinks,) if sinks is not None else ())
    assert torch.autograd.gradcheck(  # fast_mode: a random projection of the Jacobian, not every column
        lambda *a: local_attention(*a[:3], a[3] if len(a) > 3 else None, window, chunk), inputs, fast_mode=True
    )
    mask = attention_mask(12, window, chunk)
    if sinks is None:
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    else:  # the sink joins the denominator only
        scores = (q @ k.transpose(-1, -2) / 8**0.5).masked_fill(~mask, float("-inf"))
        weights = torch.cat([scores, sinks.view(1, 3, 1, 1).expand(2, 3, 12, 1)], -1).softmax(-1)[..., :-1]
        expected = weights @ v
    torch.testing.assert_close(local_attention(q, k, v, sinks, window, chunk), expected)
    # A window as long as the sequence is causal attention.
    torch.testing.assert_close(
        local_attention(q, k, v, None, 12, 0), F.scaled_dot_product_attention(q, k, v, is_causal=True)
    )


def test_the_mask_keeps_the_window_or_the_chunk_and_nothing_after_the_query() -> None:
    window = attention_mask(6, 2, 0).int().tolist()
    assert window[3] == [0, 0, 1, 1, 0, 0]
    chunks = attention_mask(6, 0, 4).int().tolist()
    assert chunks[3] == [1, 1, 1, 1, 0, 0] and chunks[5] == [0, 0, 0, 0, 1, 1]


@pytest.mark.parametrize(
    "extra",
    [
        "layers=7,sliding_window=8,global_every=3,global_head_dim=32,attention_sinks=true",
        "layers=8,attention_chunk=8,global_every=4,global_rope=false",
        "layers=6,sliding_window=8,global_every=3,global_shared_kv=true,global_kv_heads=1",
    ],
)
def test_counted_flops_equal_the_formula_with_local_layers_by_their_window(extra) -> None:
    shape = _shape(extra)
    model, module = Decoder(shape), decoder_module(shape, "t", 2, 32)
    tokens = torch.randint(0, 256, (2, 32))
    counted = count_step(lambda: module.loss(model(tokens), tokens).backward())
    dims = TransformerDims(**module.TRANSFORMER)
    formula = transformer_model_flops(matmul_parameters(model), dims, 2, 32, True, "full")
    assert counted.total == formula.per_step
    assert "local layers by their window or chunks" in formula.formula
    # Global attention alone would count more: every local layer sees 8 of 32 keys, not 32.
    uniform = TransformerDims(dims.layers, dims.heads, dims.head_dim, True)
    assert transformer_model_flops(0, uniform, 2, 32, True, "full").attention_per_step > formula.attention_per_step


def test_maxtext_convention_counts_a_window_as_its_causal_band_and_chunks_as_half_squares() -> None:
    # MaxText's maxtext_utils.py: local layers 4 B (T W - W^2 / 2) H D (x3), chunked 4 B sum(C^2) H D / 2 (x3).
    assert score_pairs(8192, 1024, 0, causal=True) == 8192 * 1024 - 1024**2 / 2
    assert score_pairs(8192, 0, 3000, causal=True) == (2 * 3000**2 + 2192**2) / 2
    assert score_pairs(100, 1024, 0, causal=True) == 100 * 100 / 2  # a window past the sequence is global
    assert score_pairs(8192, 0, 0, causal=True) == 8192**2 / 2
    assert score_pairs(8192, 1024, 0, causal=False) == 8192 * 1024


@pytest.mark.parametrize(
    "extra, words",
    [
        (
            "layers=2,sliding_window=8,attention_chunk=8",
            "a layer attends through a sliding window or in chunks, not both",
        ),
        ("layers=2,sliding_window=128", "the window (128) is larger than max_seq_len (64)"),
        ("layers=2,global_head_dim=32", "global_every, global_head_dim and global_kv_heads need local layers"),
        ("layers=2,sliding_window=8,global_every=2,global_kv_heads=3", "must be a multiple of their kv heads (3)"),
    ],
)
def test_an_impossible_pattern_is_refused_in_one_line(extra, words) -> None:
    with pytest.raises(WorkloadError, match=re.escape(words)) as info:
        _shape(extra)
    assert len(str(info.value).splitlines()) == 1


@pytest.mark.slow
def test_a_window_longer_than_the_planned_sequence_is_refused_before_any_compile(tmp_path) -> None:
    spec = f"{BASE},layers=2,sliding_window=48"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpu_tuner.cli",
            "plan",
            spec,
            "--topology",
            "v5e-4",
            "--seq",
            "32",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert "the local layers' window or chunk (48) is larger than the sequence (32)" in done.stderr
    assert not list(tmp_path.iterdir())


# Slow (~3 minutes on 2 cores): three compiles of a seven-layer pattern model for a TPU topology.
@pytest.mark.slow
def test_a_layer_pattern_compiles_with_splash_attention_and_counts_the_work_of_every_layer() -> None:
    """A Gemma-3-like pattern (2 local : 1 global, sinks, one trailing layer) compiled for v5e:2x2:
    the local layers run as splash attention inside the scanned pattern loop, the trailing layer
    unrolled beside it; the plan's one-compile method (the loop's other iteration measured in its
    HLO) gives the FLOPs and all-gather traffic of the same model compiled with every layer
    unrolled. Memory is the scanned program's own (the program MaxText runs): at this toy size
    the loop's stacked buffers leave it a few percent above the unrolled one's (3% measured)."""

    out = run_planner_python(f"""
        import json
        from tpu_tuner.planner.compiler.compile_request import topology_devices
        from tpu_tuner.model.meshes.layouts import Layout
        from tpu_tuner.model.decoders.decoder import Decoder
        from tpu_tuner.model.decoders.decoder_shape import read_shape
        from tpu_tuner.planner.compiler.compiled_step import add_loop_iterations
        import tpu_tuner.planner.compiler.program as program
        from tpu_tuner.planner.compiler.compile_request import CompileJob, CompileModel, CompileTarget, StepSettings
        from tpu_tuner.planner.plans.plan_space import PlanPoint
        texts = []
        measure = program.block_loop_iteration
        program.block_loop_iteration = lambda text: texts.append(text) or measure(text)
        spec = {BASE + ",layers=7,sliding_window=64,global_every=3,attention_sinks=true,max_seq_len=512"!r}
        shape = read_shape(spec)[0]
        devices = topology_devices("v5e:2x2")
        compile = lambda blocks, scan: program.compile_step(CompileJob(
            CompileModel("decoder", None, 64, blocks, scan), CompileTarget("v5e:2x2"), StepSettings(8, 256),
            PlanPoint(Layout(1, 4, 1), "full"), fast=True), lambda: Decoder(shape), devices)
        scanned, unrolled = compile(2, True), compile(2, False)
        gathered = lambda step: sum(c.bytes for c in step.collectives if c.kind == "all-gather")
        whole = add_loop_iterations(scanned, 2)
        print(json.dumps(dict(measured=scanned.loop_iteration is not None, loops=scanned.loop_iteration.loops,
                              splash=texts[0].count("splash_mha_fwd"), unrolled=[unrolled.flops, gathered(unrolled),
                              unrolled.peak_bytes], plan=[whole.flops, gathered(whole), whole.peak_bytes])))
    """)
    data = json.loads(out)
    assert data["measured"] and data["loops"] == 2  # the pattern loop, forward and backward
    assert data["splash"] >= 2  # two local layers a pattern, each a splash kernel
    flops, gathered, peak = data["unrolled"]
    assert data["plan"][0] == pytest.approx(flops, rel=0.01)
    assert data["plan"][1] == pytest.approx(gathered, rel=0.01)
    assert data["plan"][2] <= peak * 1.05


# Slow (~2 minutes on 2 cores): two compiles of a model whose logits dominate its memory.
@pytest.mark.slow
def test_vocabulary_tiling_keeps_one_tile_of_logits_and_computes_the_same_loss() -> None:
    """MaxText's num_vocab_tiling as the planner compiles it: a 32k vocabulary at 2 x 1024 tokens a
    device is 128 MiB of bf16 logits (and as much again in the backward pass); in 8 tiles the
    compiled step's temporaries shrink by most of that, while the loss it computes (on the CPU, on
    random weights) is the untiled one's."""

    out = run_planner_python("""
        import json
        import jax, jax.numpy as jnp, numpy as np
        from tpu_tuner.planner.compiler.compile_request import topology_devices
        from tpu_tuner.model.meshes.layouts import Layout
        from tpu_tuner.model.decoders.decoder import Decoder
        from tpu_tuner.model.decoders.decoder_shape import read_shape
        from tpu_tuner.planner.compiler.program import compile_step
        from tpu_tuner.planner.compiler.vocab_tiling import tiled_cross_entropy
        from tpu_tuner.planner.compiler.compile_request import CompileJob, CompileModel, CompileTarget, StepSettings
        from tpu_tuner.planner.plans.plan_space import PlanPoint
        shape = read_shape("decoder:vocab=32768,d_model=128,layers=2,heads=4,mlp=256,max_seq_len=1024")[0]
        devices = topology_devices("v5e:2x2")
        job = lambda tiles: CompileJob(CompileModel("decoder", None, 128, 2, scan=True), CompileTarget("v5e:2x2"),
                                       StepSettings(8, 1024, vocab_tiling=tiles), PlanPoint(Layout(1, 4, 1)), fast=True)
        peaks = [compile_step(job(tiles), lambda: Decoder(shape), devices).temp_bytes for tiles in (1, 8)]
        keys = jax.random.split(jax.random.PRNGKey(0), 3)
        hidden = jax.random.normal(keys[0], (2, 64, 16))
        head = jax.random.normal(keys[1], (100, 16))
        targets = jax.random.randint(keys[2], (2, 64), 0, 100)
        logits = jnp.einsum("bsd,vd->bsv", hidden, head)
        whole = (jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, targets[..., None], -1)[..., 0]).mean()
        print(json.dumps(dict(peaks=peaks, tiled=float(tiled_cross_entropy(hidden, head, targets, 8)),
                              whole=float(whole))))
    """)
    data = json.loads(out)
    untiled, tiled = data["peaks"]
    assert untiled - tiled > 0.5 * 128 * 2**20  # most of a step's logits no longer held
    assert data["tiled"] == pytest.approx(data["whole"], rel=1e-5)
