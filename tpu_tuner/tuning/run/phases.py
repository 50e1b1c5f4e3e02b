"""A tuning run as named phases, in the order they run; each takes the previous one's result.

1. `start`: the workload described by the worker, the run folder and its fingerprint (`Started`).
2. `profile`: the study opened or joined, the baseline profiled (or a shared study's profile
   taken), and on a TPU the default clock fitted to what that took (`Profiled`).
3. `plan`: the space narrowed to the workload, the agents, the budget, the sampler and the
   seeds, the bucketing curve (`Planned`).
4. `search`: Optuna's ask/tell loop with the tuner's trials, then a shared study settled
   (`Searched`).
5. `race_and_verify`: the leaders raced and the best verified against the baseline,
   interleaved, on this host (`Verified`).
6. `finish`: the verification recorded in a shared study, the result built, the outputs written.

`tpu-tune study finish` builds its `Searched` from the study's record (tuning/run/study_admin.py) and
runs the last two phases, the same functions. Every phase holds the same `Run`: the trial runner,
the run's one clock and where its progress goes.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.units import duration
from tpu_tuner.model.buckets.lengths import LengthHistogram, bucket_histogram
from tpu_tuner.model.workloads.summary import WorkloadSummary
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.runner.load import load_summary
from tpu_tuner.runner.multi_host import MultiHostTrialRunner
from tpu_tuner.runner.ranked_runner import RankedTrialRunner, Runner
from tpu_tuner.runner.requests import MeasureRequest
from tpu_tuner.studies.coverage import covered_settings, measured_count
from tpu_tuner.studies.fingerprint import fingerprint
from tpu_tuner.studies.liveness import RunningWatch, StudyStorage, Worker, set_liveness
from tpu_tuner.studies.loop import StopReason
from tpu_tuner.tuning.agents import Agent
from tpu_tuner.tuning.options.tune_options import TuneOptions
from tpu_tuner.tuning.run.clock import Clock, clock_stop_words, plan_finish
from tpu_tuner.tuning.run.fitted_clock import fit_default_clock
from tpu_tuner.tuning.run.progress import Progress, ProgressCallback
from tpu_tuner.tuning.run.run_location import (
    RunLocation,
    mark_interrupted,
    open_or_join,
    open_run_storage,
    run_location,
)
from tpu_tuner.tuning.run.run_setup import (
    bucketing_context,
    check_ranks,
    prepare_agents,
    profile_baseline,
    start_ranks_on,
)
from tpu_tuner.tuning.run.shared_study import (
    RECORD_ATTR,
    adopt_options,
    make_record,
    publish_profile,
    record_verification,
    shared_profile,
    verification_left_to,
)
from tpu_tuner.tuning.run.tuning_result import TuningResult
from tpu_tuner.tuning.search.bucketing_context import BucketingContext
from tpu_tuner.tuning.search.budget import search_budget
from tpu_tuner.tuning.search.memory_limit import MemoryLimit, memory_limit
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.seeding import build_sampler, enqueue_seeds, warm_seeds
from tpu_tuner.tuning.search.trials import run_search
from tpu_tuner.tuning.search.tuning_trial import TuningTrial
from tpu_tuner.tuning.search.workload_features import features_of
from tpu_tuner.tuning.verify.race import RACE_TOP, leaders
from tpu_tuner.tuning.verify.verification import Verification, verify
from tpu_tuner.tuning.verify.verify_lines import phases_not_run, round_words

REFERENCES_FOLDER = "references"  # the run folder's stored reference and baseline outputs

# Writes a finished result's run-folder files (reports, plots, the tuned config): the outputs layer's
# `write_tuning`, which `tpu_tuner.api` passes in (this layer does not import it).
OutputsWriter = Callable[[TuningResult], object]


@dataclass(frozen=True)
class Run:
    """What every phase of one run holds: the trial runner, the run's one clock (its budget fitted
    once, when the profile phase ends) and where its progress goes."""

    runner: Runner
    clock: Clock
    emit: ProgressCallback

    def say(self, phase: str, message: str) -> None:
        """A progress event of this run, with its time and what is left of its --time-budget."""
        self.emit(Progress(phase, message, elapsed=self.clock.elapsed(), time_left=self.clock.left()))


@dataclass(frozen=True)
class Started:
    """The workload as the worker described it, its length sample, and the run folder."""

    workload: WorkloadSummary
    lengths: LengthHistogram | None
    fingerprint: dict[str, Any]
    location: RunLocation
    options: TuneOptions


def start(run: Run, model_file: Path, options: TuneOptions) -> Started:
    """Describe the workload in the worker (a bad file fails here, exit 2) and make the run
    folder (or reopen a resumed one); the workers' output goes there from now on."""
    given, lengths_file = options.runner, options.objective.lengths_file
    workload = load_summary(
        run.runner, model_file, given.batch_size, given.seq_len, sample_lengths=lengths_file is None
    )
    # And a bad length sample; read once, used for the bucketing knob.
    lengths = (
        bucket_histogram(workload.length_source(), lengths_file)
        if lengths_file is not None or workload.has_sample_lengths
        else None
    )
    check_ranks(workload, lengths, given.ranks)
    current = fingerprint(model_file, workload, given.batch_size, given.seq_len, given.ranks, lengths, given.nnodes)
    location = run_location(workload.name, options, current)
    run.runner.log.move_into(location.run_dir)  # the workers' output, kept off the terminal
    return Started(workload, lengths, current, location, options)


@dataclass(frozen=True)
class Profiled:
    """The study opened (or joined) and the baseline's profile. `first`: this worker created the
    study (or it is the run's own); `keeper`: this worker profiled the baseline, so it keeps the
    study's record. `options`: a joining worker's adopted from the study, the clock's fitted."""

    started: Started
    study: optuna.Study
    storage: StudyStorage
    worker: Worker
    record: dict[str, Any]
    first: bool
    keeper: bool
    profile: Profile
    options: TuneOptions


def profile(run: Run, started: Started) -> Profiled:
    """Open or join the study; profile the baseline, or wait for a shared study's profile. Where
    this worker profiled and the clock is the default on a TPU, the run's clock is fitted here."""
    options, location, workload = started.options, started.location, started.workload
    whole_space = SearchSpace.load(options.search.space, workload.device_kind, ranks=options.runner.ranks)
    storage = open_run_storage(location.storage, options.store)
    worker = Worker.this_process(storage)
    opened = open_or_join(storage, location, make_record(started.fingerprint, whole_space, options), whole_space)
    study, first = opened.study, opened.created or not location.shared
    baseline = None
    if not first:
        run.say("profile", f"joined study {location.study_name!r}: waiting for its baseline profile")
        baseline = shared_profile(study, wait_s=options.runner.trial_timeout_s + 60)
        # The study's search, objective, liveness and budget, as recorded once its profile is in
        # (as created, where its first worker died while profiling and this one profiles).
        # Its clock stays the run's own: adopt_options leaves the time budget.
        options = adopt_options(options, study.user_attrs.get(RECORD_ATTR, opened.record))
        set_liveness(storage, options.store.heartbeat_interval_s, options.store.grace_period_s)
    keeper = baseline is None  # its first worker, or a joining one whose first worker died profiling
    if baseline is None:
        run.say("profile", "profiling the baseline")
        baseline = profile_baseline(run.runner, options, workload.source, workload.device_kind, workload.is_training)
        fitted = fit_default_clock(
            options.search.time_budget_s, baseline.device.kind, run.clock.elapsed(), baseline.device.once_s
        )
        if fitted is not None:  # the clock every phase reads, and the options the study records
            run.clock.set_budget(fitted.budget_s)
            options = replace(options, search=replace(options.search, time_budget_s=fitted.budget_s))
            run.say("profile", f"the clock: {fitted.words}")
    if baseline.workload.dims is None and workload.dims is not None:
        # Which input sizes are the batch and the sequence, as the file declares them: the
        # report's header says them (a recurrent model's sequence of 512 had read "batch 512").
        baseline = replace(baseline, workload=replace(baseline.workload, dims=workload.dims))
    return Profiled(started, study, storage, worker, opened.record, first, keeper, baseline, options)


@dataclass(frozen=True)
class Planned:
    """The search as planned: the narrowed space, the agents (their findings, the memory limit),
    the budget (in `options`), the bucketing curve and each trial's measure request."""

    profiled: Profiled
    space: SearchSpace
    agents: list[Agent]
    findings: dict[str, list[str]]
    memory: MemoryLimit | None
    bucketing: BucketingContext | None
    measure_options: MeasureRequest
    options: TuneOptions


def plan(run: Run, profiled: Profiled) -> Planned:
    """Narrow the space to the workload, let the agents read the profile, set the budget and the
    sampler, queue the seeds (a new study's), share the profile, and measure the length curve."""
    options, study, baseline, started = profiled.options, profiled.study, profiled.profile, profiled.started
    location, nproc = started.location, options.runner.ranks  # every trial's ranks, over all its hosts
    if isinstance(run.runner, RankedTrialRunner):
        start_ranks_on(run.runner, baseline, options.runner.nproc)
    # Narrowed to what can change this workload's step (no optimizer knob for inference, no
    # memory format without convolutions; the layouts the model's shapes allow): knobs/traits.py.
    space = SearchSpace.for_profile(options.search.space, baseline, ranks=nproc)
    if options.runner.nnodes > 1 and not options.runner.tensor_across_hosts:
        space = space.tensor_within_hosts(options.runner.nproc)
    if nproc > 1 and not space.spreads_over_ranks():
        # Without the knob every trial would be N unsharded copies of one process's step.
        raise UserInputError(
            f"--nproc {nproc}: the search space {space.name!r} has no layout parameter "
            "(add one, as search_spaces/default.toml does)"
        )
    record = study.user_attrs.get(RECORD_ATTR, profiled.record)
    agents, findings, memory = prepare_agents(options, baseline, space)
    if isinstance(run.runner, MultiHostTrialRunner):  # which host holds which ranks, under each layout
        findings["hosts"] = run.runner.describe_hosts(space.placements())
    budget = search_budget(options.search.trials, options.search.sampler, space, agents)
    options = replace(options, search=replace(options.search, trials=budget.trials))  # the number the run used
    budget_s = options.search.time_budget_s
    clock = (
        ""
        if budget_s is None
        else f"; the clock: {duration(budget_s)} for search, race and verification together (--time-budget)"
    )
    shared_budget = f"the study's budget: {budget.trials} measured settings across its workers"
    run.say("budget", (budget.describe() if profiled.keeper else shared_budget) + clock)
    # The sampler of the narrowed space (a grid walks its settings): the study's public attribute.
    study.sampler = build_sampler(options, space, shared=location.shared, first=profiled.first)
    if profiled.keeper:
        features = features_of(baseline, started.fingerprint).to_dict()
        study.set_user_attr(RECORD_ATTR, {**record, "options": options.to_plain(), "features": features})
    if location.resumed and not location.shared:
        mark_interrupted(study, profiled.storage)  # nobody else works on a run folder's own study
    if not study.trials:
        seeds = (
            warm_seeds(space, baseline, started.fingerprint, location.storage, location.study_name, options.outputs.out)
            if options.search.warm_start
            else []
        )
        enqueue_seeds(study, space, agents, baseline, seeds)
    if location.shared and profiled.keeper:
        publish_profile(study, baseline)  # after the seeds: a joining worker starts on them
    lengths = started.lengths
    bucketing = (
        bucketing_context(started.workload, lengths, options, run.runner, baseline, run.say) if lengths else None
    )
    measure_options = MeasureRequest(  # each trial's request, with its candidate filled in
        batch_size=options.runner.batch_size,
        seq_len=options.runner.seq_len,
        settings=options.runner.trial_settings,
        peak_flops_per_s=baseline.device.peak.flops_per_s,
        model_flops_per_step=baseline.flops.model_per_step,
        baseline=space.to_candidate(space.baseline_params()).to_dict(),  # accuracy is judged against it
        references_dir=str(location.run_dir / REFERENCES_FOLDER),  # computed once, read by every worker
        reference=baseline.fp32_reference(),  # a baseline fitted to memory lends it its memory knobs
    )
    return Planned(profiled, space, agents, findings, memory, bucketing, measure_options, options)


@dataclass(frozen=True)
class Searched:
    """A searched study as its finish needs it: from `search`, or from a shared study's record
    (`tpu-tune study finish`). `recorder`: the name its verification is recorded under in a
    shared study (None: a run's own study records none); `left_to`: why another worker verifies."""

    study: optuna.Study
    storage_url: str
    space: SearchSpace
    profile: Profile
    agents: list[Agent]
    findings: dict[str, list[str]]
    options: TuneOptions
    run_dir: Path
    recorder: str | None
    left_to: str | None = None


def search(run: Run, planned: Planned) -> Searched:
    """Measure settings until the budget, the space or the clock ends the search (tuning/search/trials.py);
    a worker of a shared study then waits for the study's running trials and learns whether it
    verifies (the one that measured the last trial) or leaves it to another."""
    profiled, study, options = planned.profiled, planned.profiled.study, planned.options
    location, worker = profiled.started.location, profiled.worker
    end = run_search(
        study,
        planned.space,
        planned.agents,
        run.runner,
        planned.measure_options,
        options,
        run.emit,
        run.clock,
        planned.bucketing,
        planned.memory,
        worker,
    )
    if end == StopReason.CLOCK:
        run.say("search", clock_stop_words(TuningTrial.all(study.get_trials(deepcopy=False)), run.clock))
    left_to = None
    if location.shared:
        run.say("verify", "settling: waiting for the study's running trials")
        left_to = verification_left_to(study, worker, end, RunningWatch(2 * options.runner.trial_timeout_s + 60))
    recorder = worker.id if location.shared else None
    return Searched(
        study,
        profiled.storage.url,
        planned.space,
        profiled.profile,
        planned.agents,
        planned.findings,
        options,
        location.run_dir,
        recorder,
        left_to,
    )


@dataclass(frozen=True)
class Verified:
    """The verification: measured here (`measured_here`), recorded by another worker, or left to
    one; `measured`: the study's distinct measured settings it judged."""

    searched: Searched
    verification: Verification
    measured_here: bool
    measured: int


def race_and_verify(run: Run, searched: Searched) -> Verified:
    """Race the search's leaders and verify the best against the baseline, interleaved, on this
    host, fitted to what the run's clock has left (tuning/verify/verification.py), reporting every round; or,
    where another worker of a shared study verifies, keep the baseline here and say why."""
    study, space = searched.study, searched.space
    measured = measured_count(covered_settings(study.get_trials(deepcopy=False)))
    if searched.left_to is not None:
        run.say("verify", f"not verifying here: {searched.left_to}")
        baseline = space.to_candidate(space.baseline_params())
        kept = Verification.keeping_baseline(baseline, f"not verified by this worker: {searched.left_to}")
        return Verified(searched, kept, measured_here=False, measured=measured)
    trials = TuningTrial.all(study.get_trials(deepcopy=False))  # read once for the whole phase (`verify` too)
    planned = plan_finish(trials, RACE_TOP, searched.options.objective.verify_rounds, run.clock.left_to_work())
    run.say("verify", f"re-measuring the leaders and the best against the baseline, interleaved: {planned.describe()}")

    def verify_progress(done: int, first: int, ratio: float) -> None:
        run.say("verify", f"{round_words(done, first)}: best {ratio:.2f}x the baseline's speed so far")

    kind, options, agents = searched.profile.device.kind, searched.options, searched.agents
    memory = memory_limit(options.objective.memory_limit_bytes, kind, searched.profile.device.memory_bytes)
    limit = memory.bytes if memory is not None else None
    verification = verify(study, space, run.runner, options, kind, verify_progress, agents, run.clock, limit, trials)
    for why in phases_not_run(planned, verification, len(leaders(trials, space.baseline_params()))):
        run.say("verify", why)
    return Verified(searched, replace(verification, host=socket.gethostname()), measured_here=True, measured=measured)


def finish(run: Run, verified: Verified, write_outputs: OutputsWriter) -> TuningResult:
    """Record a verification measured here in its shared study (later workers and `study finish`
    read it), build the result, and write the run folder's outputs."""
    searched, verification = verified.searched, verified.verification
    if verified.measured_here and searched.recorder is not None:
        record_verification(searched.study, verification, str(searched.run_dir), searched.recorder, verified.measured)
    result = TuningResult(
        run_dir=searched.run_dir,
        study=searched.study,
        space=searched.space,
        profile=searched.profile,
        findings=searched.findings,
        verification=verification,
        options=searched.options,
        worker_starts=run.runner.workers_started,
        verified=searched.left_to is None,
        storage_url=searched.storage_url,
    )
    write_outputs(result)
    return result


__all__ = [
    "OutputsWriter",
    "Planned",
    "Profiled",
    "Run",
    "Searched",
    "Started",
    "Verified",
    "finish",
    "plan",
    "profile",
    "race_and_verify",
    "search",
    "start",
]
