"""The planner's joint space: layout (data x fsdp x tensor x context), remat policy, and
gradient accumulation under a fixed global batch; which points are valid, and a lower bound on
each point's HBM that rules points out before any compile.

The per-device batch is not a free axis: with the global batch fixed, the micro-batch count
decides it (global batch / micro-batches / devices, MaxText's per_device_batch_size), as
MaxText's per_device_batch_size and gradient_accumulation_steps do together.

Over several slices a fourth layout axis, ``dcn``, says how the slices split between data and fsdp
("2x1": both slices' ways on data, MaxText's default; "1x2": on fsdp); a single-slice space has
none, so its trials and study records are as before.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from tpu_tuner.model.meshes.layouts import Layout, ModelShape, why_not
from tpu_tuner.planner.compiler.optimizer import state_bytes_per_parameter
from tpu_tuner.planner.compiler.remat import BLOCK_INPUT, parse_remat

# The policies a search tries by default: MaxText's named ones that differ in what they keep, and
# the published recipes' kind of custom policy (the block input, or it and q/k/v, in host memory).
DEFAULT_REMATS = (
    "full",
    "minimal",
    "save_dot_except_mlpwi",
    "save_dot_except_mlp",
    "save_qkv_proj",
    "save_out_proj",
    "qkv_proj_offloaded",
    "minimal_offloaded",
    "custom:decoder_layer_input=offload",
    "custom:decoder_layer_input=offload,query_proj=offload,key_proj=offload,value_proj=offload",
)
DEFAULT_ACCUMULATIONS = (1, 2, 4, 8)
DEFAULT_CONTEXTS = (1, 2, 4)


@dataclass(frozen=True)
class PlanPoint:
    """One candidate: a layout, a remat policy, a micro-batch count and, where searched, the flash
    kernel's block size (None: the plan's step's, `StepSettings.flash_block`)."""

    layout: Layout
    remat: str = "full"
    accumulation: int = 1
    flash_block: int | None = None

    def name(self) -> str:
        steps = f", {self.accumulation} micro-batches" if self.accumulation > 1 else ""
        blocks = f", flash blocks {self.flash_block}" if self.flash_block is not None else ""
        return f"{self.layout.name()}, remat {self.remat}{steps}{blocks}"

    def key(self) -> str:
        """A short stable identifier (the Optuna trial attribute that finds repeats); a point
        without its own block keeps the key it had before blocks were an axis (kept studies)."""
        blocks = f"|{self.flash_block}" if self.flash_block is not None else ""
        return f"{self.layout.short()}|{self.remat}|{self.accumulation}{blocks}"

    def per_device_batch(self, global_batch: int) -> float:
        """MaxText's per_device_batch_size: sequences per device in one micro-batch (global batch /
        micro-batches / devices; devices that split a sequence share it)."""
        return global_batch / self.accumulation / self.layout.devices


@dataclass(frozen=True)
class PlanSpace:
    """The choices of each axis; fsdp takes the devices the others leave."""

    tensors: tuple[int, ...]
    contexts: tuple[int, ...] = (1,)
    datas: tuple[int, ...] = (1,)
    remats: tuple[str, ...] = DEFAULT_REMATS
    accumulations: tuple[int, ...] = (1,)
    dcns: tuple[str, ...] = ()  # over several slices: DCN_DATAxDCN_FSDP choices (none: one slice)
    # The flash kernel's block sizes (none: no axis, the step's block): an axis only when given, so
    # a search without it keeps the trial parameters, and the studies, it had before.
    flash_blocks: tuple[int, ...] = ()

    def axes(self) -> dict[str, tuple]:
        """Each axis's choices by its trial parameter's name (dcn only over several slices)."""
        return {
            "tensor": self.tensors,
            "context": self.contexts,
            "data": self.datas,
            "remat": self.remats,
            "accumulation": self.accumulations,
            **({"dcn": self.dcns} if self.dcns else {}),
            **({"flash_block": self.flash_blocks} if self.flash_blocks else {}),
        }

    def describe(self) -> dict[str, list]:
        return {axis: list(choices) for axis, choices in self.axes().items()}


def default_space(
    devices: int,
    shape: ModelShape,
    seq_len: int,
    remats: tuple[str, ...] = DEFAULT_REMATS,
    accumulations: tuple[int, ...] = DEFAULT_ACCUMULATIONS,
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS,
    slices: int = 1,
    flash_blocks: tuple[int, ...] = (),
) -> PlanSpace:
    """Every tensor size that divides the heads, KV heads, MLP width and vocabulary (and the
    devices); context sizes that divide the sequence; data sizes in powers of two; over `slices`
    slices, every split of them between data and fsdp."""
    tensors = tuple(
        t
        for t in range(1, devices + 1)
        if devices % t == 0
        and not (shape.n_heads % t or shape.n_kv_heads % t or shape.mlp_hidden % t or shape.vocab % t)
    )
    datas = tuple(d for d in (2**k for k in range(devices.bit_length())) if devices % d == 0)
    dcns = tuple(f"{d}x{slices // d}" for d in range(slices, 0, -1) if slices % d == 0) if slices > 1 else ()
    return PlanSpace(
        tensors,
        tuple(c for c in contexts if devices % c == 0 and seq_len % c == 0),
        datas,
        tuple(remats),
        tuple(accumulations),
        dcns,
        tuple(flash_blocks),
    )


# What `point_of` needs; dcn and flash_block are optional.
POINT_AXES = frozenset({"tensor", "context", "data", "remat", "accumulation"})


def point_of(space_choice: dict, devices: int) -> PlanPoint | None:
    """The point of one choice per axis (None when the axes leave no whole fsdp size, or data and
    fsdp no whole share of the slices)."""
    tensor, context, data = space_choice["tensor"], space_choice["context"], space_choice["data"]
    if devices % (tensor * context * data):
        return None
    dcn_data, dcn_fsdp = (int(n) for n in space_choice.get("dcn", "1x1").split("x"))
    fsdp = devices // (tensor * context * data)
    if data % dcn_data or fsdp % dcn_fsdp:
        return None
    layout = Layout(data, fsdp, tensor, context, dcn_data=dcn_data, dcn_fsdp=dcn_fsdp)
    return PlanPoint(layout, space_choice["remat"], space_choice["accumulation"], space_choice.get("flash_block"))


def flash_block_refusal(block: int | None, seq_len: int, context: int = 1) -> str | None:
    """Why the flash kernel cannot take `block`-sized blocks of this sequence (None: it can). A
    device's queries are the sequence / context, its keys the whole (gathered) sequence; a block
    that divides neither would leave the kernel its default blocks unsaid (step_parts._flash_blocks)."""
    if block is None:
        return None
    queries = seq_len // context
    if seq_len % block or queries % block:
        split = f" ({queries} a device over context {context})" if context > 1 else ""
        return f"flash blocks of {block} do not divide the sequence {seq_len}{split}"
    return None


def invalid_reason(
    point: PlanPoint, shape: ModelShape, global_batch: int, seq_len: int, flash_block: int | None = None
) -> str | None:
    """Why the point cannot run this model and batch (None: it can); `flash_block` is the step's
    block, which a point's own replaces."""
    block = point.flash_block if point.flash_block is not None else flash_block
    blocks = flash_block_refusal(block, seq_len, point.layout.context)
    if blocks:
        return blocks
    if global_batch % point.accumulation:
        return f"{point.accumulation} micro-batches do not divide the global batch {global_batch}"
    micro = global_batch // point.accumulation
    reason = why_not(point.layout, shape, micro, seq_len)
    if reason and point.accumulation > 1:
        reason = reason.replace(f"global batch {micro}", f"micro-batch {micro} ({global_batch} / {point.accumulation})")
    return reason


def valid_points(space: PlanSpace, devices: int, shape: ModelShape, global_batch: int, seq_len: int) -> list[PlanPoint]:
    """Every valid point of the space, in a fixed order (the grid plan's)."""
    axes = space.axes()
    points = []
    for choice in itertools.product(*axes.values()):
        point = point_of(dict(zip(axes, choice)), devices)
        if point is not None and invalid_reason(point, shape, global_batch, seq_len) is None:
            points.append(point)
    return points


@dataclass(frozen=True)
class MemoryBound:
    """A lower bound on a point's HBM per device, from sizes the compiler cannot shrink."""

    weights_and_moments: (
        float  # the weights and the optimizer's state (AdamW's moments), split over the parameter shards
    )
    accumulated_gradients: float  # the fp32 gradient sum across micro-batches
    block_inputs: float  # every block's input (bf16), kept for the backward pass on the device

    @property
    def total(self) -> float:
        return self.weights_and_moments + self.accumulated_gradients + self.block_inputs


def memory_lower_bound(
    point: PlanPoint,
    matrix_parameters: int,
    shape: ModelShape,
    global_batch: int,
    seq_len: int,
    first_moment_bytes: int = 4,
    weight_bytes: int = 4,
    saved_inputs: int | None = None,
    optimizer: str = "adamw",
) -> MemoryBound:
    """What no compile of `point` can need less of, per device.

    Only matrix parameters count (1-D ones are replicated; leaving them out keeps it a lower
    bound), split over fsdp x context x tensor. The block inputs are the scan's saved carry:
    [micro-batch / shards, sequence / context, d_model / tensor] in bf16 per block, unless the
    policy keeps them in host memory: one per block, or `saved_inputs` (a loop over repeats of a
    layer pattern keeps one a repeat: structure.Dims.saved_block_inputs). The planner checks this
    bound against every compile it makes (a bound above a compiled peak is logged as an error in
    the bound)."""
    layout = point.layout
    # The weights and AdamW's second moment in the weights' dtype (MaxText's weight_dtype), the first in its own;
    # SGD keeps no state (optimizer.py).
    per_parameter = weight_bytes + state_bytes_per_parameter(optimizer, first_moment_bytes, weight_bytes)
    weights = float(per_parameter) * matrix_parameters / layout.parameter_shards
    accumulated = 4.0 * matrix_parameters / layout.parameter_shards if point.accumulation > 1 else 0.0
    inputs = 0.0
    if parse_remat(point.remat).action(BLOCK_INPUT) != "offload":
        tokens = global_batch / point.accumulation / layout.batch_shards * seq_len / layout.context
        inputs = (saved_inputs or shape.n_layers) * tokens * shape.d_model / layout.tensor * 2.0
    return MemoryBound(weights, accumulated, inputs)
