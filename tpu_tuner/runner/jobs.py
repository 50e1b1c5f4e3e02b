"""What a worker process does: load, profile, measure a candidate, or compare candidates interleaved.

These functions run inside the isolated worker (`trial_worker.py`) or a rank of a sharded trial
(`rank_job.py`), one per request type (`requests.py`); they load the workload from its file once
and keep the fp32 reference's and the baseline's outputs for the guardrail.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable
from typing import Any

from tpu_tuner.execution.accuracy import (
    REFERENCE,
    AccuracyErrors,
    capture,
    judge,
)
from tpu_tuner.execution.early_stop import CompileCutOff, StopRule, compile_deadline
from tpu_tuner.execution.measurement import EarlyStop, Measurement
from tpu_tuner.execution.memory_estimate import estimate_or_refuse
from tpu_tuner.execution.step import prepare_step
from tpu_tuner.execution.timer import StepClock, compile_delta, time_steps, warm_up
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.metrics.mfu import mfu
from tpu_tuner.model.workloads.summary import WorkloadSummary, summarize
from tpu_tuner.profiling import ProfilerSettings, profile
from tpu_tuner.runner.bucket_jobs import run_bucket_costs, run_bucket_replay
from tpu_tuner.runner.requests import (
    BucketCostsRequest,
    BucketReplayRequest,
    CompareRequest,
    Comparison,
    LoadRequest,
    MeasureRequest,
    ProfileRequest,
    Request,
    ShardedStepRequest,
)
from tpu_tuner.runner.sharded_step import run_sharded_step
from tpu_tuner.runner.worker_state import WorkerState


def run_load(state: WorkerState, request: LoadRequest) -> WorkloadSummary:
    """The worker has imported the file (`WorkerState`): describe it to the parent."""
    return summarize(state.workload, state.backend, request.batch_size, request.seq_len, request.sample_lengths)


def run_profile(state: WorkerState, request: ProfileRequest) -> Any:
    return profile(
        state.workload,
        device=state.backend.kind,
        candidate=Candidate.from_dict(request.candidate),
        batch_size=request.batch_size,
        seq_len=request.seq_len,
        attention_convention=request.attention_convention,
        settings=request.settings or ProfilerSettings.load(),
        fit_memory=request.fit_memory,
        ran_out=request.ran_out,
    )


def run_measure(state: WorkerState, request: MeasureRequest) -> Measurement | EarlyStop:
    """Warm up, check accuracy, and time one candidate; stop early where `request` says the trial
    is hopeless (an `EarlyStop`), and time again where the steps say the host was disturbed."""
    candidate = Candidate.from_dict(request.candidate)
    backend, workload = state.backend, state.workload
    batch_size, seq_len = request.batch_size, request.seq_len
    # The single-device fp32 reference on the whole batch: rank 0 compares (a single worker is rank 0),
    # and judges against the baseline's outputs, computed alike (none given: against fp32 alone).
    references_started = time.perf_counter()
    state.references_dir = request.references_dir
    state.reference_candidate = Candidate.from_dict(request.reference) if request.reference else REFERENCE
    reference = state.reference(batch_size, seq_len) if state.rank == 0 else None
    baseline = Candidate.from_dict(request.baseline) if request.baseline is not None else None
    # The baseline's own trial, first in the run: its outputs are the baseline's (taken below).
    adopts = reference is not None and state.computes_baseline_as(candidate, baseline, batch_size, seq_len)
    wanted = baseline is not None and reference is not None and not adopts
    base = state.baseline(baseline, batch_size, seq_len) if wanted and baseline is not None else None
    reference_seconds = time.perf_counter() - references_started
    settings = request.settings or ProfilerSettings.load()
    rule = StopRule(request.stop_above_s, request.planned_steps) if request.stop_above_s else None
    # A rank cut off alone would leave the others waiting in a collective: one process only.
    deadline = rule.compile_limit_s() if rule is not None and candidate.compiles() and backend.ranks == 1 else None
    backend.fresh_compile_state()  # each trial compiles as a fresh process would (no stale frames)
    # What the references' eager steps and earlier trials left cached goes back to the device first.
    backend.release_cached_memory()
    # Before anything is built: a step that cannot fit is refused here (WouldNotFit), unmeasured.
    estimate_started = time.perf_counter()
    estimate = estimate_or_refuse(
        workload,
        backend,
        candidate,
        batch_size,
        seq_len,
        request.memory_limit_bytes,
        request.memory_limit_source,
        state.memory_estimates,
    )
    estimate_seconds = time.perf_counter() - estimate_started
    with candidate.process(backend):
        build_started = time.perf_counter()
        step = prepare_step(workload, backend, candidate, batch_size, seq_len, weights=state.weights)
        build_seconds = time.perf_counter() - build_started
        events_before = backend.compile_events()
        start = time.perf_counter()
        try:
            with compile_deadline(deadline):
                outputs = capture(step, workload, backend, candidate)  # first call: compiles
                backend.synchronize()
        except CompileCutOff as cut:
            spent = time.perf_counter() - start
            assert rule is not None
            return EarlyStop(
                candidate.to_dict(),
                "compile",
                f"{cut}: alone it is {spent / rule.planned_steps * 1e3:.1f} ms "
                f"a step over {rule.planned_steps} steps, beyond the {rule.threshold_s * 1e3:.1f} ms "
                "the best so far allows",
                [],
                spent,
                spent,
                spent / rule.planned_steps,
            )
        first_call = time.perf_counter() - start
        judge_started = time.perf_counter()
        if adopts and baseline is not None:
            base = state.adopt_baseline(baseline, batch_size, seq_len, outputs)
        errors = judge(outputs, reference, base, candidate == baseline) if reference is not None else AccuracyErrors()
        judge_seconds = time.perf_counter() - judge_started
        del outputs  # the gathered whole gradients: not part of the step's memory
        clock = StepClock.of(step, backend)
        warmup = warm_up(clock, settings.warmup_min_steps, settings.warmup_max_steps)
        steady = list(warmup.steady_steps)
        # The compile's share of the first call and warm-up (never below 0: steps vary).
        compile_estimate = (
            max(0.0, first_call + warmup.seconds - (warmup.steps + 1) * min(steady)) if steady else first_call
        )

        def hopeless(seen: list[float]) -> EarlyStop | None:
            """The trial stopped after the steps `seen`, where they say it is hopeless."""
            if rule is None or not rule.hopeless(seen, compile_estimate):
                return None
            return EarlyStop(
                candidate.to_dict(),
                "steps",
                rule.explain(seen, compile_estimate),
                seen,
                first_call,
                compile_estimate,
                rule.optimistic(seen, compile_estimate),
                **errors.fields(),
            )

        if (early := hopeless(steady)) is not None:
            return early
        stop = (lambda samples: rule.hopeless(steady + samples, compile_estimate)) if rule is not None else None
        backend.reset_peak_memory()
        timing, compiles_while_timing, disturbed = _steady_timing(clock, settings, stop)
        if (early := hopeless(steady + timing.samples)) is not None:
            return early
        flops = float(request.model_flops_per_step)
        # N ranks: the peak of the devices they run on (devices.base.Backend.peak_of_ranks).
        peaks = state.peak_flops_per_s or backend.peak_of_ranks(
            {k: float(v) for k, v in request.peak_flops_per_s.items()}
        )
        peak_memory, _ = backend.peak_memory_bytes()
        # The largest rank's; every rank takes part in the reduction (-1: none measured).
        largest = int(backend.max_over_ranks(-1 if peak_memory is None else peak_memory))
        peak_memory = None if largest < 0 else largest
        compiles = compile_delta(events_before, backend.compile_events())
    if candidate.compiles() and not any(compiles.values()):
        # torch.compile gave up and ran eager (a graph break it could not trace, a limit): the
        # timing is not the setting's, so it is no measurement of it.
        raise RuntimeError(
            f"{candidate.describe()}: torch.compile compiled no graph, so the step ran eager; "
            "nothing of the setting was measured"
        )
    # Compile cost: the time warm-up took beyond what the same number of steady steps take.
    compile_seconds = max(0.0, first_call + warmup.seconds - (warmup.steps + 1) * timing.median)
    # The same MFU convention as the profile: the fastest dtype's peak, never exceeded.
    # A rank re-probing alone would measure its share of the cores, not the step's devices.
    choice = backend.mfu_peak(peaks, flops / timing.median, remeasure=not state.peak_reprobed and backend.ranks == 1)
    if choice.note:
        state.peak_flops_per_s = {**peaks, choice.dtype: choice.flops_per_s}
        state.peak_reprobed = True
    peak = choice.flops_per_s
    warnings = [f"recompiled while timing: {compiles_while_timing}"] if any(compiles_while_timing.values()) else []
    warnings += disturbed
    if choice.note:
        warnings.append(choice.note)
    del step
    gc.collect()
    return Measurement(
        candidate=candidate.to_dict(),
        step_median=timing.median,
        step_p10=timing.p10,
        step_p90=timing.p90,
        samples=timing.samples,
        first_call_seconds=first_call,
        warmup_seconds=warmup.seconds,
        compile_seconds=compile_seconds,
        compiles=compiles,
        model_flops_per_step=flops,
        peak_flops_per_s=peak,
        peak_dtype=choice.dtype,
        mfu=mfu(flops, timing.median, peak),
        compute_dtype=candidate.compute_dtype(backend),
        peak_memory_bytes=peak_memory,
        **errors.fields(),
        warnings=warnings,
        estimated_peak_bytes=estimate.peak_bytes,
        estimate_note=estimate.reason,
        reference_seconds=reference_seconds,
        estimate_seconds=estimate_seconds,
        build_seconds=build_seconds,
        judge_seconds=judge_seconds,
        steps_per_sample=clock.block,
    )


# Timings of a trial whose spread says the host was disturbed: at most this many more tries.
RETIMES = 2


def _steady_timing(
    clock: StepClock, settings: ProfilerSettings, stop: Callable[[list[float]], bool] | None
) -> tuple[Any, dict[str, int], list[str]]:
    """The trial's timed steps; timed again (up to `RETIMES` more times) while their robust CV is
    beyond the profile's own limit for a trusted verdict (another process took the cores), the
    steadiest kept. Returns the timing, the compiles while timing, and what was re-timed, in words."""
    tries = []
    for _ in range(1 + RETIMES):
        timing, compiles = time_steps(
            clock, settings.timing_min_steps, settings.timing_min_seconds, settings.timing_max_steps, stop
        )
        tries.append((timing, compiles))
        # A hopeless trial stops early; its few steps are no spread to judge.
        if (stop is not None and stop(timing.samples)) or timing.robust_cv <= settings.verdict_cv_max:
            break
    timing, compiles = min(tries, key=lambda pair: pair[0].robust_cv)
    notes = (
        [
            f"timed {len(tries)} times: the step times spread beyond a robust CV of {settings.verdict_cv_max:.0%} "
            f"(robust CVs {', '.join(f'{t.robust_cv:.0%}' for t, _ in tries)}; the steadiest kept)"
        ]
        if len(tries) > 1
        else []
    )
    return timing, compiles, notes


def run_compare(state: WorkerState, request: CompareRequest) -> Comparison:
    """Time the candidates interleaved in one window: A B C, B C A, C A B, ... each round.

    Every candidate is built and warmed up first; then each round times one sample of each
    candidate (a block of steps read to its result: execution/timer.py, the search's timer),
    rotating the order so that no candidate always runs first. The rounds may come in chunks
    (``first_round``, ``rounds``, ``last``): the steps built by the first chunk are kept in the
    worker until the chunk marked ``last``, so later chunks time the same warm steps. A compiling
    candidate whose build compiled nothing, in a process where nothing compiled, ran eager: the
    window fails as its trial would (`run_measure`).
    """
    backend, workload = state.backend, state.workload
    candidates, batch_size, seq_len = request.candidates, request.batch_size, request.seq_len
    parsed = [Candidate.from_dict(c) for c in candidates]
    key = json.dumps([candidates, batch_size, seq_len], sort_keys=True)
    built = state.compare_key != key
    if built:
        state.compare_key, state.compare_steps = None, []
        gc.collect()
        backend.release_cached_memory()
        # Every candidate of the window keeps its compiled frames: room for all of them.
        backend.fresh_compile_state(graphs=max(64, 8 * len(parsed)))
        window_start = backend.compile_events()
        for candidate in parsed:
            with candidate.process(backend):
                before = backend.compile_events()
                step = prepare_step(workload, backend, candidate, batch_size, seq_len, weights=state.weights)
                clock = StepClock.of(step, backend)
                warm_up(clock, request.warmup_min_steps, request.warmup_max_steps)
                after = backend.compile_events()
            # Nothing compiled for it, nor before it in this process (so no graph to reuse).
            if candidate.compiles() and not any(compile_delta(window_start, after).values()):
                state.compare_steps = []
                raise RuntimeError(
                    f"{candidate.describe()}: torch.compile compiled no graph in the window, so the step ran "
                    f"eager; nothing of the setting was measured (its build: {compile_delta(before, after)})"
                )
            state.compare_steps.append(clock)
        state.compare_key = key
    clocks: list[StepClock] = state.compare_steps
    samples: list[list[float]] = [[] for _ in parsed]
    events_before = backend.compile_events()
    first = request.first_round
    for round_index in range(first, first + request.rounds):
        for offset in range(len(parsed)):
            index = (round_index + offset) % len(parsed)
            with parsed[index].process(backend):
                samples[index].append(clocks[index].sample())
    compiles = compile_delta(events_before, backend.compile_events())
    blocks = [clock.block for clock in clocks]
    if request.last:
        state.compare_key, state.compare_steps = None, []
        gc.collect()
    return Comparison(samples=samples, compiles_while_comparing=compiles, steps_per_sample=blocks)


# The job function of each request type.
JOBS: dict[type[Request], Callable[[WorkerState, Any], Any]] = {
    LoadRequest: run_load,
    ProfileRequest: run_profile,
    MeasureRequest: run_measure,
    CompareRequest: run_compare,
    BucketCostsRequest: run_bucket_costs,
    BucketReplayRequest: run_bucket_replay,
    ShardedStepRequest: run_sharded_step,
}


def run_job(state: WorkerState, request: Request) -> Any:
    """Run `request` with its job function."""
    return JOBS[type(request)](state, request)
