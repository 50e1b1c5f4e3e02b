"""Issue 57 item 4, the planner on the chip: the flash kernel's block size is a planner option
(`--flash-block N`) and a search axis (`--flash-blocks 128,256,512`) that reach every compile job,
a block that does not divide the sequence is refused in one line, and the prediction counts
attention's own matmuls against the MXU, so 64-wide heads predict a slower step than 128-wide
ones of the same FLOPs (a v5e chip ran them 42% slower: docs/planner.md, "On a real chip")."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.common import ScriptedPool
from helpers.tiny_planner import planner_problem

from tpu_tuner.model.meshes.layouts import Layout, ModelShape
from tpu_tuner.model.workloads.structure import Dims
from tpu_tuner.planner.compiler.compile_request import StepSettings
from tpu_tuner.planner.compiler.compiled_step import CompiledStep
from tpu_tuner.planner.compiler.loop_costs import LoopIteration
from tpu_tuner.planner.plans.plan import PlanProblem
from tpu_tuner.planner.plans.plan_options import PlanOptions, PlanSearch, PlanStep, PlanStore, PlanTarget
from tpu_tuner.planner.plans.plan_space import PlanPoint, flash_block_refusal, invalid_reason
from tpu_tuner.planner.prediction.predict import CostModel, alignment, predict
from tpu_tuner.planner.topology import parse_topology

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SEQ = 512


def _small_step(job) -> CompiledStep:
    """Every job answered with the same small step."""
    iteration = LoopIteration(1e9, 1e6, [], loops=2)
    return CompiledStep(2e9, 2e6, 1e9, 0.0, 1e9, 0.0, [], 1.0, loop_iteration=iteration)


def _problem(step: StepSettings) -> PlanProblem:
    return planner_problem(
        Dims(ModelShape(256, 4, 4, 512, 1024, 2), 64, scanned=2),  # the scripted pool compiles nothing
        topology="v5e-4",  # four devices: few points to search
        devices=4,
        step=step,
        source="decoder:vocab=1024,d_model=256,layers=2,heads=4,mlp=512",
    )


def _search(tmp_path: Path, problem: PlanProblem, pool: ScriptedPool, **search_options):
    from tpu_tuner.planner.plans.plan_search import search

    options = PlanOptions(
        PlanTarget("v5e-4"),
        search=PlanSearch(sampler="grid", remats=("full",), accumulations=(1,), **search_options),
        store=PlanStore(study="flash-blocks"),  # in memory: no storage to open
    )
    return search(problem, options, pool, lambda message: None, time.perf_counter())


def test_the_searched_flash_blocks_reach_the_compile_jobs(tmp_path: Path) -> None:
    pool = ScriptedPool(_small_step, workers=2)
    result = _search(tmp_path, _problem(StepSettings(16, SEQ)), pool, contexts=(1, 2), flash_blocks=(128, 256, 512))
    assert {job.step.flash_block for job in pool.jobs} == {128, 256, 512}
    assert all(job.step.flash_block == job.point.flash_block for job in pool.jobs)
    # Context 2 leaves a device 256 queries: 512 blocks do not divide them, so none was compiled.
    assert not [job for job in pool.jobs if job.point.layout.context == 2 and job.point.flash_block == 512]
    assert {p.point.flash_block for p in result.plans} == {128, 256, 512}
    assert "flash attention in blocks of 128, 256, 512" in result.method
    assert "flash blocks 512" in result.plans[0].point.name() or result.plans[0].point.flash_block != 512


def test_one_flash_block_reaches_every_job_of_a_search_and_of_an_enumeration(tmp_path: Path) -> None:
    options = PlanOptions(PlanTarget("v5e-4"), step=PlanStep(flash_block=256))
    step = StepSettings.of(options, 16, SEQ)
    assert step.flash_block == 256 and step.record()["flash_block"] == 256
    problem = _problem(step)
    assert problem.job(PlanPoint(Layout(1, 8, 1)), 1).step.flash_block == 256  # an enumerated layout
    pool = ScriptedPool(_small_step, workers=2)
    _search(tmp_path, problem, pool, contexts=(1,))
    assert pool.jobs and {job.step.flash_block for job in pool.jobs} == {256}
    # Unset, the kernel's default: the step records nothing new (earlier plans' studies keep their names).
    assert "flash_block" not in StepSettings.of(PlanOptions(PlanTarget("v5e-4")), 16, SEQ).record()


def test_a_block_that_does_not_divide_the_sequence_is_refused() -> None:
    assert flash_block_refusal(512, 2048) is None
    assert flash_block_refusal(384, 2048) == "flash blocks of 384 do not divide the sequence 2048"
    assert "over context 8" in (flash_block_refusal(512, 2048, 8) or "")
    shape = ModelShape(256, 4, 4, 512, 1000, 2)
    point = PlanPoint(Layout(1, 4, 1, 2), flash_block=512)
    assert "do not divide the sequence 512" in (invalid_reason(point, shape, 8, 512) or "")
    # The step's block, for a point without its own (an enumerated layout).
    assert invalid_reason(replace(point, flash_block=None), shape, 8, 512, flash_block=512)
    assert invalid_reason(replace(point, flash_block=None), shape, 8, 512) is None


@pytest.mark.parametrize(
    "args, message",
    [
        (["--flash-block", "100"], "--flash-block: flash blocks of 100 do not divide the sequence"),
        (["--flash-block", "0"], "--flash-block must be at least 1, not 0"),
        (["--flash-blocks", "128,256"], "--flash-blocks set(s) the search's space or study: give --budget N"),
        (["--budget", "2", "--flash-blocks", "128,100"], "--flash-blocks: flash blocks of 100 do not divide"),
        (["--budget", "2", "--flash-blocks", "128", "--flash-block", "128"], "give one of them"),
    ],
)
def test_bad_flash_blocks_are_refused_in_one_line(tmp_path: Path, capsys, args, message) -> None:
    from tpu_tuner.cli import main

    out = tmp_path / "out"
    status = main(
        ["plan", str(EXAMPLES / "llama.py"), "--topology", "v5e-4", "--seq-len", "1024", "--out", str(out), *args]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert message in err and len(err.strip().splitlines()) == 1, err


def _step_seconds(heads: int, head_dim: int, generation: str = "v5e") -> tuple[float, float]:
    """(alignment, predicted step) of the chip check's 335M decoder, heads x head_dim = 1024: same FLOPs."""
    shape = ModelShape(1024, heads, heads, 4096, 32000, 16)
    topology = parse_topology(f"{generation}-1" if generation == "v5e" else f"{generation}-4")
    compiled = CompiledStep(4.08e13, 1e11, 6e9, 0.0, 6e9, 0.0, [], 1.0)
    pr = predict(
        compiled, topology, Layout(1, topology.devices, 1), shape, head_dim, 3.6e13, 8 * 2048, CostModel(), 0, 2048
    )
    return pr.alignment, pr.step_seconds


def test_64_wide_heads_predict_a_slower_step_than_128_wide_at_the_same_flops() -> None:
    wide, narrow = _step_seconds(8, 128), _step_seconds(16, 64)
    assert wide[0] == 1.0 and narrow[0] == pytest.approx(0.909, abs=1e-3)
    assert narrow[1] > wide[1] * 1.05  # slower, by the attention matmuls' idle lanes (the chip: 42%)
    # Without a sequence the term is off: the projections alone are aligned alike.
    shape = ModelShape(1024, 16, 16, 4096, 32000, 16)
    assert alignment(shape, Layout(1, 1, 1), 64, 128) == 1.0
    # v6e's 256-wide MXU leaves 128-wide heads' attention matmuls half idle too.
    assert _step_seconds(8, 128, "v6e")[0] < 1.0


@pytest.mark.slow  # one real compile for the TPU: .ci/run's full pass
def test_a_tiny_decoder_compiles_in_512_blocks_on_v5e_1() -> None:
    from tpu_tuner.planner.plans.plan import plan
    from tpu_tuner.planner.plans.plan_options import PlanCompile, PlanEnumeration

    result = plan(
        "decoder:vocab=1024,d_model=256,layers=2,heads=2,mlp=512,max_seq_len=1024",
        PlanOptions(
            PlanTarget("v5e-1"),
            step=PlanStep(global_batch=2, seq_len=1024, flash_block=512),
            enumeration=PlanEnumeration(layouts=[Layout(1, 1, 1)]),
            compile=PlanCompile(workers=1),
        ),
    )
    (compiled,) = result.plans
    assert compiled.prediction is not None, compiled.why
    assert "flash attention in blocks of 512" in result.method
