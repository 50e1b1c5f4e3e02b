"""Search spaces load per device, map to candidates and back, and reject bad definitions."""

from __future__ import annotations

import math

import pytest

from tpu_tuner.core.errors import DefinitionError
from tpu_tuner.devices.torchtpu import TorchTpuBackend
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.tuning.search.search_space import SearchSpace


def test_settings_lists_each_valid_setting_once_with_conditional_parameters_only_where_active() -> None:
    cpu = SearchSpace.load("default", "cpu")
    settings = cpu.settings()
    assert len({tuple(s.items()) for s in settings}) == len(settings) == cpu.size()
    assert all(cpu.normalize(s) == s == cpu.complete(s) for s in settings[::50])  # a sample: 40,824 settings
    assert all(("compile_options" in s) == (s["execution"] == "inductor") for s in settings)
    assert settings[0] == cpu.baseline_params()  # grid order: first choices first


def test_default_space_per_device() -> None:
    cpu = SearchSpace.load("default", "cpu")
    grid = cpu.grid()
    assert {name: grid[name] for name in ("execution", "matmul_precision", "autocast")} == {
        "execution": ["eager", "aot_eager", "inductor"],
        "matmul_precision": ["highest", "high", "medium"],
        "autocast": ["none", "bfloat16"],
    }
    # compile_options is conditional (inductor only): its choices multiply the inductor settings
    # only; compile_scope (any compiling execution) multiplies aot_eager's and inductor's.
    conditional = ("execution", "compile_options", "compile_scope")
    others = math.prod(len(c) for name, c in grid.items() if name not in conditional)
    scopes = len(grid["compile_scope"])
    # eager; aot_eager x scopes; inductor x options x scopes
    assert cpu.size() == others * (1 + scopes + len(grid["compile_options"]) * scopes) >= 18
    assert cpu.to_candidate(cpu.baseline_params()) == Candidate()  # first choices are the baseline
    tpu = SearchSpace.load("default", "tpu")
    fused = tpu.to_candidate({"execution": "eager:defer_and_fuse"})
    assert fused["execution"] == "eager:defer_and_fuse" and fused.environment(TorchTpuBackend) == {
        "TORCH_TPU_DEFER_AND_FUSE": "1"
    }
    assert tpu.to_candidate({"execution": "tpu"})["execution"] == "tpu"


@pytest.mark.parametrize("device", ["cpu", "cuda", "tpu"])
def test_candidate_round_trip(device: str) -> None:
    space = SearchSpace.load("default", device)
    for execution in space.grid()["execution"]:
        # Every first choice, conditional parameters (compile_options) kept only where active.
        params = space.normalize(
            {**{p.name: p.choices[0] for p in space.searched}, "execution": execution, "autocast": "bfloat16"}
        )
        assert space.to_params(space.to_candidate(params)) == params


def test_bad_definitions(tmp_path) -> None:
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('[[param]]\nname = "learning_rate"\nchoices.cpu = ["1"]\n')
    with pytest.raises(DefinitionError, match="unknown parameter 'learning_rate'"):
        SearchSpace.load(unknown, "cpu")
    bad_choice = tmp_path / "bad.toml"
    bad_choice.write_text('[[param]]\nname = "matmul_precision"\nchoices.cpu = ["highest", "fastest"]\n')
    with pytest.raises(DefinitionError, match="bad choice 'fastest'"):
        SearchSpace.load(bad_choice, "cpu")
    with pytest.raises(DefinitionError, match="no parameters for device 'cpu'"):
        empty = tmp_path / "empty.toml"
        empty.write_text('[[param]]\nname = "autocast"\nchoices.tpu = ["none", "bfloat16"]\n')
        SearchSpace.load(empty, "cpu")


def test_a_knob_the_space_does_not_list_runs_at_the_devices_own_value(tmp_path) -> None:
    """On a TPU v5e chip a space without matmul_precision ran its baseline at fp32's 6 passes
    (482 ms) where the user's code runs TorchTPU's one (243 ms): an unlisted knob takes the
    device's value, as the baseline of the user's code does."""
    from tpu_tuner.knobs.candidate import Candidate

    path = tmp_path / "compile_only.toml"
    path.write_text(
        '[space]\nname = "compile-only"\n\n[[param]]\nname = "execution"\nchoices.tpu = ["eager:strict", "tpu"]\n'
    )
    space = SearchSpace.load(str(path), "tpu")
    assert space.to_candidate(space.baseline_params()) == Candidate.baseline("tpu")
    assert space.to_candidate({"execution": "tpu"})["matmul_precision"] == "medium"
