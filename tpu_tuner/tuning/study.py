"""A tuning run: profile, let the agents shape the search, search with Optuna, verify.

The search itself is the studies' one ask/tell loop with the tuner's trials (tuning/trials.py);
its sampler and first settings come from tuning/seeding.py.

Trials run in an isolated worker (`TrialRunner`); the study lives in an Optuna storage (SQLite
in the run folder by default), so an interrupted run resumes without losing or repeating
completed trials.
"""

from __future__ import annotations

import logging
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna

from tpu_tuner.core.errors import UserInputError, WorkloadError
from tpu_tuner.core.units import duration
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.bucket_cost import fit_cost_model
from tpu_tuner.model.lengths import LengthHistogram, bucket_histogram, probe_lengths
from tpu_tuner.model.summary import WorkloadSummary
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.runner.hosts import HostGroup
from tpu_tuner.runner.load import load_summary
from tpu_tuner.runner.multi_host import MultiHostTrialRunner
from tpu_tuner.runner.ranked_runner import RankedTrialRunner, Runner, trial_runner
from tpu_tuner.runner.requests import BucketCostsRequest, MeasureRequest
from tpu_tuner.studies import records, run_file
from tpu_tuner.studies.coverage import covered_settings, measured_count
from tpu_tuner.studies.fingerprint import fingerprint
from tpu_tuner.studies.liveness import RunningWatch, Worker, set_liveness, trial_id_of
from tpu_tuner.studies.loop import StopReason
from tpu_tuner.studies.trial_record import write_stored
from tpu_tuner.tuning.agents import Agent
from tpu_tuner.tuning.bucketing import BucketingContext
from tpu_tuner.tuning.budget import search_budget
from tpu_tuner.tuning.clock import Clock, FinishPlan, clock_stop_words, plan_finish
from tpu_tuner.tuning.fitted_clock import fit_default_clock
from tpu_tuner.tuning.options import TuneOptions, default_trial_settings
from tpu_tuner.tuning.progress import Progress, ProgressCallback
from tpu_tuner.tuning.race import RACE_TOP, RACE_WITHIN, leaders
from tpu_tuner.tuning.result import TuningResult
from tpu_tuner.tuning.run_location import RunLocation, open_or_join, open_run_storage, run_location
from tpu_tuner.tuning.run_setup import check_ranks, prepare_agents, profile_baseline, start_ranks_on
from tpu_tuner.tuning.seeding import build_sampler, enqueue_seeds, warm_seeds
from tpu_tuner.tuning.shared_study import (
    RECORD_ATTR,
    JoinRefused,
    adopt_options,
    make_record,
    publish_profile,
    record_verification,
    shared_profile,
    verification_left_to,
)
from tpu_tuner.tuning.space import SearchSpace
from tpu_tuner.tuning.trials import run_search
from tpu_tuner.tuning.verify import Verification, verify
from tpu_tuner.tuning.workload_features import features_of

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)


# Writes a finished result's run-folder files (reports, plots, the tuned config): the outputs layer's
# `write_tuning`, which `tpu_tuner.api.tune` passes in (this layer does not import it).
OutputsWriter = Callable[[TuningResult], object]


def run_tuning(
    model_file: str | Path,
    options: TuneOptions | None,
    progress: ProgressCallback | None,
    write_outputs: OutputsWriter,
    hosts: HostGroup | None = None,
) -> TuningResult:
    """Tune a model file; returns the result, with the run folder written by `write_outputs`.

    This process never imports the model file: a worker loads it and describes it
    (runner/load.py). Bad options are refused before that, and a run that fails after its
    folder exists is marked "failed" in run.json with the reason (docs/run-safety.md). With
    `options.store.study` the run is one worker of a study shared by name (tuning/shared_study.py).
    With `hosts` (the driver of a multi-host run, `runner/hosts.py`) every trial spans its hosts.
    The options are never changed: what the run resolves (the storage of $TPU_TUNE_STORAGE, the
    default trial settings, a shared study's options, the budget) makes new ones, and the result
    holds those the run used.
    """
    # Numbers, search space, storage URL: seconds, nothing written yet.
    options = (options or TuneOptions()).preflight()
    if options.runner.trial_settings is None:  # left to the run by the CLI: building it imports torch
        options = replace(options, runner=replace(options.runner, trial_settings=default_trial_settings()))
    model_file = Path(model_file)
    started = time.perf_counter()
    emit = progress or (lambda event: None)
    run, lengths_file = options.runner, options.objective.lengths_file

    with (
        trial_runner(str(model_file), run.device, run.nproc, run.trial_timeout_s, options.objective.memory_limit_bytes)
        if hosts is None
        else MultiHostTrialRunner(
            str(model_file), run.device, hosts, run.trial_timeout_s, options.objective.memory_limit_bytes
        )
    ) as runner:
        # Bad files fail here, in the worker, with exit 2 (a crash at import too).
        workload = load_summary(runner, model_file, run.batch_size, run.seq_len, sample_lengths=lengths_file is None)
        # And a bad length sample; read once, used for the bucketing knob below.
        lengths = (
            bucket_histogram(workload.length_source(), lengths_file)
            if lengths_file is not None or workload.has_sample_lengths
            else None
        )
        check_ranks(workload, lengths, run.ranks)
        current = fingerprint(model_file, workload, run.batch_size, run.seq_len, run.ranks, lengths, run.nnodes)
        location = run_location(workload.name, options, current)
        runner.log.move_into(location.run_dir)  # the workers' output, kept off the terminal, from here on
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
        run_file.end(location.run_dir, "done")
    else:
        run_file.end(location.run_dir, "searched", reason=result.verification.message)
    _announcer(emit, options, started)("done", f"results in {location.run_dir}")
    return result


def _tune_in(
    location: RunLocation,
    workload: WorkloadSummary,
    lengths: LengthHistogram | None,
    options: TuneOptions,
    runner: Runner,
    emit: ProgressCallback,
    started: float,
    current: dict[str, Any],
    write_outputs: OutputsWriter,
) -> TuningResult:
    """Profile (or take the study's shared profile), search and verify, in an existing run folder."""
    model_file = workload.source
    say = _announcer(emit, options, started)  # the clock's budget is the run's own: adopt_options leaves it
    whole_space = SearchSpace.load(options.search.space, workload.device_kind, ranks=options.runner.ranks)
    storage = open_run_storage(location.storage, options.store)
    worker = Worker.this_process(storage)
    opened = open_or_join(storage, location, make_record(current, whole_space, options), whole_space)
    study, first = opened.study, opened.created or not location.shared
    profile = None
    if not first:
        say("profile", f"joined study {location.study_name!r}: waiting for its baseline profile")
        profile = shared_profile(study, wait_s=options.runner.trial_timeout_s + 60)
        # The study's search, objective, liveness and budget, as recorded once its profile is in
        # (as created, where its first worker died while profiling and this one profiles).
        options = adopt_options(options, study.user_attrs.get(RECORD_ATTR, opened.record))
        set_liveness(storage, options.store.heartbeat_interval_s, options.store.grace_period_s)
    # The worker that profiles the baseline keeps the study's record: its first worker, or a
    # joining one whose first worker died while profiling.
    keeper = profile is None
    if profile is None:
        say("profile", "profiling the baseline")
        profile = profile_baseline(runner, options, model_file, workload.device_kind)
        fitted = fit_default_clock(options.search.time_budget_s, profile.device.kind, time.perf_counter() - started)
        if fitted is not None:  # recorded with the options below: a joining worker keeps the same clock
            options = replace(options, search=replace(options.search, time_budget_s=fitted.budget_s))
            say = _announcer(emit, options, started)
            say("profile", f"the clock: {fitted.words}")
    if profile.workload.dims is None and workload.dims is not None:
        # Which input sizes are the batch and the sequence, as the file declares them: the
        # report's header says them (a recurrent model's sequence of 512 had read "batch 512").
        profile = replace(profile, workload=replace(profile.workload, dims=workload.dims))
    nproc = options.runner.ranks  # every trial's ranks, over all its hosts
    if isinstance(runner, RankedTrialRunner):
        start_ranks_on(runner, profile, options.runner.nproc)
    # Narrowed to what can change this workload's step (no optimizer knob for inference, no
    # memory format without convolutions; the layouts of --nproc ranks the model's shapes allow):
    # knobs/traits.py.
    space = SearchSpace.for_profile(options.search.space, profile, ranks=nproc)
    if options.runner.nnodes > 1 and not options.runner.tensor_across_hosts:
        space = space.tensor_within_hosts(options.runner.nproc)
    if nproc > 1 and not space.spreads_over_ranks():
        # Without the knob every trial would be N unsharded copies of one process's step.
        raise UserInputError(
            f"--nproc {nproc}: the search space {space.name!r} has no layout parameter "
            "(add one, as search_spaces/default.toml does)"
        )
    record = study.user_attrs.get(RECORD_ATTR, opened.record)
    agents, findings, memory = prepare_agents(options, profile, space)
    if isinstance(runner, MultiHostTrialRunner):  # which host holds which ranks, under each layout searched
        findings["hosts"] = runner.describe_hosts(space.placements())
    budget = search_budget(options.search.trials, options.search.sampler, space, agents)
    options = replace(options, search=replace(options.search, trials=budget.trials))  # the number the run used
    clock = (
        ""
        if options.search.time_budget_s is None
        else (
            f"; the clock: {duration(options.search.time_budget_s)} for search, race and verification together "
            "(--time-budget)"
        )
    )
    say(
        "budget",
        (budget.describe() if keeper else f"the study's budget: {budget.trials} measured settings across its workers")
        + clock,
    )
    # The sampler of the narrowed space (a grid walks its settings): the study's public attribute.
    study.sampler = build_sampler(options, space, shared=location.shared, first=first)
    if keeper:
        study.set_user_attr(
            RECORD_ATTR, {**record, "options": options.to_plain(), "features": features_of(profile, current).to_dict()}
        )
    if location.resumed and not location.shared:
        _mark_interrupted(study, storage)  # nobody else works on a run folder's own study
    if not study.trials:
        seeds = (
            warm_seeds(space, profile, current, location.storage, location.study_name, options.outputs.out)
            if options.search.warm_start
            else []
        )
        enqueue_seeds(study, space, agents, profile, seeds)
    if location.shared and keeper:
        publish_profile(study, profile)  # after the seeds: a joining worker starts on them
    bucketing = _bucketing_context(workload, lengths, options, runner, profile, say) if lengths else None
    measure_options = MeasureRequest(  # each trial's request, with its candidate filled in
        batch_size=options.runner.batch_size,
        seq_len=options.runner.seq_len,
        settings=options.runner.trial_settings,
        peak_flops_per_s=profile.device.peak.flops_per_s,
        model_flops_per_step=profile.flops.model_per_step,
        baseline=space.to_candidate(space.baseline_params()).to_dict(),  # accuracy is judged against it
    )
    end = run_search(study, space, agents, runner, measure_options, options, emit, started, bucketing, memory, worker)
    if end == StopReason.CLOCK:
        say("search", clock_stop_words(study.get_trials(deepcopy=False), Clock(options.search.time_budget_s, started)))
    left_to = None
    if location.shared:
        say("verify", "settling: waiting for the study's running trials")
        left_to = verification_left_to(study, worker, end, RunningWatch(2 * options.runner.trial_timeout_s + 60))
    if left_to is not None:
        say("verify", f"not verifying here: {left_to}")
        baseline = space.to_candidate(space.baseline_params())
        verification = Verification.keeping_baseline(baseline, f"not verified by this worker: {left_to}")
    else:
        verification = _verify_here(study, space, runner, options, profile.device.kind, agents, say, started)
        if location.shared:
            record_verification(
                study,
                verification,
                str(location.run_dir),
                worker.id,
                measured_count(covered_settings(study.get_trials(deepcopy=False))),
            )
    result = TuningResult(
        run_dir=location.run_dir,
        study=study,
        space=space,
        profile=profile,
        findings=findings,
        verification=verification,
        options=options,
        worker_starts=runner.workers_started,
        verified=left_to is None,
        storage_url=storage.url,
    )
    write_outputs(result)
    return result


def _announcer(emit: ProgressCallback, options: TuneOptions, started: float) -> Callable[[str, str], None]:
    """Emit a progress event of this run (phase, message), with its time and what is left of its
    --time-budget."""
    clock = Clock(options.search.time_budget_s, started)
    return lambda phase, message: emit(Progress(phase, message, elapsed=clock.elapsed(), time_left=clock.left()))


def _verify_here(
    study: optuna.Study,
    space: SearchSpace,
    runner: Runner,
    options: TuneOptions,
    device_kind: str,
    agents: list[Agent],
    say: Callable[[str, str], None],
    started: float,
) -> Verification:
    """The interleaved verification on this host (tuning/verify.py), reporting its rounds."""
    clock = Clock(options.search.time_budget_s, started)
    plan = plan_finish(
        study.get_trials(deepcopy=False), RACE_TOP, options.objective.verify_rounds, clock.left_to_work()
    )
    say("verify", f"re-measuring the leaders and the best against the baseline, interleaved: {plan.describe()}")

    def verify_progress(done: int, planned: int, ratio: float) -> None:
        say("verify", f"{round_words(done, planned)}: best {ratio:.2f}x the baseline's speed so far")

    verification = verify(study, space, runner, options, device_kind, verify_progress, agents, clock)
    for why in phases_not_run(plan, verification, len(leaders(study, space.baseline_params()))):
        say("verify", why)
    return replace(verification, host=socket.gethostname())


def round_words(done: int, planned: int) -> str:
    """A verification round against the rounds first planned, which stay the total: "round 5/12",
    then "round 14 (12 planned, 2 added: the interval had not decided, or rounds were disturbed)"."""
    if done <= planned:
        return f"round {done}/{planned}"
    added = done - planned
    return f"round {done} ({planned} planned, {added} added: the interval had not decided, or rounds were disturbed)"


def phases_not_run(plan: FinishPlan, verification: Verification, contenders: int) -> list[str]:
    """Why a phase the finish announced (`plan`) did not run, in words: every announced phase
    either runs or is said not to have (issue 55: a race and 12 rounds announced, neither run,
    nothing said). `contenders`: the search's leaders within reach of the best."""
    said = []
    if verification.speedup is None:
        said.append(f"no race and no verification rounds: {verification.message}")
        return said
    if plan.race_top > 1 and not verification.race:
        said.append(
            f"no race: only {contenders} setting(s) came within {RACE_WITHIN:.2f}x of the best in the search, "
            "so one measurement each could not have put them in another order"
            if contenders <= 1
            else "no race: racing the leaders failed, so the search's best was verified (workers.log says why)"
        )
    return said


def _mark_interrupted(study: optuna.Study, storage: optuna.storages.BaseStorage) -> None:
    """Trials left RUNNING by an interrupted run are failed, so that resume repeats none.

    `storage` is the one `study` was opened with: a trial of another process is annotated
    through it, by the trial's storage id (Optuna opens no `Trial` on a stored trial publicly)."""
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        write_stored(
            storage,
            trial_id_of(storage, study, trial.number),
            trial,
            {
                records.FAILURE_KIND: records.INTERRUPTED,
                records.FAILURE_MESSAGE: "the run stopped while this trial was running",
            },
        )
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)


def _bucketing_context(
    workload: Any,
    hist: LengthHistogram,
    options: TuneOptions,
    runner: Runner,
    profile: Profile,
    say: Callable[[str, str], None],
) -> BucketingContext:
    """With a length sample (--lengths, or the file's sample_lengths()), measure step time against
    length once, so every trial's objective can include its best bucketing (tuning/bucketing.py)."""
    reference = int(profile.workload.seq_len or 0)
    if not reference:
        raise UserInputError(
            "the length sample needs a sequence length to measure at: set SEQ_LEN or --seq-len", workload.source
        )
    objective = options.objective
    probes = probe_lengths(hist, objective.bucket_align)
    say("profile", f"inputs vary ({len(hist.lengths)} distinct lengths): measuring step time at {probes}")
    measured = runner.run(
        BucketCostsRequest(
            candidate=Candidate.baseline(profile.device.kind).to_dict(),
            lengths=probes,
            warmup_length=reference,
            batch_size=options.runner.batch_size,
        )
    )
    if measured.failure is not None:
        raise WorkloadError(
            f"measuring step time against length failed ({measured.failure.kind}): {measured.failure.message}",
            workload.source,
        )
    points = measured.value.points
    # The compile cost per new length as measured (a curve C(L) where the lengths' compiles differ,
    # on TorchTPU confirmed by its counters): each trial's compile is scaled along it.
    model = fit_cost_model(
        [(p.length, p.step_seconds) for p in points],
        [(p.length, p.compile_seconds) for p in points],
        [p.shape for p in points if p.shape is not None],
    )
    return BucketingContext(hist, model, reference, objective.max_buckets, objective.bucket_align)
