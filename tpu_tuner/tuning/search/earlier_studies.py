"""Earlier studies a warm start can draw on (tuning/search/warm_start.py), found but not opened yet.

Where earlier studies come from:

* the **results folder** (the run's ``--out``): every tuning run folder with a run.json (storage,
  study name, fingerprint) and a profile.json (written when the run finished). Only studies in
  SQLite are opened from there (study.db in the folder, or the SQLite file run.json names): a
  study in a database server is found through ``--storage`` (below), never by connecting to a
  server a folder names (which would cost a connection timeout per folder when it is gone);
* the **same storage** (``--storage``): every study whose user attr ``tpu_tune`` records its
  fingerprint and `WorkloadFeatures` (written by tuning/run/shared_study.py).

The new study itself is left out by name (`exclude_study`).
"""

from __future__ import annotations

import json
import logging
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from tpu_tuner.core import run_folder
from tpu_tuner.core.credentials import redact, without_password
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.studies.liveness import StudyStorage, read_storage
from tpu_tuner.tuning.run.shared_study import RECORD_ATTR, VERIFICATION_ATTR
from tpu_tuner.tuning.search.workload_features import WorkloadFeatures, features_of_json, optional

log = logging.getLogger(__name__)

# Study user attrs written by tuning/run/shared_study.py: the record ({"fingerprint": {...},
# "features": WorkloadFeatures.to_dict(), ...}) and the verification ({"speedup": ...,
# "chosen_is_best": bool, "best_trial": int, ...}).
STUDY_ATTR = RECORD_ATTR


@dataclass(frozen=True)
class Verified:
    """What an earlier run's verification says about its best: the speedup, and which setting."""

    speedup: float | None
    best_trial: int | None = None
    baseline_trial: int | None = None
    candidate: Candidate | None = None

    def applies_to(self, trial: int, candidate: Candidate, study_best: bool) -> bool:
        """Whether the speedup is that of `trial` (`study_best`: the study's fastest feasible
        trial, which a verification that names no setting is taken to be about)."""
        if self.speedup is None:
            return False
        if self.best_trial is not None:
            return self.best_trial == trial
        return self.candidate == candidate if self.candidate is not None else study_best


@dataclass(frozen=True)
class EarlierStudy:
    """An earlier study, found but not opened yet."""

    source: str
    key: tuple[str, str]  # (storage without password, study name): the same study found twice counts once
    features: WorkloadFeatures
    started: str
    url: str = field(repr=False)  # what opens its storage (with the password where it needs one: never shown)
    name: str
    verified: Verified | None = None

    def open(self, storages: dict[str, StudyStorage]) -> optuna.Study:
        """The study, through `storages` (one connection pool per storage, disposed by the caller)."""
        if self.url not in storages:
            storages[self.url] = read_storage(self.url)
        return optuna.load_study(study_name=self.name, storage=storages[self.url])


# --- earlier studies in the storage --------------------------------------------------------------


def storage_studies(
    storage: str | None, exclude_study: str | None, storages: dict[str, StudyStorage]
) -> list[EarlierStudy]:
    if not storage:
        return []
    bare = without_password(storage)
    if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).is_file():
        return []  # opening it would create it
    try:
        rdb = storages[storage] = read_storage(storage)
        summaries = optuna.get_all_study_summaries(rdb, include_best_trial=False)
    except Exception as exc:
        log.debug("warm start: cannot list the studies of %s: %s", redact(bare), redact(f"{type(exc).__name__}: {exc}"))
        return []
    found = []
    for summary in summaries:
        attrs = summary.user_attrs.get(STUDY_ATTR)
        if summary.study_name == exclude_study or not isinstance(attrs, Mapping):
            continue
        try:
            features = WorkloadFeatures.from_dict(attrs["features"])
        except (KeyError, TypeError, ValueError) as exc:
            log.debug("warm start: study %r: unreadable %s attr (%s)", summary.study_name, STUDY_ATTR, exc)
            continue
        name = summary.study_name
        found.append(
            EarlierStudy(
                source=redact(f"study '{name}' in {bare}"),
                key=(bare, name),
                features=features,
                started=summary.datetime_start.isoformat() if summary.datetime_start else "",
                url=storage,
                name=name,
                verified=_verified_attr(summary.user_attrs.get(VERIFICATION_ATTR)),
            )
        )
    return found


def _verified_attr(data: Any) -> Verified | None:
    """A stored study's verification attr, or result.json's verification ({"speedup": 2.0 or
    {"speedup": 2.0, ...}, "best_trial"?: 7}); None where it is unreadable."""
    if not isinstance(data, Mapping):
        return None
    speedup = data.get("speedup")
    if isinstance(speedup, Mapping):
        speedup = speedup.get("speedup")
    try:
        return Verified(
            speedup=optional(float, speedup),
            best_trial=optional(int, data.get("best_trial")),
            baseline_trial=optional(int, data.get("baseline_trial")),
        )
    except (TypeError, ValueError):
        return None


# --- earlier studies in the results folder -------------------------------------------------------


def folder_studies(results_dir: Path | None, storage: str | None, exclude_study: str | None) -> list[EarlierStudy]:
    if results_dir is None:
        return []
    try:
        folders = sorted(p for p in Path(results_dir).iterdir() if "-tune-" in p.name and p.is_dir())
    except OSError as exc:
        log.debug("warm start: cannot list %s: %s", results_dir, exc)
        return []
    shared = without_password(storage) if storage else None
    found = []
    for folder in folders:
        try:
            earlier = _folder_study(folder, shared, exclude_study)
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.debug("warm start: skipping %s: %s", folder, redact(f"{type(exc).__name__}: {exc}"))
            continue
        if earlier is not None:
            found.append(earlier)
    return found


def _folder_study(folder: Path, shared: str | None, exclude_study: str | None) -> EarlierStudy | None:
    """The study of one run folder, unopened; None (with a debug log) when it offers none."""
    state = json.loads((folder / run_folder.RUN_JSON).read_text())
    stored, name = str(state["storage"]), str(state["study_name"])
    if name == exclude_study or (shared is not None and without_password(stored) == shared):
        return None  # this study, or one the storage itself lists
    if not stored.startswith("sqlite:"):
        log.debug("warm start: skipping %s: its study is in a database server (found through --storage)", folder)
        return None
    local = folder / run_folder.STUDY_DB
    path = local if local.is_file() else Path(stored.removeprefix("sqlite:///"))
    if not path.is_file():
        log.debug("warm start: skipping %s: no %s", folder, run_folder.STUDY_DB)
        return None
    fingerprint = state.get("fingerprint") or {}
    features = features_of_json(json.loads((folder / run_folder.PROFILE_JSON).read_text()), fingerprint)
    return EarlierStudy(
        source=f"run {folder}",
        key=(without_password(stored), name),
        features=features,
        started=str(state.get("started") or ""),
        url=f"sqlite:///{path.resolve()}",
        name=name,
        verified=_folder_verification(folder),
    )


def _folder_verification(folder: Path) -> Verified | None:
    """result.json's verification, else tuned_config.toml's (runs written before result.json)."""
    try:
        verified = _verified_attr(json.loads((folder / run_folder.RESULT_JSON).read_text())["verification"])
    except (OSError, ValueError, TypeError, KeyError):
        verified = None
    if verified is not None:
        return verified
    try:
        config = tomllib.loads((folder / run_folder.TUNED_CONFIG).read_text())
        v = config["provenance"]["verification"]
        if not v.get("significant"):
            return None  # the config is the baseline: it does not say which setting was verified
        return Verified(
            speedup=optional(float, v.get("speedup")), candidate=Candidate.from_dict(config.get("settings", {}))
        )
    except (OSError, ValueError, TypeError, KeyError, AttributeError, tomllib.TOMLDecodeError):
        return None


__all__ = ["STUDY_ATTR", "VERIFICATION_ATTR", "EarlierStudy", "Verified", "folder_studies", "storage_studies"]
