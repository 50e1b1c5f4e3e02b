"""A plan's result: each point's compiler figures and prediction (`LayoutPlan`), and the whole
plan (`PlanResult`), as plan.json holds it."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from tpu_tuner.model.decoders.attention_pattern import describe_spans
from tpu_tuner.model.meshes.layouts import Layout
from tpu_tuner.planner.compiler.compiled_step import CompiledStep
from tpu_tuner.planner.compiler.remat import parse_remat
from tpu_tuner.planner.compiler.xla_flags import xla_flags_text
from tpu_tuner.planner.plans.plan_problem import PlanProblem
from tpu_tuner.planner.plans.plan_space import PlanPoint
from tpu_tuner.planner.prediction.attention_kernel import chip_kernels
from tpu_tuner.planner.prediction.band import ErrorBand, Place
from tpu_tuner.planner.prediction.novelty import layout_kind
from tpu_tuner.planner.prediction.predict import Prediction, error_band
from tpu_tuner.planner.topology import Topology


@dataclass
class LayoutPlan:
    """One point's compiler figures and prediction (prediction None when it did not compile)."""

    layout: Layout
    compiled: CompiledStep
    fits: bool
    margin_bytes: float
    why: str
    prediction: Prediction | None
    remat: str = "full"
    accumulation: int = 1
    per_device_batch: float = 0.0  # MaxText's per_device_batch_size (space.PlanPoint.per_device_batch)
    lower_bound_bytes: float = 0.0  # space.memory_lower_bound's total: never above the compiled peak
    band: ErrorBand | None = None  # how far this point's predicted MFU may be off (band.py)
    fit_effort: str = "full"  # which compile decided "fits": "full", "fast", or full effort after a near-limit fast one
    per_chip_batch: float = 0.0  # sequences per chip: per-device batch x devices per chip (TPU7x 2, megacore v4 1)
    # An offloading program whose HBM allocation is over the limit and which the compiler accepted
    # (CompiledStep.fits_in): it fits, with an unknown margin (margin_bytes 0).
    over_limit_accepted: bool = False
    # The HBM estimate before compiling, by term, with "total" and the "limit" (memory_estimate.py).
    memory_estimate: dict[str, float] | None = None
    flash_block: int | None = None  # the point's own flash blocks where searched (None: the plan's)

    @property
    def point(self) -> PlanPoint:
        return PlanPoint(self.layout, self.remat, self.accumulation, self.flash_block)

    @property
    def predicted_mfu(self) -> float:
        """The predicted MFU; 0 for a point that did not compile (no prediction)."""
        return self.prediction.mfu if self.prediction else 0.0


@dataclass
class PlanResult:
    """A whole plan: every evaluated point, the best, and how the figures were made."""

    workload: str
    preset: str | None
    topology: Topology
    global_batch: int
    seq_len: int
    remat: str  # the policy of every point, or "searched"
    attention_convention: str
    model_flops_per_step: float
    matmul_parameters: int
    plans: list[LayoutPlan]
    rejected: list[tuple[Layout, str]]
    placements: dict[str, str]
    method: str
    seconds: float
    error_band: ErrorBand | None = None  # the best point's band (else the first point's)
    search: dict[str, Any] | None = None  # the search's study, space and every trial
    source: str | None = None  # the model file (or shape) as given
    weight_dtype: str = "float32"  # the master weights' storage (MaxText's weight_dtype)
    quantization: str | None = None  # the blocks' matmuls: None (bf16), "int8" or "fp8"
    optimizer: str = "adamw"  # MaxText's opt_type: "adamw" or "sgd" (optimizer.py)
    attention: str = ""  # each layer group's attention: "36 layers sliding window 4096, 12 layers global (every 4th)"

    @property
    def best(self) -> LayoutPlan | None:
        fitting = [p for p in self.plans if p.fits and p.prediction]
        return max(fitting, key=lambda p: p.predicted_mfu) if fitting else None

    @property
    def indistinguishable(self) -> list[LayoutPlan]:
        """The fitting points whose predicted MFU is within the error band of the best's (the
        best first): the prediction cannot order them, a measurement can."""
        best = self.best
        if best is None or self.error_band is None:
            return [best] if best else []
        floor = best.predicted_mfu - self.error_band.points / 100
        return [
            p
            for p in sorted(self.plans, key=lambda p: -p.predicted_mfu)
            if p.fits and p.prediction and p.prediction.mfu >= floor
        ]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["topology"] = {
            "name": self.topology.name,
            "jax_name": self.topology.jax_name,
            "chips": self.topology.chips,
            "devices": self.topology.devices,
            "slices": self.topology.slices,
            "dcn_gbits_per_chip": self.topology.dcn_gbits_per_chip if self.topology.slices > 1 else None,
            "generation": self.topology.chip.generation,
            "megacore": self.topology.megacore,
            "hbm_bytes_per_device": self.topology.hbm_bytes_per_device,
            "hbm_from": "compiler" if self.topology.compiler_hbm_bytes is not None else "spec",
        }
        data["best"] = self.best.point.name() if self.best else None
        data["indistinguishable"] = [p.point.name() for p in self.indistinguishable]
        return data


def result_of(
    problem: PlanProblem,
    plans: list[LayoutPlan],
    rejected: list[tuple[Layout, str]],
    remat: str,
    started: float,
    search: dict[str, Any] | None = None,
) -> PlanResult:
    """The PlanResult of evaluated points."""
    peeled, flags = sum(1 for p in plans if p.compiled.loop_peeled), problem.step.xla_flags
    for p in plans:  # each point's own band: its remat family and per-device batch may differ
        p.per_chip_batch = p.per_device_batch * problem.topology.devices_per_chip
        p.band = error_band(
            Place(
                problem.topology.chip.generation,
                parse_remat(p.remat).family,
                problem.step.seq_len,
                p.per_device_batch,
                moe=problem.moe,
                slices=problem.topology.slices,
                chips=problem.topology.chips // problem.topology.slices,
                layout=layout_kind(p.layout),
            ),
            problem.cost_model,
        )
    fitting = [p for p in plans if p.fits and p.prediction]
    shown = max(fitting, key=lambda p: p.predicted_mfu) if fitting else plans[0] if plans else None
    return PlanResult(
        workload=problem.workload,
        preset=problem.preset,
        topology=problem.topology,
        global_batch=problem.step.global_batch,
        seq_len=problem.step.seq_len,
        remat=remat,
        # The reports print the convention beside the model FLOPs: the layers' attention goes with it.
        attention_convention=(
            "causal attention counted as half (MaxText)"
            if problem.attention == "causal"
            else "full attention (PaLM / torchtitan / nanoGPT)"
        )
        + f"; attention: {attention_layers(problem)}",
        model_flops_per_step=problem.model_flops,
        matmul_parameters=problem.matmul_parameters,
        plans=plans,
        rejected=rejected,
        placements=problem.placements,
        method=(
            f"scanned layers: the {problem.dims.shape.n_layers} layers compiled as one loop of "
            f"{problem.dims.scanned} iterations over stacked weights"
            + (f" ({problem.dims.unscanned} more unrolled)" if problem.dims.unscanned else "")
            + " "
            "(memory: that whole program's), FLOPs / bytes / collectives: the compiler's count plus the loops' "
            "other iterations, measured in the same program's HLO; parameters never materialised (meta device); "
            "collectives compiled as mocks"
            + (f"; {peeled} program{'s' if peeled != 1 else ''} whose block loop the compiler peeled" if peeled else "")
            + ("; FAST screening compile (least optimisation effort)" if problem.fast else "")
            + ("; compiled with XLA flags " + " ".join(xla_flags_text(flags)) if flags else "")
            + _multislice(problem.topology, problem.cost_model.dcn_step_seconds)
            + flash_blocks_said(
                problem.step.flash_block,
                {p.flash_block for p in plans if p.flash_block is not None},
                problem.chosen_flash_block,
                problem.topology.chip.generation,
                problem.topology.devices,
            )
            + _chip_step_said(problem, plans)
            + host_bound_said(problem.cost_model.host_link_gbytes_per_s, plans)
        ),
        seconds=time.perf_counter() - started,
        error_band=shown.band if shown else None,
        search=search,
        source=problem.source,
        weight_dtype=problem.step.weight_dtype,
        quantization=problem.step.quantization,
        optimizer=problem.step.optimizer,
        attention=attention_layers(problem),
    )


def flash_blocks_said(
    step_block: int | None, searched: set[int], chosen: int | None = None, generation: str = "", devices: int = 0
) -> str:
    """Which blocks the attention's flash kernel compiled with (the chip ran attention 5x slower in
    the default 128 than in 512: docs/planner.md, "On a real chip"), and whence the prediction's
    attention time: a chip's timings of the kernel where the generation has them."""
    kernels = chip_kernels(generation)
    costed = kernels is not None and kernels.step is not None and kernels.step.devices == devices
    timed = f"; attention's time from the kernel {kernels.source()}" if kernels and costed else ""
    if searched:
        return f"; flash attention in blocks of {', '.join(map(str, sorted(searched)))} (each point's own){timed}"
    if step_block is not None:
        return f"; flash attention in blocks of {step_block}{timed}"
    if chosen is not None:
        return (
            f"; flash attention in blocks of {chosen} where a device holds whole sequences (the planner's "
            f"choice: the fastest of those timed, or MaxText's 512 within 5% of it; --flash-block N){timed}"
        )
    return "; flash attention in the kernel's default blocks (128, as the calibration rows; --flash-block N)"


def _chip_step_said(problem: PlanProblem, plans: list[LayoutPlan]) -> str:
    """Where the step's matmul efficiency and recomputation's weight are a chip's own (one chip of
    the generation measured whole steps: attention_kernel.ChipStep), what they were fitted to."""
    step = next((s for s in (problem.chip_step(p.point) for p in plans) if s is not None), None)
    if step is None:
        return ""
    return (
        f"; matmuls at {step.efficiency:.3f} of peak and recomputed FLOPs weighed {step.recompute_weight:.2f}, "
        f"as this chip's steps measured ({step.fitted_to})"
    )


def attention_layers(problem: PlanProblem) -> str:
    """Each layer group's attention as the plan's FLOPs count it ("48 layers global")."""
    return describe_spans(problem.spans, problem.dims.shape.n_layers)


def _multislice(topology: Topology, dcn_step_seconds: float) -> str:
    """The method's words for a plan over several slices: where its DCN figures come from."""
    if topology.slices == 1:
        return ""
    return (
        f"; {topology.slices} slices compiled as one multi-slice program: the DCN collectives are its megascale "
        f"transfers across slices, each a ring over its slices at {topology.dcn_gbits_per_chip:.0f} Gbit/s of DCN "
        "per chip ("
        + (
            "Google Cloud's published figure"
            if topology.dcn_stated
            else "not published for this generation: v5p's figure assumed"
        )
        + ")"
        + (
            f", plus {dcn_step_seconds * 1e3:.2f} ms a latency-bound message step (fitted to the multi-slice "
            "calibration rows)"
            if dcn_step_seconds
            else ""
        )
        + ", reported apart from ICI"
    )


__all__ = ["LayoutPlan", "PlanResult", "attention_layers", "host_bound_said", "result_of"]


def host_bound_said(link_gbytes_per_s: float, plans: list[LayoutPlan]) -> str:
    """Which points the host link bounds (predict.py's roofline): their offloaded tensors take longer
    over the chip's host link than the rest of their step; empty where none is."""
    bound = sum(1 for p in plans if p.prediction and 0 < p.prediction.step_seconds <= p.prediction.host_link_seconds)
    if not bound:
        return ""
    return (
        f"; {bound} point{'s' if bound != 1 else ''} host-bound: the offloaded tensors' traffic at "
        f"{link_gbytes_per_s:.1f} GB/s a chip (the fastest host rate a calibration row sustained) outlasts "
        "the rest of the step"
    )
