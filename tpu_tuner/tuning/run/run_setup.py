"""What a tuning run sets up before it searches: the ranks it may start, the baseline's profile,
the agents that read it (the study's memory constraint with them), and with varying input
lengths the step time against length that every trial's bucketing is costed from."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from tpu_tuner.core.errors import UserInputError, WorkloadError, first_text_line
from tpu_tuner.core.failures import FailureKind, classify
from tpu_tuner.devices import backend_class
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.buckets.bucket_cost import fit_cost_model
from tpu_tuner.model.buckets.lengths import LengthHistogram, probe_lengths
from tpu_tuner.model.workloads.summary import WorkloadSummary
from tpu_tuner.parallel.from_plan import planned_layouts
from tpu_tuner.profiling.memory_fit import LADDER
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.runner.ranked_runner import RankedTrialRunner, Runner
from tpu_tuner.runner.requests import BucketCostsRequest, ProfileRequest
from tpu_tuner.tuning.agents import Agent, load_agents
from tpu_tuner.tuning.agents.memory_agent import MemoryAgent
from tpu_tuner.tuning.agents.sharding_agent import ShardingAgent
from tpu_tuner.tuning.options.tune_options import TuneOptions
from tpu_tuner.tuning.search.bucketing_context import BucketingContext
from tpu_tuner.tuning.search.memory_limit import MemoryLimit, memory_limit
from tpu_tuner.tuning.search.search_space import SearchSpace

log = logging.getLogger(__name__)


def check_ranks(workload: WorkloadSummary, lengths: LengthHistogram | None, nproc: int) -> None:
    """What --nproc N cannot run yet, refused before anything is measured (a training step and an
    inference step both split over ranks)."""
    if nproc > 1 and lengths is not None:
        raise UserInputError(
            f"--nproc {nproc} with varying input lengths is not supported: the bucketing "
            "cost model is measured on one process (give a fixed SEQ_LEN and no length sample)",
            workload.source,
        )


def start_ranks_on(runner: RankedTrialRunner, profile: Profile, nproc: int) -> None:
    """Give each rank a device of its own (the device kind is known once profiled), refusing
    more ranks than devices where ranks cannot share one (a CPU's ranks share its cores). `nproc`
    is a host's; a runner over several hosts (`runner.nnodes`) has that many times as many ranks."""
    backend = backend_class(profile.device.kind)
    batch, ranks = profile.workload.batch_size, nproc * runner.nnodes
    if isinstance(batch, int) and batch % ranks:
        raise UserInputError(
            f"--nproc {nproc}"
            + (f" --nnodes {runner.nnodes}" if runner.nnodes > 1 else "")
            + f": the batch of {batch} does not split over {ranks} ranks "
            "(the data-parallel baseline runs a slice on each); give --batch-size a multiple of it"
        )
    if backend.one_device_per_rank and nproc > profile.device.count:
        raise UserInputError(
            f"--nproc {nproc}: this host has {profile.device.count} {profile.device.kind} device(s), one per rank"
        )
    runner.rank_environment = backend.rank_environment
    runner.launch_environment = backend.launch_environment(nproc, runner.nnodes)
    runner.device_kind = profile.device.kind


def profile_baseline(
    runner: Runner, options: TuneOptions, model_file: Path, device_kind: str | None, training: bool = True
) -> Profile:
    """The baseline's profile, measured in the trial worker: the code as it runs on the device
    (on TPU at TorchTPU's default matmul precision, medium); a training step too large for the
    device under the first memory setting that fits (profiling/memory_fit.py: the profile's
    candidate is then the run's baseline), by its estimate, or by measurement where a profile ran
    out of device memory (profiled again in a fresh worker, past each setting that ran out). Out of
    memory under --trial-memory-gb (the worker's address-space limit): that limit is refused."""
    baseline, run, limit = Candidate.baseline(device_kind), options.runner, options.objective.memory_limit_bytes
    ran_out: tuple[str, ...] = ()
    while True:
        request = ProfileRequest(
            candidate=baseline.to_dict(),
            batch_size=run.batch_size,
            seq_len=run.seq_len,
            settings=run.trial_settings,
            fit_memory=True,
            ran_out=ran_out,
        )
        profiled = runner.run(request)
        failure = profiled.failure
        if failure is not None and limit and FailureKind.OOM in (failure.kind, classify(message=failure.message)):
            raise UserInputError(
                f"--trial-memory-gb {limit / 2**30:g} is too little for the baseline itself: profiling "
                f"it under that address-space limit ran out of memory ({first_text_line(failure.message)[:160]})"
            )
        if failure is None or failure.kind != FailureKind.OOM or not training or len(ran_out) > len(LADDER):
            break
        ran_out += (first_text_line(failure.message),)
        log.warning("the baseline's profile ran out of device memory: profiling it again under a memory setting")
    if failure is not None and failure.kind == FailureKind.REFUSED:
        raise WorkloadError(failure.message)  # the worker's own one-line error, naming the file
    if failure is not None:
        raise WorkloadError(f"profiling the baseline failed ({failure.kind}): {failure.message}", model_file)
    return profiled.value


def refuse_below_baseline(memory: MemoryLimit | None, profile: Profile) -> None:
    """A --trial-memory-gb below the baseline's estimated peak is refused before any trial: no
    setting the tuner tries starts from less than the user's own step (UserInputError)."""
    estimated = profile.memory.estimated_peak_bytes
    if memory is None or memory.source != "--trial-memory-gb" or estimated is None or estimated <= memory.bytes:
        return
    raise UserInputError(
        f"--trial-memory-gb {memory.bytes / 2**30:g} is below the baseline's estimated peak memory, "
        f"{estimated / 2**30:.2f} GiB (on fake tensors; `tpu-tune profile` shows it): give at least that"
    )


def prepare_agents(
    options: TuneOptions, profile: Profile, space: SearchSpace | None = None
) -> tuple[list[Agent], dict[str, list[str]], MemoryLimit | None]:
    """The run's agents, having read the baseline profile (their findings, by agent: a lever is
    suggested only where `space`, the run's narrowed space, holds it), and the study's memory
    constraint (--trial-memory-gb, or the device's memory): the memory agent reasons from it, and
    every measured trial is checked against it."""
    device_kind = profile.device.kind
    search, nproc = options.search, options.runner.ranks  # every rank of every host
    agents = load_agents(list(search.agents), device_kind, profile.device.probe)
    memory = memory_limit(options.objective.memory_limit_bytes, device_kind, profile.device.memory_bytes)
    if nproc == 1:  # the profile's estimate is one process's whole step: no rank's of a sharded run
        refuse_below_baseline(memory, profile)
    for agent in agents:
        if isinstance(agent, MemoryAgent):
            agent.limit = memory
        if isinstance(agent, ShardingAgent):
            agent.ranks = nproc
            if search.plan is not None:
                agent.planned = planned_layouts(search.plan, nproc, agent.definition.seeds.plan_top)
                agent.plan_source = str(search.plan)
    findings = {agent.name: agent.diagnose(profile, space) for agent in agents}
    return agents, findings, memory


def bucketing_context(
    workload: WorkloadSummary,
    hist: LengthHistogram,
    options: TuneOptions,
    runner: Runner,
    profile: Profile,
    say: Callable[[str, str], None],
) -> BucketingContext:
    """With a length sample (--lengths, or the file's sample_lengths()), measure step time against
    length once, so every trial's objective can include its best bucketing (tuning/search/bucketing_context.py)."""
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
            candidate=profile.candidate.to_dict(),  # the baseline, fitted to memory where it had to be
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


__all__ = ["bucketing_context", "check_ranks", "prepare_agents", "profile_baseline", "start_ranks_on"]
