"""Device backends: TorchTPU, CUDA and CPU behind one `Backend` interface."""

from __future__ import annotations

from tpu_tuner.devices.base import Backend, DeviceInfo, DevicePeak
from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.devices.cuda import CudaBackend
from tpu_tuner.devices.torchtpu import TorchTpuBackend
from tpu_tuner.core.errors import BackendError

# Preference order for auto-detection: the TPU when present, then a GPU, then the CPU.
BACKENDS: dict[str, type[Backend]] = {
    "tpu": TorchTpuBackend,
    "cuda": CudaBackend,
    "cpu": CpuBackend,
}

__all__ = ["BACKENDS", "Backend", "DeviceInfo", "DevicePeak", "get_backend"]


def get_backend(name: str | None = None) -> Backend:
    """The backend called `name` ("tpu", "cuda", "cpu"), or the best one present when None."""
    if name is None or name == "auto":
        from tpu_tuner.core.tpu_host import tpu_chips_on_host

        reason = TorchTpuBackend.unavailable_reason() if tpu_chips_on_host() else None
        if reason is not None:  # a TPU host whose TorchTPU cannot run: never tune its CPU unasked
            raise BackendError(f"this host has TPU chips but TorchTPU cannot run here: {reason} "
                               "(--device cpu to use the CPU anyway; tpu-tune devices)")
        for backend_class in BACKENDS.values():
            if backend_class.is_available():
                return backend_class()
        raise BackendError("no device backend is available")  # unreachable: the CPU always is
    if name not in BACKENDS:
        raise BackendError(f"unknown device {name!r}; choose one of {', '.join(BACKENDS)} or auto")
    backend_class = BACKENDS[name]
    reason = backend_class.unavailable_reason()
    if reason is not None:
        raise BackendError(f"device {name!r} is not available here: {reason} (tpu-tune devices lists every backend)")
    return backend_class()
