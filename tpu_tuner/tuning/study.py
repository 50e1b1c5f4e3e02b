"""The tuning loop: profile, let the agents shape the search, search with Optuna, verify.

Trials run in an isolated worker (`TrialRunner`); the study lives in an Optuna storage (SQLite
in the run folder by default), so an interrupted run resumes without losing or repeating
completed trials.
"""

from __future__ import annotations

import logging
import random
import shutil
import socket
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna

from tpu_tuner.core.errors import UserInputError, WorkloadError
from tpu_tuner.core.units import duration
from tpu_tuner.devices import BACKENDS
from tpu_tuner.knobs import traits
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.bucket_cost import fit_cost_model
from tpu_tuner.model.lengths import LengthHistogram, bucket_histogram, probe_lengths
from tpu_tuner.model.summary import WorkloadSummary
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.runner.load import load_summary
from tpu_tuner.runner.ranked_runner import RankedTrialRunner, Runner, trial_runner
from tpu_tuner.runner.requests import BucketCostsRequest, MeasureRequest
from tpu_tuner.studies import run_file, samplers
from tpu_tuner.studies.coverage import covered_settings, measured_count, setting_key as _key
from tpu_tuner.studies.fingerprint import fingerprint
from tpu_tuner.studies.liveness import Heartbeat, RunningWatch, Worker, fail_lost_trials, set_liveness
from tpu_tuner.tuning import trial_attrs
from tpu_tuner.tuning.agents import Agent
from tpu_tuner.tuning.bucketing import BucketingContext
from tpu_tuner.tuning.budget import search_budget
from tpu_tuner.tuning.memory_limit import MemoryLimit
from tpu_tuner.tuning.options import TuneOptions, default_trial_settings
from tpu_tuner.tuning.result import TuningResult
from tpu_tuner.tuning.run_location import RunLocation, open_or_join, open_run_storage, run_location
from tpu_tuner.tuning.run_setup import check_ranks, prepare_agents, profile_baseline, start_ranks_on
from tpu_tuner.tuning.shared_study import (RECORD_ATTR, JoinRefused, adopt_options, make_record, publish_profile,
                                           record_verification, shared_profile, verification_left_to)
from tpu_tuner.tuning.space import SearchSpace
from tpu_tuner.tuning.verify import Verification, verify
from tpu_tuner.tuning.warm_start import WarmSeed, enqueue_warm_seeds, features_of, find_warm_seeds

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass(frozen=True)
class Progress:
    """A progress event for whoever shows progress (the CLI prints these)."""

    phase: str  # "profile" | "trial" | "verify" | "done"
    message: str
    trial: int | None = None
    trials: int | None = None
    # The best feasible objective so far: the same quantity a finished trial's message leads
    # with, named by `objective` ("amortised": steady step + compile time / planned steps).
    best_seconds: float | None = None
    elapsed: float = 0.0
    objective: str = "amortised"


ProgressCallback = Callable[[Progress], None]
# Writes a finished result's run-folder files (reports, plots, the tuned config): the outputs layer's
# `write_tuning`, which `tpu_tuner.api.tune` passes in (this layer does not import it).
OutputsWriter = Callable[[TuningResult], object]


def run_tuning(model_file: str | Path, options: TuneOptions | None, progress: ProgressCallback | None,
               write_outputs: OutputsWriter) -> TuningResult:
    """Tune a model file; returns the result, with the run folder written by `write_outputs`.

    This process never imports the model file: a worker loads it and describes it
    (runner/summary.py). Bad options are refused before that, and a run that fails after its
    folder exists is marked "failed" in run.json with the reason (docs/run-safety.md). With
    `options.store.study` the run is one worker of a study shared by name (tuning/shared_study.py).
    The options are never changed: what the run resolves (the storage of $TPU_TUNE_STORAGE, the
    default trial settings, a shared study's options, the budget) makes new ones, and the result
    holds those the run used.
    """
    # Numbers, search space, storage URL: seconds, nothing written yet.
    options = (options or TuneOptions()).preflight()
    if options.runner.trial_settings is None:  # left to the run by the CLI: building it imports torch
        options = replace(options, trial_settings=default_trial_settings())
    model_file = Path(model_file)
    started = time.perf_counter()
    emit = progress or (lambda event: None)
    run, lengths_file = options.runner, options.objective.lengths_file

    with trial_runner(str(model_file), run.device, run.nproc, run.trial_timeout_s,
                      options.objective.memory_limit_bytes) as runner:
        # Bad files fail here, in the worker, with exit 2 (a crash at import too).
        workload = load_summary(runner, model_file, run.batch_size, run.seq_len, sample_lengths=lengths_file is None)
        # And a bad length sample; read once, used for the bucketing knob below.
        lengths = (bucket_histogram(workload.length_source(), lengths_file)
                   if lengths_file is not None or workload.has_sample_lengths else None)
        check_ranks(workload, lengths, run.nproc)
        current = fingerprint(model_file, workload, run.batch_size, run.seq_len, run.nproc, lengths)
        location = run_location(workload.name, options, current)
        try:
            result = _tune_in(location, workload, lengths, options, runner, emit, started, current, write_outputs)
        except JoinRefused:
            if not location.resumed:
                shutil.rmtree(location.run_dir, ignore_errors=True)  # it never ran: nothing to keep
            raise
        except BaseException as exc:
            run_file.mark_failed(location.run_dir, exc)
            raise
    if result.verified:
        run_file.update(location.run_dir, status="done", updated=time.strftime("%Y-%m-%dT%H:%M:%S"))
    else:
        run_file.update(location.run_dir, status="searched", reason=result.verification.message,
                        updated=time.strftime("%Y-%m-%dT%H:%M:%S"))
    emit(Progress("done", f"results in {location.run_dir}", elapsed=time.perf_counter() - started))
    return result


def _tune_in(location: RunLocation, workload: WorkloadSummary, lengths: LengthHistogram | None, options: TuneOptions,
             runner: Runner, emit: ProgressCallback, started: float, current: dict[str, Any],
             write_outputs: OutputsWriter) -> TuningResult:
    """Profile (or take the study's shared profile), search and verify, in an existing run folder."""
    model_file = workload.source
    whole_space = SearchSpace.load(options.search.space, workload.device_kind, ranks=options.runner.nproc)
    storage = open_run_storage(location.storage, options.store)
    worker = Worker.this_process(storage)
    opened = open_or_join(storage, location, make_record(current, whole_space, options), whole_space)
    study, first = opened.study, opened.created or not location.shared
    profile = None
    if not first:
        emit(Progress("profile", f"joined study {location.study_name!r}: waiting for its baseline profile",
                      elapsed=time.perf_counter() - started))
        profile = shared_profile(study, wait_s=options.runner.trial_timeout_s + 60)
        # The study's search, objective, liveness and budget, as recorded once its profile is in
        # (as created, where its first worker died while profiling and this one profiles).
        options = adopt_options(options, study.user_attrs.get(RECORD_ATTR, opened.record))
        set_liveness(storage, options.store.heartbeat_interval_s, options.store.grace_period_s)
    # The worker that profiles the baseline keeps the study's record: its first worker, or a
    # joining one whose first worker died while profiling.
    keeper = profile is None
    if profile is None:
        emit(Progress("profile", "profiling the baseline", elapsed=time.perf_counter() - started))
        profile = profile_baseline(runner, options.runner, model_file, workload.device_kind)
    device_kind = profile.device.kind
    nproc = options.runner.nproc
    if isinstance(runner, RankedTrialRunner):
        start_ranks_on(runner, profile, nproc)
    # Narrowed to what can change this workload's step (no optimizer knob for inference, no
    # memory format without convolutions; the layouts of --nproc ranks the model's shapes allow):
    # knobs/traits.py.
    space = (SearchSpace.load(options.search.space, device_kind, ranks=nproc)
             .for_workload(traits.of_profile(profile.workload)))
    if nproc > 1 and not space.spreads_over_ranks():
        # Without the knob every trial would be N unsharded copies of one process's step.
        raise UserInputError(f"--nproc {nproc}: the search space {space.name!r} has no layout parameter "
                             "(add one, as search_spaces/default.toml does)")
    record = study.user_attrs.get(RECORD_ATTR, opened.record)
    agents, findings, memory = prepare_agents(options, profile)
    budget = search_budget(options.search.trials, options.search.sampler, space, agents)
    options = replace(options, trials=budget.trials)  # the run's record and result hold the number it used
    emit(Progress("budget", budget.describe() if keeper else f"the study's budget: {budget.trials} measured settings "
                  "across its workers", elapsed=time.perf_counter() - started))
    # The study again, with the sampler of the narrowed space (a grid walks its settings).
    study = optuna.load_study(study_name=location.study_name, storage=storage,
                              sampler=build_sampler(options, space, shared=location.shared, first=first))
    if keeper:
        study.set_user_attr(RECORD_ATTR, {**record, "options": options.to_plain(),
                                          "features": features_of(profile, current).to_dict()})
    if location.resumed and not location.shared:
        _mark_interrupted(study)  # nobody else works on a run folder's own study
    if not study.trials:
        seeds = _warm_seeds(space, profile, current, location, options.outputs.out) if options.search.warm_start else []
        enqueue_seeds(study, space, agents, profile, seeds)
    if location.shared and keeper:
        publish_profile(study, profile)  # after the seeds: a joining worker starts on them
    bucketing = _bucketing_context(workload, lengths, options, runner, profile, emit, started) if lengths else None
    measure_options = MeasureRequest(  # each trial's request, with its candidate filled in
        batch_size=options.runner.batch_size,
        seq_len=options.runner.seq_len,
        settings=options.runner.trial_settings,
        peak_flops_per_s=profile.device.peak.flops_per_s,
        model_flops_per_step=profile.flops.model_per_step,
    )
    end = run_search(study, space, agents, runner, measure_options, options, emit, started, bucketing, memory, worker)
    left_to = None
    if location.shared:
        emit(Progress("verify", "settling: waiting for the study's running trials", elapsed=time.perf_counter() - started))
        left_to = verification_left_to(study, worker, end, RunningWatch(2 * options.runner.trial_timeout_s + 60))
    if left_to is not None:
        emit(Progress("verify", f"not verifying here: {left_to}", elapsed=time.perf_counter() - started))
        verification = Verification(baseline_trial=None, best_trial=None,
                                    chosen=space.to_candidate(space.baseline_params()), chosen_is_best=False,
                                    speedup=None, message=f"not verified by this worker: {left_to}")
    else:
        verification = _verify_here(study, space, runner, options, device_kind, agents, emit, started)
        if location.shared:
            record_verification(study, verification, str(location.run_dir), worker.id,
                                measured_count(covered_settings(study.get_trials(deepcopy=False))))
    result = TuningResult(
        run_dir=location.run_dir, study=study, space=space, profile=profile, findings=findings,
        verification=verification, options=options, worker_starts=runner.workers_started,
        verified=left_to is None,
    )
    write_outputs(result)
    return result


def _verify_here(study: optuna.Study, space: SearchSpace, runner: Runner, options: TuneOptions, device_kind: str,
                 agents: list[Agent], emit: ProgressCallback, started: float) -> Verification:
    """The interleaved verification on this host (tuning/verify.py), reporting its rounds."""
    emit(Progress("verify", f"re-measuring the best against the baseline, interleaved ({options.objective.verify_rounds} rounds "
                  "of steady steps)", elapsed=time.perf_counter() - started))

    def verify_progress(done: int, rounds: int, ratio: float) -> None:
        emit(Progress("verify", f"round {done}/{rounds}: best {ratio:.2f}x the baseline's speed so far "
                      "(steady step, geometric mean of rounds)", elapsed=time.perf_counter() - started))

    return replace(verify(study, space, runner, options, device_kind, verify_progress, agents), host=socket.gethostname())


def _warm_seeds(space: SearchSpace, profile: Profile, current: dict[str, Any], location: RunLocation,
                results_dir: Path) -> list[WarmSeed]:
    """The best settings of earlier studies of this device kind (same storage, or the results
    folder), nearest workload first (tuning/warm_start.py)."""
    return find_warm_seeds(space, features_of(profile, current), storage=location.storage,
                           results_dir=Path(results_dir), exclude_study=location.study_name)


def build_sampler(options: TuneOptions, space: SearchSpace, shared: bool = False,
                  first: bool = True) -> optuna.samplers.BaseSampler:
    """The Optuna sampler `options.search.sampler` names, seeded (studies/samplers.py builds it).

    In a shared study every TPE or random worker but the first draws from a seed of its own (the
    same seed would propose the same settings in every worker), and TPE treats the other
    workers' running trials as if they had scored the worst so far (`constant_liar`). A grid
    keeps the study's seed in every worker: trial n takes the n-th setting of one shuffled grid
    that the workers share (with other seeds, two workers on a 12-setting grid reached 8
    settings in 12 trials). The grid walks the space's valid settings (`SearchSpace.settings()`),
    not the product of every parameter's choices, so no conditional setting is walked twice.
    """
    search = options.search
    seed = search.seed if first or search.sampler == "grid" else random.SystemRandom().randrange(2**31)
    # Few startup trials: the seeds already cover the agents' best guesses. Multivariate TPE with
    # `group=True` models the knobs jointly, per group of trials that share a parameter set (the
    # conditional compiler options); docs/search-efficiency.md compares it with independent TPE.
    grid = search.sampler == "grid"
    return samplers.build_sampler(search.sampler, seed, startup_trials=4, group=True, constant_liar=shared,
                                  settings=space.settings() if grid else None,
                                  grid=space.grid() if grid else None)


def _mark_interrupted(study: optuna.Study) -> None:
    """Trials left RUNNING by an interrupted run are failed, so that resume repeats none."""
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        live = optuna.trial.Trial(study, trial._trial_id)  # noqa: SLF001 - reopen to annotate it
        live.set_user_attr("failure_kind", "interrupted")
        live.set_user_attr("failure_message", "the run stopped while this trial was running")
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)


def enqueue_seeds(study: optuna.Study, space: SearchSpace, agents: list[Agent], profile: Profile | None,
                  warm: Sequence[WarmSeed] = ()) -> None:
    """Baseline first (trial 0), then the best settings of earlier studies (`warm`, nearest
    workload first), then every agent's first seed alone, then those first seeds combined, then
    the agents' further seeds in turns, each on top of the combined seed.

    Round-robin, not agent by agent: with many knobs one agent can propose more seeds than a
    small budget holds (the compile agent's freezing / max-autotune / channels_last variants once
    filled six trials of --trials 6 before bf16 autocast, the precision agent's first guess, ran).
    Further seeds on top of the combined one, not the baseline: they are variants of one agent's
    knobs, and the other agents' knobs are mostly independent of them; on the baseline they
    measured settings every agent already expects to lose (on examples/cnn.py, inductor freezing
    in fp32 while bf16 autocast had already halved the step, and the grid's best was never queued).
    """
    baseline = space.baseline_params()
    per_agent = [agent.seeds(profile, space) for agent in agents]
    first_seeds: dict[str, str] = {}
    for seeds in per_agent:
        if seeds:
            first_seeds.update(seeds[0])
    queue: list[dict[str, str]] = [baseline]
    queue += [{**baseline, **seeds[0]} for seeds in per_agent if seeds]
    combined = {**baseline, **first_seeds}
    queue.append(combined)
    for turn in range(1, max((len(seeds) for seeds in per_agent), default=0)):
        queue += [{**combined, **seeds[turn]} for seeds in per_agent if len(seeds) > turn]
    study.enqueue_trial(space.complete(baseline), skip_if_exists=True)
    # An earlier study's best has been measured on a like workload: worth more than a guess.
    enqueue_warm_seeds(study, list(warm))
    seen: list[dict[str, str]] = [space.complete(baseline)]
    for params in map(space.complete, queue):  # whole settings: a grid sampler asks for none
        if params not in seen:
            seen.append(params)
            study.enqueue_trial(params, skip_if_exists=True)


def run_search(
    study: optuna.Study,
    space: SearchSpace,
    agents: list[Agent],
    runner: Runner,
    measure_options: MeasureRequest,
    options: TuneOptions,
    emit: ProgressCallback,
    started: float,
    bucketing: BucketingContext | None = None,
    memory: MemoryLimit | None = None,
    worker: Worker | None = None,
) -> SearchEnd:
    """Measure settings until the study holds `options.search.trials` measured ones (counted over
    all its workers), the space is covered, or `options.search.timeout_s` passes; returns which.

    With other workers on the study, a setting another worker is measuring is not measured again
    here, and when their running trials hold the rest of the budget this worker waits for them
    (one may still be lost and queued again) instead of starting more.
    """
    worker = worker or Worker.this_process(None)
    watch = RunningWatch(2 * options.runner.trial_timeout_s + 60)
    budget, timeout_s = options.search.trials, options.search.timeout_s
    distinct_total = space.size()
    asked = 0
    told: set[int] = set()
    waiting = False
    while True:
        if worker.storage is not None:
            fail_lost_trials(study, worker.storage, watch)
        trials = study.get_trials(deepcopy=False)
        _tell_new_failures(study, agents, space, trials, told)
        elapsed = time.perf_counter() - started
        covered = covered_settings(trials)
        measured = measured_count(covered)
        if measured >= budget:
            return "budget"
        if timeout_s and elapsed > timeout_s:
            return "timeout"
        if len(covered) >= distinct_total or asked >= 20 * budget:
            log.info("stopping: %d of %d settings of the space covered", len(covered), distinct_total)
            return "covered" if len(covered) >= distinct_total else "asks"
        # Other workers' trials: none of this worker's is running between two of its trials.
        running = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
        if measured + len(running) >= budget:
            if not waiting:
                emit(Progress("trial", f"the rest of the budget is running on other workers ({len(running)} "
                              "trial(s)): waiting for them", measured, budget, _best(study), elapsed,
                              _objective_name(bucketing)))
                waiting = True
            time.sleep(worker.poll_s)
            continue
        waiting = False
        asked += 1
        with warnings.catch_warnings():
            # Optuna warns that heartbeats are meant for `optimize`; this loop beats itself.
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
            trial = study.ask()
        heartbeat = Heartbeat(worker.storage, trial._trial_id) if worker.storage is not None else nullcontext()  # noqa: SLF001
        with heartbeat:
            try:
                _run_trial(study, trial, space, agents, runner, measure_options, options, emit, started, bucketing,
                           memory, worker)
            except optuna.exceptions.UpdateFinishedTrialError:
                # Beats stopped for a whole grace period (a suspended host) and another worker
                # failed this trial as lost and queued its setting again: its result is dropped.
                log.warning("trial %d was failed as lost by another worker while it ran here; its result is dropped",
                            trial.number)


SearchEnd = str
"""Why a search stopped: "budget" (measured), "covered" (the whole space), "timeout" (this
worker's --timeout) or "asks" (a sampler that only re-proposed covered settings)."""


def _run_trial(study: optuna.Study, trial: optuna.Trial, space: SearchSpace, agents: list[Agent], runner: Runner,
               measure_options: MeasureRequest, options: TuneOptions, emit: ProgressCallback, started: float,
               bucketing: BucketingContext | None, memory: MemoryLimit | None, worker: Worker) -> None:
    """One asked trial: answered from an earlier one, left to the worker already measuring the
    same setting, released when the budget is spoken for, rejected by an agent, or measured;
    told to the study in every case."""
    trial.set_user_attr("worker", worker.id)
    trial.set_user_attr("host", worker.host)
    params = space.suggest(trial)
    candidate = space.to_candidate(params)
    label = candidate.describe()
    elapsed = time.perf_counter() - started
    budget, objective = options.search.trials, options.objective
    # The study as it is now, after this trial was asked: another worker may have finished this
    # setting, be measuring it, or have taken the last of the budget since this loop looked.
    trials = study.get_trials(deepcopy=False)
    covered = covered_settings(trials)
    earlier = covered.get(_key(params))
    if earlier is not None:
        trial_attrs.copy_attrs(earlier, trial, objective.tolerance)
        study.tell(trial, earlier.value if earlier.state == optuna.trial.TrialState.COMPLETE else None,
                   state=earlier.state)
        log.debug("%s: repeat of trial %d, not re-measured", label, earlier.number)
        return
    # Two workers asked for the same setting at once (TPE's lie about running trials makes it
    # rare; on SQLite a queued setting could be popped twice before `open_storage` began every
    # transaction with the write lock): the lower trial number measures it.
    running_before = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING and t.number < trial.number]
    elsewhere = next((t for t in running_before if _key(t.params) == _key(params)), None)
    if elsewhere is not None:
        trial.set_user_attr("repeat_of", elsewhere.number)
        trial.set_user_attr("in_flight_elsewhere", True)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        log.debug("%s: being measured by trial %d of another worker", label, elsewhere.number)
        return
    # Workers that passed the budget check at once: the trials asked first take what is left.
    measured = measured_count(covered)
    if measured + len(running_before) >= budget:
        trial.set_user_attr("over_budget", True)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        log.debug("%s: released, the budget is taken by %d measured and %d running", label, measured,
                  len(running_before))
        return
    number = measured + 1  # what the user sees: the n-th measured setting of the budget
    rejection = next((f"{a.name}: {r}" for a in agents if (r := a.validate(candidate))), None)
    if rejection:
        trial.set_user_attr("rejected_by", rejection)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        emit(Progress("trial", f"rejected {label} ({rejection})", number, budget, _best(study), elapsed,
                      _objective_name(bucketing)))
        return
    emit(Progress("trial", f"running {label}", number, budget, _best(study), elapsed, _objective_name(bucketing)))
    # Start-up variables (TorchTPU eager modes): the backend names them; a trial with any runs
    # in a fresh worker started with them.
    env = candidate.environment(BACKENDS[space.device_kind])
    outcome = runner.run(replace(measure_options, candidate=candidate.to_dict()), env=env)
    trial.set_user_attr("measured", True)
    trial.set_user_attr("trial_wall_s", outcome.seconds)
    if outcome.ok:
        value = trial_attrs.record_measurement(trial, outcome.value, objective.planned_steps, objective.tolerance,
                                               bucketing, memory)
        study.tell(trial, value)
        over = memory.exceeded_by(outcome.value.peak_memory_bytes) if memory is not None else None
        verdict = ("infeasible (accuracy)" if outcome.value.accuracy_error > objective.tolerance
                   else f"infeasible ({over})" if over else "ok")
        message = f"{label}: {_figures(value, outcome.value, objective.planned_steps, bucketing)}, {verdict}"
    else:
        trial_attrs.record_failure(trial, outcome.failure)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        message = f"{label}: failed ({outcome.failure.kind}: {outcome.failure.message})"
    emit(Progress("trial", message, number, budget, _best(study), time.perf_counter() - started,
                  _objective_name(bucketing)))


def _tell_new_failures(study: optuna.Study, agents: list[Agent], space: SearchSpace,
                       trials: list[optuna.trial.FrozenTrial], told: set[int]) -> None:
    """Tell the agents of every failed trial they have not heard of: this worker's, an earlier
    run's, or another worker's (each worker's agents learn from the whole study)."""
    for trial in trials:
        if trial.state == optuna.trial.TrialState.FAIL and trial.number not in told:
            told.add(trial.number)
            _tell_agents(study, agents, space, trial.params, trial.number, trial.user_attrs)


def _tell_agents(study: optuna.Study, agents: list[Agent], space: SearchSpace, params: dict[str, Any], number: int,
                 attrs: dict[str, Any]) -> None:
    """Tell every agent that a measured trial failed, and how (`Agent.learn`); the settings they
    ask for to tell what failed are queued next (once: a setting the study holds is skipped)."""
    kind = attrs.get("failure_kind")
    if kind is None or kind == "interrupted" or "rejected_by" in attrs or "repeat_of" in attrs:
        return
    candidate = space.to_candidate(dict(params))
    for agent in agents:
        for follow_up in agent.learn(candidate, number, str(kind), str(attrs.get("failure_message", ""))):
            study.enqueue_trial(space.complete(follow_up), skip_if_exists=True)


def _objective_name(bucketing: BucketingContext | None) -> str:
    """What a trial's objective is, as progress lines name it."""
    return "expected (bucketed)" if bucketing is not None else "amortised"


def _figures(objective: float, m: Any, planned_steps: int, bucketing: BucketingContext | None) -> str:
    """A trial's figures, leading with its objective (what "best" shows) and how it is made up:
    "470 ms amortised (step 465 ms + compile 25.0 s / 5000 steps), MFU 37.4%"."""
    lead = f"{duration(objective)} {_objective_name(bucketing)}"
    if bucketing is not None:
        return f"{lead} (step {duration(m.step_median)} at the reference length, compile {duration(m.compile_seconds)} a shape), MFU {m.mfu:.1%}"
    return (f"{lead} (step {duration(m.step_median)} + compile {duration(m.compile_seconds)} / {planned_steps} steps), "
            f"MFU {m.mfu:.1%}")


def _bucketing_context(workload: Any, hist: LengthHistogram, options: TuneOptions, runner: Runner,
                       profile: Profile, emit: ProgressCallback, started: float) -> BucketingContext:
    """With a length sample (--lengths, or the file's sample_lengths()), measure step time against
    length once, so every trial's objective can include its best bucketing (bucketing/knob.py)."""
    reference = int(profile.workload.seq_len or 0)
    if not reference:
        raise UserInputError("the length sample needs a sequence length to measure at: set SEQ_LEN or --seq-len", workload.source)
    objective = options.objective
    probes = probe_lengths(hist, objective.bucket_align)
    emit(Progress("profile", f"inputs vary ({len(hist.lengths)} distinct lengths): measuring step time at {probes}",
                  elapsed=time.perf_counter() - started))
    measured = runner.run(BucketCostsRequest(candidate=Candidate.baseline(profile.device.kind).to_dict(),
                                             lengths=probes, warmup_length=reference, batch_size=options.runner.batch_size))
    if not measured.ok:
        raise WorkloadError(f"measuring step time against length failed ({measured.failure.kind}): "
                            f"{measured.failure.message}", workload.source)
    points = [(p.length, p.step_seconds) for p in measured.value.points]
    return BucketingContext(hist, fit_cost_model(points, []), reference, objective.max_buckets, objective.bucket_align)


def _best(study: optuna.Study) -> float | None:
    values = [t.value for t in study.get_trials(deepcopy=False) if trial_attrs.is_feasible(t) and t.value is not None]
    return min(values) if values else None
