"""Issue 68, item 5: the fp32 reference's and the baseline's outputs computed once a run and read
by every worker. On a TPU v5e chip they were 43.9 s of a Llama-class trial's 94 s, paid again by
every worker a new start-up environment started. The first worker writes them to the run folder;
another worker (a fresh process state) reads them and computes neither."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tpu_tuner.execution.accuracy import Outputs
from tpu_tuner.execution.reference_store import key_of, stored
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.runner.jobs import WorkerState, run_measure
from tpu_tuner.runner.requests import MeasureRequest

FIXTURES = Path(__file__).parent / "fixtures"


def _request(candidate: Candidate, settings, references: Path, baseline: Candidate | None = None) -> MeasureRequest:
    return MeasureRequest(
        candidate=candidate.to_dict(),
        settings=settings,
        model_flops_per_step=1e6,
        peak_flops_per_s={"float32": 1e12},
        baseline=(baseline or Candidate.baseline("cpu")).to_dict(),
        references_dir=str(references),
    )


def test_a_second_worker_reads_the_first_workers_reference_and_baseline(fast_settings, tmp_path: Path) -> None:
    first = WorkerState(str(FIXTURES / "tiny_mlp_benchmark.py"), "cpu")
    measured = run_measure(first, _request(Candidate(matmul_precision="medium"), fast_settings, tmp_path))
    written = sorted(p.name for p in tmp_path.iterdir())
    assert len(written) == 1  # on CPU the baseline is the fp32 reference: one file for both

    second = WorkerState(str(FIXTURES / "tiny_mlp_benchmark.py"), "cpu")

    def never(*args: object) -> Outputs:
        raise AssertionError("the second worker computed an output the first had stored")

    second._reference = never  # type: ignore[method-assign]
    again = run_measure(second, _request(Candidate(matmul_precision="medium"), fast_settings, tmp_path))
    assert again.accuracy_errors == pytest.approx(measured.accuracy_errors)
    assert sorted(p.name for p in tmp_path.iterdir()) == written


def test_a_damaged_file_is_computed_again_and_replaced(tmp_path: Path) -> None:
    key = key_of(Candidate().to_dict(), 4, None)
    (tmp_path / key).write_bytes(b"not a tensor file")
    outputs = stored(str(tmp_path), key, lambda: Outputs({"loss": torch.ones(1)}))
    assert torch.equal(outputs.parts["loss"], torch.ones(1))
    read = stored(str(tmp_path), key, lambda: Outputs({"loss": torch.zeros(1)}))
    assert torch.equal(read.parts["loss"], torch.ones(1))  # the replaced file, not computed again
    assert key_of(Candidate().to_dict(), 4, None) != key_of(Candidate().to_dict(), 8, None)


def test_the_baselines_own_trial_gives_the_baselines_outputs_without_a_second_build(
    fast_settings, tmp_path: Path
) -> None:
    """The run's first trial is the baseline's: its first call's outputs are the baseline's, so its
    step is built and compiled once, not once for the outputs and again for the trial (82 s each
    for the 335M decoder's baseline on a v5e). Stored, they serve every later worker."""
    baseline = Candidate(matmul_precision="medium")  # not the fp32 reference, as on a TPU
    computed: list[Candidate] = []
    state = WorkerState(str(FIXTURES / "tiny_mlp_benchmark.py"), "cpu")
    compute = state._reference

    def spy(batch_size, seq_len, candidate):
        computed.append(candidate)
        return compute(batch_size, seq_len, candidate)

    state._reference = spy  # type: ignore[method-assign]
    measured = run_measure(state, _request(baseline, fast_settings, tmp_path, baseline))
    assert computed == [state.reference_candidate]  # the fp32 reference only
    assert (tmp_path / key_of(baseline.to_dict(), None, None)).exists()
    assert measured.error_vs_baseline == 0.0 and measured.baseline_errors == measured.accuracy_errors

    # A later worker judges another setting against the stored baseline, computing neither.
    second = WorkerState(str(FIXTURES / "tiny_mlp_benchmark.py"), "cpu")

    def never(*args: object) -> Outputs:
        raise AssertionError("the second worker computed an output the first had stored")

    second._reference = never  # type: ignore[method-assign]
    other = Candidate(matmul_precision="medium", intra_op_threads="1")
    judged = run_measure(second, _request(other, fast_settings, tmp_path, baseline))
    assert judged.baseline_error == pytest.approx(measured.accuracy_error)


def test_a_baseline_that_is_the_fp32_reference_is_not_taken_again(fast_settings) -> None:
    """On a CPU the baseline is the fp32 reference, computed before the trial: nothing to take."""
    state = WorkerState(str(FIXTURES / "tiny_mlp_benchmark.py"), "cpu")
    baseline = Candidate.baseline("cpu")
    assert state.computes_baseline_as(baseline, baseline, None, None)  # nothing computed yet
    state.reference(None, None)
    assert state.reference_candidate == baseline
    assert not state.computes_baseline_as(baseline, baseline, None, None)
    assert not state.computes_baseline_as(Candidate(matmul_precision="medium"), baseline, None, None)
