"""FLOP blind spots: operators that do arithmetic work, take a share of the step, and have no
FLOP formula, so the counted FLOPs (and an MFU computed from them) miss their work.

The rule (docs/flops.md): an operator in the torch.profiler trace is *uncounted work* when

1. it is the operator the FLOP counter sees (the outermost aten operator that is not a
   CompositeImplicitAutograd decomposition; the time of everything it calls is its time: the
   CPU kernel ``aten::mkldnn_convolution`` is ``aten::convolution``'s time, which is counted);
2. it has no FLOP formula (torch's FlopCounterMode registry plus ours, `EXTRA_FLOP_FORMULAS`);
3. it is not one the MFU convention leaves out on purpose: elementwise (torch's ``pointwise``
   tag), reductions (``reduction`` tag), views, copies, allocation, indexing, normalisation,
   softmax, pooling, losses, optimizer updates (the name patterns below).

Autograd nodes and record_function labels are bookkeeping, never work. Such operators whose
time is at least a given share of all operators' self time are reported, largest first.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from tpu_tuner.metrics.flops import flop_counter

# Operators without FLOPs by the MFU convention (matmul / convolution / attention FLOPs only):
# memory movement, allocation, indexing, normalisation, softmax, pooling, sorting, optimizer
# updates, random numbers, dtype and layout changes, scalar reads.
_NO_WORK_NAMES = (
    "copy",
    "clone",
    "cat",
    "stack",
    "empty",
    "zeros",
    "ones",
    "fill",
    "full",
    "new_.*",
    "index",
    "gather",
    "scatter",
    "take",
    "put",
    "embedding",
    "softmax",
    "log_softmax",
    ".*norm",
    ".*pool.*",
    "upsample",
    ".*dropout.*",
    "where",
    "masked",
    "pad",
    "constant_pad.*",
    "reflection_pad.*",
    "replication_pad.*",
    "roll",
    "flip",
    "repeat",
    "tile",
    "expand",
    "contiguous",
    "to",
    "slice",
    "select",
    "narrow",
    "split",
    "chunk",
    "unbind",
    "squeeze",
    "unsqueeze",
    "view",
    "reshape",
    "permute",
    "transpose",
    "t",
    "as_strided",
    "resize",
    "set",
    "detach",
    "alias",
    "lift.*",
    "item",
    "local_scalar_dense",
    "normal",
    "uniform",
    "bernoulli",
    "rand.*",
    "arange",
    "linspace",
    "sort",
    "topk",
    "argsort",
    "argmax",
    "argmin",
    "max",
    "min",
    "sum",
    "mean",
    "var",
    "std",
    "cumsum",
    "cumprod",
    "foreach",
    "fused_adam.*",
    "fused_sgd",
    "zero",
    "unfold",
    "im2col",
    "col2im",
    "tril",
    "triu",
    "one_hot",
    "nonzero",
    "unique.*",
    "bincount",
    "histc",
    "clamp",
    "threshold",
    "nll_loss.*",
    "cross_entropy",
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "binary_cross_entropy.*",
    "resolve_conj",
    "resolve_neg",
    "conj",
    "record_stream",
    "assert.*",
    "efficientzerotensor",
    "isfinite",
    "isnan",
    "all",
    "any",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "equal",
    "allclose",
    "flatten",
    "unflatten",
    "movedim",
    "swapaxes",
    "channel_shuffle",
    "pixel_shuffle",
    "pixel_unshuffle",
    "grid_sampler.*",
    "affine_grid.*",
    "unsafe.*",
    "pin_memory",
    "has_compatible.*",
    "nested.*",
    "broadcast.*",
)
# A name matches when it is one of the above (leading underscores dropped), alone or followed by
# ``_something`` (``index_put_``, ``embedding_dense_backward``, ``native_layer_norm_backward``).
_NO_WORK = re.compile(r"^_*(?:" + "|".join(_NO_WORK_NAMES) + r")(?:_.*)?$")


@dataclass(frozen=True)
class UncountedOp:
    """An operator that did work the FLOP count misses, with its share of the profiled time."""

    name: str
    share: float
    self_ms_per_step: float


@lru_cache(maxsize=1)
def _counted_names() -> frozenset[str]:
    """Profiler names (``aten::mm``) of every operator with a FLOP formula."""
    names = set()
    for op in flop_counter().flop_registry:
        text = str(getattr(op, "_qualified_op_name", None) or op)
        names.add(text.replace("aten.", "aten::", 1) if text.startswith("aten.") else text)
    return frozenset(names)


@lru_cache(maxsize=512)
def _is_no_work(name: str) -> bool:
    """True for aten operators the MFU convention deliberately does not count."""
    short = name.removeprefix("aten::")
    packet = getattr(torch.ops.aten, short, None)
    if packet is not None:
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if op.is_view or torch.Tag.pointwise in op.tags or torch.Tag.reduction in op.tags:
                return True
    return bool(_NO_WORK.match(short))


@lru_cache(maxsize=1024)
def _is_composite(name: str) -> bool:
    """True when the aten op decomposes into other ops above the dispatch modes
    (CompositeImplicitAutograd; its ``out=`` overload may not): the FLOP counter never sees
    it, only what it calls."""
    packet = getattr(torch.ops.aten, name.removeprefix("aten::"), None)
    if packet is None:
        return False
    try:
        return any(
            torch._C._dispatch_has_kernel_for_dispatch_key(
                getattr(packet, overload).name(), "CompositeImplicitAutograd"
            )
            for overload in packet.overloads()
        )
    except RuntimeError:
        return False


def _dispatched(event: Any, counted: frozenset[str]) -> tuple[str | None, bool]:
    """The operator the FLOP counter saw for `event`, and whether it has a formula.

    The counter sees the outermost aten operator that is not a composite (``aten::conv2d`` is
    one, ``aten::convolution`` is seen); everything that operator calls (``aten::mkldnn_convolution``,
    or the ``aten::mm`` inside ``aten::_euclidean_dist``) is its work, counted or not with it.
    """
    chain = []
    node = event
    while node is not None:
        if node.name.startswith("aten::"):
            chain.append(node.name)
        node = node.cpu_parent
    chain.reverse()  # outermost first
    for index, name in enumerate(chain):
        if not _is_composite(name):
            return name, any(outer in counted for outer in chain[: index + 1])
    return None, False  # a composite's own self time is glue (argument checks, reshapes), not work


def uncounted_operators(events: Iterable[Any], steps: int, use_device: bool, share_min: float) -> list[UncountedOp]:
    """Operators doing work without a FLOP formula, whose time is >= `share_min` of the total.

    `events` are torch.profiler FunctionEvents (``prof.events()``, with their call tree) of
    `steps` steps; an operator's time is the self time of everything it calls; self time is
    device time where the device reports it, host time otherwise (as in the operator table).
    """
    counted = _counted_names()
    total = 0.0
    by_name: dict[str, float] = defaultdict(float)
    for event in events:
        self_us = float(event.self_device_time_total if use_device else event.self_cpu_time_total)
        if self_us <= 0:
            continue
        total += self_us
        name, has_formula = _dispatched(event, counted)
        if name is None or has_formula or _is_no_work(name):
            continue
        by_name[name] += self_us
    if total <= 0:
        return []
    found = [
        UncountedOp(name=name, share=us / total, self_ms_per_step=us / 1000 / max(steps, 1))
        for name, us in by_name.items()
        if us / total >= share_min
    ]
    return sorted(found, key=lambda op: op.share, reverse=True)


def describe(ops: list[UncountedOp]) -> str:
    """One line for warnings and reports: ``uncounted: aten::X, 99% of the time``."""
    return "uncounted: " + "; ".join(f"{op.name}, {op.share:.0%} of the time" for op in ops)
