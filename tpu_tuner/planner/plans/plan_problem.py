"""What every point of one plan shares (`PlanProblem`), read from the model file and the slice."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.metrics.flops import AttentionConvention, matmul_parameters, score_pairs, transformer_model_flops
from tpu_tuner.model.decoders.decoder import Block
from tpu_tuner.model.decoders.decoder_shape import is_shape_source
from tpu_tuner.model.decoders.experts import moe_routing, routed_per_token
from tpu_tuner.model.decoders.layer_parts import FeedForward
from tpu_tuner.model.decoders.transformer_dims import AttentionSpan, TransformerDims
from tpu_tuner.model.meshes.layouts import partition_spec, placements
from tpu_tuner.model.workloads.blocks import blocks_of, unscanned_blocks
from tpu_tuner.model.workloads.hf_source import is_hf_source
from tpu_tuner.model.workloads.structure import Dims, read_dims
from tpu_tuner.planner.compiler.compile_pool import stderr_to
from tpu_tuner.planner.compiler.compile_request import CompileJob, CompileModel, CompileTarget, StepSettings
from tpu_tuner.planner.compiler.hbm import compiler_hbm_limit
from tpu_tuner.planner.compiler.remat import block_tensor_roles, forward_flops_per_token, mlp_width, parse_remat
from tpu_tuner.planner.plans.hf_plan import TracedCausalLM, check_seq_len, planned_workload, source_digest
from tpu_tuner.planner.plans.plan_options import PlanOptions
from tpu_tuner.planner.plans.plan_space import MemoryBound, PlanPoint, flash_block_refusal, memory_lower_bound
from tpu_tuner.planner.prediction.attention_kernel import (
    AttentionKernelWork,
    ChipStep,
    attention_kernel_work,
    chip_kernels,
)
from tpu_tuner.planner.prediction.predict import CostModel
from tpu_tuner.planner.topology import Topology

log = logging.getLogger(__name__)
MAXTEXT_BLOCK = 512  # MaxText's splash attention blocks (sa_block_* in configs/base.yml)


@dataclass(frozen=True)
class PlanProblem:
    """What every point of one plan shares: the model, slice, batch and the FLOPs conventions."""

    source: str
    workload: str
    preset: str | None
    topology: Topology
    step: StepSettings  # what every compile of the plan shares (request.py)
    dims: Dims
    gated: bool
    matmul_parameters: int
    parameters: int
    model_flops: float
    attention: AttentionConvention
    fast: bool
    cost_model: CostModel
    placements: dict[str, str]
    quantized_parameters: int = 0  # the weights of the blocks' linear layers (what --quantization quantizes)
    model_digest: str | None = None  # what a search's study record names the model by (None: the file's sha256)
    spans: tuple[AttentionSpan, ...] = ()  # every layer's attention where layers differ (TransformerDims.spans)
    moe: str = "dense"  # how tokens reach experts: "dense", "dropping" or "dropless" (model/decoders/experts.py)
    routed_per_token: float = 0.0  # top_k x d_model over the dropless layers (experts.routed_per_token)
    # Flash blocks the planner chose where none was given: the fastest a chip of this generation
    # timed (attention_kernel.py), for points whose devices hold whole sequences (None: the kernel's).
    chosen_flash_block: int | None = None
    # Whether the backward pass reads the MLP's down-projection output (remat.forward_flops_per_token
    # says why it decides what is recomputed); True where the blocks are not known to be plain.
    mlp_output_needed: bool = True

    @property
    def hbm(self) -> float:
        return self.topology.hbm_bytes_per_device

    def hardware_flops(self, remat: str) -> float:
        """The work the chips do, a floor under the compiler's count (predict.py): the model's
        FLOPs with full attention plus what `remat` recomputes of each block's forward, and with
        the loss in vocabulary tiles the head's forward recomputed."""
        shape, policy, seq = self.dims.shape, parse_remat(remat), self.step.seq_len
        spans = self.spans or (AttentionSpan(shape.n_heads, self.dims.head_dim),) * shape.n_layers
        # A local layer's attention recomputes its window's keys per query, not the sequence's.
        recomputed = sum(
            forward_flops_per_token(
                policy,
                shape.d_model,
                span.heads,
                shape.n_kv_heads if span.kv_heads is None else span.kv_heads,
                span.head_dim,
                shape.mlp_hidden if span.mlp is None else span.mlp,
                self.gated,
                score_pairs(seq, span.window, span.chunk, False) / seq,
                self.mlp_output_needed,
            )[1]
            for span in spans
        )
        if self.step.vocab_tiling > 1:
            # The loss in tiles keeps no logits: the backward computes each tile's again (MaxText's
            # vocab tiling and compiler/vocab_tiling.py alike), one more forward of the head.
            recomputed += 2 * shape.vocab * shape.d_model
        attention = TransformerDims(shape.n_layers, shape.n_heads, self.dims.head_dim, True, self.spans)
        full = _model_flops(self.matmul_parameters, attention, self.dims, self.step.global_batch, seq, "full")
        return full + recomputed * self.step.global_batch * seq

    def attention_kernel(self, point: PlanPoint) -> AttentionKernelWork | None:
        """The step's flash attention costed from a chip's timings of the kernel, where the
        generation has them with whole steps measured on a slice of this size (the rest of the
        step's constants are fitted with them: `ChipStep`; a larger slice keeps the calibration's,
        fitted with attention as FLOPs) and every layer is global causal attention on one device's
        whole sequence (attention_kernel.py); None elsewhere: the prediction prices it as FLOPs."""
        kernels = chip_kernels(self.topology.chip.generation)
        if kernels is None or kernels.step is None or kernels.step.devices != self.topology.devices:
            return None
        if self.moe != "dense" or point.layout.context > 1 or any(s.window or s.chunk for s in self.spans):
            return None  # the chip's steps were dense decoders of global attention
        seq = self.step.seq_len
        block = self.flash_block_of(point)
        if block is None or seq % block:
            block = 128  # the kernel's default blocks (step_parts._flash_blocks)
        return attention_kernel_work(
            kernels,
            layers=self.dims.shape.n_layers,
            heads=self.dims.shape.n_heads,
            head_dim=self.dims.head_dim,
            seq=seq,
            block=block,
            sequences_per_device=self.step.global_batch / self.topology.devices,
            recomputed=parse_remat(point.remat).action("context") == "remat",
        )

    def chip_step(self, point: PlanPoint) -> ChipStep | None:
        """The chip's own step constants (attention_kernel.ChipStep) with `point`'s recomputed FLOPs,
        where the generation's whole steps were measured on a slice of this many devices and every
        layer is dense global attention the timed kernel serves; else None."""
        kernels = chip_kernels(self.topology.chip.generation)
        step = kernels.step if kernels else None
        if step is None or self.attention_kernel(point) is None:
            return None
        return replace(step, recomputed_flops=self.recomputed_flops(point))

    def recomputed_flops(self, point: PlanPoint) -> float:
        """The block FLOPs per device `point`'s remat policy recomputes in a step, attention's own
        left out (the timed kernel holds its recomputed forward): the projections and the MLP."""
        shape, policy, seq = self.dims.shape, parse_remat(point.remat), self.step.seq_len
        _, recomputed = forward_flops_per_token(
            policy,
            shape.d_model,
            shape.n_heads,
            shape.n_kv_heads,
            self.dims.head_dim,
            shape.mlp_hidden,
            self.gated,
            seq,
            self.mlp_output_needed,
        )
        if policy.action("context") == "remat":
            recomputed -= 4 * seq * shape.n_heads * self.dims.head_dim
        return recomputed * shape.n_layers * self.step.global_batch * seq / self.topology.devices

    def flash_block_of(self, point: PlanPoint) -> int | None:
        """The flash blocks `point` compiles with: its own (a search's axis), the plan's
        (--flash-block), else the planner's choice where its devices hold whole sequences."""
        if point.flash_block is not None:
            return point.flash_block
        if self.step.flash_block is not None:
            return self.step.flash_block
        return self.chosen_flash_block if point.layout.context == 1 else None

    def job(self, point: PlanPoint, blocks: int, fast: bool | None = None) -> CompileJob:
        """The compile of `point` with `blocks` scanned blocks (`fast`: the plan's effort unless given),
        in its flash blocks (`flash_block_of`)."""
        block = self.flash_block_of(point)
        step = self.step if block == self.step.flash_block else replace(self.step, flash_block=block)
        return CompileJob(
            CompileModel(self.source, self.preset, self.dims.shape.d_model, blocks, scan=True),
            CompileTarget(self.topology.jax_name, self.topology.slices),
            step,
            point,
            self.fast if fast is None else fast,
        )

    def lower_bound(self, point: PlanPoint) -> MemoryBound:
        return memory_lower_bound(
            point,
            self.matmul_parameters,
            self.dims.shape,
            self.step.global_batch,
            self.step.seq_len,
            first_moment_bytes=2 if self.step.first_moment_dtype == "bfloat16" else 4,
            weight_bytes=2 if self.step.weight_dtype == "bfloat16" else 4,
            saved_inputs=self.dims.saved_block_inputs,
            optimizer=self.step.optimizer,
        )

    def quantized_share(self) -> float:
        """The share of the step's FLOPs that --quantization runs in 8 bits: the blocks' linear
        layers' forward and both backward matmuls (6 FLOPs a weight a token) of the model's FLOPs
        with full attention; remat's recomputation is taken to have the same mix."""
        if self.step.quantization is None:
            return 0.0
        full = _model_flops(self.matmul_parameters, None, self.dims, self.step.global_batch, self.step.seq_len, "full")
        return min(1.0, 6.0 * self.quantized_parameters * self.step.global_batch * self.step.seq_len / full)


def _screen_in_worker(model_file: str | Path, log_file: Path | None = None) -> None:
    """Import the file in a worker first, so that one which crashes at import is reported
    ("the process died from SIGSEGV while importing", exit 2) rather than killing tpu-tune.
    The planner still builds the model (on the meta device) in this process afterwards: its shape
    analysis needs the module itself (docs/run-safety.md). Its output goes to `log_file` with the
    compiler processes' (None: a temporary log, dropped unless a failure names it)."""
    from tpu_tuner.runner.load import load_summary
    from tpu_tuner.runner.trial_runner import TrialRunner
    from tpu_tuner.runner.worker_log import WorkerLog

    with WorkerLog(log_file) as output, TrialRunner(str(model_file), "cpu", log=output) as runner:
        load_summary(runner, model_file, sample_lengths=False)


def build_problem(
    model_file: str | Path, options: PlanOptions, topology: Topology, emit: Callable[[str], None]
) -> PlanProblem:
    """The problem of `model_file` on `topology` (as its compiler sees it), bad input refused first.
    An ``hf:`` source or a decoder shape runs no code of its own (a config or a shape is read), so
    it is not screened in a worker (a worker's start, about 3.5 s here, for nothing)."""
    hf = is_hf_source(model_file)
    if not hf and not is_shape_source(model_file):
        _screen_in_worker(model_file, options.compile.log_file)
    workload = planned_workload(model_file)
    if not workload.is_training:
        raise UserInputError("the planner plans training steps: the file needs a loss()", workload.source)
    with stderr_to(options.compile.log_file):  # libtpu's start-up complaints go where the workers' go
        devices = CompileTarget(
            topology.jax_name, topology.slices
        ).devices()  # fails early, with the install hint, when libtpu is missing
        # The compiler's view: its device count (v4: one per TensorCore) and its HBM limit.
        topology = topology.as_compiled(len(devices), compiler_hbm_limit(devices[0]))
    emit(
        f"{topology.describe()}; HBM limit {topology.hbm_bytes_per_device / 2**30:.2f} GiB per device "
        f"({'the compiler' if topology.compiler_hbm_bytes is not None else 'published capacity'})"
    )
    seq_len = options.step.seq_len or workload.seq_len
    if not seq_len:
        raise UserInputError("give --seq (the file has no SEQ_LEN)", workload.source)
    if hf:
        check_seq_len(workload, seq_len)
        for note in workload.notes:  # which route the config took (planner/plans/hf_plan.py)
            emit(note)
    global_batch = options.step.global_batch or (workload.batch_size or 1) * topology.devices
    if options.step.vocab_tiling < 1 or seq_len % options.step.vocab_tiling:
        raise UserInputError(
            f"--vocab-tiling must be a positive divisor of the sequence ({seq_len}), not {options.step.vocab_tiling}",
            workload.source,
        )
    with torch.device("meta"):
        meta_model = workload.model_for_preset(options.step.preset)
    transformer = workload.dims_for_preset(options.step.preset)
    if options.step.vocab_tiling > 1 and not callable(getattr(meta_model, "hidden", None)):
        raise UserInputError(
            "--vocab-tiling needs the generic decoder (a decoder: shape, a shape file or a mapped "
            "hf: config): this model has no hidden() before its output head",
            workload.source,
        )
    window = max((max(span.window, span.chunk) for span in (transformer.spans if transformer else ())), default=0)
    # The generic decoder compiles the window into its kernel; a traced model's FLOPs only count it.
    if window > seq_len and not isinstance(meta_model, TracedCausalLM):
        raise UserInputError(
            f"the local layers' window or chunk ({window}) is larger than the sequence ({seq_len}): "
            "plan a longer --seq, or the model as global attention",
            workload.source,
        )
    # A block that does not divide the sequence is refused before any compile, in one line.
    for name, block in [("--flash-block", options.step.flash_block)] + [
        ("--flash-blocks", b) for b in options.search.flash_blocks
    ]:
        refusal = flash_block_refusal(block, seq_len)
        if refusal:
            raise UserInputError(f"{name}: {refusal}")
    dims = read_dims(meta_model, transformer.heads if transformer else None)
    n_matmul = matmul_parameters(meta_model)
    blocks_name, blocks = blocks_of(meta_model)
    every_block = [*blocks, *(block for _, block in unscanned_blocks(meta_model, blocks_name))]
    roles, _ = block_tensor_roles(blocks[0], dims.shape.d_model, mlp_width(blocks[0], dims.shape.d_model))
    placement = placements(meta_model, dims.shape.d_model)
    return PlanProblem(
        # An hf: source as written: the compiler processes load it from this text.
        source=str(model_file) if hf else str(workload.source),
        workload=workload.name,
        preset=options.step.preset,
        topology=topology,
        step=StepSettings.of(options, global_batch, seq_len),
        dims=dims,
        gated="mlpwi_1" in roles.values(),
        matmul_parameters=n_matmul,
        parameters=sum(p.numel() for p in meta_model.parameters()),
        model_flops=_model_flops(n_matmul, transformer, dims, global_batch, seq_len, options.step.attention),
        attention=options.step.attention,
        fast=options.compile.fast_compile,
        cost_model=options.compile.cost_model,
        quantized_parameters=sum(
            m.weight.numel() for block in every_block for m in block.modules() if isinstance(m, nn.Linear)
        ),
        model_digest=source_digest(str(model_file)) if hf else None,
        spans=transformer.spans if transformer else (),
        moe=moe_routing(meta_model),
        routed_per_token=routed_per_token(meta_model),
        chosen_flash_block=None
        if options.search.flash_blocks
        else chosen_flash_block(topology, dims.head_dim, seq_len),
        mlp_output_needed=any(map(mlp_output_needed, every_block)),
        placements={
            name: "/".join(a or "-" for a in (partition_spec(kind, 2) or ("replicated",)))
            for name, kind in placement.items()
        },
    )


def mlp_output_needed(block: nn.Module) -> bool:
    """Whether `block`'s backward pass reads its MLP's output (remat.forward_flops_per_token): not
    for the generic decoder's dense block whose MLP output goes straight into the residual sum; for
    any other block (an MoE combine, a norm after the MLP, a per-layer gate on the block's output,
    a model the planner only traces) it is taken to, as the floor counted before."""
    layers = [m for m in block.modules() if isinstance(m, Block)]  # a layer group holds several
    return not layers or any(
        not isinstance(b.feed_forward, FeedForward) or b.ffn_post_norm is not None or b.per_layer is not None
        for b in layers
    )


def chosen_flash_block(topology: Topology, head_dim: int, seq_len: int) -> int | None:
    """The flash blocks the planner compiles with where none is given: on a generation whose
    chip timed the kernel, the fastest timed block, or MaxText's 512 (`sa_block_*` in its
    base.yml) where that is within 5% of it (closer than one isolated timing tells apart);
    elsewhere None, the kernel's default, as the calibration rows were compiled."""
    kernels = chip_kernels(topology.chip.generation)
    fastest = kernels.fastest_block(head_dim, seq_len) if kernels else None
    if kernels is None or fastest is None:
        return None
    at = {b: kernels.seconds(head_dim, seq_len, b, 1.0, 2) or math.inf for b in (fastest, MAXTEXT_BLOCK)}
    return MAXTEXT_BLOCK if seq_len % MAXTEXT_BLOCK == 0 and at[MAXTEXT_BLOCK] <= 1.05 * at[fastest] else fastest


def _model_flops(
    n_matmul: int, transformer: Any, dims: Any, batch: int, seq: int, convention: AttentionConvention
) -> float:
    attention = transformer or TransformerDims(dims.shape.n_layers, dims.shape.n_heads, dims.head_dim, True)
    return transformer_model_flops(n_matmul, attention, batch, seq, True, convention).per_step


__all__ = ["PlanProblem", "build_problem", "chosen_flash_block", "mlp_output_needed"]
