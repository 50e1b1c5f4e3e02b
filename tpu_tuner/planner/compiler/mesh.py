"""The device mesh of a layout: one slice's devices in their order, or a hybrid mesh over slices.

Over several slices the mesh is built as MaxText builds it (`create_device_mesh` in
src/maxtext/utils/maxtext_utils.py at AI-Hypercomputer/maxtext@e591f30c, which calls
`jax.experimental.mesh_utils.create_hybrid_device_mesh(ici_parallelism, dcn_parallelism, ...)`):
each mesh axis is its DCN ways (across slices, outer) times its ICI ways (inside a slice, inner),
so a collective over an axis with no DCN ways stays inside a slice. Inside each slice the devices
keep the order a single-slice plan gives them (a plain reshape), so one slice of a multi-slice
plan is laid out as the single-slice plan of that slice is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tpu_tuner.model.meshes.layouts import MESH_AXES, Layout

# The axes that split the batch (MaxText's activation_batch rule: data, fsdp, fsdp_transpose, expert).
BATCH_AXES = ("data", "fsdp", "fsdp_transpose", "expert")


def mesh_devices(devices: Any, layout: Layout) -> np.ndarray:
    """The devices as an array over MESH_AXES: DCN ways outer, ICI ways inner on each axis. The
    layout's DCN ways make the devices' slice count: Topology.check_layout refused any other."""
    flat = list(np.asarray(devices).flat)
    by_slice: dict[int, list[Any]] = {}
    for device in flat:
        by_slice.setdefault(int(getattr(device, "slice_index", 0) or 0), []).append(device)
    if layout.slices == 1:
        return np.asarray(flat).reshape(layout.mesh_sizes())
    dcn, ici = layout.dcn_sizes(), layout.ici_sizes()
    grid = np.asarray([by_slice[index] for index in sorted(by_slice)], dtype=object)  # [slices, per slice]
    grid = grid.reshape(*dcn, *ici)
    axes = len(MESH_AXES)
    # (dcn_0, ..., dcn_5, ici_0, ..., ici_5) -> (dcn_0, ici_0, dcn_1, ici_1, ...) -> each axis whole
    order = [i for pair in zip(range(axes), range(axes, 2 * axes)) for i in pair]
    return grid.transpose(order).reshape(layout.mesh_sizes())


def layout_mesh(devices: Any, layout: Layout) -> Any:
    """The `jax.sharding.Mesh` of `layout` over `devices` (axes MESH_AXES)."""
    from jax.sharding import Mesh

    return Mesh(mesh_devices(devices, layout), MESH_AXES)


__all__ = ["BATCH_AXES", "layout_mesh", "mesh_devices"]
