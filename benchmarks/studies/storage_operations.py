"""What each storage operation of one tuning trial costs on PostgreSQL (loopback,
tests/helpers/postgres_server.py): the breakdown behind docs/many-workers.md's storage overhead.

One worker's trial, step by step as the search loop does it (`run_loop`, `TuneTrials`), each
step timed on its own: the ask; the trial's storage id and first heartbeat; the setting's
parameters (the sampler's read of the study; on the journal, studies/journal.py, one append a
parameter); the claim (worker, host: one record write); the loop's read of the study after the
ask; the measurement's record and its accuracy constraint; the tell; and the next round's look at
the study (stale trials, at most once a heartbeat interval; one read) and at its exclusions
(failure learning: the study's user attributes read when failures are new, and every 10 s).
Median milliseconds over the trials after the first 10 (TPE's start-up trials).

    python benchmarks/studies/storage_operations.py [--trials 50]
    taskset -c 1 python benchmarks/studies/storage_operations.py   # client and server on one core
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))


STATEMENTS: dict[str, list[int]] = {}
COMMITS: dict[str, list[int]] = {}
_executed = [0]
_committed = [0]


def _timed(costs: dict[str, list[float]], step: str, call: Callable[..., Any], *args: Any) -> Any:
    before, committed = _executed[0], _committed[0]
    started = time.perf_counter()
    result = call(*args)
    costs.setdefault(step, []).append((time.perf_counter() - started) * 1e3)
    STATEMENTS.setdefault(step, []).append(_executed[0] - before)
    COMMITS.setdefault(step, []).append(_committed[0] - committed)
    return result


def operations(trials: int) -> dict[str, list[float]]:
    """Each step's milliseconds, one entry a trial."""
    import optuna
    import sqlalchemy
    from helpers.postgres_server import running_server
    from many_workers import InstantRunner, _loop_options, _space

    from tpu_tuner.runner.requests import MeasureRequest
    from tpu_tuner.studies.liveness import fail_lost_trials, open_storage, trial_id_of
    from tpu_tuner.tuning.search import trial_attrs
    from tpu_tuner.tuning.search.failure_learning import FailureLearning
    from tpu_tuner.tuning.search.seeding import build_sampler

    space, options = _space(), _loop_options(trials)
    m = InstantRunner().run(MeasureRequest(candidate={})).value
    costs: dict[str, list[float]] = {}
    with running_server() as server:
        storage = open_storage(server.url("tune"), 1)

        def executed(connection: Any, cursor: Any, statement: str, *args: Any) -> None:
            _executed[0] += 1
            # The journal's statements are transactions of their own (autocommit): count its writes.
            autocommit = connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
            _committed[0] += autocommit and statement.lstrip().upper().startswith(
                ("INSERT", "UPDATE", "SELECT TPU_TUNE")
            )

        sqlalchemy.event.listen(storage.engine, "before_cursor_execute", executed)
        sqlalchemy.event.listen(storage.engine, "commit", lambda *args: _committed.__setitem__(0, _committed[0] + 1))
        study = optuna.create_study(
            storage=storage,
            study_name=f"operations-{uuid.uuid4().hex[:8]}",
            direction="minimize",
            sampler=build_sampler(options, space),
        )
        seen = study.get_trials(deepcopy=False)
        learning = FailureLearning(space, options.objective.tolerance)
        for _ in range(trials):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna: heartbeats are meant for `optimize`
                trial = _timed(costs, "ask", study.ask)
            trial_id = _timed(costs, "trial id (trial_id_of)", trial_id_of, storage, study, trial.number)
            _timed(costs, "first heartbeat", storage.record_heartbeat, trial_id)
            _timed(costs, "parameters (suggest)", space.suggest, trial)
            _timed(costs, "claim (record write)", trial_attrs.record_claim, trial, "worker", "host")
            _timed(costs, "loop's read after the ask", study.get_trials, False)
            value = _timed(
                costs,
                "record write + constraint",
                trial_attrs.record_measurement,
                trial,
                m,
                options.objective.planned_steps,
                options.objective.tolerance,
            )
            _timed(costs, "tell", study.tell, trial, value)
            seen = _timed(costs, "next round's look (stale, read)", fail_lost_trials, study, storage)
            _timed(costs, "exclusions (failure learning)", learning.update, study, seen)
        storage.engine.dispose()
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=50)
    args = parser.parse_args()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    costs = operations(args.trials)
    skip = min(10, args.trials - 1)
    medians = {step: statistics.median(values[skip:]) for step, values in costs.items()}
    # Statements and transactions: the mean (a step that makes its write only some trials, such as
    # the stale check once a heartbeat interval, counts its share).
    statements = {step: statistics.mean(values[skip:]) for step, values in STATEMENTS.items()}
    commits = {step: statistics.mean(values[skip:]) for step, values in COMMITS.items()}
    print(
        f"ms per trial, median over trials {skip + 1}-{args.trials} (load {os.getloadavg()[0]:.2f}); "
        "SQL statements and transactions, mean"
    )
    print(f"{'step':34} {'ms':>7} {'SQL':>5} {'txn':>5}")
    for step, median in medians.items():
        print(f"{step:34} {median:7.2f} {statements[step]:5.1f} {commits[step]:5.1f}")
    print(f"{'sum':34} {sum(medians.values()):7.2f} {sum(statements.values()):5.1f} {sum(commits.values()):5.1f}")


if __name__ == "__main__":
    main()
