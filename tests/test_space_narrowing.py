"""The search space narrowed to a workload (knobs/traits.py): knobs that cannot change its step
and choices that cannot run are left out, with the reason, and never measured."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from tpu_tuner.knobs.model_traits import of_model
from tpu_tuner.knobs.traits import WorkloadTraits, of_profile
from tpu_tuner.model.workloads.profiled import ProfiledWorkload
from tpu_tuner.tuning.options.tune_options import SearchOptions
from tpu_tuner.tuning.search.search_space import SearchSpace


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(x)


def _names(space: SearchSpace) -> set[str]:
    return {p.name for p in space.searched}


def test_traits_read_convolutions_and_repeated_blocks() -> None:
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3))
    assert of_model(conv, training=False, batch_size=2) == WorkloadTraits(False, 2, 0, 2, linear_layers=0)
    stack = nn.Sequential(nn.Linear(8, 8), nn.ModuleList([_Block(), _Block(), _Block()]))
    traits = of_model(stack, training=True, batch_size=8)
    assert (traits.conv_weights, traits.repeated_blocks, traits.linear_layers) == (0, 3, 4)
    assert of_profile({"traits": traits.to_dict()}) == traits
    assert of_profile({}) is None and of_profile({"traits": {"training": True}}) is None


def test_the_profiled_workload_has_one_training_flag_and_keeps_its_profile_json_table() -> None:
    traits = WorkloadTraits(True, 0, 3, 8, 4)
    table = {
        "name": "m",
        "source": "m.py",
        "convention": "native",
        "step": "training step",
        "batch_size": 8,
        "seq_len": 64,
        "notes": ["a note"],
        "traits": traits.to_dict(),
    }
    workload = ProfiledWorkload.from_dict(table)
    assert workload.training and of_profile(workload) == traits == of_profile(table)
    assert json.dumps(workload.to_dict()) == json.dumps(table)  # the same keys, in the same order
    assert workload["batch_size"] == workload.get("batch_size") == 8 and dict(workload) == table  # reads as the dict
    # A profile written before traits were recorded: the step's words give the flag; no narrowing.
    older = ProfiledWorkload.from_dict({key: value for key, value in table.items() if key != "traits"})
    assert older.training and of_profile(older) is None and "traits" not in older.to_dict()
    inference = ProfiledWorkload.from_dict(
        {**table, "step": "inference (forward)", "traits": {**traits.to_dict(), "training": False}}
    )
    assert not inference.training and of_profile(inference) == WorkloadTraits(False, 0, 3, 8, 4)
    assert inference.to_dict()["step"] == "inference (forward)"
    with pytest.raises(TypeError, match="name"):
        ProfiledWorkload.from_dict({"step": "training step"})


def test_inference_space_leaves_out_training_knobs_and_keeps_memory_format_for_convolutions() -> None:
    full = SearchSpace.load("default", "cpu")
    inference = full.for_workload(WorkloadTraits(training=False, conv_weights=8, repeated_blocks=4, batch_size=32))
    assert {"optimizer_impl", "micro_batches", "activation_checkpointing"}.isdisjoint(_names(inference))
    assert "memory_format" in _names(inference)
    assert any(line.startswith("optimizer_impl: an inference step has no optimizer") for line in inference.left_out)
    # Every setting of the narrowed space is a setting of the full one, the others at baseline.
    assert all(full.normalize(s) == s for s in inference.settings())
    assert inference.to_candidate({}).changed == {}
    no_conv = full.for_workload(WorkloadTraits(False, 0, 0, None))
    assert "memory_format" not in _names(no_conv)
    assert no_conv.size() * 2 == inference.size()  # memory_format's two choices, nothing else


def test_training_space_drops_freezing_and_micro_batches_that_do_not_divide_the_batch() -> None:
    full = SearchSpace.load("default", "cpu")
    training = full.for_workload(WorkloadTraits(training=True, conv_weights=0, repeated_blocks=4, batch_size=6))
    options = dict((p.name, p.choices) for p in training.searched)
    assert not any("freezing" in c for c in options["compile_options"])
    assert "max-autotune" in options["compile_options"]
    assert options["micro_batches"] == ("1", "2")  # 4 does not divide 6
    assert {"optimizer_impl", "activation_checkpointing"} <= set(options)
    assert "memory_format" not in options
    # The size is the product of the choices, inductor's options counted only under inductor and
    # the compile scope only under a compiling execution.
    per_rest = 1
    for name, choices in options.items():
        if name not in ("execution", "compile_options", "compile_scope"):
            per_rest *= len(choices)
    scopes = len(options["compile_scope"])
    assert scopes == 2  # a training step searches it
    conditional = sum(
        (len(options["compile_options"]) if e.startswith("inductor") else 1) * (1 if e == "eager" else scopes)
        for e in options["execution"]
    )
    assert training.size() == per_rest * conditional
    # A model without repeated blocks cannot be checkpointed.
    flat = full.for_workload(WorkloadTraits(True, 0, 0, 8))
    assert "activation_checkpointing" not in _names(flat)


def test_narrowed_space_round_trips_through_its_stored_form() -> None:
    import dataclasses
    import json

    from tpu_tuner.core.plain_data import from_plain

    space = SearchSpace.load("default", "cpu").for_workload(WorkloadTraits(False, 0, 0, 4))
    again = from_plain(SearchSpace, json.loads(json.dumps(dataclasses.asdict(space))))  # as result.json holds it
    assert again == space and again.left_out


@pytest.mark.parametrize("example, training", [("cnn", False), ("gpt", True)])
def test_the_examples_traits(example: str, training: bool) -> None:
    from pathlib import Path

    from tpu_tuner.model.workloads.loader import load_workload

    workload = load_workload(Path(__file__).resolve().parent.parent / "examples" / f"{example}.py")
    traits = of_model(workload.build_model(), workload.is_training, workload.batch_size)
    assert traits.training is training
    assert (traits.conv_weights > 0) is (example == "cnn")
    assert traits.repeated_blocks >= 2


def test_grid_run_takes_seeds_that_switch_on_a_conditional_parameter() -> None:
    # A seed naming only execution = inductor must be enqueued whole (inductor's options at
    # their default): Optuna's grid sampler refuses to fill in an enqueued trial's missing params.
    import optuna

    from tpu_tuner.tuning import TuneOptions
    from tpu_tuner.tuning.search.seeding import build_sampler, enqueue_seeds

    space = SearchSpace.load("default", "cpu").for_workload(WorkloadTraits(False, 0, 0, 4))
    assert space.complete({"execution": "inductor"})["compile_options"] == "default"
    assert "compile_options" not in space.complete({"execution": "eager"})

    class _Seeder:
        name = "compile"

        def seeds(self, profile: object, space: SearchSpace) -> list[dict[str, str]]:
            return [{"execution": "inductor"}]

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=build_sampler(TuneOptions(search=SearchOptions(sampler="grid")), space))
    enqueue_seeds(study, space, [_Seeder()], None)  # type: ignore[list-item]
    asked = []
    for _ in range(3):  # baseline, the seed, then the grid's own first point
        trial = study.ask()
        asked.append(space.suggest(trial))
        study.tell(trial, 1.0)
    assert asked[1]["execution"] == "inductor" and asked[1]["compile_options"] == "default"
    assert asked[2] in space.settings()
