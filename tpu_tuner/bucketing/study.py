"""`tpu-tune buckets`: measure the cost model, choose buckets, compare strategies, replay them.

1. The length sample: `--lengths FILE` or the workload's ``sample_lengths()``.
2. The cost model, measured on the present backend in an isolated worker: compile cost of a new
   shape and steady step time at a few lengths across the distribution (aligned quantiles), and
   the fit of step time against length (model/buckets/bucket_cost.py).
3. The exact optimiser (model/buckets/bucket_choice.py) under the user's limits, and the baselines, evaluated under
   the same model; the oracle bound.
4. Optionally (`--replay N`), every strategy replayed end to end through the real workload on a
   stream of N lengths drawn from the sample, each in a fresh worker (runner/bucket_jobs.py). The
   planned run has S steps; the replay runs N, so the measured total is
   (measured compiles) + S/N x (measured stream step time), said so in the report.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tpu_tuner.bucketing.heldout import HeldOut, held_out
from tpu_tuner.bucketing.options import BucketOptions
from tpu_tuner.core.errors import TpuTuneError, UserInputError
from tpu_tuner.core.field_types import check_field_types
from tpu_tuner.core.tpu_host import TORCHTPU_CACHE_VARIABLE
from tpu_tuner.devices import get_backend
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.execution import compiled_with
from tpu_tuner.model.buckets.bucket_choice import (
    BucketShare,
    Evaluation,
    Strategy,
    baselines,
    bucket_shares,
    evaluate,
    optimal_buckets,
    oracle_seconds,
)
from tpu_tuner.model.buckets.bucket_cost import BucketCostModel, ShapeCost, fit_cost_model
from tpu_tuner.model.buckets.lengths import LengthHistogram, bucket_histogram, probe_lengths
from tpu_tuner.runner.load import load_summary
from tpu_tuner.runner.requests import BucketCostsRequest, BucketReplayRequest
from tpu_tuner.runner.trial_runner import TrialRunner
from tpu_tuner.runner.worker_log import WorkerLog

log = logging.getLogger(__name__)


@dataclass
class Replay:
    """A strategy replayed end to end: measured compiles and stream steps, scaled to the run."""

    strategy: str
    compiled_shapes: int
    compile_seconds: float
    stream_steps: int
    stream_step_seconds: float
    total_seconds: float  # compile + steps x planned / stream
    compilations: int | None = None  # the backend's compile counter over the bounds' first steps
    cache_hits: int | None = None  # first steps at a bound that reused a compiled program


@dataclass
class BucketResult:
    """The bucketing study: the sample, the measured cost model, the chosen bounds, the table."""

    workload: str
    device: str  # the backend's kind ("tpu", "cpu")
    compile_backend: str
    samples: int
    distinct_lengths: int
    length_summary: dict[str, float]
    steps: int
    max_buckets: int
    align: int
    cost_model: BucketCostModel
    chosen: Evaluation
    table: list[Evaluation]
    oracle_seconds: float
    optimiser_seconds: float
    histogram: LengthHistogram
    replays: list[Replay] = field(default_factory=list)
    replay_note: str = ""
    seconds: float = 0.0
    device_name: str = ""  # the device measured on, by name ("TPU v5e"); the kind where none
    chosen_shares: list[BucketShare] = field(default_factory=list)  # each chosen bucket's compile vs padding
    # The chosen bounds on a held-out length sample, beside strategies made from it (bucketing/heldout.py);
    # with it, `replays` ran on a stream drawn from the held-out sample.
    heldout: HeldOut | None = None

    def to_dict(self) -> dict[str, Any]:
        """buckets.json's content: every field, the histogram as lists, the chosen bounds."""
        data = asdict(self)
        data["histogram"] = {"lengths": self.histogram.lengths.tolist(), "counts": self.histogram.counts.tolist()}
        data["chosen_buckets"] = list(self.chosen.strategy.bounds)
        return data


def plan_buckets(
    model_file: str | Path,
    options: BucketOptions,
    progress: Callable[[str], None] | None = None,
    workers_log: WorkerLog | None = None,
) -> BucketResult:
    """Run the whole bucketing study on `model_file`; the workers' output goes to `workers_log` (None:
    each worker's own temporary log, dropped unless a failure names it)."""
    emit = progress or (lambda message: None)
    started = time.perf_counter()
    check_field_types(options)
    if options.choice.lengths_file is not None and not Path(options.choice.lengths_file).is_file():
        raise UserInputError("length sample file not found", options.choice.lengths_file)
    heldout_file = options.replay.heldout_file
    if heldout_file is not None and not Path(heldout_file).is_file():
        raise UserInputError("no such held-out lengths file", heldout_file)
    # Read before any worker starts: a bad file is a one-line error, not a study's end.
    held = bucket_histogram(None, heldout_file) if heldout_file is not None else None
    # This process never imports the model file: a worker loads it and sends back a summary
    # (a crash at import becomes a WorkloadError, runner/load.py).
    with TrialRunner(
        str(model_file), options.measure.device, options.measure.trial_timeout_s, log=workers_log
    ) as loader:
        workload = load_summary(
            loader, model_file, options.measure.batch_size, None, sample_lengths=options.choice.lengths_file is None
        )
    hist = bucket_histogram(workload.length_source(), options.choice.lengths_file)
    backend = get_backend(options.measure.device)
    backend_name = options.measure.compile_backend or backend.default_compile_backend()
    candidate = Candidate(compiled_with(backend_name)).to_dict()
    probes = probe_lengths(hist, options.choice.align)
    warmup = max(1, probes[0] // 2) if probes[0] > 1 else probes[-1] + options.choice.align
    emit(
        f"{hist.total} lengths ({len(hist.lengths)} distinct, {hist.lengths[0]}..{hist.max_length}); measuring "
        f"compile cost and step time at {probes} with torch.compile(backend={backend_name!r}, dynamic=False)"
    )
    request = BucketCostsRequest(
        candidate=candidate, lengths=probes, warmup_length=warmup, batch_size=options.measure.batch_size
    )
    measured = _run_cold(workload.source, options, request, "measuring the cost model", workers_log)
    points = measured.points
    # The worker's points carry how each length was measured (runner/bucket_jobs.py: ShapeCost).
    shapes: list[ShapeCost] = [p.shape for p in points if p.shape is not None]
    model = fit_cost_model(
        [(p.length, p.step_seconds) for p in points], [(p.length, p.compile_seconds) for p in points], shapes
    )
    device_name = measured.device_name or workload.device_name or backend.kind
    emit(f"cost model on {device_name}: {model.describe()}")

    start = time.perf_counter()
    chosen_strategy = optimal_buckets(
        hist, model, options.choice.planned_steps, options.choice.max_buckets, options.choice.align
    )
    optimiser_seconds = time.perf_counter() - start
    strategies = [chosen_strategy, *baselines(hist)]
    table = [evaluate(s, hist, model, options.choice.planned_steps, options.choice.max_buckets) for s in strategies]
    result = BucketResult(
        workload=workload.name,
        device=backend.kind,
        compile_backend=backend_name,
        samples=hist.total,
        distinct_lengths=len(hist.lengths),
        length_summary=_summary(hist),
        steps=options.choice.planned_steps,
        max_buckets=options.choice.max_buckets,
        align=options.choice.align,
        cost_model=model,
        chosen=table[0],
        table=table,
        oracle_seconds=oracle_seconds(hist, model, options.choice.planned_steps),
        optimiser_seconds=optimiser_seconds,
        histogram=hist,
        device_name=device_name,
        chosen_shares=bucket_shares(chosen_strategy, hist, model, options.choice.planned_steps),
    )
    stream_hist = hist
    if held is not None and heldout_file is not None:
        c = options.choice
        result.heldout = held_out(chosen_strategy, held, heldout_file, model, c.planned_steps, c.max_buckets, c.align)
        strategies, stream_hist = [e.strategy for e in result.heldout.table], held
        emit(f"held-out lengths ({heldout_file}): {_heldout_words(result.heldout)}")
    if options.replay.steps:
        drawn_from = "the sample" if held is None else f"the held-out lengths ({Path(str(heldout_file)).name})"
        result.replays, result.replay_note = replay(
            workload.source, stream_hist, strategies, options, candidate, warmup, emit, workers_log, drawn_from
        )
    result.seconds = time.perf_counter() - started
    return result


def replay(
    source: Path,
    hist: LengthHistogram,
    strategies: list[Strategy],
    options: BucketOptions,
    candidate: dict[str, Any],
    warmup: int,
    emit: Callable[[str], None],
    workers_log: WorkerLog | None = None,
    drawn_from: str = "the sample",
) -> tuple[list[Replay], str]:
    """Replay a length stream drawn from `hist` (`drawn_from`, in words) through the real workload
    under each strategy, each in a fresh worker (no compile inherited from another strategy)."""
    stream = hist.sample(options.replay.steps, options.replay.seed)
    scale = options.choice.planned_steps / len(stream)
    replays = []
    for strategy in strategies:
        if options.replay.only is not None and strategy.name not in options.replay.only:
            continue
        bounds = np.asarray(strategy.bounds)
        needed = sorted({int(b) for b in bounds[np.searchsorted(bounds, stream, side="left")]})
        if len(needed) > options.replay.max_compiles:
            emit(
                f"replay: {strategy.name} needs {len(needed)} compiled shapes "
                f"(> {options.replay.max_compiles}); predicted only"
            )
            continue
        emit(f"replay: {strategy.name} ({len(needed)} shapes, {len(stream)} steps)")
        request = BucketReplayRequest(
            candidate=candidate,
            bounds=list(strategy.bounds),
            stream=stream.tolist(),
            warmup_length=warmup,
            batch_size=options.measure.batch_size,
        )
        value = _run_cold(source, options, request, f"replaying {strategy.name}", workers_log)
        compile_seconds = float(sum(value.compile_seconds.values()))
        shapes = [s for s in value.shapes if s.counter is not None]
        replays.append(
            Replay(
                strategy.name,
                len(needed),
                compile_seconds,
                len(stream),
                value.step_seconds,
                compile_seconds + scale * value.step_seconds,
                sum(s.compilations or 0 for s in shapes) if shapes else None,
                sum(1 for s in shapes if s.cache_hit) if shapes else None,
            )
        )
    note = (
        f"replayed {len(stream)} steps drawn from {drawn_from} (seed {options.replay.seed}); measured total = measured "
        f"compiles + {scale:.4g} x the stream's measured step time, for a planned run of "
        f"{options.choice.planned_steps} steps"
    )
    return replays, note


@contextlib.contextmanager
def cold_compile_env() -> Iterator[dict[str, str]]:
    """Fresh, empty compile cache folders for one worker, removed afterwards: inductor keeps
    compiled kernels on disk across processes, and TorchTPU its executables where a run folder
    or the user names a Tier-3 cache, so without them a strategy would reuse programs an earlier
    one compiled for the same shape and look cheaper (docs/bucketing.md)."""
    with tempfile.TemporaryDirectory(prefix="tpu-tune-inductor-") as folder:
        os.makedirs(os.path.join(folder, "torchtpu"))
        yield {
            "TORCHINDUCTOR_CACHE_DIR": folder,
            "TRITON_CACHE_DIR": os.path.join(folder, "triton"),
            TORCHTPU_CACHE_VARIABLE: os.path.join(folder, "torchtpu"),
        }


def _heldout_words(heldout: HeldOut) -> str:
    """The held-out comparison's verdict in a line."""
    ratio = heldout.predicted_ratio()
    added = f"; {len(heldout.added_bounds)} bound(s) added past the chosen ones" if heldout.added_bounds else ""
    said = f"the chosen buckets predicted at {ratio:.3g}x powers of two" if ratio is not None else "no powers of two"
    return f"{heldout.samples} lengths ({heldout.distinct_lengths} distinct), {said}{added}"


def _summary(hist: LengthHistogram) -> dict[str, float]:
    sample = np.repeat(hist.lengths, hist.counts)
    return {
        "min": int(sample.min()),
        "median": float(np.median(sample)),
        "p90": float(np.quantile(sample, 0.9)),
        "p99": float(np.quantile(sample, 0.99)),
        "max": int(sample.max()),
        "mean": float(sample.mean()),
    }


def _run_cold(source: Path, options: BucketOptions, request: Any, what: str, workers_log: WorkerLog | None) -> Any:
    """The value `request` gives in a fresh worker with an empty compile cache (`cold_compile_env`);
    a TpuTuneError saying `what` failed where it fails."""
    with (
        TrialRunner(str(source), options.measure.device, options.measure.trial_timeout_s, log=workers_log) as runner,
        cold_compile_env() as env,
    ):
        result = runner.run(request, env=env)
    if result.failure is not None:
        raise TpuTuneError(f"{what} failed: {result.failure.kind}: {result.failure.message}")
    return result.value


__all__ = ["BucketOptions", "BucketResult", "Replay", "bucket_histogram", "plan_buckets", "probe_lengths"]
