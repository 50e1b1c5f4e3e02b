"""The device abstraction: the only code that knows which device a workload runs on."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from tpu_tuner.devices.peak import DevicePeak
from tpu_tuner.devices.roofline_probe import RooflineProbe
from tpu_tuner.metrics.mfu import PeakChoice, checked_peak, fastest_peak


@dataclass(frozen=True)
class DeviceInfo:
    """What a profile says about the device it ran on."""

    kind: str  # the backend's registered name
    name: str
    count: int
    memory_bytes: int | None
    peak: DevicePeak
    details: dict[str, Any] = field(default_factory=dict)
    # The measured probe (CPUs, unknown GPUs): rates per dtype with their spread, whether
    # "medium" changes the numerics, the per-op dispatch cost. None for datasheet peaks.
    probe: RooflineProbe | None = None
    # Seconds this process spent on what a later process reads from a cache (the CPU's roofline
    # probe, measured once per machine): not a cost each setting pays (tuning/run/fitted_clock.py).
    once_s: float = 0.0


class Backend(ABC):
    """A device backend: detects its device, reports its facts (peaks, memory, compile counters)
    and offers the primitives the knobs combine with a candidate (`tpu_tuner.knobs`); it never
    sees a candidate itself."""

    kind: ClassVar[str]  # its registered name: the torch device type for the built-ins
    label: ClassVar[str]  # what runs the device, in words ("TorchTPU")
    # The torch.distributed backend the ranks of a sharded trial join (gloo on CPU tensors).
    process_group_backend: ClassVar[str] = "gloo"
    one_device_per_rank: ClassVar[bool] = True  # False where ranks share the device (a CPU's cores)
    # Whether the measured peak is of memory of the device's own that a step fills (its
    # allocator's), so that a study's memory limit defaults to the device's memory.
    memory_bounds_trials: ClassVar[bool] = False
    # Whether the host can queue steps ahead of the device (an asynchronous stream, TorchTPU's
    # dispatch and DeferAndFuse): steps are then timed in blocks run back to back, each ended by a
    # read of its result (execution/timer.py); elsewhere a block is one step.
    runs_ahead: ClassVar[bool] = False
    # Where the memory estimate's fake tensors go when they cannot be placed on the device itself
    # (TorchTPU's: "Couldn't swap Embedding.weight"): the same shapes and dtypes, so the same bytes.
    fake_tensor_device: ClassVar[str | None] = None
    # The ranks of the process group this process times steps with (set by a rank of a sharded
    # trial, `runner/rank_job.py`): its steps start and end together and report the slowest.
    ranks: int = 1

    @classmethod
    @abstractmethod
    def is_available(cls) -> bool:
        """Whether this backend's device is present in this process."""

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None where this backend can run here, else why not, in words (`tpu-tune devices`)."""
        return None if cls.is_available() else f"no {cls.kind} device here"

    @classmethod
    def device_on_host(cls) -> str | None:
        """The device this host has where the backend can tell without running ("TPU chips"), so
        that auto-detection refuses to fall back to the CPU when it cannot run; None by default."""
        return None

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """The torch device models and batches move to."""

    @abstractmethod
    def info(self) -> DeviceInfo:
        """Device name, count, memory and peak FLOP/s."""

    def device_name(self) -> str:
        """The device's name, measuring nothing where the backend can (`info` may probe its peak)."""
        return self.info().name

    def describe(self) -> str:
        """What `tpu-tune devices` says the backend runs on."""
        return f"{self.device_name()} x {self.info().count}"

    def available_memory_bytes(self, total: int | None) -> int | None:
        """Memory a step may use now, given the device's `total` (the total where nothing says more)."""
        return total

    @classmethod
    def device_mesh(cls, sizes: tuple[int, ...], names: tuple[str, ...]) -> Any:
        """A DeviceMesh of `sizes` named `names` over the default process group's ranks."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        from torch.distributed.device_mesh import init_device_mesh

        with unset_fake_temporarily():  # its rank map is real data, under a memory estimate's fake mode too
            return init_device_mesh(cls.kind, sizes, mesh_dim_names=names)

    @abstractmethod
    def synchronize(self) -> None:
        """Block until queued device work is done, so that a timer sees its end."""

    @abstractmethod
    def matmul_dtype(self, precision: str) -> str:
        """The dtype float32 matmuls run in under ``torch.set_float32_matmul_precision(precision)``.
        MFU never depends on it (it divides by the fastest dtype's peak, docs/mfu.md); reports
        name it beside the per-dtype utilisation."""

    def autocast_matmul_dtype(self, dtype: str) -> str | None:
        """The dtype matmuls run in under ``torch.autocast`` to `dtype`; None where autocast to
        it leaves them as the matmul precision decides."""
        return dtype

    def remeasure_peak(self) -> DevicePeak | None:
        """Measure the peak again because a step beat it; None where it is a published figure."""
        return None

    def mfu_peak(self, flops_per_s: dict[str, float], achieved: float, remeasure: bool = True) -> PeakChoice:
        """The peak an MFU figure divides by: the fastest dtype of `flops_per_s`, re-measured
        (unless `remeasure` is False: it was already) or else raised to the achieved rate when
        the step beats it."""
        peak, dtype = fastest_peak(flops_per_s)
        if not remeasure:
            return checked_peak(achieved, peak, dtype)

        def measure_again() -> tuple[float, str] | None:
            fresh = self.remeasure_peak()
            return fresh.fastest() if fresh is not None else None

        return checked_peak(achieved, peak, dtype, measure_again)

    def dispatch_seconds_per_op(self) -> float | None:
        """What one tiny op costs from Python to done (the per-op overhead floor), measured
        now; backends with a cached probe return the cached figure."""
        from tpu_tuner.devices.roofline import dispatch_seconds_per_op

        try:
            return dispatch_seconds_per_op(self.device, self.synchronize)
        except Exception:
            return None

    def reset_peak_memory(self) -> None:
        """Start a new peak-memory window; nothing to reset where the backend tracks no peak."""
        return None

    def release_cached_memory(self) -> None:
        """Hand back what the framework's allocator keeps cached of freed tensors, before a trial
        builds its step; nothing by default (a CPU's allocator returns it, and CUDA's compiled kernels
        allocate from the same cache, so nothing they need is held away from them)."""
        return None

    @classmethod
    def worker_environment(cls, results_folder: Path) -> dict[str, str]:
        """Start-up variables every worker and rank of a run in `results_folder` gets, the same
        for every job (so they never decide a worker restart): TorchTPU's compilation cache kept
        in the folder, shared by its runs; none by default. A variable the user set is left to
        the user."""
        return {}

    # --- a rank of a sharded step: every rank must take the same decisions --------------------

    @classmethod
    def launch_environment(cls, ranks: int, nnodes: int = 1) -> dict[str, str]:
        """Start-up variables every rank of a trial of `ranks` ranks a host on `nnodes` hosts
        shares, decided once by each host's parent (TorchTPU's topology and slice addresses);
        none elsewhere."""
        return {}

    @classmethod
    def host_node_rank(cls, ranks: int, nnodes: int) -> int | None:
        """This host's node rank in a multi-host slice where the device decides it (TorchTPU:
        from the chips' coordinates or the JobSet's index); None where any order will do."""
        return None

    @classmethod
    def rank_environment(cls, rank: int) -> dict[str, str]:
        """Start-up variables of rank `rank` of a sharded trial (a device of its own); none where
        ranks share the device (a CPU's cores)."""
        return {}

    def synchronize_ranks(self) -> None:
        """`synchronize`, then (as a rank of a sharded step) wait for every rank: a step timed
        between two of these lasts as long as the slowest rank's."""
        self.synchronize()
        if self.ranks > 1:
            import torch.distributed as dist

            dist.barrier()

    def max_over_ranks(self, value: float) -> float:
        """The largest `value` any rank holds (the value itself in a single process): timings and
        memory peaks are the slowest / largest rank's, and decisions taken from them (how many
        steps to time) are the same on every rank, so their collectives stay in step."""
        if self.ranks == 1:
            return value
        import torch.distributed as dist

        tensor = torch.tensor([float(value)], dtype=torch.float64, device=self.collective_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return float(tensor.item())

    def mean_over_ranks(self, tensor: torch.Tensor) -> torch.Tensor:
        """The mean of `tensor` over the ranks (itself in a single process): each rank's loss is
        its slice's, and the slices are equal, so the mean is the global batch's loss."""
        if self.ranks == 1:
            return tensor
        import torch.distributed as dist

        total = tensor.detach().clone().to(self.collective_device())
        dist.all_reduce(total)
        return (total / self.ranks).to(tensor.device)

    def peak_of_ranks(self, flops_per_s: dict[str, float]) -> dict[str, float]:
        """The peak FLOP/s of the devices the ranks run on, given one device's: each rank has a
        device of its own, so N ranks have N times its peak (the MFU convention over a slice)."""
        return {dtype: rate * self.ranks for dtype, rate in flops_per_s.items()}

    def collective_device(self) -> torch.device:
        """Where tensors for the process group's collectives live (gloo: the CPU)."""
        return torch.device("cpu") if self.process_group_backend == "gloo" else self.device

    @abstractmethod
    def peak_memory_bytes(self) -> tuple[int | None, str]:
        """Peak memory since the last reset, and how it was measured."""

    def estimate_kernels(self) -> contextlib.AbstractContextManager[Any]:
        """A context for the memory estimate's fake step that picks the kernels the device runs
        where they decide what a step keeps (the attention's); nothing by default."""
        return contextlib.nullcontext()

    def memory_in_use_bytes(self) -> int | None:
        """The memory this process holds now, in `peak_memory_bytes`'s terms (an estimated step's
        peak adds to it: execution/memory_estimate.py); None where the backend cannot tell."""
        return None

    def free_heap_bytes(self) -> int | None:
        """Bytes a malloc heap holds freed and resident, where the step's tensors come from one
        that keeps what it frees (glibc on a CPU: execution/heap_model.py); None elsewhere."""
        return None

    def compile_events(self) -> dict[str, int]:
        """Cumulative compilation counters of this process (differences give compiles).

        The base counts torch.compile graph compilations; backends add their own caches.
        """
        from torch._dynamo.utils import counters

        return {"torch_compile_graphs": int(counters["stats"].get("unique_graphs", 0))}

    def fresh_compile_state(self, graphs: int = 64) -> None:
        """Forget this process's earlier torch.compile frames and allow `graphs` cache entries
        per function. A worker measures trial after trial: each builds a new model whose
        forward is the same code object, and once dynamo's per-function recompile limit (8)
        is spent it silently runs that forward eager: a trial labelled inductor would measure
        eager (docs/knobs.md, "Compiler options"). Compiled artefacts on disk (inductor's FX
        graph cache) are kept."""
        import torch._dynamo

        torch._dynamo.reset()
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(graphs, getattr(torch._dynamo.config, name)))

    def default_compile_backend(self) -> str:
        """The torch.compile backend that suits this device."""
        return "inductor"

    def step_tracer(self) -> Any:
        """The device's whole-step tracer, a module with ``SingleTraceTrainer`` and ``AdamW`` (TorchTPU's
        ``torch.tpu.optimizers``: execution/traced_step.py), or None where the device has none."""
        return None

    def profiler_activities(self) -> list[torch.profiler.ProfilerActivity]:
        return [torch.profiler.ProfilerActivity.CPU]

    def profiler_config(self) -> Any:
        """torch.profiler's ``experimental_config`` for this device (None: torch's default)."""
        return None

    # --- the device's side of the knobs (tpu_tuner.knobs ask these) ---------------------------

    @classmethod
    def eager_modes(cls) -> tuple[str, ...]:
        """Eager execution modes this device offers, the default first; () for plain eager only."""
        return ()

    @classmethod
    def eager_mode_environment(cls, mode: str) -> dict[str, str]:
        """Variables that select eager `mode` at process start-up (read once, before torch is
        imported); the backend owns them, so the study and the tuned config ask it."""
        return {}

    def eager_mode(self, mode: str | None) -> contextlib.AbstractContextManager[Any]:
        """A context running in eager `mode` (None: the default) where it can be switched in-process."""
        return contextlib.nullcontext()
