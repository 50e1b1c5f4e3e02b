"""The knob registry: the explicit list of every knob tpu-tune searches.

Everything that lists knobs reads this registry (the search space's known parameters, the trials
table's columns, the dashboard, the tuned config's [settings], provenance), so adding a knob is
one new module in this package, one line in `KNOB_CLASSES`, and its choices in
``search_spaces/default.toml`` (docs/knobs.md); a knob not yet measured where it applies has its
choices in an opt-in space instead (``search_spaces/torchtpu.toml``).
"""

from __future__ import annotations

from tpu_tuner.knobs.activation_checkpointing import ActivationCheckpointingKnob
from tpu_tuner.knobs.attention_kernel import AttentionKernelKnob
from tpu_tuner.knobs.attn_implementation import AttnImplementationKnob
from tpu_tuner.knobs.autocast import AutocastKnob
from tpu_tuner.knobs.base import Knob
from tpu_tuner.knobs.compile_options import CompileOptionsKnob
from tpu_tuner.knobs.compile_scope import CompileScopeKnob
from tpu_tuner.knobs.execution import ExecutionKnob
from tpu_tuner.knobs.intra_op_threads import IntraOpThreadsKnob
from tpu_tuner.knobs.layout import LayoutKnob
from tpu_tuner.knobs.libtpu_flags import LibtpuFlagsKnob
from tpu_tuner.knobs.matmul_precision import MatmulPrecisionKnob
from tpu_tuner.knobs.memory_format import MemoryFormatKnob
from tpu_tuner.knobs.micro_batches import MicroBatchesKnob
from tpu_tuner.knobs.optimizer_impl import OptimizerImplKnob
from tpu_tuner.knobs.param_dtype import ParamDtypeKnob
from tpu_tuner.knobs.quantization import QuantizationKnob
from tpu_tuner.knobs.xla_optimization_level import XlaOptimizationLevelKnob

__all__ = ["KNOB_CLASSES", "Knob", "REGISTRY", "get", "names"]

KNOB_CLASSES: tuple[type[Knob], ...] = (
    ActivationCheckpointingKnob,
    AttentionKernelKnob,
    AttnImplementationKnob,
    AutocastKnob,
    CompileOptionsKnob,
    CompileScopeKnob,
    ExecutionKnob,
    IntraOpThreadsKnob,
    LayoutKnob,
    LibtpuFlagsKnob,
    MatmulPrecisionKnob,
    MemoryFormatKnob,
    MicroBatchesKnob,
    OptimizerImplKnob,
    ParamDtypeKnob,
    QuantizationKnob,
    XlaOptimizationLevelKnob,
)


def _build() -> dict[str, Knob]:
    found = sorted((cls() for cls in KNOB_CLASSES), key=lambda knob: (knob.position, knob.name))
    registry: dict[str, Knob] = {}
    for knob in found:
        if knob.name in registry:
            raise RuntimeError(f"two knobs are named {knob.name!r}")
        registry[knob.name] = knob
    return registry


# name -> knob, in `position` order.
REGISTRY: dict[str, Knob] = _build()


def names() -> tuple[str, ...]:
    """The registered knob names, in order."""
    return tuple(REGISTRY)


def get(name: str) -> Knob:
    """The knob called `name`; KeyError naming the known knobs otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown knob {name!r}; known: {', '.join(REGISTRY)}") from None
