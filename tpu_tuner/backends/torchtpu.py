"""The TorchTPU backend (PyPI ``torch-tpu``, device ``"tpu"``).

Every import of ``torch_tpu`` is lazy: the package changes every ``import torch`` in an
environment where it is installed, and aborts without libtpu, so tpu-tune never imports it
unless this backend is selected. API facts used here are in shared notes FACTS.md §1.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Iterator
from typing import Any

import torch

from tpu_tuner.backends.base import Backend, DeviceInfo, DevicePeak
from tpu_tuner.candidate import Candidate
from tpu_tuner.errors import BackendError
from tpu_tuner.hardware import GIGA, tpu_chip_for_name

log = logging.getLogger(__name__)

# Candidate eager modes -> TorchTPU's EagerMode enum members and start-up environment variables.
EAGER_MODE_ENUM = {
    "strict": "DEFER_NEVER",
    "debug": "DEFER_NEVER_AND_LAUNCH_BLOCKING",
    "defer_and_fuse": "DEFER_AND_FUSE",
}
EAGER_MODE_ENV = {
    "strict": {},
    "debug": {"TORCH_TPU_LAUNCH_BLOCKING": "1"},
    "defer_and_fuse": {"TORCH_TPU_DEFER_AND_FUSE": "1"},
}


class TorchTpuBackend(Backend):
    """Runs on a TPU through TorchTPU, when the package is installed and a TPU is present."""

    kind = "tpu"
    process_group_backend = "tpu_dist"  # TorchTPU's own process group backend (one process per device)

    @classmethod
    def is_available(cls) -> bool:
        if importlib.util.find_spec("torch_tpu") is None:
            return False
        try:
            accelerator = torch.accelerator.current_accelerator()
            return accelerator is not None and accelerator.type == "tpu" and (
                torch.accelerator.device_count() > 0
            )
        except Exception:  # noqa: BLE001 - a broken install means "not available"
            return False

    @property
    def device(self) -> torch.device:
        return torch.device("tpu", torch.accelerator.current_device_index())

    def info(self) -> DeviceInfo:
        tpu = _torch_tpu_module()
        name = str(tpu.get_device_name())
        chip = tpu_chip_for_name(name)
        flops, source = _runtime_peak()
        if flops is None and chip is not None:
            flops, source = chip.bf16_flops_per_device, f"Google TPU spec table ({chip.generation})"
        if flops is None:
            raise BackendError(f"unknown TPU generation {name!r}: no peak FLOP/s for MFU")
        memory = None
        with contextlib.suppress(Exception):
            memory = int(tpu.get_device_properties().total_memory)
        return DeviceInfo(
            kind="tpu",
            name=name,
            count=int(torch.accelerator.device_count()),
            memory_bytes=memory,
            peak=DevicePeak(
                # MXU matmuls run in bf16 passes; MFU on TPU is quoted against the bf16 peak.
                flops_per_s={"bfloat16": flops, "float32": flops},
                memory_bytes_per_s=chip.hbm_gbytes_per_s * GIGA if chip else None,
                source=source,
            ),
            details={"generation": chip.generation if chip else None},
        )

    def synchronize(self) -> None:
        torch.accelerator.synchronize()

    def compute_dtype(self, candidate: Candidate) -> str:
        return "bfloat16"

    def reset_peak_memory(self) -> None:
        with contextlib.suppress(Exception):
            torch.accelerator.reset_peak_memory_stats()

    def peak_memory_bytes(self) -> tuple[int | None, str]:
        try:
            return int(torch.accelerator.max_memory_allocated()), "torch.accelerator.max_memory_allocated"
        except Exception:  # noqa: BLE001 - not every runtime version reports it
            return None, "not reported by this TorchTPU version"

    def compile_events(self) -> dict[str, int]:
        events = super().compile_events()
        with contextlib.suppress(Exception):
            stats = _torch_tpu_module()._get_cache_stats()
            events["tpu_cache_misses"] = int(_stat(stats, "misses"))
            events["tpu_cache_requests"] = int(_stat(stats, "requests"))
        return events

    def default_compile_backend(self) -> str:
        return "tpu"

    @classmethod
    def eager_modes(cls) -> tuple[str, ...]:
        return tuple(EAGER_MODE_ENUM)

    @classmethod
    def eager_mode_environment(cls, mode: str) -> dict[str, str]:
        # Environment variables are read once, at start-up: a trial with them needs a fresh
        # process (FACTS.md §1).
        return dict(EAGER_MODE_ENV.get(mode, {}))

    @contextlib.contextmanager
    def eager_mode(self, mode: str | None) -> Iterator[None]:
        # The eager mode can also be switched in-process (torch.tpu.eager_mode); a fresh process
        # with EAGER_MODE_ENV set is the faithful way, which the study uses for measuring.
        tpu = _torch_tpu_module()
        previous_mode = getattr(tpu, "eager_mode", None)
        with contextlib.suppress(Exception):
            tpu.eager_mode = getattr(tpu.EagerMode, EAGER_MODE_ENUM[mode or "strict"])
        try:
            yield
        finally:
            if previous_mode is not None:
                with contextlib.suppress(Exception):
                    tpu.eager_mode = previous_mode


def _torch_tpu_module() -> Any:
    import torch_tpu  # noqa: F401 - registers torch.tpu

    return torch.tpu  # type: ignore[attr-defined]


def _runtime_peak() -> tuple[float | None, str]:
    try:
        from torch_tpu._internal.utils.hardware import get_bf16_flops_per_device

        return float(get_bf16_flops_per_device()), "torch_tpu hardware table (get_bf16_flops_per_device)"
    except Exception:  # noqa: BLE001 - private API; fall back to our table
        return None, ""


def _stat(stats: Any, name: str) -> int:
    if isinstance(stats, dict):
        return int(stats.get(name, 0))
    return int(getattr(stats, name, 0))
