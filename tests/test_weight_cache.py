"""A worker's kept weights (execution/weight_cache.py): a later build of the same seeded model
gets the weights, buffers and random state a fresh build would, without drawing its init; a
model that cannot be built on the meta device is built as usual."""

from __future__ import annotations

import pytest
import torch
from conftest import FIXTURES
from torch import nn

from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.execution import weight_cache
from tpu_tuner.execution.step import prepare_step
from tpu_tuner.execution.weight_cache import WeightCache
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.workloads.loader import load_workload


@pytest.fixture(autouse=True)
def keep_every_build(monkeypatch) -> None:
    monkeypatch.setattr(weight_cache, "KEEP_AFTER_S", 0.0)


class Tied(nn.Module):
    """Tied embedding and head, a derived non-persistent buffer, a persistent one."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 50, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("freq", torch.arange(4).float() / 4, persistent=False)
        self.register_buffer("running", torch.randn(8))


class Computes(Tied):
    """A constructor that reads its own tensor's value: no meta build."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = float(self.running.abs().max().item())


class PlainMask(Tied):
    """A tensor kept as a plain attribute: nothing kept stands for it, so no meta build."""

    def __init__(self) -> None:
        super().__init__()
        self.mask = torch.tril(torch.ones(4, 4))


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


@pytest.mark.parametrize("factory", [Tied, Computes, PlainMask])
def test_a_later_build_is_the_fresh_builds_weights_and_random_state(factory) -> None:
    cache = WeightCache()
    first = cache.build(factory, seed=3)
    after_first = torch.rand(4)
    again = cache.build(factory, seed=3)
    after_again = torch.rand(4)
    fresh = (torch.manual_seed(3), factory())[1]
    after_fresh = torch.rand(4)
    for model in (first, again):
        assert _state(model).keys() == _state(fresh).keys()
        assert all(torch.equal(t, _state(fresh)[name]) for name, t in _state(model).items())
    assert torch.equal(after_first, after_fresh) and torch.equal(after_again, after_fresh)
    assert again.head.weight is again.embed.weight  # still tied
    assert cache.reused == (1 if factory is Tied else 0)  # the others: built as usual
    if factory is PlainMask:
        assert not again.mask.is_meta


def test_the_kept_weights_are_copies_and_another_seed_is_built_afresh() -> None:
    cache = WeightCache()
    first = cache.build(Tied, seed=0)
    with torch.no_grad():
        first.embed.weight.add_(1.0)  # a trial changing its model in place
    again = cache.build(Tied, seed=0)
    assert not torch.equal(again.embed.weight, first.embed.weight)
    other = cache.build(Tied, seed=1)
    assert cache.reused == 1 and not torch.equal(other.embed.weight, again.embed.weight)


def test_a_fast_build_keeps_nothing(monkeypatch) -> None:
    monkeypatch.setattr(weight_cache, "KEEP_AFTER_S", 60.0)
    cache = WeightCache()
    cache.build(Tied, seed=0)
    assert cache.tensors is None


def test_a_step_prepared_from_kept_weights_is_the_same_step() -> None:
    workload, backend, cache = load_workload(FIXTURES / "tiny_gpt.py"), CpuBackend(), WeightCache()
    steps = [prepare_step(workload, backend, Candidate(), 4, weights=cache) for _ in range(2)]
    plain = prepare_step(workload, backend, Candidate(), 4)
    assert cache.reused == 1
    for step in steps:
        pairs = zip(step.model.state_dict().values(), plain.model.state_dict().values(), strict=True)
        assert all(torch.equal(a, b) for a, b in pairs)
        assert torch.equal(step.batch[0], plain.batch[0])
        assert torch.equal(step.batch[1], plain.batch[1])
