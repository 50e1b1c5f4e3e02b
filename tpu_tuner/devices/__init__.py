"""Device backends: one module a backend, each a `Backend` (devices/base.py), registered here by name.

Importing the package imports no torch: the registry names each built-in backend's class by its
module, imported when the backend is first asked for, so the agents' schema and the options' checks
list the backends before torch is imported (docs/design.md, "Adding a backend").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from tpu_tuner.core.errors import BackendError
from tpu_tuner.core.lazy import lazy_exports

if TYPE_CHECKING:
    from tpu_tuner.devices.base import Backend, DeviceInfo, DevicePeak

# name -> its Backend class, or "module:Class" until first asked for; in auto-detection order
# (the TPU when present, then a GPU, then the CPU, which always is).
_REGISTRY: dict[str, type[Backend] | str] = {
    "tpu": "tpu_tuner.devices.torchtpu:TorchTpuBackend",
    "cuda": "tpu_tuner.devices.cuda:CudaBackend",
    "cpu": "tpu_tuner.devices.cpu:CpuBackend",
}

__all__ = ["Backend", "DeviceInfo", "DevicePeak", "backend_class", "backend_classes", "get_backend", "names"]


def register(backend: type[Backend]) -> None:
    """Register a backend class after the others, in this process only (a built-in's is its line above)."""
    if backend.kind in _REGISTRY:
        raise ValueError(f"a backend named {backend.kind!r} is registered already")
    _REGISTRY[backend.kind] = backend


def names() -> tuple[str, ...]:
    """The registered backends' names (their device kinds), without importing any."""
    return tuple(_REGISTRY)


def backend_class(name: str) -> type[Backend]:
    """The backend class called `name`, its module imported on first use."""
    entry = _REGISTRY.get(name)
    if entry is None:
        raise BackendError(f"unknown device {name!r}; choose one of {', '.join(_REGISTRY)} or auto")
    if isinstance(entry, str):
        module, _, attribute = entry.partition(":")
        entry = _REGISTRY[name] = getattr(importlib.import_module(module), attribute)
    return entry


def backend_classes() -> list[type[Backend]]:
    """Every registered backend class, in auto-detection order."""
    return [backend_class(name) for name in _REGISTRY]


def get_backend(name: str | None = None) -> Backend:
    """The backend called `name`, or the first one present when None ("auto")."""
    if name is None or name == "auto":
        for candidate in backend_classes():
            reason = candidate.unavailable_reason()
            if reason is None:
                return candidate()
            present = candidate.device_on_host()
            if present:  # e.g. a TPU host whose TorchTPU cannot run: never tune its CPU unasked
                raise BackendError(
                    f"this host has {present} but {candidate.label} cannot run here: {reason} "
                    "(--device cpu to use the CPU anyway; tpu-tune devices)"
                )
        raise BackendError("no device backend is available")  # unreachable: the CPU always is
    chosen = backend_class(name)
    reason = chosen.unavailable_reason()
    if reason is not None:
        raise BackendError(f"device {name!r} is not available here: {reason} (tpu-tune devices lists every backend)")
    return chosen()


# `Backend`, `DeviceInfo` and `DevicePeak` on first use (they import torch).
__getattr__, __dir__ = lazy_exports(
    __name__, dict.fromkeys(("Backend", "DeviceInfo", "DevicePeak"), f"{__name__}.base")
)
