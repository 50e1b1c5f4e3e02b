"""How a search starts: the sampler that proposes its settings, and the queue of settings it
measures first (the baseline, earlier studies' best, the agents' seeds)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import optuna

from tpu_tuner.devices import backend_class
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.studies import samplers
from tpu_tuner.tuning.agents import Agent
from tpu_tuner.tuning.options.tune_options import TuneOptions
from tpu_tuner.tuning.search import stacking
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.warm_start import WarmSeed, enqueue_warm_seeds, find_warm_seeds
from tpu_tuner.tuning.search.workload_features import features_of

T = TypeVar("T")


def build_sampler(
    options: TuneOptions, space: SearchSpace, shared: bool = False, first: bool = True
) -> optuna.samplers.BaseSampler:
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
    return samplers.build_sampler(
        search.sampler,
        seed,
        startup_trials=4,
        group=True,
        constant_liar=shared,
        settings=space.settings() if grid else None,
        grid=space.grid() if grid else None,
    )


def enqueue_seeds(
    study: optuna.Study, space: SearchSpace, agents: list[Agent], profile: Profile | None, warm: Sequence[WarmSeed] = ()
) -> None:
    """Baseline first (trial 0), then the best settings of earlier studies (`warm`, nearest
    workload first), then every agent's first seed alone, then those first seeds combined, then
    the agents' further seeds in turns, each on top of the combined seed (their winners are
    stacked into one more setting once they are measured: `stacking.py`).

    Round-robin, not agent by agent: with many knobs one agent can propose more seeds than a
    small budget holds (the compile agent's freezing / max-autotune / channels_last variants once
    filled six trials of --trials 6 before bf16 autocast, the precision agent's first guess, ran).
    Further seeds on top of the combined one, not the baseline: they are variants of one agent's
    knobs, and the other agents' knobs are mostly independent of them; on the baseline they
    measured settings every agent already expects to lose (on examples/cnn.py, inductor freezing
    in fp32 while bf16 autocast had already halved the step, and the grid's best was never queued).

    Then the queue is grouped by start-up environment (`by_start_environment`), the baseline's
    group first: each change of environment costs a worker start, so a seed needing another
    environment waits for the end of its predecessors' group rather than splitting it.
    """
    baseline = space.baseline_params()
    per_agent = [agent.seeds(profile, space) for agent in agents]
    first_seeds: dict[str, str] = {name: value for seeds in per_agent if seeds for name, value in seeds[0].items()}
    queue: list[dict[str, str]] = [baseline]
    queue += [{**baseline, **seeds[0]} for seeds in per_agent if seeds]
    combined = {**baseline, **first_seeds}
    queue.append(combined)
    variants = [
        {**combined, **seeds[turn]}
        for turn in range(1, max((len(seeds) for seeds in per_agent), default=0))
        for seeds in per_agent
        if len(seeds) > turn
    ]
    queue += variants
    # The variants that beat the combined seed are stacked into one more setting once measured.
    stacking.record_plan(study, space.complete(combined), [space.complete(v) for v in variants])
    # An earlier study's best has been measured on a like workload: worth more than a guess.
    ordered: list[dict[str, str] | WarmSeed] = [space.complete(baseline), *warm]
    for params in map(space.complete, queue):  # whole settings: a grid sampler asks for none
        if params not in ordered:
            ordered.append(params)
    for entry in by_start_environment(ordered, space, lambda e: e.params if isinstance(e, WarmSeed) else e):
        if isinstance(entry, WarmSeed):
            enqueue_warm_seeds(study, [entry])
        else:
            study.enqueue_trial(entry, skip_if_exists=True)


def by_start_environment(
    settings: Sequence[T], space: SearchSpace, params_of: Callable[[T], dict[str, str]]
) -> list[T]:
    """`settings` with those that need the same start-up environment (TorchTPU's eager modes,
    read once per process) back to back, each group where its first member was and in its own
    order: the first setting (the baseline) stays first. A worker is started for each change of
    environment (runner/trial_runner.py), so a queue of strict, DeferAndFuse, strict settings
    would cost three starts (about 15 s each on a v5e chip) where two do. On a device whose
    settings need no environment (CPU, CUDA) the order is unchanged. `params_of`: a setting's
    parameters."""
    backend = backend_class(space.device_kind)
    groups: dict[tuple[tuple[str, str], ...], list[T]] = {}
    for setting in settings:
        env = space.to_candidate(params_of(setting)).environment(backend)
        groups.setdefault(tuple(sorted(env.items())), []).append(setting)
    return [setting for group in groups.values() for setting in group]


def warm_seeds(
    space: SearchSpace, profile: Profile, current: dict[str, Any], storage: str, study_name: str, results_dir: Path
) -> list[WarmSeed]:
    """The best settings of earlier studies of this device kind (same storage, or the results
    folder), nearest workload first (tuning/search/warm_start.py)."""
    return find_warm_seeds(
        space, features_of(profile, current), storage=storage, results_dir=Path(results_dir), exclude_study=study_name
    )


__all__ = ["build_sampler", "by_start_environment", "enqueue_seeds", "warm_seeds"]
