"""Inference on ranks: the layouts of an inference step (data parallel replicas, FSDP, tensor
parallel by the model's structure or a transformers model's own plan) on 2 gloo ranks match the
single-device output (each rank's slice gathered in batch order); the printed apply code and
``tpu_tuner.apply`` run them; a study of an inference file on 2 ranks measures its layouts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.traits import WorkloadTraits
from tpu_tuner.model.meshes.layouts import Layout
from tpu_tuner.runner.launch import run_ranks
from tpu_tuner.runner.sharded_check import check_layout

ROOT = Path(__file__).parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
MLP = ROOT / "examples" / "mlp.py"
RESIDUAL = FIXTURES / "tiny_residual_mlp.py"
LLAMA = (
    "hf:llama?hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,"
    "num_key_value_heads=2,vocab_size=256#inference"
)
TOLERANCE = 1e-5  # fp32 on both sides: only the order of reductions differs (test_sharding.py's)


def _check(source: str | Path, layout: str, nproc: int = 2) -> dict:
    result = check_layout(source, layout, nproc=nproc, timeout_s=240)
    assert result.ok, result.failure
    report = result.reports[0]
    assert report["output_error"] < TOLERANCE and report["output_max_abs_diff"] < 1e-5, report
    return report


# --- the layouts of an inference step (no processes) -------------------------------------------


def test_a_plain_mlp_splits_its_chain_of_linears_as_column_row_pairs() -> None:
    import torch

    from tpu_tuner.model.workloads.loader import load_workload
    from tpu_tuner.parallel.apply import linear_pairs, tensor_widths, why_not

    torch.manual_seed(0)
    model = load_workload(MLP).build_model()  # Linear, ReLU, Linear, ReLU, Linear, ReLU, Linear
    assert linear_pairs(model) == [("net.0", "net.2"), ("net.4", "net.6")]
    assert tensor_widths(model) == {"net.0's width": 2048, "net.4's width": 2048}
    assert why_not(model, Layout(1, 1, 2), 2, 256, inference=True) is None
    assert "does not divide net.0's width = 2048" in why_not(model, Layout(1, 1, 3), 3, 255, inference=True)
    assert "fewer than two like blocks" in why_not(model, Layout(1, 2, 1), 2, 256, inference=True)
    # Data x tensor: replicas of tensor groups for inference; training would need DDP over DTensors.
    assert why_not(model, Layout(2, 1, 2), 4, 256, inference=True) is None
    assert "DDP cannot wrap" in why_not(model, Layout(2, 1, 2), 4, 256)
    # A norm between two linears needs whole features: no pair across it.
    from torch import nn

    assert linear_pairs(nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 4))) == []


def test_an_inference_space_offers_the_layouts_an_inference_step_can_run() -> None:
    from tpu_tuner.tuning.search.search_space import SearchSpace

    four = SearchSpace.load("default", "cpu", ranks=4)
    # A plain MLP (no repeated blocks, chain widths 2048) as inference: replicas, tensor, data x tensor.
    mlp = four.for_workload(WorkloadTraits(False, 0, 0, 256, 2048))
    assert next(p for p in mlp.params if p.name == "layout").choices == ("4x1x1", "1x1x4", "2x1x2")
    assert any(line.startswith("layout: 1x4x1: fsdp layouts shard repeated blocks") for line in mlp.left_out)


def test_the_sharding_agent_seeds_tensor_layouts_first_for_an_inference_step() -> None:
    from types import SimpleNamespace

    from tpu_tuner.tuning.agents import load_agents
    from tpu_tuner.tuning.search.search_space import SearchSpace

    agent = next(a for a in load_agents(["sharding"], "cpu", None) if a.name == "sharding")
    agent.ranks = 4
    space = SearchSpace.load("default", "cpu", ranks=4).for_workload(WorkloadTraits(False, 0, 4, 8, 4))
    inference = SimpleNamespace(workload=SimpleNamespace(training=False))
    training = SimpleNamespace(workload=SimpleNamespace(training=True))
    assert agent.seeds(inference, space) == [{"layout": "1x1x4"}, {"layout": "2x1x2"}, {"layout": "1x4x1"}]
    assert agent.seeds(training, space) == [{"layout": "1x4x1"}, {"layout": "1x2x2"}]


def test_compile_options_that_cannot_run_an_inference_layout_are_rejected_and_others_kept() -> None:
    from tpu_tuner.tuning.agents.compiler_options import validate

    # Replicas are no DDP: fullgraph compiles them whole; it is refused only for a training step.
    fullgraph = Candidate(execution="inductor", compile_options="fullgraph", layout="2x1x1")
    assert validate(fullgraph, False, "cpu") is None and validate(fullgraph, True, "cpu") is not None
    frozen = Candidate(execution="inductor", compile_options="freezing", layout="1x1x2")
    assert validate(frozen, False, "cpu").startswith("freezing skipped: under tensor parallelism (layout 1x1x2)")
    for layout in ("2x1x1", "1x2x1"):
        assert (
            validate(Candidate(execution="inductor", compile_options="freezing", layout=layout), False, "cpu") is None
        )


def test_channels_last_under_fsdp_is_rejected_unmeasured() -> None:
    from tpu_tuner.tuning.agents import load_agents

    agent = next(a for a in load_agents(["compile"], "cpu", None) if a.name == "compile")
    agent._conv_share = 0.5  # what diagnose reads from a convolution-heavy profile (examples/cnn.py)
    refusal = agent.validate(Candidate(memory_format="channels_last", layout="1x2x1"))
    assert refusal is not None and refusal.startswith("channels_last skipped: under fsdp (layout 1x2x1)")
    assert agent.validate(Candidate(memory_format="channels_last", layout="2x1x1")) is None


def test_the_printed_code_of_an_inference_config_applies_an_inference_layout(tmp_path) -> None:
    from tpu_tuner.knobs.tuned_config import TunedConfig
    from tpu_tuner.model.workloads.profiled import INFERENCE_STEP

    inference = TunedConfig(Candidate(layout="2x1x1"), "cpu", provenance={"workload": {"step": INFERENCE_STEP}})
    printed = "\n".join(inference.instructions(tmp_path / "c.toml"))
    assert not inference.training
    assert "apply_layout(model, Layout(data=2, fsdp=1, tensor=1), device_type='cpu', inference=True)" in printed
    assert "with torch.no_grad(), autocast():" in printed and "DistributedSampler" not in printed
    assert "gather_batch(output, Layout(data=2, fsdp=1, tensor=1), local_batch)" in printed
    training = TunedConfig(Candidate(layout="2x1x1"), "cpu")  # no workload recorded: a training config
    printed = "\n".join(training.instructions(tmp_path / "c.toml"))
    assert training.training and "inference=True" not in printed and "DistributedSampler" in printed
    assert TunedConfig.load(inference.save(tmp_path / "c.toml")).training is False


# --- on 2 gloo ranks against the single-device output -------------------------------------------


@pytest.mark.parametrize("layout", ["2x1x1", "1x1x2"])
def test_inference_layouts_of_a_plain_mlp_on_two_ranks_match_the_single_device(layout: str) -> None:
    report = _check(MLP, layout)
    assert report["local_batch"] == (4 if layout == "2x1x1" else 8)  # a tensor group shares the batch


@pytest.mark.slow  # the default run keeps one rank-spawning case a kind; .ci/run's full pass has the rest
def test_fsdp_inference_on_two_ranks_matches_the_single_device() -> None:
    assert _check(RESIDUAL, "1x2x1")["local_batch"] == 4


@pytest.mark.parametrize("layout", [pytest.param("2x1x1", marks=pytest.mark.slow), "1x1x2"])
def test_inference_layouts_of_a_hugging_face_llama_on_two_ranks_match_the_single_device(layout: str) -> None:
    pytest.importorskip("transformers")
    report = _check(LLAMA, layout)
    assert report["local_batch"] == (2 if layout == "2x1x1" else 4)


@pytest.mark.slow  # 4 ranks on a 2-core host: .ci/run's full pass
def test_data_x_tensor_inference_on_four_ranks_matches_the_single_device() -> None:
    assert _check(MLP, "2x1x2", nproc=4)["local_batch"] == 4


# --- the apply code on 2 ranks ------------------------------------------------------------------


def _apply_code(monkeypatch, tmp_path, source: str | Path, setting: str, mode: str) -> dict[int, dict]:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))
    result = run_ranks(2, "inference_apply_code", [str(source), setting, mode, str(tmp_path)], timeout_s=240)
    assert result.ok, result.failure
    reports = result.reports
    assert reports[1]["own_differs"] > 1e-4  # each rank built a different model (a seed of its own)
    for report in reports.values():
        # Rank 0's weights on every rank: the whole batch through the applied model, and each rank's
        # slice gathered, give rank 0's own output.
        assert report["whole_diff"] < 1e-5 and report["gathered_diff"] < 1e-5, report
        assert report["observed"] == report["layout"] and not report["ddp"]
    return reports


@pytest.mark.parametrize("layout", [pytest.param("2x1x1", marks=pytest.mark.slow), "1x1x2"])
def test_the_printed_inference_layout_code_runs_on_two_ranks(monkeypatch, tmp_path, layout: str) -> None:
    reports = _apply_code(monkeypatch, tmp_path, MLP, layout, "code")
    assert "inference=True" in reports[0]["code"]


def test_tpu_tuner_apply_of_an_inference_config_runs_on_two_ranks(monkeypatch, tmp_path) -> None:
    reports = _apply_code(monkeypatch, tmp_path, RESIDUAL, "1x2x1", "printed")
    assert "tpu_tuner.apply(model, " in reports[0]["code"]


@pytest.mark.slow  # test_tpu_tuner_apply_of_an_inference_config_runs_on_two_ranks is the quick one
def test_tpu_tuner_apply_splits_a_hugging_face_llama_by_its_plan_for_inference(monkeypatch, tmp_path) -> None:
    pytest.importorskip("transformers")
    _apply_code(monkeypatch, tmp_path, LLAMA, "1x1x2", "printed")


# --- a study ------------------------------------------------------------------------------------


@pytest.mark.slow  # a whole study on two ranks; no clock (--time-budget none): its 4 trials, however slow
def test_a_study_of_an_inference_file_on_two_ranks_measures_its_layouts(monkeypatch, tmp_path) -> None:
    import subprocess
    import sys

    from tpu_tuner.knobs.tuned_config import TunedConfig
    from tpu_tuner.studies import records
    from tpu_tuner.tuning.run.tuning_result import TuningResult

    out = tmp_path / "results"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpu_tuner.cli",
            str(RESIDUAL),
            "--nproc",
            "2",
            "--trials",
            "4",
            "--time-budget",
            "none",
            "--space",
            str(FIXTURES / "inference_layout_space.toml"),
            "--verify-rounds",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run_dir = next(out.iterdir())
    result = TuningResult.load(run_dir)
    measured = {
        t.params["layout"]: records.attrs(t) for t in result.study.get_trials() if records.attrs(t).get("measured")
    }
    assert set(measured) == {"2x1x1", "1x2x1", "1x1x2"}  # data x tensor needs 4 ranks
    for layout, attrs in measured.items():  # each against the single-device fp32 output
        assert attrs["accuracy_error"] < TOLERANCE, (layout, attrs)
    # Verified interleaved where a layout beat the baseline in the search; on a tiny model over gloo
    # the replicas usually win, and the baseline is then kept without a window.
    assert result.verification.message
    config = TunedConfig.load(run_dir / "tuned_config.toml")
    assert not config.training and config.candidate["layout"] == result.verification.chosen["layout"]
    assert "Every trial ran on 2 ranks" in (run_dir / "report.md").read_text()
    # The tuned config's printed apply code on 2 ranks of a user's own (differently seeded) models.
    _apply_code(monkeypatch, tmp_path, RESIDUAL, str(run_dir / "tuned_config.toml"), "printed")
