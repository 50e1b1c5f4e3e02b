"""A stand-in trial worker for tests/test_keep_the_chip.py: ``python -m test_keep_the_chip_child
READ_FD WRITE_FD ARGS...`` (tests/ on PYTHONPATH). Its start-up sleeps $CHILD_START_S seconds (a
chip being opened) before it says READY; each job's reply names the job and the variables the
process was started with that the tests look at. It imports nothing heavy, so it starts fast."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

LOOKED_AT = ("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", "TORCH_TPU_DEFER_AND_FUSE")


def main(argv: list[str]) -> None:
    from tpu_tuner.runner.worker_process import serve

    def ready() -> None:
        time.sleep(float(os.environ.get("CHILD_START_S", "0")))

    def handle(job: Any) -> dict[str, Any]:
        return {"job": job, "env": {name: os.environ.get(name) for name in LOOKED_AT}, "pid": os.getpid()}

    serve(int(argv[0]), int(argv[1]), handle, ready=ready)


if __name__ == "__main__":
    main(sys.argv[1:])
