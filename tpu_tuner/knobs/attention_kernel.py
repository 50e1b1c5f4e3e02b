"""The `attention_kernel` knob: TorchTPU's splash attention in place of torch's SDPA.

torch-tpu 0.2.0's ``torch.tpu.ops.splash_sdpa`` (``_internal/ops/splash_attention.py``: JAX's
Pallas splash-attention kernel, with a backward; every block size 512 by default) takes
``(q, k, v)`` of shape (batch, heads, length, head_dim), ``scale``, ``is_causal`` and
``enable_gqa``, and no mask or dropout. So the knob replaces
``torch.nn.functional.scaled_dot_product_attention`` with a function that serves the calls it can
(no ``attn_mask``, no dropout, 4-D, as many keys as queries, on the step's device) and passes every
other call to torch's own, unchanged. Values: ``default`` (torch's SDPA), ``splash`` (torch-tpu's
block sizes) and ``splash:N`` (every block of the forward and the backward N; a multiple of 128,
the TPU's lane width). A context around each step (`StepContext`), one function object per block
size so that dynamo's guard holds; why, and what a v5e chip showed of the block sizes:
docs/knobs.md, "TorchTPU's levers". Offered only where the model calls SDPA
(`WorkloadTraits.scaled_dot_product_attention`); in the opt-in ``torchtpu`` space only. A
transformers model, which hands SDPA a materialised causal mask whenever it is compiled, is
switched to an implementation that leaves a plain causal mask to ``is_causal``
(`model/workloads/hf_causal_mask.py`): without it no compiled call of it reaches the kernel.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Iterator
from functools import cache
from typing import TYPE_CHECKING, Any

from tpu_tuner.knobs.base import BackendLike, Knob
from tpu_tuner.knobs.capabilities import NarrowedByWorkload, StepContext
from tpu_tuner.model.workloads.hf_causal_mask import CAUSAL_SDPA, leave_causal_mask_to_kernel

if TYPE_CHECKING:
    from torch import nn

    from tpu_tuner.knobs.traits import WorkloadTraits

DEFAULT = "default"
SPLASH = "splash"
LANE = 128  # TPU vector lane width: block sizes are multiples of it
NO_JAX = "JAX is not installed (torch-tpu's splash_sdpa runs JAX's kernel: pip install 'tpu-tune[tpu]')"
TORCH_TPU_BLOCK = 512  # splash_sdpa's default for every block
MAX_BLOCK = 8192
# splash_sdpa's block-size keywords, each set to the value's N (the forward's and the backward's).
BLOCK_KEYWORDS = ("block_q", "block_kv", "block_kv_compute", "block_q_dkv", "block_kv_dkv", "block_kv_dkv_compute")
_VALUE_ATTR = "_tpu_tune_attention_kernel"  # on the installed function: the value it serves


class AttentionKernelKnob(Knob, NarrowedByWorkload, StepContext):
    """``default``, ``splash`` or ``splash:N`` (TorchTPU only)."""

    name = "attention_kernel"
    agent = "compile"
    default = DEFAULT
    position = 16
    device_kinds = ("tpu",)
    described = "{value} attention"
    not_applicable = "the model calls no torch.nn.functional.scaled_dot_product_attention"

    def check(self, value: str) -> str:
        if not isinstance(value, str):
            raise ValueError(f"attention_kernel must be a string, not {type(value).__name__}")
        if value in (DEFAULT, SPLASH):
            return value
        head, _, size = value.partition(":")
        if head != SPLASH or not size.isdigit() or int(size) % LANE or not LANE <= int(size) <= MAX_BLOCK:
            raise ValueError(
                f"attention_kernel must be {DEFAULT}, {SPLASH} or {SPLASH}:N with N a multiple of {LANE} "
                f"up to {MAX_BLOCK}, not {value!r}"
            )
        return SPLASH if int(size) == TORCH_TPU_BLOCK else f"{SPLASH}:{int(size)}"  # 512 is torch-tpu's own

    def applies_to_workload(self, traits: WorkloadTraits) -> bool:
        return traits.scaled_dot_product_attention

    def choice_refusal(self, value: str, traits: WorkloadTraits) -> str | None:
        # splash_sdpa imports JAX's Pallas kernel: without JAX every splash trial would fail.
        return NO_JAX if importlib.util.find_spec("jax") is None else None

    def model(self, value: str, model: nn.Module, backend: BackendLike) -> nn.Module:
        return model if value == DEFAULT else leave_causal_mask_to_kernel(model)

    def step(self, value: str, backend: BackendLike) -> contextlib.AbstractContextManager[Any]:
        return splash_attention(block(value), backend.kind) if value != DEFAULT else contextlib.nullcontext()

    def step_code(self, value: str, device_kind: str) -> str | None:
        return None if value == DEFAULT else f'splash_attention({block(value)}, "{device_kind}")'

    def code(self, value: str, device_kind: str) -> list[str]:
        if value == DEFAULT:
            return []
        return [
            "from tpu_tuner.knobs.attention_kernel import splash_attention",
            "from tpu_tuner.model.workloads.hf_causal_mask import leave_causal_mask_to_kernel",
            "model = leave_causal_mask_to_kernel(model)  # a transformers model: its causal mask left to the kernel",
        ]

    def observe(self, model: nn.Module, forward: Callable[..., Any], backend: BackendLike) -> str | None:
        import torch

        return getattr(torch.nn.functional.scaled_dot_product_attention, _VALUE_ATTR, DEFAULT)


def block(value: str) -> int | None:
    """The block size of a checked value (None: torch-tpu's defaults)."""
    _, _, size = value.partition(":")
    return int(size) if size else None


@contextlib.contextmanager
def splash_attention(block_size: int | None = None, device_type: str = "tpu") -> Iterator[None]:
    """``torch.nn.functional.scaled_dot_product_attention`` served by TorchTPU's splash kernel
    (blocks of `block_size`; None: torch-tpu's) for the calls it can serve on `device_type`
    tensors, for a block; torch's own again after it."""
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _replacement(original, block_size, device_type)
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


@cache
def _replacement(original: Callable[..., Any], block_size: int | None, device_type: str) -> Callable[..., Any]:
    """One function per (torch's SDPA, block size, device), so dynamo's guard on it holds."""
    blocks = {} if block_size is None else dict.fromkeys(BLOCK_KEYWORDS, block_size)
    # The kernel's backward, like its forward, traces other strides than it returns, so a reshape of
    # its gradient traced as a view fails: the gradients of q, k and v are copied to a plain layout.
    contiguous_gradient = _contiguous_gradient_function()

    def scaled_dot_product_attention(
        query: Any,
        key: Any,
        value: Any,
        attn_mask: Any = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Any:
        servable = (
            attn_mask is None
            and dropout_p == 0.0
            and query.dim() == key.dim() == value.dim() == 4
            and query.shape[-2] == key.shape[-2]
            and query.device.type == device_type
            and (query.shape[1] != key.shape[1]) == bool(enable_gqa)  # torch's own raises otherwise
        )
        if not servable:
            return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        import torch

        query, key, value = (
            contiguous_gradient.apply(query),
            contiguous_gradient.apply(key),
            contiguous_gradient.apply(value),
        )
        out = torch.tpu.ops.splash_sdpa(  # type: ignore[attr-defined]  # torch.tpu: torch-tpu's
            query, key, value, scale=scale, is_causal=is_causal, enable_gqa=bool(enable_gqa), **blocks
        )
        # Under `tpu` compile the kernel's traced strides differ from its real output's, so a caller's
        # transpose + reshape traced as a view fails at run time (chip, 2026-12-07); a copy agrees.
        return out.clone(memory_format=torch.contiguous_format)

    label = SPLASH if block_size in (None, TORCH_TPU_BLOCK) else f"{SPLASH}:{block_size}"
    setattr(scaled_dot_product_attention, _VALUE_ATTR, label)
    return scaled_dot_product_attention


@cache
def _contiguous_gradient_function() -> Any:
    """One autograd function (dynamo traces a module-level class, not one made per call)."""
    import torch

    class ContiguousGradient(torch.autograd.Function):
        # forward and setup_context apart: the style torch.func's transforms (a whole step traced
        # with torch.func.grad) accept; a forward taking ctx is refused there.
        @staticmethod
        def forward(x: Any) -> Any:
            return x.view_as(x)

        @staticmethod
        def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
            pass  # the backward needs nothing saved

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad.clone(memory_format=torch.contiguous_format)

    return ContiguousGradient


# torch modules whose forward reaches SDPA through torch.nn.functional (multi_head_attention_forward).
_TORCH_SDPA_MODULES = ("MultiheadAttention",)


def calls_sdpa(model: nn.Module) -> bool:
    """Whether `model`'s code calls ``scaled_dot_product_attention``: read from the source of its
    modules' classes (any method: attention is often a helper of the block), torch's attention
    modules, and a transformers model that runs its ``sdpa`` attention. A call hidden in a
    function outside the classes is not seen (the knob is then not offered)."""
    import inspect

    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) in ("sdpa", CAUSAL_SDPA):
        return True
    for kind in {type(module) for module in model.modules()}:
        if kind.__name__ in _TORCH_SDPA_MODULES and kind.__module__.startswith("torch.nn"):
            return True
        if kind.__module__.startswith("torch."):
            continue  # torch's own layers: only the ones above call it
        try:
            source = inspect.getsource(kind)
        except (OSError, TypeError):  # defined in a string or C: nothing to read
            continue
        if "scaled_dot_product_attention" in source:
            return True
    return False
