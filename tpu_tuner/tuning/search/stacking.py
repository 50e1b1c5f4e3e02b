"""The seeds' winners stacked: one more setting once the agents' seeds are measured.

The seeds end with one-agent variants, each on top of the agents' combined first guesses
(`seeding.enqueue_seeds`). Each variant changes a knob or two that the other agents' knobs mostly
leave alone, so where two or more variants beat the combined seed, the natural next setting is
the combined seed with all of their changes: a greedy step of the kind autotuners take over
independent flags. Without it a short clock rarely measures the union (on examples/gpt.py the
loss compiled with the model and the fused optimizer each beat inductor + bf16 autocast alone,
and TPE never proposed the two together in a 4-minute run).

Kept in the study (its user attribute, `PLAN_ATTR`), not in a worker: a resumed run or another
worker of a shared study stacks the same setting once (an enqueued setting the study holds is
skipped).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import TrialState

from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.tuning_trial import TuningTrial

PLAN_ATTR = "seed_variants"  # {"combined": params, "variants": [params, ...]}
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def record_plan(study: optuna.Study, combined: dict[str, Any], variants: list[dict[str, Any]]) -> None:
    """Keep the combined seed and its variants in the study, for `stacked_setting`."""
    if variants:
        study.set_user_attr(PLAN_ATTR, {"combined": combined, "variants": variants})


def stacked_setting(study: optuna.Study, trials: Sequence[TuningTrial], space: SearchSpace) -> dict[str, Any] | None:
    """The combined seed with the changes of every variant that beat it (the best variant's first;
    a later one that changes a parameter an earlier one set is left out), once the combined seed
    and all of its variants have finished; None before then, or with fewer than two winners."""
    plan = study.user_attrs.get(PLAN_ATTR)
    if not plan:
        return None
    combined = space.to_candidate(plan["combined"])
    variants = [space.to_candidate(params) for params in plan["variants"]]
    results: dict[Candidate, float] = {}
    finished: set[Candidate] = set()
    for trial in trials:
        candidate = space.to_candidate(dict(trial.params))
        if trial.state in FINISHED:
            finished.add(candidate)
        if trial.is_feasible and trial.value is not None:
            results[candidate] = min(trial.value, results.get(candidate, trial.value))
    if not {combined, *variants} <= finished or combined not in results:
        return None
    base = results[combined]
    winners = sorted(
        ((value, variant) for variant in variants if (value := results.get(variant)) is not None and value < base),
        key=lambda pair: pair[0],
    )
    if len(winners) < 2:
        return None
    stacked, changed = dict(combined.changed), set[str]()
    for _, variant in winners:
        diff = {name: value for name, value in variant.changed.items() if combined[name] != value}
        diff |= {name: variant[name] for name in combined.changed if name not in variant.changed}
        if changed & diff.keys():
            continue
        stacked |= diff
        changed |= diff.keys()
    searched = {p.name for p in space.params}
    setting = space.complete({name: value for name, value in stacked.items() if name in searched})
    held = {space.to_candidate(dict(trial.params)) for trial in trials}
    return setting if len(changed) > 1 and space.to_candidate(setting) not in held else None
