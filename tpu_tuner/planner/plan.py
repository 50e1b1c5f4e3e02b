"""`tpu-tune plan`: rank sharding layouts for a TPU slice, without owning one.

For each layout the TPU compiler itself (libtpu, ahead of time, on this CPU) reports per-device
memory, FLOPs, HBM bytes and collectives; `predict.py` turns them into step time and MFU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from tpu_tuner.errors import TpuTuneError, UserInputError
from tpu_tuner.loader import load_workload
from tpu_tuner.metrics.flops import matmul_parameters, transformer_model_flops
from tpu_tuner.planner.compile_pool import CompileJob, CompilePool, default_workers, stderr_to
from tpu_tuner.planner.layouts import Layout, enumerate_layouts, partition_spec, placements
from tpu_tuner.planner.model_shape import read_dims
from tpu_tuner.planner.predict import CostModel, Prediction, predict
from tpu_tuner.planner.program import CompiledStep, add_loop_iterations, combine_scanned
from tpu_tuner.planner.hbm import compiler_hbm_limit
from tpu_tuner.planner.topology import Topology, parse_topology

log = logging.getLogger(__name__)

# The calibrated defaults (see CostModel).
CALIBRATED = CostModel()


@dataclass
class PlanOptions:
    topology: str
    global_batch: int | None = None
    seq_len: int | None = None
    preset: str | None = None
    remat: str = "full"  # "full", "offload", "minimal" or "none" (see program.REMAT_POLICIES)
    attention: str = "full"  # MFU convention: "full" or "causal"
    max_layouts: int = 10
    layouts: list[Layout] | None = None  # explicit layouts instead of the enumeration
    workers: int = field(default_factory=default_workers)  # compiler processes at once
    fast_compile: bool = False  # program.FAST_COMPILE_OPTIONS: quicker, but temporaries overstated
    log_file: Path | None = None  # the compiler processes' output (libtpu's logs); None: the terminal
    cost_model: CostModel = field(default_factory=lambda: CALIBRATED)


@dataclass
class LayoutPlan:
    """One layout's compiler figures and prediction (prediction None when it did not compile)."""

    layout: Layout
    compiled: CompiledStep
    fits: bool
    margin_bytes: float
    why: str
    prediction: Prediction | None


@dataclass
class PlanResult:
    workload: str
    preset: str | None
    topology: Topology
    global_batch: int
    seq_len: int
    remat: str
    attention_convention: str
    model_flops_per_step: float
    matmul_parameters: int
    plans: list[LayoutPlan]
    rejected: list[tuple[Layout, str]]
    placements: dict[str, str]
    method: str
    seconds: float

    @property
    def best(self) -> LayoutPlan | None:
        fitting = [p for p in self.plans if p.fits and p.prediction]
        return max(fitting, key=lambda p: p.prediction.mfu) if fitting else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["topology"] = {"name": self.topology.name, "jax_name": self.topology.jax_name,
                            "chips": self.topology.chips, "devices": self.topology.devices,
                            "generation": self.topology.chip.generation,
                            "hbm_bytes_per_device": self.topology.hbm_bytes_per_device,
                            "hbm_from": "compiler" if self.topology.compiler_hbm_bytes is not None else "spec"}
        data["best"] = self.best.layout.name() if self.best else None
        return data


def plan(model_file: str | Path, options: PlanOptions, progress: Callable[[str], None] | None = None) -> PlanResult:
    """Plan `model_file` on `options.topology`."""
    started = time.perf_counter()
    topology = parse_topology(options.topology)
    # The compiler processes start now: their start-up overlaps reading the model.
    with CompilePool(options.workers, options.log_file) as pool:
        return _plan(model_file, options, topology, pool, progress or (lambda message: None), started)


def _screen_in_worker(model_file: str | Path) -> None:
    """Import the file in a worker first, so that one which crashes at import is reported
    ("the process died with SIGSEGV while importing", exit 2) rather than killing tpu-tune.
    The planner still builds the model (on the meta device) in this process afterwards: its shape
    analysis needs the module itself (docs/run-safety.md)."""
    from tpu_tuner.runner.pool import TrialRunner
    from tpu_tuner.runner.summary import load_summary

    with TrialRunner(str(model_file), "cpu") as runner:
        load_summary(runner, model_file, sample_lengths=False)


def _plan(model_file: str | Path, options: PlanOptions, topology: Topology, pool: CompilePool,
          emit: Callable[[str], None], started: float) -> PlanResult:
    _screen_in_worker(model_file)
    workload = load_workload(model_file)
    if not workload.is_training:
        raise UserInputError("the planner plans training steps: the file needs a loss()", workload.source)
    with stderr_to(options.log_file):  # libtpu's start-up complaints go where the workers' go
        devices = _topology_devices(topology)  # fails early, with the install hint, when libtpu is missing
        # The compiler's view: its device count (v4: one per TensorCore) and its HBM limit.
        topology = topology.as_compiled(len(devices), compiler_hbm_limit(devices[0]))
    emit(f"{topology.describe()}; HBM limit {topology.hbm_bytes_per_device / 2**30:.2f} GiB per device "
         f"({'the compiler' if topology.compiler_hbm_bytes is not None else 'published capacity'})")
    seq_len = options.seq_len or workload.seq_len
    if not seq_len:
        raise UserInputError("give --seq (the file has no SEQ_LEN)", workload.source)
    global_batch = options.global_batch or (workload.batch_size or 1) * topology.devices
    with torch.device("meta"):
        meta_model = workload.model_for_preset(options.preset)
    transformer = workload.dims_for_preset(options.preset)
    dims = read_dims(meta_model, transformer.heads if transformer else None)
    n_matmul = matmul_parameters(meta_model)
    model_flops = _model_flops(n_matmul, transformer, dims, global_batch, seq_len, options.attention)
    # Work the chips do: full attention (the mask is applied, not skipped) plus the forward pass
    # again under full remat. A floor under the compiler's count, which counts a while-loop body
    # (XLA's windowed einsums for FSDP) once; see predict.py.
    hardware_flops = _model_flops(n_matmul, transformer, dims, global_batch, seq_len, "full") * (
        4 / 3 if options.remat in ("full", "offload") else 1.0)

    hbm = topology.hbm_bytes_per_device
    n_params = sum(p.numel() for p in meta_model.parameters())
    if options.layouts:
        candidates, rejected = options.layouts, []
    else:
        candidates, rejected = enumerate_layouts(topology.devices, dims.shape, global_batch)
        candidates, too_big = _weights_fit(candidates, n_params, hbm)
        rejected += too_big
        candidates = sorted(candidates, key=_preference)[: options.max_layouts]
    if not candidates:
        raise UserInputError(f"no layout divides this model or fits it on {topology.devices} devices: "
                             + "; ".join(r for _, r in rejected[:3]))

    # One program a layout: every block scanned, its loops measured in its own HLO (program.py).
    depth = dims.shape.n_layers

    def job(layout: Layout, blocks: int, fast: bool = options.fast_compile) -> CompileJob:
        return CompileJob(str(workload.source), options.preset, blocks, layout, topology.jax_name, global_batch,
                          seq_len, dims.shape.d_model, options.remat, fast, scan=True)

    emit(f"compiling {len(candidates)} layouts for {topology.jax_name} on {pool.workers} compiler processes")
    finished: list[Layout] = []

    def done(compiled_job: CompileJob, step: CompiledStep) -> None:
        finished.append(compiled_job.layout)
        status = "refused" if step.error else f"compiled in {step.compile_seconds:.0f} s"
        emit(f"[{len(finished)}/{len(candidates)}] {compiled_job.layout.name()}: {status} ({time.perf_counter() - started:.0f} s)")

    scanned = {j.layout: step for j, step in pool.compile([job(layout, depth) for layout in candidates], done).items()}
    # A second round, only where needed. Block loops that could not be measured: the ends-only
    # program gives one block as the difference (program.combine_scanned). Loops a full-effort
    # compile peeled (its cost analysis then holds more than one block): the work is read from the
    # same program compiled with the least effort, which does not peel (measured: 8B with host
    # offload on v6e-256 counted 4.09e15 FLOPs peeled, 2.10e15 not, as the unrolled program does).
    ends_jobs = {layout: job(layout, 0) for layout, step in scanned.items() if not step.error and step.loop_iteration is None}
    recost_jobs = {layout: job(layout, depth, fast=True) for layout, step in scanned.items()
                   if not step.error and not options.fast_compile and step.loop_peeled}
    if ends_jobs:
        emit(f"{len(ends_jobs)} layouts' block loops could not be measured in their HLO: compiling their ends alone")
    if recost_jobs:
        emit(f"{len(recost_jobs)} layouts' block loops were peeled by the compiler: recompiling them once for their work")
    second = pool.compile([*ends_jobs.values(), *recost_jobs.values()])

    plans = []
    for layout in candidates:
        step = scanned[layout]
        ends = second[ends_jobs[layout]] if layout in ends_jobs else None
        failed = step if step.error else ends if ends is not None and ends.error else None
        if failed is not None:
            plans.append(LayoutPlan(layout, failed, False, 0.0, f"the compiler refused: {failed.error}", None))
            continue
        cost_step = second[recost_jobs[layout]] if layout in recost_jobs else None
        if cost_step is not None and cost_step.error:
            cost_step = None
        if ends is not None:
            full = combine_scanned(ends, step, depth, cost_step)
        else:
            full = add_loop_iterations(step, depth, cost_step if cost_step and cost_step.loop_iteration else None)
        if full.loop_peeled:
            log.warning("%s: the compiler peeled the block loop; per-block work may count more than one block", layout.name())
        fits = full.peak_bytes <= hbm
        why = (
            f"arguments (weights + optimizer state) {full.argument_bytes / 2**30:.1f} GiB + temporaries "
            f"(activations, gathered weights) {full.temp_bytes / 2**30:.1f} GiB + outputs "
            f"{(full.output_bytes - full.alias_bytes) / 2**30:.1f} GiB vs {hbm / 2**30:.1f} GiB HBM"
            + (f"; {full.host_temp_bytes / 2**30:.1f} GiB of block inputs offloaded to host memory" if full.host_temp_bytes else "")
            + ("; the compiler peeled the block loop, so FLOPs / bytes / collectives may count more than one block"
               if full.loop_peeled else "")
        )
        prediction = predict(full, topology, layout, dims.shape, dims.head_dim, model_flops / topology.devices,
                             global_batch * seq_len, options.cost_model, hardware_flops / topology.devices)
        plans.append(LayoutPlan(layout, full, fits, hbm - full.peak_bytes, why, prediction))
    plans.sort(key=lambda p: (not p.fits, -(p.prediction.mfu if p.prediction else 0.0)))
    placement = placements(meta_model, dims.shape.d_model)
    return PlanResult(
        workload=workload.name,
        preset=options.preset,
        topology=topology,
        global_batch=global_batch,
        seq_len=seq_len,
        remat=options.remat,
        attention_convention="causal attention counted as half (MaxText)" if options.attention == "causal"
        else "full attention (PaLM / torchtitan / nanoGPT)",
        model_flops_per_step=model_flops,
        matmul_parameters=n_matmul,
        plans=plans,
        rejected=rejected,
        placements={name: "/".join(a or "-" for a in (partition_spec(kind, 2) or ("replicated",)))
                    for name, kind in placement.items()},
        method=(f"scanned layers: the {dims.shape.n_layers} blocks compiled as one loop over stacked weights (memory: "
                "that whole program's), FLOPs / bytes / collectives: the compiler's count plus the loops' other "
                f"{dims.shape.n_layers - 1} iterations, measured in the same program's HLO; parameters never materialised (meta device); collectives compiled as mocks"
                + (f"; {len(ends_jobs)} layout{'s' if len(ends_jobs) != 1 else ''} whose loops could not be measured: one block is the difference "
                   "from a second, block-less program" if ends_jobs else "")
                + ("; FAST screening compile (least optimisation effort)" if options.fast_compile else "")),
        seconds=time.perf_counter() - started,
    )


def _weights_fit(layouts: list[Layout], n_params: int, hbm: float) -> tuple[list[Layout], list[tuple[Layout, str]]]:
    """Drop, without compiling, layouts whose fp32 weights and two AdamW moments alone (12 bytes a
    parameter, split over fsdp x tensor, replicated over data) exceed a device's HBM: a lower bound
    on the compiler's argument bytes, so nothing that could fit is dropped."""
    keep, drop = [], []
    for layout in layouts:
        need = 12 * n_params / (layout.fsdp * layout.tensor)
        if need > hbm:
            reason = (f"fp32 weights + AdamW moments alone need {need / 2**30:.0f} GiB per device "
                      f"(> {hbm / 2**30:.0f} GiB HBM)")
            drop.append((layout, reason))
        else:
            keep.append(layout)
    return keep, drop


def _preference(layout: Layout) -> tuple:
    # Try the layouts practitioners reach for first: FSDP-heavy, small tensor axes, little pure DP.
    return (layout.tensor > 8, layout.data, layout.tensor, -layout.fsdp)


def _model_flops(n_matmul: int, transformer: Any, dims: Any, batch: int, seq: int, convention: str) -> float:
    from tpu_tuner.workload import TransformerDims

    attention = transformer or TransformerDims(dims.shape.n_layers, dims.shape.n_heads, dims.head_dim, True)
    return transformer_model_flops(n_matmul, attention, batch, seq, True, convention).per_step  # type: ignore[arg-type]


def _topology_devices(topology: Topology) -> Any:
    """The topology's devices (the workers build theirs the same way), or a clear error without libtpu."""
    try:
        from tpu_tuner.planner.compile_pool import topology_devices

        return topology_devices(topology.jax_name)
    except ImportError as exc:
        raise TpuTuneError("the planner needs JAX: pip install 'tpu-tune[plan]'") from exc
    except Exception as exc:  # noqa: BLE001 - no libtpu, or a shape it does not know
        raise TpuTuneError(
            f"cannot build the TPU topology {topology.jax_name}: {type(exc).__name__}: {str(exc).splitlines()[0]} "
            "(the planner needs libtpu: pip install 'tpu-tune[plan]')"
        ) from exc
