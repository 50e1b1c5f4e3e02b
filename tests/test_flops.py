"""FLOPs: counted FLOPs of a decoder LM equal the analytical formula exactly."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tpu_tuner.loader import load_workload
from tpu_tuner.metrics.flops import count_step, matmul_parameters, transformer_model_flops
from tpu_tuner.workload import TransformerDims

from conftest import EXAMPLES, FIXTURES


def _tiny_gpt(use_sdpa: bool):
    gpt = load_workload(FIXTURES / "tiny_gpt.py")
    module = sys.modules[gpt.build_model.__module__]
    config = module.CONFIG.__class__(**{**module.CONFIG.__dict__, "use_sdpa": use_sdpa})
    return module._gpt.GPT(config), gpt


@pytest.mark.parametrize("use_sdpa", [True, False], ids=["sdpa", "manual-attention"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "inference"])
def test_counted_flops_match_formula_exactly(use_sdpa: bool, training: bool) -> None:
    torch.manual_seed(0)
    model, workload = _tiny_gpt(use_sdpa)
    batch, seq = 3, 24
    inputs, targets = workload.make_batch(batch, seq)
    optimizer = torch.optim.AdamW(model.parameters())

    def step() -> None:
        if training:
            workload.loss_fn(model(inputs), targets).backward()
            optimizer.step()
            optimizer.zero_grad()
        else:
            with torch.no_grad():
                model(inputs)

    counted = count_step(step)
    expected = transformer_model_flops(
        matmul_parameters(model), workload.transformer, batch, seq, training, "full"
    )
    assert counted.total == expected.per_step
    if use_sdpa:
        # The CPU flash kernels are what F.scaled_dot_product_attention dispatches to here; without
        # our formulas they would count zero.
        assert any("flash_attention_for_cpu" in op for op in counted.by_op)
        assert all(n > 0 for n in counted.by_op.values())


def test_example_gpt_counts_match_formula() -> None:
    workload = load_workload(EXAMPLES / "gpt.py")
    model = workload.build_model()
    inputs, targets = workload.make_batch(2, 64)
    counted = count_step(lambda: workload.loss_fn(model(inputs), targets).backward())
    expected = transformer_model_flops(matmul_parameters(model), workload.transformer, 2, 64, True)
    assert counted.total == expected.per_step


def test_sdpa_attention_is_counted_on_cpu() -> None:
    q = k = v = torch.randn(2, 3, 16, 8, requires_grad=True)
    forward = count_step(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert forward.total == 4 * 2 * 3 * 16 * 16 * 8  # QK^T and AV, mask not discounted
    both = count_step(lambda: F.scaled_dot_product_attention(q, k, v).sum().backward())
    assert both.total == 3 * forward.total  # backward is two forwards (no recomputation counted)


def test_causal_convention_halves_attention_only() -> None:
    dims = TransformerDims(layers=2, heads=4, head_dim=16, causal=True)
    full = transformer_model_flops(1000, dims, 2, 32, True, "full")
    causal = transformer_model_flops(1000, dims, 2, 32, True, "causal")
    assert full.dense_per_step == causal.dense_per_step == 6 * 1000 * 64
    assert full.attention_per_step == 12 * 2 * 4 * 16 * 32 * 64
    assert causal.attention_per_step == full.attention_per_step / 2
    assert "MaxText" in causal.convention and "PaLM" in full.convention
    non_causal = transformer_model_flops(1000, TransformerDims(2, 4, 16, causal=False), 2, 32, True, "causal")
    assert non_causal.attention_per_step == full.attention_per_step


def test_matmul_parameters_skip_lookups_but_count_tied_head() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(100, 8)
            self.pos = nn.Embedding(10, 8)
            self.norm = nn.LayerNorm(8)
            self.fc = nn.Linear(8, 8)
            self.head = nn.Linear(8, 100, bias=False)
            self.head.weight = self.emb.weight

    # tied embedding/head 100*8 counts once, fc 64; positions, norm and bias do not count.
    assert matmul_parameters(Tied()) == 800 + 64
