"""Issue 55 item 14: a knob value that crashes the worker in every setting holding it is excluded
after at most 2 measured settings with it, whatever comes with it. The search runs for real, with
the seeds queued as `enqueue_seeds` queues them, on a runner that answers from a rule: the
baseline and every other value succeed.

Inductor is the case that spent more: a setting naming ``execution = inductor`` always holds
inductor's default options too (and, where the step compiles its loss, the default compile
scope), values no success can hold before an inductor setting works. The first two inductor
crashes then held them all alike, the study excluded only their pairs, and a third inductor
setting with other options was measured (on a training space, with two such defaults, up to 4).
"""

from __future__ import annotations

import time
import zlib
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
from helpers.common import step_measurement

from tpu_tuner import TuneOptions
from tpu_tuner.execution.measurement import EarlyStop, TrialFailure
from tpu_tuner.runner.requests import MeasureRequest
from tpu_tuner.runner.trial_runner import JobResult
from tpu_tuner.studies import records
from tpu_tuner.studies.samplers import build_sampler
from tpu_tuner.tuning.options.tune_options import SearchOptions
from tpu_tuner.tuning.search.failure_learning import stored_causes
from tpu_tuner.tuning.search.search_space import Param, SearchSpace
from tpu_tuner.tuning.search.seeding import enqueue_seeds
from tpu_tuner.tuning.search.trials import run_search

EXECUTION = Param("execution", "compile", ("eager", "aot_eager", "inductor"))
OPTIONS = Param("compile_options", "compile", ("default", "freezing", "max-autotune"))
AUTOCAST = Param("autocast", "precision", ("none", "bfloat16"))
# Inference: quantized linears searched.
INFERENCE = SearchSpace(
    "crash-inference",
    "cpu",
    (EXECUTION, AUTOCAST, OPTIONS, Param("quantization", "precision", ("none", "int8_dynamic", "int8_weight_only"))),
)
# Training: the compile scope is searched under every compiling mode (aot_eager and inductor).
TRAINING = SearchSpace(
    "crash-training",
    "cpu",
    (EXECUTION, AUTOCAST, OPTIONS, Param("compile_scope", "compile", ("model", "model+loss"))),
)
# The agents' seeds, as the real ones come: the compile agent's inductor first, then its options.
COMPILE_SEEDS = [{"execution": "inductor"}, {"compile_options": "freezing"}, {"compile_options": "max-autotune"}]
PRECISION_SEEDS = [{"autocast": "bfloat16"}, {"quantization": "int8_weight_only"}]


class CrashRunner:
    """Every job whose setting holds `bad` dies from SIGSEGV; the others run, each setting at a
    step of its own (a stable hash), stopped early past the pruner's threshold as the worker is."""

    keeps_warm_steps = True
    workers_started = 1

    def __init__(self, bad: tuple[str, str]) -> None:
        self.bad, self.jobs = bad, []

    def check_usable(self) -> None:
        pass  # the Runner protocol: every job can run here

    def close(self) -> None:
        pass

    def run(self, request: MeasureRequest, env=None, timeout_s=None) -> JobResult:
        candidate = dict(request.candidate)
        self.jobs.append(candidate)
        name, value = self.bad
        if str(candidate.get(name)) == value:
            return JobResult(failure=TrialFailure("crash", "worker died from SIGSEGV"), seconds=0.0)
        step = 0.002 + (zlib.crc32(repr(sorted(candidate.items())).encode()) % 1000) * 1e-5
        if request.stop_above_s is not None and step > request.stop_above_s:
            stop = EarlyStop(candidate, "steps", "too slow", [step] * 3, step, 0.0, step)
            return JobResult(value=stop, seconds=0.0)
        return JobResult(value=step_measurement(candidate, step), seconds=0.0)


def _tune(space: SearchSpace, bad: tuple[str, str], sampler: str, seed: int) -> tuple[optuna.Study, list[Any]]:
    grid = {"settings": space.settings(), "grid": space.grid()} if sampler == "grid" else {}
    study = optuna.create_study(direction="minimize", sampler=build_sampler(sampler, seed, startup_trials=4, **grid))
    precision = [s for s in PRECISION_SEEDS if all(name in {p.name for p in space.params} for name in s)]
    agents = [SimpleNamespace(seeds=lambda p, s: COMPILE_SEEDS), SimpleNamespace(seeds=lambda p, s: precision)]
    enqueue_seeds(study, space, agents, None)  # type: ignore[arg-type]  # fakes with the one method used
    events: list[Any] = []
    opts = TuneOptions(search=SearchOptions(space=space.name, agents=(), trials=12))
    run_search(study, space, [], CrashRunner(bad), MeasureRequest(), opts, events.append, time.perf_counter())
    return study, events


@pytest.mark.parametrize(
    ("space", "bad"),
    [
        (INFERENCE, ("execution", "inductor")),
        (TRAINING, ("execution", "inductor")),
        (INFERENCE, ("quantization", "int8_weight_only")),
    ],
    ids=["inductor-inference", "inductor-training", "int8-weight-only"],
)
@pytest.mark.parametrize(("sampler", "seed"), [("grid", 0), ("tpe", 0), ("tpe", 1)])
def test_a_value_that_crashes_every_time_is_excluded_after_two_settings(
    space: SearchSpace, bad: tuple[str, str], sampler: str, seed: int
) -> None:
    study, events = _tune(space, bad, sampler, seed)
    name, value = bad
    measured = [t for t in study.trials if records.attrs(t).get(records.MEASURED) and str(t.params.get(name)) == value]
    assert len(measured) == 2, [t.params for t in measured]
    assert all(records.attrs(t)[records.FAILURE_KIND] == "crash" for t in measured)
    # The value itself is the cause, not only its pairs with what came with it.
    causes = {cause.key: cause for cause in stored_causes(study.user_attrs)}
    cause = causes[f"{name}={value}"]
    assert (cause.failures_with, cause.settings_with, cause.failures_without) == (2, 2, 0)
    assert not [key for key in causes if key != cause.key], "nothing else is blamed"
    said = [e.message for e in events if e.phase == "learn" and "excluded" in e.message]
    assert said and "the worker died from SIGSEGV in 2 of 2 settings with it" in said[0]
