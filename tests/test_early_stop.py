"""Hopeless trials stop in the worker: after a few steps beyond the threshold, or while a compile
runs past what it could pay back; a trial near the best is measured to the end; a disturbed
timing is taken again."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpu_tuner.execution.early_stop import CompileCutOff, StopRule, compile_deadline
from tpu_tuner.execution.measurement import EarlyStop, Measurement
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.runner.jobs import WorkerState, run_measure
from tpu_tuner.runner.requests import MeasureRequest

FIXTURES = Path(__file__).parent / "fixtures"


def _request(candidate: Candidate, settings, **stop) -> MeasureRequest:
    return MeasureRequest(
        candidate=candidate.to_dict(),
        settings=settings,
        model_flops_per_step=1e6,
        peak_flops_per_s={"float32": 1e12, "bfloat16": 1e12},
        **stop,
    )


def test_the_rule_judges_only_after_enough_steps_and_counts_the_compile() -> None:
    rule = StopRule(threshold_s=0.010, planned_steps=100)
    assert not rule.hopeless([0.05, 0.05], 0.0)  # two steps: too few to judge
    assert rule.hopeless([0.05, 0.05, 0.012], 0.0)
    assert not rule.hopeless([0.05, 0.05, 0.009], 0.0)  # the fastest step is within reach
    assert rule.hopeless([0.009, 0.009, 0.009], 0.5)  # + 0.5 s of compile over 100 steps = 14 ms
    assert rule.compile_limit_s() == pytest.approx(1.0)
    assert "stopped after 3 steps" in rule.explain([0.05, 0.05, 0.012], 0.0)


def test_a_deadline_interrupts_the_main_thread() -> None:
    import time

    with pytest.raises(CompileCutOff):
        with compile_deadline(0.05):
            time.sleep(2)
    with compile_deadline(None):
        time.sleep(0.01)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped raise
def test_a_cut_off_dropped_inside_a_gc_callback_is_raised_again() -> None:
    """Python drops an exception a signal handler raises while a gc callback runs (jax registers
    one): the deadline raises again until the cut-off is seen."""
    import gc
    import time

    def busy(seconds: float) -> None:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            pass

    def slow_callback(phase: str, info: dict) -> None:
        if phase == "start":
            busy(0.03)

    gc.callbacks.append(slow_callback)
    try:
        with pytest.raises(CompileCutOff):
            with compile_deadline(0.01):
                gc.collect()  # the first alarm (at 10 ms) lands in the callback and is dropped
                # Then work outside collections (busy) between them: a try that lands there is
                # seen. A collection of this test process's heap takes tens of ms on its own (a
                # tick then runs at the "stop" callback, dropped too), hence 60 ms of work between.
                end = time.perf_counter() + 5
                while time.perf_counter() < end:
                    busy(0.06)
                    gc.collect()
    finally:
        gc.callbacks.remove(slow_callback)


def test_a_slow_trial_stops_after_its_first_steps(fast_settings) -> None:
    state = WorkerState(str(FIXTURES / "synthetic_speed.py"), "cpu")
    stopped = run_measure(state, _request(Candidate(), fast_settings, stop_above_s=0.001, planned_steps=100))
    assert isinstance(stopped, EarlyStop) and stopped.reason == "steps"
    assert 3 <= len(stopped.steps) < 10 and min(stopped.steps) > 0.010  # the fixture sleeps 12 ms a step
    assert stopped.accuracy_errors  # the first call was compared before it stopped
    near = run_measure(state, _request(Candidate(), fast_settings, stop_above_s=1.0, planned_steps=100))
    assert isinstance(near, Measurement) and len(near.samples) >= fast_settings.timing_min_steps


def test_a_compile_that_cannot_pay_back_is_cut_off(fast_settings) -> None:
    state = WorkerState(str(FIXTURES / "tiny_mlp_benchmark.py"), "cpu")
    # 1 ms x 10 planned steps: a compile of more than 10 ms can never pay back.
    stopped = run_measure(
        state, _request(Candidate(execution="aot_eager"), fast_settings, stop_above_s=0.001, planned_steps=10)
    )
    assert isinstance(stopped, EarlyStop) and stopped.reason == "compile" and stopped.steps == []
    assert stopped.compile_seconds >= 0.010 and "the compile ran past" in stopped.message
    # The worker goes on: the next trial compiles and measures as usual.
    after = run_measure(state, _request(Candidate(execution="aot_eager"), fast_settings))
    assert isinstance(after, Measurement) and after.compiles.get("torch_compile_graphs", 0) >= 1


def test_a_disturbed_timing_is_taken_again(fast_settings) -> None:
    state = WorkerState(str(FIXTURES / "jittery.py"), "cpu")
    measured = run_measure(state, _request(Candidate(), fast_settings))
    assert isinstance(measured, Measurement)
    (note,) = [w for w in measured.warnings if w.startswith("timed ")]
    assert note.startswith("timed 3 times: the step times spread beyond a robust CV of 25%")
