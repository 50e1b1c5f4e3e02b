"""A seeded model's weights kept after its first build in a worker, so later builds skip the init.

Every trial and reference builds the model afresh from the same seed (execution/step.py), so it
gets the same weights each time, and a large model's random init is paid again each time: on
this repository's 2-core host a Llama-class `hf:` model (402M parameters) took 37 s to build, of
which drawing its normal init alone was 25 s; on the chip a warm worker's trial of it had 14 s
beyond its compile and steps (docs/torchtpu.md). After a build slower than `KEEP_AFTER_S`, the
weights (every parameter and buffer, by name, on the CPU) and the random generator's state after
the build are kept. The next build constructs the model on the meta device (no init, no
memory), gives it copies of the kept tensors and restores the generator's state,
so the batch drawn next is the one a fresh build would have drawn. A model that cannot be built
on the meta device (its constructor computes on its tensors), whose tensors differ by name,
shape or dtype from the kept ones, that keeps a tensor as a plain attribute (no parameter or
buffer), or whose build left a tensor off the CPU, is built as usual.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

log = logging.getLogger(__name__)

# A build faster than this keeps nothing: copying would save little, and the copy costs memory.
KEEP_AFTER_S = 1.0


@dataclass
class WeightCache:
    """The kept weights of one workload's seeded build (one per worker: `runner/jobs.WorkerState`)."""

    seed: int | None = None
    tensors: dict[str, torch.Tensor] | None = None
    rng_state: torch.Tensor | None = None
    reused: int = 0  # builds served from the kept weights (for the tests and the log)

    def build(self, build_model: Callable[[], object], seed: int) -> object:
        """`build_model()` as a fresh build after `torch.manual_seed(seed)` returns it, weights and
        the generator's state after it included; from the kept weights where it can be."""
        torch.manual_seed(seed)
        if self.tensors is not None and self.seed == seed:
            kept = self._from_kept(build_model)
            if kept is not None:
                assert self.rng_state is not None
                torch.set_rng_state(self.rng_state)
                self.reused += 1
                return kept
            torch.manual_seed(seed)  # a meta build draws nothing, but a failed one may have
        started = time.perf_counter()
        built = build_model()
        if time.perf_counter() - started >= KEEP_AFTER_S and isinstance(built, nn.Module):
            self._keep(built, seed)
        return built

    def _keep(self, model: nn.Module, seed: int) -> None:
        named = dict(_tensors(model))
        if any(t.device.type != "cpu" for t in named.values()):
            return  # a build that placed tensors on a device: no copy held in its memory
        # Copies: the trial changes its model in place (a bf16 cast, a compile's wrappers).
        self.tensors = {name: tensor.detach().clone() for name, tensor in named.items()}
        self.rng_state, self.seed = torch.get_rng_state(), seed

    def _from_kept(self, build_model: Callable[[], object]) -> nn.Module | None:
        assert self.tensors is not None
        try:
            with torch.device("meta"):
                model = build_model()
            if not isinstance(model, nn.Module):
                return None
            named = dict(_tensors(model))
            if named.keys() != self.tensors.keys() or any(
                t.shape != self.tensors[n].shape or t.dtype != self.tensors[n].dtype for n, t in named.items()
            ):
                log.debug("the model's tensors differ from the kept ones: built as usual")
                return None
            _materialise(model, self.tensors)
            if any(t.is_meta for _, t in _tensors(model)) or _plain_meta_tensors(model):
                log.debug("the model holds tensors no kept one stands for: built as usual")
                return None
            return model
        except Exception as exc:  # a constructor that computes on its tensors: built as usual
            log.debug("the model could not be built on the meta device (%s): built as usual", exc)
            return None


def _materialise(model: nn.Module, kept: dict[str, torch.Tensor]) -> None:
    """Give a meta-built `model` copies of the `kept` tensors, a tied parameter one Parameter in
    every module that holds it (`Module.to_empty` swaps each module's own, which unties them)."""
    fresh: dict[int, nn.Parameter] = {}
    for name, parameter in model.named_parameters():  # each Parameter once, by its first name
        fresh[id(parameter)] = nn.Parameter(kept[name].clone(), requires_grad=parameter.requires_grad)
    for module in model.modules():
        for name, parameter in list(module.named_parameters(recurse=False)):
            setattr(module, name, fresh[id(parameter)])
    for name, _ in list(model.named_buffers()):
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner), leaf, kept[name].clone())  # still a buffer: its name is registered


def _plain_meta_tensors(model: nn.Module) -> bool:
    """Whether a module keeps a tensor as a plain attribute (not a parameter or buffer, so not
    kept: a mask made in `__init__`), alone or in a list, tuple or dict, still on the meta device."""
    for module in model.modules():
        for value in vars(module).values():
            values = (
                value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else [value]
            )
            if any(isinstance(v, torch.Tensor) and v.is_meta for v in values):
                return True
    return False


def _tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every parameter (a tied one once) and buffer of `model`, by qualified name."""
    yield from model.named_parameters()
    yield from model.named_buffers()


__all__ = ["KEEP_AFTER_S", "WeightCache"]
