"""The `layout` knob: how the ranks of a multi-process run (``--nproc N``) share a step.

A value is a mesh, ``DATAxFSDPxTENSOR`` (the planner's `Layout`; ``Nx1x1``, data parallel, is the
baseline), applied by the one function every caller shares (`tpu_tuner.parallel.apply.apply_layout`)
on the process group the ranks joined; each rank runs its slice of the global batch (`local_batch`),
so every layout's step times compare directly, and an inference step's outputs are gathered back
for the accuracy guardrail (`gather_output`). The space lists layout *families* (the mesh axes a
layout may spread over), expanded to every factorisation of N with exactly those axes above 1
(`choices`) and narrowed by the model's shapes (`choice_refusal`); with one process the only choice
is ``1x1x1``, not searched. A Hugging Face model splits as it declares (`parallel/hf.py`). More:
docs/knobs.md, "`layout`: how N ranks share a step", and docs/sharding.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from itertools import product
from typing import TYPE_CHECKING, Any, Protocol

from tpu_tuner.knobs.base import BackendLike, Knob
from tpu_tuner.knobs.capabilities import NarrowedByWorkload, SpreadsOverRanks
from tpu_tuner.model.meshes.layouts import Layout, divisors, parse_layout, why_not_ranks

if TYPE_CHECKING:
    from torch import nn

    from tpu_tuner.knobs.traits import WorkloadTraits

SINGLE = "1x1x1"
AXES = ("data", "fsdp", "tensor")
# The families a search space may list: each a set of axes. "data+tensor" runs only an inference
# step (DDP cannot wrap tensor-parallel parameters; `model.meshes.layouts.why_not_ranks`).
FAMILIES = ("data", "fsdp", "tensor", "data+fsdp", "fsdp+tensor", "data+tensor", "data+fsdp+tensor")


def expand(family: str, ranks: int) -> list[str]:
    """Every ``DxFxT`` of `ranks` devices whose axes above 1 are exactly `family`'s."""
    wanted = set(family.split("+"))
    found = []
    for sizes in product(divisors(ranks), repeat=3):
        if math.prod(sizes) == ranks and {axis for axis, size in zip(AXES, sizes) if size > 1} == wanted:
            found.append(Layout(*sizes).short())
    return found


class LayoutKnob(Knob, NarrowedByWorkload, SpreadsOverRanks):
    name = "layout"
    agent = "sharding"
    default = SINGLE
    position = 70  # after the other model hooks: shard the model they changed (checkpointed blocks)

    def check(self, value: str) -> str:
        return parse_layout(super().check(value), context=False).short()

    def choices(self, device_kind: str, entry: dict[str, Any], ranks: int = 1) -> tuple[str, ...]:
        """The families of `entry` expanded for `ranks` ranks, the data-parallel one (the
        baseline) first; ``1x1x1`` alone for one process."""
        if not self.applies_to(device_kind):
            return ()
        families = list(entry.get("choices", {}).get(device_kind, []))
        unknown = [f for f in families if f not in FAMILIES]
        if unknown:
            raise ValueError(f"layout choices are families of mesh axes ({', '.join(FAMILIES)}), not {unknown[0]!r}")
        if ranks == 1 or not families:
            return (SINGLE,) if families else ()
        baseline = f"{ranks}x1x1"
        expanded = [baseline] + [v for family in families for v in expand(family, ranks) if v != baseline]
        return tuple(dict.fromkeys(expanded))

    def choice_refusal(self, value: str, traits: WorkloadTraits) -> str | None:
        """`model.meshes.layouts.why_not_ranks` from the profile's numbers (`tensor_divisor`: the gcd
        of what a tensor axis must divide)."""
        layout = _layout(value)
        widths = (
            {}
            if traits.tensor_divisor is None
            else {"the gcd of its tensor-split widths and head counts": traits.tensor_divisor}
        )
        return why_not_ranks(
            layout,
            layout.devices,
            traits.batch_size,
            traits.repeated_blocks,
            widths if layout.tensor > 1 else {},
            inference=not traits.training,
        )

    def model(self, value: str, model: nn.Module, backend: BackendLike) -> nn.Module:
        return self.model_for_step(value, model, backend, training=True)

    def model_for_step(self, value: str, model: nn.Module, backend: BackendLike, training: bool) -> nn.Module:
        if value == SINGLE:
            return model
        import torch.distributed as dist

        from tpu_tuner.parallel.apply import LayoutError, apply_layout, mesh_device_type

        layout = _layout(value)
        if not (dist.is_available() and dist.is_initialized()):
            raise LayoutError(
                f"layout {value} runs on {layout.devices} processes, one per device: start them "
                f"(torchrun --nproc-per-node {layout.devices}, or tpu-tune --nproc {layout.devices}) "
                "and join a process group first"
            )
        return apply_layout(model, layout, device_type=mesh_device_type(), inference=not training)

    def local_batch(self, value: str, inputs: Any, target: Any) -> tuple[Any, Any]:
        """This rank's slice of the global batch: ranks of one data x fsdp coordinate share one."""
        layout = _layout(value)
        if layout.batch_shards == 1:
            return inputs, target
        import torch.distributed as dist

        from tpu_tuner.model.workloads.batch import batch_size_of, batch_slice
        from tpu_tuner.parallel.apply import batch_shard

        size = batch_size_of(inputs)
        if size is None or size % layout.batch_shards:
            raise ValueError(
                f"layout {value}: the batch of {size} does not split into {layout.batch_shards} equal slices"
            )
        shard = batch_shard(layout, dist.get_rank())
        return (
            batch_slice(inputs, size, layout.batch_shards, shard),
            batch_slice(target, size, layout.batch_shards, shard),
        )

    def gather_output(self, value: str, output: Any, local_batch: int | None) -> Any:
        """Every rank's output of its slice, gathered in batch order (`parallel.inference`)."""
        if value == SINGLE:
            return output
        from tpu_tuner.parallel.inference import gather_batch

        return gather_batch(output, _layout(value), local_batch)

    def within_hosts(self, value: str, ranks_per_host: int) -> bool:
        """`model.meshes.host_mesh`: a tensor size that divides the ranks of a host."""
        from tpu_tuner.model.meshes.host_mesh import tensor_within_host

        return tensor_within_host(_layout(value), ranks_per_host)

    def describe(self, value: str) -> str:
        if value == SINGLE:
            return ""
        layout = _layout(value)
        # "data", not "DDP": an inference step's data axis holds plain replicas.
        parts = [
            f"{name} {size}"
            for name, size in (
                ("data" if layout.fsdp == 1 else "replicas", layout.data),
                ("FSDP", layout.fsdp),
                ("TP", layout.tensor),
            )
            if size > 1
        ]
        return "layout " + " x ".join(parts)

    def code(self, value: str, device_kind: str) -> list[str]:
        return self.code_for_step(value, device_kind, training=True)

    def code_for_step(self, value: str, device_kind: str, training: bool) -> list[str]:
        if value == SINGLE:
            return []
        layout = _layout(value)
        mesh = f"Layout(data={layout.data}, fsdp={layout.fsdp}, tensor={layout.tensor})"
        lines = [
            "# one process per device, each joined to the process group first "
            f"(torchrun --nproc-per-node {layout.devices} script.py)",
            "from tpu_tuner.model.meshes.layouts import Layout",
            "from tpu_tuner.parallel.apply import apply_layout",
        ]
        if training:
            return lines + [
                f"model = apply_layout(model, {mesh}, device_type={device_kind!r})  # before the optimizer is built"
            ]
        lines.append(
            f"model = apply_layout(model, {mesh}, device_type={device_kind!r}, inference=True)  "
            "# every rank holds rank 0's weights (or its shards of them)"
        )
        if layout.batch_shards > 1:
            lines += [
                f"# each rank runs its slice of the global batch ({layout.batch_shards} slices: rank "
                f"// {layout.tensor}'s); the whole batch's output on every rank, where you need it:",
                "#   from tpu_tuner.parallel.inference import gather_batch",
                f"#   output = gather_batch(output, {mesh}, local_batch)  # local_batch: your slice's size",
            ]
        return lines

    def training_code(self, value: str, device_kind: str) -> list[str]:
        layout = _layout(value)
        if layout.batch_shards == 1:
            return []
        return [
            f"# each rank trains on its slice of the global batch: {layout.batch_shards} slices, "
            f"ranks of one tensor group ({layout.tensor}) share one",
            "from torch.utils.data.distributed import DistributedSampler",
            f"sampler = DistributedSampler(dataset, num_replicas={layout.batch_shards}, "
            f"rank=torch.distributed.get_rank() // {layout.tensor})",
        ]

    def observe(self, model: nn.Module, forward: Callable[..., Any], backend: BackendLike) -> str | None:
        """The mesh the model's parameters are laid out on: DDP's replicas, or the mesh axes of
        its DTensor parameters (FSDP shards, tensor-parallel shards), and the replicas of an
        inference layout (plain tensors: `apply_layout` marks their count on the model)."""
        from torch.distributed.tensor import DTensor
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(model, DistributedDataParallel):
            import torch.distributed as dist

            return f"{dist.get_world_size()}x1x1"
        sizes = {axis: 1 for axis in AXES}
        for parameter in model.parameters():
            if isinstance(parameter, DTensor):
                mesh = parameter.device_mesh
                for axis, size in zip(mesh.mesh_dim_names or (), mesh.shape):
                    if axis in sizes:
                        sizes[axis] = max(sizes[axis], size)
        from tpu_tuner.parallel.apply import REPLICAS_MARK

        sizes["data"] = max(sizes["data"], int(getattr(model, REPLICAS_MARK, 1)))
        return Layout.from_mesh(sizes).short()

    # --- the tuned config: [sharding.mesh] repeats the layout for planners' readers -----------

    def config_tables(self, value: str) -> dict[str, dict[str, Any]]:
        return {} if value == SINGLE else {"sharding": {"mesh": _layout(value).mesh_shape()}}

    def from_config_tables(self, value: str, tables: Mapping[str, Any]) -> str:
        """The layout of a [sharding.mesh] table (configs that give the mesh alone, as a planner's
        sharding_config.toml does); ValueError where the two disagree."""
        sharding = tables.get("sharding")
        mesh = sharding.get("mesh") if isinstance(sharding, dict) else None
        if not mesh:
            return value
        try:
            meshed = self.check(Layout.from_mesh({axis: mesh.get(axis, 1) for axis in AXES}).short())
        except (TypeError, ValueError, AttributeError):
            raise ValueError(f"[sharding.mesh] must give integer data / fsdp / tensor sizes, not {mesh!r}") from None
        if value not in (SINGLE, meshed):
            raise ValueError(f"[settings] layout {value} and [sharding.mesh] {meshed} disagree")
        return meshed

    def instructions(self, value: str, backend: BackendLike) -> list[str]:
        if value == SINGLE:
            return []
        layout = _layout(value)
        return [
            f"# sharding {layout.name()}: run one process per device ({layout.devices}, e.g. torchrun "
            f"--nproc-per-node {layout.devices}), each joined to the process group "
            f"({backend.process_group_backend!r}) before apply(), which shards the model on it (or alone: "
            "tpu_tuner.knobs.tuned_config.apply_sharding(model, config))"
        ]


def _layout(value: str) -> Layout:
    return parse_layout(value, context=False)


class KnobValues(Protocol):
    """Knob values by knob name: a mapping, or a `Candidate`."""

    def __getitem__(self, name: str, /) -> str: ...


def layout_in(settings: KnobValues) -> Layout:
    """The layout a candidate (or a tuned config's settings) runs under: how the agents of other
    knobs and the sharded numerics check read this knob's value without naming it."""
    return parse_layout(settings[LayoutKnob.name], context=False)
