"""Warm start (tuning/search/warm_start.py, earlier_studies.py, workload_features.py): earlier studies' best
settings, found in the results folder and the storage, ranked (the same workload, then the nearest
by features), valid for this space, never the baseline, never a password; and the report's
"Warm start" and "Hosts" sections.

No model runs: studies are built with Optuna directly in SQLite under tmp_path, run folders are
a run.json and a minimal profile.json.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest

from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.model.workloads.profiled import ProfiledWorkload
from tpu_tuner.studies import records
from tpu_tuner.tuning.options.tune_options import ObjectiveOptions, OutputOptions, RunnerOptions, SearchOptions
from tpu_tuner.tuning.search import earlier_studies, warm_start
from tpu_tuner.tuning.search.search_space import Param, SearchSpace
from tpu_tuner.tuning.search.warm_start import WarmSeed, enqueue_warm_seeds, find_warm_seeds
from tpu_tuner.tuning.search.workload_features import (
    WorkloadFeatures,
    distance,
    features_of,
    features_of_json,
    model_kind_of,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

# The warm start logs from its three modules (warm_start, earlier_studies, workload_features).
WARM_START_LOGGERS = "tpu_tuner.tuning"

SHA = "a" * 64
OTHER_SHA = "b" * 64
BASELINE: dict[str, str] = {}
BF16 = {"autocast": "bfloat16"}
INDUCTOR = {"execution": "inductor"}
INDUCTOR_BF16 = {"execution": "inductor", "autocast": "bfloat16"}


def _space() -> SearchSpace:
    """A small CPU space: execution (no aot_eager), autocast searched; memory format kept contiguous."""
    return SearchSpace(
        "test",
        "cpu",
        (
            Param("execution", "compile", ("eager", "inductor")),
            Param("autocast", "precision", ("none", "bfloat16")),
            Param("memory_format", "memory", ("contiguous",)),
        ),
    )


def _fingerprint(
    device_kind: str = "cpu",
    sha256: str = SHA,
    batch_size: int = 8,
    seq_len: int | None = 256,
    nproc: int = 1,
    step_kind: str = "training step",
) -> dict[str, Any]:
    return {
        "model_file": "/models/gpt.py",
        "sha256": sha256,
        "convention": "native",
        "step_kind": step_kind,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "device_kind": device_kind,
        "device_name": "host cpu",
        "nproc": nproc,
    }


def _here(**changes: Any) -> WorkloadFeatures:
    data = {
        "device_kind": "cpu",
        "sha256": SHA,
        "batch_size": 8,
        "seq_len": 256,
        "nproc": 1,
        "step_kind": "training step",
        "flops_per_param": 12_000.0,
        "bound": "compute-bound",
        "model_kind": "transformer",
        **changes,
    }
    return WorkloadFeatures.from_dict(data)


def _profile_json(
    device_kind: str = "cpu",
    flops_per_param: float = 12_000.0,
    bound: str = "compute-bound",
    attention: bool = True,
    conv_weights: int = 0,
) -> dict[str, Any]:
    """The parts of a profile.json warm start reads."""
    return {
        "device": {"kind": device_kind, "name": "host cpu"},
        "workload": {
            "name": "m",
            "step": "training step",
            "batch_size": 8,
            "seq_len": 256,
            "traits": {"training": True, "conv_weights": conv_weights, "repeated_blocks": 4, "batch_size": 8},
        },
        "flops": {
            "model_per_step": flops_per_param * 1_000_000,
            "total_parameters": 1_000_000,
            "attention_convention": "full attention" if attention else "not applicable (no attention declared)",
        },
        "verdict": {"bound": bound},
        "operators": [{"name": "aten::mm"}],
    }


def _fill(study: optuna.Study, rows: list[tuple[dict[str, str], float, bool]]) -> None:
    """Completed trials: (knob changes from the baseline, objective seconds, feasible)."""
    full = SearchSpace.load("default", "cpu")
    choices = {p.name: p.choices for p in full.params}
    for changes, value, feasible in rows:
        candidate = Candidate(changes)
        params = {name: candidate[name] for name in ("execution", "autocast")}
        study.add_trial(
            optuna.trial.create_trial(
                params=params,
                distributions={k: optuna.distributions.CategoricalDistribution(choices[k]) for k in params},
                value=value,
                user_attrs={"candidate": candidate.to_dict(), "feasible": feasible, "measured": True},
            )
        )


def _run_folder(
    root: Path,
    name: str,
    rows: list[tuple[dict[str, str], float, bool]],
    *,
    fingerprint: dict[str, Any] | None = None,
    profile: dict[str, Any] | None = None,
    started: str = "2026-11-30T19:00:00",
    result: dict[str, Any] | None = None,
) -> Path:
    """results/<name>-tune-<stamp>/ with run.json, profile.json, study.db (and result.json)."""
    folder = root / f"{name}-tune-{started.replace(':', '').replace('-', '')}"
    folder.mkdir(parents=True)
    storage = f"sqlite:///{folder / 'study.db'}"
    _fill(optuna.create_study(study_name=folder.name, storage=storage), rows)
    (folder / "run.json").write_text(
        json.dumps(
            {
                "storage": storage,
                "study_name": folder.name,
                "fingerprint": fingerprint or _fingerprint(),
                "started": started,
                "status": "done",
            }
        )
    )
    (folder / "profile.json").write_text(json.dumps(profile or _profile_json()))
    if result is not None:
        (folder / "result.json").write_text(json.dumps(result))
    return folder


# --- features ----------------------------------------------------------------------------------


def test_model_kind_rule() -> None:
    assert (
        model_kind_of({"conv_weights": 0}, "full attention, causal mask not discounted", ["aten::mm"]) == "transformer"
    )
    # A ViT's patch convolution does not make it convolutional: attention decides first.
    assert (
        model_kind_of({"conv_weights": 1}, "not applicable", ["aten::_scaled_dot_product_flash_attention"])
        == "transformer"
    )
    assert (
        model_kind_of({"conv_weights": 12}, "not applicable (no attention declared)", ["aten::addmm"])
        == "convolutional"
    )
    assert model_kind_of(None, None, ["aten::mkldnn_convolution"]) == "convolutional"
    assert model_kind_of(None, None, ["aten::lstm", "aten::addmm"]) == "recurrent"
    assert model_kind_of({"conv_weights": 0}, "not applicable", ["aten::addmm", "aten::relu"]) == "mlp"
    assert model_kind_of(None, None, ["aten::add"]) is None


def test_features_of_profile_and_of_its_json_agree() -> None:
    data = _profile_json(flops_per_param=500.0, bound="memory-bound", attention=False, conv_weights=3)
    profile = SimpleNamespace(
        device=SimpleNamespace(kind="cpu"),
        workload=data["workload"],
        flops=SimpleNamespace(**data["flops"]),
        verdict=SimpleNamespace(bound="memory-bound"),
        operators=[SimpleNamespace(name="aten::mm")],
    )
    fp = _fingerprint(batch_size=None, seq_len=None)  # an older run: None for the file's own sizes
    features = features_of(profile, fp)  # type: ignore[arg-type]
    assert features == features_of_json(data, fp)
    assert features.flops_per_param == pytest.approx(500.0)
    assert (features.bound, features.model_kind) == ("memory-bound", "convolutional")
    assert (features.batch_size, features.seq_len) == (8, 256)  # the profile's sizes fill the gaps
    assert WorkloadFeatures.from_dict(json.loads(json.dumps(features.to_dict()))) == features


def test_distance_rule() -> None:
    here = _here()
    assert distance(here, _here()) == (0.0, "same workload")
    same_file = distance(here, _here(batch_size=16, flops_per_param=24_000.0))
    other_file = distance(here, _here(sha256=OTHER_SHA, flops_per_param=24_000.0))
    assert 0 < same_file[0] < other_file[0]
    assert "FLOPs/parameter 2.00x" in other_file[1] and "same bound (compute-bound)" in other_file[1]
    # Twice and half as many FLOPs per parameter are equally far.
    half = distance(here, _here(sha256=OTHER_SHA, flops_per_param=6_000.0))[0]
    assert half == pytest.approx(other_file[0])
    other_bound = distance(here, _here(sha256=OTHER_SHA, bound="memory-bound"))
    other_kind = distance(here, _here(sha256=OTHER_SHA, model_kind="convolutional"))
    alike = distance(here, _here(sha256=OTHER_SHA))[0]
    assert alike < other_bound[0] < other_kind[0]
    assert "other kind (convolutional vs transformer here)" in other_kind[1]
    # A different rank count or step kind is another workload even with the same file.
    assert distance(here, _here(nproc=4))[0] > 0
    assert distance(here, _here(step_kind="inference (forward)"))[0] > 0


# --- finding seeds -------------------------------------------------------------------------------


def test_exact_workload_ranks_before_nearer_features(tmp_path: Path) -> None:
    # The same workload, whose profile happened to come out another bound and more FLOPs per
    # parameter, against another model whose features equal this one's exactly (and newer).
    _run_folder(
        tmp_path,
        "same",
        [(BASELINE, 4.0, True), (BF16, 1.0, True)],
        profile=_profile_json(flops_per_param=30_000.0, bound="memory-bound"),
        started="2026-11-01T00:00:00",
    )
    _run_folder(
        tmp_path,
        "other",
        [(BASELINE, 4.0, True), (INDUCTOR, 2.0, True)],
        fingerprint=_fingerprint(sha256=OTHER_SHA),
        started="2026-11-30T00:00:00",
    )
    seeds = find_warm_seeds(_space(), _here(), storage=None, results_dir=tmp_path)
    assert [s.params for s in seeds] == [_space().complete(BF16), _space().complete(INDUCTOR)]
    assert (seeds[0].distance, seeds[0].match) == (0.0, "same workload")
    assert seeds[1].distance > 0 and seeds[1].match.startswith("nearest: ")
    assert seeds[0].source == f"run {tmp_path / 'same-tune-20261101T000000'}"
    assert (seeds[0].objective_s, seeds[0].speedup, seeds[0].verified, seeds[0].trial) == (1.0, 4.0, False, 1)
    assert len(find_warm_seeds(_space(), _here(), storage=None, results_dir=tmp_path, limit=1)) == 1


def test_other_device_kind_is_excluded(tmp_path: Path) -> None:
    _run_folder(
        tmp_path,
        "cuda",
        [(BASELINE, 4.0, True), (BF16, 1.0, True)],
        fingerprint=_fingerprint(device_kind="cuda"),
        profile=_profile_json(device_kind="cuda"),
    )
    assert find_warm_seeds(_space(), _here(), storage=None, results_dir=tmp_path) == []
    assert len(find_warm_seeds(_space(), _here(device_kind="cuda"), storage=None, results_dir=tmp_path)) == 1


def test_a_study_of_another_model_kind_is_too_far(tmp_path: Path) -> None:
    # A convolutional model's best is no better a first guess for a transformer than the agents'.
    _run_folder(
        tmp_path,
        "cnn",
        [(BASELINE, 4.0, True), (BF16, 1.0, True)],
        fingerprint=_fingerprint(sha256=OTHER_SHA),
        profile=_profile_json(attention=False, conv_weights=3),
    )
    assert find_warm_seeds(_space(), _here(), storage=None, results_dir=tmp_path) == []
    assert len(find_warm_seeds(_space(), _here(), storage=None, results_dir=tmp_path, max_distance=10.0)) == 1


def test_settings_this_space_cannot_run_are_skipped(tmp_path: Path) -> None:
    # Faster than the one taken: a choice this space lacks (aot_eager), a knob this space keeps at
    # another value (channels_last), a knob it does not have (matmul precision medium), an
    # infeasible setting.
    _run_folder(
        tmp_path,
        "m",
        [
            (BASELINE, 4.0, True),
            ({"execution": "aot_eager"}, 0.5, True),
            ({"autocast": "bfloat16", "memory_format": "channels_last"}, 0.6, True),
            ({"matmul_precision": "medium"}, 0.7, True),
            (INDUCTOR, 0.8, False),
            (INDUCTOR_BF16, 2.0, True),
        ],
    )
    (seed,) = find_warm_seeds(_space(), _here(), storage=None, results_dir=tmp_path)
    assert seed.params == _space().complete(INDUCTOR_BF16) == {"execution": "inductor", "autocast": "bfloat16"}
    assert seed.objective_s == 2.0 and seed.speedup == pytest.approx(2.0)


def test_the_baseline_is_never_a_seed(tmp_path: Path) -> None:
    # Best is the baseline: nothing slower is worth a trial.
    _run_folder(tmp_path, "flat", [(BASELINE, 1.0, True), (BF16, 1.5, True)])
    assert find_warm_seeds(_space(), _here(), storage=None, results_dir=tmp_path) == []
    # A study whose trials do not start with the baseline: its best is still recognised as it.
    _run_folder(
        tmp_path, "late", [(INDUCTOR, 3.0, True), (BASELINE, 1.0, True)], fingerprint=_fingerprint(sha256=OTHER_SHA)
    )
    assert find_warm_seeds(_space(), _here(), storage=None, results_dir=tmp_path) == []


def test_duplicate_settings_keep_the_closest(tmp_path: Path) -> None:
    _run_folder(
        tmp_path,
        "far",
        [(BASELINE, 4.0, True), (BF16, 1.0, True)],
        fingerprint=_fingerprint(sha256=OTHER_SHA),
        profile=_profile_json(bound="memory-bound"),
    )
    _run_folder(tmp_path, "near", [(BASELINE, 4.0, True), (BF16, 3.0, True)])
    (seed,) = find_warm_seeds(_space(), _here(), storage=None, results_dir=tmp_path)
    assert seed.match == "same workload" and seed.objective_s == 3.0


def test_verified_speedup_only_for_the_verified_trial(tmp_path: Path) -> None:
    rows = [(BASELINE, 4.0, True), (BF16, 1.0, True), (INDUCTOR, 1.1, True)]
    verification = {
        "baseline_trial": 0,
        "best_trial": 1,
        "chosen_is_best": True,
        "speedup": {"speedup": 3.5, "ci_low": 3.4, "ci_high": 3.6, "rounds": 12},
    }
    _run_folder(tmp_path, "raced", rows, result={"format": 1, "verification": verification})
    (seed,) = find_warm_seeds(_space(), _here(), storage=None, results_dir=tmp_path)
    assert (seed.speedup, seed.verified) == (3.5, True)
    # The race picked another setting than the search's fastest: that one is offered, with the
    # verified speedup (the race ordered them; one search measurement each could not).
    _run_folder(
        tmp_path,
        "other",
        rows,
        result={"format": 1, "verification": {**verification, "best_trial": 2}},
        fingerprint=_fingerprint(sha256=OTHER_SHA),
        started="2026-11-30T20:00:00",
    )
    seeds = find_warm_seeds(_space(), _here(), storage=None, results_dir=tmp_path / "nowhere")
    assert seeds == []  # a results folder that does not exist offers nothing
    other = find_warm_seeds(_space(), _here(sha256=OTHER_SHA), storage=None, results_dir=tmp_path, limit=1)[0]
    assert other.params == _space().complete(INDUCTOR) and (other.speedup, other.verified) == (3.5, True)
    # Without a verification naming a setting, the search's fastest, with the search's ratio.
    _run_folder(tmp_path, "unverified", rows, fingerprint=_fingerprint(sha256="c" * 64), started="2026-11-30T21:00:00")
    plain = find_warm_seeds(_space(), _here(sha256="c" * 64), storage=None, results_dir=tmp_path, limit=1)[0]
    assert plain.params == _space().complete(BF16) and (plain.speedup, plain.verified) == (pytest.approx(4.0), False)


def test_unreadable_folders_are_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = _run_folder(tmp_path, "good", [(BASELINE, 4.0, True), (BF16, 1.0, True)])
    bad_run = _run_folder(
        tmp_path, "badrun", [(BASELINE, 4.0, True), (INDUCTOR, 1.0, True)], started="2026-11-02T00:00:00"
    )
    (bad_run / "run.json").write_text("{not json")
    no_profile = _run_folder(
        tmp_path, "noprofile", [(BASELINE, 4.0, True), (INDUCTOR, 1.0, True)], started="2026-11-03T00:00:00"
    )
    (no_profile / "profile.json").unlink()
    bad_profile = _run_folder(
        tmp_path, "badprofile", [(BASELINE, 4.0, True), (INDUCTOR, 1.0, True)], started="2026-11-04T00:00:00"
    )
    (bad_profile / "profile.json").write_text("[1, 2]")
    bad_db = _run_folder(
        tmp_path, "baddb", [(BASELINE, 4.0, True), (INDUCTOR, 1.0, True)], started="2026-11-05T00:00:00"
    )
    (bad_db / "study.db").write_bytes(b"this is not a database" * 100)
    no_db = _run_folder(tmp_path, "nodb", [(BASELINE, 4.0, True), (INDUCTOR, 1.0, True)], started="2026-11-06T00:00:00")
    (no_db / "study.db").unlink()
    (tmp_path / "empty-tune-x").mkdir()
    (tmp_path / "stray-tune-file").write_text("")
    with caplog.at_level(logging.DEBUG, logger=WARM_START_LOGGERS):
        seeds = find_warm_seeds(_space(), _here(), storage=None, results_dir=tmp_path)
    assert [s.source for s in seeds] == [f"run {good}"]
    assert "skipping" in caplog.text


def test_the_run_itself_is_excluded(tmp_path: Path) -> None:
    folder = _run_folder(tmp_path, "self", [(BASELINE, 4.0, True), (BF16, 1.0, True)])
    assert find_warm_seeds(_space(), _here(), storage=None, results_dir=tmp_path, exclude_study=folder.name) == []


# --- studies in the storage ----------------------------------------------------------------------


def _shared_storage(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    tagged = optuna.create_study(study_name="gpt-v5e", storage=url)
    tagged.set_user_attr("tpu_tune", {"fingerprint": _fingerprint(), "features": _here().to_dict()})
    tagged.set_user_attr(
        "tpu_tune_verification", {"speedup": {"speedup": 3.9}, "chosen_is_best": True, "best_trial": 1}
    )
    _fill(tagged, [(BASELINE, 4.0, True), (BF16, 1.0, True)])
    untagged = optuna.create_study(study_name="someone-elses", storage=url)  # no "tpu_tune": not ours
    _fill(untagged, [(BASELINE, 4.0, True), (INDUCTOR, 0.1, True)])
    cuda = optuna.create_study(study_name="gpt-cuda", storage=url)
    cuda.set_user_attr(
        "tpu_tune", {"fingerprint": _fingerprint("cuda"), "features": _here(device_kind="cuda").to_dict()}
    )
    _fill(cuda, [(BASELINE, 4.0, True), (INDUCTOR, 0.1, True)])
    new = optuna.create_study(study_name="gpt-new", storage=url)
    new.set_user_attr("tpu_tune", {"fingerprint": _fingerprint(), "features": _here().to_dict()})
    _fill(new, [(BASELINE, 4.0, True), (INDUCTOR_BF16, 0.1, True)])
    return url


def test_storage_studies_without_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sqlite = _shared_storage(tmp_path)

    def server_stand_in(url: str) -> optuna.storages.RDBStorage:
        """A server URL with a password, answered by the SQLite file (no server in this test)."""
        assert url.startswith("postgresql://")
        return optuna.storages.RDBStorage(sqlite)

    monkeypatch.setattr(earlier_studies, "read_storage", server_stand_in)
    url = "postgresql://tune:s3cret@db.example:5432/tune"
    with caplog.at_level(logging.DEBUG, logger=WARM_START_LOGGERS):
        seeds = find_warm_seeds(_space(), _here(), storage=url, results_dir=None, exclude_study="gpt-new")
    assert [s.params for s in seeds] == [_space().complete(BF16)]
    (seed,) = seeds
    assert seed.source == "study 'gpt-v5e' in postgresql://tune@db.example:5432/tune"
    assert (seed.speedup, seed.verified, seed.match) == (3.9, True, "same workload")
    assert "s3cret" not in json.dumps(seed.attrs()) + caplog.text


def test_unreachable_storage_logs_no_password(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=WARM_START_LOGGERS):
        seeds = find_warm_seeds(
            _space(), _here(), storage="postgresql://tune:s3cret@127.0.0.1:1/tune", results_dir=None
        )
    assert seeds == []
    assert "cannot list the studies" in caplog.text and "s3cret" not in caplog.text


def test_folders_of_the_storage_are_not_read_twice(tmp_path: Path) -> None:
    url = _shared_storage(tmp_path)
    # A worker's run folder of the shared study: its study is the storage's.
    folder = tmp_path / "results" / "gpt-tune-20261130-000000"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(
        json.dumps({"storage": url, "study_name": "gpt-v5e", "fingerprint": _fingerprint()})
    )
    (folder / "profile.json").write_text(json.dumps(_profile_json()))
    seeds = find_warm_seeds(_space(), _here(), storage=url, results_dir=tmp_path / "results", exclude_study="gpt-new")
    assert [s.source for s in seeds] == [f"study 'gpt-v5e' in {url}"]


# --- enqueueing ----------------------------------------------------------------------------------


def _seed(params: dict[str, str], **changes: Any) -> WarmSeed:
    data = dict(
        params=params,
        source="run results/gpt-tune-20261130-193123",
        match="same workload",
        distance=0.0,
        objective_s=0.2263,
        speedup=2.03,
        verified=True,
        trial=3,
    )
    return WarmSeed(**{**data, **changes})


def test_enqueued_trials_carry_the_warm_start_attr(tmp_path: Path) -> None:
    space = _space()
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'new.db'}")
    study.enqueue_trial(space.baseline_params())
    seeds = [_seed(space.complete(INDUCTOR_BF16)), _seed(space.complete(BF16), source="run results/other", trial=5)]
    enqueue_warm_seeds(study, seeds)
    enqueue_warm_seeds(study, seeds[:1])  # already queued: skipped
    assert len(study.trials) == 3
    asked = [study.ask() for _ in range(3)]
    for trial in asked:
        space.suggest(trial)
    attrs = [records.attrs(t).get("warm_start") for t in study.trials]
    assert attrs[0] is None
    assert attrs[1] == seeds[0].attrs() and attrs[2]["source"] == "run results/other"
    assert [study.trials[i].params for i in (1, 2)] == [s.params for s in seeds]
    assert json.loads(json.dumps(seeds[0].attrs())) == seeds[0].attrs()


# --- the report and trials.csv -------------------------------------------------------------------


def _result(tmp_path: Path, hosts: list[str], verified_on: str | None):
    from tpu_tuner.tuning.options.tune_options import RunnerOptions, TuneOptions, default_trial_settings
    from tpu_tuner.tuning.run.tuning_result import TuningResult
    from tpu_tuner.tuning.verify.verification import Verification

    space = _space()
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'report.db'}")
    study.enqueue_trial(space.baseline_params())
    enqueue_warm_seeds(
        study,
        [
            _seed(space.complete(INDUCTOR_BF16)),
            _seed(
                space.complete(BF16),
                source="run results/cnn-tune-x",
                match="nearest: far",
                distance=2.0,
                speedup=None,
                verified=False,
                trial=7,
            ),
        ],
    )
    for value, host in zip((0.4, 0.2, None), hosts):
        trial = study.ask()
        space.suggest(trial)
        trial.set_user_attr("host", host)
        trial.set_user_attr("worker", f"{host}:1")
        trial.set_user_attr("measured", True)
        if value is None:
            trial.set_user_attr("failure_kind", "crash")
            trial.set_user_attr("feasible", False)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            trial.set_user_attr("feasible", True)
            trial.set_user_attr("amortised_step_s", value)
            study.tell(trial, value)
    verification = Verification(
        baseline_trial=0,
        best_trial=1,
        chosen=Candidate(),
        chosen_is_best=False,
        speedup=None,
        message="not verified",
        host=verified_on,
    )
    profile = SimpleNamespace(
        workload=ProfiledWorkload.from_dict(
            {
                "name": "gpt",
                "source": "gpt.py",
                "convention": "native",
                "step": "training step",
                "batch_size": 8,
                "seq_len": 256,
            }
        ),
        device=SimpleNamespace(name="host cpu", kind="cpu"),
        peak_flops_per_s=1e12,
        peak_dtype="bfloat16",
        verdict=SimpleNamespace(summary="compute-bound"),
        flops=SimpleNamespace(model_formula="6N"),
        fitted_to_memory={},  # the step fit the device as written
        warnings=[],
    )
    return TuningResult(
        run_dir=tmp_path,
        study=study,
        space=space,
        profile=profile,  # type: ignore[arg-type]
        findings={},
        verification=verification,
        options=TuneOptions(runner=RunnerOptions(trial_settings=default_trial_settings())),  # as a run resolves them
    )


def test_report_shows_where_warm_start_settings_came_from(tmp_path: Path) -> None:
    from tpu_tuner.outputs.tuning_report import render_report

    text = render_report(_result(tmp_path, ["vm-a", "vm-b", "vm-b"], "vm-a"), {})
    section = text.split("## Warm start")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert len(rows) == 2
    assert (
        "inductor, matmul highest, autocast bfloat16" in rows[0]
        and "trial 3 of run results/gpt-tune-20261130-193123 (same workload)" in rows[0]
    )
    assert "226 ms, 2.03x verified" in rows[0] and "200 ms, 2.00x the baseline" in rows[0]
    assert "run results/cnn-tune-x (nearest: far)" in rows[1] and "| failed (crash) |" in rows[1]
    hosts = text.split("## Hosts")[1].split("\n## ")[0]
    assert "re-measured on host `vm-a`" in hosts
    assert "| vm-a | 1 | 400 ms |" in hosts and "| vm-b | 2 | 200 ms |" in hosts


def test_report_hosts_line_for_one_host(tmp_path: Path) -> None:
    from tpu_tuner.outputs.tuning_report import render_report

    text = render_report(_result(tmp_path, ["vm-a"] * 3, "vm-a"), {})
    assert "Every trial ran on host `vm-a`, and so did the comparison above." in text
    (tmp_path / "other").mkdir()
    assert "## Hosts" not in render_report(_result(tmp_path / "other", ["vm-a"] * 3, None), {})


def test_trials_csv_keeps_host_and_names_the_warm_start_source(tmp_path: Path) -> None:
    from tpu_tuner.tuning.search.trials_table import TRIAL_COLUMNS

    frame = _result(tmp_path, ["vm-a", "vm-b", "vm-b"], "vm-a").trials_dataframe()
    assert "host" in TRIAL_COLUMNS and list(frame["host"]) == ["vm-a", "vm-b", "vm-b"]
    assert "worker" not in frame.columns
    assert frame["warm_start"].tolist()[1:] == ["run results/gpt-tune-20261130-193123", "run results/cnn-tune-x"]
    assert frame["warm_start"].isna().tolist()[0]


def test_the_report_reads_the_attr_warm_start_writes() -> None:
    from tpu_tuner.tuning.search.tuning_trial import TuningTrial

    study = optuna.create_study()
    study.enqueue_trial({}, user_attrs={warm_start.TRIAL_ATTR: {"source": "earlier"}})
    study.tell(study.ask(), 1.0)
    assert warm_start.TRIAL_ATTR == "warm_start"  # the record (and the report) read it by this name
    assert TuningTrial.of(study.trials[0]).warm_start == {"source": "earlier"}


# --- through tune() ------------------------------------------------------------------------------


@pytest.mark.slow  # a whole run end to end: .ci/run's full pass
@pytest.mark.timed  # the earlier run's best, medium matmuls (3 ms), is found by timing against 9-18 ms
def test_a_new_run_in_the_results_folder_starts_from_an_earlier_runs_best(tmp_path: Path) -> None:
    from conftest import FIXTURES

    from tpu_tuner.api import tune
    from tpu_tuner.profiling import ProfilerSettings
    from tpu_tuner.tuning.options.tune_options import TuneOptions

    fast = ProfilerSettings(
        warmup_min_steps=1,
        warmup_max_steps=3,
        timing_min_steps=5,
        timing_min_seconds=0.0,
        timing_max_steps=10,
        profiled_steps=1,
        top_operators=5,
        explained_share_min=0.5,
    )
    common = dict(
        objective=ObjectiveOptions(verify_rounds=2),
        runner=RunnerOptions(trial_timeout_s=60.0, trial_settings=fast),
        outputs=OutputOptions(out=tmp_path),
    )
    space = FIXTURES / "eager_precision_space.toml"
    # The earlier run measures the whole space (6 settings): its best is medium matmuls, no autocast.
    earlier = tune(
        FIXTURES / "synthetic_speed.py",
        TuneOptions(search=SearchOptions(trials=6, sampler="grid", agents=(), space=space), **common),
    )
    later = tune(
        FIXTURES / "synthetic_speed.py", TuneOptions(search=SearchOptions(trials=2, agents=(), space=space), **common)
    )
    warm = [t for t in later.study.trials if "warm_start" in records.attrs(t)]
    assert [t.number for t in warm] == [1] and warm[0].params == {"matmul_precision": "medium", "autocast": "none"}
    assert records.attrs(warm[0])["warm_start"]["match"] == "same workload"
    assert str(earlier.run_dir) in records.attrs(warm[0])["warm_start"]["source"]
    assert "## Warm start" in (later.run_dir / "report.md").read_text()
    cold = tune(
        FIXTURES / "synthetic_speed.py",
        TuneOptions(search=SearchOptions(trials=1, agents=(), warm_start=False, space=space), **common),
    )
    assert not any("warm_start" in records.attrs(t) for t in cold.study.trials)
