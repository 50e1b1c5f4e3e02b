"""The guardrail's sample (execution/accuracy.py, `sampled`): small parts are compared whole; a
part of more than the sample's size is compared on the same elements in every process, and the
sample's relative error stands for the whole's."""

from __future__ import annotations

import torch

from tpu_tuner.execution.accuracy import Outputs, relative_error, sampled


def _gradients(seed: int, sizes: tuple[int, ...] = (3000, 50_000, 7, 120_000)) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(size, generator=generator) for size in sizes]


def test_parts_within_the_limit_are_compared_whole() -> None:
    pieces = _gradients(0, (10, 20))
    assert torch.equal(sampled(pieces, limit=100), torch.cat(pieces))


def test_the_sample_is_the_same_elements_in_every_process_and_spread_by_size() -> None:
    first, second = _gradients(0), _gradients(0)
    a, b = sampled(first, limit=4096), sampled(second, limit=4096)
    assert torch.equal(a, b) and abs(a.numel() - 4096) <= len(first)
    # A piece's share of the sample follows its size: the 7-element piece still gets one.
    other = sampled([first[0], first[1] * 0, first[2], first[3]], limit=4096)
    assert (other == 0).sum().item() == round(4096 * 50_000 / sum(p.numel() for p in first))


def test_the_samples_relative_error_stands_for_the_wholes() -> None:
    reference = _gradients(0)
    noise = _gradients(1)
    trial = [r + 0.01 * n for r, n in zip(reference, noise, strict=True)]
    whole = relative_error(Outputs({"g": torch.cat(trial)}), Outputs({"g": torch.cat(reference)}))["g"]
    part = relative_error(Outputs({"g": sampled(trial, 4096)}), Outputs({"g": sampled(reference, 4096)}))["g"]
    assert abs(part - whole) < 0.05 * whole, (part, whole)
    # A setting that breaks one large piece is seen in the sample as in the whole.
    broken = [*trial[:3], -trial[3]]
    assert relative_error(Outputs({"g": sampled(broken, 4096)}), Outputs({"g": sampled(reference, 4096)}))["g"] > 1


def test_a_bf16_piece_is_read_back_as_float32() -> None:
    pieces = [torch.randn(50_000).bfloat16()]
    assert sampled(pieces, limit=1000).dtype == torch.float32
    assert sampled(pieces, limit=10**6).dtype == torch.float32
