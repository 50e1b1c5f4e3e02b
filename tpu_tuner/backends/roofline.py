"""A measured roofline probe for devices without a published peak (CPUs, unknown GPUs).

It times large fp32 and bf16 matmuls and a large copy, and caches the result per machine so
that it runs once, not on every profile. The cache key names the processor, the number of
threads torch uses, and the torch version, since each changes the figures.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from tpu_tuner.backends.base import DevicePeak

log = logging.getLogger(__name__)

MATMUL_SIZE = 2048
COPY_BYTES = 256 * 1024**2
REPEATS = 5


@dataclass(frozen=True)
class RooflineProbe:
    """Measured throughput of one device: the best of `repeats` timings each."""

    float32_flops_per_s: float
    bfloat16_flops_per_s: float
    copy_bytes_per_s: float
    matmul_size: int
    copy_bytes: int
    repeats: int
    measured_at: str

    def to_peak(self, source: str) -> "DevicePeak":
        """The probe as a backend's peak table (fp32 and bf16 FLOP/s, copy bandwidth)."""
        from tpu_tuner.backends.base import DevicePeak

        return DevicePeak(
            flops_per_s={"float32": self.float32_flops_per_s, "bfloat16": self.bfloat16_flops_per_s},
            memory_bytes_per_s=self.copy_bytes_per_s,
            source=source,
        )

    def describe(self) -> str:
        return (
            f"measured roofline probe: {self.matmul_size}x{self.matmul_size} matmuls and a "
            f"{self.copy_bytes // 1024**2} MiB copy, best of {self.repeats}, at {self.measured_at}"
        )


def cache_path() -> Path:
    """Where probe results are cached: $TPU_TUNE_CACHE_DIR, else ~/.cache/tpu-tune."""
    root = os.environ.get("TPU_TUNE_CACHE_DIR") or Path.home() / ".cache" / "tpu-tune"
    return Path(root) / "roofline.json"


def machine_key(device: torch.device) -> str:
    """Identify the machine and settings a probe result is valid for."""
    if device.type == "cpu":
        name = cpu_model_name()
        return f"cpu|{name}|{os.cpu_count()} cpus|{torch.get_num_threads()} threads|torch {torch.__version__}"
    return f"{device.type}|{torch.cuda.get_device_name(device)}|torch {torch.__version__}"


def cached_probe(device: torch.device, sync: Callable[[], None]) -> tuple[RooflineProbe, bool]:
    """The probe for this machine, from the cache or measured now; True when it was cached."""
    path = cache_path()
    key = machine_key(device)
    cache: dict[str, dict] = {}
    if path.exists():
        try:
            cache = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            log.warning("roofline cache %s is unreadable; measuring again", path)
    if key in cache:
        try:
            return RooflineProbe(**cache[key]), True
        except TypeError:
            log.warning("roofline cache entry for %s is stale; measuring again", key)
    probe = measure(device, sync)
    cache[key] = asdict(probe)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache, indent=2))
        tmp.replace(path)  # atomic: concurrent profiles never read half a file
    except OSError as exc:
        log.warning("could not cache the roofline probe at %s: %s", path, exc)
    return probe, False


def measure(device: torch.device, sync: Callable[[], None]) -> RooflineProbe:
    """Time the matmuls and the copy on `device` (about two seconds on a 2-core CPU)."""
    log.info("measuring the roofline of %s (cached afterwards)", device)
    flops = 2 * MATMUL_SIZE**3
    fp32 = flops / _best_time(lambda a, b: torch.mm(a, b), torch.float32, device, sync)
    bf16 = flops / _best_time(lambda a, b: torch.mm(a, b), torch.bfloat16, device, sync)
    source = torch.empty(COPY_BYTES // 4, dtype=torch.float32, device=device).fill_(1.0)
    target = torch.empty_like(source)
    copy_time = _best_of(lambda: target.copy_(source), sync)
    # A copy reads and writes every byte once.
    copy_rate = 2 * COPY_BYTES / copy_time
    return RooflineProbe(
        float32_flops_per_s=fp32,
        bfloat16_flops_per_s=bf16,
        copy_bytes_per_s=copy_rate,
        matmul_size=MATMUL_SIZE,
        copy_bytes=COPY_BYTES,
        repeats=REPEATS,
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )


def _best_time(op: Callable, dtype: torch.dtype, device: torch.device, sync: Callable[[], None]) -> float:
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=generator).to(device=device, dtype=dtype)
    return _best_of(lambda: op(a, b), sync)


def _best_of(op: Callable[[], object], sync: Callable[[], None]) -> float:
    # The probe measures *precision-independent* throughput: fp32 at "highest" precision.
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        op()  # warm-up: first-call allocation and kernel selection
        sync()
        best = float("inf")
        for _ in range(REPEATS):
            start = time.perf_counter()
            op()
            sync()
            best = min(best, time.perf_counter() - start)
        return best
    finally:
        torch.set_float32_matmul_precision(previous)


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
