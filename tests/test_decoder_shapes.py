"""A model shape without code (tpu_tuner/model/decoders/decoder.py): a TOML file or an inline spec builds
the generic decoder, through the same loader a user's file goes through."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.metrics.flops import matmul_parameters
from tpu_tuner.model.workloads.loader import load_workload

GPT3_STYLE = """
[model]
vocab = 512
d_model = 64
layers = 2
heads = 4
mlp = 256
gated = false
activation = "gelu"
norm = "layer"
positions = "learned"
tied_embeddings = true
max_seq_len = 64

[run]
batch_size = 2
seq_len = 16
"""


def _write(tmp_path: Path, text: str, name: str = "shape.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_toml_shape_is_a_training_workload_of_that_shape(tmp_path) -> None:
    workload = load_workload(_write(tmp_path, GPT3_STYLE, "gpt3_style.toml"))
    assert (workload.name, workload.batch_size, workload.seq_len, workload.is_training) == ("gpt3_style", 2, 16, True)
    model = workload.build_model()
    d, layers, mlp, vocab = 64, 2, 256, 512
    # Tied embeddings: the output projection is the token table, counted once.
    assert model.output.weight is model.tok_embeddings.weight
    per_block = 4 * d * d + 2 * d * mlp + 2 * 2 * d  # attention, ungated MLP, two LayerNorms
    assert sum(p.numel() for p in model.parameters()) == vocab * d + 64 * d + layers * per_block + 2 * d
    tokens, targets = workload.make_batch(2, 16)
    loss = workload.loss_fn(model(tokens), targets)
    loss.backward()
    assert torch.isfinite(loss) and model.tok_embeddings.weight.grad is not None
    assert workload.transformer.heads == 4 and workload.transformer.head_dim == 16


def test_an_inline_shape_with_grouped_query_attention_and_a_gated_mlp() -> None:
    spec = "decoder:vocab=256,d_model=64,layers=1,heads=8,kv_heads=2,mlp=128"
    model = load_workload(spec).build_model()
    block = model.layers[0]
    assert block.attention.wk.out_features == 2 * 8 and block.feed_forward.w_gate is not None
    assert matmul_parameters(model) == 64 * 64 * 2 + 64 * 16 * 2 + 3 * 64 * 128 + 64 * 256


@pytest.mark.parametrize(
    "text, words",
    [
        (
            "[model]\nvocab = 8\nd_model = 64\nlayers = 1\nheads = 6\nmlp = 8\n",
            "d_model (64) is not a multiple of heads (6)",
        ),
        (
            "[model]\nvocab = 8\nd_model = 64\nlayers = 1\nheads = 8\nkv_heads = 3\nmlp = 8\n",
            "must be a multiple of kv_heads",
        ),
        ("[model]\nvocab = 8\nd_model = 64\nlayers = 1\nheads = 8\nmlp = 8\nwidth = 3\n", "unknown shape key(s) width"),
        (
            "[model]\nvocab = 8\nd_model = 64\nlayers = 1\nheads = 8\nmlp = 8\nactivation = 'tanh'\n",
            "activation must be one of",
        ),
        ("[model]\nvocab = 8\nd_model = 64\n", "incomplete shape"),
        ("[run]\nbatch_size = 2\n", "no [model] table"),
        (
            "[model]\nvocab = 8\nd_model = 64\nlayers = 1\nheads = 8\nmlp = 8\nexperts = 2\ntop_k = 3\n",
            "top_k (3) must be between 1 and experts (2)",
        ),
    ],
)
def test_a_bad_shape_is_refused_in_one_line_naming_the_file(tmp_path, text, words) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(WorkloadError, match=re.escape(words)) as info:
        load_workload(path)
    assert str(path) in str(info.value) and len(str(info.value).splitlines()) == 1


def test_a_mixture_of_experts_routes_each_token_to_its_top_experts() -> None:
    """With room for every token, the layer equals the per-token sum over its two chosen experts
    weighted by their softmaxed router logits; with a capacity factor below one, tokens past an
    expert's slots are dropped (their output for that expert is zero); only the chosen experts'
    weights count as model FLOPs parameters."""
    import torch.nn.functional as F

    spec = "decoder:vocab=256,d_model=32,layers=1,heads=4,kv_heads=2,mlp=48,experts=4,top_k=2"
    model = load_workload(spec).build_model()
    moe = model.layers[0].feed_forward
    torch.manual_seed(0)
    x = torch.randn(2, 16, 32)
    weights, chosen = moe.router(x).topk(2, dim=-1)
    weights = weights.softmax(dim=-1)
    expected = torch.zeros_like(x)
    for b in range(2):
        for t in range(16):
            for j in range(2):
                e = chosen[b, t, j]
                hidden = F.silu(x[b, t] @ moe.w_gate[e]) * (x[b, t] @ moe.w_up[e])
                expected[b, t] += weights[b, t, j] * (hidden @ moe.w_down[e])
    moe.capacity_factor = 4.0  # 4 x 8 slots per expert: no token dropped
    torch.testing.assert_close(moe(x), expected, atol=1e-5, rtol=1e-4)
    moe.capacity_factor = 0.25  # 2 slots per expert: most routings dropped
    dropped = moe(x)
    assert (dropped.abs().sum(-1) == 0).any() and not torch.allclose(dropped, expected)
    dense_part = 32 * 32 + 2 * 32 * 16 + 32 * 32 + 32 * 4 + 32 * 256
    assert matmul_parameters(model) == dense_part + 3 * 32 * 48 * 2  # two of four experts a token
