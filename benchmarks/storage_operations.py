"""What each storage operation of one tuning trial costs on PostgreSQL (loopback,
tests/postgres_server.py): the breakdown behind docs/many-workers.md's storage overhead.

One worker's trial, step by step as the search loop does it (`run_loop`, `TuneTrials`), each
step timed on its own: the ask; the claim (worker, host: one record write); the trial's storage
id and first heartbeat; the setting's parameters (the sampler's read of the study and one write a
parameter); the loop's read of the study after the ask; the measurement's record (one write)
and its accuracy constraint; the tell; and the next round's look at the study (stale trials, one
read). Median milliseconds over the trials after the first 10 (TPE's start-up trials).

    python benchmarks/storage_operations.py [--trials 50]
    taskset -c 1 python benchmarks/storage_operations.py   # client and server on one core
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))


STATEMENTS: dict[str, list[int]] = {}
_executed = [0]


def _timed(costs: dict[str, list[float]], step: str, call: Callable[[], Any]) -> Any:
    before = _executed[0]
    started = time.perf_counter()
    result = call()
    costs.setdefault(step, []).append((time.perf_counter() - started) * 1e3)
    STATEMENTS.setdefault(step, []).append(_executed[0] - before)
    return result


def operations(trials: int) -> dict[str, list[float]]:
    """Each step's milliseconds, one entry a trial."""
    import optuna
    import sqlalchemy

    from many_workers import InstantRunner, _loop_options, _space
    from postgres_server import running_server
    from tpu_tuner.runner.requests import MeasureRequest
    from tpu_tuner.studies.liveness import fail_lost_trials, open_storage, trial_id_of
    from tpu_tuner.tuning import trial_attrs
    from tpu_tuner.tuning.seeding import build_sampler

    space, options = _space(), _loop_options(trials)
    m = InstantRunner().run(MeasureRequest(candidate={})).value
    costs: dict[str, list[float]] = {}
    with running_server() as server:
        storage = open_storage(server.url("tune"), 1)
        sqlalchemy.event.listen(storage.engine, "before_cursor_execute",
                                lambda *args: _executed.__setitem__(0, _executed[0] + 1))
        study = optuna.create_study(storage=storage, study_name=f"operations-{uuid.uuid4().hex[:8]}",
                                    direction="minimize", sampler=build_sampler(options, space))
        for _ in range(trials):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna: heartbeats are meant for `optimize`
                trial = _timed(costs, "ask", study.ask)
            _timed(costs, "claim (record write)", lambda: trial_attrs.record_claim(trial, "worker", "host"))
            trial_id = _timed(costs, "trial id (trial_id_of)", lambda: trial_id_of(storage, study, trial.number))
            _timed(costs, "first heartbeat", lambda: storage.record_heartbeat(trial_id))
            _timed(costs, "parameters (suggest)", lambda: space.suggest(trial))
            _timed(costs, "loop's read after the ask", lambda: study.get_trials(deepcopy=False))
            value = _timed(costs, "record write + constraint",
                           lambda: trial_attrs.record_measurement(trial, m, options.objective.planned_steps,
                                                                  options.objective.tolerance))
            _timed(costs, "tell", lambda: study.tell(trial, value))
            _timed(costs, "next round's look (stale, read)", lambda: fail_lost_trials(study, storage))
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
    statements = {step: statistics.median(values[skip:]) for step, values in STATEMENTS.items()}
    print(f"ms per trial, median over trials {skip + 1}-{args.trials} (load {os.getloadavg()[0]:.2f})")
    print(f"{'step':34} {'ms':>7} {'SQL':>5}")
    for step, median in medians.items():
        print(f"{step:34} {median:7.2f} {statements[step]:5.0f}")
    print(f"{'sum':34} {sum(medians.values()):7.2f} {sum(statements.values()):5.0f}")


if __name__ == "__main__":
    main()
