"""The one sampler factory of every tpu-tune study: TPE, random search, or a grid of settings.

Each feature states what differs (the tuner's grouped TPE with four start-up trials, the
planner's constant liar); the factory builds it.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from tpu_tuner.studies.coverage import setting_key

SAMPLERS = ("tpe", "random", "grid")


def build_sampler(
    kind: str,
    seed: int,
    *,
    startup_trials: int = 4,
    group: bool = False,
    constant_liar: bool = False,
    settings: Sequence[Mapping[str, Any]] | None = None,
    grid: Mapping[str, Sequence[Any]] | None = None,
) -> optuna.samplers.BaseSampler:
    """The sampler `kind` names, seeded.

    * "tpe": multivariate TPE (the knobs or axes interact), with `startup_trials` random trials
      first; `group` models each set of trials sharing a parameter set on its own (conditional
      parameters); `constant_liar` treats running trials as having scored the worst so far,
      Optuna's remedy for parallel workers proposing the same point. Optuna marks these
      options experimental.
    * "random": random search.
    * "grid": every setting of `settings` once, in a seeded shuffled order (`SettingsGrid`;
      `grid`, each parameter's choices, orders it as Optuna's GridSampler would).
    """
    if kind == "grid":
        if settings is None:
            raise ValueError("a grid sampler needs the settings to walk")
        return SettingsGrid(settings, grid or {}, seed=seed)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind != "tpe":
        raise ValueError(f"unknown sampler {kind!r} (known: {', '.join(SAMPLERS)})")
    with warnings.catch_warnings(action="ignore", category=optuna.exceptions.ExperimentalWarning):
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=startup_trials, multivariate=True, group=group, constant_liar=constant_liar
        )


class SettingsGrid(optuna.samplers.BaseSampler):
    """A grid over a list of settings, not the product of every parameter's choices: a
    conditional parameter is in a setting only where it is active, so no setting is walked twice.

    As Optuna's GridSampler does, trial n takes the n-th setting of the shuffled list (workers of
    one study with the same seed then take different settings), and a later trial a setting no
    trial has finished or is evaluating, picked at random. Built on the sampler's public
    interface alone: a trial's setting is chosen at its first parameter and kept by this process
    until its last (GridSampler keeps its grid in private attributes and trial system attributes).
    The loop stops on its own, so the grid never calls `study.stop()`.
    """

    def __init__(
        self, settings: Sequence[Mapping[str, Any]], grid: Mapping[str, Sequence[Any]], seed: int | None = None
    ) -> None:
        self._rng = np.random.RandomState(seed or 0)
        # The order GridSampler gives a seed: its generator shuffles the product of `grid` first
        # (so a seed walks the settings in the order it did before this class replaced it).
        self._rng.shuffle(list(itertools.product(*(grid[name] for name in sorted(grid)))))
        self._settings = [dict(s) for s in settings]
        self._rng.shuffle(self._settings)  # type: ignore[arg-type]  # numpy's stubs take arrays; a list shuffles in place
        self._chosen: dict[int, dict[str, Any]] = {}

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        setting = self._chosen.get(trial.number)
        if setting is None:
            setting = self._chosen[trial.number] = self._pick(study, trial)
        if param_name in setting:
            return setting[param_name]
        # A parameter outside the grid's settings: any value of its distribution.
        seed = int(self._rng.randint(2**31))
        return optuna.samplers.RandomSampler(seed=seed).sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self._chosen.pop(trial.number, None)

    def _pick(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        finished: set[tuple] = set()
        running: set[tuple] = set()
        for other in study.get_trials(deepcopy=False):
            if other.number == trial.number:
                continue
            if other.state.is_finished():
                finished.add(setting_key(other.params))
            elif other.state == TrialState.RUNNING:
                held = self._chosen.get(other.number)  # this process's: its params may be partial yet
                running.add(setting_key(held if held is not None else other.params))
        if trial.number < len(self._settings):
            own = self._settings[trial.number]
            if setting_key(own) not in finished | running:
                return own
        unvisited = [s for s in self._settings if setting_key(s) not in finished | running]
        # Every setting started: one not finished yet, as GridSampler does; else any.
        unvisited = unvisited or [s for s in self._settings if setting_key(s) not in finished] or self._settings
        return unvisited[int(self._rng.choice(len(unvisited)))]


class ExcludingSampler(optuna.samplers.BaseSampler):
    """A sampler that never proposes what `excluded` rules out (a setting, or the part of one
    sampled so far, holding a value the study has found to fail): each proposal of `base` that
    is ruled out is drawn again, up to `REDRAWS` times (sampling TPE's proposal within the
    allowed region). What still slips through (a grid keeps its setting; a pair of values drawn
    one at a time) the caller tells without measuring it."""

    REDRAWS = 16

    def __init__(self, base: optuna.samplers.BaseSampler, excluded: Callable[[Mapping[str, Any]], bool]) -> None:
        self.base, self.excluded = base, excluded

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.base.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        proposal = self.base.sample_relative(study, trial, search_space)
        for _ in range(self.REDRAWS):
            if not proposal or not self.excluded({**trial.params, **proposal}):
                break
            proposal = self.base.sample_relative(study, trial, search_space)
        return proposal

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        value = self.base.sample_independent(study, trial, param_name, param_distribution)
        for _ in range(self.REDRAWS):
            if not self.excluded({**trial.params, param_name: value}):
                break
            value = self.base.sample_independent(study, trial, param_name, param_distribution)
        return value

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()


class PreferringSampler(ExcludingSampler):
    """A sampler that draws `base`'s proposal again, up to `REDRAWS` times, where `preferred`
    says no (a setting, or the part of one sampled so far): `base`'s proposal conditioned on the
    preferred region where it gives one there, else its last proposal, kept. The tuner prefers
    settings of the trial worker's start-up environment (tuning/search/environment_blocks.py)."""

    def __init__(self, base: optuna.samplers.BaseSampler, preferred: Callable[[Mapping[str, Any]], bool]) -> None:
        super().__init__(base, lambda setting: not preferred(setting))


__all__ = ["SAMPLERS", "ExcludingSampler", "PreferringSampler", "SettingsGrid", "build_sampler"]
