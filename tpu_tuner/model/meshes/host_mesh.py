"""How a layout's mesh maps onto the hosts of a multi-host run (pure arithmetic).

The ranks of a run of M hosts x N ranks are numbered host by host (node k holds global ranks
k*N .. k*N+N-1, `runner/hosts.py`), and the mesh (data, fsdp, tensor) lays them out in row-major
order, as `init_device_mesh` does: the tensor axis varies fastest, so a tensor group of size T
stays within a host exactly when T divides N, an fsdp x tensor group when F*T does. (TorchTPU's
`topology_aware_mesh` orders ranks by the chip interconnect instead; there the slice decides.)
"""

from __future__ import annotations

from itertools import product

from tpu_tuner.model.meshes.layouts import Layout

AXES = ("data", "fsdp", "tensor")


def coordinates(layout: Layout, rank: int) -> tuple[int, int, int]:
    """The (data, fsdp, tensor) coordinate of global rank `rank` in the row-major mesh."""
    data, rest = divmod(rank, layout.fsdp * layout.tensor)
    fsdp, tensor = divmod(rest, layout.tensor)
    return data, fsdp, tensor


def axes_within_hosts(layout: Layout, nproc: int) -> dict[str, bool]:
    """Per mesh axis of size above 1: whether every group along it (ranks that differ in that
    coordinate alone) lies on one host of `nproc` ranks."""
    sizes = dict(zip(AXES, (layout.data, layout.fsdp, layout.tensor)))
    strides = {"data": layout.fsdp * layout.tensor, "fsdp": layout.tensor, "tensor": 1}
    within = {}
    for axis, size in sizes.items():
        if size == 1:
            continue
        others = [range(s) for a, s in sizes.items() if a != axis]
        within[axis] = True
        for fixed in product(*others):
            start = sum(c * strides[a] for a, c in zip((a for a in AXES if a != axis), fixed))
            hosts = {(start + i * strides[axis]) // nproc for i in range(size)}
            if len(hosts) > 1:
                within[axis] = False
                break
    return within


def tensor_within_host(layout: Layout, nproc: int) -> bool:
    """Whether the layout's tensor groups stay within a host of `nproc` ranks."""
    return axes_within_hosts(layout, nproc).get("tensor", True)


def describe_on_hosts(layout: Layout, nnodes: int, nproc: int, names: list[str] | None = None) -> str:
    """One line: which ranks and mesh coordinates each host holds, and which axes cross hosts,
    e.g. "1x2x2: node 0 (a) ranks 0-1 = fsdp 0 x tensor 0-1; node 1 (b) ranks 2-3 = fsdp 1 x
    tensor 0-1; tensor within a host, fsdp across hosts"."""
    parts = []
    for node in range(nnodes):
        ranks = range(node * nproc, (node + 1) * nproc)
        coords = [coordinates(layout, r) for r in ranks]
        held = " x ".join(
            f"{axis} {_span(sorted({c[i] for c in coords}))}"
            for i, axis in enumerate(AXES)
            if (layout.data, layout.fsdp, layout.tensor)[i] > 1
        )
        who = f"node {node}" + (f" ({names[node]})" if names and node < len(names) else "")
        parts.append(f"{who} rank{'s' if nproc > 1 else ''} {_span(list(ranks))}" + (f" = {held}" if held else ""))
    within = axes_within_hosts(layout, nproc)
    placement = ", ".join(f"{axis} {'within a host' if inside else 'across hosts'}" for axis, inside in within.items())
    return f"{layout.short()}: " + "; ".join(parts) + (f"; {placement}" if placement else "")


def _span(values: list[int]) -> str:
    """0-3 for a run of consecutive numbers, else the numbers."""
    if len(values) > 1 and values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}-{values[-1]}"
    return ",".join(str(v) for v in values)


__all__ = ["axes_within_hosts", "coordinates", "describe_on_hosts", "tensor_within_host"]
