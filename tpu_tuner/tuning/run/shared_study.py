"""A study many workers share by name (`--study NAME`): created by the first, joined by the rest.

The first worker creates the Optuna study and records in its attributes what every later worker
must agree with: the workload's fingerprint, the search space, and the options that define the
objective and the budget. A later worker is refused, in one line, when its workload, device kind
or space differs; it adopts the study's budget, planned steps and tolerance (the objective every
trial is ranked by must be one). The first worker's baseline profile is shared the same way, so
the baseline is profiled once, and the verification is recorded there once it has run.

The first worker is the one whose `create_study` succeeded (studies/opening.py); the rest wait
for its record.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any

import optuna

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.polling import poll
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.studies.coverage import covered_settings, last_measured, measured_count
from tpu_tuner.studies.fingerprint import differences
from tpu_tuner.studies.liveness import RunningWatch, Worker, fail_lost_trials
from tpu_tuner.studies.loop import StopReason
from tpu_tuner.studies.opening import POLL_S, OpenedStudy, open_study
from tpu_tuner.tuning.options.tune_options import TuneOptions
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.tuning_trial import TuningTrial

log = logging.getLogger(__name__)

# Study user attributes (plain JSON): what the first worker recorded, its baseline profile, and
# the final verification.
RECORD_ATTR = "tpu_tune"
PROFILE_ATTR = "tpu_tune_profile"
VERIFICATION_ATTR = "tpu_tune_verification"
# 2: each trial keeps its keys in one structured attribute (studies/trial_record.py). A worker of
# format 1 reads only flat keys and would miscount this version's trials: it refuses a format-2
# study; this version reads both, so it joins either.
RECORD_FORMAT = 2
JOINABLE_FORMATS = (1, 2)
# Options every worker of a study takes from its record: the budget, what the objective is and
# how a trial is timed and judged, the search (sampler, seed, agents), liveness (a worker that
# judged others by a shorter grace period than theirs would fail their live trials).
ADOPTED_OPTIONS = (
    "trials",
    "planned_steps",
    "tolerance",
    "verify_rounds",
    "sampler",
    "seed",
    "agents",
    "trial_settings",
    "max_buckets",
    "bucket_align",
    "heartbeat_interval_s",
    "grace_period_s",
)
# Options a joining worker must have as the study does, refused otherwise: they shape the
# worker process it has already started (its address-space limit), so they cannot be adopted.
# A trial timeout shorter than the others' would fail trials they complete (and count them).
MATCHED_OPTIONS = {"memory_limit_bytes": "--trial-memory-gb", "trial_timeout_s": "--trial-timeout"}
# Fingerprint keys a joining worker may differ in: where the file lies on its host, and the
# host's device name (hosts of one device kind join; the report says which host measured what).
HOST_KEYS = ("model_file", "device_name")


class JoinRefused(UserInputError):
    """A worker whose workload, device kind, space or worker-shaping options differ from the
    study's (its run folder is removed: it never ran)."""


def space_signature(space: SearchSpace) -> dict[str, Any]:
    """What two workers' spaces must share: name, device kind, ranks and every parameter's choices."""
    return {
        "name": space.name,
        "device_kind": space.device_kind,
        "ranks": space.ranks,
        "params": {p.name: list(p.choices) for p in space.params},
    }


def make_record(fingerprint: dict[str, Any], space: SearchSpace, options: TuneOptions) -> dict[str, Any]:
    """The first worker's record: what later workers are checked against and adopt."""
    return {
        "format": RECORD_FORMAT,
        "fingerprint": fingerprint,
        "space": space_signature(space),
        "options": options.to_plain(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def join_differences(
    recorded: dict[str, Any], fingerprint: dict[str, Any], space: SearchSpace, options: dict[str, Any] | None = None
) -> list[str]:
    """Why a worker with `fingerprint`, `space` and (a record's plain) `options` may not join the
    study `recorded` describes."""
    theirs = {k: v for k, v in recorded.get("fingerprint", {}).items() if k not in HOST_KEYS}
    ours = {k: v for k, v in fingerprint.items() if k not in HOST_KEYS}
    found = differences(theirs, ours)
    if "sha256" in theirs and theirs["sha256"] != ours.get("sha256"):
        found = [d for d in found if not d.startswith("model file differs")]
        found.insert(
            0,
            f"model file differs (sha256 {str(ours.get('sha256'))[:8]}.. vs {str(theirs['sha256'])[:8]}.. "
            f"recorded for {recorded['fingerprint'].get('model_file')})",
        )
    theirs_options, ours_options = recorded.get("options", {}), options or {}
    for key, flag in MATCHED_OPTIONS.items():
        if options is not None and theirs_options.get(key) != ours_options.get(key):
            found.append(f"{flag} differs ({ours_options.get(key)} vs {theirs_options.get(key)} recorded)")
    signature = space_signature(space)
    stored = recorded.get("space", {})
    if stored != signature:
        changed = sorted(
            name
            for name in set(stored.get("params", {})) | set(signature["params"])
            if stored.get("params", {}).get(name) != signature["params"].get(name)
        )
        what = f"parameters {', '.join(changed)}" if changed else "name / device kind / ranks"
        found.append(f"search space differs ({space.name!r}: {what})")
    return found


def open_shared(
    storage: optuna.storages.BaseStorage,
    name: str,
    sampler: optuna.samplers.BaseSampler,
    record: dict[str, Any],
    space: SearchSpace,
    wait_s: float = 60.0,
) -> OpenedStudy:
    """Create the study `name` with `record`, or join it (studies/opening.py): refused
    (UserInputError, one line) when the record it holds differs in workload, device kind or space."""
    opened = open_study(storage, name, "minimize", RECORD_ATTR, record, sampler, wait_s)
    recorded = opened.record
    if opened.created:
        return opened
    if not recorded:
        raise UserInputError(
            f"--study {name}: the study exists but no tpu-tune worker recorded its workload "
            f"(not created by tpu-tune, or its first worker died within {wait_s:.0f} s of creating it)"
        )
    if recorded.get("format") not in JOINABLE_FORMATS:
        raise UserInputError(
            f"--study {name}: recorded by another version of tpu-tune (format "
            f"{recorded.get('format')!r}, this one reads {', '.join(map(str, JOINABLE_FORMATS))})"
        )
    differing = join_differences(recorded, record["fingerprint"], space, record["options"])
    if differing:
        raise JoinRefused(f"--study {name}: join refused: {'; '.join(differing)}")
    log.info("joined study %r (created %s)", name, recorded.get("created"))
    return opened


def adopt_options(options: TuneOptions, recorded: dict[str, Any]) -> TuneOptions:
    """`options` with the study's budget and objective (`ADOPTED_OPTIONS`), logging each value
    this worker was given otherwise."""
    stored, ours = recorded.get("options", {}), options.to_plain()
    changes = {key: stored[key] for key in ADOPTED_OPTIONS if key in stored and stored[key] != ours[key]}
    for key, value in changes.items():
        log.info("the study's %s is %r (this worker had %r): using the study's", key, value, ours[key])
    return TuneOptions.from_plain(changes, base=options)


def publish_profile(study: optuna.Study, profile: Profile) -> None:
    """Share the baseline profile with the study's other workers."""
    study.set_user_attr(PROFILE_ATTR, json.loads(profile.to_json()))


def shared_profile(study: optuna.Study, wait_s: float) -> Profile | None:
    """The first worker's baseline profile, waiting up to `wait_s` for it (None when it did not
    come: its worker died while profiling, and this one profiles instead)."""
    data = poll(lambda: study.user_attrs.get(PROFILE_ATTR), POLL_S, wait_s)
    if not isinstance(data, dict):
        return None
    try:
        return Profile.from_dict(data)
    except (TypeError, ValueError, KeyError) as exc:
        log.warning("the study's shared profile is unreadable (%s): profiling here", exc)
        return None


def record_verification(study: optuna.Study, verification: Any, run_dir: str, worker: str, measured: int) -> None:
    """Record the study's verification, of its best among `measured` settings (`study finish` and
    later workers read it; a study that has measured more since is verified again)."""
    from tpu_tuner.core.plain_data import json_default

    plain = json.loads(json.dumps(dataclasses.asdict(verification), default=json_default))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    record = dict(plain, run_dir=run_dir, worker=worker, measured=measured, recorded=stamp)
    study.set_user_attr(VERIFICATION_ATTR, record)


def recorded_verification(study: optuna.Study) -> dict[str, Any] | None:
    """The verification a worker recorded for the study, or None."""
    value = study.user_attrs.get(VERIFICATION_ATTR)
    return value if isinstance(value, dict) else None


def verification_left_to(study: optuna.Study, worker: Worker, end: StopReason, watch: RunningWatch) -> str | None:
    """Why this worker of a shared study leaves the verification to another (or None: it verifies).

    The study is verified once it is complete, by the worker that measured its last trial (the
    one that completed the budget): every worker that stops decides the same from the same
    trials, so exactly one verifies. A worker that stops on its own `--timeout` leaves it to the
    others. Before deciding, the study's running trials are waited for (the last measurements of
    others, short repeats; a lost one is failed meanwhile), since they decide who measured last.
    `tpu-tune study finish` verifies wherever no worker did.
    """
    if end in (StopReason.TIMEOUT, StopReason.ASKS):
        why = (
            "this worker's --timeout ended its part of the search"
            if end is StopReason.TIMEOUT
            else "this worker's sampler proposed only settings the study has covered"
        )
        return f"{why}; the worker that completes the study's budget verifies (or run `tpu-tune study finish`)"
    storage = worker.storage
    assert storage is not None

    def settled() -> list[optuna.trial.FrozenTrial] | None:
        trials = fail_lost_trials(study, storage, watch)
        return None if any(t.state == optuna.trial.TrialState.RUNNING for t in trials) else trials

    trials = poll(settled, worker.poll_s)
    assert trials is not None  # no timeout: polled until settled
    measured = measured_count(covered_settings(trials))
    done = recorded_verification(study)
    if done is not None and done.get("measured") == measured:
        return f"the study was verified by worker {done.get('worker')} ({done.get('run_dir')})"
    last = last_measured(trials)
    last_worker = TuningTrial.of(last).claims.worker if last is not None else None
    if last is None or last_worker == worker.id:
        return None
    return f"worker {last_worker} measured the study's last trial and verifies it (or run `tpu-tune study finish`)"


__all__ = [
    "ADOPTED_OPTIONS",
    "JoinRefused",
    "MATCHED_OPTIONS",
    "PROFILE_ATTR",
    "RECORD_ATTR",
    "VERIFICATION_ATTR",
    "adopt_options",
    "join_differences",
    "make_record",
    "open_shared",
    "publish_profile",
    "record_verification",
    "recorded_verification",
    "shared_profile",
    "space_signature",
    "verification_left_to",
]
