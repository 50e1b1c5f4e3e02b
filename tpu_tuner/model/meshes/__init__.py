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
