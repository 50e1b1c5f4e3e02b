"""Warm start: a new study begins with the best settings of earlier studies on the same device kind.

Where earlier studies come from: tuning/search/earlier_studies.py; how they are ranked (`distance`):
tuning/search/workload_features.py. Only studies of the same device kind count; the new study itself is left
out by name.

The setting a study offers is its best: the feasible trial with the lowest value that this space
can run (its knob values are choices of this space, the knobs this space keeps fixed at the same
values) and that is not a baseline (the study's own, or this space's). Walking its feasible
trials from the fastest, the first one that qualifies is taken, and none once the walk reaches
the study's baseline: a setting slower than the baseline is not worth a trial.

It reads only run.json, profile.json, result.json (or tuned_config.toml) and the studies it
needs: folders are ranked from their JSON first and studies opened closest first, until `limit`
seeds are found.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from tpu_tuner.core.credentials import redact
from tpu_tuner.knobs import registry as knobs
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.studies import records
from tpu_tuner.studies.liveness import StudyStorage
from tpu_tuner.tuning.search.earlier_studies import EarlierStudy, Verified, folder_studies, storage_studies
from tpu_tuner.tuning.search.tuning_trial import TuningTrial
from tpu_tuner.tuning.search.workload_features import MAX_DISTANCE, WorkloadFeatures, distance

if TYPE_CHECKING:
    from tpu_tuner.tuning.search.search_space import SearchSpace

log = logging.getLogger(__name__)

# The trial user attr an enqueued warm-start setting carries (WarmSeed.attrs()).
TRIAL_ATTR = records.WARM_START


@dataclass(frozen=True)
class WarmSeed:
    """An earlier study's best setting, to be measured early in this one."""

    params: dict[str, str]  # the setting, whole for this space (SearchSpace.complete)
    source: str  # "study 'gpt-v5e' in postgresql://tune@db/tune" or "run results/gpt-tune-..." (no password)
    match: str  # "same workload" or "nearest: ..." (`distance`)
    distance: float  # 0 for the same workload; the ranking key
    objective_s: float  # what it measured there: the trial's value (amortised step seconds)
    speedup: float | None  # over that study's baseline: verified when `verified`, else the search's ratio
    verified: bool = False  # `speedup` is the interleaved verification's, not the search's ratio
    trial: int | None = None  # its trial number there

    def attrs(self) -> dict[str, Any]:
        """The enqueued trial's user attr "warm_start" (plain JSON)."""
        return {
            "source": self.source,
            "match": self.match,
            "distance": self.distance,
            "trial": self.trial,
            "objective_s": self.objective_s,
            "speedup": self.speedup,
            "speedup_verified": self.verified,
        }

    def describe(self) -> str:
        """One line: "run results/x (trial 7; same workload): 12.3 ms amortised, 2.03x verified"."""
        from tpu_tuner.core.units import duration

        trial = f"trial {self.trial}; " if self.trial is not None else ""
        gain = (
            "" if self.speedup is None else f", {self.speedup:.2f}x {'verified' if self.verified else 'in its search'}"
        )
        return f"{self.source} ({trial}{self.match}): {duration(self.objective_s)} amortised{gain}"


def find_warm_seeds(
    space: SearchSpace,
    features: WorkloadFeatures,
    *,
    storage: str | None,
    results_dir: Path | None,
    exclude_study: str | None = None,
    limit: int = 3,
    max_distance: float = MAX_DISTANCE,
) -> list[WarmSeed]:
    """Up to `limit` settings from earlier studies on `features.device_kind`, closest first (the
    same workload, then the nearest by features, no farther than `max_distance`), each a
    different setting valid in `space`.

    Never raises for what it reads: an unreadable folder, study or storage is skipped with a
    debug log (the password of `storage` never in it)."""
    if limit <= 0:
        return []
    storages: dict[str, StudyStorage] = {}
    try:
        found: dict[tuple[str, str], EarlierStudy] = {}
        for earlier in [
            *storage_studies(storage, exclude_study, storages),
            *folder_studies(results_dir, storage, exclude_study),
        ]:
            if earlier.features.device_kind == features.device_kind:
                found.setdefault(earlier.key, earlier)
        # Closest first; among equally close studies the newest (a stable sort on the newer order).
        newest_first = sorted(found.values(), key=lambda e: e.started, reverse=True)
        ranked = sorted(((*distance(features, e.features), e) for e in newest_first), key=lambda item: item[0])
        baseline = space.to_candidate(space.baseline_params())
        seeds: list[WarmSeed] = []
        for d, match, earlier in ranked:
            if d > max_distance:
                log.debug("warm start: %s is too far (%.2f > %.2f): %s", earlier.source, d, max_distance, match)
                break
            try:
                seed = _best_of(earlier.open(storages), space, baseline, earlier, d, match)
            except Exception as exc:
                log.debug("warm start: skipping %s: %s", earlier.source, redact(f"{type(exc).__name__}: {exc}"))
                continue
            if seed is None or any(s.params == seed.params for s in seeds):
                continue
            seeds.append(seed)
            log.info("warm start: %s", seed.describe())
            if len(seeds) >= limit:
                break
        return seeds
    finally:
        for rdb in storages.values():  # no connection pool left open behind the search
            with contextlib.suppress(Exception):
                rdb.engine.dispose()


def enqueue_warm_seeds(study: optuna.Study, seeds: list[WarmSeed]) -> None:
    """Queue each seed, carrying its origin in the trial's user attr "warm_start" (a setting the
    study already holds is skipped)."""
    for seed in seeds:
        study.enqueue_trial(dict(seed.params), user_attrs={TRIAL_ATTR: seed.attrs()}, skip_if_exists=True)


# --- the best setting of one study --------------------------------------------------------------


def _candidate_of(trial: TuningTrial) -> Candidate | None:
    stored = trial.candidate
    try:
        if isinstance(stored, Mapping):
            return Candidate.from_dict(stored)
        return Candidate({k: v for k, v in trial.params.items() if k in knobs.REGISTRY})
    except (TypeError, ValueError):
        return None


def _in_space(space: SearchSpace, candidate: Candidate) -> dict[str, str] | None:
    """`candidate` as a whole setting of `space`, or None when `space` cannot run it (a value
    that is not a choice here, or a knob this space keeps at another value)."""
    params = space.to_params(candidate)
    choices = {p.name: p.choices for p in space.searched}
    if any(value not in choices.get(name, ()) for name, value in params.items()):
        return None
    try:
        if space.to_candidate(params) != candidate:
            return None
    except Exception:
        return None
    return space.complete(params)


def _baseline_trial(
    trials: list[TuningTrial], verified: Verified | None, baselines: tuple[Candidate, ...]
) -> TuningTrial | None:
    if verified is not None and verified.baseline_trial is not None:
        named = next((t for t in trials if t.number == verified.baseline_trial), None)
        if named is not None:
            return named
    return next((t for t in trials if _candidate_of(t) in baselines), None)


def _best_of(
    study: optuna.Study, space: SearchSpace, baseline: Candidate, earlier: EarlierStudy, d: float, match: str
) -> WarmSeed | None:
    trials = TuningTrial.all(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    feasible = [t for t in trials if t.is_feasible and t.value is not None]
    feasible.sort(key=lambda t: (t.objective, t.number))
    base_trial = _baseline_trial(trials, earlier.verified, (baseline, Candidate()))
    base_candidate = _candidate_of(base_trial) if base_trial is not None else None
    # The setting the earlier run verified first: its race re-measured the search's leaders
    # interleaved, which orders settings a few percent apart that one measurement each cannot
    # (benchmarks/tuning/warm_start.py: offering the search's fastest instead cost 4 trials on a GPT pair).
    chosen = earlier.verified.best_trial if earlier.verified is not None else None
    feasible.sort(key=lambda t: t.measured_by != chosen)
    for t in feasible:
        candidate = _candidate_of(t)
        if (
            candidate is None
            or candidate in (baseline, base_candidate)
            or (base_trial is not None and t.number == base_trial.number)
        ):
            break  # the baseline is as good as it got there: nothing slower is worth a trial
        params = _in_space(space, candidate)
        if params is None or params == space.baseline_params():
            log.debug(
                "warm start: %s trial %d (%s) cannot run in this space", earlier.source, t.number, candidate.describe()
            )
            continue
        number = t.measured_by
        if earlier.verified is not None and earlier.verified.applies_to(number, candidate, t is feasible[0]):
            speedup, verified = earlier.verified.speedup, True
        else:
            speedup = base_trial.value / t.value if base_trial is not None and base_trial.value and t.value else None
            verified = False
        return WarmSeed(
            params=params,
            source=earlier.source,
            match=match,
            distance=d,
            objective_s=t.objective,
            speedup=speedup,
            verified=verified,
            trial=number,
        )
    return None


__all__ = ["TRIAL_ATTR", "WarmSeed", "enqueue_warm_seeds", "find_warm_seeds"]
