"""The load job seen from the parent: a model file imported and validated in a worker, described
by a `WorkloadSummary`, so that a file that crashes at import never takes tpu-tune down
(docs/run-safety.md). A worker that dies while importing becomes a `WorkloadError` ("the process
died from SIGSEGV while importing")."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tpu_tuner.core.errors import UserInputError, WorkloadError
from tpu_tuner.core.failures import FailureKind, describe_end
from tpu_tuner.model.workloads.summary import WorkloadSummary
from tpu_tuner.runner.requests import LoadRequest

if TYPE_CHECKING:
    from tpu_tuner.runner.ranked_runner import Runner
    from tpu_tuner.runner.trial_runner import JobResult

# Importing a file is quick; a minute covers `import torch` plus a model module on a busy machine.
LOAD_TIMEOUT_S = 120.0


def load_summary(
    runner: Runner,
    model_file: str | Path,
    batch_size: int | None = None,
    seq_len: int | None = None,
    sample_lengths: bool = True,
) -> WorkloadSummary:
    """Import and validate `model_file` in `runner`'s worker; raise `WorkloadError` for a bad
    file, including one whose import kills the process."""
    result = runner.run(
        LoadRequest(batch_size=batch_size, seq_len=seq_len, sample_lengths=sample_lengths),
        timeout_s=max(LOAD_TIMEOUT_S, runner.timeout_s),
    )
    if result.ok:
        # The device the workers run on: the runner's later workers take its variables for the
        # run folder (TrialRunner.run_environment).
        runner.device_kind = result.value.device_kind
        return result.value
    raise load_failure(result, model_file)


def load_failure(result: JobResult, model_file: str | Path) -> UserInputError:
    """The error a failed load job means, naming the file."""
    failure = result.failure
    assert failure is not None
    if failure.kind == FailureKind.REFUSED:  # the loader's own WorkloadError/UserInputError, already naming the file
        return WorkloadError(failure.message)
    # A death's own words are in the workers' log, not on the terminal: `note` quotes it.
    if result.exit_code is not None:
        return WorkloadError(f"the process {describe_end(result.exit_code)} while importing{result.note}", model_file)
    if failure.kind == FailureKind.TIMEOUT:
        return WorkloadError(f"importing took longer than {LOAD_TIMEOUT_S:.0f} s ({failure.message})", model_file)
    return WorkloadError(f"error while importing: {failure.message}", model_file)


__all__ = ["LOAD_TIMEOUT_S", "load_failure", "load_summary"]
