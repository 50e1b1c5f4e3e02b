"""Collectives in compiled HLO text: kind, bytes, group size; and their cost on an ICI torus."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "s32": 4, "u32": 4, "s64": 8, "u64": 8,
               "s8": 1, "u8": 1, "pred": 1, "s16": 2, "u16": 2, "f8e4m3fn": 1, "f8e5m2": 1}
_LINE = re.compile(r"=\s*(?P<shape>.+?)\s+(?P<kind>" + "|".join(KINDS) + r")(?P<start>-start)?\(")
_ARRAY = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")
_IOTA_GROUPS = re.compile(r"replica_groups=\[(\d+),(\d+)\]")
_EXPLICIT_GROUPS = re.compile(r"replica_groups=\{\{([\d,]*)\}")
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")


@dataclass(frozen=True)
class Collective:
    """One kind of collective with a given group size: how many, and the bytes they produce."""

    kind: str
    group_size: int
    count: int
    bytes: int  # sum of result bytes (per device)


def parse_collectives(hlo_text: str) -> list[Collective]:
    """Collectives of a compiled module (async -start ops counted once, by their result)."""
    totals: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for line in hlo_text.splitlines():
        match = _LINE.search(line)
        if not match:
            continue
        arrays = [_bytes(dtype, dims) for dtype, dims in _ARRAY.findall(match.group("shape"))]
        if not arrays:
            continue
        size = arrays[-1] if match.group("start") else sum(arrays)
        entry = totals[(match.group("kind"), _group_size(line))]
        entry[0] += 1
        entry[1] += size
    return [Collective(kind, group, count, nbytes) for (kind, group), (count, nbytes) in sorted(totals.items())]


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
    if c.kind == "all-gather":
        moved = c.bytes * share
    elif c.kind == "reduce-scatter":
        moved = c.bytes * n * share
    elif c.kind == "all-reduce":
        moved = 2 * c.bytes * share
    elif c.kind == "all-to-all":
        moved = c.bytes * share
    else:
        moved = c.bytes
    return moved / ring_bytes_per_s
