"""How a model is laid over devices, in pure arithmetic (no torch): the room of `model/` that
imports no other.

* `layouts.py`: the `Layout` vocabulary (data x fsdp x tensor, context, and the whole mesh's
  fsdp_transpose, expert and DCN axes), what a model's structure says of it (`ModelShape`), the
  layouts of N devices (`enumerate_layouts`), a layout named on a command line (`parse_layout`),
  why a layout cannot run (`why_not`, `why_not_ranks`) and each parameter's placement
  (`placements`);
* `host_mesh.py`: how a layout's mesh maps onto the hosts of a multi-host run.

The sharding that applies a layout is `parallel/`; the planner's JAX mesh is
`planner/compiler/mesh.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpu_tuner.core.lazy import lazy_exports

if TYPE_CHECKING:
    from tpu_tuner.model.meshes.host_mesh import describe_on_hosts
    from tpu_tuner.model.meshes.layouts import (
        Layout,
        ModelShape,
        enumerate_layouts,
        parse_layout,
        placements,
        why_not_ranks,
    )

# Imported on first use (PEP 562): the face imports none of its modules, and so no torch.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Layout": f"{__name__}.layouts",
        "ModelShape": f"{__name__}.layouts",
        "enumerate_layouts": f"{__name__}.layouts",
        "parse_layout": f"{__name__}.layouts",
        "placements": f"{__name__}.layouts",
        "why_not_ranks": f"{__name__}.layouts",
        "describe_on_hosts": f"{__name__}.host_mesh",
    },
)

__all__ = [
    "Layout",
    "ModelShape",
    "describe_on_hosts",
    "enumerate_layouts",
    "parse_layout",
    "placements",
    "why_not_ranks",
]
