"""The failure vocabulary: every way a trial, a rank, a host or a compile fails, and one classifier.

`FailureKind`'s values are the strings studies, trials.csv and reports store (`failure_kind`), so
runs written before read back unchanged: a stored "oom" equals `FailureKind.OOM`.
"""

from __future__ import annotations

import re
import signal
from enum import StrEnum


class FailureKind(StrEnum):
    """Why something produced no usable result. The values are stored: never change one."""

    ERROR = "error"  # the job raised
    CRASH = "crash"  # the process died: a signal other than SIGKILL, or an exit without a reply
    OOM = "oom"  # out of memory: an allocation failed, or SIGKILL (the kernel's OOM killer)
    TIMEOUT = "timeout"  # no result by the deadline (a hang or a slow job): the process was killed
    ACCURACY = "accuracy"  # measured, but its outputs are off the baseline's beyond the tolerance
    MEMORY = "memory"  # measured, but its peak memory is over the study's limit
    REFUSED = "refused"  # refused before it ran: a bad file or option while loading, a compile refused
    INTERRUPTED = "interrupted"  # cut short from outside (a host lost, the run stopped): measured again
    ABORTED = "aborted"  # a host's ranks stopped because another host's failed
    LOST = "lost"  # its worker went away with it: nobody was left to record a kind
    WOULD_NOT_FIT = "would-not-fit"  # refused unmeasured: its peak memory, estimated, is over the limit
    HANG = "hang"  # a process it ran on froze (stopped, SIGSTOP or a paused host): killed, measured again


WORKER_FAILURES = (FailureKind.CRASH, FailureKind.OOM, FailureKind.TIMEOUT, FailureKind.ERROR)  # a worker's measurement
# Failures that say nothing of the setting (a lost host, a frozen process): FAIL, queued again, measured once more.
MEASURED_AGAIN = (FailureKind.INTERRUPTED, FailureKind.HANG)


def classify(
    exit_code: int | None = None, message: str = "", *, died: bool = False, exit_is_error: bool = False
) -> FailureKind:
    """The kind of a failure but a deadline's (TIMEOUT). A process that ended (`died`, or an `exit_code`;
    negative: the signal): SIGKILL is the kernel's OOM killer (tpu-tune kills only at a deadline),
    else a crash, or an error where it exits with a status when its job raises (`exit_is_error`, a
    rank). Else `message`, an exception's text: an allocation that failed, or an error."""
    if died or exit_code is not None:
        if exit_code is not None and exit_code < 0:
            return FailureKind.OOM if -exit_code == signal.SIGKILL else FailureKind.CRASH
        return FailureKind.ERROR if exit_is_error and exit_code else FailureKind.CRASH
    if "would not fit:" in message.lower():  # execution/memory_estimate.py's refusal
        return FailureKind.WOULD_NOT_FIT
    markers = ("out of memory", "can't allocate memory", "cannot allocate memory", "memoryerror")
    return FailureKind.OOM if any(marker in message.lower() for marker in markers) else FailureKind.ERROR


def failure_line(exc: BaseException, limit: int = 500) -> str:
    """An exception's first line, "Type: message", with its cause where that line only announces
    one: dynamo's `BackendCompilerFailed` reads "backend='tpu' raised:" and names the compiler's
    error on the next line (the chip's splash failure of 2026-12-07 kept nothing else)."""
    lines = [line.strip() for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip()]
    head = lines[0] if lines else type(exc).__name__
    if head.endswith(":"):
        cause = exc.__cause__
        rest = lines[1] if len(lines) > 1 else (failure_line(cause, limit) if cause is not None else "")
        head = f"{head} {rest}".strip()
    return head[:limit]


def describe_end(exit_code: int | None) -> str:
    """How a process ended, in every failure message's words: "died from SIGSEGV", "exited with status 3"."""
    if exit_code is None or exit_code >= 0:
        return "did not exit, and was killed" if exit_code is None else f"exited with status {exit_code}"
    name = {sig.value: sig.name for sig in signal.Signals}.get(-exit_code, f"signal {-exit_code}")
    return f"died from {name}" + (" (the kernel's OOM killer)" if classify(exit_code) is FailureKind.OOM else "")


def is_compiler_out_of_memory(error: str) -> bool:
    """Whether the TPU compiler refused a program for device memory (HBM, or a kernel's scoped
    VMEM): XLA's RESOURCE_EXHAUSTED, or its HBM message. No other refusal (a RET_CHECK, a compiler
    process that died) is a verdict on memory, even where its text mentions memory."""
    return "RESOURCE_EXHAUSTED" in error or "exceeds available HBM" in error


# What a TPU runtime's own log says where a program or a buffer did not fit: torch-tpu 0.2.0 raises
# "a required argument is in a failed state" in Python, and libtpu writes the cause to stderr only
# ("RESOURCE_EXHAUSTED ... RuntimeBufferAllocationFailure", seen on a v5e chip).
_DEVICE_OOM_MARKERS = ("RESOURCE_EXHAUSTED", "RuntimeBufferAllocationFailure", "exceeds available HBM")
_ABSL_PREFIX = re.compile(
    r"^[IWEF]\d{4} [\d:.]+(?:\s+\d+)?\s+[\w.]+:\d+\] "
)  # "E0000 00:00:17.5 4411 materialize.cc:583] "


def device_out_of_memory_line(output: str) -> str | None:
    """The first line of a worker's output (its libraries' own log) saying the device ran out of
    memory, stripped of the logger's prefix; None where none does."""
    for line in output.splitlines():
        if any(marker in line for marker in _DEVICE_OOM_MARKERS):
            return _ABSL_PREFIX.sub("", line).strip()
    return None


def with_device_cause(kind: FailureKind, message: str, output: str) -> tuple[FailureKind, str]:
    """A worker's failure as its device's log tells it: an error whose `output` holds the device's
    out-of-memory line is that OOM, the line quoted; anything else as it was."""
    line = device_out_of_memory_line(output) if kind is FailureKind.ERROR else None
    return (kind, message) if line is None else (FailureKind.OOM, f"{message} (the device: {line[:200]})")


def unknown_compile_option(error: str) -> str | None:
    """The option a TPU compile was refused for not having ("No such compile option: 'NAME'"),
    else None: a user's flag, wrong for every program alike."""
    found = re.search(r"No such compile option: '?(\w+)", error)
    return found.group(1) if found else None
