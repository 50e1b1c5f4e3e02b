"""The `quantization` knob: a model's linear layers quantized through torchao, for inference.

torchao's ``quantize_`` swaps each ``nn.Linear`` weight for a quantized tensor subclass in place
(https://docs.pytorch.org/ao/stable/quick_start.html); torch.compile then fuses the quantize /
int8-matmul / rescale steps. The choices: ``int8_dynamic`` (int8 weights and activations,
``Int8DynamicActivationInt8WeightConfig``), ``int8_weight_only`` (``Int8WeightOnlyConfig``) and
``float8_dynamic`` (``Float8DynamicActivationFloat8WeightConfig``: CUDA only, on GPUs with fp8
units; elsewhere the trial fails saying so). Inference only, judged by the accuracy guardrail at
the run's tolerance (nothing loosened); torchao is an extra (``pip install 'tpu-tune[quant]'``):
without it the choices are left out of the space with that reason. TorchTPU has its own int8 path,
not torchao's: not a knob there. Why and what was measured: docs/knobs.md, "`quantization`".
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tpu_tuner.knobs.base import BackendLike, Knob
from tpu_tuner.knobs.capabilities import NarrowedByWorkload

if TYPE_CHECKING:
    from torch import nn

    from tpu_tuner.knobs.traits import WorkloadTraits

NONE = "none"
INT8_DYNAMIC = "int8_dynamic"
INT8_WEIGHT_ONLY = "int8_weight_only"
FLOAT8_DYNAMIC = "float8_dynamic"
# torchao's config class for each choice (torchao.quantization, 0.18).
CONFIGS = {
    INT8_DYNAMIC: "Int8DynamicActivationInt8WeightConfig",
    INT8_WEIGHT_ONLY: "Int8WeightOnlyConfig",
    FLOAT8_DYNAMIC: "Float8DynamicActivationFloat8WeightConfig",
}
NO_TORCHAO = "torchao is not installed (pip install 'tpu-tune[quant]')"


class QuantizationKnob(Knob, NarrowedByWorkload):
    name = "quantization"
    agent = "precision"
    default = NONE
    position = 35
    values = (NONE, INT8_DYNAMIC, INT8_WEIGHT_ONLY, FLOAT8_DYNAMIC)
    device_kinds = ("cpu", "cuda")
    not_applicable = "quantized linear weights are for inference steps of models with linear layers"

    def applies_to_workload(self, traits: WorkloadTraits) -> bool:
        return not traits.training and traits.linear_layers != 0  # None: a profile that did not count them

    def choice_refusal(self, value: str, traits: WorkloadTraits) -> str | None:
        return NO_TORCHAO if importlib.util.find_spec("torchao") is None else None

    def model(self, value: str, model: nn.Module, backend: BackendLike) -> nn.Module:
        if value == NONE or self.observe(model, model, backend) == value:
            return model  # a second application would quantize quantized weights
        import torchao.quantization as quantization

        try:
            quantization.quantize_(model, getattr(quantization, CONFIGS[value])())
        except AssertionError as exc:  # torchao states a device it cannot run on as an assertion
            raise RuntimeError(f"quantization {value} cannot run on this device: {exc}") from exc
        return model

    def describe(self, value: str) -> str:
        return "" if value == NONE else value.replace("_", " ") + " linears"

    def code(self, value: str, device_kind: str) -> list[str]:
        if value == NONE:
            return []
        return [
            f"from torchao.quantization import quantize_, {CONFIGS[value]}",
            f"quantize_(model, {CONFIGS[value]}())  # every nn.Linear; inference only",
        ]

    def observe(self, model: nn.Module, forward: Callable[..., Any], backend: BackendLike) -> str | None:
        import torch

        weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
        if not weights:
            return None
        kind = type(weights[0]).__name__
        if kind.startswith("Float8"):
            return FLOAT8_DYNAMIC
        if kind.startswith("Int8"):
            return INT8_WEIGHT_ONLY if getattr(weights[0], "act_quant_kwargs", None) is None else INT8_DYNAMIC
        return NONE
