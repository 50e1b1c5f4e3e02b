"""What the planner's tests of a tiny decoder share: the model, its matrix weights, the marker
that skips them without the planner extra, the environment a compiling subprocess needs, and the
search tests' scripted compiler (`ShapedPool`) with its problem and space (tests/test_planner_search.py,
test_old_studies.py, test_compile_request.py)."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tpu_tuner.model.workloads.loader import load_workload
from tpu_tuner.model.workloads.structure import Dims, read_dims
from tpu_tuner.planner.compiler.compile_request import StepSettings
from tpu_tuner.planner.compiler.compiled_step import CompiledStep
from tpu_tuner.planner.plans.plan import PlanProblem
from tpu_tuner.planner.plans.plan_space import PlanSpace
from tpu_tuner.planner.prediction.predict import CostModel
from tpu_tuner.planner.topology import parse_topology

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"  # tests/helpers/tiny_planner.py

needs_planner = pytest.mark.skipif(
    importlib.util.find_spec("torchax") is None or importlib.util.find_spec("libtpu") is None,
    reason="the planner extra is not installed: pip install -e '.[plan]'",
)
TINY = "decoder:vocab=256,d_model=128,layers=2,heads=4,mlp=256"
# The tiny decoder's matrix weights: embedding + head (256 x 128 each) and, in each of 2 blocks,
# q/k/v/o (128 x 128) and gate/up/down (128 x 256).
TINY_MATRIX_PARAMETERS = 2 * 256 * 128 + 2 * (4 * 128 * 128 + 3 * 128 * 256)


def run_planner_python(code: str, timeout: int = 900) -> str:
    """Planner code in a fresh interpreter (importing torchax registers a "jax" device with torch
    that breaks torch.compile later in the same process, so tests keep it out of pytest's); the last
    line of its output, the script's JSON by convention. Its error output where it fails."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=planner_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def planner_env() -> dict[str, str]:
    """The environment of a subprocess that loads libtpu beside this one, with the repository importable."""
    root = str(Path(__file__).resolve().parents[2])  # the repository
    return {
        **os.environ,
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
    }


class ShapedPool:
    """Answers every compile from the point: peak memory grows with the per-device batch and
    what the policy keeps; FLOPs fall with the tensor size (so the objective has a shape)."""

    workers = 2

    def __init__(self) -> None:
        self.compiled: list = []

    def compile(self, jobs, done=None):
        from tpu_tuner.planner.compiler.loop_costs import LoopIteration

        results = {}
        for job in jobs:
            self.compiled.append(job)
            keeps = {"full": 1.0, "minimal": 3.0, "save_qkv_proj": 1.5}.get(job.point.remat, 1.0)
            point = job.point
            batch = job.step.global_batch / point.accumulation / (point.layout.data * point.layout.fsdp)
            peak = 1e9 * batch * keeps
            micro = LoopIteration(3e9, 2e6, [], loops=1) if point.accumulation > 1 else None
            iteration = LoopIteration(1e9 / point.layout.tensor, 1e6, [], loops=2, micro_batch=micro)
            step = CompiledStep(2e9, 2e6, peak / 2, 0.0, peak / 2, 0.0, [], 1.0, loop_iteration=iteration)
            results[job] = step
            if done:
                done(job, step)
        return results


def planner_problem(
    dims: Dims,
    *,
    topology: str = "v5p:2x2x2",
    devices: int = 8,
    hbm_gib: float = 6.0,
    step: StepSettings | None = None,
    source: str = "decoder",
    workload: str = "decoder",
    preset: str | None = None,
    fast: bool = True,
) -> PlanProblem:
    """A plan's problem for the tests' scripted compilers: a model of `dims` on `topology` compiled
    for `devices` devices of `hbm_gib` GiB, a step of batch 16 x 128 unless `step` says, with fixed
    parameter and FLOP counts (3.1M parameters, 1e12 model FLOPs) and the default cost model."""
    return PlanProblem(
        source=source,
        workload=workload,
        preset=preset,
        topology=parse_topology(topology).as_compiled(devices, int(hbm_gib * 2**30)),
        step=step or StepSettings(16, 128),
        dims=dims,
        gated=True,
        matmul_parameters=3_000_000,
        parameters=3_100_000,
        model_flops=1e12,
        attention="full",
        fast=fast,
        cost_model=CostModel(),
        placements={},
    )


@functools.cache
def tiny_llama_dims() -> Dims:
    """The planner's reading of examples/llama.py's tiny preset (built on the meta device; read once:
    loading the example costs most of a planner test's time)."""
    workload = load_workload(EXAMPLES / "llama.py")
    with torch.device("meta"):
        return read_dims(workload.model_for_preset("tiny"))


def tiny_llama_problem(hbm_gib: float = 6.0, fast: bool = True, seq_len: int = 128) -> PlanProblem:
    """examples/llama.py's tiny preset planned for v5p:2x2x2 with `hbm_gib` GiB a device, batch 16 x
    `seq_len`: the problem the search tests hand a `ShapedPool`."""
    return planner_problem(
        tiny_llama_dims(),
        hbm_gib=hbm_gib,
        step=StepSettings(16, seq_len),
        source=str(EXAMPLES / "llama.py"),
        workload="llama",
        preset="tiny",
        fast=fast,
    )


# A small joint space of the search tests: tensor, context, data, remat and micro-batch axes.
SEARCH_SPACE = PlanSpace(
    tensors=(1, 2, 4, 8),
    contexts=(1, 2),
    datas=(1, 2),
    remats=("full", "minimal", "save_qkv_proj"),
    accumulations=(1, 2),
)
