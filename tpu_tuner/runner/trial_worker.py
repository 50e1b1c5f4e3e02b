"""The trial worker: ``python -m tpu_tuner.runner.trial_worker READ_FD WRITE_FD WORKLOAD DEVICE MEMLIMIT``.

It serves typed requests (`runner/requests.py`) with the job functions of `runner/jobs.py`
(`worker_process.serve`): the reply is the job's value, or its `FailureKind` (REFUSED for a
refusable request's TpuTuneError), message and traceback. A None message ends it.

It loads the model file as soon as it starts and then says READY, so the parent can tell the
worker's start-up (interpreter, imports, the file) from its first job. A file that fails to load
is still the first job's failure, as if the job had loaded it; the next job tries again.
"""

from __future__ import annotations

import sys
from typing import Any


def main(argv: list[str]) -> None:
    read_fd, write_fd, workload_path, device, memory_limit = argv
    if int(memory_limit):
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (int(memory_limit), int(memory_limit)))
    from tpu_tuner.core.errors import TpuTuneError
    from tpu_tuner.core.failures import FailureKind
    from tpu_tuner.runner.jobs import WorkerState, run_job
    from tpu_tuner.runner.worker_process import failure_of, serve

    state: WorkerState | None = None
    failed: BaseException | None = None  # why the start-up could not load the file

    def load() -> None:
        nonlocal state, failed
        try:
            state = WorkerState(workload_path, None if device == "auto" else device)
        except BaseException as exc:  # the first job's failure, as when that job loaded the file
            failed = exc

    def handle(request: Any) -> Any:
        nonlocal state, failed
        if failed is not None:
            exc, failed = failed, None
            raise exc
        if state is None:
            state = WorkerState(workload_path, None if device == "auto" else device)
        return run_job(state, request)

    def describe(exc: BaseException, request: Any) -> tuple[FailureKind, str]:
        if getattr(request, "refusable", False) and isinstance(exc, TpuTuneError):
            # A bad file or option: its one-line message (naming the file) is the parent's error.
            return FailureKind.REFUSED, str(exc)
        return failure_of(exc)

    serve(int(read_fd), int(write_fd), handle, describe, ready=load)


if __name__ == "__main__":
    main(sys.argv[1:])
