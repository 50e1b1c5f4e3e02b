"""A study many workers share by name (`--study NAME`): created by the first, joined by the rest.

The first worker creates the Optuna study and records in its attributes what every later worker
must agree with: the workload's fingerprint, the search space, and the options that define the
objective and the budget. A later worker is refused, in one line, when its workload, device kind
or space differs; it adopts the study's budget, planned steps and tolerance (the objective every
trial is ranked by must be one). The first worker's baseline profile is shared the same way, so
the baseline is profiled once, and the verification is recorded there once it has run.

Optuna creates a study atomically (`DuplicatedStudyError` for every worker but one), which makes
the first worker the one whose `create_study` succeeded; the rest wait for its record.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import optuna

from tpu_tuner.errors import UserInputError
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.search.space import SearchSpace
from tpu_tuner.tuning.fingerprint import differences
from tpu_tuner.tuning.options import TuneOptions

log = logging.getLogger(__name__)

# Study user attributes (plain JSON): what the first worker recorded, its baseline profile, and
# the final verification.
RECORD_ATTR = "tpu_tune"
PROFILE_ATTR = "tpu_tune_profile"
VERIFICATION_ATTR = "tpu_tune_verification"
RECORD_FORMAT = 1
# Options every worker of a study takes from its record (the objective and the budget).
ADOPTED_OPTIONS = ("trials", "planned_steps", "tolerance", "memory_limit_bytes", "verify_rounds")
# Fingerprint keys a joining worker may differ in: where the file lies on its host, and the
# host's device name (hosts of one device kind join; the report says which host measured what).
HOST_KEYS = ("model_file", "device_name")
# How often a joining worker looks for the first worker's record and profile.
POLL_S = 0.5


@dataclass
class SharedStudy:
    """An opened named study, and whether this worker created it."""

    study: optuna.Study
    created: bool
    record: dict[str, Any]


def space_signature(space: SearchSpace) -> dict[str, Any]:
    """What two workers' spaces must share: name, device kind, ranks and every parameter's choices."""
    return {"name": space.name, "device_kind": space.device_kind, "ranks": space.ranks,
            "params": {p.name: list(p.choices) for p in space.params}}


def make_record(fingerprint: dict[str, Any], space: SearchSpace, options: TuneOptions) -> dict[str, Any]:
    """The first worker's record: what later workers are checked against and adopt."""
    from tpu_tuner.credentials import without_password
    from tpu_tuner.plain_data import json_default

    plain = dataclasses.asdict(options)
    plain["storage"] = without_password(options.storage) if options.storage else None
    plain = json.loads(json.dumps(plain, default=json_default))
    return {"format": RECORD_FORMAT, "fingerprint": fingerprint, "space": space_signature(space), "options": plain,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S")}


def join_differences(recorded: dict[str, Any], fingerprint: dict[str, Any], space: SearchSpace) -> list[str]:
    """Why a worker with `fingerprint` and `space` may not join the study `recorded` describes."""
    theirs = {k: v for k, v in recorded.get("fingerprint", {}).items() if k not in HOST_KEYS}
    ours = {k: v for k, v in fingerprint.items() if k not in HOST_KEYS}
    found = differences(theirs, ours)
    if "sha256" in theirs and theirs["sha256"] != ours.get("sha256"):
        found = [d for d in found if not d.startswith("model file differs")]
        found.insert(0, f"model file differs (sha256 {str(ours.get('sha256'))[:8]}.. vs {str(theirs['sha256'])[:8]}.. "
                        f"recorded for {recorded['fingerprint'].get('model_file')})")
    signature = space_signature(space)
    stored = recorded.get("space", {})
    if stored != signature:
        changed = sorted(name for name in set(stored.get("params", {})) | set(signature["params"])
                         if stored.get("params", {}).get(name) != signature["params"].get(name))
        what = f"parameters {', '.join(changed)}" if changed else "name / device kind / ranks"
        found.append(f"search space differs ({space.name!r}: {what})")
    return found


def open_shared(storage: optuna.storages.BaseStorage, name: str, sampler: optuna.samplers.BaseSampler,
                record: dict[str, Any], space: SearchSpace, wait_s: float = 60.0) -> SharedStudy:
    """Create the study `name` with `record`, or join it: refused (UserInputError, one line)
    when the record it holds differs in workload, device kind or space."""
    try:
        study = optuna.create_study(storage=storage, study_name=name, direction="minimize", sampler=sampler)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    else:
        study.set_user_attr(RECORD_ATTR, record)
        log.info("created study %r", name)
        return SharedStudy(study, True, record)
    recorded = _wait_for(study, RECORD_ATTR, wait_s)
    if not isinstance(recorded, dict):
        raise UserInputError(f"--study {name}: the study exists but no tpu-tune worker recorded its workload "
                             f"(not created by tpu-tune, or its first worker died within {wait_s:.0f} s of creating it)")
    if recorded.get("format") != RECORD_FORMAT:
        raise UserInputError(f"--study {name}: recorded by another version of tpu-tune (format "
                             f"{recorded.get('format')!r}, this one reads {RECORD_FORMAT})")
    if study.direction != optuna.study.StudyDirection.MINIMIZE:
        raise UserInputError(f"--study {name}: not a tpu-tune study (it maximises)")
    differing = join_differences(recorded, record["fingerprint"], space)
    if differing:
        raise UserInputError(f"--study {name}: join refused: {'; '.join(differing)}")
    log.info("joined study %r (created %s)", name, recorded.get("created"))
    return SharedStudy(study, False, recorded)


def adopt_options(options: TuneOptions, recorded: dict[str, Any]) -> TuneOptions:
    """`options` with the study's budget and objective (`ADOPTED_OPTIONS`), logging each value
    this worker was given otherwise."""
    theirs = recorded.get("options", {})
    changes = {key: theirs[key] for key in ADOPTED_OPTIONS if key in theirs and theirs[key] != getattr(options, key)}
    for key, value in changes.items():
        log.info("the study's %s is %r (this worker had %r): using the study's", key, value, getattr(options, key))
    return dataclasses.replace(options, **changes)


def publish_profile(study: optuna.Study, profile: Profile) -> None:
    """Share the baseline profile with the study's other workers."""
    study.set_user_attr(PROFILE_ATTR, json.loads(profile.to_json()))


def shared_profile(study: optuna.Study, wait_s: float) -> Profile | None:
    """The first worker's baseline profile, waiting up to `wait_s` for it (None when it did not
    come: its worker died while profiling, and this one profiles instead)."""
    data = _wait_for(study, PROFILE_ATTR, wait_s)
    if not isinstance(data, dict):
        return None
    try:
        return Profile.from_dict(data)
    except (TypeError, ValueError, KeyError) as exc:
        log.warning("the study's shared profile is unreadable (%s): profiling here", exc)
        return None


def record_verification(study: optuna.Study, verification: Any, run_dir: str, worker: str) -> None:
    """Record the study's verification (once: `study finish` and later workers read it)."""
    from tpu_tuner.plain_data import json_default

    plain = json.loads(json.dumps(dataclasses.asdict(verification), default=json_default))
    study.set_user_attr(VERIFICATION_ATTR, {**plain, "run_dir": run_dir, "worker": worker,
                                            "recorded": time.strftime("%Y-%m-%dT%H:%M:%S")})


def recorded_verification(study: optuna.Study) -> dict[str, Any] | None:
    """The verification a worker recorded for the study, or None."""
    value = study.user_attrs.get(VERIFICATION_ATTR)
    return value if isinstance(value, dict) else None


def _wait_for(study: optuna.Study, attr: str, wait_s: float) -> Any:
    deadline = time.monotonic() + wait_s
    while True:
        value = study.user_attrs.get(attr)
        if value is not None or time.monotonic() >= deadline:
            return value
        time.sleep(POLL_S)


__all__ = ["ADOPTED_OPTIONS", "PROFILE_ATTR", "RECORD_ATTR", "VERIFICATION_ATTR", "SharedStudy", "adopt_options",
           "join_differences", "make_record", "open_shared", "publish_profile", "record_verification",
           "recorded_verification", "shared_profile", "space_signature"]
