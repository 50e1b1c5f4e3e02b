"""The CUDA backend: NVIDIA GPUs, with datasheet peaks (or a measured probe for unknown GPUs)."""

from __future__ import annotations

import os

import torch

from tpu_tuner.core.hardware import GIGA, TERA, gpu_spec_for_name
from tpu_tuner.devices.base import Backend, DeviceInfo, DevicePeak
from tpu_tuner.devices.roofline import cached_probe


class CudaBackend(Backend):
    """Runs on the first CUDA device."""

    kind = "cuda"
    label = "CUDA"
    process_group_backend = "nccl"  # NCCL: one GPU per rank
    memory_bounds_trials = True
    runs_ahead = True  # kernels queue on a stream

    @classmethod
    def rank_environment(cls, rank: int) -> dict[str, str]:
        """Each rank sees one GPU, its own, as cuda:0."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        devices = visible.split(",") if visible else None
        return {"CUDA_VISIBLE_DEVICES": devices[rank] if devices and rank < len(devices) else str(rank)}

    @classmethod
    def is_available(cls) -> bool:
        return torch.cuda.is_available()

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            return f"torch {torch.__version__} is built without CUDA"
        return None if torch.cuda.is_available() else "torch sees no CUDA device"

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device())

    def device_name(self) -> str:
        return str(torch.cuda.get_device_name(self.device))

    def describe(self) -> str:
        return f"{self.device_name()} x {torch.cuda.device_count()}"

    def available_memory_bytes(self, total: int | None) -> int | None:
        free, _ = torch.cuda.mem_get_info()  # free memory on the device, now
        return int(free)

    def info(self) -> DeviceInfo:
        name = self.device_name()
        spec = gpu_spec_for_name(name)
        probe = None
        if spec is not None:
            peak = DevicePeak(
                flops_per_s={dtype: tflops * TERA for dtype, tflops in spec.tflops.items()},
                memory_bytes_per_s=spec.hbm_gbytes_per_s * GIGA,
                source=f"NVIDIA datasheet, {spec.name} (dense)",
            )
        else:
            probe, _ = cached_probe(self.device, self.synchronize)
            peak = probe.to_peak(f"{name} is not in the datasheet table; " + probe.describe())
        properties = torch.cuda.get_device_properties(self.device)
        return DeviceInfo(
            kind="cuda",
            name=name,
            count=torch.cuda.device_count(),
            memory_bytes=int(properties.total_memory),
            peak=peak,
            details={"capability": f"{properties.major}.{properties.minor}"},
            probe=probe,
        )

    def remeasure_peak(self) -> DevicePeak | None:
        # A datasheet peak is not re-measured (a step beating it has a wrong FLOP count); a GPU
        # missing from the table has a measured probe, which may have been taken under load.
        if gpu_spec_for_name(self.device_name()) is not None:
            return None
        probe, _ = cached_probe(self.device, self.synchronize, force=True)
        return probe.to_peak(probe.describe() + " (re-measured: a step beat the cached peak)")

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def matmul_dtype(self, precision: str) -> str:
        # "high" and "medium" let fp32 matmuls use TF32 tensor cores.
        return "tf32" if precision != "highest" else "float32"

    def reset_peak_memory(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_memory_bytes(self) -> tuple[int | None, str]:
        return int(torch.cuda.max_memory_allocated(self.device)), "torch.cuda.max_memory_allocated"

    def memory_in_use_bytes(self) -> int | None:
        return int(torch.cuda.memory_allocated(self.device))

    def profiler_activities(self) -> list[torch.profiler.ProfilerActivity]:
        return [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
