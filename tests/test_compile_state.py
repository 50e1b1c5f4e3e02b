"""A reused trial worker compiles every trial afresh: dynamo's per-function recompile limit must
not turn a later "aot_eager" trial into a silent eager one, and a trial whose compile produced no
graph is a failure, not a measurement."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.runner.jobs import WorkerState, run_measure
from tpu_tuner.runner.requests import MeasureRequest

FIXTURES = Path(__file__).parent / "fixtures"


def _measure(candidate: Candidate, fast_settings) -> MeasureRequest:
    return MeasureRequest(
        candidate=candidate.to_dict(),
        settings=fast_settings,
        model_flops_per_step=1e6,
        peak_flops_per_s={"float32": 1e12, "bfloat16": 1e12},
    )


@pytest.mark.slow  # more compiled trials than dynamo's limit, each a compile (39 s at the default limit of 8)
def test_more_compiled_trials_than_dynamos_recompile_limit_all_compile(fast_settings) -> None:
    import torch._dynamo

    state = WorkerState(str(FIXTURES / "tiny_mlp_benchmark.py"), "cpu")
    # A limit of 2, not the default 8: the same overrun (two trials past it) in 4 compiles, not 10.
    # dynamo's own `config.patch`, not monkeypatch: undoing a setattr on the config module deletes
    # the option, and the next compile in this worker fails "recompile_limit does not exist".
    limit = 2
    with torch._dynamo.config.patch(recompile_limit=limit):
        # Each trial builds a new model: the same forward code object, a new cache entry each time.
        for _ in range(limit + 2):
            measured = run_measure(state, _measure(Candidate(execution="aot_eager"), fast_settings))
            assert measured.compiles.get("torch_compile_graphs", 0) >= 1


def test_a_compiled_setting_that_compiles_nothing_is_not_a_measurement(fast_settings) -> None:
    state = WorkerState(str(FIXTURES / "never_compiles.py"), "cpu")
    with pytest.raises(RuntimeError, match="compiled no graph, so the step ran eager"):
        run_measure(state, _measure(Candidate(execution="aot_eager"), fast_settings))
    assert run_measure(state, _measure(Candidate(), fast_settings)).step_median > 0


def test_a_window_s_compiled_setting_that_compiles_nothing_fails_the_window() -> None:
    """Issue 68: the window counts each setting's compiles from its build, not after every
    setting's warm-up, so a compiled setting that ran eager fails the window as its trial would."""
    from tpu_tuner.runner.jobs import run_compare
    from tpu_tuner.runner.requests import CompareRequest

    state = WorkerState(str(FIXTURES / "never_compiles.py"), "cpu")
    request = CompareRequest(
        candidates=[Candidate().to_dict(), Candidate(execution="aot_eager").to_dict()], rounds=2, last=True
    )
    with pytest.raises(RuntimeError, match="compiled no graph in the window, so the step ran eager"):
        run_compare(state, request)
    eager = CompareRequest(candidates=[Candidate().to_dict(), Candidate().to_dict()], rounds=2, last=True)
    compared = run_compare(state, eager)
    assert [len(s) for s in compared.samples] == [2, 2] and compared.steps_per_sample == [1, 1]
