"""Which workers of a study are alive: Optuna's heartbeats and its retry of stale trials.

Every trial records a heartbeat in the storage while it runs (a thread of the worker that asked
for it, beating every `interval_s`). Any worker of the study fails the RUNNING trials whose last
beat is older than the grace period (`fail_lost_trials`, Optuna's `fail_stale_trials`), and
Optuna's `RetryHeartbeatStaleTrialCallback` queues each such trial's setting again, once: a
worker killed with SIGKILL, or a host lost, costs the study its running trial and nothing else,
while the trials of live workers (beating) are never touched. A lost trial carries no
`failure_kind` (nobody was left to record one): `is_lost` tells it from a measured failure.

This replaces, for a shared study, marking every RUNNING trial "interrupted" on resume, which
would fail the live trials of the other workers (docs/tuning.md, "Many workers, one study").
"""

from __future__ import annotations

import logging
import threading
import warnings
from datetime import datetime, timedelta
from types import TracebackType

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

log = logging.getLogger(__name__)

# Seconds between a running trial's heartbeats, and without one before other workers call it
# lost. The grace period is three beats, not Optuna's two: on a busy 2-core host a beat written
# by a thread of a process that also compiles can come a few seconds late.
HEARTBEAT_INTERVAL_S = 10
GRACE_BEATS = 3
# A lost trial is measured again at most this many times (a setting that kills its worker every
# time must not eat the budget).
MAX_RETRIES = 1


def default_grace_period(interval_s: int) -> int:
    """The grace period used when none is given: `GRACE_BEATS` heartbeats."""
    return GRACE_BEATS * interval_s


def open_storage(url: str, interval_s: int = HEARTBEAT_INTERVAL_S, grace_period_s: int | None = None) -> RDBStorage:
    """An RDB storage for `url` whose trials keep heartbeats and whose lost trials are retried.

    SQLite waits up to a minute for a lock held by another worker (its default, 5 s, was not
    enough for several processes writing trial attributes at once); server connections are
    checked before use, so a connection the server closed while a long trial ran is replaced.
    """
    grace = grace_period_s if grace_period_s is not None else default_grace_period(interval_s)
    engine_kwargs: dict[str, object] = (
        {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    )
    with warnings.catch_warnings():
        # Both are Optuna's documented mechanism, marked experimental since 2.8 / 2.9.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RDBStorage(
            url, engine_kwargs=engine_kwargs, heartbeat_interval=interval_s, grace_period=grace,
            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES),
        )


class Heartbeat:
    """Beats for one trial while the `with` block runs: once on entry (so the trial can be
    found stale from the start), then every interval from a daemon thread.

    A beat that fails (the server restarting) is logged and retried at the next interval: the
    trial is only lost when beats stop for the whole grace period.
    """

    def __init__(self, storage: RDBStorage, trial_id: int) -> None:
        self._storage = storage
        self._trial_id = trial_id
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Heartbeat":
        interval = self._storage.get_heartbeat_interval()
        if interval is None:
            return self
        self._beat()
        self._thread = threading.Thread(target=self._run, args=(interval,), name=f"heartbeat-{self._trial_id}",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, interval: int) -> None:
        while not self._stop.wait(interval):
            self._beat()

    def _beat(self) -> None:
        try:
            self._storage.record_heartbeat(self._trial_id)
        except Exception as exc:  # noqa: BLE001 - a lost connection: the next beat tries again
            log.warning("trial heartbeat not recorded (%s); retrying in the next interval", type(exc).__name__)


def fail_lost_trials(study: optuna.Study, storage: RDBStorage) -> None:
    """Fail the study's RUNNING trials whose worker is gone, and queue their settings again.

    Optuna's `fail_stale_trials` handles trials with a stale heartbeat. A trial without any beat
    (its worker died between asking for it and its first beat, a window of one database write)
    would never go stale there and would make every other worker wait for it: such a trial is
    failed too once it is older than three grace periods (the start time is the asking host's
    clock, hence the margin), with the same retry.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    grace = storage.grace_period or default_grace_period(storage.get_heartbeat_interval() or HEARTBEAT_INTERVAL_S)
    cutoff = datetime.now() - timedelta(seconds=3 * grace)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if "worker" in trial.user_attrs or trial.datetime_start is None or trial.datetime_start > cutoff:
            continue
        try:
            if storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):  # noqa: SLF001
                log.warning("trial %d never recorded a worker or a heartbeat: failed as lost", trial.number)
                callback = storage.get_heartbeat_stale_trial_callback()
                if callback is not None:
                    callback(study, storage.get_trial(trial._trial_id))  # noqa: SLF001
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another worker failed it first


def is_lost(trial: FrozenTrial) -> bool:
    """Whether `trial` was failed because its worker stopped beating (never measured)."""
    return (trial.state == TrialState.FAIL and "failure_kind" not in trial.user_attrs
            and "measured" not in trial.user_attrs)


__all__ = ["HEARTBEAT_INTERVAL_S", "Heartbeat", "default_grace_period", "fail_lost_trials", "is_lost", "open_storage"]
