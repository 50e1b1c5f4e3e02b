"""Measurements for bucketing, run inside the isolated trial worker (see runner/jobs.py).

Both jobs build the model once and wrap it with torch.compile(dynamic=False), as TorchTPU always
compiles: every new padded length is a fresh compile, and a length seen before is a cache hit.
Compile caches that outlive the process (inductor's FX-graph and AOTAutograd caches) are turned
off, or a strategy would inherit another's compiles and look cheaper than it is.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from tpu_tuner.devices import Backend
from tpu_tuner.execution.step import run_user_step, step_function
from tpu_tuner.execution.timer import timed_call
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.workload import Workload, move_to
from tpu_tuner.runner.requests import BucketCosts, BucketCostsRequest, BucketPoint, BucketReplay, BucketReplayRequest

STEADY_STEPS = 5  # steady steps timed per length (median)


class ShapeRunner:
    """One model, compiled once with static shapes, stepped at any padded length."""

    def __init__(self, workload: Workload, backend: Backend, candidate: Candidate, batch_size: int | None) -> None:
        _fresh_compile_state()
        torch.manual_seed(0)
        self.workload, self.backend, self.candidate = workload, backend, candidate
        self.batch_size = batch_size or workload.batch_size
        self.model = workload.build_model().to(backend.device)
        self.model.train(workload.is_training)
        self.optimizer = workload.optimizer_for(self.model)
        self.forward = candidate.wrap_forward(self.model, backend, static_shapes=True)
        self.loss = (
            None
            if workload.loss_fn is None
            else candidate.training_loss(self.model, workload.loss_fn, self.forward, backend, static_shapes=True)
        )
        self._steps: dict[int, Callable[[], Any]] = {}

    def step_at(self, length: int) -> Callable[[], Any]:
        """The step on a batch padded to `length` (its attention mask, if any, marks no padding:
        the padded shape, not the mask, decides the work of a dense step)."""
        if length not in self._steps:
            inputs, target = self.workload.split_batch(self.workload.batch(self.batch_size, length))
            inputs, target = move_to(inputs, self.backend.device), move_to(target, self.backend.device)
            self._steps[length] = step_function(
                self.workload, self.backend, self.candidate, self.forward, self.loss, self.optimizer, inputs, target
            )
        return self._steps[length]

    def first_call(self, length: int) -> float:
        """Seconds of the first call at `length`, including its compile."""
        self.backend.synchronize()
        start = time.perf_counter()
        run_user_step(self.step_at(length), self.workload, f"a step at length {length}")
        self.backend.synchronize()
        return time.perf_counter() - start

    def first_and_steady(self, length: int) -> tuple[float, float]:
        """(seconds of the first call at `length`, including its compile; median steady step)."""
        first = self.first_call(length)
        steady = statistics.median(timed_call(self.step_at(length), self.backend) for _ in range(STEADY_STEPS))
        return first, steady


def run_bucket_costs(state: Any, request: BucketCostsRequest) -> BucketCosts:
    """Compile cost of a new shape and steady step time at each of the request's lengths.

    A throwaway compile at its `warmup_length` first pays the once-per-process costs
    (dynamo and backend start-up) that a new shape in a running job does not pay again. Steady
    steps are timed round-robin over the lengths, as a bucketed stream alternates shapes: timed
    back to back at one length they read faster than a replayed stream (docs/bucketing.md)."""
    runner = ShapeRunner(state.workload, state.backend, Candidate.from_dict(request.candidate), request.batch_size)
    runner.first_and_steady(int(request.warmup_length))
    lengths = [int(length) for length in request.lengths]
    first = {length: runner.first_call(length) for length in lengths}
    samples: dict[int, list[float]] = {length: [] for length in lengths}
    for _ in range(STEADY_STEPS):
        for length in lengths:
            samples[length].append(timed_call(runner.step_at(length), runner.backend))
    points = []
    for length in lengths:
        steady = statistics.median(samples[length])
        points.append(BucketPoint(length, max(0.0, first[length] - steady), steady))
    return BucketCosts(points)


def run_bucket_replay(state: Any, request: BucketReplayRequest) -> BucketReplay:
    """Replay the request's `stream` (one length per step) under its `bounds`.

    Each bound the stream needs is compiled on first use, timed as first call minus a steady step;
    every step of the stream is then timed at its padded length."""
    runner = ShapeRunner(state.workload, state.backend, Candidate.from_dict(request.candidate), request.batch_size)
    runner.first_and_steady(int(request.warmup_length))
    bounds = sorted(int(b) for b in request.bounds)
    stream = [int(length) for length in request.stream]
    padded = [bounds[_bucket_index(bounds, length)] for length in stream]
    compiles = {}
    for bound in dict.fromkeys(padded):  # first-use order
        first, steady = runner.first_and_steady(bound)
        compiles[bound] = max(0.0, first - steady)
    step_seconds = sum(timed_call(runner.step_at(bound), runner.backend) for bound in padded)
    return BucketReplay(compile_seconds=compiles, step_seconds=step_seconds, steps=len(stream))


def _bucket_index(bounds: list[int], length: int) -> int:
    for index, bound in enumerate(bounds):
        if bound >= length:
            return index
    raise ValueError(f"length {length} exceeds the largest bucket {bounds[-1]}")


def _fresh_compile_state() -> None:
    """Forget earlier compiles, allow one compiled graph per bucket, and keep compiles honest."""
    import torch._dynamo

    torch._dynamo.reset()
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 4096)
    try:
        import torch._inductor.config as inductor_config

        inductor_config.fx_graph_cache = False
        inductor_config.fx_graph_remote_cache = False
    except ImportError:  # pragma: no cover - inductor is part of torch
        pass
    import torch._functorch.config as functorch_config

    if hasattr(functorch_config, "enable_autograd_cache"):
        functorch_config.enable_autograd_cache = False
