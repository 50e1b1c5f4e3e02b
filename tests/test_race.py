"""The race: the search's leaders re-measured interleaved before one is verified. A setting the
search ranked second by one noisy measurement but that is faster interleaved is the one verified
and recommended; a lone leader is not raced."""

from __future__ import annotations

import pytest
from helpers.common import precision_space, searched_study

from tpu_tuner.runner.requests import CompareRequest, Comparison
from tpu_tuner.runner.trial_runner import JobResult
from tpu_tuner.tuning import TuneOptions
from tpu_tuner.tuning.options.tune_options import ObjectiveOptions, RunnerOptions
from tpu_tuner.tuning.search.tuning_trial import TuningTrial
from tpu_tuner.tuning.verify.race import leaders
from tpu_tuner.tuning.verify.verification import verify

# Steady step each setting really takes (what every interleaved round sees), by autocast x precision.
TRUE_STEP = {
    ("none", "highest"): 0.100,
    ("bfloat16", "highest"): 0.050,
    ("none", "medium"): 0.040,
    ("bfloat16", "medium"): 0.080,
}


class _ScriptedRunner:
    """Answers "compare" jobs with each candidate's true step (a little jitter per round)."""

    keeps_warm_steps = True  # a comparison comes one round a job, as from a warm worker

    def __init__(self) -> None:
        self.compared: list[list[dict]] = []

    def run(self, request, env=None, timeout_s=None):
        assert isinstance(request, CompareRequest)
        self.compared.append(request.candidates)
        jitter = 1.0 + 0.01 * (request.first_round % 3)
        times = [[TRUE_STEP[(c["autocast"], c["matmul_precision"])] * jitter] for c in request.candidates]
        return JobResult(value=Comparison(samples=times, compiles_while_comparing={}))


@pytest.fixture
def options() -> TuneOptions:
    from tpu_tuner.profiling.settings import ProfilerSettings

    return TuneOptions(
        objective=ObjectiveOptions(verify_rounds=6), runner=RunnerOptions(trial_settings=ProfilerSettings())
    )


def test_a_leader_that_one_measurement_put_second_wins_the_race_and_is_verified(options) -> None:
    # The search saw bf16 (truly 50 ms) at 41 ms and medium (truly 40 ms) at 45 ms.
    study = searched_study({("none", "highest"): 0.100, ("bfloat16", "highest"): 0.041, ("none", "medium"): 0.045})
    runner = _ScriptedRunner()
    v = verify(study, precision_space(), runner, options, "cpu")
    assert [e.label for e in v.race] == ["eager, matmul highest, autocast bfloat16", "eager, matmul medium"]
    winner = next(e for e in v.race if e.trial == v.best_trial)
    assert winner.label == "eager, matmul medium" and winner.interleaved_amortised_s == pytest.approx(0.040, rel=0.03)
    assert v.chosen.to_dict()["matmul_precision"] == "medium" and v.chosen_is_best
    assert v.speedup.speedup == pytest.approx(2.5, rel=0.01)
    assert len(runner.compared[0]) == 3  # the race: baseline and the two leaders, one window


def test_a_lone_leader_and_a_distant_runner_up_are_not_raced(options) -> None:
    # 45 ms against 100 ms: beyond RACE_WITHIN of the leader, one measurement's noise cannot reverse that.
    study = searched_study({("none", "highest"): 0.100, ("none", "medium"): 0.040, ("bfloat16", "medium"): 0.080})
    led = leaders(TuningTrial.all(study.trials), precision_space().baseline_params())
    assert [t.params["matmul_precision"] for t in led] == ["medium"]
    runner = _ScriptedRunner()
    v = verify(study, precision_space(), runner, options, "cpu")
    assert v.race == [] and v.chosen.to_dict()["matmul_precision"] == "medium"
    assert all(len(payload) == 2 for payload in runner.compared)  # only baseline and best


def test_the_race_is_kept_in_result_json(options) -> None:
    import dataclasses
    import json

    from tpu_tuner.core.plain_data import from_plain
    from tpu_tuner.tuning.verify.verification import Verification

    study = searched_study({("none", "highest"): 0.100, ("bfloat16", "highest"): 0.041, ("none", "medium"): 0.045})
    v = verify(study, precision_space(), _ScriptedRunner(), options, "cpu")
    data = dataclasses.asdict(v)
    data["chosen"] = v.chosen.to_dict()
    again = from_plain(Verification, json.loads(json.dumps(data)))
    assert again.race == v.race and again.best_trial == v.best_trial


def test_a_bucketed_search_is_not_raced() -> None:
    figures = {("none", "highest"): 0.100, ("bfloat16", "highest"): 0.041, ("none", "medium"): 0.045}
    baseline = precision_space().baseline_params()
    assert len(leaders(TuningTrial.all(searched_study(figures).trials), baseline)) == 2
    assert leaders(TuningTrial.all(searched_study(figures, buckets=[16, 32]).trials), baseline) == []


def test_out_of_time_the_contributions_are_left_out_with_why_unless_one_knob_changed(options) -> None:
    """With no time left the finish drops the knob-by-knob contributions (tuning/run/clock.py) and the
    verification records why; one knob changed costs nothing to attribute (set back, it is the baseline)."""
    import time

    from tpu_tuner.tuning.run.clock import Clock
    from tpu_tuner.tuning.verify.verification import NO_TIME

    no_time = Clock(budget_s=1.0, started=time.perf_counter() - 60)
    two_knobs = searched_study({("none", "highest"): 0.100, ("bfloat16", "medium"): 0.030})
    runner = _ScriptedRunner()
    v = verify(two_knobs, precision_space(), runner, options, "cpu", clock=no_time)
    assert v.chosen_is_best and v.contributions == []
    assert v.contributions_left_out == {"matmul_precision": NO_TIME, "autocast": NO_TIME}
    assert all(len(payload) == 2 for payload in runner.compared)  # baseline and best only
    one_knob = verify(
        searched_study({("none", "highest"): 0.100, ("none", "medium"): 0.040}),
        precision_space(),
        _ScriptedRunner(),
        options,
        "cpu",
        clock=no_time,
    )
    (only,) = one_knob.contributions
    assert only.param == "matmul_precision" and only.speedup.speedup == pytest.approx(one_knob.speedup.speedup)
    assert one_knob.contributions_left_out == {}
