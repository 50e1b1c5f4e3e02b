"""The `param_dtype` knob: pure bfloat16 steps, parameters (and a training step's optimizer states) in bfloat16.

Not autocast (which keeps fp32 weights and casts per op): the model's floating-point parameters
and persistent buffers (state such as a norm's running statistics) become bfloat16 in the `model`
hook, which `execution/step.py` runs before the optimizer is built, so the optimizer's states are
bfloat16 too. Non-persistent buffers, the constants a model derives from its config (rotary
frequencies, sine tables), keep their dtype, as torchtitan's bf16 parameters do: a Llama-class
`hf:` model's RoPE `inv_freq` rounded to bf16 turned positions up to 2048 into other angles, and
its first-step gradients moved 0.298 from fp32 (0.0127 with the frequencies kept, one layer;
docs/knobs.md).
Floating-point inputs are cast to bfloat16 on the way in (a forward pre-hook: the user's batch
stays as it is) and outputs back to float32 on the way out, so the loss and the accuracy
guardrail see the dtype the user's code expects. In the default space on TPU, where a v5e chip's
Llama-class training step ran 2.25x faster with it, and in the opt-in ``torchtpu`` space on every
device (what one step cannot show, and the chip's figures: docs/knobs.md, "TorchTPU's levers").
An inference step takes it too (issue 69, item 2): bf16 weights are how a model is served, and
they halve what each forward reads where autocast reads fp32 weights and casts them every step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tpu_tuner.knobs.base import BackendLike, Knob
from tpu_tuner.knobs.capabilities import SetsComputeDtype

if TYPE_CHECKING:
    import torch
    from torch import nn

    from tpu_tuner.devices.base import Backend

DEFAULT = "default"
BFLOAT16 = "bfloat16"
_MARK = "_tpu_tune_param_dtype"  # the dtype the knob cast the model to (its hooks are installed once)


class ParamDtypeKnob(Knob, SetsComputeDtype):
    """``default`` (the parameters as the model file built them) or ``bfloat16``."""

    name = "param_dtype"
    agent = "precision"
    default = DEFAULT
    position = 36  # after autocast (30): the matmul dtype it decides is the last word
    values = (DEFAULT, BFLOAT16)
    described = "{value} parameters (and optimizer states)"

    def check(self, value: str) -> str:
        if not isinstance(value, str) or value not in self.values:
            raise ValueError(f"param_dtype must be one of {', '.join(self.values)}, not {value!r}")
        return value

    def compute_dtype(self, value: str, dtype: str, backend: Backend) -> str:
        return BFLOAT16 if value == BFLOAT16 else dtype

    def model(self, value: str, model: nn.Module, backend: BackendLike) -> nn.Module:
        if value == DEFAULT:
            return model
        import torch

        return cast_parameters(model, getattr(torch, value))

    def code(self, value: str, device_kind: str) -> list[str]:
        if value == DEFAULT:
            return []
        return [
            "from tpu_tuner.knobs.param_dtype import cast_parameters",
            f"# before the optimizer is built: its states are created in the parameters' dtype ({value})",
            f"model = cast_parameters(model, torch.{value})",
        ]

    def observe(self, model: nn.Module, forward: Callable[..., Any], backend: BackendLike) -> str | None:
        marked = getattr(model, _MARK, None)
        if marked is None:
            return DEFAULT
        floating = [p for p in model.parameters() if p.is_floating_point()]
        wanted = str(marked).removeprefix("torch.")
        return wanted if all(str(p.dtype).removeprefix("torch.") == wanted for p in floating) else None


def cast_parameters(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """`model` with its floating-point parameters and persistent buffers in `dtype` (in place),
    its non-persistent floating-point buffers as they were, taking floating-point inputs in
    `dtype` and giving floating-point outputs in float32."""
    import torch

    constants = derived_constants(model)
    try:
        model.to(dtype)  # in place: the Parameter objects stay, so an optimizer built earlier still holds them
    except RuntimeError:
        # Fake tensors (the memory estimate, execution/memory_estimate.py) refuse `_apply`'s swap
        # ("Couldn't swap Embedding.weight"); their `.data` takes the cast in place all the same.
        _cast_tensors_in_place(model, dtype)
    for name, buffer in constants.items():
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner), leaf, buffer)  # still a buffer: the name is in its table
    if getattr(model, _MARK, None) is None:
        model.register_forward_pre_hook(
            lambda _module, args, kwargs: (_cast(args, dtype), _cast(kwargs, dtype)), with_kwargs=True
        )
        model.register_forward_hook(lambda _module, _args, output: _cast(output, torch.float32))
    setattr(model, _MARK, dtype)
    return model


def derived_constants(model: nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s non-persistent floating-point buffers by qualified name: those its state dict
    leaves out (`register_buffer(..., persistent=False)`), constants derived from the config."""
    persistent = model.state_dict(keep_vars=True).keys()  # references, no copies
    return {name: b for name, b in model.named_buffers() if b.is_floating_point() and name not in persistent}


def _cast_tensors_in_place(model: nn.Module, dtype: torch.dtype) -> None:
    """Each floating-point parameter (its `.data`, the Parameter kept) and buffer of `model` in `dtype`."""
    for parameter in model.parameters():
        if parameter.is_floating_point():
            parameter.data = parameter.data.to(dtype)
    for module in model.modules():
        for name, buffer in module.named_buffers(recurse=False):
            if buffer.is_floating_point():
                setattr(module, name, buffer.to(dtype))


def _cast(value: Any, dtype: torch.dtype) -> Any:
    """`value` with every floating-point tensor in it (nested in tuples, lists, dicts) in `dtype`."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_cast(v, dtype) for v in value))
    if isinstance(value, tuple | list):
        return type(value)(_cast(v, dtype) for v in value)
    if isinstance(value, dict):
        items = {k: _cast(v, dtype) for k, v in value.items()}
        if type(value) is dict:
            return items
        try:  # a dict subclass (transformers' ModelOutput) keeps its type and attributes
            return type(value)(**items)
        except TypeError:
            return items
    return value
