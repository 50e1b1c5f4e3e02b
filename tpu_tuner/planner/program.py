"""The user's PyTorch model as a sharded JAX training step, compiled ahead of time for a TPU slice.

Route: torchax (Google's PyTorch-on-JAX library, imported through `torchax_compat`) turns the
torch module's forward into a JAX function. Parameters are never materialised: the model is
built on the ``meta`` device and enters the compiler as `jax.ShapeDtypeStruct`s with their
`NamedSharding`, so a 70B model plans on a laptop. The step is MaxText's: fp32 master weights
cast to bf16 for compute, cross-entropy, backward, AdamW (fp32 moments), with activation
sharding constraints on the residual stream and optional full rematerialisation per block.

Depth is handled by *block scaling*: the program is compiled with 1 and with 2 repeated blocks,
and every figure (FLOPs, bytes, memory, collectives) is extrapolated linearly to the model's
depth. The report says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from tpu_tuner.planner.collectives import Collective, parse_collectives
from tpu_tuner.planner.layouts import Layout, partition_spec, placements

log = logging.getLogger(__name__)


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

    @property
    def peak_bytes(self) -> float:
        """Live bytes at the peak: arguments + outputs not aliased to them + temporaries."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes


# The planner reads the compiler's analyses and never runs the program, so collectives are emitted
# as mocks: their code for a group of thousands of devices is most of the backend's time there.
# Measured: the same FLOPs, bytes, memory and collectives (kind, group, count, bytes) as without.
COMPILE_OPTIONS: dict[str, Any] = {"xla_tpu_mock_collectives": True}
# `--fast` also asks for the least execution-time optimisation: 2-4x quicker compiles with the same
# FLOPs and collectives, but the compiler then schedules rematerialised blocks less tightly, so
# temporaries grow faster with depth (Llama-3.1-8B on v6e-256: 4.5 GiB a block instead of 0.6,
# 151 GiB extrapolated instead of 28). Good for screening layouts, not for "does it fit".
FAST_COMPILE_OPTIONS: dict[str, Any] = {**COMPILE_OPTIONS, "exec_time_optimization_effort": -1.0}

# Rematerialisation per block, as MaxText names them: "full" recomputes the whole block in backward,
# "minimal" keeps the outputs of weight matmuls and recomputes the rest, "none" keeps everything.
REMAT_POLICIES = {"none": None, "minimal": "dots_with_no_batch_dims_saveable", "full": "nothing_saveable"}


def blocks_of(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The repeated blocks: the longest ModuleList of same-typed modules."""
    best: tuple[str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) and len({type(m) for m in module}) == 1:
            if best is None or len(module) > len(best[1]):
                best = (name, module)
    if best is None:
        raise ValueError("the model has no ModuleList of repeated blocks to scale")
    return best


def truncated(model: nn.Module, keep: int) -> nn.Module:
    """The model with only its first `keep` repeated blocks (shares the rest)."""
    name, blocks = blocks_of(model)
    parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
    setattr(parent, name.rsplit(".", 1)[-1], nn.ModuleList(list(blocks)[:keep]))
    return model


def compile_step(
    build_meta_model: Callable[[], nn.Module],
    blocks: int,
    layout: Layout,
    devices: Any,
    global_batch: int,
    seq_len: int,
    d_model: int,
    remat: str,
    fast: bool = False,
) -> CompiledStep:
    """Compile one training step of the model cut to `blocks` blocks on `devices` (a TPU topology).

    On a TPU topology it compiles with COMPILE_OPTIONS, or FAST_COMPILE_OPTIONS when `fast`."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from tpu_tuner.planner.torchax_compat import import_torchax

    torchax = import_torchax()
    from torchax.interop import JittableModule, jax_view, torch_view

    with torch.device("meta"):
        model = build_meta_model()
    blocks_name, _ = blocks_of(model)
    model = truncated(model, blocks)
    mesh = Mesh(np.asarray(devices).reshape(layout.data, layout.fsdp, layout.tensor), ("data", "fsdp", "tensor"))
    # The residual stream [batch, seq, embed] splits its batch over (data, fsdp) and is replicated
    # over tensor (Megatron). MaxText's alternative, embed over tensor, was tried: on the 32B
    # calibration row it raised peak memory (144 -> 179 GiB) and doubled the compile time.
    residual = NamedSharding(mesh, PartitionSpec(("data", "fsdp"), None, None))

    def constrain(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        return torch_view(jax.lax.with_sharding_constraint(jax_view(output), residual))

    block_list = model.get_submodule(blocks_name)
    for module in [*block_list, *[m for m in model.modules() if isinstance(m, nn.Embedding)]]:
        module.register_forward_hook(constrain)
    policy = REMAT_POLICIES[remat]
    if policy is not None:
        for block in block_list:
            block.forward = torchax.interop.gradient_checkpoint(block.forward, kwargs={"policy": getattr(jax.checkpoint_policies, policy)})

    placement = placements(model, d_model)
    jittable = JittableModule(model)
    env = torchax.default_env()
    if np.asarray(devices).flat[0].platform == "tpu":
        _use_flash_attention(env, mesh)

    def param_struct(name: str, tensor: torch.Tensor) -> Any:
        spec = partition_spec(placement.get(name, "replicated"), tensor.dim())
        return jax.ShapeDtypeStruct(tuple(tensor.shape), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec(*spec)))

    params = {name: param_struct(name, t) for name, t in jittable.params.items()}
    buffers = {name: jax.ShapeDtypeStruct(tuple(t.shape), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec()))
               for name, t in jittable.buffers.items()}
    tokens = jax.ShapeDtypeStruct((global_batch, seq_len), jnp.int32,
                                  sharding=NamedSharding(mesh, PartitionSpec(("data", "fsdp"), None)))

    def loss_fn(weights: Any, buffer_values: Any, inputs: Any, targets: Any) -> Any:
        compute = jax.tree.map(lambda w: w.astype(jnp.bfloat16), weights)  # bf16 compute, fp32 master
        torch_weights, torch_buffers, torch_inputs = env.j2t_iso((compute, buffer_values, inputs))
        with env:
            logits = jittable.functional_call("forward", torch_weights, torch_buffers, torch_inputs)
        logits = env.t2j_iso(logits)
        # Cross-entropy without a float32 copy of the logits: the fp32 log-sum-exp fuses into its
        # reduction, as in MaxText; a [tokens, vocab] fp32 buffer would dominate HBM at 128k vocab.
        lse = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
        target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0].astype(jnp.float32)
        return (lse - target_logit).mean()

    def train_step(weights: Any, moments: Any, buffer_values: Any, inputs: Any, targets: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(weights, buffer_values, inputs, targets)
        first, second = moments
        first = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, first, grads)
        second = jax.tree.map(lambda v, g: 0.95 * v + 0.05 * g * g, second, grads)
        weights = jax.tree.map(lambda w, m, v: w - 1e-4 * (m / (jnp.sqrt(v) + 1e-8) + 0.1 * w), weights, first, second)
        return weights, (first, second), loss

    start = time.perf_counter()
    lowered = jax.jit(train_step, donate_argnums=(0, 1)).lower(params, (params, params), buffers, tokens, tokens)
    on_tpu = np.asarray(devices).flat[0].platform == "tpu"
    try:
        compiled = lowered.compile(dict(FAST_COMPILE_OPTIONS if fast else COMPILE_OPTIONS) if on_tpu else None)
    except Exception as exc:  # noqa: BLE001 - the compiler reports out-of-HBM as an exception
        message = str(exc).strip().splitlines()[0]
        return CompiledStep(0, 0, 0, 0, 0, 0, [], time.perf_counter() - start, error=message)
    seconds = time.perf_counter() - start
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list):
        cost = cost[0]
    memory = compiled.memory_analysis()
    return CompiledStep(
        flops=float(cost.get("flops", 0.0)),
        bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        argument_bytes=float(memory.argument_size_in_bytes),
        output_bytes=float(memory.output_size_in_bytes),
        temp_bytes=float(memory.temp_size_in_bytes),
        alias_bytes=float(memory.alias_size_in_bytes),
        collectives=parse_collectives(compiled.as_text()),
        compile_seconds=seconds,
    )


def _use_flash_attention(env: Any, mesh: Any) -> None:
    """Run F.scaled_dot_product_attention as TPU flash attention (Pallas), as MaxText does.

    torchax's own translation materialises the [batch, heads, seq, seq] scores, which at 8k
    tokens outweighs everything else in HBM; on a TPU the attention is a flash kernel that never
    does. Heads split over the tensor axis, the batch over (data, fsdp).
    """
    import jax
    import torch.nn.functional as F
    from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash
    from jax.sharding import PartitionSpec
    from torchax.interop import jax_view, torch_view

    spec = PartitionSpec(("data", "fsdp"), "tensor", None, None)

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None or dropout_p or key.shape[1] != query.shape[1]:
            raise NotImplementedError("the planner's flash attention takes causal or full attention with equal heads")
        q, k, v = (jax_view(t) for t in (query, key, value))
        sm_scale = scale if scale is not None else q.shape[-1] ** -0.5
        kernel = jax.shard_map(
            lambda q, k, v: pallas_flash.flash_attention(q, k, v, causal=bool(is_causal), sm_scale=sm_scale),
            mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False,
        )
        return torch_view(kernel(q, k, v))

    env.override_op_definition(F.scaled_dot_product_attention, sdpa)


def extrapolate(one: CompiledStep, two: CompiledStep, blocks: int) -> CompiledStep:
    """Linear in depth: figure(L) = figure(1) + (L - 1) * (figure(2) - figure(1))."""
    def scale(a: float, b: float) -> float:
        return a + (blocks - 1) * (b - a)

    by_key = {(c.kind, c.group_size): c for c in one.collectives}
    collectives = []
    for c2 in two.collectives:
        c1 = by_key.get((c2.kind, c2.group_size), Collective(c2.kind, c2.group_size, 0, 0))
        collectives.append(replace(c2, count=max(0, round(scale(c1.count, c2.count))), bytes=max(0, round(scale(c1.bytes, c2.bytes)))))
    return CompiledStep(
        flops=scale(one.flops, two.flops),
        bytes_accessed=scale(one.bytes_accessed, two.bytes_accessed),
        argument_bytes=scale(one.argument_bytes, two.argument_bytes),
        output_bytes=scale(one.output_bytes, two.output_bytes),
        # Temporaries follow the compiler's schedule, which may pack two blocks tighter than one
        # (measured: 70B, data 2 x fsdp 512 x tensor 8: 5.52 GiB with one block, 5.12 with two).
        # A negative slope is scheduling noise, not memory freed by depth: never extrapolate it
        # below the larger of the two measured figures.
        temp_bytes=max(scale(one.temp_bytes, two.temp_bytes), one.temp_bytes, two.temp_bytes),
        alias_bytes=scale(one.alias_bytes, two.alias_bytes),
        collectives=collectives,
        compile_seconds=one.compile_seconds + two.compile_seconds,
    )
