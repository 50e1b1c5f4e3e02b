"""Trials on N ranks (``--nproc``): the `layout` knob in the search space and the study, each
sharded trial run as a process group through PyTorch's launcher, checked against the
single-device fp32 reference, timed on the slowest rank, and failing cleanly when a rank does.
Two gloo ranks and tiny models throughout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import processes_running, use_probe

from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.layout import expand
from tpu_tuner.knobs.registry import get
from tpu_tuner.knobs.traits import WorkloadTraits
from tpu_tuner.runner.requests import CompareRequest, MeasureRequest
from tpu_tuner.studies import records
from tpu_tuner.tuning.options.tune_options import ObjectiveOptions, OutputOptions, RunnerOptions, SearchOptions
from tpu_tuner.tuning.search.search_space import SearchSpace

FIXTURES = Path(__file__).parent / "fixtures"
TINY_LLAMA = FIXTURES / "tiny_llama.py"


def _measure(layout: str) -> MeasureRequest:
    from tpu_tuner.tuning.options.tune_options import default_trial_settings

    return MeasureRequest(
        candidate=Candidate(layout=layout).to_dict(),
        settings=default_trial_settings(),
        peak_flops_per_s={"float32": 1e11},
        model_flops_per_step=1e8,
    )


# --- the knob and the space (no processes) -----------------------------------------------------


def test_families_expand_to_every_split_of_the_rank_count() -> None:
    assert expand("fsdp", 4) == ["1x4x1"]
    assert expand("fsdp+tensor", 4) == ["1x2x2"]
    assert expand("data+fsdp+tensor", 8) == ["2x2x2"]
    assert sorted(expand("fsdp+tensor", 8)) == ["1x2x4", "1x4x2"]
    assert expand("tensor", 1) == []
    knob = get("layout")
    assert knob.check("2X1x1") == "2x1x1"
    for bad in ("2x1", "0x2x1", "fsdp"):
        with pytest.raises(ValueError, match="layout"):
            knob.check(bad)


def test_the_space_searches_layouts_only_with_several_ranks_and_only_those_the_model_allows() -> None:
    single = SearchSpace.load("default", "cpu")
    assert next(p for p in single.params if p.name == "layout").choices == ("1x1x1",)  # one process: not searched
    four = SearchSpace.load("default", "cpu", ranks=4)
    layouts = next(p for p in four.params if p.name == "layout").choices
    assert layouts[0] == "4x1x1"  # data parallel, the baseline
    assert set(layouts) == {"4x1x1", "1x4x1", "1x1x4", "2x2x1", "1x2x2", "2x1x2"}
    # Two heads per tensor group at most (tensor_divisor 2), a batch of 2: the model's shapes narrow;
    # a training step cannot run data x tensor without fsdp (DDP cannot wrap DTensor parameters).
    narrowed = four.for_workload(
        WorkloadTraits(training=True, conv_weights=0, repeated_blocks=4, batch_size=2, tensor_divisor=2)
    )
    assert next(p for p in narrowed.params if p.name == "layout").choices == ("4x1x1", "1x2x2")
    assert any(line.startswith("layout: 2x1x2: data x tensor without fsdp") for line in narrowed.left_out)
    # An inference step: replicas on the data axis, so data x tensor runs too.
    inference = four.for_workload(WorkloadTraits(False, 0, 4, 8, 2))
    assert set(next(p for p in inference.params if p.name == "layout").choices) == {
        "4x1x1",
        "1x4x1",
        "2x2x1",
        "1x2x2",
        "2x1x2",
    }
    # fsdp needs repeated blocks, tensor a linear layer to split.
    flat = four.for_workload(WorkloadTraits(True, 0, 0, 8, None))
    assert next(p for p in flat.params if p.name == "layout").choices == ("4x1x1",)


def test_a_config_s_layout_is_its_setting_and_its_mesh_alike(tmp_path) -> None:
    from tpu_tuner.core.errors import UserInputError
    from tpu_tuner.knobs.tuned_config import TunedConfig

    path = TunedConfig(Candidate(layout="1x2x1"), "cpu").save(tmp_path / "tuned_config.toml")
    text = path.read_text()
    assert 'layout = "1x2x1"' in text and "[sharding.mesh]" in text
    assert TunedConfig.load(path).candidate["layout"] == "1x2x1"
    # A planner's config of before: the mesh alone; and a config whose two disagree.
    legacy = tmp_path / "legacy.toml"
    legacy.write_text(
        'format_version = 1\ndevice_kind = "tpu"\n[settings]\n[sharding.mesh]\ndata = 1\nfsdp = 4\ntensor = 2\n'
    )
    assert TunedConfig.load(legacy).candidate["layout"] == "1x4x2"
    legacy.write_text(legacy.read_text().replace("[settings]\n", '[settings]\nlayout = "8x1x1"\n'))
    with pytest.raises(UserInputError, match="layout 8x1x1 and \\[sharding.mesh\\] 1x4x2 disagree"):
        TunedConfig.load(legacy)


# --- sharded trials: the runner ----------------------------------------------------------------


@pytest.mark.slow  # a whole run end to end: .ci/run's full pass
def test_each_layout_is_measured_on_two_ranks_against_the_single_device_reference() -> None:
    from tpu_tuner.runner.ranked_runner import RankedTrialRunner
    from tpu_tuner.tuning.options.tune_options import default_trial_settings

    with RankedTrialRunner(str(TINY_LLAMA), "cpu", 2, timeout_s=120) as runner:
        measured = {}
        for layout in ("2x1x1", "1x2x1", "1x1x2"):
            outcome = runner.run(_measure(layout))
            assert outcome.ok, outcome.failure
            measured[layout] = outcome.value
        compared = runner.run(
            CompareRequest(
                candidates=[Candidate(layout="2x1x1").to_dict(), Candidate(layout="1x2x1").to_dict()],
                rounds=3,
                first_round=0,
                last=True,
            )
        )
        assert runner.groups_started == 4
    for layout, m in measured.items():
        # Loss and gradients (gathered from the shards) against one process's fp32 step on the
        # whole batch: a placement bug would read 1e-1 or more, fp32 reordering reads ~1e-7.
        assert set(m.accuracy_errors) == {"loss", "gradients"} and m.accuracy_error < 1e-5, (layout, m.accuracy_errors)
        assert m.step_median > 0 and len(m.samples) >= default_trial_settings().timing_min_steps
        assert m.peak_memory_bytes and m.peak_memory_bytes > 50 * 2**20  # a rank's resident set, at least torch's
        # Each rank estimated on the fake process group before it joined (runner/rank_job.py);
        # loosely: glibc's retained heap puts VmHWM 10-20% above it (docs/tuning.md).
        assert m.estimated_peak_bytes and m.estimate_note is None and abs(m.estimate_error) < 0.5, (layout, m)
    assert compared.ok and [len(s) for s in compared.value.samples] == [3, 3]


@pytest.mark.slow  # ranks or compilers end to end: .ci/run's full pass
def test_a_placement_that_breaks_the_numerics_is_an_accuracy_failure_not_a_result() -> None:
    """examples/gpt.py's attention projects q, k and v with one fused linear and splits its output
    in three: column-wise shards of it are not whole q / k / v heads, so tensor parallelism runs
    but computes something else. The guardrail must see it."""
    from tpu_tuner.runner.ranked_runner import RankedTrialRunner

    with RankedTrialRunner(str(FIXTURES / "tiny_gpt.py"), "cpu", 2, timeout_s=120) as runner:
        tensor = runner.run(_measure("1x1x2"))
        fsdp = runner.run(_measure("1x2x1"))
    assert fsdp.ok and fsdp.value.accuracy_error < 1e-5
    assert (not tensor.ok) or tensor.value.accuracy_error > 1e-2, tensor.value.accuracy_errors


@pytest.mark.parametrize(
    "mode, kind, says",
    [
        ("segfault", "crash", "rank 1 died from SIGSEGV"),
        ("raise", "error", "rank 1: WorkloadError"),
        ("hang", "timeout", "no rank finished within 10 s"),
    ],
)
@pytest.mark.slow  # a whole run end to end: .ci/run's full pass
@pytest.mark.timed  # the hang's group of 2 ranks has a 10 s deadline
def test_a_rank_that_fails_fails_the_trial_and_leaves_no_process(
    monkeypatch, tmp_path, mode: str, kind: str, says: str
) -> None:
    from tpu_tuner.runner.ranked_runner import RankedTrialRunner
    from tpu_tuner.runner.worker_log import WorkerLog

    monkeypatch.setenv("TPU_TUNE_TEST_MISBEHAVE", mode)
    # Only the hang waits out its deadline; the others get a roomy one, since on a loaded CI host two
    # ranks' start (torch imported, gloo joined) once took over 10 s and a raise read as a hang.
    deadline_s = 10 if mode == "hang" else 90
    # The ranks' output goes to a log of the test's own (a run's folder holds it as workers.log).
    with (
        WorkerLog(tmp_path / "workers.log") as log,
        RankedTrialRunner(
            str(FIXTURES / "misbehaving_rank_workload.py"), "cpu", 2, timeout_s=deadline_s, log=log
        ) as runner,
    ):
        failed = runner.run(_measure("1x2x1"))
        assert not failed.ok and failed.failure.kind == kind and says in failed.failure.message, failed.failure
        assert failed.failure.message.endswith("(see workers.log)") or mode == "hang"
        assert processes_running("tpu_tuner.runner.rank_job") == []
        monkeypatch.delenv("TPU_TUNE_TEST_MISBEHAVE")
        healthy = runner.run(_measure("1x2x1"), timeout_s=120)
        assert healthy.ok, healthy.failure  # the next trial starts a fresh group
    assert processes_running("tpu_tuner.runner.rank_job") == []


# --- the study on N ranks ----------------------------------------------------------------------


def _plan(folder: Path) -> Path:
    """A plan folder as `tpu-tune plan` writes it (plan.json), ranked for a 64-chip slice: its
    fitting layouts map onto 2 ranks as 1x2x1 (fsdp 8 x tensor 8: a tie, fsdp kept), then 1x1x2
    (tensor-dominant); the first does not fit and is not seeded."""
    import json

    folder.mkdir()
    plans = [
        {"layout": {"data": 1, "fsdp": 1, "tensor": 64}, "fits": False, "prediction": None},
        {"layout": {"data": 1, "fsdp": 8, "tensor": 8}, "fits": True, "prediction": {"mfu": 0.41}},
        {"layout": {"data": 1, "fsdp": 64, "tensor": 1}, "fits": True, "prediction": {"mfu": 0.39}},
        {"layout": {"data": 1, "fsdp": 2, "tensor": 32}, "fits": True, "prediction": {"mfu": 0.38}},
    ]
    (folder / "plan.json").write_text(json.dumps({"plans": plans}))
    return folder


# Slow (20 s): a whole study on two ranks; the default run checks the plan's mapping onto ranks
# (test_sharding_from_plan) and layouts on two ranks (test_each_layout_is_measured_...). No clock
# (time_budget_s=None): its five trials are measured however loaded the host.
@pytest.mark.slow
def test_a_study_on_two_ranks_searches_layouts_seeded_from_a_plan(tmp_path, monkeypatch) -> None:
    import optuna

    from tpu_tuner.api import tune
    from tpu_tuner.knobs.tuned_config import TunedConfig
    from tpu_tuner.tuning.options.tune_options import TuneOptions

    plan = _plan(tmp_path / "plan")
    # A host with fast bf16 units, whatever this one is: on one without (no AMX) the precision
    # agent rejects bf16 autocast unmeasured, and the five measured trials the test reads are three.
    use_probe(monkeypatch, tmp_path / "cache")
    # Every trial measured to the end (no pruning): the test reads five complete trials back.
    options = TuneOptions(
        search=SearchOptions(
            trials=5,
            space=FIXTURES / "layout_space.toml",
            plan=plan,
            agents=("sharding", "precision"),
            prune=False,
            time_budget_s=None,
        ),
        runner=RunnerOptions(nproc=2),
        objective=ObjectiveOptions(verify_rounds=2),
        outputs=OutputOptions(out=tmp_path / "results"),
    )
    result = tune(TINY_LLAMA, options)
    trials = [t for t in result.study.get_trials() if records.attrs(t).get("measured")]
    layouts = [t.params["layout"] for t in trials]
    # The baseline is data parallel; the plan's first fitting layout comes next, its second on
    # top of the agents' combined seed (bf16 autocast): seeds, before the search's own picks.
    assert layouts[:2] == ["2x1x1", "1x2x1"]
    assert trials[4].params == {"autocast": "bfloat16", "layout": "1x1x2"}
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    for trial in trials:  # every layout's step matched the single-device fp32 reference
        assert records.attrs(trial)["accuracy_error"] < (1e-5 if trial.params["autocast"] == "none" else 1e-2)
    findings = " ".join(result.findings["sharding"])
    assert "every trial runs on 2 ranks" in findings
    assert f"from the plan in {plan}: 1x2x1 on 2 ranks from the plan's data 1 x fsdp 8 x tensor 8" in findings
    assert "1x1x2 on 2 ranks from the plan's data 1 x fsdp 2 x tensor 32" in findings
    config = TunedConfig.load(result.run_dir / "tuned_config.toml")
    assert config.candidate["layout"] == result.verification.chosen["layout"]
    report = (result.run_dir / "report.md").read_text()
    assert "Every trial ran on 2 ranks, one process each" in report


@pytest.mark.parametrize("layout", ["2x1x1", "1x2x1", "1x1x2"])
def test_the_printed_layout_code_runs_on_two_ranks_and_applies_the_layout(monkeypatch, layout: str) -> None:
    from tpu_tuner.runner.launch import run_ranks

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))
    result = run_ranks(2, "printed_layout_code", [layout], timeout_s=120)
    assert result.ok, result.failure
    for report in result.reports.values():
        assert report["observed"] == layout and "apply_layout(model, Layout(" in report["code"]
        assert report["output_shape"][:2] == [4, 16]  # the whole batch through the sharded model


def test_a_layout_is_given_up_only_when_it_fails_on_its_own() -> None:
    from tpu_tuner.tuning.agents import load_agents

    agent = load_agents(["sharding"], "cpu")[0]
    agent.ranks = 2  # set by the study from --nproc
    foreach = Candidate(layout="1x1x2", optimizer_impl="foreach", autocast="bfloat16")
    # An error with other knobs set may be theirs: the layout alone is asked for, not given up.
    assert agent.learn(
        foreach, 3, "error", "RuntimeError: aten._foreach_mul_.Scalar got mixed torch.Tensor and DTensor"
    ) == [{"layout": "1x1x2"}]
    assert agent.validate(foreach) is None
    assert agent.learn(Candidate(layout="1x1x2"), 4, "oom", "killed") == []  # not an error of the layout's
    assert agent.learn(Candidate(layout="1x1x2"), 5, "error", "ValueError: not enough values to unpack") == []
    assert agent.validate(Candidate(layout="1x1x2", autocast="bfloat16")) == (
        "layout 1x1x2 failed on its own (every other knob at its baseline) in trial 5 (ValueError: not enough values "
        "to unpack): the model cannot run it, so it is not measured again"
    )
    assert agent.validate(Candidate(layout="1x2x1")) is None


@pytest.mark.slow  # a whole run end to end, no clock (time_budget_s=None): .ci/run's full pass
def test_a_study_measures_a_failing_layout_alone_then_gives_it_up(tmp_path) -> None:
    """tiny_gpt's fused q/k/v cannot run tensor parallel: after its first error the layout is
    measured alone, fails there too, and the rest of its settings are rejected unmeasured."""
    import optuna

    from tpu_tuner.api import tune
    from tpu_tuner.tuning.options.tune_options import TuneOptions
    from tpu_tuner.tuning.search.tuning_trial import TuningTrial

    # No pruning: the test counts the data-parallel settings measured to the end.
    options = TuneOptions(
        search=SearchOptions(
            trials=8,
            sampler="grid",
            space=FIXTURES / "tensor_or_data_space.toml",
            agents=("sharding",),
            prune=False,
            time_budget_s=None,
        ),
        runner=RunnerOptions(nproc=2),
        objective=ObjectiveOptions(verify_rounds=2),
        outputs=OutputOptions(out=tmp_path),
    )
    result = tune(FIXTURES / "tiny_gpt.py", options)
    tensor = [t for t in result.study.get_trials() if t.params.get("layout") == "1x1x2"]
    failed = [t for t in tensor if TuningTrial.of(t).failed_to_run]
    # Given up unmeasured: rejected by the sharding agent once the layout failed alone, or, once it
    # failed twice with no success, excluded by the study (tuning/search/failure_learning.py), whichever came first.
    given_up = [t for t in tensor if {"rejected_by", "excluded_by"} & set(records.attrs(t))]
    alone = [t for t in failed if t.params == {"autocast": "none", "optimizer_impl": "default", "layout": "1x1x2"}]
    assert len(alone) == 1 and len(failed) <= 2 and all("rank" in records.attrs(t)["failure_message"] for t in failed)
    assert len(given_up) == 4 - len(failed) and min(t.number for t in given_up) > alone[0].number
    for trial in given_up:
        attrs = records.attrs(trial)
        assert attrs.get("excluded_by") == "layout=1x1x2" or str(attrs.get("rejected_by")).startswith(
            f"sharding: layout 1x1x2 failed on its own (every other knob at its baseline) in trial {alone[0].number} ("
        )
    measured = [
        t
        for t in result.study.get_trials()
        if t.state == optuna.trial.TrialState.COMPLETE and "repeat_of" not in records.attrs(t)
    ]
    assert len(measured) == 4 and {t.params["layout"] for t in measured} == {"2x1x1"}


def test_micro_batches_that_do_not_split_a_rank_s_slice_are_rejected() -> None:
    from tpu_tuner.tuning.agents import load_agents

    memory = load_agents(["memory"], "cpu")[0]
    memory._training, memory._pressed, memory._batch = True, False, 4  # what diagnose reads from a profile
    assert memory.validate(Candidate(layout="2x1x1", micro_batches="2")) is None  # 2 samples a rank, in 2
    refusal = memory.validate(Candidate(layout="2x1x1", micro_batches="4"))
    assert refusal == (
        "micro_batches 4 skipped: under layout 2x1x1 each rank runs 2 of the batch's 4 samples, "
        "which do not split into 4 equal micro-batches"
    )
    assert memory.validate(Candidate(layout="1x1x2", micro_batches="4")) is None  # tensor ranks share the batch


def test_fullgraph_under_ddp_is_rejected_unmeasured() -> None:
    from tpu_tuner.tuning.agents.compiler_options import validate

    ddp = Candidate(execution="inductor", compile_options="fullgraph", layout="2x1x1")
    assert validate(ddp, True, "cpu").startswith("fullgraph skipped: under DDP (layout 2x1x1)")
    assert validate(Candidate(execution="inductor", compile_options="fullgraph", layout="1x1x2"), True, "cpu") is None
    assert validate(Candidate(execution="inductor", compile_options="fullgraph"), True, "cpu") is None


def test_multi_tensor_optimizers_under_tensor_parallelism_alone_are_rejected_unmeasured() -> None:
    from tpu_tuner.tuning.agents.training_step import validate

    for impl in ("foreach", "fused"):
        assert "tensor parallelism alone (layout 1x1x2)" in validate(
            Candidate(optimizer_impl=impl, layout="1x1x2"), True
        )
        assert validate(Candidate(optimizer_impl=impl, layout="1x2x1"), True) is None
    assert validate(Candidate(layout="1x1x2"), True) is None


def test_the_baseline_layout_and_one_process_runs_are_never_given_up() -> None:
    from tpu_tuner.tuning.agents import load_agents

    agent = load_agents(["sharding"], "cpu")[0]
    agent.ranks = 1  # one process: every candidate is 1x1x1; a failed baseline is the workload's
    assert (
        agent.learn(Candidate(), 0, "error", "ValueError") == []
        and agent.validate(Candidate(execution="inductor")) is None
    )
    agent.ranks = 2
    assert agent.learn(Candidate(layout="2x1x1"), 0, "error", "ValueError") == []
    assert agent.validate(Candidate(layout="2x1x1", autocast="bfloat16")) is None
