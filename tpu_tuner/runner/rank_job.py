"""One job of a sharded trial, run as one of its ranks: ``python -m tpu_tuner.runner.rank_job JOB``.

`RankedTrialRunner` writes the job (its typed request, the model file and device) to JOB, a
pickle in the trial's own folder, and starts N ranks of this module through
`runner.launch.run_ranks`. Each rank joins the process group, runs the same job function a
single worker runs (`runner/jobs.py`), with its backend syncing steps with the other ranks, and
rank 0 writes the result beside JOB. A rank whose job raises writes its failure (kind and first
line, as a single worker reports one) and exits non-zero, which stops the other ranks. The ranks
of a multi-host trial (`runner/host_jobs.py`) run the same way on every host, rank 0 on the
driver's; each rank dies with the launcher that started it (`launch.die_with_launcher`).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpu_tuner.runner.jobs import WorkerState

RESULT = "result.pkl"


def failure_path(job_file: Path, rank: int) -> Path:
    """Where rank `rank` writes why its job failed (JSON: kind, message)."""
    return job_file.parent / f"failure-{rank}.json"


def read_accounts(job_file: Path, ranks: Iterable[int]) -> dict[int, dict[str, str]]:
    """The accounts that the ranks of `ranks` wrote of their job's failure (`failure_path`), by
    rank: those that wrote one."""
    accounts = {}
    for rank in ranks:
        with suppress(OSError, ValueError):
            accounts[rank] = json.loads(failure_path(job_file, rank).read_text())
    return accounts


def main(argv: list[str]) -> None:
    from tpu_tuner.runner.launch import die_with_launcher

    die_with_launcher()  # before anything slow: a launcher killed meanwhile leaves no rank behind
    job_file = Path(argv[0])
    spec = pickle.loads(job_file.read_bytes())
    rank, ranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        if spec.get("memory_limit_bytes"):
            import resource

            limit = int(spec["memory_limit_bytes"])
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        from tpu_tuner.runner.jobs import WorkerState, run_job
        from tpu_tuner.runner.launch import init_rank

        state = WorkerState(spec["workload_path"], spec["device"], rank=rank, ranks=ranks)
        estimate_before_joining(state, spec["request"])
        init_rank(state.backend.process_group_backend)
        value = run_job(state, spec["request"])
        if rank == 0:
            (job_file.parent / RESULT).write_bytes(pickle.dumps(value))
    except BaseException as exc:
        from tpu_tuner.runner.worker_process import failure_of

        kind, message = failure_of(exc)
        failure_path(job_file, rank).write_text(json.dumps({"kind": kind, "message": message}))
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    from tpu_tuner.runner.launch import finish_rank

    finish_rank()


def estimate_before_joining(state: WorkerState, request: object) -> None:
    """A measurement's per-rank memory estimate, made on torch's fake process group before this
    rank joins its real one (where fake tensors cannot run): `run_measure` finds it in the cache."""
    from tpu_tuner.execution.memory_estimate import memory_key
    from tpu_tuner.execution.rank_memory import estimate_rank_memory
    from tpu_tuner.knobs.candidate import Candidate
    from tpu_tuner.runner.requests import MeasureRequest

    if not isinstance(request, MeasureRequest):
        return
    candidate, batch_size, seq_len = Candidate.from_dict(request.candidate), request.batch_size, request.seq_len
    state.memory_estimates[memory_key(candidate, batch_size, seq_len, state.backend.kind)] = estimate_rank_memory(
        state.workload, state.backend, candidate, batch_size, seq_len, state.rank, state.backend.ranks
    )


if __name__ == "__main__":
    main(sys.argv[1:])
