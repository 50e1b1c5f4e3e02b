"""Opening a study: the one way every feature creates or joins a study by name.

Optuna creates a study atomically (`DuplicatedStudyError` for every process but one), which makes
the creator the one whose `create_study` succeeded: it writes the study's record (what the study
is for: a tuning run's workload and options, a plan's inputs) as a study user attribute, and
every other process joins, reading that record (waiting for it when the creator may not have
written it yet). What a record must agree with is the feature's to check.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

import optuna

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.polling import poll

log = logging.getLogger(__name__)

# How often a joining process looks for the creator's record.
POLL_S = 0.5


@dataclass(frozen=True)
class OpenedStudy:
    """A study opened by name: whether this process created it, and the record it holds (empty:
    joined a study whose record never came)."""

    study: optuna.Study
    created: bool
    record: dict[str, Any]


def open_study(
    storage: optuna.storages.BaseStorage | None,
    name: str,
    direction: Literal["minimize", "maximize"],
    record_attr: str,
    record: dict[str, Any],
    sampler: optuna.samplers.BaseSampler | None = None,
    wait_s: float = 0.0,
) -> OpenedStudy:
    """Create the study `name` (in `storage`; None: in memory) holding `record` under
    `record_attr`, or join it, waiting up to `wait_s` for its record. A study there that goes
    the other `direction` is refused in one line (`UserInputError`)."""
    try:
        study = optuna.create_study(storage=storage, study_name=name, direction=direction, sampler=sampler)
    except optuna.exceptions.DuplicatedStudyError:
        assert storage is not None  # a study in memory is always new
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    else:
        study.set_user_attr(record_attr, record)
        log.info("created study %r", name)
        return OpenedStudy(study, True, record)
    if study.direction.name.lower() != direction:
        raise UserInputError(f"study {name!r} is not one of this kind (it {study.direction.name.lower()}s)")
    recorded = poll(lambda: study.user_attrs.get(record_attr), POLL_S, wait_s)
    return OpenedStudy(study, False, recorded if isinstance(recorded, dict) else {})


__all__ = ["OpenedStudy", "open_study"]
