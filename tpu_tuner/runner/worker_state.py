"""A trial worker's state across its jobs: the loaded workload and backend, the fp32 reference's
and the baseline's outputs (computed once, and stored in the run folder for other workers), the
memory estimates, the seeded weights, and the comparison window's built steps."""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

from tpu_tuner.devices import Backend, get_backend
from tpu_tuner.execution.accuracy import (
    REFERENCE,
    BaselineOutputs,
    Outputs,
    baseline_outputs,
    capture,
    relative_error,
    single_device,
)
from tpu_tuner.execution.memory_estimate import MemoryEstimate
from tpu_tuner.execution.reference_store import key_of, stored
from tpu_tuner.execution.step import prepare_step, run_user_step
from tpu_tuner.execution.weight_cache import WeightCache
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.workloads.loader import load_workload
from tpu_tuner.model.workloads.workload import Workload


class WorkerState:
    """Per-process caches: the loaded workload, the backend, the reference's and the baseline's outputs."""

    def __init__(self, workload_path: str, device: str | None, rank: int = 0, ranks: int = 1) -> None:
        self.workload: Workload = load_workload(workload_path)
        self.backend: Backend = get_backend(device)
        # A rank of a sharded trial (runner/rank_job.py): its steps sync with the other ranks;
        # rank 0 holds the reference and returns the measurement.
        self.rank = rank
        self.backend.ranks = ranks
        self._references: dict[tuple[Any, Any, Any], Outputs] = {}  # by candidate, batch size, length
        self.references_dir: str | None = None  # the run's stored outputs (a measure request names it)
        self.reference_candidate = REFERENCE  # the run's fp32 reference (a measure request names it)
        self._baselines: dict[tuple[Any, Any, Any], BaselineOutputs] = {}
        # The peak table trials divide by, once a trial beat the profile's (re-measured or
        # raised): later trials of this worker start from it instead of re-probing again.
        self.peak_flops_per_s: dict[str, float] | None = None
        self.peak_reprobed = False  # a worker re-probes at most once; later beats raise the peak
        # The interleaved comparison runs as several jobs (a few rounds each, so the parent can
        # show progress); its built and warmed-up steps stay here between them.
        self.compare_key: str | None = None
        self.compare_steps: list[Any] = []  # each candidate's `StepClock`, its step built and warm
        # Memory estimates by the settings that change them (execution/memory_estimate.py):
        # trials differing only in threads, matmul precision or compiler flags share one.
        self.memory_estimates: dict[Hashable, MemoryEstimate] = {}
        # The seeded model's weights after its first build: later builds skip the init (weight_cache.py).
        self.weights = WeightCache()

    def reference(self, batch_size: int | None, seq_len: int | None, candidate: Candidate | None = None) -> Outputs:
        """`candidate`'s outputs (the fp32 reference's by default) on one process, the whole batch;
        cached here, and in the run's `references_dir` for every other worker (reference_store.py)."""
        candidate = self.reference_candidate if candidate is None else candidate
        key = (candidate, batch_size, seq_len)
        if key not in self._references:
            ranks, self.backend.ranks = self.backend.ranks, 1  # one process, the whole batch: no collective
            try:
                self._references[key] = stored(
                    self.references_dir,
                    key_of(candidate.to_dict(), batch_size, seq_len),
                    lambda: self._reference(batch_size, seq_len, candidate),
                )
            finally:
                self.backend.ranks = ranks
        return self._references[key]

    def baseline(self, baseline: Candidate, batch_size: int | None, seq_len: int | None) -> BaselineOutputs:
        """The baseline's outputs and errors against the fp32 reference, computed once (the same
        cache as the reference's: on CPU the baseline is the reference, computed once for both)."""
        key = (baseline, batch_size, seq_len)
        if key not in self._baselines:
            self._baselines[key] = baseline_outputs(
                lambda c: self.reference(batch_size, seq_len, c), baseline, self.reference(batch_size, seq_len)
            )
        return self._baselines[key]

    def computes_baseline_as(
        self, candidate: Candidate, baseline: Candidate | None, batch_size: int | None, seq_len: int | None
    ) -> bool:
        """Whether `candidate`'s trial can give the baseline's outputs itself: it is the baseline, on
        one process, and no worker has computed them yet. Its first call then compiles the step
        once, not twice (the 335M decoder's baseline compiled for 82 s, twice, on a v5e)."""
        if baseline is None or candidate != baseline or single_device(baseline) != baseline or self.rank != 0:
            return False
        if (baseline, batch_size, seq_len) in self._baselines or (baseline, batch_size, seq_len) in self._references:
            return False  # at hand already (on a CPU the baseline is the fp32 reference, computed first)
        stored_at = self.references_dir and Path(self.references_dir) / key_of(baseline.to_dict(), batch_size, seq_len)
        return not (stored_at and stored_at.exists())

    def adopt_baseline(
        self, baseline: Candidate, batch_size: int | None, seq_len: int | None, outputs: Outputs
    ) -> BaselineOutputs:
        """The baseline's outputs taken from its own trial's first call (`computes_baseline_as`),
        kept and stored as `baseline` computes them."""
        key = (baseline, batch_size, seq_len)
        self._references[key] = stored(
            self.references_dir, key_of(baseline.to_dict(), batch_size, seq_len), lambda: outputs
        )
        reference = self.reference(batch_size, seq_len)
        self._baselines[key] = BaselineOutputs(self._references[key], relative_error(self._references[key], reference))
        return self._baselines[key]

    def _reference(self, batch_size: int | None, seq_len: int | None, candidate: Candidate) -> Outputs:
        what = "the reference step" if candidate == self.reference_candidate else "the baseline step"
        with candidate.process(self.backend):
            step = prepare_step(self.workload, self.backend, candidate, batch_size, seq_len, weights=self.weights)
            return run_user_step(lambda: capture(step, self.workload, self.backend, candidate), self.workload, what)
