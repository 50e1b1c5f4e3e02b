"""The user's PyTorch model as a sharded JAX training step, compiled ahead of time for a TPU slice.

Route: torchax (Google's PyTorch-on-JAX library, imported through `torchax_compat`) turns the
torch module's forward into a JAX function. Parameters are never materialised: the model is
built on the ``meta`` device and enters the compiler as `jax.ShapeDtypeStruct`s with their
`NamedSharding`, so a 70B model plans on a laptop. The step is MaxText's: fp32 master weights
cast to bf16 for compute, cross-entropy, backward, AdamW (fp32 moments, or MaxText's mu_dtype
bf16 first moment) or SGD without momentum (optimizer.py), with activation
sharding constraints on the residual stream and optional rematerialisation per block.

Depth is handled as MaxText does it (``scan_layers``): the repeated blocks run as one
`jax.lax.scan` over per-block weights stacked on a leading axis, so the compiler sees the whole
model at its real depth (its memory analysis is the real program's: every saved activation,
every buffer) while compiling one block. XLA's cost analysis counts a loop body once, so the
other (depth - 1) iterations are measured from the same compiled program's HLO (`loop_costs`)
and added by `add_loop_iterations` (compiled_step.py): one compile a layout. Where that
measurement is not possible the plan falls back to a second program, the model with no blocks ("ends": embedding, head,
loss), and `combine_scanned` takes the difference as one block. Tests check both against an
unrolled program. The pieces put into the traced model (checkpoint names, the scanned blocks, the
embedding and attention the planner compiles) are in step_parts.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from tpu_tuner.core.errors import first_line
from tpu_tuner.model.meshes.layouts import mesh_partition_spec, placements
from tpu_tuner.model.workloads.blocks import blocks_of, unscanned_blocks
from tpu_tuner.planner.compiler.compile_request import CompileJob
from tpu_tuner.planner.compiler.compiled_step import CompiledStep
from tpu_tuner.planner.compiler.expert_parallel import expert_dispatch
from tpu_tuner.planner.compiler.grouped_matmul import grouped_matmuls_per_device, sort_each_device
from tpu_tuner.planner.compiler.loop_costs import block_loop_iteration, windowed_uncounted
from tpu_tuner.planner.compiler.mesh import BATCH_AXES, layout_mesh
from tpu_tuner.planner.compiler.optimizer import apply_update, initial_state
from tpu_tuner.planner.compiler.quantized_matmul import BlockScope, install_quantized_linear
from tpu_tuner.planner.compiler.remat import BLOCK_INPUT, block_tensor_roles, mlp_width, parse_remat
from tpu_tuner.planner.compiler.step_parts import (
    ScannedBlocks,
    embedding_without_index_sort,
    name_block_tensors,
    sharded_attention,
)
from tpu_tuner.planner.compiler.vocab_tiling import cross_entropy, tiled_cross_entropy
from tpu_tuner.planner.prediction.collectives import add_collectives, device_slices, parse_collectives

log = logging.getLogger(__name__)


# The planner reads the compiler's analyses and never runs the program, so collectives are emitted
# as mocks: their code for a group of thousands of devices is most of the backend's time there.
# The analyses come out the same as without (docs/planner.md, "Compiler shortcuts").
COMPILE_OPTIONS: dict[str, Any] = {"xla_tpu_mock_collectives": True}
# `--fast` also asks for the least execution-time optimisation: quicker compiles with the same
# FLOPs and collectives, and with scanned blocks the same memory as full effort (unrolled blocks'
# temporaries it overstates); docs/planner.md, "Compiling many layouts". It does not peel loop
# iterations, so the plan also uses it to recost peeled full-effort programs.
FAST_COMPILE_OPTIONS: dict[str, Any] = {**COMPILE_OPTIONS, "exec_time_optimization_effort": -1.0}


def truncated(model: nn.Module, keep: int) -> nn.Module:
    """The model with only its first `keep` repeated blocks (shares the rest)."""
    name, blocks = blocks_of(model)
    model.set_submodule(name, nn.ModuleList(list(blocks)[:keep]))
    return model


def compile_step(job: CompileJob, build_meta_model: Callable[[], nn.Module], devices: Any) -> CompiledStep:
    """Compile one training step of `job` (request.py, where each field says what it sets): its
    model, built by `build_meta_model`, cut to `job.model.blocks` blocks (one `jax.lax.scan` over
    stacked weights with `scan`, see the module docstring), on `devices`, the target's as this
    process built them. Micro-batches accumulate fp32 gradients, the optimizer once after them
    (MaxText's gradient_accumulation_steps); `export_to` takes the step serialized by `jax.export`
    (benchmarks/chip/tpu_chip_check.py). On a TPU topology it compiles with COMPILE_OPTIONS, or
    FAST_COMPILE_OPTIONS when `fast`, and the step's XLA flags on top."""
    blocks, scan, d_model = job.model.blocks, job.model.scan, job.model.d_model
    layout, remat, accumulation = job.point.layout, job.point.remat, job.point.accumulation
    global_batch, seq_len, vocab_tiling = job.step.global_batch, job.step.seq_len, job.step.vocab_tiling
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from tpu_tuner.planner.compiler.torchax_compat import import_torchax

    torchax = import_torchax()
    from jax.ad_checkpoint import checkpoint_name
    from torchax.interop import JittableModule, jax_view, torch_view

    with torch.device("meta"):
        model = build_meta_model()
    blocks_name, _ = blocks_of(model)
    placement = placements(model, d_model)  # before the blocks are cut or stacked: their own names
    model = truncated(model, blocks)
    policy = parse_remat(remat)
    mesh = layout_mesh(devices, layout)  # over slices: hybrid, DCN ways outer (mesh.py)
    sort_each_device(model, mesh, global_batch // accumulation)  # before the scan takes the blocks out of the model
    # The residual stream [batch, seq, embed] splits its batch over (data, fsdp) and its features
    # over tensor, as MaxText's `activation_embed` rule does: the residual and every block's
    # input and output, which the backward pass keeps, are then stored once per tensor group, not
    # tensor times (replicated over tensor, Megatron's layout, the 32B calibration row does not
    # fit: docs/planner.md, "Layouts").
    # Context parallelism splits the sequence too (MaxText's activation_length over context).
    residual = NamedSharding(mesh, PartitionSpec(BATCH_AXES, "context", "tensor"))

    def constrain(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        if output.ndim != 3:  # not a residual stream: a learned position table looked up by position
            return output
        return torch_view(jax.lax.with_sharding_constraint(jax_view(output), residual))

    env = torchax.default_env()
    checkpoint_policy = policy.jax_policy()
    block_list = cast(nn.ModuleList, model.get_submodule(blocks_name))  # the blocks a scan runs: a ModuleList
    beside_named = unscanned_blocks(model, blocks_name)
    beside = [block for _, block in beside_named]
    if len(block_list) or beside:
        width = mlp_width(block_list[0] if len(block_list) else beside[0], d_model)
        name_block_tensors([*block_list, *beside], d_model, mlp_hidden=width)
    stacked: dict[str, Any] = {}  # the scanned blocks' weights, set by loss_fn while tracing
    if scan and len(block_list):
        template = block_list[0]

        def run_blocks(x: torch.Tensor, args: tuple, kwargs: dict) -> torch.Tensor:
            def body(h: Any, layer: Any) -> tuple[Any, None]:
                h = checkpoint_name(h, BLOCK_INPUT)
                out = torch.func.functional_call(template, env.j2t_iso(layer), (torch_view(h), *args), kwargs)
                return jax.lax.with_sharding_constraint(jax_view(out), residual), None

            if checkpoint_policy is not None:
                body = jax.checkpoint(body, policy=checkpoint_policy)
            h, _ = jax.lax.scan(body, jax.lax.with_sharding_constraint(jax_view(x), residual), stacked["weights"])
            return torch_view(h)

        model.set_submodule(blocks_name, nn.ModuleList([ScannedBlocks(run_blocks)]))
        unrolled = beside  # leading / trailing layers of a layer pattern: unrolled, as MaxText does
    else:
        if policy.action(BLOCK_INPUT) == "offload" and len(block_list):
            raise ValueError("offloading the block input needs the scanned blocks (scan=True)")
        template = None
        unrolled = [*block_list, *beside]
    for block in unrolled:
        block.register_forward_hook(constrain)
        if checkpoint_policy is not None:
            block.forward = torchax.interop.gradient_checkpoint(block.forward, kwargs={"policy": checkpoint_policy})
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            module.register_forward_hook(constrain)

    head_weight = ""
    if vocab_tiling > 1:
        head = getattr(model, "output", None)
        if not callable(getattr(model, "hidden", None)) or not isinstance(head, nn.Linear):
            raise ValueError(
                "vocabulary tiling needs a model with a hidden() method and an output Linear (the generic decoder)"
            )
        head_weight = next(name for name, p in model.named_parameters() if p is head.weight)
    jittable = JittableModule(model)
    embedding_without_index_sort(env)
    on_tpu = np.asarray(devices).flat[0].platform == "tpu"
    sharded_attention(env, mesh, flash=on_tpu, flash_block=job.step.flash_block)
    if job.step.quantization is not None:
        scope = BlockScope()
        scope.watch([*block_list, *beside])  # unrolled: every block; scanned: the template, and the blocks beside it
        install_quantized_linear(env, job.step.quantization, scope)
    expert_dispatch(env, mesh)  # the MoE's dispatch as all-to-alls over an expert axis (expert_parallel.py)

    # The MLP's linears (their checkpoint roles, remat.py), which fsdp_transpose splits on their MLP side:
    # the scanned template's (its parameters are named as block 0's) and those of the blocks beside it.
    mlp_modules = {
        f"{prefix}.{path}"
        for prefix, block in ([(f"{blocks_name}.0", block_list[0])] if len(block_list) else []) + beside_named
        for path, role in block_tensor_roles(block, d_model, mlp_width(block, d_model))[0].items()
        if role.startswith("mlp")
    }
    grouped_matmuls_per_device(env, mesh, megablox=on_tpu)

    def param_struct(name: str, tensor: torch.Tensor, leading: tuple = ()) -> Any:
        # MaxText's rules: the embed side over fsdp, context (and fsdp_transpose, expert), the MLP's
        # side over fsdp_transpose x tensor, experts over expert (layouts.mesh_partition_spec).
        split = mesh_partition_spec(
            placement.get(name, "replicated"), tensor.dim(), name.rpartition(".")[0] in mlp_modules
        )
        if split[:1] == ("expert",) and tensor.shape[0] % layout.expert:
            raise ValueError(f"expert {layout.expert} does not divide the {tensor.shape[0]} experts of {name}")
        spec = (None,) * len(leading) + split
        return jax.ShapeDtypeStruct(
            (*leading, *tensor.shape),
            jnp.dtype(job.step.weight_dtype),
            sharding=NamedSharding(mesh, PartitionSpec(*spec)),
        )

    params: dict[str, Any] = {"model": {name: param_struct(name, t) for name, t in jittable.params.items()}}
    buffers: dict[str, Any] = {
        "model": {
            name: jax.ShapeDtypeStruct(tuple(t.shape), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec()))
            for name, t in jittable.buffers.items()
        }
    }
    if template is not None:
        params["blocks"] = {
            name: param_struct(f"{blocks_name}.0.{name}", t, (blocks,)) for name, t in template.named_parameters()
        }
        buffers["blocks"] = {
            name: jax.ShapeDtypeStruct((blocks, *t.shape), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec()))
            for name, t in template.named_buffers()
        }
    if global_batch % accumulation:
        raise ValueError(f"{accumulation} micro-batches do not divide the global batch {global_batch}")
    # The micro-batches on a leading axis, each split over (data, fsdp) and its sequence over context.
    micro = (accumulation,) if accumulation > 1 else ()
    tokens = jax.ShapeDtypeStruct(
        (*micro, global_batch // accumulation, seq_len),
        jnp.int32,
        sharding=NamedSharding(mesh, PartitionSpec(*(None,) * len(micro), BATCH_AXES, "context")),
    )

    def loss_fn(weights: Any, buffer_values: Any, inputs: Any, targets: Any) -> Any:
        # bf16 compute, fp32 master weights, cast here once: casting each block's weights inside
        # the loop instead (as MaxText's layers do) makes the compiler gather fp32 weights and
        # needs more memory (docs/planner.md, "Calibration").
        compute = jax.tree.map(lambda w: w.astype(jnp.bfloat16), weights)
        if "blocks" in compute:
            stacked["weights"] = {**compute["blocks"], **buffer_values["blocks"]}
        torch_weights, torch_buffers, torch_inputs = env.j2t_iso((compute["model"], buffer_values["model"], inputs))
        with env:
            logits = jittable.functional_call(
                "hidden" if vocab_tiling > 1 else "forward", torch_weights, torch_buffers, torch_inputs
            )
        logits = env.t2j_iso(logits)
        if vocab_tiling > 1:  # the final hidden states: the head's logits a tile at a time
            return tiled_cross_entropy(logits, compute["model"][head_weight], targets, vocab_tiling)
        return cross_entropy(logits, targets).mean()

    def gradients(weights: Any, buffer_values: Any, inputs: Any, targets: Any) -> tuple[Any, Any]:
        if accumulation == 1:
            return jax.value_and_grad(loss_fn)(weights, buffer_values, inputs, targets)

        def micro_step(carry: Any, batch: Any) -> tuple[Any, None]:
            total, summed = carry
            loss, grads = jax.value_and_grad(loss_fn)(weights, buffer_values, *batch)
            return (total + loss, jax.tree.map(lambda s, g: s + g.astype(jnp.float32), summed, grads)), None

        zeros = jax.tree.map(lambda w: jnp.zeros_like(w, jnp.float32), weights)  # fp32, sharded as the weights
        (total, summed), _ = jax.lax.scan(micro_step, (jnp.zeros((), jnp.float32), zeros), (inputs, targets))
        return total / accumulation, jax.tree.map(lambda g: g / accumulation, summed)

    def train_step(weights: Any, state: Any, buffer_values: Any, inputs: Any, targets: Any) -> Any:
        loss, grads = gradients(weights, buffer_values, inputs, targets)
        weights, state = apply_update(job.step.optimizer, weights, state, grads)
        return weights, state, loss

    start = time.perf_counter()
    state = initial_state(job.step.optimizer, params, job.step.first_moment_dtype)
    step = jax.jit(train_step, donate_argnums=(0, 1))
    lowered = step.lower(params, state, buffers, tokens, tokens)
    if job.export_to is not None:
        exported = jax.export.export(step, platforms=[np.asarray(devices).flat[0].platform])(
            params, state, buffers, tokens, tokens
        )
        Path(job.export_to).write_bytes(exported.serialize())
    try:
        options = {**(FAST_COMPILE_OPTIONS if job.fast else COMPILE_OPTIONS), **dict(job.step.xla_flags)}
        compiled = lowered.compile(options if on_tpu else None)
    except Exception as exc:
        message = first_line(exc)
        return CompiledStep(0, 0, 0, 0, 0, 0, [], time.perf_counter() - start, error=message)
    seconds = time.perf_counter() - start
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list):
        cost = cost[0]
    memory = compiled.memory_analysis()
    text = compiled.as_text()
    assert memory is not None and text is not None  # XLA's TPU and CPU clients give both
    with device_slices(np.asarray(devices).flat):  # DCN groups named by device ids (collectives.py)
        collectives, loop_iteration = parse_collectives(text), block_loop_iteration(text) if scan and blocks else None
        # The windowed einsums' loops are counted once by the cost analysis too: their other iterations.
        windowed = windowed_uncounted(text)
    flops = float(cost.get("flops", 0.0))
    if windowed is not None:
        flops += windowed.flops
        collectives = add_collectives(collectives, windowed.collectives, 1)
    return CompiledStep(
        flops=flops,
        bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        argument_bytes=float(memory.argument_size_in_bytes),
        output_bytes=float(memory.output_size_in_bytes),
        temp_bytes=float(memory.temp_size_in_bytes),
        alias_bytes=float(memory.alias_size_in_bytes),
        collectives=collectives,
        compile_seconds=seconds,
        host_temp_bytes=float(getattr(memory, "host_temp_size_in_bytes", 0)),
        compiler_peak_bytes=float(getattr(memory, "peak_memory_in_bytes", 0) or 0),
        loop_peeled="loop_peel" in text,
        loop_iteration=loop_iteration,
    )


__all__ = ["COMPILE_OPTIONS", "FAST_COMPILE_OPTIONS", "compile_step", "truncated"]
