"""A --fast point near the HBM limit is compiled again at full effort, which decides whether it
fits (planner/plans/evaluate.py), and the plan says which effort decided; v4 plans as megacore."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from helpers.tiny_planner import tiny_llama_problem

from tpu_tuner.model.meshes.layouts import Layout
from tpu_tuner.outputs.plan_report import hbm_status
from tpu_tuner.planner.compiler.compile_request import StepSettings, topology_config
from tpu_tuner.planner.compiler.compiled_step import CompiledStep
from tpu_tuner.planner.compiler.loop_costs import LoopIteration
from tpu_tuner.planner.plans.evaluate import evaluate, judged, near_limit
from tpu_tuner.planner.plans.plan_problem import PlanProblem
from tpu_tuner.planner.plans.plan_space import PlanPoint
from tpu_tuner.planner.prediction.predict import CostModel
from tpu_tuner.planner.topology import parse_topology

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
HBM = 8 * 2**30
# libtpu's refusals as the compile pool keeps them (the exception's first line): out of HBM, out
# of a kernel's scoped VMEM (benchmarks/planner/calibration_compiled.json), and faults that are no verdict
# on memory though their text names it: a compiler process SIGKILLed, and a RET_CHECK in the form
# of libtpu 0.0.42's (docs/planner.md), put in XLA's memory-space-assignment pass.
HBM_OOM = (
    "XlaRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory "
    "space hbm. Used 96.71G of 95.74G hbm. Exceeded hbm capacity by 993.28M."
)
VMEM_OOM = "XlaRuntimeError: RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:"
RET_CHECK = (
    "XlaRuntimeError: INTERNAL: RET_CHECK failure (xla/service/memory_space_assignment/"
    "memory_space_assignment.cc:1375) allocation->memory_space() == MemorySpace::kDefault HBM buffer"
)


class _TwoEffortPool:
    """The fast compile says `fast` of the limit, the full-effort one `full` (None: refused with `refusal`)."""

    workers = 1

    def __init__(self, fast: float, full: float | None, refusal: str = HBM_OOM) -> None:
        self.fast, self.full, self.refusal, self.jobs = fast, full, refusal, []

    def compile(self, jobs, done=None):
        out = {}
        for job in jobs:
            self.jobs.append(job)
            share = self.fast if job.fast else self.full
            iteration = LoopIteration(1e9, 1e6, [], loops=2)
            if share is None:
                step = CompiledStep(0, 0, 0, 0, 0, 0, [], 1.0, error=self.refusal)
            else:
                step = CompiledStep(
                    2e9, 2e6, share * HBM / 2, 0.0, share * HBM / 2, 0.0, [], 1.0, loop_iteration=iteration
                )
            out[job] = step
            if done:
                done(job, step)
        return out


def _problem(fast: bool) -> PlanProblem:
    return tiny_llama_problem(hbm_gib=HBM / 2**30, fast=fast)


POINT = PlanPoint(Layout(1, 8, 1))


def test_near_limit_reads_peaks_and_refusals() -> None:
    step = CompiledStep(0, 0, 0.48 * HBM, 0, 0.49 * HBM, 0, [])
    assert near_limit(step, HBM) and not near_limit(CompiledStep(0, 0, 0.4 * HBM, 0, 0.4 * HBM, 0, []), HBM)
    refused = CompiledStep(
        0,
        0,
        0,
        0,
        0,
        0,
        [],
        error="RESOURCE_EXHAUSTED: ... the total memory required for HLO "
        "temporaries (8.20G) exceeds available HBM (8.00G).",
    )
    assert near_limit(refused, HBM)
    far = CompiledStep(0, 0, 0, 0, 0, 0, [], error="... HLO temporaries (12.00G) exceeds available HBM (8.00G).")
    assert not near_limit(far, HBM) and not near_limit(CompiledStep(0, 0, 0, 0, 0, 0, [], error="SIGFPE"), HBM)


@pytest.mark.parametrize("full, fits", [(1.03, False), (0.95, True), (None, False)])
def test_a_fast_point_near_the_limit_is_decided_at_full_effort(full: float | None, fits: bool) -> None:
    pool = _TwoEffortPool(fast=0.98, full=full)
    (plan,) = evaluate(_problem(fast=True), [POINT], pool, lambda message: None).values()
    assert [job.fast for job in pool.jobs] == [True, False]
    assert plan.fits is fits and plan.fit_effort.startswith("full effort")
    assert "full effort" in hbm_status(plan)


@pytest.mark.parametrize(
    "refusal, out_of_memory",
    [
        (HBM_OOM, True),
        (VMEM_OOM, True),
        (RET_CHECK, False),
        ("the compiler process died from SIGKILL (the kernel's OOM killer)", False),
    ],
)
def test_the_planner_and_plan_md_read_a_compiler_refusal_alike(refusal: str, out_of_memory: bool) -> None:
    """A full-effort refusal decides a near-limit point only when it is for memory; plan.md says
    DOES NOT FIT for exactly those refusals, COMPILER FAILED for the rest."""
    problem = _problem(fast=True)
    (plan,) = evaluate(problem, [POINT], _TwoEffortPool(fast=0.98, full=None, refusal=refusal), lambda _: None).values()
    assert (plan.compiled.error == refusal) is out_of_memory  # the planner's verdict
    assert plan.fits is not out_of_memory  # else the fast compile's 98% decides
    refused = hbm_status(judged(problem, POINT, CompiledStep(0, 0, 0, 0, 0, 0, [], 1.0, error=refusal)))
    assert refused == ("DOES NOT FIT" if out_of_memory else "COMPILER FAILED")


class _UnrolledAtFullEffort(_TwoEffortPool):
    """As `_TwoEffortPool`, and with micro-batches the fast program has its micro-batch loop
    measured while the full-effort one unrolled it past measuring (one block loop, no micro-batch
    loop: Llama 3.1 70B on v6e-32 at 8 micro-batches, libtpu 0.0.42)."""

    def compile(self, jobs, done=None):
        out = super().compile(jobs, done)
        for job, step in out.items():
            if not step.error:
                micro = LoopIteration(4e9, 4e6, [], loops=2) if job.fast else None
                out[job] = replace(step, loop_iteration=LoopIteration(1e9, 1e6, [], loops=2, micro_batch=micro))
        return out


def test_full_effort_decides_memory_and_the_fast_program_counts_the_micro_batches() -> None:
    point = PlanPoint(Layout(1, 8, 1), "full", 4)
    pool = _UnrolledAtFullEffort(fast=0.98, full=0.95)
    (plan,) = evaluate(_problem(fast=True), [point], pool, lambda message: None).values()
    assert [job.fast for job in pool.jobs] == [True, False]
    # Before: refused, "the micro-batch loop could not be measured in the compiled program".
    assert plan.fits and plan.prediction is not None and plan.fit_effort.startswith("full effort")
    assert plan.compiled.peak_bytes == pytest.approx(0.95 * HBM)  # the full-effort program's memory
    blocks = _problem(fast=True).dims.scanned
    assert plan.compiled.flops == pytest.approx(2e9 + 3 * 4e9 + 4 * (blocks - 1) * 1e9)  # the fast program's count


def test_a_fast_point_far_from_the_limit_stays_fast_and_full_effort_plans_compile_once() -> None:
    pool = _TwoEffortPool(fast=0.5, full=1.5)
    (plan,) = evaluate(_problem(fast=True), [POINT], pool, lambda message: None).values()
    assert [job.fast for job in pool.jobs] == [True] and plan.fits and plan.fit_effort == "fast"
    pool = _TwoEffortPool(fast=0.98, full=0.98)
    (plan,) = evaluate(_problem(fast=False), [POINT], pool, lambda message: None).values()
    assert [job.fast for job in pool.jobs] == [False] and plan.fit_effort == "full"


def test_a_dropless_step_is_predicted_at_the_dropless_efficiency() -> None:
    """The calibration fits dropless MoE steps their own efficiency (TPU7x 0.35 against dense 0.63):
    a plan of such a model must use it, or it is predicted about 1.8x too fast."""
    from dataclasses import replace

    dense = replace(_problem(fast=False), cost_model=CostModel(mxu_efficiency=0.6, dropless_ratio=0.5))
    dropless = replace(dense, moe="dropless")
    (fast,) = evaluate(dense, [POINT], _TwoEffortPool(fast=0.5, full=0.5), lambda _: None).values()
    (slow,) = evaluate(dropless, [POINT], _TwoEffortPool(fast=0.5, full=0.5), lambda _: None).values()
    assert fast.prediction is not None and slow.prediction is not None
    assert slow.prediction.step_seconds > fast.prediction.step_seconds


def test_v4_is_planned_as_megacore() -> None:
    assert topology_config("v4:4x4x4") == {"chip_config_name": "megacore"} and topology_config("v5p:4x4x4") == {}
    v4 = parse_topology("v4-128")  # slice names count TensorCores: 64 chips, one megacore device each
    assert v4.chips == 64 and v4.devices == 64 and v4.megacore and "megacore" in v4.describe()
    assert v4.hbm_bytes_per_device == 32 * 2**30
    assert not parse_topology("v5p-128").megacore


def test_a_one_chip_machine_is_a_slice_and_its_own_host() -> None:
    # libtpu's default host is 2x2 chips; a v5litepod-1 / v6e-1 topology must name its own bounds.
    assert parse_topology("v5e-1").shape == (1, 1) and parse_topology("v6e-1").chips == 1
    assert topology_config("v5e:1x1") == {"chips_per_host_bounds": (1, 1, 1)}
    assert topology_config("v6e:2x1") == {"chips_per_host_bounds": (2, 1, 1)} and topology_config("v5e:2x2") == {}


class _OffloadingPool:
    """A full-effort compile the compiler accepted, its allocation 1.08 x the limit, `host` bytes offloaded."""

    workers = 1

    def __init__(self, host: float) -> None:
        self.host = host

    def compile(self, jobs, done=None):
        iteration = LoopIteration(1e9, 1e6, [], loops=2)
        step = CompiledStep(
            2e9, 2e6, 0.5 * HBM, 0.0, 0.58 * HBM, 0.0, [], 1.0, loop_iteration=iteration, host_temp_bytes=self.host
        )
        return {job: step for job in jobs}


@pytest.mark.parametrize("host, fits", [(2 * HBM, True), (0.0, False)])
def test_an_offloading_program_the_compiler_accepts_fits_though_its_allocation_is_over(host: float, fits: bool) -> None:
    """The TPU compiler refuses an offloading program over its HBM limit and its allocation
    overstates (70B on v6e-32: 33.8 of 31.25 GiB allocated, accepted; refused at 3 sequences a
    device), so its acceptance decides; a program that offloads nothing is still judged by its peak."""
    (plan,) = evaluate(_problem(fast=False), [POINT], _OffloadingPool(host), lambda message: None).values()
    assert plan.compiled.peak_bytes > HBM and plan.fits is fits and plan.over_limit_accepted is fits
    assert hbm_status(plan) == (
        "fits (the compiler accepted its allocation over the limit)" if fits else "DOES NOT FIT"
    )
    assert plan.margin_bytes == (0.0 if fits else HBM - plan.compiled.peak_bytes)


def test_a_recipes_xla_flags_reach_every_compile_and_an_unknown_one_is_refused_in_one_line() -> None:
    """--xla-flags as LIBTPU_INIT_ARGS spells them: typed compile options on every job; a word not
    of that form, or an option the compiler does not have, is the user's error (exit status 2)."""
    from dataclasses import replace

    from tpu_tuner.core.errors import UserInputError
    from tpu_tuner.planner.compiler.xla_flags import parse_xla_flags
    from tpu_tuner.planner.plans.plan_records import plan_record
    from tpu_tuner.planner.plans.plan_space import PlanSpace

    flags = parse_xla_flags("--xla_tpu_scoped_vmem_limit_kib=81920 --xla_enable_async_all_gather=true --xla_x=ENABLED")
    assert flags == (
        ("xla_tpu_scoped_vmem_limit_kib", 81920),
        ("xla_enable_async_all_gather", True),
        ("xla_x", "ENABLED"),
    )
    for bad in ("xla_a=1", "--xla_a", "--tpu_a=1", "--xla_a="):
        with pytest.raises(UserInputError, match="--xla-flags takes"):
            parse_xla_flags(bad)
    problem = replace(_problem(fast=False), step=StepSettings(16, 128, xla_flags=flags))
    assert problem.job(POINT, 2).step.xla_flags == flags
    assert plan_record(problem, PlanSpace((1,)))["xla_flags"][:2] == [
        "--xla_tpu_scoped_vmem_limit_kib=81920",
        "--xla_enable_async_all_gather=true",
    ]
    assert "xla_flags" not in plan_record(_problem(fast=False), PlanSpace((1,)))  # earlier plans' records unchanged
    unknown = CompiledStep(0, 0, 0, 0, 0, 0, [], 1.0, error="INVALID_ARGUMENT: No such compile option: 'xla_x'")
    with pytest.raises(UserInputError, match="no option 'xla_x'"):
        judged(problem, POINT, unknown)


class _PeelingPool:
    """Full effort peels the block loop (its count is wrong); the least effort does not, and at full
    depth is refused for memory, at a quarter or a half of it fits (`shallow_fits`). Outside the loop
    each block adds STACKED FLOPs (its optimizer update); the loop's body is ITERATION FLOPs."""

    workers = 1
    ENDS, STACKED, ITERATION = 5e9, 1e8, 1e9

    def __init__(self, depth: int, shallow_fits: bool = True) -> None:
        self.depth, self.shallow_fits, self.jobs = depth, shallow_fits, []

    def compile(self, jobs, done=None):
        out = {}
        for job in jobs:
            self.jobs.append((job.fast, job.model.blocks))
            iteration = LoopIteration(self.ITERATION, 1e6, [], loops=2)
            if not job.fast:  # peeled: a count no formula of the depth gives
                step = CompiledStep(
                    1e9, 1e6, 0.3 * HBM, 0, 0.3 * HBM, 0, [], 1.0, loop_peeled=True, loop_iteration=iteration
                )
            elif job.model.blocks == self.depth or not self.shallow_fits:
                step = CompiledStep(0, 0, 0, 0, 0, 0, [], 1.0, error=HBM_OOM)
            else:
                flops = self.ENDS + job.model.blocks * self.STACKED + self.ITERATION
                step = CompiledStep(flops, 2e6, 0.2 * HBM, 0, 0.2 * HBM, 0, [], 1.0, loop_iteration=iteration)
            out[job] = step
        return out


@pytest.mark.parametrize("shallow_fits", [True, False])
def test_a_peeled_program_whose_unpeeled_one_does_not_fit_is_counted_from_two_shallower_ones(
    shallow_fits: bool,
) -> None:
    """70B on two v5p-256 slices: the peeled program counted 2.24e15 FLOPs, its unpeeled
    neighbours 7.3e15, and it ranked first by 3 points of MFU (docs/planner.md)."""
    from dataclasses import replace

    problem = _problem(fast=False)
    problem = replace(problem, dims=replace(problem.dims, scanned=8, unscanned=0))
    pool = _PeelingPool(8, shallow_fits)
    said: list[str] = []
    (plan,) = evaluate(problem, [POINT], pool, said.append).values()
    assert pool.jobs[:2] == [(False, 8), (True, 8)] and sorted(pool.jobs[2:]) == [(True, 2), (True, 4)]
    if shallow_fits:
        whole = pool.ENDS + 8 * pool.STACKED + 8 * pool.ITERATION  # the program at 8 blocks, unpeeled
        assert plan.compiled.flops == pytest.approx(whole) and not plan.compiled.loop_peeled
        assert plan.fits and plan.compiled.peak_bytes == pytest.approx(0.6 * HBM)  # memory: the real program's
    else:
        assert plan.compiled.loop_peeled and "unpeeled program could not be compiled" in plan.why
        # and the run says why the shallower programs did not count it (the compiler's own words)
        assert any("did not count its work either" in m and HBM_OOM.splitlines()[0] in m for m in said), said
