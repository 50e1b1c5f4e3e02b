"""Many workers, one study, on a real PostgreSQL server (issue 15): three worker processes tune one
study by name; one is killed with SIGKILL in the middle of a trial. The study still measures its
whole budget, every setting once, the dead worker's trial failed by heartbeat and measured again
by a live worker, and the best verified once. A worker with another workload is refused.

The workers take the `secret` role's password three ways (in --storage, from $TPU_TUNE_STORAGE,
from a pgpass file), and nothing any of them writes or logs holds it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from conftest import FIXTURES
from helpers.postgres_server import PASSWORD

from tpu_tuner.cli import main
from tpu_tuner.studies import records
from tpu_tuner.studies.liveness import is_lost, open_storage
from tpu_tuner.tuning.run.shared_study import RECORD_ATTR, VERIFICATION_ATTR
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.seeding import enqueue_seeds
from tpu_tuner.tuning.search.warm_start import find_warm_seeds
from tpu_tuner.tuning.search.workload_features import WorkloadFeatures

STUDY = "synthetic-shared"
BUDGET = 5  # fixtures/shared_study_worker.py; fewer than the space's 6 settings, so a worker could overshoot


def _start_workers(postgres, tmp_path: Path) -> list[subprocess.Popen]:
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"127.0.0.1:{postgres.port}:tune:secret:{PASSWORD}\n")
    pgpass.chmod(0o600)  # libpq ignores a pgpass file others can read
    base = {k: v for k, v in os.environ.items() if k not in ("TPU_TUNE_STORAGE", "PGPASSWORD", "PGPASSFILE")}
    ways = [
        ([postgres.url("secret", PASSWORD)], {}),  # in the URL given
        ([], {"TPU_TUNE_STORAGE": postgres.url("secret", PASSWORD)}),  # from the environment
        ([postgres.url("secret")], {"PGPASSFILE": str(pgpass)}),  # from a pgpass file
    ]
    workers = []
    for index, (args, env) in enumerate(ways):
        log = (tmp_path / f"worker{index}.log").open("w")
        workers.append(
            subprocess.Popen(
                [sys.executable, str(FIXTURES / "shared_study_worker.py"), STUDY, str(tmp_path / "results"), *args],
                env={**base, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        time.sleep(0.3)
    return workers


def _pid_of(trial: optuna.trial.FrozenTrial) -> int | None:
    worker = records.attrs(trial).get("worker")
    return int(worker.split(":")[1]) if isinstance(worker, str) else None


def _kill_one_mid_trial(url: str, workers: list[subprocess.Popen]) -> tuple[int, set[int]]:
    """SIGKILL the process group of a worker (the worker and its trial process: a host lost)
    while it measures a trial; the trial's number and the trials complete at that moment."""
    by_pid = {w.pid: w for w in workers}
    deadline = time.monotonic() + 240
    storage = open_storage(url)
    while time.monotonic() < deadline:
        try:
            study = optuna.load_study(study_name=STUDY, storage=storage)
        except KeyError:  # not created yet
            time.sleep(0.5)
            continue
        trials = study.get_trials(deepcopy=False)
        for trial in trials:
            if (
                trial.state == optuna.trial.TrialState.RUNNING
                and _pid_of(trial) in by_pid
                and trial.datetime_start is not None
                and (time.time() - trial.datetime_start.timestamp()) > 0.8
            ):
                os.killpg(by_pid[_pid_of(trial)].pid, signal.SIGKILL)
                complete = {t.number for t in trials if t.state == optuna.trial.TrialState.COMPLETE}
                return trial.number, complete
        time.sleep(0.2)
    raise AssertionError("no worker started a trial within 240 s")


@pytest.mark.slow  # a whole run end to end: .ci/run's full pass
@pytest.mark.timed  # the killed worker's trial is found by a 4 s heartbeat grace; a late live beat reads as lost
def test_three_workers_one_killed_mid_trial_complete_the_budget_once(postgres, tmp_path, capsys) -> None:
    url = postgres.url("secret", PASSWORD)
    workers = _start_workers(postgres, tmp_path)
    try:
        killed_trial, complete_before = _kill_one_mid_trial(url, workers)
        codes = {w.pid: w.wait(timeout=300) for w in workers}
    finally:
        for w in workers:
            if w.poll() is None:
                os.killpg(w.pid, signal.SIGKILL)
    logs = "\n".join(p.read_text() for p in sorted(tmp_path.glob("worker*.log")))
    study = optuna.load_study(study_name=STUDY, storage=open_storage(url))
    trials = study.get_trials(deepcopy=False)
    by_number = {t.number: t for t in trials}
    dead = by_number[killed_trial]
    survivors = [pid for pid, code in codes.items() if code != -signal.SIGKILL]
    assert len(survivors) == 2 and all(codes[pid] == 0 for pid in survivors), (codes, logs[-3000:])

    # The dead worker's trial: failed by the others' heartbeat check, never measured, queued again.
    assert is_lost(dead), dead
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == killed_trial]
    assert len(retries) == 1 and retries[0].state == optuna.trial.TrialState.COMPLETE
    assert _pid_of(retries[0]) in survivors
    # No completed trial lost; the whole budget measured; no setting measured twice.
    assert all(by_number[n].state == optuna.trial.TrialState.COMPLETE for n in complete_before)
    measured = [t for t in trials if records.attrs(t).get("measured") and "repeat_of" not in records.attrs(t)]
    settings = [tuple(sorted(t.params.items())) for t in measured if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(settings) == BUDGET and len(set(settings)) == BUDGET, settings
    assert not any(t.state == optuna.trial.TrialState.RUNNING for t in trials)
    # Verified once, by a live worker; the others left it to that one and wrote no config.
    verification = study.user_attrs[VERIFICATION_ATTR]
    assert int(verification["worker"].split(":")[1]) in survivors
    configs = list((tmp_path / "results").glob("*/tuned_config.toml"))
    assert len(configs) == 1 and str(configs[0].parent) == verification["run_dir"]
    # The verified best is the best feasible setting the study measured.
    feasible = [t for t in measured if records.attrs(t).get("feasible")]
    best_params = min(feasible, key=lambda t: t.value).params
    assert by_number[verification["best_trial"]].params == best_params
    # The baseline was profiled once, by the study's first worker.
    assert logs.count("profiling the baseline") == 1, logs[-3000:]

    # A worker with another workload is refused in one line, before it measures anything.
    capsys.readouterr()
    status = main(
        [
            "-q",
            str(FIXTURES / "tiny_mlp_benchmark.py"),
            "--study",
            STUDY,
            "--storage",
            url,
            "--out",
            str(tmp_path / "refused"),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert status == 2 and "join refused" in err and "model file differs" in err and len(err.splitlines()) == 1, err
    assert len(study.get_trials(deepcopy=False)) == len(trials)
    assert list((tmp_path / "refused").iterdir()) == []  # its run folder removed: it never ran

    # The status, from any host: the budget spent, the lost trial, the verification.
    assert main(["study", "status", "--storage", url, "--study", STUDY]) == 0
    shown = capsys.readouterr().out
    assert f"measured  {BUDGET} settings of a budget of {BUDGET}" in shown and "1 lost" in shown, shown
    assert "verified  on" in shown
    # `study finish` from "another host": the recorded verification is written without measuring;
    # with none recorded (a worker died at the end), it verifies here, once, and records it.
    for recorded in (True, False):
        if not recorded:
            study.set_user_attr(VERIFICATION_ATTR, None)
        assert (
            main(["-q", "study", "finish", "--storage", url, "--study", STUDY, "--out", str(tmp_path / "finish")]) == 0
        )
        shown = capsys.readouterr().out
        assert "verified on" in shown and PASSWORD not in shown, shown
    finished = sorted((tmp_path / "finish").glob("*/tuned_config.toml"))
    assert len(finished) == 2
    again = study.user_attrs[VERIFICATION_ATTR]
    assert again["worker"].startswith("study finish") and again["run_dir"] == str(finished[-1].parent)
    assert "Hosts" in (finished[-1].parent / "report.md").read_text()

    # A later study of a like workload (another batch size: the nearest, not the same) on this
    # storage measures this study's best right after its baseline (warm start).
    record = study.user_attrs[RECORD_ATTR]
    space = SearchSpace.load(FIXTURES / "eager_precision_space.toml", "cpu")
    later = WorkloadFeatures.from_dict({**record["features"], "batch_size": 8})
    seeds = find_warm_seeds(space, later, storage=url, results_dir=None, exclude_study="later")
    if best_params == space.baseline_params():  # medium matmuls left out of the 5 of 6: nothing beat it
        assert seeds == []
    else:
        assert seeds and seeds[0].params == best_params, seeds
        assert STUDY in seeds[0].source and "same workload" not in seeds[0].match
        fresh = optuna.create_study()
        enqueue_seeds(fresh, space, [], None, seeds)
        queued = fresh.get_trials(deepcopy=False)
        fixed = [t.system_attrs["fixed_params"] for t in queued]  # a queued trial's setting, until it runs
        assert fixed[0] == space.complete(space.baseline_params()) and fixed[1] == seeds[0].params
        assert STUDY in queued[1].user_attrs["warm_start"]["source"]
    # The password appears nowhere: not in the workers' logs, the run folders, the study's record,
    # the warm start's record of where a setting came from.
    assert PASSWORD not in str([seed.attrs() for seed in seeds])
    assert PASSWORD not in logs + err + shown
    assert PASSWORD not in str(study.user_attrs[RECORD_ATTR])
    for path in tmp_path.rglob("*"):  # every run folder: the workers', study finish's
        if path.is_file() and path.suffix in (".json", ".md", ".toml", ".csv"):
            assert PASSWORD not in path.read_text(errors="replace"), path
