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


def test_the_sample_is_the_same_elements_in_every_process_and_shared_out() -> None:
    from tpu_tuner.execution.accuracy import sample_counts

    first, second = _gradients(0), _gradients(0)
    a, b = sampled(first, limit=4096), sampled(second, limit=4096)
    assert torch.equal(a, b) and a.numel() <= 4096
    # The 7-element piece whole, the others an equal share of the rest.
    other = sampled([first[0], first[1] * 0, first[2], first[3]], limit=4096)
    assert (other == 0).sum().item() == sample_counts([3000, 50_000, 7, 120_000], 4096)[1] == 1363


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


def test_a_small_piece_carrying_the_difference_is_seen_as_in_the_whole() -> None:
    # A norm's weight: 64 elements whose gradients are large (summed over every token) and whose
    # error is most of the step's; a share by size gave it no more than one element of the sample.
    generator = torch.Generator().manual_seed(3)
    reference = [torch.randn(200_000, generator=generator), 50 * torch.randn(64, generator=generator)]
    trial = [reference[0] * 1.001, reference[1] * 1.3]
    whole = relative_error(Outputs({"g": torch.cat(trial)}), Outputs({"g": torch.cat(reference)}))["g"]
    part = relative_error(Outputs({"g": sampled(trial, 4096)}), Outputs({"g": sampled(reference, 4096)}))["g"]
    assert abs(part - whole) < 0.05 * whole, (part, whole)


def test_the_sample_is_shared_out_smallest_pieces_whole() -> None:
    from tpu_tuner.execution.accuracy import sample_counts

    assert sample_counts([10, 1000, 0, 5000], 1000) == [10, 495, 0, 495]
    assert sum(sample_counts([7, 50_000, 3000, 120_000], 4096)) <= 4096
