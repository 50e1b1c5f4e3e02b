"""The compile_options knob (inductor freezing / max-autotune / fullgraph) and the conditional space."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest
import torch._inductor.config as inductor_config
from conftest import FIXTURES
from torch import nn

from tpu_tuner.api import tune
from tpu_tuner.core.errors import DefinitionError
from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.registry import get
from tpu_tuner.knobs.tuned_config import TunedConfig, apply
from tpu_tuner.model.workloads.profiled import ProfiledWorkload
from tpu_tuner.profiling import ProfilerSettings
from tpu_tuner.tuning.agents.compiler_options import seeds, validate
from tpu_tuner.tuning.options.tune_options import (
    ObjectiveOptions,
    OutputOptions,
    RunnerOptions,
    SearchOptions,
    TuneOptions,
)
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.search.seeding import build_sampler

CONDITIONAL = """
[[param]]
name = "execution"
agent = "compile"
choices.cpu = ["eager", "aot_eager", "inductor"]

[[param]]
name = "compile_options"
agent = "compile"
choices.cpu = ["default", "freezing", "freezing+max-autotune"]

[[param]]
name = "autocast"
agent = "precision"
choices.cpu = ["none", "bfloat16"]
"""


def _space(tmp_path, text: str = CONDITIONAL) -> SearchSpace:
    path = tmp_path / "space.toml"
    path.write_text(text)
    return SearchSpace.load(path, "cpu")


def test_values_are_checked_and_canonical() -> None:
    knob = get("compile_options")
    assert knob.check("max-autotune+freezing") == "freezing+max-autotune"
    with pytest.raises(ValueError, match="flags joined by"):
        knob.check("freezing+turbo")
    with pytest.raises(ValueError, match="CUDA graphs exist only on CUDA"):
        knob.choices("cpu", {"choices": {"cpu": ["default", "cudagraphs"]}})


def test_freezing_is_on_in_the_trial_and_after_apply_and_restored(tmp_path) -> None:
    candidate = Candidate(execution="inductor", compile_options="freezing+fullgraph")
    backend = CpuBackend()
    knob = get("compile_options")
    assert not inductor_config.freezing
    with candidate.process(backend):
        assert inductor_config.freezing and not inductor_config.max_autotune
        assert knob.observe(nn.Linear(2, 2), None, backend) == "freezing+fullgraph"
    assert not inductor_config.freezing and knob.observe(nn.Linear(2, 2), None, backend) == "default"

    config = TunedConfig.load(TunedConfig(candidate, "cpu").save(tmp_path / "tuned_config.toml"))
    assert config.candidate == candidate
    applied = apply(nn.Linear(2, 2).eval(), config)
    try:
        assert inductor_config.freezing  # kept for the rest of the process
        assert knob.observe(nn.Linear(2, 2), applied.model, backend) == "freezing+fullgraph"
    finally:
        applied.restore()
    assert not inductor_config.freezing


def test_the_compiled_forward_carries_the_options() -> None:
    """A worker that already compiled the model under plain inductor would reuse that graph for a
    second torch.compile (dynamo does not guard on inductor's config): the forward hook compiles
    with the options passed, so the backend differs. torch.compile is lazy: nothing compiles here."""
    backend = CpuBackend()
    candidate = Candidate(execution="inductor:max-autotune-no-cudagraphs", compile_options="freezing+fullgraph")
    with candidate.process(backend):
        forward = candidate.wrap_forward(nn.Linear(2, 2), backend)
    inductor = forward.dynamo_ctx.callback._torchdynamo_orig_backend._torchdynamo_orig_backend
    assert inductor.config["freezing"] is True and inductor.config["max_autotune"] is True  # mode kept
    assert forward._tpu_tune_execution == candidate["execution"]
    # Not under inductor: the options leave aot_eager's forward alone.
    other = Candidate(execution="aot_eager", compile_options="freezing")
    assert other.wrap_forward(nn.Linear(2, 2), backend)._tpu_tune_execution == "aot_eager"


def test_printed_code_sets_the_options() -> None:
    code = "\n".join(Candidate(execution="inductor", compile_options="freezing+max-autotune").code("cpu"))
    assert "torch._inductor.config.freezing = True" in code and "torch._inductor.config.max_autotune = True" in code
    assert code.index('torch.compile(model, backend="inductor")') < code.index("output = model(inputs)")


def test_conditional_space_suggests_and_enumerates_only_valid_settings(tmp_path) -> None:
    space = _space(tmp_path)
    # eager and aot_eager: no compiler options; inductor: three. Times two autocast choices.
    assert space.size() == (1 + 1 + 3) * 2 == len(space.settings())
    assert all(("compile_options" in s) == (s["execution"] == "inductor") for s in space.settings())
    assert space.baseline_params() == {"execution": "eager", "autocast": "none"}
    assert space.to_candidate(space.baseline_params()) == Candidate()
    # A value for an inactive conditional parameter is dropped, not applied.
    assert space.to_candidate({"execution": "eager", "compile_options": "freezing"}) == Candidate()
    assert space.to_params(Candidate(execution="inductor", compile_options="freezing")) == {
        "execution": "inductor",
        "compile_options": "freezing",
        "autocast": "none",
    }
    assert space.to_params(Candidate(execution="aot_eager")) == {"execution": "aot_eager", "autocast": "none"}

    eager = space.suggest(optuna.trial.FixedTrial({"execution": "eager", "autocast": "none"}))
    assert eager == {"execution": "eager", "autocast": "none"}  # compile_options never asked
    compiled = space.suggest(
        optuna.trial.FixedTrial({"execution": "inductor", "compile_options": "freezing", "autocast": "none"})
    )
    assert compiled["compile_options"] == "freezing"

    # The grid sampler walks exactly the valid settings, each once.
    study = optuna.create_study(sampler=build_sampler(TuneOptions(search=SearchOptions(sampler="grid", seed=0)), space))
    walked = []
    for _ in range(space.size()):
        trial = study.ask()
        walked.append(space.suggest(trial))
        study.tell(trial, 1.0)
    assert sorted(map(str, walked)) == sorted(map(str, space.settings()))

    # TPE copes with the conditional parameter.
    tpe = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=2))
    for _ in range(8):
        trial = tpe.ask()
        params = space.suggest(trial)
        assert ("compile_options" in params) == (params["execution"] == "inductor")
        tpe.tell(trial, 1.0)


def test_default_space_grid_counts_valid_settings() -> None:
    space = SearchSpace.load("default", "cpu")
    grid = space.grid()
    product = 1
    for choices in grid.values():
        product *= len(choices)
    options, scopes = len(grid["compile_options"]), len(grid["compile_scope"])
    per_execution = product // (len(grid["execution"]) * options * scopes)
    # compile_options counts only under inductor, compile_scope under any compiling execution.
    conditional = sum(
        (options if e.partition(":")[0] == "inductor" else 1) * (1 if e.startswith("eager") else scopes)
        for e in grid["execution"]
    )
    assert space.size() == per_execution * conditional


def test_cudagraphs_refused_off_cuda_by_the_space(tmp_path) -> None:
    with pytest.raises(DefinitionError, match="CUDA graphs exist only on CUDA"):
        _space(tmp_path, CONDITIONAL.replace('"freezing+max-autotune"]', '"cudagraphs"]'))


def _profile(training: bool, compute: bool) -> SimpleNamespace:
    verdict = SimpleNamespace(bound="compute-bound" if compute else "memory-bound", compute_kernels_dominate=compute)
    return SimpleNamespace(verdict=verdict, workload=_profiled_workload("training step" if training else "inference"))


def test_agent_seeds_freezing_for_compute_heavy_inference_and_rejects_what_cannot_apply() -> None:
    choices = {"execution": ("eager", "inductor"), "compile_options": ("default", "freezing", "freezing+max-autotune")}
    assert seeds(_profile(training=False, compute=True), choices) == [
        {"execution": "inductor", "compile_options": "freezing"},
        {"execution": "inductor", "compile_options": "freezing+max-autotune"},
    ]
    assert seeds(_profile(training=False, compute=False), choices) == []
    assert seeds(_profile(training=True, compute=True), choices) == []
    frozen = Candidate(execution="inductor", compile_options="freezing")
    assert "the step trains" in validate(frozen, True, "cpu")
    assert validate(frozen, False, "cpu") is None
    assert "only on CUDA" in validate(Candidate(execution="inductor", compile_options="cudagraphs"), False, "cpu")


# Slow: the baseline compiles a tiny model with inductor (C++). No clock (time_budget_s=None): both
# settings are measured however long the compiles take, so it runs two at a time.
@pytest.mark.slow
def test_fullgraph_on_a_graph_break_is_a_failed_trial(tmp_path) -> None:
    settings = ProfilerSettings(
        warmup_min_steps=1,
        warmup_max_steps=3,
        timing_min_steps=5,
        timing_min_seconds=0.0,
        timing_max_steps=10,
        profiled_steps=1,
        top_operators=3,
    )
    options = TuneOptions(
        search=SearchOptions(
            space=FIXTURES / "inductor_options_space.toml", agents=(), trials=2, sampler="grid", time_budget_s=None
        ),
        objective=ObjectiveOptions(verify_rounds=2),
        outputs=OutputOptions(out=tmp_path),
        runner=RunnerOptions(trial_timeout_s=240.0, trial_settings=settings),
    )
    result = tune(FIXTURES / "graph_break.py", options)
    rows = {row["compile_options"]: row for _, row in result.trials_dataframe().iterrows()}
    assert rows["default"]["state"] == "COMPLETE"  # dynamo splits the graph and runs
    assert rows["fullgraph"]["state"] == "PRUNED" and rows["fullgraph"]["failure_kind"] == "error"
    assert (
        "graph_break" in rows["fullgraph"]["failure_message"] or "Unsupported" in rows["fullgraph"]["failure_message"]
    )


def _profiled_workload(step: str) -> ProfiledWorkload:
    """A profiled workload whose step reads `step`, as profile.json writes it."""
    return ProfiledWorkload.from_dict({"name": "m", "source": "m.py", "convention": "native", "step": step})
