"""One compile of the planner as one object (`CompileJob`: model, target, step, point), from the
options (`StepSettings.of`) through `PlanProblem.job` and a compile worker to `program.compile_step`,
and into a plan's study record (`StepSettings.record`): a compile option is one field of `StepSettings`."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from tpu_tuner.core.errors import TpuTuneError, first_line
from tpu_tuner.planner.compiler.xla_flags import xla_flags_text
from tpu_tuner.planner.plans.plan_space import PlanPoint
from tpu_tuner.planner.topology import MEGACORE

if TYPE_CHECKING:  # a type only: a compile worker, which unpickles jobs, needs none of the options' imports
    from tpu_tuner.planner.plans.plan_options import PlanOptions


@dataclass(frozen=True)
class CompileModel:
    """The model compiled: its source (a file, a shape, an ``hf:`` source) and preset, cut to
    `blocks` repeated blocks, run as one scan over stacked weights or unrolled."""

    source: str
    preset: str | None
    d_model: int  # the residual stream's width: what names each weight's placement (layouts.placements)
    blocks: int
    scan: bool = False


@dataclass(frozen=True)
class CompileTarget:
    """The TPU slice compiled for, by the name get_topology_desc takes (e.g. "v5p:16x16x32"), and
    how many of them DCN joins (multi-slice)."""

    topology: str
    slices: int = 1

    def devices(self) -> Any:
        """The target's devices (`topology_devices`)."""
        return topology_devices(self.topology, self.slices)


# Recorded by every plan study since the first, at its default too: dropping it there would rename those studies.
_ALWAYS_RECORDED = ("first_moment_dtype",)


@dataclass(frozen=True)
class StepSettings:
    """The training step every point of a plan shares, by MaxText's names. A plan's study record
    holds a field without a default always, one with a default where it differs: a field added
    with a default keeps earlier plans' records, and the studies named from them, as they were."""

    global_batch: int
    seq_len: int
    first_moment_dtype: str = "float32"  # AdamW's first moment (MaxText's mu_dtype)
    weight_dtype: str = "float32"  # the master weights' storage (MaxText's weight_dtype)
    optimizer: str = "adamw"  # MaxText's opt_type: "adamw" or "sgd" (optimizer.py)
    quantization: str | None = None  # the blocks' matmuls: None (bf16), "int8" or "fp8"
    vocab_tiling: int = 1  # the loss's logits a 1 / vocab_tiling of the tokens at a time (vocab_tiling.py)
    xla_flags: tuple[tuple[str, Any], ...] = ()  # added to every compile's options (--xla-flags)
    flash_block: int | None = None  # the flash kernel's blocks (None: its default, as calibrated)

    def record(self) -> dict[str, Any]:
        """The fields a plan's study record holds (see the class), as JSON stores them."""
        defaults = {f.name: f.default for f in fields(self)}
        return {
            name: xla_flags_text(value) if name == "xla_flags" else value
            for name, value in asdict(self).items()
            if value != defaults[name] or name in _ALWAYS_RECORDED
        }

    @classmethod
    def of(cls, options: PlanOptions, global_batch: int, seq_len: int) -> StepSettings:
        """The plan's step: each field from the options' step or compile section's field of its name
        (a new option needs no line here), the batch and sequence as the model resolved them."""
        names = {f.name for f in fields(cls)}
        sections = (options.step, options.compile)
        given = {f.name: getattr(s, f.name) for s in sections for f in fields(s) if f.name in names}
        resolved = {"global_batch": global_batch, "seq_len": seq_len, "first_moment_dtype": options.step.moment_dtype}
        return cls(**{**given, **resolved})


@dataclass(frozen=True)
class CompileJob:
    """One program to compile: the model on the target, the plan's step at one point; `fast`
    compiles with the least optimisation effort, `export_to` names a file that takes the step
    serialized by `jax.export` (program.compile_step)."""

    model: CompileModel
    target: CompileTarget
    step: StepSettings
    point: PlanPoint
    fast: bool = False
    export_to: str | None = None


def topology_config(jax_name: str) -> dict[str, Any]:
    """Extra arguments of get_topology_desc for `jax_name`: megacore where the runtime uses it
    (topology.MEGACORE says why), and the host of a slice smaller than libtpu's default 2x2 host."""
    generation, _, shape = jax_name.partition(":")
    config: dict[str, Any] = {"chip_config_name": "megacore"} if generation in MEGACORE else {}
    dims = tuple(int(d) for d in shape.split("x")) if shape else ()
    if len(dims) == 2 and dims[0] * dims[1] < 4:  # v5e-1, v6e-1: a one-chip machine is its whole slice
        config["chips_per_host_bounds"] = (*dims, 1)
    return config


@lru_cache(maxsize=4)
def topology_devices(jax_name: str, slices: int = 1) -> Any:
    """The devices of a TPU topology, for compile-only use (needs libtpu); v4 as megacore. With
    `slices` > 1, that many copies of the slice, each device with its `slice_index` (MaxText's
    ahead-of-time compile asks for multi-slice the same way).

    Both processes build them, each once: the plan's for the compiler's device count and HBM limit
    (problem.build_problem), every compile worker for its jobs: a device is a handle into its
    process's own libtpu client and cannot cross the process boundary."""
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        from jax.experimental import topologies

        extra: dict[str, Any] = {"num_slices": slices} if slices > 1 else {}
        return topologies.get_topology_desc(
            topology_name=jax_name, platform="tpu", **topology_config(jax_name), **extra
        ).devices
    except ImportError as exc:
        raise TpuTuneError("the planner needs JAX: pip install 'tpu-tune[plan]'") from exc
    except Exception as exc:
        raise TpuTuneError(
            f"cannot build the TPU topology {jax_name}: {first_line(exc)} "
            "(the planner needs libtpu: pip install 'tpu-tune[plan]')"
        ) from exc


__all__ = ["CompileJob", "CompileModel", "CompileTarget", "StepSettings", "topology_config", "topology_devices"]
