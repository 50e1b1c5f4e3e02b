"""The TorchTPU backend (PyPI ``torch-tpu``, device ``"tpu"``), against the released 0.2.0.

Every TorchTPU name used here is listed in `devices/torchtpu_api.py`, which checks them against
the installed package; the backend refuses to run on a package that fails that check, naming what
moved. Nothing here swallows a TorchTPU error: an API change fails loudly.

``import torch_tpu`` is lazy: on a host without a TPU chip tpu-tune's processes do not autoload it
(`core/tpu_host.py`), and it costs seconds where they do. docs/torchtpu.md has what each name does.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from tpu_tuner.core import tpu_host
from tpu_tuner.core.errors import BackendError, UserInputError
from tpu_tuner.core.hardware import tpu_chip_for_name
from tpu_tuner.core.tpu_host import TORCHTPU_CACHE_VARIABLE, tpu_chips_on_host
from tpu_tuner.devices.base import Backend, DeviceInfo, DevicePeak
from tpu_tuner.devices.torchtpu_api import (
    EAGER_MODE_ENUM,
    EAGER_MODE_ENV,
    NODE_RANK_VARIABLE,
    PROCESS_GROUP_BACKEND,
    cached_api_check,
)
from tpu_tuner.devices.torchtpu_package import DISTRIBUTION, installed_version, package_folder

# torch-tpu releases whose API this adapter was read against, and the libtpu 0.2.0 requires.
SUPPORTED_SERIES = "0.2"
MIN_LIBTPU = (0, 0, 50)
# Where the XPlane trace of a profile goes (for XProf / TensorBoard); unset: TorchTPU's default.
XPROF_DIR_VARIABLE = "TPU_TUNE_XPROF_DIR"
# Set by a process whose installed torch-tpu passed the API check, to that version.
API_CHECKED_VARIABLE = "TPU_TUNE_TORCHTPU_API_CHECKED"
# TorchTPU's persistent compilation cache (core/tpu_host.py), kept in the results folder under
# COMPILATION_CACHE_FOLDER and shared by its runs (as inductor's FX graph cache is by every run of a
# user), so that every worker, the verification, a resume and the next run reuse the search's
# compiles. Its Tier-2 cache is off for a world size of 1 ("disabled for world size 1").
COMPILATION_CACHE_VARIABLE = TORCHTPU_CACHE_VARIABLE
COMPILATION_CACHE_FOLDER = ".torchtpu_cache"  # hidden: the dashboard and the warm start skip it

log = logging.getLogger(__name__)


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:4])


class TorchTpuBackend(Backend):
    """Runs on a TPU through TorchTPU, when the package is installed and a TPU is present."""

    kind = "tpu"
    label = "TorchTPU"
    process_group_backend = PROCESS_GROUP_BACKEND  # TorchTPU's own; one process per device
    memory_bounds_trials = True
    runs_ahead = True  # ops are dispatched asynchronously; DeferAndFuse defers them further
    # Fake tensors cannot move to the chip (torch-tpu 0.2.0: "_apply(): Couldn't swap
    # Embedding.weight"): the estimate traces the step on CPU fake tensors (docs/torchtpu.md).
    fake_tensor_device = "cpu"

    @classmethod
    def device_on_host(cls) -> str | None:
        return "TPU chips" if tpu_host.tpu_chips_on_host() else None  # looked up now: tests replace it

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None where TorchTPU can run here, else why not (cheapest checks first: nothing is
        imported on a host without the package or without a chip)."""
        version = installed_version()
        if version is None or package_folder() is None:
            return f"{DISTRIBUTION} is not installed (pip install -e '.[tpu]')"
        if not version.startswith(SUPPORTED_SERIES + "."):
            return (
                f"{DISTRIBUTION} {version} is outside the releases tpu-tune was checked against ({SUPPORTED_SERIES}.x)"
            )
        try:
            libtpu = metadata.version("libtpu")
        except metadata.PackageNotFoundError:
            return f"libtpu is not installed ({DISTRIBUTION} {version} needs libtpu >= 0.0.50)"
        if _version_tuple(libtpu) < MIN_LIBTPU:
            return f"libtpu {libtpu} is older than {DISTRIBUTION} {version} needs (>= 0.0.50)"
        if not tpu_chips_on_host():
            return "no TPU chip on this host's PCI bus"
        # The full check (imports, parses sources, scans the shared libraries) once per install:
        # a process that passed it tells its trial workers and ranks, which inherit the variable.
        if os.environ.get(API_CHECKED_VARIABLE) != version:
            check = cached_api_check()
            if not check.ok:
                return check.summary()
            os.environ[API_CHECKED_VARIABLE] = version
        accelerator = torch.accelerator.current_accelerator()
        if accelerator is None or accelerator.type != "tpu" or torch.accelerator.device_count() == 0:
            return "TorchTPU sees no TPU device (torch.accelerator has none)"
        return None

    @classmethod
    def is_available(cls) -> bool:
        return cls.unavailable_reason() is None

    @property
    def device(self) -> torch.device:
        return torch.device("tpu", torch.accelerator.current_device_index())

    def device_name(self) -> str:
        return str(torch_tpu_module().get_device_name())

    def describe(self) -> str:
        return f"{self.device_name()} x {torch.accelerator.device_count()}"

    @classmethod
    def device_mesh(cls, sizes: tuple[int, ...], names: tuple[str, ...]) -> Any:
        """A DeviceMesh over the TPU ranks in TorchTPU's ICI-aware order (``topology_aware_mesh``),
        so that a mesh axis's neighbours are neighbours on the chip interconnect."""
        from torch.distributed.device_mesh import DeviceMesh

        ranks = torch_tpu_module().distributed.topology_aware_mesh(mesh_shape=tuple(sizes))
        return DeviceMesh("tpu", ranks, mesh_dim_names=names)

    def info(self) -> DeviceInfo:
        tpu = torch_tpu_module()
        name = self.device_name()
        chip = tpu_chip_for_name(name)
        if chip is None:
            raise BackendError(f"unknown TPU generation {name!r}: no peak FLOP/s for MFU")
        from torch_tpu._internal.utils.hardware import get_bf16_flops_per_device  # no public equivalent

        runtime_flops = get_bf16_flops_per_device()
        flops, source = (
            (float(runtime_flops), "torch_tpu hardware table (get_bf16_flops_per_device)")
            if runtime_flops
            else (chip.bf16_flops_per_device, f"Google TPU spec table ({chip.generation})")
        )
        return DeviceInfo(
            kind="tpu",
            name=name,
            count=int(torch.accelerator.device_count()),
            memory_bytes=int(tpu.get_device_properties().total_memory),
            peak=DevicePeak(
                # MXU matmuls run in bf16 passes; MFU on TPU is quoted against the bf16 peak.
                flops_per_s={"bfloat16": flops, "float32": flops},
                memory_bytes_per_s=chip.hbm_bytes_per_s_per_device,
                source=source,
            ),
            details={"generation": chip.generation},
        )

    def synchronize(self) -> None:
        torch.accelerator.synchronize()

    def matmul_dtype(self, precision: str) -> str:
        return "bfloat16"  # the MXU runs bf16 passes at every precision

    def autocast_matmul_dtype(self, dtype: str) -> str | None:
        return "bfloat16"

    def reset_peak_memory(self) -> None:
        torch.accelerator.reset_peak_memory_stats()

    def release_cached_memory(self) -> None:
        # An XLA program's temporaries are the runtime's, not the torch allocator's: memory the
        # allocator keeps cached after an eager step (the references, an earlier trial) may be
        # what the next compiled program cannot get (a suspect of the sixth chip session's
        # RuntimeProgramAllocationFailure; docs/torchtpu.md). torch's device-generic call, after a
        # collection so that tensors only cycles still hold are freed first.
        gc.collect()
        try:
            torch.accelerator.empty_cache()
        except Exception as exc:  # unmeasured on a chip so far: a release that fails never fails a trial
            log.debug("torch.accelerator.empty_cache() on TorchTPU: %s", exc)

    def peak_memory_bytes(self) -> tuple[int | None, str]:
        return int(torch.accelerator.max_memory_allocated()), "torch.accelerator.max_memory_allocated"

    def memory_in_use_bytes(self) -> int | None:
        return int(torch.accelerator.memory_allocated())

    def compile_events(self) -> dict[str, int]:
        events = super().compile_events()
        stats = torch_tpu_module()._get_cache_stats()  # private; no public counter in 0.2.0
        events["tpu_compilations"] = int(stats.num_compilations)
        events["tpu_cache_requests"] = int(stats.num_cache_reqs)
        events["tpu_cache_hits"] = int(stats.num_cache_hits)
        return events

    def default_compile_backend(self) -> str:
        return "tpu"

    def step_tracer(self) -> Any:
        return torch_tpu_module().optimizers

    def profiler_activities(self) -> list[torch.profiler.ProfilerActivity]:
        # TorchTPU registers its device tracer as torch.profiler's PrivateUse1 activity.
        return [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.PrivateUse1]

    def profiler_config(self) -> Any:
        """TorchTPU's profiler configuration: the trace also goes to an XPlane file for XProf,
        under $TPU_TUNE_XPROF_DIR when set."""
        config = torch_tpu_module().profiler.TpuProfilerConfig
        rank = os.environ.get("RANK") if self.ranks > 1 else None
        return config(run_dir=os.environ.get(XPROF_DIR_VARIABLE), worker_rank=rank)

    @classmethod
    def launch_environment(cls, ranks: int, nnodes: int = 1) -> dict[str, str]:
        """The variables every rank of an N-rank trial shares (topology, slice-builder addresses,
        the XProf session), as TorchTPU's ``set_tpu_launch_env`` decides them in the parent; the
        parent's own environment is left as it was. TorchTPU decides each once per process, so a
        process launches groups of one size (as a study does). On `nnodes` hosts each host's
        agent asks it with ``nnodes``: TorchTPU then reads the slice from the environment
        (TPU_WORKER_HOSTNAMES, the slice's TORCH_TPU_TOPOLOGY, JOB_COMPLETION_INDEX) and decides
        this host's NODE_RANK and the slice-builder addresses of every host's devices."""
        distributed = torch_tpu_module().distributed  # imported first: its own start-up variables stay
        before = dict(os.environ)
        hosts = f" --nnodes {nnodes}" if nnodes > 1 else ""
        try:
            distributed.set_tpu_launch_env(nproc_per_node=ranks, **({"nnodes": nnodes} if nnodes > 1 else {}))
        except (RuntimeError, ValueError) as exc:  # e.g. a rank count with no TPU topology
            where = f"a host on {nnodes} hosts" if nnodes > 1 else "on this host"
            raise UserInputError(
                f"--nproc {ranks}{hosts}: TorchTPU cannot lay out {ranks} ranks {where}: {exc}"
            ) from exc
        finally:
            decided = {k: v for k, v in os.environ.items() if before.get(k) != v}
            os.environ.clear()
            os.environ.update(before)
        return decided

    @classmethod
    def worker_environment(cls, results_folder: Path) -> dict[str, str]:
        """TorchTPU's compilation cache in `results_folder`/.torchtpu_cache (made here), unless the
        user set the variable: workers inherit the user's value then."""
        if os.environ.get(COMPILATION_CACHE_VARIABLE):
            return {}
        cache = Path(results_folder).absolute() / COMPILATION_CACHE_FOLDER  # the same for a worker elsewhere
        cache.mkdir(parents=True, exist_ok=True)
        return {COMPILATION_CACHE_VARIABLE: str(cache)}

    @classmethod
    def host_node_rank(cls, ranks: int, nnodes: int) -> int | None:
        """TorchTPU's NODE_RANK for this host (``set_tpu_launch_env`` derives it from the chips'
        coordinates in the slice topology, or JOB_COMPLETION_INDEX; an operator may set it): the
        order of the slice-builder addresses, which global ranks must follow."""
        decided = cls.launch_environment(ranks, nnodes)
        value = decided.get(NODE_RANK_VARIABLE, os.environ.get(NODE_RANK_VARIABLE))
        return int(value) if value not in (None, "") else None

    def estimate_kernels(self) -> contextlib.AbstractContextManager[Any]:
        # The math attention, which keeps the attention matrix for the backward: with it the
        # estimates of a v5e chip's measured peaks were within 14% (decoder +13.8%, GPT -9.6%), with
        # CPU's fused kernel not (GPT -16.5%): docs/torchtpu.md, "On a real chip".
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(SDPBackend.MATH)

    @classmethod
    def eager_modes(cls) -> tuple[str, ...]:
        return tuple(EAGER_MODE_ENUM)

    @classmethod
    def eager_mode_environment(cls, mode: str) -> dict[str, str]:
        # Read once, at start-up: a trial with them needs a fresh process.
        return dict(EAGER_MODE_ENV.get(mode, {}))

    @contextlib.contextmanager
    def eager_mode(self, mode: str | None) -> Iterator[None]:
        # In-process switch for a block (the study measures in a fresh process with
        # EAGER_MODE_ENV set, the faithful way); set_eager_mode restores the previous mode.
        tpu = torch_tpu_module()
        with tpu.set_eager_mode(getattr(tpu.EagerMode, EAGER_MODE_ENUM[mode or "strict"])):
            yield


def torch_tpu_module() -> Any:
    """``torch.tpu``, importing torch_tpu first (it installs ``torch.tpu`` also where the
    autoload is off)."""
    import torch_tpu  # noqa: F401

    return torch.tpu  # type: ignore[attr-defined]  # torch.tpu exists only with torch_tpu installed
