"""A study storage that makes a running trial's writes in one transaction instead of one each:
the only module of tpu-tune that uses Optuna's private names.

Why: on PostgreSQL a tuning trial cost 26 transactions and 87 SQL statements (105 ms on a 2-core
host, mostly SQLAlchemy ORM work here): a transaction a parameter, the trial read back whole at
the ask, at each constraint and twice at the tell; Optuna's public API has no batched write
(docs/design.md). `BatchedStorage`, an `RDBStorage`, keeps each trial this process runs (asked
here, or popped from the queue) in memory as the database holds it plus the writes not made yet:

* makes the trial's parameter and attribute writes in ONE transaction of a few Core statements:
  at `flush()`, which the loop calls once the setting is suggested and before it is evaluated
  (other workers, TPE's ``constant_liar`` among them, then see its parameters and claim); before
  any read of a study (this process reads what it wrote); and with the tell (record,
  constraints, value and state together);
* answers reads of the trial from memory, and a read of the study that finds nothing else new
  with one Core statement; writes a heartbeat as one upsert; knows its trials' ids.
Where a private name below is missing, or the database is neither PostgreSQL nor SQLite >= 3.24
(ON CONFLICT), `batching` is False and every call passes through to `RDBStorage` unchanged.

A write to a trial that another worker has meanwhile failed as lost raises Optuna's
`UpdateFinishedTrialError` at the flush or the tell (the plain storage raises it at the write).
A worker that dies between a write and its flush loses that trial's unflushed writes only: the
trial stays RUNNING, its beats stop, and the lost-trial retry (studies/liveness.py) fails it and
queues its setting again, as for any worker lost mid-trial.

Private names it relies on (Optuna 5.0; `supported()` checks each, and
tests/test_batched_storage.py fails loudly when their shape changes):

* `optuna.storages._CachedStorage` (what `create_study` wraps an `RDBStorage` in) reaches it
  through `_create_new_trial` (returns the new `FrozenTrial`), `_set_trial_param` and
  `_get_trials` (a study's rows with an id in a set or above a bound), overridden here with the
  signatures in `_OVERRIDDEN`.
* `optuna.storages._rdb.models`: the tables in `_WRITTEN`, written with SQLAlchemy Core as the
  ORM writes them, and `TrialValueModel.value_to_stored_repr`.
* `FrozenTrial._trial_id`, a trial's storage id.
"""

from __future__ import annotations

import copy
import inspect
import json
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import optuna
import sqlalchemy
from optuna.distributions import (BaseDistribution, check_distribution_compatibility, distribution_to_json,
                                  json_to_distribution)
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

# Finished trials kept in memory: Optuna reads a trial back after its tell, as does the next read.
FINISHED_KEPT = 8
# A read of the study leaves this process's trials out where it then lists at most this many ids.
LISTED_IDS_MAX = 64
# The tables read and written here: the unique key an upsert names (ON CONFLICT), other columns.
_WRITTEN = {"StudyModel": ((), {"study_id"}),
            "TrialModel": ((), {"trial_id", "study_id", "state", "datetime_complete"}),
            "TrialParamModel": (("trial_id", "param_name"), {"param_value", "distribution_json"}),
            "TrialUserAttributeModel": (("trial_id", "key"), {"value_json"}),
            "TrialSystemAttributeModel": (("trial_id", "key"), {"value_json"}),
            "TrialValueModel": (("trial_id", "objective"), {"value", "value_type"}),
            "TrialHeartbeatModel": (("trial_id",), {"heartbeat"})}
_OVERRIDDEN = {"_create_new_trial": ["study_id", "template_trial"],
               "_set_trial_param": ["trial_id", "param_name", "param_value_internal", "distribution",
                                    "previous_distribution"],
               "_get_trials": ["study_id", "states", "included_trial_ids", "trial_id_greater_than"]}
# The wrapper's method that must reach the storage through each overridden one.
_CALLED_BY = {"create_new_trial": "_create_new_trial", "set_trial_param": "_set_trial_param",
              "_read_trials_from_remote_storage": "_get_trials"}


def _models() -> Any:
    from optuna.storages._rdb import models  # private: see the module docstring

    return models


def supported() -> bool:
    """Whether the installed Optuna has every private name this module relies on, in the shape it
    expects (else `BatchedStorage` passes every call through to `RDBStorage`)."""
    try:
        from optuna.storages._cached_storage import _CachedStorage

        models = _models()
        for name, (key, columns) in _WRITTEN.items():
            table = getattr(models, name).__table__
            unique = [set(c.columns.keys()) for c in table.constraints if isinstance(c, sqlalchemy.UniqueConstraint)]
            if not set(key) | columns <= set(table.columns.keys()) or (key and set(key) not in unique):
                return False
        if not all(list(inspect.signature(getattr(RDBStorage, n)).parameters)[1:] == p for n, p in _OVERRIDDEN.items()):
            return False
        if not all(name in getattr(_CachedStorage, caller).__code__.co_names for caller, name in _CALLED_BY.items()):
            return False
        return (callable(models.TrialValueModel.value_to_stored_repr)
                and "_trial_id" in FrozenTrial.__init__.__code__.co_names)
    except Exception:  # noqa: BLE001 - any change of shape: the plain path
        return False


@dataclass
class _Running:
    """A trial this process runs, as the database holds it (`exact`: no write refused) and the
    writes held; `study_id` None for a trial popped from the queue."""

    trial: FrozenTrial
    study_id: int | None
    exact: bool = True
    params: list[dict[str, Any]] = field(default_factory=list)
    user: dict[str, str] = field(default_factory=dict)
    system: dict[str, str] = field(default_factory=dict)

    def pending(self) -> bool:
        return bool(self.params or self.user or self.system)


class _NotRunning(Exception):
    """The trial is no longer RUNNING in the database (another worker failed it as lost)."""


class BatchedStorage(RDBStorage):
    """An `RDBStorage` that batches its running trials' writes (the module docstring says how)."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._init_batching()

    def _init_batching(self) -> None:
        self._lock = threading.RLock()
        self._running: dict[int, _Running] = {}
        self._finished: OrderedDict[int, tuple[int | None, FrozenTrial]] = OrderedDict()
        self._ids: dict[tuple[int, int], int] = {}
        dialect = self.engine.name
        self.batching = supported() and (dialect == "postgresql"
                                         or (dialect == "sqlite" and sqlite3.sqlite_version_info >= (3, 24, 0)))
        self._sql = _Statements(dialect) if self.batching else None

    def __getstate__(self) -> dict[Any, Any]:
        self.flush()  # a copy (another process) starts with nothing held
        return {k: v for k, v in super().__getstate__().items()
                if k not in ("_lock", "_running", "_finished", "_ids", "_sql")}

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__(state)
        self._init_batching()

    def _create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> FrozenTrial:
        trial = super()._create_new_trial(study_id, template_trial)
        if self.batching:
            with self._lock:
                self._ids[(study_id, trial.number)] = trial._trial_id
                if template_trial is None:  # a new RUNNING trial (a template makes a queued or a finished one)
                    self._running[trial._trial_id] = _Running(copy.deepcopy(trial), study_id)
        return trial

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        known = self._ids.get((study_id, trial_number))  # one dict read: no lock needed
        return known if known is not None else super().get_trial_id_from_study_id_trial_number(study_id, trial_number)

    def _known(self, trial_id: int) -> FrozenTrial | None:  # a trial run here, running or just finished
        running, finished = self._running.get(trial_id), self._finished.get(trial_id)
        return running.trial if running is not None else finished[1] if finished is not None else None

    def _from_memory(self, trial_id: int, part: Callable[[FrozenTrial], Any], otherwise: Callable[[int], Any]) -> Any:
        with self._lock:
            if (known := self._known(trial_id)) is not None:
                return copy.deepcopy(part(known))  # callers (optuna.Trial) change what they are given
        return otherwise(trial_id)

    def get_trial(self, trial_id: int) -> FrozenTrial:
        return self._from_memory(trial_id, lambda t: t, super().get_trial)

    def get_trial_user_attrs(self, trial_id: int) -> dict[str, Any]:
        return self._from_memory(trial_id, lambda t: t.user_attrs, super().get_trial_user_attrs)

    def get_trial_system_attrs(self, trial_id: int) -> dict[str, Any]:
        return self._from_memory(trial_id, lambda t: t.system_attrs, super().get_trial_system_attrs)

    def get_trial_param(self, trial_id: int, param_name: str) -> float:
        self.flush(strict=False)  # a held one is read written
        return super().get_trial_param(trial_id, param_name)

    def _set_trial_param(self, trial_id: int, param_name: str, param_value_internal: float,
                         distribution: BaseDistribution, previous_distribution: BaseDistribution | None) -> None:
        with self._lock:
            running = self._running.get(trial_id)
            if running is not None and previous_distribution is not None:
                check_distribution_compatibility(previous_distribution, distribution)
                self.check_trial_is_updatable(trial_id, running.trial.state)
                as_json = distribution_to_json(distribution)
                running.params.append({"trial_id": trial_id, "param_name": param_name,
                                       "param_value": param_value_internal, "distribution_json": as_json})
                _param_known(running.trial, param_name, param_value_internal, as_json)
                return
        # A name's first use here: Optuna checks it against the study's stored one, and writes it.
        super()._set_trial_param(trial_id, param_name, param_value_internal, distribution, previous_distribution)
        with self._lock:
            if (running := self._running.get(trial_id)) is not None:
                _param_known(running.trial, param_name, param_value_internal, distribution_to_json(distribution))

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        if not self._hold(trial_id, "user", key, value):
            super().set_trial_user_attr(trial_id, key, value)

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        if not self._hold(trial_id, "system", key, value):
            super().set_trial_system_attr(trial_id, key, value)

    def _hold(self, trial_id: int, kind: str, key: str, value: Any) -> bool:
        with self._lock:
            running = self._running.get(trial_id)
            if running is None:
                return False
            self.check_trial_is_updatable(trial_id, running.trial.state)
            getattr(running, kind)[key] = as_json = json.dumps(value)
            # As a read gives it back (a tuple as a list, ...).
            (running.trial.user_attrs if kind == "user" else running.trial.system_attrs)[key] = json.loads(as_json)
            return True

    def set_trial_intermediate_value(self, trial_id: int, step: int, intermediate_value: float) -> None:
        super().set_trial_intermediate_value(trial_id, step, intermediate_value)  # rare: made at once
        with self._lock:
            if (running := self._running.get(trial_id)) is not None:
                running.trial.intermediate_values[step] = float(intermediate_value)

    def flush(self, strict: bool = True) -> None:
        """Make every held write, one transaction a trial. Raises `UpdateFinishedTrialError` for a
        trial another worker has finished meanwhile (its writes dropped), as a write made at once
        would; not with `strict` False (a read), where the trial's next flush or tell raises it."""
        with self._lock:
            for trial_id in [i for i, r in self._running.items() if r.pending()]:
                self._flush_trial(trial_id, strict)

    def _flush_trial(self, trial_id: int, strict: bool) -> None:
        running = self._running[trial_id]
        try:
            self._write(trial_id, running, None)
        except _NotRunning:
            running.params, running.user, running.system = [], {}, {}  # the database refused them
            running.exact = False
            if not strict:  # a read: the trial's flush or tell says so
                return
            self._running.pop(trial_id)
            state = super().get_trial(trial_id).state  # KeyError for a trial that is gone
            self.check_trial_is_updatable(trial_id, state)
            raise RuntimeError(f"trial {trial_id} is {state.name}: its writes were dropped") from None

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        with self._lock:
            running = self._running.get(trial_id)
            if running is not None and state.is_finished():
                finished = datetime.now()
                try:
                    self._write(trial_id, running, (state, values, finished))
                except _NotRunning:
                    self._running.pop(trial_id)  # Optuna's own path says why (UpdateFinishedTrialError)
                    return super().set_trial_state_values(trial_id, state, values)
                trial = self._running.pop(trial_id).trial
                trial.state, trial.datetime_complete = state, finished
                trial.values = None if values is None else [float(v) for v in values]
                self._finished[trial_id] = (running.study_id, trial)
                while len(self._finished) > FINISHED_KEPT:
                    self._finished.popitem(last=False)
                return True
            if running is not None:
                if running.pending():
                    self._flush_trial(trial_id, strict=True)
                self._running.pop(trial_id)
        popped = super().set_trial_state_values(trial_id, state, values)
        if popped and state == TrialState.RUNNING and self.batching:
            # A queued trial this process now runs: read once (Optuna reads it next), then kept.
            trial = super().get_trial(trial_id)
            with self._lock:
                self._running[trial_id] = _Running(trial, None)
        return popped

    def _write(self, trial_id: int, running: _Running,
               finish: tuple[TrialState, Sequence[float] | None, datetime] | None) -> None:
        """One transaction: the trial checked RUNNING (and locked), its held writes, and with
        `finish` its values and final state. Raises `_NotRunning`, having written nothing."""
        assert (sql := self._sql) is not None  # batching
        with self.engine.begin() as connection:
            if finish is None:
                if connection.execute(sql.lock, {"b_id": trial_id}).scalar_one_or_none() != TrialState.RUNNING:
                    raise _NotRunning
            elif connection.execute(sql.finish, {"b_id": trial_id, "b_state": finish[0],
                                                 "b_complete": finish[2]}).rowcount != 1:
                raise _NotRunning  # the UPDATE takes the row lock: another worker's fail waits, or won
            if running.params:  # one statement a table (SQLAlchemy sends a list of rows as one INSERT)
                connection.execute(sql.params, running.params)
            for statement, held in ((sql.user, running.user), (sql.system, running.system)):
                if held:
                    connection.execute(statement, [{"trial_id": trial_id, "key": k, "value_json": v}
                                                   for k, v in held.items()])
            if finish is not None and finish[1] is not None:
                stored = [_models().TrialValueModel.value_to_stored_repr(float(v)) for v in finish[1]]  # inf, as Optuna
                connection.execute(sql.values, [{"trial_id": trial_id, "objective": i, "value": v, "value_type": k}
                                                for i, (v, k) in enumerate(stored)])
        running.params, running.user, running.system = [], {}, {}

    def _get_trials(self, study_id: int, states: Container[TrialState] | None, included_trial_ids: set[int],
                    trial_id_greater_than: int) -> list[FrozenTrial]:
        if self._sql is None:
            return super()._get_trials(study_id, states, included_trial_ids, trial_id_greater_than)
        with self._lock:
            self.flush(strict=False)  # this process reads what it wrote
            # This process's trials of the study that the read asks for, as the database holds them.
            known = {i: t for i, (s, t) in self._finished.items() if s == study_id}
            known.update((i, r.trial) for i, r in self._running.items() if r.study_id == study_id and r.exact)
            known = {i: copy.deepcopy(t) for i, t in known.items() if (states is None or t.state in states)
                     and (i in included_trial_ids or i > trial_id_greater_than)}
        top = max(known, default=trial_id_greater_than)
        if top - trial_id_greater_than > LISTED_IDS_MAX:
            return super()._get_trials(study_id, states, included_trial_ids, trial_id_greater_than)
        # The same rows, the known ones left out: those above the newest known one, and by id the
        # others asked for (`listed`, which exist) and those between the bound and it (`gaps`).
        # Optuna's read is two ORM statements even when it finds nothing (with one worker, every
        # read): where nothing is listed, one Core statement first says whether it would find any.
        listed = {i for i in included_trial_ids if i not in known}
        gaps = {i for i in range(trial_id_greater_than + 1, top) if i not in known}
        read = super()._get_trials(study_id, states, listed | gaps, top) if listed or self._has_rows(
            study_id, states, gaps, top) else []
        return sorted(read + list(known.values()), key=lambda t: t._trial_id)

    def _has_rows(self, study_id: int, states: Container[TrialState] | None, ids: set[int], above: int) -> bool:
        """Whether the study has a trial (in `states`) with an id in `ids` or above `above`; KeyError
        for a study that does not exist, as Optuna's read."""
        assert self._sql is not None  # batching
        query, bound = self._sql.rows, {"b_study": study_id, "b_ids": list(ids), "b_above": above}
        if states is not None:
            query, bound["b_states"] = self._sql.rows_in_states, list(states)  # type: ignore[call-overload]
        with self.engine.begin() as connection:  # committed, as Optuna's reads are
            if (row := connection.execute(query, bound).first()) is None:
                raise KeyError("Record does not exist.")
        return row[1] is not None

    def record_heartbeat(self, trial_id: int) -> None:
        if self._sql is None:
            return super().record_heartbeat(trial_id)
        # One upsert at the database's clock, as Optuna stores a first beat (not a read, then a write).
        with self.engine.begin() as connection:
            connection.execute(self._sql.beat, {"trial_id": trial_id})


def _param_known(trial: FrozenTrial, name: str, internal: float, as_json: str) -> None:
    """Add a parameter to a trial in memory as a read gives it back (through its JSON)."""
    stored = json_to_distribution(as_json)
    trial.distributions[name] = stored
    trial.params[name] = stored.to_external_repr(internal)


class _Statements:
    """The Core statements made here, built once for a storage (so SQLAlchemy compiles each once)
    with the dialect's INSERT, which has ON CONFLICT; each execution binds its values."""

    def __init__(self, dialect: str) -> None:
        from sqlalchemy.dialects import postgresql, sqlite

        insert, bind, m = (postgresql if dialect == "postgresql" else sqlite).insert, sqlalchemy.bindparam, _models()
        studies, trials = m.StudyModel.__table__, m.TrialModel.__table__
        this = trials.c.trial_id == bind("b_id")
        self.lock = sqlalchemy.select(trials.c.state).where(this).with_for_update()
        self.finish = (sqlalchemy.update(trials).where(this, trials.c.state == TrialState.RUNNING)
                       .values(state=bind("b_state"), datetime_complete=bind("b_complete")))
        # A parameter written twice is ignored, as Optuna ignores the duplicate's IntegrityError.
        params = m.TrialParamModel.__table__
        self.params = insert(params).on_conflict_do_nothing(index_elements=[params.c.trial_id, params.c.param_name])
        self.user = _upsert(insert(m.TrialUserAttributeModel.__table__), ("trial_id", "key"), ("value_json",))
        self.system = _upsert(insert(m.TrialSystemAttributeModel.__table__), ("trial_id", "key"), ("value_json",))
        self.values = _upsert(insert(m.TrialValueModel.__table__), ("trial_id", "objective"), ("value", "value_type"))
        beat = insert(m.TrialHeartbeatModel.__table__).values(heartbeat=sqlalchemy.func.current_timestamp())
        self.beat = _upsert(beat, ("trial_id",), ("heartbeat",))
        # A study's first row that a read would return (None where it has none), for `_has_rows`.
        match = (trials.c.study_id == studies.c.study_id) & (
            trials.c.trial_id.in_(bind("b_ids", expanding=True)) | (trials.c.trial_id > bind("b_above")))
        rows = sqlalchemy.select(studies.c.study_id, trials.c.trial_id).where(studies.c.study_id == bind("b_study"))
        self.rows = rows.select_from(studies.outerjoin(trials, match)).limit(1)
        in_states = match & trials.c.state.in_(bind("b_states", expanding=True))
        self.rows_in_states = rows.select_from(studies.outerjoin(trials, in_states)).limit(1)


def _upsert(insert: Any, keys: tuple[str, ...], updated: tuple[str, ...]) -> Any:
    """`insert` that replaces the `updated` columns of a row whose `keys` exist."""
    return insert.on_conflict_do_update(index_elements=keys, set_={c: insert.excluded[c] for c in updated})


def flush(storage: optuna.storages.BaseStorage | None) -> None:
    """Make the writes `storage` holds for this process's running trials (nothing for any other
    storage): what the loop calls once a trial's setting is suggested, before it is evaluated."""
    if isinstance(storage, BatchedStorage):
        storage.flush()


__all__ = ["BatchedStorage", "FINISHED_KEPT", "LISTED_IDS_MAX", "flush", "supported"]
