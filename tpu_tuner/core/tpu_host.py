"""What this host has of TPUs, read from the PCI bus without loading any TPU library, and the
environment that keeps libtpu from reaching for a TPU that is not there.

Only where the PCI bus shows no TPU chip, and never over a value the user set: ``TPU_SKIP_MDS_QUERY=1``
(else libtpu, autoloaded with torch-tpu by every ``import torch``, asks GCE's metadata server for
its topology at the first backward, for minutes) and, where torch-tpu is installed, for tpu-tune's
own processes ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (the autoload costs seconds a process and changes
dynamo's settings for CPU and CUDA work too). Measured, and why: docs/torchtpu.md, "`import
torch_tpu` on a machine without a TPU". On a real TPU VM the metadata server is how libtpu learns
its slice.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

# TorchTPU's persistent ("Tier-3") compilation cache: the root folder its C++ runtime reads from
# this variable (named in torch-tpu 0.2.0's libpywrap_2_13_0_common.so): the run folder's workers
# share one (devices/torchtpu.py), the bucketing study gives each worker an empty one.
TORCHTPU_CACHE_VARIABLE = "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"
PCI_DEVICES = Path("/sys/bus/pci/devices")
GOOGLE_PCI_VENDOR = "0x1ae0"
# Google's PCI device ids of TPU chips (torch-tpu 0.2.0's hardware table). Google's vendor id alone
# is not enough: GCE's virtual NIC (gVNIC) has it too.
TPU_PCI_DEVICE_IDS = {"0x005e": "v4", "0x0062": "v5p", "0x0063": "v5e", "0x006f": "v6e", "0x0076": "tpu7x"}


def tpu_chips_on_host(pci_devices: Path = PCI_DEVICES) -> dict[str, int]:
    """TPU chips on this host's PCI bus by generation ({} on a host without one)."""
    chips: dict[str, int] = {}
    if not pci_devices.is_dir():
        return chips
    for device in pci_devices.iterdir():
        try:
            vendor = (device / "vendor").read_text().strip()
            if vendor != GOOGLE_PCI_VENDOR:
                continue
            generation = TPU_PCI_DEVICE_IDS.get((device / "device").read_text().strip())
        except OSError:  # a device that vanished or a file we may not read: not a chip we can use
            continue
        if generation is not None:
            chips[generation] = chips.get(generation, 0) + 1
    return chips


def torch_tpu_installed() -> bool:
    """Whether torch-tpu is installed here (found, not imported: importing it imports torch)."""
    return importlib.util.find_spec("torch_tpu") is not None


def loads_torch_tpu(pci_devices: Path = PCI_DEVICES) -> bool:
    """Whether ``import torch`` in a tpu-tune process loads torch-tpu here, start-up lines and all:
    a host with a TPU chip (where tpu-tune leaves the autoload on) and torch-tpu installed. Also
    where the user turned the autoload off: ``--device tpu`` imports torch_tpu itself."""
    return bool(tpu_chips_on_host(pci_devices)) and torch_tpu_installed()


def settle_tpu_environment(
    environ: MutableMapping[str, str] = os.environ, pci_devices: Path = PCI_DEVICES, torch_imported: bool | None = None
) -> dict[str, str]:
    """On a host without a TPU chip: tell libtpu not to ask the metadata server, and, where torch
    is not imported yet, do not autoload torch-tpu into this process either (module doc; its
    import also prints a tcmalloc warning and libtpu's log lines around tpu-tune's one-line
    errors). Returns what it set; never overrides a value already there."""
    wanted = child_environment(environ, pci_devices)
    if torch_imported if torch_imported is not None else "torch" in sys.modules:
        wanted.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)  # too late: it is read at import
    environ.update(wanted)
    return wanted


def child_environment(
    environ: MutableMapping[str, str] | None = None, pci_devices: Path = PCI_DEVICES
) -> dict[str, str]:
    """Variables for a process tpu-tune starts (trial workers, ranks, compilers): on a host
    without a TPU chip, no torch-tpu autoload and no metadata queries (module doc); nothing on a
    TPU host. A value the user set wins."""
    environ = os.environ if environ is None else environ
    if tpu_chips_on_host(pci_devices):
        return {}
    wanted = {"TPU_SKIP_MDS_QUERY": "1"}
    # The autoload switch turns off every torch.backends plugin: only where torch-tpu is one.
    if torch_tpu_installed():
        wanted["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    return {name: value for name, value in wanted.items() if name not in environ}
