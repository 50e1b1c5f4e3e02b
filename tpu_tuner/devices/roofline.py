"""A measured roofline probe for devices without a published peak (CPUs, unknown GPUs).

It times large fp32 and bf16 matmuls, a large copy and many tiny ops (the per-op dispatch
cost), and checks whether ``torch.set_float32_matmul_precision("medium")`` changes the numerics
of an fp32 matmul on this device. A probe taken while other processes run reads low, so it runs
several interleaved rounds, each the best of a few timings, keeps the best round of each figure
and records the spread across rounds. Results are cached per machine (processor, core count,
threads, torch version) and expire after a week; `cached_probe(force=True)` re-measures when a
step beats the cached peak (see docs/mfu.md).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from tpu_tuner.core.host import cpu_model_name, usable_cores
from tpu_tuner.core.run_folder import write_atomic
from tpu_tuner.devices.roofline_probe import PROBE_VERSION, RooflineProbe

log = logging.getLogger(__name__)

MATMUL_SIZE = 2048
COPY_BYTES = 256 * 1024**2
ROUNDS = 3  # interleaved rounds: a burst of load spoils one round, not every figure
REPEATS = 3  # timings per figure per round; each round keeps its best
DISPATCH_OPS = 2000  # tiny adds per dispatch timing
DISPATCH_ELEMENTS = 8
NUMERICS_SIZE = 512
MAX_AGE_SECONDS = 7 * 24 * 3600.0
# A probe taken under load (roofline_probe.RooflineProbe.under_load) is probed again after an
# hour, keeping the best of both, until a quiet probe replaces it.
LOADED_MAX_AGE_SECONDS = 3600.0
# The figures each round measures; rates are "higher is better", the dispatch cost "lower".
RATE_METRICS = ("float32_flops_per_s", "bfloat16_flops_per_s", "copy_bytes_per_s")
COST_METRICS = ("dispatch_seconds_per_op",)


def cache_path() -> Path:
    """Where probe results are cached: $TPU_TUNE_CACHE_DIR, else ~/.cache/tpu-tune."""
    root = os.environ.get("TPU_TUNE_CACHE_DIR") or Path.home() / ".cache" / "tpu-tune"
    return Path(root) / "roofline.json"


def machine_key(device: torch.device) -> str:
    """Identify the machine and settings a probe result is valid for."""
    if device.type == "cpu":
        return (
            f"v{PROBE_VERSION}|cpu|{cpu_model_name()}|{os.cpu_count()} cpus|{usable_cores()} usable"
            f"|{torch.get_num_threads()} threads|torch {torch.__version__}"
        )
    return f"v{PROBE_VERSION}|{device.type}|{torch.cuda.get_device_name(device)}|torch {torch.__version__}"


MeasureFn = Callable[[torch.device, Callable[[], None]], RooflineProbe]


def cached_probe(
    device: torch.device,
    sync: Callable[[], None],
    *,
    force: bool = False,
    measure_fn: MeasureFn | None = None,
    now: Callable[[], float] = time.time,
    max_age_seconds: float = MAX_AGE_SECONDS,
) -> tuple[RooflineProbe, bool]:
    """The probe for this machine, from the cache or measured now; True when it was cached.

    An entry older than `max_age_seconds` (by the injectable clock `now`) is measured again.
    An entry taken under load is measured again after `LOADED_MAX_AGE_SECONDS`, and `force`
    re-measures even a fresh entry (a step beat its peak); both keep the best of the old and the
    new probe, since a re-probe under load must not lower a peak measured quietly.
    """
    measure_fn = measure_fn or measure  # looked up at call time, so tests can replace `measure`
    path = cache_path()
    key = machine_key(device)
    cache = _read_cache(path)
    cached = _entry(cache, key)
    if cached is not None and not force:
        age = now() - cached.measured_at_epoch
        if age > max_age_seconds:
            log.info("roofline probe of %s is %.1f days old; measuring again", key, age / 86400)
            cached = None
        elif cached.under_load and age > LOADED_MAX_AGE_SECONDS:
            log.info(
                "roofline probe of %s was taken under load (load average %.1f on %d cores); measuring again",
                key,
                cached.load_average,
                cached.cores,
            )
        else:
            return cached, True
    probe = measure_fn(device, sync)
    if cached is not None:
        probe = cached.merged_with(probe)
    cache[key] = asdict(probe)
    _write_cache(path, cache)
    return probe, False


def _read_cache(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, json.JSONDecodeError):
        log.warning("roofline cache %s is unreadable; measuring again", path)
        return {}


def _entry(cache: dict[str, Any], key: str) -> RooflineProbe | None:
    if key not in cache:
        return None
    try:
        probe = RooflineProbe(**cache[key])
    except TypeError:
        log.warning("roofline cache entry for %s is stale; measuring again", key)
        return None
    return probe if probe.version == PROBE_VERSION else None


def _write_cache(path: Path, cache: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(cache, indent=2))  # concurrent profiles never read half a file
    except OSError as exc:
        log.warning("could not cache the roofline probe at %s: %s", path, exc)


def measure(
    device: torch.device,
    sync: Callable[[], None],
    rounds: int = ROUNDS,
    repeats: int = REPEATS,
    timer: Callable[[], float] = time.perf_counter,
) -> RooflineProbe:
    """Probe `device`: `rounds` interleaved rounds of matmuls, copy and tiny ops (a few seconds
    on a CPU), plus one numerics check of "medium"."""
    log.info("measuring the roofline of %s (%d rounds, cached afterwards)", device, rounds)
    load = _load_average()
    flops = 2 * MATMUL_SIZE**3
    fp32 = _matmul_operands(torch.float32, device)
    bf16 = _matmul_operands(torch.bfloat16, device)
    source = torch.empty(COPY_BYTES // 4, dtype=torch.float32, device=device).fill_(1.0)
    target = torch.empty_like(source)

    measured = [
        {
            "float32_flops_per_s": flops / _best_of(lambda: torch.mm(*fp32), sync, repeats, timer),
            "bfloat16_flops_per_s": flops / _best_of(lambda: torch.mm(*bf16), sync, repeats, timer),
            # A copy reads and writes every byte once.
            "copy_bytes_per_s": 2 * COPY_BYTES / _best_of(lambda: target.copy_(source), sync, repeats, timer),
            "dispatch_seconds_per_op": dispatch_seconds_per_op(device, sync, repeats, timer),
        }
        for _ in range(rounds)
    ]
    probe = probe_from_rounds(measured, repeats, medium_relative_error(device), now=time.time(), load_average=load)
    if probe.under_load:
        # Info, not a warning: the profile's peak source line says it where the figures are shown.
        log.info(
            "the roofline probe ran under load (load average %.1f on %d cores): its peaks may read low; "
            "it is measured again within the hour",
            load,
            probe.cores,
        )
    return probe


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def probe_from_rounds(
    measured: list[dict[str, float]],
    repeats: int,
    medium_error: float | None,
    now: float,
    load_average: float | None = None,
) -> RooflineProbe:
    """Combine rounds into a probe: the best round of each figure, every round kept for spread."""
    if not measured:
        raise ValueError("no probe rounds")
    rounds = {name: [r[name] for r in measured] for name in (*RATE_METRICS, *COST_METRICS) if name in measured[0]}
    dispatch = rounds.get("dispatch_seconds_per_op")
    return RooflineProbe(
        float32_flops_per_s=max(rounds["float32_flops_per_s"]),
        bfloat16_flops_per_s=max(rounds["bfloat16_flops_per_s"]),
        copy_bytes_per_s=max(rounds["copy_bytes_per_s"]),
        matmul_size=MATMUL_SIZE,
        copy_bytes=COPY_BYTES,
        repeats=repeats,
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now)),
        dispatch_seconds_per_op=min(dispatch) if dispatch else None,
        medium_relative_error=medium_error,
        rounds=rounds,
        measured_at_epoch=now,
        load_average=load_average,
        cores=usable_cores(),
    )


def dispatch_seconds_per_op(
    device: torch.device,
    sync: Callable[[], None],
    repeats: int = REPEATS,
    timer: Callable[[], float] = time.perf_counter,
) -> float:
    """Seconds one tiny op costs from Python to done: `DISPATCH_OPS` adds of 8-element tensors,
    best of `repeats`. Their arithmetic is negligible, so this is the per-op dispatch floor."""
    tiny = torch.ones(DISPATCH_ELEMENTS, device=device)

    def loop() -> None:
        for _ in range(DISPATCH_OPS):
            torch.add(tiny, tiny)

    return _best_of(loop, sync, repeats, timer) / DISPATCH_OPS


def medium_relative_error(device: torch.device) -> float:
    """Relative error of an fp32 matmul under "medium" against "highest" on `device`: ~1e-7
    when "medium" changes nothing (fp32 kernels), ~1e-3 when it runs the matmul as bf16."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(NUMERICS_SIZE, NUMERICS_SIZE, generator=generator).to(device)
    b = torch.randn(NUMERICS_SIZE, NUMERICS_SIZE, generator=generator).to(device)
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        exact = torch.mm(a.double(), b.double())  # the reference: fp32 rounding shows as ~1e-7
        torch.set_float32_matmul_precision("medium")
        medium = torch.mm(a, b)
    finally:
        torch.set_float32_matmul_precision(previous)
    return float((medium.double() - exact.double()).norm() / exact.double().norm())


def _matmul_operands(dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=generator).to(device=device, dtype=dtype)
    return a, b


def _best_of(
    op: Callable[[], object], sync: Callable[[], None], repeats: int, timer: Callable[[], float] = time.perf_counter
) -> float:
    # The probe measures *precision-independent* throughput: fp32 at "highest" precision.
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        op()  # warm-up: first-call allocation and kernel selection
        sync()
        best = float("inf")
        for _ in range(repeats):
            start = timer()
            op()
            sync()
            best = min(best, timer() - start)
        return best
    finally:
        torch.set_float32_matmul_precision(previous)
