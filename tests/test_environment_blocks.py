"""Settings of one start-up environment measured together (tuning/search/environment_blocks.py):
on the chip every alternation of the sampler between Strict and DeferAndFuse settings started a
trial worker (4 starts of ~17 s, 37% of the README example's trial time). Once the worker runs an
environment, the sampler's proposals keep to it for a block of trials; a proposal the sampler
insists on is still measured."""

from __future__ import annotations

import optuna

from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.studies.samplers import PreferringSampler
from tpu_tuner.tuning.search.environment_blocks import BLOCK, EnvironmentBlocks
from tpu_tuner.tuning.search.search_space import SearchSpace

STRICT, COMPILED, DEFER = "eager:strict", "tpu", "eager:defer_and_fuse"


def _blocks() -> EnvironmentBlocks:
    return EnvironmentBlocks(SearchSpace.load("default", "tpu"))


def test_a_worker_keeps_its_environment_for_a_block_then_may_move() -> None:
    blocks = _blocks()
    assert "execution" in blocks.names
    assert blocks.preferred({"execution": DEFER})  # nothing measured yet: anything
    blocks.measured(Candidate(execution=STRICT))
    # Compiled settings need no start-up variable: the Strict worker runs them too.
    assert blocks.preferred({"execution": COMPILED}) and blocks.preferred({"autocast": "bfloat16"})
    assert not blocks.preferred({"execution": DEFER})
    for _ in range(BLOCK - 1):
        blocks.measured(Candidate(execution=COMPILED))
    assert blocks.preferred({"execution": DEFER})  # the block is done
    blocks.measured(Candidate(execution=DEFER))  # the worker moved: a new block
    assert blocks.in_a_row == 1 and not blocks.preferred({"execution": STRICT})


def _switches(preferring: bool, trials: int = 30) -> tuple[int, list[int]]:
    """Workers started by a seeded random search over execution x autocast, with or without the
    preference; and the length of each run of trials in one environment."""
    blocks = _blocks()
    base = optuna.samplers.RandomSampler(seed=3)
    sampler = PreferringSampler(base, blocks.preferred) if preferring else base
    study = optuna.create_study(sampler=sampler)
    runs: list[int] = []
    previous = None
    for _ in range(trials):
        trial = study.ask()
        execution = trial.suggest_categorical("execution", [STRICT, COMPILED, DEFER])
        trial.suggest_categorical("autocast", ["none", "bfloat16"])
        blocks.measured(Candidate(execution=execution))
        env = execution == DEFER
        if env == previous:
            runs[-1] += 1
        else:
            runs.append(1)
        previous = env
        study.tell(trial, 1.0)
    return len(runs), runs


def test_the_search_starts_fewer_workers_and_still_visits_both_environments() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    starts_without, _ = _switches(preferring=False)
    starts_with, runs = _switches(preferring=True)
    assert starts_with < starts_without / 2, (starts_with, starts_without)
    assert starts_with >= 2  # DeferAndFuse is still searched
    assert all(run >= BLOCK for run in runs[:-1]), runs


def test_a_proposal_the_sampler_insists_on_is_kept() -> None:
    """A sampler that only proposes DeferAndFuse: after its redraws the proposal stands."""
    blocks = _blocks()
    blocks.measured(Candidate(execution=STRICT))
    study = optuna.create_study(sampler=PreferringSampler(optuna.samplers.RandomSampler(seed=0), blocks.preferred))
    trial = study.ask()
    assert trial.suggest_categorical("execution", [DEFER]) == DEFER
