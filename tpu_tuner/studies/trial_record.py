"""The writer of a trial's record: its keys (studies/records.py) collected, and stored as ONE user
attribute (`records.RECORD`) in one storage call, instead of one call (a transaction, two
statements on PostgreSQL) per key; `records.attrs` reads it back.

A trial's record is written at most twice: the claim (who runs it and where) when it is asked,
so that other workers see it while it runs, and everything else just before it is told. Each
write stores the whole record so far (Optuna's attribute write replaces the value), so the last
one holds every key, and a worker lost mid-trial leaves a record that is either the claim alone
or complete, never half a measurement.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from tpu_tuner.studies import records


class TrialRecord:
    """The record of one asked trial, kept in this process until it is written.

    `TrialRecord.of(trial)` gives the same record for the same `optuna.Trial` object wherever it
    is called (the loop's ask, and the tell that happens in another function), so the claim
    written at the ask is kept when the result is written over it.
    """

    _live: weakref.WeakKeyDictionary[optuna.Trial, TrialRecord] = weakref.WeakKeyDictionary()

    def __init__(self, trial: optuna.Trial) -> None:
        self.trial = trial
        self._values: dict[str, Any] = {}
        self._dirty = False

    @classmethod
    def of(cls, trial: optuna.Trial) -> TrialRecord:
        """The record of `trial` in this process (made empty on first use)."""
        record = cls._live.get(trial)
        if record is None:
            record = cls._live[trial] = cls(trial)
        return record

    def set(self, key: str, value: Any) -> None:
        """Set `key` (one of studies/records.py's names); stored at the next `flush`."""
        self._values[key] = value
        self._dirty = True

    def update(self, values: Mapping[str, Any]) -> None:
        """Set several keys at once."""
        for key, value in values.items():
            self.set(key, value)

    def values(self) -> dict[str, Any]:
        """A copy of every key set so far."""
        return dict(self._values)

    def flush(self) -> None:
        """Store the whole record as one user attribute (one storage call); nothing when no key
        changed since the last flush."""
        if not self._dirty:
            return
        self.trial.set_user_attr(records.RECORD, {**self._values, records.VERSION: records.RECORD_VERSION})
        self._dirty = False

    def write(self, values: Mapping[str, Any]) -> None:
        """Set `values` and store the record: a trial told with no measurement (a claim, a
        repeat, a rejection) writes this once."""
        self.update(values)
        self.flush()


def write_stored(
    storage: optuna.storages.BaseStorage, trial_id: int, trial: FrozenTrial, values: Mapping[str, Any]
) -> None:
    """Add `values` to the record of a stored trial that no `optuna.Trial` of this process holds
    (one another run left RUNNING), in one storage call: its structured record, if it has one,
    keeps its keys."""
    stored = trial.user_attrs.get(records.RECORD)
    record = dict(stored) if isinstance(stored, dict) else {}
    record.update(values)
    record[records.VERSION] = records.RECORD_VERSION
    storage.set_trial_user_attr(trial_id, records.RECORD, record)


__all__ = ["TrialRecord", "write_stored"]
