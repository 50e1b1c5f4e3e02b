"""The user's PyTorch model as a sharded JAX training step, compiled ahead of time for a TPU slice.

Route: torchax (Google's PyTorch-on-JAX library, imported through `torchax_compat`) turns the
torch module's forward into a JAX function. Parameters are never materialised: the model is
built on the ``meta`` device and enters the compiler as `jax.ShapeDtypeStruct`s with their
`NamedSharding`, so a 70B model plans on a laptop. The step is MaxText's: fp32 master weights
cast to bf16 for compute, cross-entropy, backward, AdamW (fp32 moments, or MaxText's mu_dtype
bf16 first moment), with activation
sharding constraints on the residual stream and optional rematerialisation per block.

Depth is handled as MaxText does it (``scan_layers``): the repeated blocks run as one
`jax.lax.scan` over per-block weights stacked on a leading axis, so the compiler sees the whole
model at its real depth (its memory analysis is the real program's: every saved activation,
every buffer) while compiling one block. XLA's cost analysis counts a loop body once, so the
other (depth - 1) iterations are measured from the same compiled program's HLO (`loop_costs`)
and added by `add_loop_iterations`: one compile a layout. Where that measurement is not possible
the plan falls back to a second program, the model with no blocks ("ends": embedding, head,
loss), and `combine_scanned` takes the difference as one block. Tests check both against an
unrolled program.
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
from tpu_tuner.model.blocks import blocks_of
from tpu_tuner.model.layouts import Layout, partition_spec, placements
from tpu_tuner.planner.loop_costs import LoopIteration, block_loop_iteration
from tpu_tuner.planner.remat import BLOCK_INPUT, block_tensor_roles, mlp_width, parse_remat

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
    host_temp_bytes: float = 0.0  # temporaries in the host's memory (remat "offload")
    # The compiler peeled iterations out of a loop (seen with full effort and host offload): its
    # cost analysis then counts those iterations besides the body, so the scanned program's FLOPs,
    # bytes and collectives no longer hold exactly one block. Its memory is still the program's.
    loop_peeled: bool = False
    # One iteration of the scanned block loops (forward + backward), measured from this program's
    # HLO; None for unrolled or block-less programs, or when it could not be measured.
    loop_iteration: LoopIteration | None = None
    # The compiler's own peak of live bytes over its schedule (memory_analysis().peak_memory_in_bytes;
    # 0 where the compiler did not say).
    compiler_peak_bytes: float = 0.0

    @property
    def allocated_bytes(self) -> float:
        """Arguments + outputs not aliased to them + the temporaries' allocation."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    @property
    def peak_bytes(self) -> float:
        """HBM at the peak: the compiler's own peak of live bytes where it states one and the
        program keeps nothing in host memory, else `allocated_bytes`.

        The allocation overstates what the TPU compiler holds against its limit: 70B on TPU7x
        4x4x4 (the published recipe, which ran) allocated 96.0 GiB (5.2 of arguments, 90.9 of
        temporaries) against a 94.75 GiB limit, and the compiler accepted it with a peak of
        84.9 GiB; at a per-device batch of 3 it refused ("HLO temporaries (119.42G) exceeds
        available HBM (94.75G)"). The compiler's peak counts host-memory buffers too (8B on
        v6e-256 with 28.0 GiB offloaded: peak 28.4 GiB, HBM allocation 12.0), so a program that
        offloads is judged by its HBM allocation. A program the compiler refuses never gets here:
        it is a refusal."""
        if self.compiler_peak_bytes and not self.host_temp_bytes:
            return self.compiler_peak_bytes
        return self.allocated_bytes


# The planner reads the compiler's analyses and never runs the program, so collectives are emitted
# as mocks: their code for a group of thousands of devices is most of the backend's time there.
# Measured: the same FLOPs, bytes, memory and collectives (kind, group, count, bytes) as without.
COMPILE_OPTIONS: dict[str, Any] = {"xla_tpu_mock_collectives": True}
# `--fast` also asks for the least execution-time optimisation: about 3x quicker compiles with the
# same FLOPs and collectives. With unrolled blocks it scheduled rematerialised blocks less tightly
# (temporaries overstated 5x); with scanned blocks the memory came out the same as full effort
# where compared (70B, fsdp 8192 on v5p:16x16x32: 15.17 GiB of temporaries both ways). It does not
# peel loop iterations, so the plan also uses it to recost peeled full-effort programs.
FAST_COMPILE_OPTIONS: dict[str, Any] = {**COMPILE_OPTIONS, "exec_time_optimization_effort": -1.0}


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
    scan: bool = False,
    accumulation: int = 1,
    first_moment_dtype: str = "float32",
    compiler_options: tuple[tuple[str, Any], ...] = (),
) -> CompiledStep:
    """Compile one training step of the model cut to `blocks` blocks on `devices` (a TPU topology).

    `remat` is a policy as `remat.parse_remat` reads it. With `scan` the blocks run as one
    `jax.lax.scan` over stacked weights (see the module docstring); otherwise they are unrolled.
    With `accumulation` > 1 the global batch runs as that many micro-batches in a loop that
    accumulates fp32 gradients, AdamW once after it (MaxText's gradient_accumulation_steps).
    `first_moment_dtype` is AdamW's first moment's storage (MaxText's mu_dtype);
    `compiler_options` are added to the TPU compile's options (a recipe's XLA flags).
    On a TPU topology it compiles with COMPILE_OPTIONS, or FAST_COMPILE_OPTIONS when `fast`."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from tpu_tuner.planner.torchax_compat import import_torchax

    torchax = import_torchax()
    from jax.ad_checkpoint import checkpoint_name
    from torchax.interop import JittableModule, jax_view, torch_view

    with torch.device("meta"):
        model = build_meta_model()
    blocks_name, _ = blocks_of(model)
    placement = placements(model, d_model)  # before the blocks are cut or stacked: their own names
    model = truncated(model, blocks)
    policy = parse_remat(remat)
    mesh = Mesh(np.asarray(devices).reshape(layout.data, layout.fsdp, layout.context, layout.tensor),
                ("data", "fsdp", "context", "tensor"))
    # The residual stream [batch, seq, embed] splits its batch over (data, fsdp) and its features
    # over tensor, as MaxText's `activation_embed` rule does: the residual and every block's
    # input and output, which the backward pass keeps, are then stored once per tensor group, not
    # tensor times. Measured on the 32B calibration row (fsdp 16 x tensor 4, remat minimal):
    # 94.1 GiB per device instead of 122 GiB replicated over tensor (Megatron's layout), which does
    # not fit the published run's 95 GiB.
    # Context parallelism splits the sequence too (MaxText's activation_length over context).
    residual = NamedSharding(mesh, PartitionSpec(("data", "fsdp"), "context", "tensor"))

    def constrain(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        if output.ndim != 3:  # not a residual stream: a learned position table looked up by position
            return output
        return torch_view(jax.lax.with_sharding_constraint(jax_view(output), residual))

    env = torchax.default_env()
    checkpoint_policy = policy.jax_policy()
    block_list = model.get_submodule(blocks_name)
    if len(block_list):
        _name_block_tensors(block_list, d_model, mlp_hidden=mlp_width(block_list[0], d_model))
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

        parent = model.get_submodule(blocks_name.rsplit(".", 1)[0]) if "." in blocks_name else model
        setattr(parent, blocks_name.rsplit(".", 1)[-1], nn.ModuleList([_ScannedBlocks(run_blocks)]))
    else:
        if policy.action(BLOCK_INPUT) == "offload" and len(block_list):
            raise ValueError("offloading the block input needs the scanned blocks (scan=True)")
        template = None
        for block in block_list:
            block.register_forward_hook(constrain)
            if checkpoint_policy is not None:
                block.forward = torchax.interop.gradient_checkpoint(block.forward, kwargs={"policy": checkpoint_policy})
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            module.register_forward_hook(constrain)

    jittable = JittableModule(model)
    _embedding_without_index_sort(env)
    _sharded_attention(env, mesh, flash=np.asarray(devices).flat[0].platform == "tpu")

    def param_struct(name: str, tensor: torch.Tensor, leading: tuple = ()) -> Any:
        # Parameters split over context as over fsdp (MaxText's rule for its embed axis).
        split = tuple(("fsdp", "context") if axis == "fsdp" else axis
                      for axis in partition_spec(placement.get(name, "replicated"), tensor.dim()))
        spec = (None,) * len(leading) + split
        return jax.ShapeDtypeStruct((*leading, *tensor.shape), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec(*spec)))

    params: dict[str, Any] = {"model": {name: param_struct(name, t) for name, t in jittable.params.items()}}
    buffers: dict[str, Any] = {"model": {name: jax.ShapeDtypeStruct(tuple(t.shape), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec()))
                                         for name, t in jittable.buffers.items()}}
    if template is not None:
        params["blocks"] = {name: param_struct(f"{blocks_name}.0.{name}", t, (blocks,)) for name, t in template.named_parameters()}
        buffers["blocks"] = {name: jax.ShapeDtypeStruct((blocks, *t.shape), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec()))
                             for name, t in template.named_buffers()}
    if global_batch % accumulation:
        raise ValueError(f"{accumulation} micro-batches do not divide the global batch {global_batch}")
    # The micro-batches on a leading axis, each split over (data, fsdp) and its sequence over context.
    micro = (accumulation,) if accumulation > 1 else ()
    tokens = jax.ShapeDtypeStruct((*micro, global_batch // accumulation, seq_len), jnp.int32,
                                  sharding=NamedSharding(mesh, PartitionSpec(*(None,) * len(micro), ("data", "fsdp"), "context")))

    def loss_fn(weights: Any, buffer_values: Any, inputs: Any, targets: Any) -> Any:
        # bf16 compute, fp32 master weights. Measured: casting each block's weights inside the
        # loop instead (as MaxText's layers do) needed more memory here (32B on v5p-128: 95.9 GiB
        # against 94.1; 70B on TPU7x: 98.1 against 96.0): the compiler then gathers fp32 weights.
        compute = jax.tree.map(lambda w: w.astype(jnp.bfloat16), weights)
        if "blocks" in compute:
            stacked["weights"] = {**compute["blocks"], **buffer_values["blocks"]}
        torch_weights, torch_buffers, torch_inputs = env.j2t_iso((compute["model"], buffer_values["model"], inputs))
        with env:
            logits = jittable.functional_call("forward", torch_weights, torch_buffers, torch_inputs)
        logits = env.t2j_iso(logits)
        # Cross-entropy without a float32 copy of the logits: the fp32 log-sum-exp fuses into its
        # reduction, as in MaxText; a [tokens, vocab] fp32 buffer would dominate HBM at 128k vocab.
        lse = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
        target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0].astype(jnp.float32)
        return (lse - target_logit).mean()

    def gradients(weights: Any, buffer_values: Any, inputs: Any, targets: Any) -> tuple[Any, Any]:
        if accumulation == 1:
            return jax.value_and_grad(loss_fn)(weights, buffer_values, inputs, targets)

        def micro_step(carry: Any, batch: Any) -> tuple[Any, None]:
            total, summed = carry
            loss, grads = jax.value_and_grad(loss_fn)(weights, buffer_values, *batch)
            return (total + loss, jax.tree.map(lambda s, g: s + g.astype(jnp.float32), summed, grads)), None

        zeros = jax.tree.map(jnp.zeros_like, weights)  # fp32, sharded as the weights
        (total, summed), _ = jax.lax.scan(micro_step, (jnp.zeros((), jnp.float32), zeros), (inputs, targets))
        return total / accumulation, jax.tree.map(lambda g: g / accumulation, summed)

    def train_step(weights: Any, moments: Any, buffer_values: Any, inputs: Any, targets: Any) -> Any:
        loss, grads = gradients(weights, buffer_values, inputs, targets)
        first, second = moments
        first = jax.tree.map(lambda m, g: (0.9 * m + 0.1 * g).astype(m.dtype), first, grads)
        second = jax.tree.map(lambda v, g: 0.95 * v + 0.05 * g * g, second, grads)
        # AdamW with its epsilon inside the square root (optax's eps_root): a reciprocal square
        # root instead of a square root and a divide. Measured on 70B (fsdp 8192, 8192 v5p): the
        # same FLOPs, bytes and memory, and 8% less compile CPU time (13.2 s against 14.4 s, the
        # mean of five interleaved pairs): the divide's code is long.
        weights = jax.tree.map(lambda w, m, v: w - 1e-4 * (m * jax.lax.rsqrt(v + 1e-16) + 0.1 * w), weights, first, second)
        return weights, (first, second), loss

    start = time.perf_counter()
    first_moments = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, jnp.dtype(first_moment_dtype), sharding=p.sharding),
                                 params)
    lowered = jax.jit(train_step, donate_argnums=(0, 1)).lower(params, (first_moments, params), buffers, tokens, tokens)
    on_tpu = np.asarray(devices).flat[0].platform == "tpu"
    try:
        options = {**(FAST_COMPILE_OPTIONS if fast else COMPILE_OPTIONS), **dict(compiler_options)}
        compiled = lowered.compile(options if on_tpu else None)
    except Exception as exc:  # noqa: BLE001 - the compiler reports out-of-HBM as an exception
        message = str(exc).strip().splitlines()[0]
        return CompiledStep(0, 0, 0, 0, 0, 0, [], time.perf_counter() - start, error=message)
    seconds = time.perf_counter() - start
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list):
        cost = cost[0]
    memory = compiled.memory_analysis()
    text = compiled.as_text()
    return CompiledStep(
        flops=float(cost.get("flops", 0.0)),
        bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        argument_bytes=float(memory.argument_size_in_bytes),
        output_bytes=float(memory.output_size_in_bytes),
        temp_bytes=float(memory.temp_size_in_bytes),
        alias_bytes=float(memory.alias_size_in_bytes),
        collectives=parse_collectives(text),
        compile_seconds=seconds,
        host_temp_bytes=float(getattr(memory, "host_temp_size_in_bytes", 0)),
        compiler_peak_bytes=float(getattr(memory, "peak_memory_in_bytes", 0) or 0),
        loop_peeled="loop_peel" in text,
        loop_iteration=block_loop_iteration(text) if scan and blocks else None,
    )


def _name_block_tensors(blocks: nn.ModuleList, d_model: int, mlp_hidden: int) -> None:
    """Give the block tensors MaxText's checkpoint names (remat.block_tensor_roles), so that a
    policy can save or offload them: each projection's output, the out projection's input
    (``context``). Hooks on every block (unrolled) or the one template the scan calls."""
    from jax.ad_checkpoint import checkpoint_name
    from torchax.interop import jax_view, torch_view

    roles, context_of = block_tensor_roles(blocks[0], d_model, mlp_hidden)

    def named(name: str) -> Callable[..., Any]:
        def hook(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
            return torch_view(checkpoint_name(jax_view(output), name))
        return hook

    def named_context(module: nn.Module, args: tuple) -> tuple:
        return (torch_view(checkpoint_name(jax_view(args[0]), "context")), *args[1:])

    for block in blocks:
        for path, role in roles.items():
            block.get_submodule(path).register_forward_hook(named(role))
        if context_of is not None:
            block.get_submodule(context_of).register_forward_pre_hook(named_context)


class _ScannedBlocks(nn.Module):
    """Stands in for a ModuleList's blocks: the model's loop calls it once and it scans them all.

    Holds no weights of its own: the stacked ones arrive as the step's arguments."""

    def __init__(self, run: Callable[[torch.Tensor, tuple, dict], torch.Tensor]) -> None:
        super().__init__()
        self.run = run

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.run(x, args, kwargs)


def _embedding_without_index_sort(env: Any) -> None:
    """Compile embedding lookups with a gradient that scatters without sorting the token ids.

    JAX's gradient of a gather is a scatter-add, which the TPU compiler lowers by sorting the
    (token, update row) pairs: for a 70B model's 4,096 tokens x 8,192 features per device that sort
    took 10 of the 14 s of a fast compile, and made a full-effort compile run for over 14 minutes.
    The planner never runs the program, so it tells the compiler the ids are sorted; the sort it
    leaves out is of a few thousand keys per step, while the scatter's FLOPs and bytes are
    unchanged (measured: 9.412e10 HBM bytes and 2.584e13 FLOPs either way, 70B ends on 8192 v5p).
    """
    import jax
    import jax.numpy as jnp
    import torch.nn.functional as F
    from torchax.interop import jax_view, torch_view

    def embedding(input, weight, padding_idx=None, max_norm=None, *args, **kwargs):
        if max_norm is not None:
            raise NotImplementedError("the planner's embedding takes no max_norm")
        table, ids = jax_view(weight), jax_view(input)
        shape, dtype = table.shape, table.dtype

        @jax.custom_vjp
        def lookup(table: Any, ids: Any) -> Any:
            return jnp.take(table, ids, axis=0)

        def forward(table: Any, ids: Any) -> tuple[Any, Any]:
            return lookup(table, ids), ids

        def backward(ids: Any, grad: Any) -> tuple[Any, None]:
            rows = grad.reshape(-1, shape[-1])
            table_grad = jnp.zeros(shape, grad.dtype).at[ids.reshape(-1)].add(rows, indices_are_sorted=True)
            return table_grad.astype(dtype), None

        lookup.defvjp(forward, backward)
        return torch_view(lookup(table, ids))

    env.override_op_definition(F.embedding, embedding)


def _sharded_attention(env: Any, mesh: Any, flash: bool) -> None:
    """Run F.scaled_dot_product_attention per device: heads over the tensor axis, the batch over
    (data, fsdp), inside `shard_map`; with `flash` as TPU flash attention (Pallas), as MaxText does.

    torchax's own translation materialises the [batch, heads, seq, seq] scores, which at 8k
    tokens outweighs everything else in HBM; on a TPU the attention is a flash kernel that never
    does. Elsewhere (the emulated-CPU cross-check) it is the textbook attention under the
    same shard_map (plain softmax attention), so both compilers are given the same per-device split: left to XLA's own
    partitioning, the CPU compile counted 7-10% more FLOPs per block for tensor-parallel layouts.
    """
    import jax
    import jax.numpy as jnp
    import torch.nn.functional as F
    from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash
    from jax.sharding import PartitionSpec
    from torchax.interop import jax_view, torch_view

    spec = PartitionSpec(("data", "fsdp"), "tensor", "context", None)
    context = mesh.shape["context"]

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None or dropout_p or key.shape[1] != query.shape[1]:
            raise NotImplementedError("the planner's flash attention takes causal or full attention with equal heads")
        q, k, v = (jax_view(t) for t in (query, key, value))
        sm_scale = scale if scale is not None else q.shape[-1] ** -0.5
        # Context parallel: each device holds a slice of the queries and gathers every key and
        # value over the context axis (MaxText's all-gather context parallelism). The kernel
        # takes no query offset, so the slice attends to every key unmasked: the same cost to the
        # compiler (the kernel's cost estimate does not discount a causal mask), not the same
        # numbers, which the planner never computes.
        causal = bool(is_causal) and context == 1
        if flash:
            def kernel(q: Any, k: Any, v: Any) -> Any:
                return pallas_flash.flash_attention(q, k, v, causal=causal, sm_scale=sm_scale)
        else:
            def kernel(q: Any, k: Any, v: Any) -> Any:  # softmax(q k^T) v, [batch, heads, seq, head_dim]
                scores = jnp.einsum("bhqd,bhkd->bhqk", q, k).astype(jnp.float32) * sm_scale
                if causal:
                    scores = jnp.where(jnp.tril(jnp.ones(scores.shape[-2:], bool)), scores, -jnp.inf)
                return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1).astype(q.dtype), v)

        def attend(q: Any, k: Any, v: Any) -> Any:
            if context > 1:
                k, v = (jax.lax.all_gather(t, "context", axis=2, tiled=True) for t in (k, v))
            return kernel(q, k, v)

        sharded = jax.shard_map(attend, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)
        return torch_view(sharded(q, k, v))

    env.override_op_definition(F.scaled_dot_product_attention, sdpa)


def add_loop_iterations(scanned: CompiledStep, blocks: int, costs: CompiledStep | None = None,
                        accumulation: int = 1) -> CompiledStep:
    """The whole step from the scanned program of `blocks` blocks alone.

    Memory is the program's own. Its cost analysis and HLO text count each loop once, so the
    other `blocks - 1` iterations of its measured `loop_iteration` are added to its FLOPs, bytes
    and collectives; with `accumulation` micro-batches in a loop, the other micro-batches too (see
    `LoopIteration`). `costs`, when given, is the same program compiled without loop peeling (see
    `CompiledStep.loop_peeled`), and the work is read from it instead.
    """
    memory, work = scanned, costs or scanned
    iteration = work.loop_iteration
    if iteration is None:
        raise ValueError("the program's block loops were not measured (see loop_costs.block_loop_iteration)")
    # (how many more times, what) beyond the compiler's count of each loop body once
    extra = [(blocks - 1, iteration)]
    if iteration.micro_batch is not None:
        extra = [(accumulation - 1, iteration.micro_batch), (accumulation * (blocks - 1), iteration)]
    by_key = {(c.kind, c.group_size): c for c in work.collectives}
    flops, bytes_accessed = work.flops, work.bytes_accessed
    for times, loop in extra:
        flops += times * loop.flops
        bytes_accessed += times * loop.bytes_accessed
        for c in loop.collectives:
            seen = by_key.get((c.kind, c.group_size), Collective(c.kind, c.group_size, 0, 0))
            by_key[(c.kind, c.group_size)] = replace(seen, count=seen.count + times * c.count, bytes=seen.bytes + times * c.bytes)
    return replace(
        memory,
        flops=flops,
        bytes_accessed=bytes_accessed,
        collectives=sorted(by_key.values(), key=lambda c: (c.kind, c.group_size)),
        compile_seconds=memory.compile_seconds + (costs.compile_seconds if costs else 0.0),
        loop_peeled=work.loop_peeled,
    )


def combine_scanned(ends: CompiledStep, scanned: CompiledStep, blocks: int,
                    costs: CompiledStep | None = None) -> CompiledStep:
    """The whole step from the ends-only program and the scanned program of `blocks` blocks (the
    fallback where `add_loop_iterations` cannot be used).

    Memory is the scanned program's own (it is the real program). XLA's cost analysis and the
    HLO text hold the loop body once, so one block's FLOPs, bytes and collectives are the scanned
    program's minus the ends', and the step's are the ends' plus `blocks` of them. A difference
    below zero (the compiler fusing the ends differently) counts as zero, never as negative work.
    `costs`, when given, is the same scanned program compiled without loop peeling (see
    `CompiledStep.loop_peeled`), and the work is read from it instead.
    """
    memory, scanned = scanned, costs or scanned
    def total(end: float, with_body: float) -> float:
        return end + blocks * max(0.0, with_body - end)

    by_key = {(c.kind, c.group_size): c for c in ends.collectives}
    collectives = []
    for c in scanned.collectives:
        e = by_key.pop((c.kind, c.group_size), Collective(c.kind, c.group_size, 0, 0))
        collectives.append(replace(c, count=round(total(e.count, c.count)), bytes=round(total(e.bytes, c.bytes))))
    collectives += list(by_key.values())
    return CompiledStep(
        flops=total(ends.flops, scanned.flops),
        bytes_accessed=total(ends.bytes_accessed, scanned.bytes_accessed),
        argument_bytes=memory.argument_bytes,
        output_bytes=memory.output_bytes,
        temp_bytes=memory.temp_bytes,
        alias_bytes=memory.alias_bytes,
        collectives=sorted(collectives, key=lambda c: (c.kind, c.group_size)),
        compile_seconds=ends.compile_seconds + memory.compile_seconds + (costs.compile_seconds if costs else 0.0),
        host_temp_bytes=memory.host_temp_bytes,
        loop_peeled=scanned.loop_peeled,
        compiler_peak_bytes=memory.compiler_peak_bytes,
    )
