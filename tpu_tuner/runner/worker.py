"""The worker process: `python -m tpu_tuner.runner.worker READ_FD WRITE_FD WORKLOAD DEVICE MEMLIMIT`.

It receives (job, payload, options) messages, runs them (see jobs.py) and sends back
("ok", value) or (kind, message, traceback) with kind "error" or "oom". A None message ends it.
"""

from __future__ import annotations

import sys
import traceback
from multiprocessing.connection import Connection

OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "memoryerror")


def main(argv: list[str]) -> None:
    read_fd, write_fd, workload_path, device, memory_limit = argv
    if int(memory_limit):
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (int(memory_limit), int(memory_limit)))
    receive = Connection(int(read_fd), writable=False)
    send = Connection(int(write_fd), readable=False)
    from tpu_tuner.runner.jobs import JOBS, WorkerState

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
            send.send(("ok", JOBS[job](state, payload, options)))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
            text = f"{type(exc).__name__}: {exc}".strip()
            is_oom = isinstance(exc, MemoryError) or any(marker in text.lower() for marker in OOM_MARKERS)
            send.send(("oom" if is_oom else "error", text.splitlines()[0][:500], traceback.format_exc()[-4000:]))


if __name__ == "__main__":
    main(sys.argv[1:])
