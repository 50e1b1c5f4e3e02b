"""The worker process: `python -m tpu_tuner.runner.worker READ_FD WRITE_FD WORKLOAD DEVICE MEMLIMIT`.

It receives (job, payload, options) messages, runs them (see jobs.py) and sends back
("ok", value) or (kind, message, traceback) with kind "error" or "oom". A None message ends it.
"""

from __future__ import annotations

import sys
import traceback
from multiprocessing.connection import Connection

# Jobs whose TpuTuneError (a bad file, option or device) is the parent's own error, passed on as
# kind "refused" with its message; in a trial the same error is just a failed trial.
REFUSABLE_JOBS = ("load", "profile")
OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "memoryerror")


def main(argv: list[str]) -> None:
    read_fd, write_fd, workload_path, device, memory_limit = argv
    if int(memory_limit):
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (int(memory_limit), int(memory_limit)))
    receive = Connection(int(read_fd), writable=False)
    send = Connection(int(write_fd), readable=False)
    from tpu_tuner.core.errors import TpuTuneError
    from tpu_tuner.runner.jobs import JOBS, WorkerState
    from tpu_tuner.model.summary import summarize

    # "load": import and validate the file, describe it to the parent (which never imports it).
    jobs = {**JOBS, "load": summarize}

    state = None
    while True:
        try:
            message = receive.recv()
        except EOFError:
            return
        if message is None:
            return
        job, payload, options = message
        try:
            if state is None:
                state = WorkerState(workload_path, None if device == "auto" else device)
            send.send(("ok", jobs[job](state, payload, options)))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
            if job in REFUSABLE_JOBS and isinstance(exc, TpuTuneError):
                # A bad file or option: its one-line message (naming the file) is the parent's error.
                send.send(("refused", str(exc), traceback.format_exc()[-4000:]))
                continue
            kind, message = failure_of(exc)
            send.send((kind, message, traceback.format_exc()[-4000:]))


def failure_of(exc: BaseException) -> tuple[str, str]:
    """A job's exception as a failure kind ("oom" for allocation failures, else "error") and its
    first line (500 characters at most)."""
    text = f"{type(exc).__name__}: {exc}".strip()
    is_oom = isinstance(exc, MemoryError) or any(marker in text.lower() for marker in OOM_MARKERS)
    return ("oom" if is_oom else "error"), text.splitlines()[0][:500]


if __name__ == "__main__":
    main(sys.argv[1:])
