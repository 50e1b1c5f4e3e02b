"""The `quantization` knob (torchao, inference): what each choice does to a model's linears and
reads back, the code `tpu-tune apply` prints, when it is left out of the space, and the report's
note of faster settings the accuracy guardrail refused."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest
import torch
from torch import nn

from tpu_tuner.knobs import registry
from tpu_tuner.knobs.quantization import NO_TORCHAO
from tpu_tuner.knobs.traits import WorkloadTraits
from tpu_tuner.outputs.guardrail_refusals import refused_faster
from tpu_tuner.studies import records
from tpu_tuner.tuning.search.search_space import SearchSpace

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="the quant extra")
KNOB = registry.get("quantization")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 64)).eval()


@pytest.mark.parametrize("value, largest_error", [("int8_dynamic", 3e-2), ("int8_weight_only", 1e-2)])
def test_each_int8_choice_quantizes_every_linear_reads_back_and_stays_close(value: str, largest_error: float) -> None:
    reference, inputs = _model(), torch.randn(8, 256)
    expected = reference(inputs)
    model = KNOB.model(value, _model(), "cpu")  # type: ignore[arg-type]
    assert KNOB.observe(model, model, "cpu") == value  # type: ignore[arg-type]
    assert {type(m.weight).__name__ for m in model.modules() if isinstance(m, nn.Linear)} == {"Int8Tensor"}
    with torch.no_grad():
        error = ((model(inputs) - expected).norm() / expected.norm()).item()
    assert 0 < error < largest_error  # quantized: not exact, but close
    assert KNOB.model(value, model, "cpu") is model and KNOB.observe(model, model, "cpu") == value  # type: ignore[arg-type]


def test_the_printed_code_applies_the_same_setting() -> None:
    model = _model()
    exec("\n".join(KNOB.code("int8_weight_only", "cpu")), {"model": model})
    assert KNOB.observe(model, model, "cpu") == "int8_weight_only"  # type: ignore[arg-type]
    assert KNOB.code("none", "cpu") == [] and KNOB.observe(_model(), model, "cpu") == "none"  # type: ignore[arg-type]


def test_float8_on_a_device_without_fp8_units_fails_naming_the_device_rule() -> None:
    with pytest.raises(RuntimeError, match="quantization float8_dynamic cannot run on this device: .*8.9"):
        KNOB.model("float8_dynamic", _model(), "cpu")  # type: ignore[arg-type]


def test_left_out_for_training_for_models_without_linears_and_without_torchao(monkeypatch: pytest.MonkeyPatch) -> None:
    space = SearchSpace.load("default", "cpu")
    inference = WorkloadTraits(False, 0, 0, 8, linear_layers=3)
    assert next(p for p in space.for_workload(inference).params if p.name == "quantization").choices == (
        "none",
        "int8_dynamic",
        "int8_weight_only",
    )
    for traits in (WorkloadTraits(True, 0, 0, 8, linear_layers=3), WorkloadTraits(False, 4, 0, 8, linear_layers=0)):
        narrowed = space.for_workload(traits)
        assert next(p for p in narrowed.params if p.name == "quantization").choices == ("none",)
        assert any(
            line.startswith("quantization: quantized linear weights are for inference") for line in narrowed.left_out
        )
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real_find_spec(name, *a)
    )
    narrowed = space.for_workload(inference)
    assert next(p for p in narrowed.params if p.name == "quantization").choices == ("none",)
    assert f"quantization: int8_dynamic: {NO_TORCHAO}" in narrowed.left_out


def test_the_report_names_faster_settings_the_guardrail_refused_and_by_how_much() -> None:
    frame = pd.DataFrame(
        {
            "number": [0, 1, 2, 3],
            records.FAILURE_KIND: [None, "accuracy", "accuracy", "crash"],
            records.AMORTISED_STEP_S: [0.010, 0.004, 0.020, None],
            records.ACCURACY_ERROR: [0.0, 0.013, 0.05, None],
        }
    )
    lines = refused_faster(frame, baseline_amortised_s=0.010, tolerance=1e-2)
    refused = [line for line in lines if line.startswith("- trial")]
    assert refused == [
        "- trial 1: 2.50x the baseline's speed (one search measurement), error 1.30e-02: 30% over the tolerance"
    ]
    assert refused_faster(frame.iloc[[0, 2, 3]], 0.010, 1e-2) == [] and refused_faster(frame, None, 1e-2) == []
