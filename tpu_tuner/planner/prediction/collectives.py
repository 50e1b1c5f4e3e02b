"""Collectives in compiled HLO text: kind, bytes, group size, network; and their ring cost.

A multi-slice program holds two kinds (docs/planner.md, "The whole mesh"): ICI collectives, the
usual all-gather / reduce-scatter / ... ops, whose replica groups stay inside one slice, and DCN
collectives, which the TPU compiler emits as host-transfer send / recv pairs handed to the
megascale runtime (``_xla_megascale_transfer_type="ALL_REDUCE"`` and a ``_xla_megascale_target``
naming the slices, or the devices, of each group). The recv's buffer is what one device receives:
the collective's result, counted as an ICI op's result is."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
DTYPE_BYTES = {
    **dict.fromkeys(("pred", "s8", "u8", "f8e4m3fn", "f8e5m2"), 1),
    **dict.fromkeys(("bf16", "f16", "s16", "u16"), 2),
    **dict.fromkeys(("f32", "s32", "u32"), 4),
    **dict.fromkeys(("f64", "s64", "u64"), 8),
}
_LINE = re.compile(r"=\s*(?P<shape>.+?)\s+(?P<kind>" + "|".join(KINDS) + r")(?P<start>-start)?\(")
_ARRAY = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")
_IOTA_GROUPS = re.compile(r"replica_groups=\[(\d+),(\d+)\]")
_EXPLICIT_GROUPS = re.compile(r"replica_groups=\{\{([\d,]*)\}")
# mesh['axis_0'=2,'axis_1'=2] {'axis_1'}, or with the devices reordered: ..., device_ids=([2,2]T(1,0)) {...}
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\((?:[^()]|\([^()]*\))*\))?\s*\{([^}]*)\}")
_DCN_RECV = re.compile(r"=\s*(?P<shape>.+?)\s+recv\(.*_xla_megascale_transfer_type=\"(?P<kind>\w+)\"")
_DCN_SLICES = re.compile(r"_xla_megascale_target=\"\{([\d,]*)\}x")  # "{1,2}x{0:3}": slices 1 and 2, devices 0-3
_DCN_GROUPS = re.compile(r"_xla_megascale_target=\{\{([\d,]*)\}")  # {{100000,200000},...}: device ids per group
# Device id -> slice of the program being parsed (`device_slices`): an all-to-all's target names
# every device of its group, several in each slice.
_SLICE_OF: ContextVar[Mapping[int, int] | None] = ContextVar("slice_of", default=None)


@contextmanager
def device_slices(devices: Any) -> Iterator[None]:
    """Parse, inside the block, DCN groups named by device ids as the slices of `devices` (a
    multi-slice topology's devices, each with its `slice_index`)."""
    token = _SLICE_OF.set({int(d.id): int(getattr(d, "slice_index", 0) or 0) for d in devices})
    try:
        yield
    finally:
        _SLICE_OF.reset(token)


@dataclass(frozen=True)
class Collective:
    """One kind of collective with a given group size: how many, and the bytes they produce."""

    kind: str
    group_size: int
    count: int
    bytes: int  # sum of result bytes (per device)
    network: str = "ici"  # "ici" (inside a slice), or "dcn": across slices, group_size counting slices


def add_collectives(base: list[Collective], more: list[Collective], times: int) -> list[Collective]:
    """`base` with `times` x `more` added, one entry a (kind, group size, network), sorted."""
    by_key = {(c.kind, c.group_size, c.network): c for c in base}
    for c in more:
        seen = by_key.get((c.kind, c.group_size, c.network), Collective(c.kind, c.group_size, 0, 0, c.network))
        by_key[(c.kind, c.group_size, c.network)] = replace(
            seen, count=seen.count + times * c.count, bytes=seen.bytes + times * c.bytes
        )
    return sorted(by_key.values(), key=lambda c: (c.kind, c.group_size, c.network))


def parse_collectives(hlo_text: str) -> list[Collective]:
    """Collectives of a compiled module (async -start ops counted once, by their result)."""
    totals: dict[tuple[str, int, str], list[int]] = defaultdict(lambda: [0, 0])
    for line in hlo_text.splitlines():
        dcn = _DCN_RECV.search(line) if "_xla_megascale_transfer_type" in line else None
        match = dcn or _LINE.search(line)
        if not match:
            continue
        shapes = _ARRAY.findall(match.group("shape"))
        if not dcn and match.group("start"):
            # An async start's tuple ends with its result; a permute's adds u32[] context scalars after it.
            shapes = [shape for shape in shapes if shape[1]] or shapes
        arrays = [_bytes(dtype, dims) for dtype, dims in shapes]
        if dcn:
            key = (dcn.group("kind").lower().replace("_", "-"), _dcn_slices(line), "dcn")
            size = arrays[0] if arrays else 0
        elif arrays:
            key = (match.group("kind"), _group_size(line), "ici")
            size = arrays[-1] if match.group("start") else sum(arrays)
        else:
            continue
        totals[key][0] += 1
        totals[key][1] += size
    return [
        Collective(kind, group, count, nbytes, network)
        for (kind, group, network), (count, nbytes) in sorted(totals.items())
    ]


def _dcn_slices(line: str) -> int:
    """Slices in each group of a DCN transfer, from either spelling of its target (2, the fewest a
    transfer across slices can join, where neither is there)."""
    named = _DCN_SLICES.search(line)
    if named:
        return max(2, len([x for x in named.group(1).split(",") if x]))
    explicit = _DCN_GROUPS.search(line)
    if explicit:
        ids = [int(x) for x in explicit.group(1).split(",") if x]
        slice_of = _SLICE_OF.get()
        # Without the devices' slices, each member counts as a slice: an upper bound.
        return max(2, len({slice_of.get(i, i) for i in ids} if slice_of else ids))
    return 2


def _bytes(dtype: str, dims: str) -> int:
    count = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
    return count * DTYPE_BYTES.get(dtype, 4)


def _group_size(line: str) -> int:
    """Devices per replica group, from any of the three HLO spellings."""
    if "source_target_pairs" in line:
        return 2  # a permute sends one buffer to one peer
    mesh = _MESH_GROUPS.search(line)
    if mesh:
        sizes = {name.strip("' "): int(size) for name, size in re.findall(r"'?([\w]+)'?=(\d+)", mesh.group(1))}
        axes = [a.strip("' ") for a in mesh.group(2).split(",") if a.strip()]
        return math.prod(sizes.get(a, 1) for a in axes)
    iota = _IOTA_GROUPS.search(line)
    if iota:
        return int(iota.group(2))
    explicit = _EXPLICIT_GROUPS.search(line)
    if explicit:
        return len([x for x in explicit.group(1).split(",") if x])
    return 1


def ring_seconds(c: Collective, ring_bytes_per_s: float) -> float:
    """Bandwidth-optimal ring cost of a collective over `group_size` devices.

    All-gather moves (n-1)/n of its result through each link; reduce-scatter the same of its
    input (n times its result); all-reduce is both (2 (n-1)/n); all-to-all and permutes move
    their buffer once.
    """
    n = c.group_size
    if n <= 1:
        return 0.0
    share = (n - 1) / n
    moved = {"all-gather": share, "reduce-scatter": n * share, "all-reduce": 2 * share, "all-to-all": share}
    return c.bytes * moved.get(c.kind, 1.0) / ring_bytes_per_s


def latency_steps(c: Collective) -> float:
    """Message steps each of `c`'s ops takes over its group when latency, not bandwidth, bounds it
    (small buffers over a slow network): recursive halving / doubling, log2(n) steps for a
    gather or a scatter and twice that for an all-reduce (Thakur, Rabenseifner and Gropp,
    "Optimization of Collective Communication Operations in MPICH", IJHPCA 2005); an all-to-all
    one step a peer, a permute one. Times `count`: the steps of every such op in the step."""
    n = c.group_size
    if n <= 1:
        return 0.0
    per_op = {"all-gather": math.log2(n), "reduce-scatter": math.log2(n), "all-reduce": 2 * math.log2(n)}
    return c.count * per_op.get(c.kind, float(n - 1) if c.kind == "all-to-all" else 1.0)
