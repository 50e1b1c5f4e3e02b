"""The CPU backend: real work on this machine, with a measured roofline as its peak."""

from __future__ import annotations

import os
import time
from contextlib import suppress
from pathlib import Path

import torch

from tpu_tuner.core.host import usable_cores
from tpu_tuner.devices.base import Backend, DeviceInfo, DevicePeak
from tpu_tuner.devices.roofline import cached_probe, cpu_model_name


class CpuBackend(Backend):
    """Runs on the host CPU. Its peak FLOP/s come from the cached roofline probe."""

    kind = "cpu"
    label = "the CPU"
    one_device_per_rank = False  # ranks share the cores (each runs cores / N threads)

    @classmethod
    def is_available(cls) -> bool:
        return True

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def device_name(self) -> str:
        return cpu_model_name()

    def describe(self) -> str:
        return f"{cpu_model_name()}, {usable_cores()} usable cores"

    def available_memory_bytes(self, total: int | None) -> int | None:
        """The host's available memory (MemAvailable), else its free pages, else `total`."""
        meminfo = _proc_bytes("meminfo", "MemAvailable:")
        if meminfo is not None:
            return meminfo
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return total

    def info(self) -> DeviceInfo:
        started = time.perf_counter()
        probe, was_cached = cached_probe(self.device, self.synchronize)
        peak = probe.to_peak(probe.describe() + (" (cached)" if was_cached else ""))
        return DeviceInfo(
            kind="cpu",
            name=cpu_model_name(),
            count=1,
            memory_bytes=_proc_bytes("meminfo", "MemTotal:"),
            peak=peak,
            details={"threads": torch.get_num_threads(), "cpus": os.cpu_count(), "usable_cores": usable_cores()},
            probe=probe,
            once_s=0.0 if was_cached else time.perf_counter() - started,
        )

    def peak_of_ranks(self, flops_per_s: dict[str, float]) -> dict[str, float]:
        """The host's peak: the ranks of a CPU step share its cores (each runs cores / N threads);
        over several hosts (LOCAL_WORLD_SIZE ranks each, as the launcher sets it), theirs added up."""
        hosts = max(1, self.ranks // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", self.ranks))))
        return {dtype: rate * hosts for dtype, rate in flops_per_s.items()}

    def remeasure_peak(self) -> DevicePeak | None:
        # The cached probe may have been taken under load: measure again, keep the best of both.
        probe, _ = cached_probe(self.device, self.synchronize, force=True)
        return probe.to_peak(probe.describe() + " (re-measured: a step beat the cached peak)")

    def dispatch_seconds_per_op(self) -> float | None:
        probe, _ = cached_probe(self.device, self.synchronize)
        return probe.dispatch_seconds_per_op

    def synchronize(self) -> None:
        # CPU ops run synchronously: when the call returns, the work is done.
        return None

    def matmul_dtype(self, precision: str) -> str:
        # "medium" lets oneDNN run fp32 matmuls as bf16 on some hosts (AMX) and changes nothing on
        # others: the probe's numerics check says which. "high" has no TF32 equivalent on CPU.
        if precision == "medium":
            probe, _ = cached_probe(self.device, self.synchronize)
            return "bfloat16" if probe.medium_changes_numerics else "float32"
        return "float32"

    def autocast_matmul_dtype(self, dtype: str) -> str | None:
        # Only bfloat16 is counted as a CPU autocast dtype; float16 reports the precision's.
        return dtype if dtype == "bfloat16" else None

    def reset_peak_memory(self) -> None:
        # Writing 5 to clear_refs resets the kernel's peak-RSS mark (VmHWM) to the current RSS.
        with suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")

    def peak_memory_bytes(self) -> tuple[int | None, str]:
        peak = _proc_bytes("self/status", "VmHWM:")
        if peak is not None:
            return peak, "peak resident set of the process (VmHWM)"
        import resource

        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return kib * 1024, "peak resident set of the process since start (ru_maxrss)"

    def memory_in_use_bytes(self) -> int | None:
        # The resident set less what malloc holds freed (glibc's mallinfo2): a step's tensors
        # reuse that first, so it is no part of the base its peak adds to.
        resident = _proc_bytes("self/status", "VmRSS:")
        return None if resident is None else max(0, resident - (self.free_heap_bytes() or 0))

    def free_heap_bytes(self) -> int | None:
        return _malloc_free_bytes()


def _proc_bytes(file: str, field: str) -> int | None:
    """A figure of /proc/`file` (status, meminfo: `field` with its colon) in bytes; None where
    there is none."""
    try:
        for line in Path("/proc", file).read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _malloc_free_bytes() -> int | None:
    """Bytes glibc's malloc holds in free chunks (mallinfo2's fordblks); None on another C library."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                *("arena", "ordblks", "smblks", "hblks", "hblkhd"),
                *("usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"),  # all ten: returned by value
            )
        ]

    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):  # not glibc >= 2.33
        return None
    mallinfo2.restype = MallInfo2
    return int(mallinfo2().fordblks)
