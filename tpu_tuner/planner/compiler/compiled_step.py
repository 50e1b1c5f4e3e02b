"""The TPU compiler's per-device figures for one training step (`CompiledStep`), and the whole
step's figures put together from a scanned program (`add_loop_iterations`, `combine_scanned`;
why: planner/compiler/program.py), or from two shallower ones (`extrapolate_depth`). Plain data: no JAX, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tpu_tuner.planner.compiler.loop_costs import LoopIteration
from tpu_tuner.planner.prediction.collectives import Collective, add_collectives


@dataclass(frozen=True)
class CompiledStep:
    """The TPU compiler's per-device figures for one training step."""

    flops: float
    bytes_accessed: float
    argument_bytes: float
    output_bytes: float
    temp_bytes: float
    alias_bytes: float
    collectives: list[Collective] = field(default_factory=list)
    compile_seconds: float = 0.0
    error: str | None = None  # the compiler's own words when it refused (e.g. out of HBM)
    host_temp_bytes: float = 0.0  # temporaries in the host's memory (remat "offload")
    # The compiler peeled iterations out of a loop (full effort with host offload does): its
    # cost analysis then counts those iterations besides the body, so the scanned program's FLOPs,
    # bytes and collectives no longer hold exactly one block. Its memory is still the program's.
    loop_peeled: bool = False
    # One iteration of the scanned block loops (forward + backward), measured from this program's
    # HLO; None for unrolled or block-less programs, or when it could not be measured.
    loop_iteration: LoopIteration | None = None
    # The compiler's own peak of live bytes over its schedule (memory_analysis().peak_memory_in_bytes;
    # 0 where the compiler did not say).
    compiler_peak_bytes: float = 0.0
    # How it was compiled where that differs from the plan's options (evaluate.py's retries).
    note: str | None = None

    @property
    def allocated_bytes(self) -> float:
        """Arguments + outputs not aliased to them + the temporaries' allocation."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    @property
    def peak_bytes(self) -> float:
        """HBM at the peak: the compiler's own peak of live bytes where it states one and the
        program keeps nothing in host memory, else `allocated_bytes`.

        The allocation overstates what the TPU compiler holds against its limit (a program it
        accepts can allocate more than the limit), while the compiler's peak counts host-memory
        buffers too, so a program that offloads is judged by its HBM allocation (figures:
        docs/planner.md, "What fits"). A program the compiler refuses never gets here: it is a
        refusal."""
        if self.compiler_peak_bytes and not self.host_temp_bytes:
            return self.compiler_peak_bytes
        return self.allocated_bytes

    def fits_in(self, hbm: float) -> bool:
        """Whether the program fits `hbm` bytes a device: its peak within the limit, or, for a
        program that keeps buffers in host memory, the compiler's acceptance. The compiler refuses
        such a program over its HBM limit and its allocation overstates what it holds (docs/planner.md,
        "What fits": 70B on v6e-32 allocates 33.8 of 31.25 GiB and is accepted; at 3 sequences a
        device it is refused)."""
        return self.error is None and (self.peak_bytes <= hbm or self.host_temp_bytes > 0)


def add_loop_iterations(
    scanned: CompiledStep, blocks: int, costs: CompiledStep | None = None, accumulation: int = 1
) -> CompiledStep:
    """The whole step from the scanned program of `blocks` blocks alone.

    Memory is the program's own. Its cost analysis and HLO text count each loop once, so the
    other `blocks - 1` iterations of its measured `loop_iteration` are added to its FLOPs, bytes
    and collectives; with `accumulation` micro-batches in a loop, the other micro-batches too (see
    `LoopIteration`). `costs`, when given, is the same program compiled without loop peeling (see
    `CompiledStep.loop_peeled`), and the work is read from it instead.
    """
    memory, work = scanned, costs or scanned
    iteration = work.loop_iteration
    if iteration is None:
        raise ValueError("the program's block loops were not measured (see loop_costs.block_loop_iteration)")
    # (how many more times, what) beyond the compiler's count of each loop body once
    extra = [(blocks - 1, iteration)]
    if iteration.micro_batch is not None:
        extra = [(accumulation - 1, iteration.micro_batch), (accumulation * (blocks - 1), iteration)]
    flops, bytes_accessed, collectives = work.flops, work.bytes_accessed, work.collectives
    for times, loop in extra:
        flops += times * loop.flops
        bytes_accessed += times * loop.bytes_accessed
        collectives = add_collectives(collectives, loop.collectives, times)
    return replace(
        memory,
        flops=flops,
        bytes_accessed=bytes_accessed,
        collectives=collectives,
        compile_seconds=memory.compile_seconds + (costs.compile_seconds if costs else 0.0),
        loop_peeled=work.loop_peeled,
    )


def extrapolate_depth(shallow: CompiledStep, deep: CompiledStep, depths: tuple[int, int], blocks: int) -> CompiledStep:
    """One program's work at `blocks` blocks from the same program compiled at two smaller `depths`.

    For a peeled program whose unpeeled compile at full depth was refused for memory. The cost
    analysis counts the block loop's body once at any depth; what grows with the depth is the work
    on the stacked weights outside the loop (optimizer update, gradient reductions), linearly, so
    the two depths give the full one. The loop iteration is the deeper program's."""
    low, high = depths
    scale = (blocks - high) / (high - low)

    def grown(at_low: float, at_high: float) -> float:
        return max(0.0, at_high + scale * (at_high - at_low))

    by_key = {(c.kind, c.group_size, c.network): c for c in shallow.collectives}
    collectives = []
    for c in deep.collectives:
        low_c = by_key.get((c.kind, c.group_size, c.network), Collective(c.kind, c.group_size, 0, 0, c.network))
        collectives.append(
            replace(c, count=round(grown(low_c.count, c.count)), bytes=round(grown(low_c.bytes, c.bytes)))
        )
    return replace(
        deep,
        flops=grown(shallow.flops, deep.flops),
        bytes_accessed=grown(shallow.bytes_accessed, deep.bytes_accessed),
        collectives=collectives,
        compile_seconds=shallow.compile_seconds + deep.compile_seconds,
    )


def combine_scanned(
    ends: CompiledStep, scanned: CompiledStep, blocks: int, costs: CompiledStep | None = None
) -> CompiledStep:
    """The whole step from the ends-only program and the scanned program of `blocks` blocks (the
    fallback where `add_loop_iterations` cannot be used).

    Memory is the scanned program's own (it is the real program). XLA's cost analysis and the
    HLO text hold the loop body once, so one block's FLOPs, bytes and collectives are the scanned
    program's minus the ends', and the step's are the ends' plus `blocks` of them. A difference
    below zero (the compiler fusing the ends differently) counts as zero, never as negative work.
    `costs`, when given, is the same scanned program compiled without loop peeling (see
    `CompiledStep.loop_peeled`), and the work is read from it instead.
    """
    memory, scanned = scanned, costs or scanned

    def total(end: float, with_body: float) -> float:
        return end + blocks * max(0.0, with_body - end)

    by_key = {(c.kind, c.group_size, c.network): c for c in ends.collectives}
    collectives = []
    for c in scanned.collectives:
        e = by_key.pop((c.kind, c.group_size, c.network), Collective(c.kind, c.group_size, 0, 0, c.network))
        collectives.append(replace(c, count=round(total(e.count, c.count)), bytes=round(total(e.bytes, c.bytes))))
    collectives += list(by_key.values())
    return replace(
        memory,
        flops=total(ends.flops, scanned.flops),
        bytes_accessed=total(ends.bytes_accessed, scanned.bytes_accessed),
        collectives=sorted(collectives, key=lambda c: (c.kind, c.group_size, c.network)),
        compile_seconds=ends.compile_seconds + memory.compile_seconds + (costs.compile_seconds if costs else 0.0),
        error=None,
        loop_peeled=scanned.loop_peeled,
        loop_iteration=None,
    )


__all__ = ["CompiledStep", "add_loop_iterations", "combine_scanned"]
