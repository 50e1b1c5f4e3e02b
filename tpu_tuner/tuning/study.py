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
from optuna.storages import RDBStorage

from tpu_tuner.tuning.agents import Agent, load_agents
from tpu_tuner.tuning.agents.memory_agent import MemoryAgent
from tpu_tuner.tuning.agents.sharding_agent import ShardingAgent
from tpu_tuner.devices import BACKENDS
from tpu_tuner.model.bucket_cost import fit_cost_model
from tpu_tuner.tuning.bucketing import BucketingContext
from tpu_tuner.model.lengths import LengthHistogram
from tpu_tuner.model.lengths import bucket_histogram, probe_lengths
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.core.errors import UserInputError, WorkloadError
from tpu_tuner.knobs import traits
from tpu_tuner.knobs.matmul_precision import device_default
from tpu_tuner.core.credentials import password_of, redact, with_password, without_password
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.core.units import duration
from tpu_tuner.core.run_folder import STUDY_DB, new_run_dir
from tpu_tuner.runner.ranked_runner import RankedTrialRunner, Runner, trial_runner
from tpu_tuner.model.summary import WorkloadSummary
from tpu_tuner.runner.load import load_summary
from tpu_tuner.runner.requests import BucketCostsRequest, MeasureRequest, ProfileRequest
from tpu_tuner.tuning.space import SearchSpace
from tpu_tuner.parallel.from_plan import planned_layouts
from tpu_tuner.studies import run_file
from tpu_tuner.tuning import trial_attrs
from tpu_tuner.tuning.budget import search_budget
from tpu_tuner.studies.coverage import covered_settings, measured_count, setting_key as _key
from tpu_tuner.studies.fingerprint import differences, fingerprint
from tpu_tuner.studies.liveness import (Heartbeat, RunningWatch, Worker, fail_lost_trials, open_storage,
                                       set_liveness)
from tpu_tuner.tuning.memory_limit import MemoryLimit, memory_limit
from tpu_tuner.tuning.options import TuneOptions, default_trial_settings
from tpu_tuner.studies.run_file import RUN_FILE
from tpu_tuner.tuning.shared_study import (RECORD_ATTR, JoinRefused, SharedStudy, adopt_options, make_record, open_shared,
                                           plain_options, publish_profile, record_verification, shared_profile, verification_left_to)
from tpu_tuner.studies.storage import STORAGE_ENV, check_storage, shared_sqlite, storage_from_environment
from tpu_tuner.tuning.result import TuningResult
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
    `options.study` the run is one worker of a study shared by name (tuning/shared_study.py).
    """
    options = options or TuneOptions()
    options.preflight()  # numbers, search space, storage URL: seconds, nothing written yet
    if options.trial_settings is None:
        options.trial_settings = default_trial_settings()
    model_file = Path(model_file)
    started = time.perf_counter()
    emit = progress or (lambda event: None)

    with trial_runner(str(model_file), options.device, options.nproc, options.trial_timeout_s,
                      options.memory_limit_bytes) as runner:
        # Bad files fail here, in the worker, with exit 2 (a crash at import too).
        workload = load_summary(runner, model_file, options.batch_size, options.seq_len,
                                sample_lengths=options.lengths_file is None)
        # And a bad length sample; read once, used for the bucketing knob below.
        lengths = (bucket_histogram(workload.length_source(), options.lengths_file)
                   if options.lengths_file is not None or workload.has_sample_lengths else None)
        _check_ranks(workload, lengths, options)
        current = fingerprint(model_file, workload, options.batch_size, options.seq_len, options.nproc, lengths)
        location = _run_location(workload.name, options, current)
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


@dataclass(frozen=True)
class RunLocation:
    """Where a run keeps its files and its study: the storage URL may carry a password (it is
    used to connect, never written); `shared` for a study joined by name (`--study`)."""

    run_dir: Path
    storage: str
    study_name: str
    shared: bool
    resumed: bool


def _tune_in(location: RunLocation, workload: WorkloadSummary, lengths: LengthHistogram | None, options: TuneOptions,
             runner: Runner, emit: ProgressCallback, started: float, current: dict[str, Any],
             write_outputs: OutputsWriter) -> TuningResult:
    """Profile (or take the study's shared profile), search and verify, in an existing run folder."""
    model_file = workload.source
    whole_space = SearchSpace.load(options.space, workload.device_kind, ranks=options.nproc)
    storage = _open_storage(location.storage, options)
    worker = Worker.this_process(storage)
    opened = _open_or_join(storage, location, make_record(current, whole_space, options), whole_space)
    study, first = opened.study, opened.created or not location.shared
    profile = None
    if not first:
        # The study's search, objective and liveness; its budget again once its profile is in.
        options = adopt_options(options, opened.record)
        set_liveness(storage, options.heartbeat_interval_s, options.grace_period_s)
        emit(Progress("profile", f"joined study {location.study_name!r}: waiting for its baseline profile",
                      elapsed=time.perf_counter() - started))
        profile = shared_profile(study, wait_s=options.trial_timeout_s + 60)
    # The worker that profiles the baseline keeps the study's record: its first worker, or a
    # joining one whose first worker died while profiling.
    keeper = profile is None
    if profile is None:
        emit(Progress("profile", "profiling the baseline", elapsed=time.perf_counter() - started))
        profile = _profile_baseline(runner, options, model_file, workload.device_kind)
    device_kind = profile.device.kind
    if isinstance(runner, RankedTrialRunner):
        _start_ranks_on(runner, profile, options)
    # Narrowed to what can change this workload's step (no optimizer knob for inference, no
    # memory format without convolutions; the layouts of --nproc ranks the model's shapes allow):
    # knobs/traits.py.
    space = (SearchSpace.load(options.space, device_kind, ranks=options.nproc)
             .for_workload(traits.of_profile(profile.workload)))
    if options.nproc > 1 and not any(p.name == "layout" for p in space.params):
        # Without the knob every trial would be N unsharded copies of one process's step.
        raise UserInputError(f"--nproc {options.nproc}: the search space {space.name!r} has no layout parameter "
                             "(add one, as search_spaces/default.toml does)")
    record = study.user_attrs.get(RECORD_ATTR, opened.record)
    if not keeper:
        options = adopt_options(options, record)
    agents, findings, memory = prepare_agents(options, profile)
    budget = search_budget(options.trials, options.sampler, space, agents)
    options = replace(options, trials=budget.trials)  # the run's record holds the number it used
    emit(Progress("budget", budget.describe() if keeper else f"the study's budget: {budget.trials} measured settings "
                  "across its workers", elapsed=time.perf_counter() - started))
    # The study again, with the sampler of the narrowed space (a grid walks its settings).
    study = optuna.load_study(study_name=location.study_name, storage=storage,
                              sampler=build_sampler(options, space, shared=location.shared, first=first))
    if keeper:
        study.set_user_attr(RECORD_ATTR, {**record, "options": plain_options(options),
                                          "features": features_of(profile, current).to_dict()})
    if location.resumed and not location.shared:
        _mark_interrupted(study)  # nobody else works on a run folder's own study
    if not study.trials:
        seeds = _warm_seeds(space, profile, current, location, options) if options.warm_start else []
        enqueue_seeds(study, space, agents, profile, seeds)
    if location.shared and keeper:
        publish_profile(study, profile)  # after the seeds: a joining worker starts on them
    bucketing = _bucketing_context(workload, lengths, options, runner, profile, emit, started) if lengths else None
    measure_options = MeasureRequest(  # each trial's request, with its candidate filled in
        batch_size=options.batch_size,
        seq_len=options.seq_len,
        settings=options.trial_settings,
        peak_flops_per_s=profile.device.peak.flops_per_s,
        model_flops_per_step=profile.flops.model_per_step,
    )
    end = run_search(study, space, agents, runner, measure_options, options, emit, started, bucketing, memory, worker)
    left_to = None
    if location.shared:
        emit(Progress("verify", "settling: waiting for the study's running trials", elapsed=time.perf_counter() - started))
        left_to = verification_left_to(study, worker, end, RunningWatch(2 * options.trial_timeout_s + 60))
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


def _profile_baseline(runner: Runner, options: TuneOptions, model_file: Path, device_kind: str | None) -> Profile:
    """The baseline's profile, measured in the trial worker: the code as it runs on the device
    (on TPU at TorchTPU's default matmul precision, medium)."""
    baseline = Candidate(matmul_precision=device_default(device_kind))
    profiled = runner.run(ProfileRequest(candidate=baseline.to_dict(), batch_size=options.batch_size,
                                         seq_len=options.seq_len, settings=options.trial_settings))
    if not profiled.ok and profiled.failure.kind == "refused":
        raise WorkloadError(profiled.failure.message)  # the worker's own one-line error, naming the file
    if not profiled.ok:
        raise WorkloadError(f"profiling the baseline failed ({profiled.failure.kind}): {profiled.failure.message}", model_file)
    return profiled.value


def _verify_here(study: optuna.Study, space: SearchSpace, runner: Runner, options: TuneOptions, device_kind: str,
                 agents: list[Agent], emit: ProgressCallback, started: float) -> Verification:
    """The interleaved verification on this host (tuning/verify.py), reporting its rounds."""
    emit(Progress("verify", f"re-measuring the best against the baseline, interleaved ({options.verify_rounds} rounds "
                  "of steady steps)", elapsed=time.perf_counter() - started))

    def verify_progress(done: int, rounds: int, ratio: float) -> None:
        emit(Progress("verify", f"round {done}/{rounds}: best {ratio:.2f}x the baseline's speed so far "
                      "(steady step, geometric mean of rounds)", elapsed=time.perf_counter() - started))

    return replace(verify(study, space, runner, options, device_kind, verify_progress, agents), host=socket.gethostname())


def prepare_agents(options: TuneOptions, profile: Profile) -> tuple[list[Agent], dict[str, list[str]], MemoryLimit | None]:
    """The run's agents, having read the baseline profile (their findings, by agent), and the
    study's memory constraint (--trial-memory-gb, or the device's memory): the memory agent
    reasons from it, and every measured trial is checked against it."""
    device_kind = profile.device.kind
    agents = load_agents(list(options.agents), device_kind, profile.device.probe)
    memory = memory_limit(options.memory_limit_bytes, device_kind, profile.device.memory_bytes)
    for agent in agents:
        if isinstance(agent, MemoryAgent):
            agent.limit = memory
        if isinstance(agent, ShardingAgent):
            agent.ranks = options.nproc
            if options.plan is not None:
                agent.planned = planned_layouts(options.plan, options.nproc, agent.definition.seeds.plan_top)
                agent.plan_source = str(options.plan)
    findings = {agent.name: agent.diagnose(profile) for agent in agents}
    return agents, findings, memory


def _check_ranks(workload: WorkloadSummary, lengths: LengthHistogram | None, options: TuneOptions) -> None:
    """What --nproc N cannot run yet, refused before anything is measured."""
    if options.nproc == 1:
        return
    if not workload.is_training:
        raise UserInputError(f"--nproc {options.nproc} splits a training step over ranks (data / fsdp / tensor "
                             "layouts); this file's step is inference (it declares no loss)", workload.source)
    if lengths is not None:
        raise UserInputError(f"--nproc {options.nproc} with varying input lengths is not supported: the bucketing "
                             "cost model is measured on one process (give a fixed SEQ_LEN and no length sample)",
                             workload.source)


def _start_ranks_on(runner: RankedTrialRunner, profile: Profile, options: TuneOptions) -> None:
    """Give each rank a device of its own (the device kind is known once profiled), refusing
    more ranks than devices where ranks cannot share one (a CPU's ranks share its cores)."""
    backend = BACKENDS[profile.device.kind]
    batch = profile.workload.get("batch_size")
    if isinstance(batch, int) and batch % options.nproc:
        raise UserInputError(f"--nproc {options.nproc}: the batch of {batch} does not split over {options.nproc} ranks "
                             "(the data-parallel baseline runs a slice on each); give --batch-size a multiple of it")
    if profile.device.kind != "cpu" and options.nproc > profile.device.count:
        raise UserInputError(f"--nproc {options.nproc}: this host has {profile.device.count} "
                             f"{profile.device.kind} device(s), one per rank")
    runner.rank_environment = backend.rank_environment
    runner.launch_environment = backend.launch_environment(options.nproc)


def _run_location(name: str, options: TuneOptions, current: dict[str, Any]) -> RunLocation:
    """The run folder, the storage URL to connect with, and the study name.

    A new run gets a fresh folder and a run.json; a resumed one is checked first (same workload
    fingerprint, same storage) and refused with nothing rewritten when it differs. The URL
    returned may carry a password (from --storage); the one written never does. A worker of a
    shared study (`--study NAME`) has a folder of its own too: its report, its trials' view.
    """
    if options.resume is not None:
        return _resumed_location(Path(options.resume), options, current)
    run_dir = new_run_dir(options.out, name, "tune")
    if options.study is not None:
        storage = options.storage or shared_sqlite(options.out)
        study_name = options.study
    else:
        storage = options.storage or f"sqlite:///{(run_dir / STUDY_DB).resolve()}"
        study_name = run_dir.name
    run_file.write(run_dir, {"storage": without_password(storage), "study_name": study_name,
                             "shared": options.study is not None,
                             "model_file": str(current["model_file"]), "fingerprint": current,
                             "started": time.strftime("%Y-%m-%dT%H:%M:%S"), **run_file.this_process()})
    return RunLocation(run_dir, storage, study_name, shared=options.study is not None, resumed=False)


def _resumed_location(run_dir: Path, options: TuneOptions, current: dict[str, Any]) -> RunLocation:
    saved = run_file.read(run_dir)
    if "storage" not in saved or "study_name" not in saved:
        raise UserInputError(f"not a tuning run folder (no readable {RUN_FILE})", run_dir)
    where = f"{run_dir}/: resume refused"
    recorded = saved.get("fingerprint")
    if isinstance(recorded, dict):
        differing = differences(recorded, current)
        if differing:
            raise UserInputError(f"{where}: {'; '.join(differing)}")
    else:
        log.warning("%s has no workload fingerprint (written before fingerprints): resuming unchecked", run_dir)
    stored = str(saved["storage"])
    storage = stored
    from_environment = storage_from_environment()
    if options.storage is None and from_environment is not None:
        # $TPU_TUNE_STORAGE is ambient: its password is used where it names this run's database.
        if without_password(from_environment) == without_password(stored):
            options = replace(options, storage=from_environment)
        else:
            log.info("$%s names another database than the run's: not used for this resume", STORAGE_ENV)
    if options.storage is not None:
        # The password is never stored: it comes from --storage given again, which must name the
        # same database (or from libpq's PGPASSWORD / ~/.pgpass when the URL has none).
        if without_password(options.storage) != without_password(stored):
            raise UserInputError(f"{where}: --storage {redact(options.storage)!r} is not the run's storage "
                                 f"{redact(stored)!r}")
        storage = with_password(stored, password_of(options.storage))
    elif stored != without_password(stored):
        log.warning("%s stores its storage URL with a password (written before redaction)", run_dir)
    else:
        check_storage(stored)  # a stored server URL: reachable, before anything is rewritten
    run_file.update(run_dir, **run_file.this_process())
    return RunLocation(run_dir, storage, str(saved["study_name"]), shared=bool(saved.get("shared")), resumed=True)


def _open_storage(url: str, options: TuneOptions) -> RDBStorage:
    """The study's storage, with heartbeats; a bad URL or an unreachable server in one line."""
    try:
        return open_storage(url, options.heartbeat_interval_s, options.grace_period_s)
    except Exception as exc:  # noqa: BLE001 - a bad URL or an unreachable database server
        # Driver messages quote the URL, password included: redact the whole line.
        raise UserInputError(redact(f"cannot open the study storage {url!r}: {type(exc).__name__}: {exc}")) from exc


def _open_or_join(storage: RDBStorage, location: RunLocation, record: dict[str, Any],
                  space: SearchSpace) -> SharedStudy:
    """The run's study: created or joined by name when shared, else created (or reopened, on
    resume) under the run folder's name."""
    # A placeholder sampler: the study is reopened with the real one once the space is narrowed.
    placeholder = optuna.samplers.RandomSampler()
    try:
        if location.shared:
            return open_shared(storage, location.study_name, placeholder, record, space)
        study = optuna.create_study(storage=storage, study_name=location.study_name, direction="minimize",
                                    sampler=placeholder, load_if_exists=True)
    except UserInputError:
        raise
    except Exception as exc:  # noqa: BLE001 - the server went away between the check and here
        raise UserInputError(redact(f"cannot open the study {location.study_name!r} in {location.storage!r}: "
                                    f"{type(exc).__name__}: {exc}")) from exc
    # A run's own study: this worker is its only one, and keeps its record.
    return SharedStudy(study, True, study.user_attrs.get(RECORD_ATTR) or record)


def _warm_seeds(space: SearchSpace, profile: Profile, current: dict[str, Any], location: RunLocation,
                options: TuneOptions) -> list[WarmSeed]:
    """The best settings of earlier studies of this device kind (same storage, or the results
    folder), nearest workload first (tuning/warm_start.py)."""
    return find_warm_seeds(space, features_of(profile, current), storage=location.storage,
                           results_dir=Path(options.out), exclude_study=location.study_name)


def build_sampler(options: TuneOptions, space: SearchSpace, shared: bool = False,
                  first: bool = True) -> optuna.samplers.BaseSampler:
    """The Optuna sampler `options.sampler` names, seeded.

    In a shared study every TPE or random worker but the first draws from a seed of its own (the
    same seed would propose the same settings in every worker), and TPE treats the other
    workers' running trials as if they had scored the worst so far (`constant_liar`, Optuna's
    remedy for parallel workers proposing the same point). A grid keeps the study's seed in
    every worker: Optuna's GridSampler walks one shuffled grid that the workers share (with
    other seeds, two workers on a 12-setting grid reached 8 settings in 12 trials).
    """
    seed = options.seed if first or options.sampler == "grid" else random.SystemRandom().randrange(2**31)
    if options.sampler == "grid":
        return _AskTellGridSampler(space, seed=seed)
    if options.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # Few startup trials: the seeds already cover the agents' best guesses. Multivariate TPE with
    # `group=True` models the knobs jointly, per group of trials that share a parameter set (the
    # conditional compiler options), where independent TPE models each knob alone: replayed on
    # the measured grids of examples/cnn.py and examples/gpt.py (10 seeds each, with the agents'
    # seeds), it reached within 3% of the grid's best on 10/10 and 10/10, independent TPE on
    # 10/10 and 5/10 (docs/search-efficiency.md). Optuna marks both options experimental.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=4, multivariate=True, group=True,
                                          constant_liar=shared)


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler for an ask/tell loop: its after_trial only calls `study.stop()` once the grid
    is exhausted, which Optuna forbids outside `optimize`; the loop stops on its own instead.
    It walks the space's valid settings (`SearchSpace.settings()`), not the product of every
    parameter's choices: a conditional parameter (inductor's options) is in a grid point only
    where it is active, so no setting is enumerated twice."""

    def __init__(self, space: SearchSpace, seed: int | None = None) -> None:
        super().__init__(space.grid(), seed=seed)
        # A grid point is a tuple in `_param_names` order; an inactive parameter's slot holds a
        # placeholder the trial never asks for. (Optuna keeps no public hook for a non-product grid.)
        first = {name: choices[0] for name, choices in space.grid().items()}
        self._all_grids = [tuple(setting.get(name, first[name]) for name in self._param_names)
                           for setting in space.settings()]
        self._rng.rng.shuffle(self._all_grids)  # type: ignore[arg-type]
        self._n_min_trials = len(self._all_grids)

    def after_trial(self, study, trial, state, values) -> None:  # type: ignore[no-untyped-def]
        return None


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
    """Measure settings until the study holds `options.trials` measured ones (counted over all
    its workers), the space is covered, or `options.timeout_s` passes; returns which.

    With other workers on the study, a setting another worker is measuring is not measured again
    here, and when their running trials hold the rest of the budget this worker waits for them
    (one may still be lost and queued again) instead of starting more.
    """
    worker = worker or Worker.this_process(None)
    watch = RunningWatch(2 * options.trial_timeout_s + 60)
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
        if measured >= options.trials:
            return "budget"
        if options.timeout_s and elapsed > options.timeout_s:
            return "timeout"
        if len(covered) >= distinct_total or asked >= 20 * options.trials:
            log.info("stopping: %d of %d settings of the space covered", len(covered), distinct_total)
            return "covered" if len(covered) >= distinct_total else "asks"
        # Other workers' trials: none of this worker's is running between two of its trials.
        running = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
        if measured + len(running) >= options.trials:
            if not waiting:
                emit(Progress("trial", f"the rest of the budget is running on other workers ({len(running)} "
                              "trial(s)): waiting for them", measured, options.trials, _best(study), elapsed,
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
    # The study as it is now, after this trial was asked: another worker may have finished this
    # setting, be measuring it, or have taken the last of the budget since this loop looked.
    trials = study.get_trials(deepcopy=False)
    covered = covered_settings(trials)
    earlier = covered.get(_key(params))
    if earlier is not None:
        trial_attrs.copy_attrs(earlier, trial, options.tolerance)
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
    if measured + len(running_before) >= options.trials:
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
        emit(Progress("trial", f"rejected {label} ({rejection})", number, options.trials, _best(study), elapsed,
                      _objective_name(bucketing)))
        return
    emit(Progress("trial", f"running {label}", number, options.trials, _best(study), elapsed, _objective_name(bucketing)))
    # Start-up variables (TorchTPU eager modes): the backend names them; a trial with any runs
    # in a fresh worker started with them.
    env = candidate.environment(BACKENDS[space.device_kind])
    outcome = runner.run(replace(measure_options, candidate=candidate.to_dict()), env=env)
    trial.set_user_attr("measured", True)
    trial.set_user_attr("trial_wall_s", outcome.seconds)
    if outcome.ok:
        value = trial_attrs.record_measurement(trial, outcome.value, options.planned_steps, options.tolerance,
                                               bucketing, memory)
        study.tell(trial, value)
        over = memory.exceeded_by(outcome.value.peak_memory_bytes) if memory is not None else None
        verdict = ("infeasible (accuracy)" if outcome.value.accuracy_error > options.tolerance
                   else f"infeasible ({over})" if over else "ok")
        message = f"{label}: {_figures(value, outcome.value, options.planned_steps, bucketing)}, {verdict}"
    else:
        trial_attrs.record_failure(trial, outcome.failure)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        message = f"{label}: failed ({outcome.failure.kind}: {outcome.failure.message})"
    emit(Progress("trial", message, number, options.trials, _best(study), time.perf_counter() - started,
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
    reference = int(profile.workload.get("seq_len") or 0)
    if not reference:
        raise UserInputError("the length sample needs a sequence length to measure at: set SEQ_LEN or --seq-len", workload.source)
    probes = probe_lengths(hist, options.bucket_align)
    emit(Progress("profile", f"inputs vary ({len(hist.lengths)} distinct lengths): measuring step time at {probes}",
                  elapsed=time.perf_counter() - started))
    measured = runner.run(BucketCostsRequest(candidate=Candidate(matmul_precision=device_default(profile.device.kind)).to_dict(),
                                             lengths=probes, warmup_length=reference, batch_size=options.batch_size))
    if not measured.ok:
        raise WorkloadError(f"measuring step time against length failed ({measured.failure.kind}): "
                            f"{measured.failure.message}", workload.source)
    points = [(p.length, p.step_seconds) for p in measured.value.points]
    return BucketingContext(hist, fit_cost_model(points, []), reference, options.max_buckets, options.bucket_align)


def _best(study: optuna.Study) -> float | None:
    values = [t.value for t in study.get_trials(deepcopy=False) if trial_attrs.is_feasible(t) and t.value is not None]
    return min(values) if values else None
