"""Issue 58, item 1: a tuning run is a sequence of named phases (tuning/run/phases.py) that share one
`Run`: one clock, made once, fitted in place when the profile phase ends, and read by the
search, the verification and every progress line; `tpu-tune tune` and `tpu-tune study finish`
verify, record and build their result through the same two functions. Stubbed phases, a fake
runner and in-memory studies: nothing is measured."""

from __future__ import annotations

import inspect
import re
import socket
import types
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest import FIXTURES

from tpu_tuner.runner.requests import MeasureRequest
from tpu_tuner.studies.fingerprint import file_sha256
from tpu_tuner.studies.liveness import Worker
from tpu_tuner.studies.loop import StopReason
from tpu_tuner.tuning.options.search_options import DefaultBudget, SearchOptions
from tpu_tuner.tuning.options.tune_options import TuneOptions
from tpu_tuner.tuning.run import phases, study_admin, tune_run
from tpu_tuner.tuning.run.clock import Clock
from tpu_tuner.tuning.run.run_location import RunLocation
from tpu_tuner.tuning.run.shared_study import PROFILE_ATTR, RECORD_ATTR, VERIFICATION_ATTR, record_verification
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.trials import TuneTrials
from tpu_tuner.tuning.verify.verification import Verification

SPACE = SearchSpace.load(FIXTURES / "compile_precision_space.toml", "cpu")
OPTIONS = TuneOptions(
    search=SearchOptions(space=str(FIXTURES / "compile_precision_space.toml"), agents=(), trials=4, time_budget_s=60.0)
)
CPU = types.SimpleNamespace(device=types.SimpleNamespace(kind="cpu", memory_bytes=None))


class FakeRunner:
    """A trial runner that measures nothing: the phases here never send it a job."""

    workers_started = 2
    log = types.SimpleNamespace(move_into=lambda run_dir: None)

    def __enter__(self) -> FakeRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _kept(words: str) -> Verification:
    return Verification.keeping_baseline(SPACE.to_candidate(SPACE.baseline_params()), words)


def test_a_run_is_its_phases_in_order_each_given_the_last_ones_result(monkeypatch, tmp_path) -> None:
    calls: list[tuple[str, phases.Run, tuple[Any, ...]]] = []
    location = types.SimpleNamespace(run_dir=tmp_path, resumed=False)
    result = types.SimpleNamespace(verified=True, verification=types.SimpleNamespace(message="verified: 2x"))
    returns = {
        "start": types.SimpleNamespace(location=location),
        "profile": "profiled",
        "plan": "planned",
        "search": "searched",
        "race_and_verify": "verified",
        "finish": result,
    }
    for name, value in returns.items():

        def phase(run: phases.Run, *args: Any, name: str = name, value: Any = value) -> Any:
            calls.append((name, run, args))
            return value

        monkeypatch.setattr(phases, name, phase)
    runner, ended, events, writer = FakeRunner(), [], [], object()
    monkeypatch.setattr(tune_run, "trial_runner", lambda *args: runner)
    monkeypatch.setattr(tune_run.run_file, "end", lambda run_dir, status, **fields: ended.append(status))

    assert tune_run.run_tuning(FIXTURES / "model.py", OPTIONS, events.append, writer) is result  # type: ignore[arg-type]
    assert [name for name, _, _ in calls] == list(returns)
    handed = [args[0] for _, _, args in calls[1:]]
    assert handed == [returns["start"], "profiled", "planned", "searched", "verified"]  # each the last one's result
    assert calls[-1][2][1] is writer
    (run,) = {id(run): run for _, run, _ in calls}.values()  # one Run for every phase
    assert run.runner is runner and run.clock.budget_s == 60.0
    assert ended == ["done"] and events[-1].phase == "done" and events[-1].time_left is not None


def _planned(tmp_path: Path, worker: Worker) -> phases.Planned:
    started = types.SimpleNamespace(location=types.SimpleNamespace(shared=False, run_dir=tmp_path))
    profiled = types.SimpleNamespace(
        study=optuna.create_study(),
        started=started,
        worker=worker,
        storage=types.SimpleNamespace(url=None),
        profile=CPU,
    )
    return phases.Planned(profiled, SPACE, [], {}, None, None, MeasureRequest(), OPTIONS)  # type: ignore[arg-type]


def test_the_one_clock_reaches_the_search_and_the_verification(monkeypatch, tmp_path) -> None:
    seen: dict[str, Clock] = {}

    def search(*args: Any) -> StopReason:
        seen["search"] = args[7]
        return StopReason.CLOCK

    def verify(*args: Any) -> Verification:
        seen["verify"] = args[7]
        return _kept("undecided: nothing compared")

    monkeypatch.setattr(phases, "run_search", search)
    monkeypatch.setattr(phases, "verify", verify)
    events, written = [], []
    run = phases.Run(FakeRunner(), Clock(60.0, 0.0, now=lambda: 5.0), events.append)  # type: ignore[arg-type]
    searched = phases.search(run, _planned(tmp_path, Worker("w", "h")))
    result = phases.finish(run, phases.race_and_verify(run, searched), written.append)

    assert seen["search"] is run.clock and seen["verify"] is run.clock
    assert [e.phase for e in events] == ["search", "verify", "verify"]
    assert events[0].message.startswith("search stopped by the clock with 55.0 s left")
    assert all(e.elapsed == 5.0 and e.time_left == 55.0 for e in events)
    assert written == [result] and result.worker_starts == 2 and result.verification.host == socket.gethostname()


def test_the_search_keeps_the_clock_it_is_given_and_reads_timeout_on_it() -> None:
    clock, events = Clock(60.0, 0.0, now=lambda: 5.0), []
    timed = TuneOptions(search=SearchOptions(space=SPACE.name, agents=(), trials=4, timeout_s=4.0))
    trials = TuneTrials(
        optuna.create_study(),
        SPACE,
        [],
        FakeRunner(),
        MeasureRequest(),
        timed,
        events.append,
        clock,
        None,
        None,
        Worker("a", "h"),
    )  # type: ignore[arg-type]
    assert trials.clock is clock
    trials._progress("running eager", 1)
    assert events[0].elapsed == 5.0 and events[0].time_left == 55.0
    assert trials.stop_reason() is StopReason.TIMEOUT  # 5 s on the run's clock, past --timeout 4 s


def test_the_profile_phase_fits_the_run_clock_in_place(monkeypatch, tmp_path) -> None:
    opened = types.SimpleNamespace(study=optuna.create_study(), created=True, record={})
    monkeypatch.setattr(phases, "open_run_storage", lambda url, store: None)
    monkeypatch.setattr(phases, "open_or_join", lambda *args: opened)
    on_tpu = types.SimpleNamespace(
        device=types.SimpleNamespace(kind="tpu", once_s=0.0), workload=types.SimpleNamespace(dims=None)
    )
    monkeypatch.setattr(phases, "profile_baseline", lambda *args: on_tpu)
    workload = types.SimpleNamespace(device_kind="cpu", source=FIXTURES / "model.py", dims=None, is_training=True)
    location = RunLocation(tmp_path, "sqlite://", "run", shared=False, resumed=False)
    started = phases.Started(workload, None, {"model_file": "model.py"}, location, TuneOptions())  # type: ignore[arg-type]
    events: list[Any] = []
    clock = Clock(DefaultBudget(240.0), 0.0, now=lambda: 60.0)  # the load and profile took 60 s
    profiled = phases.profile(phases.Run(FakeRunner(), clock, events.append), started)  # type: ignore[arg-type]

    fitted = 60.0 + 11 * 60.0 + 10.0  # 8 settings and the finish's 3 at 60 s each, and the wrap-up
    assert clock.budget_s == fitted and profiled.options.search.time_budget_s == fitted
    assert [e.message.split(":")[0] for e in events] == ["profiling the baseline", "the clock"]
    assert events[1].time_left == fitted - 60.0  # said on the fitted clock
    assert profiled.keeper and profiled.first and profiled.profile is on_tpu


@pytest.fixture
def finishing(monkeypatch, tmp_path) -> tuple[optuna.Study, dict[str, int], Path]:
    """`study finish` on a recorded study, up to the phases: its loading, checks and runner stubbed."""
    model = tmp_path / "model.py"
    model.write_text("# the study's model\n")
    recorded = optuna.create_study()
    fingerprint = {"model_file": str(model), "sha256": file_sha256(model)}
    recorded.set_user_attr(RECORD_ATTR, {"options": OPTIONS.to_plain(), "fingerprint": fingerprint})
    recorded.set_user_attr(PROFILE_ATTR, {})
    monkeypatch.setattr(
        study_admin, "load_named_study", lambda storage, name: (recorded, types.SimpleNamespace(url=storage))
    )
    monkeypatch.setattr(study_admin, "set_liveness", lambda *args: None)
    monkeypatch.setattr(study_admin, "fail_lost_trials", lambda *args: [])
    monkeypatch.setattr(study_admin, "Profile", types.SimpleNamespace(from_dict=lambda data: CPU))
    monkeypatch.setattr(study_admin, "trial_runner", lambda *args: FakeRunner())
    monkeypatch.setattr(
        study_admin, "load_summary", lambda *args, **kw: types.SimpleNamespace(name="m", device_kind="cpu")
    )
    monkeypatch.setattr(study_admin, "fingerprint", lambda *args: {})
    monkeypatch.setattr(study_admin, "join_differences", lambda *args: [])
    monkeypatch.setattr(
        study_admin,
        "_searched",
        lambda run, run_dir, st, url, options, profile: phases.Searched(
            st, url, SPACE, profile, [], {}, options, run_dir, f"study finish on {socket.gethostname()}"
        ),
    )
    monkeypatch.setattr(phases, "verify", lambda *args: _kept("undecided: verified here"))
    count = {"race_and_verify": 0, "finish": 0}
    for name in count:
        real = getattr(phases, name)

        def counted(*args: Any, name: str = name, real: Any = real) -> Any:
            count[name] += 1
            return real(*args)

        monkeypatch.setattr(phases, name, counted)
    return recorded, count, model


def test_study_finish_verifies_records_and_builds_its_result_through_the_one_finish(finishing, tmp_path) -> None:
    recorded, count, model = finishing
    written: list[Any] = []
    result = study_admin.finish_study("sqlite://", "s", tmp_path / "out", model, write_outputs=written.append)
    assert count == {"race_and_verify": 1, "finish": 1} and written == [result]
    assert result.verification.message == "undecided: verified here" and result.verified
    assert recorded.user_attrs[VERIFICATION_ATTR]["worker"] == f"study finish on {socket.gethostname()}"


def test_study_finish_writes_a_recorded_verification_through_the_one_finish(finishing, tmp_path) -> None:
    recorded, count, model = finishing
    record_verification(recorded, _kept("verified: by a worker"), "elsewhere", "worker w", 0)  # of 0 measured
    result = study_admin.finish_study("sqlite://", "s", tmp_path / "out", model, write_outputs=lambda r: None)
    assert count == {"race_and_verify": 0, "finish": 1}  # not measured again
    assert result.verification.message == "verified: by a worker"
    assert recorded.user_attrs[VERIFICATION_ATTR]["worker"] == "worker w"  # not recorded again


def test_the_finish_and_the_clock_are_written_once() -> None:
    """Neither entry point verifies, records or builds a result itself, and the run makes its clock once."""
    for module in (tune_run, study_admin):
        source = inspect.getsource(module)
        assert not re.search(r"\b(verify|record_verification|TuningResult)\(", source), module.__name__
    assert inspect.getsource(tune_run).count("Clock(") == 1
    assert "Clock(" not in inspect.getsource(phases)
