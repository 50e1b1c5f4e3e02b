"""The `attn_implementation` knob: which attention kernels a Hugging Face model runs.

transformers models choose their attention code by name (``config._attn_implementation``:
``eager``, ``sdpa``, ``flex_attention``); ``PreTrainedModel.set_attn_implementation`` switches a
built model, which is what this knob does and what its code line tells the user to write.
``default`` leaves the model as transformers built it; the other choices are the ones the model
supports other than the one it uses (`knobs/traits.py`), and other models do not search it. Which
choices each space holds and why: docs/hf-models.md, "Knobs the model declares".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tpu_tuner.knobs.base import BackendLike, Knob
from tpu_tuner.knobs.capabilities import NarrowedByWorkload

if TYPE_CHECKING:
    from torch import nn

    from tpu_tuner.knobs.traits import WorkloadTraits

DEFAULT = "default"
IMPLEMENTATIONS = ("sdpa", "eager", "flex_attention")
_MARK = "_tpu_tune_attn_implementation"


class AttnImplementationKnob(Knob, NarrowedByWorkload):
    name = "attn_implementation"
    agent = "compile"
    default = DEFAULT
    position = 15
    values = (DEFAULT, *IMPLEMENTATIONS)
    described = "{value} attention"
    not_applicable = "the model has no attention implementation switch (a transformers model's set_attn_implementation)"

    def applies_to_workload(self, traits: WorkloadTraits) -> bool:
        return bool(traits.attention_implementations)

    def choice_refusal(self, value: str, traits: WorkloadTraits) -> str | None:
        if value == DEFAULT or value in traits.attention_implementations:
            return None
        return f"the model does not offer {value} attention here (or already runs it)"

    def model(self, value: str, model: nn.Module, backend: BackendLike) -> nn.Module:
        if value == DEFAULT:
            return model
        model.set_attn_implementation(value)  # type: ignore[operator]  # nn.Module.__getattr__'s type
        setattr(model, _MARK, value)
        return model

    def code(self, value: str, device_kind: str) -> list[str]:
        if value == DEFAULT:
            return []
        return [f'model.set_attn_implementation("{value}")  # transformers\' attention kernels']

    def observe(self, model: nn.Module, forward: Callable[..., Any], backend: BackendLike) -> str | None:
        if not hasattr(model, "set_attn_implementation"):
            return DEFAULT  # nothing to switch: the model runs its own attention
        chosen = getattr(model, _MARK, None)
        if chosen is None:
            return DEFAULT
        config: Any = model.config  # a transformers PretrainedConfig (nn.Module.__getattr__ types it Tensor | Module)
        return chosen if config._attn_implementation == chosen else None


def offered(model: nn.Module) -> tuple[str, ...]:
    """The implementations a transformers model can switch to (not the one it runs now); empty
    for any other model."""
    if not (hasattr(model, "set_attn_implementation") and hasattr(model, "config")):
        return ()
    current = getattr(model.config, "_attn_implementation", None)
    supported = ["eager"]
    if getattr(model, "_supports_sdpa", False):
        supported.append("sdpa")
    if getattr(model, "_supports_flex_attn", False):
        supported.append("flex_attention")
    return tuple(v for v in IMPLEMENTATIONS if v in supported and v != current)
