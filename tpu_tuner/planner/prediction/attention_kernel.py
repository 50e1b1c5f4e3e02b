"""The chip's own figures: the flash attention kernel's time by head width, sequence and block
size, and what whole steps on one chip measured beyond it.

The compiler's count prices attention as matmuls: the Pallas forward kernel carries the reference
attention's FLOPs as its cost estimate and the backward kernels carry none. On a v5e chip that
kernel ran at 6-100 TFLOP/s of its 197, five times faster in 512 blocks than in the default 128,
and its backward took four times its forward (docs/planner.md, "On a real chip"). Where a chip
timed the kernel (`chip_kernels.json`, written by `benchmarks/chip/tpu_attention_kernel.py adopt`, with
its chip, date, JAX and libtpu) and whole steps were measured on a slice of the plan's size (one
chip: `ChipStep`), a step's attention is costed from those timings, not its FLOPs (the forward
once, again where the remat policy recomputes the attention, and the backward), and the step's
matmul efficiency and the weight of recomputed FLOPs are the chip's. Elsewhere (no timings for the
generation, a larger slice, local or chunked layers, context parallelism) the prediction is what
it was: FLOPs at the calibration's efficiency; the timings still choose the blocks. These figures
are the chip's, kept apart from the calibration rows (published runs) and never fitted into them.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

KERNELS_FILE = Path(__file__).with_name("chip_kernels.json")


@dataclass(frozen=True)
class KernelTiming:
    """One timed point: causal flash attention over `batch_heads` [seq, head_dim] heads in
    `block`-sized blocks; the forward alone, and the forward then the backward (`jax.vjp`)."""

    head_dim: int
    seq: int
    block: int
    batch_heads: int
    forward_ms: float
    forward_backward_ms: float


@dataclass(frozen=True)
class ChipStep:
    """What whole training steps on one chip of the generation measured beyond the kernel: the
    fraction of peak its matmul work reached (`efficiency`) and the share of a remat policy's
    recomputed FLOPs its step time showed (`recompute_weight`), fitted by
    `benchmarks/chip/tpu_chip_check.py fit` to steps of several decoder shapes and policies, for slices
    of `devices` devices (where they were measured); `recomputed_flops`: a point's, per device."""

    efficiency: float
    recompute_weight: float
    devices: int
    fitted_to: str
    recomputed_flops: float = 0.0


@dataclass(frozen=True)
class ChipKernels:
    """A generation's kernel timings and where they come from (said with every plan that uses them)."""

    generation: str
    device: str
    date: str
    jax: str
    libtpu: str
    timings: tuple[KernelTiming, ...]
    step: ChipStep | None = None

    def source(self) -> str:
        return f"timed on a {self.device} chip, {self.date}, JAX {self.jax}, libtpu {self.libtpu}"

    def blocks(self, head_dim: int, seq: int) -> list[int]:
        """The timed blocks usable at this head width and sequence (a block must divide it)."""
        width = self._width(head_dim)
        return sorted({t.block for t in self.timings if t.head_dim == width and seq % t.block == 0})

    def seconds(self, head_dim: int, seq: int, block: int, batch_heads: float, forwards: int) -> float | None:
        """One layer's attention in a training step: `forwards` forward passes (2 where the remat
        policy recomputes attention) and one backward, over `batch_heads` heads; None where the
        block was not timed at this width."""
        width = self._width(head_dim)
        points = sorted((t.seq, t) for t in self.timings if t.head_dim == width and t.block == block)
        if not points:
            return None
        forward = _interpolate([(s, t.forward_ms / t.batch_heads) for s, t in points], seq)
        backward = _interpolate([(s, (t.forward_backward_ms - t.forward_ms) / t.batch_heads) for s, t in points], seq)
        # A head wider than any timed one costs in proportion (the kernel pads it to 128-wide tiles).
        widen = max(1.0, head_dim / width)
        return (forwards * forward + backward) * widen * batch_heads / 1e3

    def fastest_block(self, head_dim: int, seq: int) -> int | None:
        """The block whose forward, recomputed forward and backward take least at this width and
        sequence (None: none timed that divides it)."""
        timed = {b: self.seconds(head_dim, seq, b, 1.0, 2) for b in self.blocks(head_dim, seq)}
        usable = {b: s for b, s in timed.items() if s is not None}
        return min(usable, key=lambda b: usable[b]) if usable else None

    def _width(self, head_dim: int) -> int:
        """The timed head width that stands for `head_dim`: the narrowest at least as wide (a
        narrower head fills the same 128-lane tiles), else the widest timed."""
        widths = sorted({t.head_dim for t in self.timings})
        return next((w for w in widths if w >= head_dim), widths[-1])


def _interpolate(points: list[tuple[int, float]], seq: int) -> float:
    """Milliseconds per head at `seq`, log-log between the timed sequences around it (past the
    ends, the end segment's slope: causal attention grows about as the square)."""
    if len(points) == 1:
        ((s0, t0),) = points
        return t0 * (seq / s0) ** 2
    upper = next((i for i, (s, _) in enumerate(points) if i and s >= seq), len(points) - 1)
    (s0, t0), (s1, t1) = points[upper - 1], points[upper]
    return t0 * (seq / s0) ** (math.log(t1 / t0) / math.log(s1 / s0))


@functools.cache
def _table() -> dict[str, ChipKernels]:
    if not KERNELS_FILE.exists():
        return {}
    kept = json.loads(KERNELS_FILE.read_text())
    return {
        generation: ChipKernels(
            generation,
            record["device"],
            record["date"],
            record["jax"],
            record["libtpu"],
            tuple(
                KernelTiming(
                    row["head_dim"],
                    row["seq"],
                    row["block"],
                    row["batch"] * row["heads"],
                    row["forward_ms"],
                    row["forward_backward_ms"],
                )
                for row in record["rows"]
                if "forward_ms" in row and "forward_backward_ms" in row
            ),
            ChipStep(**record["step"]) if "step" in record else None,
        )
        for generation, record in kept.items()
    }


def chip_kernels(generation: str) -> ChipKernels | None:
    """The kernel timings of `generation` (None: no chip of it has timed the kernel)."""
    return _table().get(generation)


@dataclass(frozen=True)
class AttentionKernelWork:
    """A step's flash attention per device, as the prediction costs it on a chip that timed the
    kernel: its measured `seconds`, and what the compiler's count and the analytic floor charge
    for it (taken out of the matmul work so it is not paid twice)."""

    seconds: float
    counted_flops: float  # the forward kernels' cost estimates in the compiler's count
    hardware_flops: float  # attention's part of the analytic floor (full attention, + its recompute)
    counted_bytes: float  # the forward kernels' inputs and outputs in the compiler's bytes
    block: int
    source: str


def attention_kernel_work(
    kernels: ChipKernels,
    *,
    layers: int,
    heads: int,
    head_dim: int,
    seq: int,
    block: int,
    sequences_per_device: float,
    recomputed: bool,
) -> AttentionKernelWork | None:
    """The step's attention on one device: `layers` global causal layers of `heads` heads, over
    `sequences_per_device` sequences (the query heads: grouped keys and values are repeated before
    the kernel), the forward run again where `recomputed`. None where the block was not timed."""
    forwards = 2 if recomputed else 1
    batch_heads = sequences_per_device * heads
    per_layer = kernels.seconds(head_dim, seq, block, batch_heads, forwards)
    if per_layer is None:
        return None
    pairs = layers * batch_heads * seq * seq * head_dim  # query-key pairs x width, every layer
    return AttentionKernelWork(
        seconds=per_layer * layers,
        counted_flops=4.0 * pairs * forwards,  # the reference attention's estimate: 4 x s^2 x d a head
        hardware_flops=(12.0 + 4.0 * (forwards - 1)) * pairs,
        counted_bytes=2.0 * 4 * layers * batch_heads * seq * head_dim * forwards,  # q, k, v, o in bf16
        block=block,
        source=kernels.source(),
    )


__all__ = ["AttentionKernelWork", "ChipKernels", "ChipStep", "KernelTiming", "attention_kernel_work", "chip_kernels"]
