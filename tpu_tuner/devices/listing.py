"""``tpu-tune devices``: each backend, whether it can run here and why not, the installed versions
of the packages the backends and the planner use, and the TorchTPU API check."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any

# Distributions whose versions decide what runs: the backends', the planner's and TorchTPU's.
PACKAGES = ("torch", "torch-tpu", "libtpu", "jax", "jaxlib", "torchax")


@dataclass(frozen=True)
class BackendStatus:
    """One backend on this host."""

    kind: str
    available: bool
    detail: str  # the device where available, else why not


@dataclass(frozen=True)
class DevicesReport:
    """What `tpu-tune devices` prints."""

    backends: list[BackendStatus]
    versions: dict[str, str | None]  # distribution -> version, None when not installed
    torchtpu_api: str  # the API check's summary line
    torchtpu_api_ok: bool | None  # None: torch-tpu is not installed
    torchtpu_missing: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The table, then the versions, then the API check."""
        width = max(len("backend"), *(len(b.kind) for b in self.backends))
        rows = [f"{'backend'.ljust(width)}  available  device / why not"]
        rows += [f"{b.kind.ljust(width)}  {'yes' if b.available else 'no':<9}  {b.detail}" for b in self.backends]
        versions = ", ".join(f"{name} {version or '-'}" for name, version in self.versions.items())
        return [*rows, "", f"installed: {versions}", self.torchtpu_api]


def installed_versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Each distribution's installed version from its metadata (nothing is imported)."""
    versions: dict[str, str | None] = {}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def devices_report() -> DevicesReport:
    """Check every backend and the TorchTPU API on this host (imports torch; with torch-tpu
    installed also torch_tpu, a few seconds)."""
    from tpu_tuner.devices import backend_classes
    from tpu_tuner.devices.torchtpu_api import cached_api_check

    statuses = []
    for backend in backend_classes():
        reason = backend.unavailable_reason()
        statuses.append(BackendStatus(backend.kind, reason is None, backend().describe() if reason is None else reason))
    check = cached_api_check()
    return DevicesReport(
        backends=statuses,
        versions=installed_versions(),
        torchtpu_api=check.summary(),
        torchtpu_api_ok=None if check.version is None else check.ok,
        torchtpu_missing=[c.name for c in check.missing],
    )
