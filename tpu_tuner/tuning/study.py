"""The tuning loop: profile, let the agents shape the search, search with Optuna, verify.

Trials run in an isolated worker (`TrialRunner`); the study lives in an Optuna storage (SQLite
in the run folder by default), so an interrupted run resumes without losing or repeating
completed trials.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import optuna

from tpu_tuner.agents import Agent, load_agents
from tpu_tuner.agents.memory_agent import MemoryAgent
from tpu_tuner.agents.sharding_agent import ShardingAgent
from tpu_tuner.backends import BACKENDS
from tpu_tuner.bucketing.cost_model import fit_cost_model
from tpu_tuner.bucketing.knob import BucketingContext
from tpu_tuner.bucketing.lengths import LengthHistogram
from tpu_tuner.bucketing.study import bucket_histogram, probe_lengths
from tpu_tuner.candidate import Candidate
from tpu_tuner.definitions import load_definition
from tpu_tuner.errors import UserInputError, WorkloadError
from tpu_tuner.knobs import traits
from tpu_tuner.credentials import password_of, redact, with_password, without_password
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.report.units import duration
from tpu_tuner.results import STUDY_DB, new_run_dir
from tpu_tuner.run_outputs import write_tuning
from tpu_tuner.runner.ranked import RankedTrialRunner, Runner, trial_runner
from tpu_tuner.runner.summary import WorkloadSummary, load_summary
from tpu_tuner.search.space import SearchSpace
from tpu_tuner.sharding.from_plan import planned_layouts
from tpu_tuner.tuning import run_file, trial_attrs
from tpu_tuner.tuning.budget import search_budget
from tpu_tuner.tuning.fingerprint import differences, fingerprint
from tpu_tuner.tuning.memory_limit import MemoryLimit, memory_limit
from tpu_tuner.tuning.options import TuneOptions, default_trial_settings
from tpu_tuner.tuning.run_file import RUN_FILE
from tpu_tuner.tuning.storage import check_storage
from tpu_tuner.tuning.result import TuningResult
from tpu_tuner.tuning.verify import verify

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


def tune(model_file: str | Path, options: TuneOptions | None = None, progress: ProgressCallback | None = None) -> TuningResult:
    """Tune a model file; returns the result and writes the run folder.

    This process never imports the model file: a worker loads it and describes it
    (runner/summary.py). Bad options are refused before that, and a run that fails after its
    folder exists is marked "failed" in run.json with the reason (docs/run-safety.md).
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
        current = fingerprint(model_file, workload, options.batch_size, options.seq_len, options.nproc)
        run_dir, storage, study_name = _run_location(workload.name, options, current)
        try:
            result = _tune_in(run_dir, storage, study_name, workload, lengths, options, runner, emit, started)
        except BaseException as exc:
            run_file.mark_failed(run_dir, exc)
            raise
    run_file.update(run_dir, status="done", updated=time.strftime("%Y-%m-%dT%H:%M:%S"))
    emit(Progress("done", f"results in {run_dir}", elapsed=time.perf_counter() - started))
    return result


def _tune_in(run_dir: Path, storage: str, study_name: str, workload: WorkloadSummary, lengths: LengthHistogram | None,
             options: TuneOptions, runner: Runner, emit: ProgressCallback, started: float) -> TuningResult:
    """Profile, search and verify, in an existing run folder."""
    model_file = workload.source
    emit(Progress("profile", "profiling the baseline", elapsed=time.perf_counter() - started))
    profiled = runner.run("profile", Candidate().to_dict(), {
        "batch_size": options.batch_size, "seq_len": options.seq_len,
        "settings": asdict(options.trial_settings),
    })
    if not profiled.ok and profiled.failure.kind == "refused":
        raise WorkloadError(profiled.failure.message)  # the worker's own one-line error, naming the file
    if not profiled.ok:
        raise WorkloadError(f"profiling the baseline failed ({profiled.failure.kind}): {profiled.failure.message}", model_file)
    profile: Profile = profiled.value
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
    agents, findings, memory = prepare_agents(options, profile)
    budget = search_budget(options.trials, options.sampler, space, agents)
    options = replace(options, trials=budget.trials)  # the run's record holds the number it used
    emit(Progress("budget", budget.describe(), elapsed=time.perf_counter() - started))
    study = _open_study(storage, study_name, options, space)
    _mark_interrupted(study)
    if not study.trials:
        enqueue_seeds(study, space, agents, profile)
    bucketing = _bucketing_context(workload, lengths, options, runner, profile, emit, started) if lengths else None
    measure_options = {
        "batch_size": options.batch_size,
        "seq_len": options.seq_len,
        "settings": asdict(options.trial_settings),
        "peak_flops_per_s": profile.device.peak.flops_per_s,
        "model_flops_per_step": profile.flops.model_per_step,
    }
    run_search(study, space, agents, runner, measure_options, options, emit, started, bucketing, memory)
    emit(Progress("verify", f"re-measuring the best against the baseline, interleaved ({options.verify_rounds} rounds "
                  "of steady steps)", elapsed=time.perf_counter() - started))

    def verify_progress(done: int, rounds: int, ratio: float) -> None:
        emit(Progress("verify", f"round {done}/{rounds}: best {ratio:.2f}x the baseline's speed so far "
                      "(steady step, geometric mean of rounds)", elapsed=time.perf_counter() - started))

    verification = verify(study, space, runner, options, device_kind, verify_progress, agents)
    worker_starts = runner.workers_started

    result = TuningResult(
        run_dir=run_dir, study=study, space=space, profile=profile, findings=findings,
        verification=verification, options=options, worker_starts=worker_starts,
    )
    write_tuning(result)
    return result


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


def _run_location(name: str, options: TuneOptions, current: dict[str, Any]) -> tuple[Path, str, str]:
    """The run folder, the storage URL to connect with, and the study name.

    A new run gets a fresh folder and a run.json; a resumed one is checked first (same workload
    fingerprint, same storage) and refused with nothing rewritten when it differs. The URL
    returned may carry a password (from --storage); the one written never does.
    """
    if options.resume is not None:
        return _resumed_location(Path(options.resume), options, current)
    run_dir = new_run_dir(options.out, name, "tune")
    storage = options.storage or f"sqlite:///{(run_dir / STUDY_DB).resolve()}"
    study_name = run_dir.name
    run_file.write(run_dir, {"storage": without_password(storage), "study_name": study_name,
                             "model_file": str(current["model_file"]), "fingerprint": current,
                             "started": time.strftime("%Y-%m-%dT%H:%M:%S"), **run_file.this_process()})
    return run_dir, storage, study_name


def _resumed_location(run_dir: Path, options: TuneOptions, current: dict[str, Any]) -> tuple[Path, str, str]:
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
    return run_dir, storage, str(saved["study_name"])


def build_sampler(options: TuneOptions, space: SearchSpace) -> optuna.samplers.BaseSampler:
    """The Optuna sampler `options.sampler` names, seeded."""
    if options.sampler == "grid":
        return _AskTellGridSampler(space, seed=options.seed)
    if options.sampler == "random":
        return optuna.samplers.RandomSampler(seed=options.seed)
    # Few startup trials: the seeds already cover the agents' best guesses. Multivariate TPE with
    # `group=True` models the knobs jointly, per group of trials that share a parameter set (the
    # conditional compiler options), where independent TPE models each knob alone: replayed on
    # the measured grids of examples/cnn.py and examples/gpt.py (10 seeds each, with the agents'
    # seeds), it reached within 3% of the grid's best on 10/10 and 10/10, independent TPE on
    # 10/10 and 5/10 (docs/search-efficiency.md). Optuna marks both options experimental.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=options.seed, n_startup_trials=4, multivariate=True, group=True)


def _open_study(storage: str, study_name: str, options: TuneOptions, space: SearchSpace) -> optuna.Study:
    sampler = build_sampler(options, space)
    try:
        return optuna.create_study(
            storage=storage, study_name=study_name, direction="minimize", sampler=sampler, load_if_exists=True
        )
    except Exception as exc:  # noqa: BLE001 - a bad URL or an unreachable database server
        # Driver messages quote the URL, password included: redact the whole line.
        raise UserInputError(redact(f"cannot open the study storage {storage!r}: {type(exc).__name__}: {exc}")) from exc


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


def enqueue_seeds(study: optuna.Study, space: SearchSpace, agents: list[Agent], profile: Profile | None) -> None:
    """Baseline first (trial 0), then every agent's first seed alone, then those first seeds
    combined, then the agents' further seeds in turns, each on top of the combined seed.

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
    seen: list[dict[str, str]] = []
    for params in map(space.complete, queue):  # whole settings: a grid sampler asks for none
        if params not in seen:
            seen.append(params)
            study.enqueue_trial(params, skip_if_exists=True)


def run_search(
    study: optuna.Study,
    space: SearchSpace,
    agents: list[Agent],
    runner: Runner,
    measure_options: dict[str, Any],
    options: TuneOptions,
    emit: ProgressCallback,
    started: float,
    bucketing: BucketingContext | None = None,
    memory: MemoryLimit | None = None,
) -> None:
    distinct_total = space.size()
    asked = 0
    for earlier_trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)):
        _tell_agents(study, agents, space, earlier_trial.params, earlier_trial.number, earlier_trial.user_attrs)
    while True:
        finished = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
        elapsed = time.perf_counter() - started
        # Settings already covered: measured, failed or rejected. Trials an interrupted run left
        # behind were never measured: they neither count nor answer repeats.
        covered = {
            _key(t.params): t
            for t in finished
            if "repeat_of" not in t.user_attrs and t.user_attrs.get("failure_kind") != "interrupted"
        }
        # The budget counts settings *measured*. Rejections cost nothing, and samplers re-propose
        # settings in small categorical spaces: a repeat is answered from the earlier trial, so
        # neither counts (a bound on asks stops a sampler that only repeats).
        measured = sum(1 for t in covered.values() if "rejected_by" not in t.user_attrs)
        if measured >= options.trials or (options.timeout_s and elapsed > options.timeout_s):
            return
        if len(covered) >= distinct_total or asked >= 20 * options.trials:
            log.info("stopping: %d of %d settings of the space covered", len(covered), distinct_total)
            return
        asked += 1
        trial = study.ask()
        params = space.suggest(trial)
        candidate = space.to_candidate(params)
        label = candidate.describe()
        earlier = covered.get(_key(params))
        if earlier is not None:
            trial_attrs.copy_attrs(earlier, trial, options.tolerance)
            study.tell(trial, earlier.value if earlier.state == optuna.trial.TrialState.COMPLETE else None,
                       state=earlier.state)
            log.debug("%s: repeat of trial %d, not re-measured", label, earlier.number)
            continue
        number = measured + 1  # what the user sees: the n-th measured setting of the budget
        rejection = next((f"{a.name}: {r}" for a in agents if (r := a.validate(candidate))), None)
        if rejection:
            trial.set_user_attr("rejected_by", rejection)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            emit(Progress("trial", f"rejected {label} ({rejection})", number, options.trials, _best(study), elapsed,
                          _objective_name(bucketing)))
            continue
        emit(Progress("trial", f"running {label}", number, options.trials, _best(study), elapsed, _objective_name(bucketing)))
        # Start-up variables (TorchTPU eager modes): the backend names them; a trial with any runs
        # in a fresh worker started with them.
        env = candidate.environment(BACKENDS[space.device_kind])
        outcome = runner.run("measure", candidate.to_dict(), measure_options, env=env)
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
            _tell_agents(study, agents, space, params, trial.number,
                         {"failure_kind": outcome.failure.kind, "failure_message": outcome.failure.message})
            message = f"{label}: failed ({outcome.failure.kind}: {outcome.failure.message})"
        emit(Progress("trial", message, number, options.trials, _best(study), time.perf_counter() - started,
                      _objective_name(bucketing)))


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
    measured = runner.run("bucket_costs", Candidate().to_dict(), {
        "lengths": probes, "warmup_length": reference, "batch_size": options.batch_size})
    if not measured.ok:
        raise WorkloadError(f"measuring step time against length failed ({measured.failure.kind}): "
                            f"{measured.failure.message}", workload.source)
    points = [(p["length"], p["step_seconds"]) for p in measured.value["points"]]
    return BucketingContext(hist, fit_cost_model(points, []), reference, options.max_buckets, options.bucket_align)


def _key(params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))


def _best(study: optuna.Study) -> float | None:
    values = [t.value for t in study.get_trials(deepcopy=False) if trial_attrs.is_feasible(t) and t.value is not None]
    return min(values) if values else None
