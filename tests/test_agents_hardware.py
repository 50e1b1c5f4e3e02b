"""Agents decide from the measured hardware probe, not from what a device kind usually has
(issue 12, item 8): both host kinds are injected, whatever this machine is."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest
from conftest import use_probe
from helpers.common import AMX, injected_probe, matmul_heavy_profile, precision_agent

from tpu_tuner.core.definitions import load_definition
from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.tuning.agents import PrecisionAgent, load_agents
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.seeding import enqueue_seeds

# The two host kinds of docs/mfu.md ("medium" numerics): AVX-512F only (medium is fp32, bf16 ~5x slower) and AMX.
NO_BF16_UNITS = injected_probe(300e9, 60e9, 1.2e-7)
# This kind too: fast bf16 (AVX512_BF16) but "medium" leaves fp32 matmuls unchanged.
BF16_BUT_MEDIUM_IS_FP32 = injected_probe(210e9, 900e9, 4e-7)


def _space() -> SearchSpace:
    return SearchSpace.load("precision", "cpu")


def test_host_without_bf16_units_skips_medium_and_bf16_with_the_figures() -> None:
    agent = precision_agent(NO_BF16_UNITS)
    medium = agent.validate(Candidate(matmul_precision="medium"))
    assert medium is not None and "relative error 1.2e-07" in medium and "same kernels as 'highest'" in medium
    bf16 = agent.validate(Candidate(autocast="bfloat16"))
    assert bf16 is not None and "60 GFLOP/s against 300 GFLOP/s" in bf16 and "0.20x" in bf16
    assert agent.seeds(None, _space()) == []
    findings = " ".join(agent.diagnose(matmul_heavy_profile()))
    assert "should pay off" not in findings and "no faster than fp32" in findings
    assert "matmul precision 'medium' skipped" in findings and "bf16 autocast rejected" in findings


def test_host_with_fast_bf16_still_seeds_both() -> None:
    agent = precision_agent(AMX)
    assert agent.validate(Candidate(matmul_precision="medium")) is None
    assert agent.validate(Candidate(autocast="bfloat16")) is None
    assert agent.seeds(None, _space()) == [{"autocast": "bfloat16"}, {"matmul_precision": "medium"}]
    findings = " ".join(agent.diagnose(matmul_heavy_profile()))
    assert "should pay off" in findings and "runs fp32 matmuls as bf16" in findings


def test_fast_bf16_with_fp32_medium_seeds_only_autocast() -> None:
    agent = precision_agent(BF16_BUT_MEDIUM_IS_FP32)
    assert agent.validate(Candidate(matmul_precision="medium")) is not None
    assert agent.validate(Candidate(autocast="bfloat16")) is None
    assert agent.seeds(None, _space()) == [{"autocast": "bfloat16"}]
    assert "bf16 matmuls (bf16 autocast) should pay off" in " ".join(agent.diagnose(matmul_heavy_profile()))


def test_bf16_a_little_slower_is_not_seeded_but_not_rejected() -> None:
    agent = precision_agent(injected_probe(300e9, 240e9, 2.5e-3))  # 0.8x: not seeded, still searchable
    assert agent.validate(Candidate(autocast="bfloat16")) is None
    assert agent.seeds(None, _space()) == [{"matmul_precision": "medium"}]


def test_published_peaks_keep_the_definition_seeds() -> None:
    # TPU / datasheet GPUs carry no probe: nothing is skipped on its account.
    agent = PrecisionAgent(load_definition("agents", "precision"), "tpu", None)
    assert agent.validate(Candidate(matmul_precision="medium")) is None
    # On TPU medium is the baseline (TorchTPU's default): bf16 autocast is the seed left.
    assert agent.seeds(None, SearchSpace.load("precision", "tpu")) == [{"autocast": "bfloat16"}]
    cuda = PrecisionAgent(load_definition("agents", "precision"), "cuda", None)
    assert {"matmul_precision": "high"} in cuda.seeds(None, SearchSpace.load("precision", "cuda"))


def test_the_study_never_queues_what_the_probe_rules_out() -> None:
    study = optuna.create_study()
    agents = load_agents(["precision"], "cpu", NO_BF16_UNITS)
    enqueue_seeds(study, _space(), agents, None)
    queued = [t.system_attrs["fixed_params"] for t in study.get_trials(deepcopy=False)]
    assert queued == [{"matmul_precision": "highest", "autocast": "none"}]


def test_the_cpu_backend_hands_its_probe_to_the_profile(tmp_path, monkeypatch) -> None:
    injected = use_probe(monkeypatch, tmp_path, bfloat16_flops_per_s=60e9, medium_relative_error=1e-7)
    probe = CpuBackend().info().probe
    assert probe == injected and probe.medium_changes_numerics is False
    assert probe.bf16_speed_ratio == pytest.approx(0.2)


def test_seeds_are_queued_in_turns_so_every_agent_s_first_guess_runs_early() -> None:
    """One agent with many seeds must not fill a small budget before the others' first guess."""
    from types import SimpleNamespace

    many = SimpleNamespace(
        seeds=lambda profile, space: [
            {"autocast": "bfloat16"},
            {"matmul_precision": "medium"},
            {"matmul_precision": "high"},
        ]
    )
    one = SimpleNamespace(seeds=lambda profile, space: [{"matmul_precision": "medium"}])
    study = optuna.create_study()
    enqueue_seeds(study, _space(), [many, one], None)
    queued = [t.system_attrs["fixed_params"] for t in study.get_trials(deepcopy=False)]
    base = {"matmul_precision": "highest", "autocast": "none"}
    combined = {"matmul_precision": "medium", "autocast": "bfloat16"}
    # Further seeds go on top of the combined one ("medium" again is the combined seed: once).
    assert queued == [
        base,
        {**base, "autocast": "bfloat16"},
        {**base, "matmul_precision": "medium"},
        combined,
        {**combined, "matmul_precision": "high"},
    ]


def test_quantized_linears_are_proposed_only_for_a_linear_heavy_inference_step() -> None:
    agent, space = precision_agent(AMX), SearchSpace.load("default", "cpu")
    inference = matmul_heavy_profile(training=False)
    assert {"quantization": "int8_dynamic"} in agent.seeds(inference, space)
    assert "int8 quantized linears (torchao) may pay off" in " ".join(agent.diagnose(inference))
    assert {"quantization": "int8_dynamic"} not in agent.seeds(matmul_heavy_profile(), space)  # training
    light = matmul_heavy_profile(training=False)
    light.operators = [
        SimpleNamespace(name="aten::convolution", share=0.8),
        SimpleNamespace(name="aten::addmm", share=0.1),
    ]
    assert {"quantization": "int8_dynamic"} not in agent.seeds(light, space)
    assert "quantized linears" not in " ".join(agent.diagnose(light))
