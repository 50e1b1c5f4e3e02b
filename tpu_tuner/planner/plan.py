"""`tpu-tune plan`: rank sharding layouts for a TPU slice, without owning one.

For each layout the TPU compiler itself (libtpu, ahead of time, on this CPU) reports per-device
memory, FLOPs, HBM bytes and collectives; `predict.py` turns them into step time and MFU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from tpu_tuner.core.errors import TpuTuneError, UserInputError
from tpu_tuner.model.loader import load_workload
from tpu_tuner.metrics.flops import matmul_parameters, transformer_model_flops
from tpu_tuner.planner.calibration import calibrated_cost_model
from tpu_tuner.planner.compile_pool import CompileJob, CompilePool, default_workers, stderr_to
from tpu_tuner.planner.hbm import compiler_hbm_limit
from tpu_tuner.model.layouts import Layout, enumerate_layouts, partition_spec, placements
from tpu_tuner.model.structure import Dims, read_dims
from tpu_tuner.planner.predict import CostModel, ErrorBand, Prediction, error_band, predict
from tpu_tuner.model.blocks import blocks_of
from tpu_tuner.planner.program import CompiledStep, add_loop_iterations, combine_scanned
from tpu_tuner.planner.remat import block_tensor_roles, forward_flops_per_token, mlp_width, parse_remat
from tpu_tuner.planner.space import (DEFAULT_ACCUMULATIONS, DEFAULT_CONTEXTS, DEFAULT_REMATS, MemoryBound, PlanPoint,
                                     SearchSpace, invalid_reason, memory_lower_bound)
from tpu_tuner.planner.topology import Topology, parse_topology

log = logging.getLogger(__name__)



@dataclass
class PlanOptions:
    topology: str
    global_batch: int | None = None
    seq_len: int | None = None
    preset: str | None = None
    remat: str = "full"  # a policy as remat.parse_remat reads it: "full", "save_qkv_proj", "custom:...", ...
    accumulation: int = 1  # micro-batches a step (gradient accumulation)
    first_moment_dtype: str = "float32"  # AdamW's first moment: "float32" or "bfloat16" (MaxText's mu_dtype)
    attention: str = "full"  # MFU convention: "full" or "causal"
    max_layouts: int = 10
    layouts: list[Layout] | None = None  # explicit layouts instead of the enumeration
    workers: int = field(default_factory=default_workers)  # compiler processes at once
    fast_compile: bool = False  # program.FAST_COMPILE_OPTIONS: quicker, but temporaries overstated
    log_file: Path | None = None  # the compiler processes' output (libtpu's logs); None: the terminal
    cost_model: CostModel = field(default_factory=calibrated_cost_model)  # fitted to the published rows
    # The search (planner/search.py): with a budget, Optuna picks `budget` points of the joint
    # space to compile instead of the layout enumeration.
    budget: int | None = None
    space: SearchSpace | None = None  # None: space.default_space with the three below
    remats: tuple[str, ...] = DEFAULT_REMATS
    accumulations: tuple[int, ...] = DEFAULT_ACCUMULATIONS
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    sampler: str = "tpe"  # "tpe", "random" or "exhaustive" (every valid point, in order)
    seed: int = 0
    study: str | None = None  # the Optuna study's name; None: one derived from the plan's inputs
    storage: str | None = None  # an Optuna storage URL; None: in memory (plan_to_folder gives one)


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

    @property
    def point(self) -> PlanPoint:
        return PlanPoint(self.layout, self.remat, self.accumulation)


@dataclass
class PlanResult:
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
    error_band: ErrorBand | None = None
    search: dict[str, Any] | None = None  # the search's study, space and every trial
    source: str | None = None  # the model file (or shape) as given

    @property
    def best(self) -> LayoutPlan | None:
        fitting = [p for p in self.plans if p.fits and p.prediction]
        return max(fitting, key=lambda p: p.prediction.mfu) if fitting else None

    @property
    def indistinguishable(self) -> list[LayoutPlan]:
        """The fitting points whose predicted MFU is within the error band of the best's (the
        best first): the prediction cannot order them, a measurement can."""
        best = self.best
        if best is None or self.error_band is None:
            return [best] if best else []
        floor = best.prediction.mfu - self.error_band.points / 100
        return [p for p in sorted(self.plans, key=lambda p: -(p.prediction.mfu if p.prediction else 0))
                if p.fits and p.prediction and p.prediction.mfu >= floor]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["topology"] = {"name": self.topology.name, "jax_name": self.topology.jax_name,
                            "chips": self.topology.chips, "devices": self.topology.devices,
                            "generation": self.topology.chip.generation,
                            "hbm_bytes_per_device": self.topology.hbm_bytes_per_device,
                            "hbm_from": "compiler" if self.topology.compiler_hbm_bytes is not None else "spec"}
        data["best"] = self.best.point.name() if self.best else None
        data["indistinguishable"] = [p.point.name() for p in self.indistinguishable]
        return data


def plan(model_file: str | Path, options: PlanOptions, progress: Callable[[str], None] | None = None) -> PlanResult:
    """Plan `model_file` on `options.topology`: the layout enumeration, or with `options.budget`
    (or the exhaustive sampler) the search over the joint space."""
    started = time.perf_counter()
    topology = parse_topology(options.topology)
    # The compiler processes start now: their start-up overlaps reading the model.
    with CompilePool(options.workers, options.log_file) as pool:
        emit = progress or (lambda message: None)
        problem = _problem(model_file, options, topology, emit)
        if options.budget is not None or options.sampler == "exhaustive":
            from tpu_tuner.planner.search import search

            return search(problem, options, pool, emit, started)
        return _enumerated(problem, options, pool, emit, started)


@dataclass(frozen=True)
class PlanProblem:
    """What every point of one plan shares: the model, slice, batch and the FLOPs conventions."""

    source: str
    workload: str
    preset: str | None
    topology: Topology
    global_batch: int
    seq_len: int
    dims: Dims
    gated: bool
    matmul_parameters: int
    parameters: int
    model_flops: float
    attention: str
    fast: bool
    cost_model: CostModel
    placements: dict[str, str]
    first_moment_dtype: str = "float32"

    @property
    def hbm(self) -> float:
        return self.topology.hbm_bytes_per_device

    def hardware_flops(self, remat: str) -> float:
        """The work the chips do, a floor under the compiler's count (predict.py): the model's
        FLOPs with full attention plus what `remat` recomputes of each block's forward."""
        shape = self.dims.shape
        _, recomputed = forward_flops_per_token(parse_remat(remat), shape.d_model, shape.n_heads, shape.n_kv_heads,
                                                self.dims.head_dim, shape.mlp_hidden, self.gated, self.seq_len)
        full = _model_flops(self.matmul_parameters, None, self.dims, self.global_batch, self.seq_len, "full")
        return full + recomputed * shape.n_layers * self.global_batch * self.seq_len

    def job(self, point: PlanPoint, blocks: int, fast: bool | None = None) -> CompileJob:
        return CompileJob(self.source, self.preset, blocks, point.layout, self.topology.jax_name, self.global_batch,
                          self.seq_len, self.dims.shape.d_model, point.remat, self.fast if fast is None else fast,
                          scan=True, accumulation=point.accumulation, first_moment_dtype=self.first_moment_dtype)

    def lower_bound(self, point: PlanPoint) -> MemoryBound:
        return memory_lower_bound(point, self.matmul_parameters, self.dims.shape, self.global_batch, self.seq_len,
                                  first_moment_bytes=2 if self.first_moment_dtype == "bfloat16" else 4)


def _screen_in_worker(model_file: str | Path) -> None:
    """Import the file in a worker first, so that one which crashes at import is reported
    ("the process died with SIGSEGV while importing", exit 2) rather than killing tpu-tune.
    The planner still builds the model (on the meta device) in this process afterwards: its shape
    analysis needs the module itself (docs/run-safety.md)."""
    from tpu_tuner.runner.trial_runner import TrialRunner
    from tpu_tuner.runner.load import load_summary

    with TrialRunner(str(model_file), "cpu") as runner:
        load_summary(runner, model_file, sample_lengths=False)


def _problem(model_file: str | Path, options: PlanOptions, topology: Topology, emit: Callable[[str], None]) -> PlanProblem:
    _screen_in_worker(model_file)
    workload = load_workload(model_file)
    if not workload.is_training:
        raise UserInputError("the planner plans training steps: the file needs a loss()", workload.source)
    for policy in (options.remat, *options.remats):
        parse_remat(policy)  # a bad policy is bad input, before any compile
    if options.first_moment_dtype not in ("float32", "bfloat16"):
        raise UserInputError(f"the first moment's dtype is float32 or bfloat16, not {options.first_moment_dtype!r}")
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
    _, blocks = blocks_of(meta_model)
    roles, _ = block_tensor_roles(blocks[0], dims.shape.d_model, mlp_width(blocks[0], dims.shape.d_model))
    placement = placements(meta_model, dims.shape.d_model)
    return PlanProblem(
        source=str(workload.source), workload=workload.name, preset=options.preset, topology=topology,
        global_batch=global_batch, seq_len=seq_len, dims=dims, gated="mlpwi_1" in roles.values(),
        matmul_parameters=n_matmul, parameters=sum(p.numel() for p in meta_model.parameters()),
        model_flops=_model_flops(n_matmul, transformer, dims, global_batch, seq_len, options.attention),
        attention=options.attention, fast=options.fast_compile, cost_model=options.cost_model,
        first_moment_dtype=options.first_moment_dtype,
        placements={name: "/".join(a or "-" for a in (partition_spec(kind, 2) or ("replicated",)))
                    for name, kind in placement.items()},
    )


def _enumerated(problem: PlanProblem, options: PlanOptions, pool: CompilePool, emit: Callable[[str], None],
                started: float) -> PlanResult:
    """The plan of `options.layouts`, or of the first `max_layouts` enumerated layouts, each with
    the options' remat policy and micro-batch count."""
    shape = problem.dims.shape
    if options.layouts:
        candidates, rejected = options.layouts, []
    else:
        candidates, rejected = enumerate_layouts(problem.topology.devices, shape,
                                                 problem.global_batch // max(1, options.accumulation), problem.seq_len)
        candidates, too_big = _weights_fit(candidates, problem.matmul_parameters, problem.hbm,
                                           2 if problem.first_moment_dtype == "bfloat16" else 4)
        rejected += too_big
        candidates = sorted(candidates, key=_preference)[: options.max_layouts]
    if not candidates:
        raise UserInputError(f"no layout divides this model or fits it on {problem.topology.devices} devices: "
                             + "; ".join(r for _, r in rejected[:3]))
    points = [PlanPoint(layout, parse_remat(options.remat).name, options.accumulation) for layout in candidates]
    for point in points:
        reason = invalid_reason(point, shape, problem.global_batch, problem.seq_len)
        if reason:
            raise UserInputError(f"{point.layout.short()}: {reason}")
    emit(f"compiling {len(points)} layouts for {problem.topology.jax_name} on {pool.workers} compiler processes")
    counter = iter(range(1, len(points) + 1))

    def done(point: PlanPoint, step: CompiledStep) -> None:
        status = "refused" if step.error else f"compiled in {step.compile_seconds:.0f} s"
        emit(f"[{next(counter)}/{len(points)}] {point.layout.name()}: {status} ({time.perf_counter() - started:.0f} s)")

    evaluated = evaluate(problem, points, pool, emit, done)
    plans = sorted(evaluated.values(), key=lambda p: (not p.fits, -(p.prediction.mfu if p.prediction else 0.0)))
    return result_of(problem, plans, rejected, parse_remat(options.remat).name, started)


def result_of(problem: PlanProblem, plans: list[LayoutPlan], rejected: list[tuple[Layout, str]], remat: str,
              started: float, search: dict[str, Any] | None = None) -> PlanResult:
    """The PlanResult of evaluated points."""
    peeled = sum(1 for p in plans if p.compiled.loop_peeled)
    return PlanResult(
        workload=problem.workload,
        preset=problem.preset,
        topology=problem.topology,
        global_batch=problem.global_batch,
        seq_len=problem.seq_len,
        remat=remat,
        attention_convention="causal attention counted as half (MaxText)" if problem.attention == "causal"
        else "full attention (PaLM / torchtitan / nanoGPT)",
        model_flops_per_step=problem.model_flops,
        matmul_parameters=problem.matmul_parameters,
        plans=plans,
        rejected=rejected,
        placements=problem.placements,
        method=(f"scanned layers: the {problem.dims.shape.n_layers} blocks compiled as one loop over stacked weights "
                "(memory: that whole program's), FLOPs / bytes / collectives: the compiler's count plus the loops' "
                "other iterations, measured in the same program's HLO; parameters never materialised (meta device); "
                "collectives compiled as mocks"
                + (f"; {peeled} program{'s' if peeled != 1 else ''} whose block loop the compiler peeled" if peeled else "")
                + ("; FAST screening compile (least optimisation effort)" if problem.fast else "")),
        seconds=time.perf_counter() - started,
        error_band=error_band(problem.topology.chip.generation, problem.cost_model),
        search=search,
        source=problem.source,
    )


def evaluate(problem: PlanProblem, points: list[PlanPoint], pool: CompilePool, emit: Callable[[str], None],
             done: Callable[[PlanPoint, CompiledStep], None] | None = None) -> dict[PlanPoint, LayoutPlan]:
    """Compile every point (one program each: every block scanned, its loops measured in its own
    HLO; program.py) and predict it."""
    depth = problem.dims.shape.n_layers
    jobs = {point: problem.job(point, depth) for point in points}
    by_job = {job: point for point, job in jobs.items()}

    def first_done(job: CompileJob, step: CompiledStep) -> None:
        if done is not None:
            done(by_job[job], step)

    scanned = {by_job[job]: step for job, step in pool.compile(list(jobs.values()), first_done).items()}
    # A second round, only where needed. Block loops that could not be measured: the ends-only
    # program gives one block as the difference (program.combine_scanned; single micro-batch
    # programs only). Loops a full-effort compile peeled (its cost analysis then holds more than
    # one block): the work is read from the same program compiled with the least effort, which
    # does not peel (measured: 8B with host offload on v6e-256 counted 4.09e15 FLOPs peeled,
    # 2.10e15 not, as the unrolled program does).
    ends_jobs = {p: problem.job(p, 0) for p, step in scanned.items()
                 if not step.error and step.loop_iteration is None and p.accumulation == 1}
    recost_jobs = {p: problem.job(p, depth, fast=True) for p, step in scanned.items()
                   if not step.error and not problem.fast and step.loop_peeled}
    if ends_jobs:
        emit(f"{_programs(len(ends_jobs))} block loops could not be measured in {_its(len(ends_jobs))} HLO: "
             f"compiling {_its(len(ends_jobs))} ends alone")
    if recost_jobs:
        emit(f"{_programs(len(recost_jobs))} block loops were peeled by the compiler: recompiling "
             f"{'it' if len(recost_jobs) == 1 else 'them'} once for {_its(len(recost_jobs))} work")
    second = pool.compile([*ends_jobs.values(), *recost_jobs.values()])
    return {point: _judge(problem, point, scanned[point], second.get(ends_jobs.get(point)),  # type: ignore[arg-type]
                          second.get(recost_jobs.get(point))) for point in points}  # type: ignore[arg-type]


def _judge(problem: PlanProblem, point: PlanPoint, step: CompiledStep, ends: CompiledStep | None,
           cost_step: CompiledStep | None) -> LayoutPlan:
    """One point's LayoutPlan from its compiled programs."""
    depth = problem.dims.shape.n_layers
    failed = step if step.error else ends if ends is not None and ends.error else None
    if failed is None and ends is None and step.loop_iteration is None:
        failed = replace(step, error="the block loops could not be measured in the compiled program")
    iteration = step.loop_iteration
    if (failed is None and point.accumulation > 1 and iteration is not None and iteration.micro_batch is None
            and iteration.loops < 2 * point.accumulation):
        # Neither a micro-batch loop around the block loops nor one pair of block loops per
        # micro-batch (unrolled): the work cannot be counted (a model of one block, say).
        failed = replace(step, error="the micro-batch loop could not be measured in the compiled program")
    if failed is not None:
        return judged(problem, point, failed)
    if cost_step is not None and (cost_step.error or cost_step.loop_iteration is None):
        cost_step = None
    if ends is not None:
        full = combine_scanned(ends, step, depth, cost_step)
    else:
        full = add_loop_iterations(step, depth, cost_step, point.accumulation)
    return judged(problem, point, full)


def _programs(n: int) -> str:
    return "1 program's" if n == 1 else f"{n} programs'"


def _its(n: int) -> str:
    return "its" if n == 1 else "their"


def judged(problem: PlanProblem, point: PlanPoint, full: CompiledStep) -> LayoutPlan:
    """The LayoutPlan of a point from its whole step's compiler figures (or refusal)."""
    hbm = problem.hbm
    bound = problem.lower_bound(point).total
    batch = point.per_device_batch(problem.global_batch)
    if full.error:
        return LayoutPlan(point.layout, full, False, 0.0, f"the compiler refused: {full.error}", None,
                          point.remat, point.accumulation, batch, bound)
    if full.loop_peeled:
        log.warning("%s: the compiler peeled the block loop; per-block work may count more than one block", point.name())
    if bound > full.peak_bytes * 1.001:
        log.error("%s: the memory lower bound (%.2f GiB) is above the compiled peak (%.2f GiB): the bound is wrong "
                  "and may have ruled out points that fit", point.name(), bound / 2**30, full.peak_bytes / 2**30)
    fits = full.peak_bytes <= hbm
    why = (
        (f"the compiler's peak {full.compiler_peak_bytes / 2**30:.1f} GiB of live buffers; allocated: " if full.compiler_peak_bytes else "")
        + f"arguments (weights + optimizer state) {full.argument_bytes / 2**30:.1f} GiB + temporaries "
        f"(activations, gathered weights) {full.temp_bytes / 2**30:.1f} GiB + outputs "
        f"{(full.output_bytes - full.alias_bytes) / 2**30:.1f} GiB vs {hbm / 2**30:.2f} GiB HBM limit"
        + (f"; {full.host_temp_bytes / 2**30:.1f} GiB offloaded to host memory" if full.host_temp_bytes else "")
        + ("; the compiler peeled the block loop, so FLOPs / bytes / collectives may count more than one block"
           if full.loop_peeled else "")
    )
    devices = problem.topology.devices
    prediction = predict(full, problem.topology, point.layout, problem.dims.shape, problem.dims.head_dim,
                         problem.model_flops / devices, problem.global_batch * problem.seq_len, problem.cost_model,
                         problem.hardware_flops(point.remat) / devices)
    return LayoutPlan(point.layout, full, fits, hbm - full.peak_bytes, why, prediction, point.remat,
                      point.accumulation, batch, bound)


def _weights_fit(layouts: list[Layout], n_params: int, hbm: float,
                 first_moment_bytes: int = 4) -> tuple[list[Layout], list[tuple[Layout, str]]]:
    """Drop, without compiling, layouts whose fp32 weights and two AdamW moments alone (8 bytes a
    parameter plus the first moment's, split over fsdp x context x tensor, replicated over data)
    exceed a device's HBM: a lower bound on the compiler's argument bytes, so nothing that could
    fit is dropped."""
    keep, drop = [], []
    for layout in layouts:
        need = (8 + first_moment_bytes) * n_params / layout.parameter_shards
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
    from tpu_tuner.model.workload import TransformerDims

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
