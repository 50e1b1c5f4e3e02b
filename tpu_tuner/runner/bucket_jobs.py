"""Measurements for bucketing, run inside the isolated trial worker (see runner/jobs.py).

Both jobs build the model once and wrap it with torch.compile(dynamic=False), as TorchTPU always
compiles: every new padded length is a fresh compile, and a length seen before is a cache hit.
Compile caches that outlive the process (inductor's FX-graph and AOTAutograd caches) are turned
off, or a strategy would inherit another's compiles and look cheaper than it is.

What a new shape costs is measured, not assumed (`probe_shapes`): the first step at the length
minus a warm step, with the backend's compile counters read around the first step. On TorchTPU
they are the device's (``torch.tpu._get_cache_stats()``: compilations, cache requests and hits,
`devices/torchtpu.py`), so a first step that reused a compiled program is counted as a cache
hit costing no compile; elsewhere dynamo's graph counter says whether the step compiled.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tpu_tuner.devices import Backend
from tpu_tuner.execution.step import result_read, run_user_step, step_function
from tpu_tuner.execution.timer import StepClock, compile_delta
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.buckets.bucket_cost import ShapeCost, compile_counter
from tpu_tuner.model.workloads.summary import device_name_or_kind
from tpu_tuner.model.workloads.workload import Workload, move_to
from tpu_tuner.runner.requests import BucketCosts, BucketCostsRequest, BucketPoint, BucketReplay, BucketReplayRequest

log = logging.getLogger(__name__)

STEADY_STEPS = 5  # steady steps timed per length (median)


def probe_shapes(
    steps: dict[int, Callable[[], Any]],
    timed: Callable[[Callable[[], Any]], float],
    events: Callable[[], dict[str, int]],
    steady_steps: int = STEADY_STEPS,
) -> list[ShapeCost]:
    """What each length of `steps` (length -> its step, built) costs as a new shape.

    Each length's first step is timed with the compile counters (`events`) read around it; then
    `steady_steps` rounds time every length once, round-robin, as a bucketed stream alternates
    shapes (timed back to back at one length they read faster than a replayed stream:
    docs/bucketing.md). A warm step that still compiled is counted (`warm_compilations`)."""
    first: dict[int, float] = {}
    deltas: dict[int, dict[str, int]] = {}
    for length, step in steps.items():
        before = events()
        first[length] = timed(step)
        deltas[length] = compile_delta(before, events())
    warm: dict[int, list[float]] = {length: [] for length in steps}
    recompiled = dict.fromkeys(steps, 0)
    for _ in range(steady_steps):
        for length, step in steps.items():
            before = events()
            warm[length].append(timed(step))
            delta = compile_delta(before, events())
            if (name := compile_counter(delta)) is not None:
                recompiled[length] += delta[name]
    shapes = [
        ShapeCost.measured(length, first[length], statistics.median(warm[length]), deltas[length], recompiled[length])
        for length in steps
    ]
    for shape in shapes:
        if shape.warm_compilations:
            log.warning(
                "length %d: the warm steps compiled %d more times, so its compile cost is a lower bound",
                shape.length,
                shape.warm_compilations,
            )
    return shapes


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
        # A step is timed to its result (execution/timer.py): where the device runs behind the host
        # (TorchTPU), a sync can return with the step's work still deferred.
        self.read = result_read(self.model, workload.is_training)
        self._steps: dict[int, Callable[[], Any]] = {}

    def step_at(self, length: int) -> Callable[[], Any]:
        """The step on a batch padded to `length` (its attention mask, if any, marks no padding:
        the padded shape, not the mask, decides the work of a dense step). Building it makes and
        moves the batch, so callers build it before timing the first step."""
        if length not in self._steps:
            inputs, target = self.workload.split_batch(self.workload.batch(self.batch_size, length))
            inputs, target = move_to(inputs, self.backend.device), move_to(target, self.backend.device)
            step = step_function(
                self.workload, self.backend, self.candidate, self.forward, self.loss, self.optimizer, inputs, target
            )
            what = f"a step at length {length}"
            self._steps[length] = lambda: run_user_step(step, self.workload, what)
        return self._steps[length]

    def probe(self, lengths: Sequence[int], steady_steps: int = STEADY_STEPS) -> list[ShapeCost]:
        """`probe_shapes` over `lengths` on this runner's backend."""
        steps = {int(length): self.step_at(int(length)) for length in lengths}
        return probe_shapes(steps, self.timed, self.backend.compile_events, steady_steps)

    def timed(self, step: Callable[[], Any]) -> float:
        """Seconds of one call of `step`, ended by a host read of its result where the device runs
        behind the host (a new shape's compile included, for its first call)."""
        return StepClock(step, self.read, self.backend).seconds()

    def stream_seconds(self, lengths: Sequence[int]) -> float:
        """Seconds of the steps at `lengths` (each built and compiled) run back to back as a data
        pipeline sends them, ended by one read of the last one's result: the replay's whole stream
        is timed to its result, with no sync or read between steps that the real run would not have."""
        steps = [self.step_at(int(length)) for length in lengths]

        def stream() -> Any:
            output = None
            for step in steps:
                output = step()  # only the last output is kept: an inference step's can be large
            return output

        return StepClock(stream, self.read, self.backend).seconds() if steps else 0.0


def run_bucket_costs(state: Any, request: BucketCostsRequest) -> BucketCosts:
    """Compile cost of a new shape and steady step time at each of the request's lengths.

    A throwaway compile at its `warmup_length` first pays the once-per-process costs
    (dynamo and backend start-up, the optimizer's state) that a new shape in a running job does
    not pay again."""
    runner = ShapeRunner(state.workload, state.backend, Candidate.from_dict(request.candidate), request.batch_size)
    runner.probe([int(request.warmup_length)])
    shapes = runner.probe([int(length) for length in request.lengths])
    points: list[BucketPoint] = [
        BucketPoint(shape.length, shape.compile_seconds, shape.warm_seconds, shape=shape) for shape in shapes
    ]
    return BucketCosts(points, device_name=device_name_or_kind(state.backend))


def run_bucket_replay(state: Any, request: BucketReplayRequest) -> BucketReplay:
    """Replay the request's `stream` (one length per step) under its `bounds`.

    Each bound the stream needs is measured on first use as `probe_shapes` measures a length;
    every step of the stream is then timed at its padded length."""
    runner = ShapeRunner(state.workload, state.backend, Candidate.from_dict(request.candidate), request.batch_size)
    runner.probe([int(request.warmup_length)])
    bounds = sorted(int(b) for b in request.bounds)
    padded = [bounds[_bucket_index(bounds, int(length))] for length in request.stream]
    shapes = [runner.probe([bound])[0] for bound in dict.fromkeys(padded)]  # first-use order
    step_seconds = runner.stream_seconds(padded)
    return BucketReplay(
        compile_seconds={s.length: s.compile_seconds for s in shapes},
        step_seconds=step_seconds,
        steps=len(padded),
        shapes=shapes,
    )


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
