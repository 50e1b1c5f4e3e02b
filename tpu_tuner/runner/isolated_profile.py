"""A profile measured in a worker process: the model file never runs in the caller's process.

`tpu-tune profile` uses this; `tpu_tuner.profile` runs in-process for library users who already
hold a model. A crash at import or in the step is reported as a one-line WorkloadError rather
than taking the caller down (docs/run-safety.md). The worker's output goes to a `WorkerLog`, which
the caller moves into the profile's folder once it is written.
"""

from __future__ import annotations

from pathlib import Path

from tpu_tuner.core.errors import UserInputError, WorkloadError
from tpu_tuner.core.failures import FailureKind
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.metrics.flops import AttentionConvention
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.profiling.settings import ProfilerSettings
from tpu_tuner.runner.worker_log import WorkerLog


def profile_in_worker(
    model_file: str | Path,
    candidate: Candidate | None = None,
    device: str | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    attention_convention: AttentionConvention = "full",
    settings: ProfilerSettings | None = None,
    log: WorkerLog | None = None,
) -> Profile:
    """Profile `model_file` in an isolated worker on `device` (auto-detected when None); its
    output goes to `log` (None: a temporary log, dropped unless a failure names it)."""
    from tpu_tuner.runner.load import load_summary
    from tpu_tuner.runner.requests import ProfileRequest
    from tpu_tuner.runner.trial_runner import TrialRunner

    candidate = candidate or Candidate()
    settings = settings or ProfilerSettings.load()
    # The profile's own time budget bounds it; the worker's timeout only catches a hang.
    timeout_s = max(600.0, 2 * settings.max_profile_seconds)
    with TrialRunner(str(model_file), device, timeout_s, log=log) as runner:
        load_summary(runner, Path(model_file), batch_size, seq_len, sample_lengths=False)
        outcome = runner.run(
            ProfileRequest(
                candidate=candidate.to_dict(),
                batch_size=batch_size,
                seq_len=seq_len,
                settings=settings,
                attention_convention=attention_convention,
            )
        )
    if not outcome.ok:
        assert outcome.failure is not None
        if outcome.failure.kind == FailureKind.REFUSED:
            raise UserInputError(outcome.failure.message)
        raise WorkloadError(f"profiling failed ({outcome.failure.kind}: {outcome.failure.message})", model_file)
    return outcome.value


__all__ = ["profile_in_worker"]
