"""A host-offloading point whose compile libtpu aborts (libtpu 0.0.42 on TPU7x, in its SparseCore
collective offload: docs/planner.md, "Memory first") is compiled once more with that offload off,
and its plan says so (a user's own setting of those flags overridden and named); other aborted points
are left, and a second compile that fails too says its own reason."""

from __future__ import annotations

from dataclasses import replace

from helpers.common import ScriptedPool
from helpers.tiny_planner import tiny_llama_problem

from tpu_tuner.model.meshes.layouts import Layout
from tpu_tuner.planner.compiler.compiled_step import CompiledStep
from tpu_tuner.planner.compiler.loop_costs import LoopIteration
from tpu_tuner.planner.plans.evaluate import SPARSECORE_NOTE, SPARSECORE_OFFLOAD_OFF, evaluate
from tpu_tuner.planner.plans.plan_space import PlanPoint

ABORTED = "the compiler process died from SIGABRT (libtpu aborted)"


def _aborts_unless_offload_off(job) -> CompiledStep:
    if not set(SPARSECORE_OFFLOAD_OFF) <= set(job.step.xla_flags):
        return CompiledStep(0, 0, 0, 0, 0, 0, error=ABORTED)
    iteration = LoopIteration(1e9, 1e6, [], loops=2)
    return CompiledStep(2e9, 2e6, 1e8, 0.0, 1e8, 0.0, [], 1.0, loop_iteration=iteration)


def test_an_aborted_offloading_point_is_compiled_again_with_the_sparsecore_offload_off() -> None:
    problem = tiny_llama_problem(hbm_gib=64.0)
    offloading, plain = PlanPoint(Layout(1, 8, 1), "minimal_offloaded"), PlanPoint(Layout(1, 8, 1), "full")
    pool = ScriptedPool(_aborts_unless_offload_off)
    said: list[str] = []
    plans = evaluate(problem, [offloading, plain], pool, said.append)
    assert plans[offloading].fits and SPARSECORE_NOTE in plans[offloading].why
    assert not plans[plain].fits and "SIGABRT" in plans[plain].why  # nothing offloaded: left as the compiler said
    assert sum(set(SPARSECORE_OFFLOAD_OFF) <= set(job.step.xla_flags) for job in pool.jobs) == 1
    assert any(line.startswith("libtpu aborted compiling 1 program that offload") for line in said)


def test_a_users_own_sparsecore_flags_are_overridden_and_named() -> None:
    problem = tiny_llama_problem(hbm_gib=64.0)
    given = ((SPARSECORE_OFFLOAD_OFF[2][0], True),)  # gpt-oss-120b's published flags turn them on
    problem = replace(problem, step=replace(problem.step, xla_flags=given))
    point = PlanPoint(Layout(1, 8, 1), "minimal_offloaded")
    pool = ScriptedPool(_aborts_unless_offload_off)
    said: list[str] = []
    plans = evaluate(problem, [point], pool, said.append)
    assert plans[point].fits and len(pool.jobs) == 2
    assert "the given --xla-flags turned it on" in plans[point].why
    assert any("overriding the 1 given --xla-flags that turn it on" in line for line in said)


def test_a_second_compile_that_fails_says_its_own_reason() -> None:
    problem = tiny_llama_problem(hbm_gib=64.0)
    point = PlanPoint(Layout(1, 8, 1), "minimal_offloaded")
    host = "RESOURCE_EXHAUSTED: Ran out of memory in memory space host. Used 154.22G of 128.00G host."

    def aborts_then_runs_out_of_host_memory(job) -> CompiledStep:
        second = set(SPARSECORE_OFFLOAD_OFF) <= set(job.step.xla_flags)
        return CompiledStep(0, 0, 0, 0, 0, 0, error=host if second else ABORTED)

    plans = evaluate(problem, [point], ScriptedPool(aborts_then_runs_out_of_host_memory), lambda line: None)
    assert not plans[point].fits and "memory space host" in plans[point].why and "SIGABRT" not in plans[point].why


def test_no_second_compile_where_the_users_flags_turn_the_offload_off_already() -> None:
    problem = tiny_llama_problem(hbm_gib=64.0)
    problem = replace(problem, step=replace(problem.step, xla_flags=SPARSECORE_OFFLOAD_OFF))
    point = PlanPoint(Layout(1, 8, 1), "minimal_offloaded")
    pool = ScriptedPool(lambda job: CompiledStep(0, 0, 0, 0, 0, 0, error=ABORTED))
    plans = evaluate(problem, [point], pool, lambda line: None)
    assert not plans[point].fits and "SIGABRT" in plans[point].why and len(pool.jobs) == 1
