"""Warm start: a new study begins with the best settings of earlier studies on the same device kind.

Where earlier studies come from:

* the **results folder** (the run's ``--out``): every tuning run folder with a run.json (storage,
  study name, fingerprint) and a profile.json (written when the run finished). Only studies in
  SQLite are opened from there (study.db in the folder, or the SQLite file run.json names): a
  study in a database server is found through ``--storage`` (below), never by connecting to a
  server a folder names (which would cost a connection timeout per folder when it is gone);
* the **same storage** (``--storage``): every study whose user attr ``tpu_tune`` records its
  fingerprint and `WorkloadFeatures` (written by tuning/shared_study.py).

Only studies of the same device kind count; the new study itself is left out by name.

The setting a study offers is its best: the feasible trial with the lowest value that this space
can run (its knob values are choices of this space, the knobs this space keeps fixed at the same
values) and that is not a baseline (the study's own, or this space's). Walking its feasible
trials from the fastest, the first one that qualifies is taken, and none once the walk reaches
the study's baseline: a setting slower than the baseline is not worth a trial.

Ranking (`distance`, lower first):

* **0: the same workload**: the same model file (sha256), batch size, sequence length, ranks
  and step kind. Its best was measured on exactly this step, so it goes first.
* otherwise ``NOT_SAME_WORKLOAD`` (0.1), plus ``OTHER_MODEL_FILE`` (0.25) when the model file
  differs, plus ``|ln(FLOPs per parameter there / here)|``, plus ``OTHER_BOUND`` (1.0) when the
  verdicts' bounds differ, plus ``OTHER_KIND`` (1.5) when the model kinds differ; an unknown
  FLOPs per parameter counts as ``UNKNOWN_RATIO`` (ln 8), an unknown bound or kind as differing.

Why these weights: FLOPs per parameter (model FLOPs of a step over the parameter count: about 2x
the tokens a step processes, 6x when it trains) is how much work each weight does, which decides
whether a step is dominated by big matmuls (precision and autocast pay) or by small launches
(compilation and threads pay); on a log scale so that 2x more and 2x fewer are equally far. A
different bound means the bottleneck differs, and with it which knobs win (lower precision for a
compute-bound step, fusion for a memory-bound one, compilation for an overhead-bound one): as far
as an e-fold (2.7x) difference in FLOPs per parameter. A different model kind means a different
operator mix (convolutions: memory format; attention: the SDPA kernels compilers rewrite):
weighed more, as far as a 4.5x difference. The same model file at other sizes comes before
another model with the same features (`OTHER_MODEL_FILE`), and any exact match before both
(`NOT_SAME_WORKLOAD`). Ties go to the newer study.

Model kind, from what the profile records (`model_kind_of`): "transformer" when the FLOPs report
declares attention or an attention operator ran (a ViT's patch convolution does not make it
convolutional); "convolutional" when the model has 4-D weights (``traits.conv_weights``) or a
convolution ran; "recurrent" when an LSTM/GRU/RNN operator ran; "mlp" when only matmuls (mm,
addmm, linear) remain; None when the profile records none of these.

It reads only run.json, profile.json, result.json (or tuned_config.toml) and the studies it
needs: folders are ranked from their JSON first and studies opened closest first, until `limit`
seeds are found.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from tpu_tuner.core import run_folder
from tpu_tuner.knobs import registry as knobs
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.core.credentials import redact, without_password
from tpu_tuner.tuning import trial_attrs
from tpu_tuner.tuning.shared_study import RECORD_ATTR, VERIFICATION_ATTR

if TYPE_CHECKING:
    from tpu_tuner.profiling.profile import Profile
    from tpu_tuner.tuning.space import SearchSpace

log = logging.getLogger(__name__)

# Study user attrs written by tuning/shared_study.py: the record ({"fingerprint": {...},
# "features": WorkloadFeatures.to_dict(), ...}) and the verification ({"speedup": ...,
# "chosen_is_best": bool, "best_trial": int, ...}).
STUDY_ATTR = RECORD_ATTR
# The trial user attr an enqueued warm-start setting carries (WarmSeed.attrs()).
TRIAL_ATTR = "warm_start"

# The distance's weights (see the module docstring for why).
NOT_SAME_WORKLOAD = 0.1
OTHER_MODEL_FILE = 0.25
OTHER_BOUND = 1.0
OTHER_KIND = 1.5
UNKNOWN_RATIO = math.log(8.0)
# Farther than this, an earlier best is a guess no better than the agents' own and would only take
# a trial of a small budget: another model kind (1.5 alone) never qualifies; the same kind and
# bound does within about 3.2x FLOPs per parameter (another model file), another bound within 1.16x.
MAX_DISTANCE = 1.5

SAME_WORKLOAD = "same workload"


@dataclass(frozen=True)
class WorkloadFeatures:
    """What a study's workload is, as far as choosing an earlier study's setting goes."""

    device_kind: str
    sha256: str | None  # the model file's hash (fingerprint["sha256"])
    batch_size: int | None
    seq_len: int | None
    nproc: int
    step_kind: str | None  # "training step", "inference (forward)", ...
    flops_per_param: float | None  # model FLOPs of a step / total parameters
    bound: str | None  # the baseline profile's verdict ("compute-bound", ...)
    model_kind: str | None  # "transformer", "convolutional", "recurrent", "mlp" (model_kind_of)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "WorkloadFeatures":
        """From `to_dict` output; KeyError/TypeError/ValueError when malformed."""
        return cls(
            device_kind=str(data["device_kind"]),
            sha256=_opt(str, data.get("sha256")),
            batch_size=_opt(int, data.get("batch_size")),
            seq_len=_opt(int, data.get("seq_len")),
            nproc=int(data.get("nproc") or 1),
            step_kind=_opt(str, data.get("step_kind")),
            flops_per_param=_opt(float, data.get("flops_per_param")),
            bound=_opt(str, data.get("bound")),
            model_kind=_opt(str, data.get("model_kind")),
        )

    def same_workload(self, other: "WorkloadFeatures") -> bool:
        """The same step: model file, sizes, ranks, step kind and device kind."""
        return (self.sha256 is not None and self.sha256 == other.sha256 and self.device_kind == other.device_kind
                and (self.batch_size, self.seq_len, self.nproc, self.step_kind)
                == (other.batch_size, other.seq_len, other.nproc, other.step_kind))


def _opt(kind: Callable[[Any], Any], value: Any) -> Any:
    return None if value is None else kind(value)


def features_of(profile: "Profile", fingerprint: Mapping[str, Any]) -> WorkloadFeatures:
    """The features of a run: its baseline `profile` and its `fingerprint` (fingerprint.py)."""
    flops = profile.flops
    verdict = getattr(profile, "verdict", None)
    return _features(
        device_kind=fingerprint.get("device_kind") or profile.device.kind,
        fingerprint=fingerprint,
        workload=profile.workload,
        model_flops=getattr(flops, "model_per_step", None),
        parameters=getattr(flops, "total_parameters", None),
        attention=getattr(flops, "attention_convention", None),
        bound=getattr(verdict, "bound", None),
        operators=[getattr(op, "name", "") for op in getattr(profile, "operators", None) or []],
    )


def features_of_json(profile: Mapping[str, Any], fingerprint: Mapping[str, Any]) -> WorkloadFeatures:
    """`features_of` on a profile.json read as plain JSON (no Profile rebuilt: a folder scan
    reads dozens). KeyError/TypeError/ValueError when it is not a profile."""
    flops = profile.get("flops") or {}
    return _features(
        device_kind=fingerprint.get("device_kind") or profile["device"]["kind"],
        fingerprint=fingerprint,
        workload=profile.get("workload") or {},
        model_flops=flops.get("model_per_step"),
        parameters=flops.get("total_parameters"),
        attention=flops.get("attention_convention"),
        bound=(profile.get("verdict") or {}).get("bound"),
        operators=[op.get("name", "") if isinstance(op, Mapping) else str(op) for op in profile.get("operators") or []],
    )


def _features(device_kind: str, fingerprint: Mapping[str, Any], workload: Mapping[str, Any], model_flops: Any,
              parameters: Any, attention: Any, bound: Any, operators: list[str]) -> WorkloadFeatures:
    def size(key: str) -> int | None:
        # The fingerprint's, else the profile's: fingerprints of older runs hold None for "the
        # file's own size", which the profile's workload records.
        value = fingerprint.get(key)
        value = workload.get(key) if value is None else value
        return None if value is None else int(value)

    flops_per_param = (float(model_flops) / float(parameters)
                       if model_flops and parameters and float(parameters) > 0 else None)
    return WorkloadFeatures(
        device_kind=str(device_kind),
        sha256=_opt(str, fingerprint.get("sha256")),
        batch_size=size("batch_size"),
        seq_len=size("seq_len"),
        nproc=int(fingerprint.get("nproc") or 1),
        step_kind=_opt(str, fingerprint.get("step_kind") or workload.get("step")),
        flops_per_param=flops_per_param,
        bound=_opt(str, bound),
        model_kind=model_kind_of(workload.get("traits"), attention, operators),
    )


def model_kind_of(traits: Any, attention_convention: Any, operators: Iterable[str]) -> str | None:
    """"transformer", "convolutional", "recurrent", "mlp" or None (the rule: module docstring)."""
    names = [str(name).lower() for name in operators]
    declared = isinstance(attention_convention, str) and attention_convention and \
        not attention_convention.startswith("not applicable")
    if declared or any("attention" in n for n in names):
        return "transformer"
    conv_weights = traits.get("conv_weights") if isinstance(traits, Mapping) else None
    if (conv_weights or 0) > 0 or any("conv" in n for n in names):
        return "convolutional"
    if any(word in n for n in names for word in ("lstm", "gru", "rnn")):
        return "recurrent"
    if any(n.endswith(("::mm", "::addmm", "::bmm", "::linear", "::matmul")) for n in names):
        return "mlp"
    return None


def distance(here: WorkloadFeatures, there: WorkloadFeatures) -> tuple[float, str]:
    """How far `there`'s best setting is from fitting `here` (0: the same workload), and the
    words that say why: "same workload", or "nearest: FLOPs/parameter 1.40x, same bound
    (compute-bound), same kind (transformer)"."""
    if here.same_workload(there):
        return 0.0, SAME_WORKLOAD
    d, words = NOT_SAME_WORKLOAD, []
    if here.sha256 is not None and here.sha256 == there.sha256:
        words.append("same model file, other sizes")
    else:
        d += OTHER_MODEL_FILE
    if here.flops_per_param and there.flops_per_param:
        ratio = there.flops_per_param / here.flops_per_param
        d += abs(math.log(ratio))
        words.append(f"FLOPs/parameter {ratio:.2f}x")
    else:
        d += UNKNOWN_RATIO
        words.append("FLOPs/parameter unknown")
    for weight, name, a, b in ((OTHER_BOUND, "bound", here.bound, there.bound),
                               (OTHER_KIND, "kind", here.model_kind, there.model_kind)):
        if a is not None and a == b:
            words.append(f"same {name} ({a})")
        else:
            d += weight
            words.append(f"other {name} ({b or 'unknown'} vs {a or 'unknown'} here)")
    return d, "nearest: " + ", ".join(words)


@dataclass(frozen=True)
class WarmSeed:
    """An earlier study's best setting, to be measured early in this one."""

    params: dict[str, str]  # the setting, whole for this space (SearchSpace.complete)
    source: str  # "study 'gpt-v5e' in postgresql://tune@db/tune" or "run results/gpt-tune-..." (no password)
    match: str  # "same workload" or "nearest: ..." (`distance`)
    distance: float  # 0 for the same workload; the ranking key
    objective_s: float  # what it measured there: the trial's value (amortised step seconds)
    speedup: float | None  # over that study's baseline: verified when `verified`, else the search's ratio
    verified: bool = False  # `speedup` is the interleaved verification's, not the search's ratio
    trial: int | None = None  # its trial number there

    def attrs(self) -> dict[str, Any]:
        """The enqueued trial's user attr "warm_start" (plain JSON)."""
        return {"source": self.source, "match": self.match, "distance": self.distance, "trial": self.trial,
                "objective_s": self.objective_s, "speedup": self.speedup, "speedup_verified": self.verified}

    def describe(self) -> str:
        """One line: "run results/x (trial 7; same workload): 12.3 ms amortised, 2.03x verified"."""
        from tpu_tuner.core.units import duration

        trial = f"trial {self.trial}; " if self.trial is not None else ""
        gain = "" if self.speedup is None else \
            f", {self.speedup:.2f}x {'verified' if self.verified else 'in its search'}"
        return f"{self.source} ({trial}{self.match}): {duration(self.objective_s)} amortised{gain}"


@dataclass(frozen=True)
class _Verified:
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
class _Earlier:
    """An earlier study, found but not opened yet."""

    source: str
    key: tuple[str, str]  # (storage without password, study name): the same study found twice counts once
    features: WorkloadFeatures
    started: str
    url: str = field(repr=False)  # what opens its storage (with the password where it needs one: never shown)
    name: str
    verified: _Verified | None = None

    def open(self, storages: dict[str, optuna.storages.RDBStorage]) -> optuna.Study:
        """The study, through `storages` (one connection pool per storage, disposed by the caller)."""
        if self.url not in storages:
            storages[self.url] = optuna.storages.RDBStorage(self.url)
        return optuna.load_study(study_name=self.name, storage=storages[self.url])


def find_warm_seeds(space: "SearchSpace", features: WorkloadFeatures, *, storage: str | None,
                    results_dir: Path | None, exclude_study: str | None = None, limit: int = 3,
                    max_distance: float = MAX_DISTANCE) -> list[WarmSeed]:
    """Up to `limit` settings from earlier studies on `features.device_kind`, closest first (the
    same workload, then the nearest by features, no farther than `max_distance`), each a
    different setting valid in `space`.

    Never raises for what it reads: an unreadable folder, study or storage is skipped with a
    debug log (the password of `storage` never in it)."""
    if limit <= 0:
        return []
    storages: dict[str, optuna.storages.RDBStorage] = {}
    try:
        return _seeds(space, features, storage, results_dir, exclude_study, limit, max_distance, storages)
    finally:
        for rdb in storages.values():  # no connection pool left open behind the search
            with contextlib.suppress(Exception):
                rdb.engine.dispose()


def _seeds(space: "SearchSpace", features: WorkloadFeatures, storage: str | None, results_dir: Path | None,
           exclude_study: str | None, limit: int, max_distance: float,
           storages: dict[str, optuna.storages.RDBStorage]) -> list[WarmSeed]:
    found: dict[tuple[str, str], _Earlier] = {}
    for earlier in [*_storage_studies(storage, exclude_study, storages),
                    *_folder_studies(results_dir, storage, exclude_study)]:
        if earlier.features.device_kind == features.device_kind:
            found.setdefault(earlier.key, earlier)
    # Closest first; among equally close studies the newest (a stable sort on the newer order).
    newest_first = sorted(found.values(), key=lambda e: e.started, reverse=True)
    ranked = sorted(((*distance(features, e.features), e) for e in newest_first), key=lambda item: item[0])
    baseline = space.to_candidate(space.baseline_params())
    seeds: list[WarmSeed] = []
    for d, match, earlier in ranked:
        if d > max_distance:
            log.debug("warm start: %s is too far (%.2f > %.2f): %s", earlier.source, d, max_distance, match)
            break
        try:
            seed = _best_of(earlier.open(storages), space, baseline, earlier, d, match)
        except Exception as exc:  # noqa: BLE001 - a study that cannot be read offers nothing
            log.debug("warm start: skipping %s: %s", earlier.source, redact(f"{type(exc).__name__}: {exc}"))
            continue
        if seed is None or any(s.params == seed.params for s in seeds):
            continue
        seeds.append(seed)
        log.info("warm start: %s", seed.describe())
        if len(seeds) >= limit:
            break
    return seeds


def enqueue_warm_seeds(study: optuna.Study, seeds: list[WarmSeed]) -> None:
    """Queue each seed, carrying its origin in the trial's user attr "warm_start" (a setting the
    study already holds is skipped)."""
    for seed in seeds:
        study.enqueue_trial(dict(seed.params), user_attrs={TRIAL_ATTR: seed.attrs()}, skip_if_exists=True)


# --- the best setting of one study --------------------------------------------------------------


def _candidate_of(trial: optuna.trial.FrozenTrial) -> Candidate | None:
    stored = trial.user_attrs.get("candidate")
    try:
        if isinstance(stored, Mapping):
            return Candidate.from_dict(stored)
        return Candidate({k: v for k, v in trial.params.items() if k in knobs.REGISTRY})
    except (TypeError, ValueError):
        return None


def _in_space(space: "SearchSpace", candidate: Candidate) -> dict[str, str] | None:
    """`candidate` as a whole setting of `space`, or None when `space` cannot run it (a value
    that is not a choice here, or a knob this space keeps at another value)."""
    params = space.to_params(candidate)
    choices = {p.name: p.choices for p in space.searched}
    if any(value not in choices.get(name, ()) for name, value in params.items()):
        return None
    try:
        if space.to_candidate(params) != candidate:
            return None
    except Exception:  # noqa: BLE001 - DefinitionError: values this space does not accept
        return None
    return space.complete(params)


def _baseline_trial(trials: list[optuna.trial.FrozenTrial], verified: _Verified | None,
                    baselines: tuple[Candidate, ...]) -> optuna.trial.FrozenTrial | None:
    if verified is not None and verified.baseline_trial is not None:
        named = next((t for t in trials if t.number == verified.baseline_trial), None)
        if named is not None:
            return named
    return next((t for t in trials if _candidate_of(t) in baselines), None)


def _best_of(study: optuna.Study, space: "SearchSpace", baseline: Candidate, earlier: _Earlier, d: float,
             match: str) -> WarmSeed | None:
    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    feasible = sorted((t for t in trials if trial_attrs.is_feasible(t) and t.value is not None),
                      key=lambda t: (t.value, t.number))
    base_trial = _baseline_trial(trials, earlier.verified, (baseline, Candidate()))
    base_candidate = _candidate_of(base_trial) if base_trial is not None else None
    # The setting the earlier run verified first: its race re-measured the search's leaders
    # interleaved, which orders settings a few percent apart that one measurement each cannot
    # (benchmarks/warm_start.py: offering the search's fastest instead cost 4 trials on a GPT pair).
    chosen = earlier.verified.best_trial if earlier.verified is not None else None
    feasible.sort(key=lambda t: int(t.user_attrs.get("repeat_of", t.number)) != chosen)
    for t in feasible:
        candidate = _candidate_of(t)
        if candidate is None or candidate in (baseline, base_candidate) or \
                (base_trial is not None and t.number == base_trial.number):
            break  # the baseline is as good as it got there: nothing slower is worth a trial
        params = _in_space(space, candidate)
        if params is None or params == space.baseline_params():
            log.debug("warm start: %s trial %d (%s) cannot run in this space", earlier.source, t.number,
                      candidate.describe())
            continue
        number = int(t.user_attrs.get("repeat_of", t.number))
        if earlier.verified is not None and earlier.verified.applies_to(number, candidate, t is feasible[0]):
            speedup, verified = earlier.verified.speedup, True
        else:
            speedup = base_trial.value / t.value if base_trial is not None and base_trial.value and t.value else None
            verified = False
        return WarmSeed(params=params, source=earlier.source, match=match, distance=d, objective_s=float(t.value),
                        speedup=speedup, verified=verified, trial=number)
    return None


# --- earlier studies in the storage --------------------------------------------------------------


def _storage_studies(storage: str | None, exclude_study: str | None,
                     storages: dict[str, optuna.storages.RDBStorage]) -> list[_Earlier]:
    if not storage:
        return []
    bare = without_password(storage)
    if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).is_file():
        return []  # opening it would create it
    try:
        rdb = storages[storage] = optuna.storages.RDBStorage(storage)
        summaries = optuna.get_all_study_summaries(rdb, include_best_trial=False)
    except Exception as exc:  # noqa: BLE001 - no earlier studies to offer, not an error
        log.debug("warm start: cannot list the studies of %s: %s", redact(bare),
                  redact(f"{type(exc).__name__}: {exc}"))
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
        found.append(_Earlier(
            source=redact(f"study '{name}' in {bare}"), key=(bare, name), features=features,
            started=summary.datetime_start.isoformat() if summary.datetime_start else "", url=storage, name=name,
            verified=_verified_attr(summary.user_attrs.get(VERIFICATION_ATTR))))
    return found


def _verified_attr(data: Any) -> _Verified | None:
    """A stored study's verification attr ({"speedup": 2.0 or {"speedup": 2.0, ...}, "best_trial"?: 7})."""
    if not isinstance(data, Mapping):
        return None
    speedup = data.get("speedup")
    if isinstance(speedup, Mapping):
        speedup = speedup.get("speedup")
    try:
        return _Verified(speedup=_opt(float, speedup), best_trial=_opt(int, data.get("best_trial")),
                         baseline_trial=_opt(int, data.get("baseline_trial")))
    except (TypeError, ValueError):
        return None


# --- earlier studies in the results folder -------------------------------------------------------


def _folder_studies(results_dir: Path | None, storage: str | None, exclude_study: str | None) -> list[_Earlier]:
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


def _folder_study(folder: Path, shared: str | None, exclude_study: str | None) -> _Earlier | None:
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
    return _Earlier(source=f"run {folder}", key=(without_password(stored), name), features=features,
                    started=str(state.get("started") or ""), url=f"sqlite:///{path.resolve()}", name=name,
                    verified=_folder_verification(folder))


def _folder_verification(folder: Path) -> _Verified | None:
    """result.json's verification, else tuned_config.toml's (runs written before result.json)."""
    try:
        record = json.loads((folder / run_folder.RESULT_JSON).read_text())
        v = record["verification"]
        speedup = v.get("speedup")
        return _Verified(speedup=_opt(float, speedup.get("speedup") if isinstance(speedup, Mapping) else speedup),
                         best_trial=_opt(int, v.get("best_trial")), baseline_trial=_opt(int, v.get("baseline_trial")))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass
    try:
        config = tomllib.loads((folder / run_folder.TUNED_CONFIG).read_text())
        v = config["provenance"]["verification"]
        if not v.get("significant"):
            return None  # the config is the baseline: it does not say which setting was verified
        return _Verified(speedup=_opt(float, v.get("speedup")), candidate=Candidate.from_dict(config.get("settings", {})))
    except (OSError, ValueError, TypeError, KeyError, AttributeError, tomllib.TOMLDecodeError):
        return None


__all__ = ["STUDY_ATTR", "TRIAL_ATTR", "VERIFICATION_ATTR", "WarmSeed", "WorkloadFeatures", "distance",
           "enqueue_warm_seeds", "features_of", "features_of_json", "find_warm_seeds", "model_kind_of"]
