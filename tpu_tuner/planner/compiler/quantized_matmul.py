"""The decoder blocks' linear layers compiled as 8-bit matmuls: `--quantization int8|fp8`.

What MaxText runs (src/maxtext/layers/quantizations.py at
https://github.com/AI-Hypercomputer/maxtext/blob/e591f30cbbf217ed67ef71263ec0538239f9c3b8/src/maxtext/layers/quantizations.py):

* ``int8`` (AQT, `_get_int8_quant_config`): the forward dot and both backward dots (the gradient
  of the activations, "dlhs", and of the weights, "drhs", the latter whenever
  quantization_local_shard_count is not 0, and it defaults to the device count) run as int8 x int8
  with int32 accumulation, scaled per channel by the absolute maximum (AQT's default calibration);
* ``fp8_full`` (Qwix, `_get_fp8_full_qwix_config`): activations and weights in float8_e4m3fn,
  both gradients in float8_e5m2, absmax scales.

The logits matmul stays bf16 in both ("We do not quantize the logits matmul", decoders.py), and so
here: only `F.linear` calls made inside a decoder block are replaced (`BlockScope`). Each is a
`jax.custom_vjp` whose forward and both backward dots take 8-bit operands, so the compiled program
holds s8 (or f8e4m3fn / f8e5m2) dots, and its FLOPs, bytes and memory are those of the quantized
step. The planner never runs the program, so scales are exact absmax per channel (AQT's local
per-shard scales for the weight gradient change the numbers, not the dots' types or sizes).
"""

from __future__ import annotations

from typing import Any

from torch import nn

QUANTIZATIONS = ("int8", "fp8")


class BlockScope:
    """Whether the model is inside a decoder block while it is traced (a depth counter that
    forward pre-hooks and hooks on every block raise and lower)."""

    def __init__(self) -> None:
        self.depth = 0

    @property
    def inside(self) -> bool:
        return self.depth > 0

    def watch(self, blocks: list[nn.Module]) -> None:
        """Count `blocks`' forward calls (unrolled blocks, or the one template the scan calls)."""

        def enter(module: nn.Module, args: Any) -> None:
            self.depth += 1

        def leave(module: nn.Module, args: Any, output: Any) -> None:
            self.depth -= 1

        for block in blocks:
            block.register_forward_pre_hook(enter)
            block.register_forward_hook(leave)


def _dtypes(quantization: str) -> tuple[Any, Any, Any, Any]:
    """(forward operands' dtype, gradients' dtype, accumulator dtype, largest representable value
    of each operand dtype as a dict)."""
    import jax.numpy as jnp

    if quantization == "int8":
        return jnp.int8, jnp.int8, jnp.int32, {jnp.dtype(jnp.int8): 127.0}
    if quantization == "fp8":
        return (
            jnp.float8_e4m3fn,
            jnp.float8_e5m2,
            jnp.float32,
            {jnp.dtype(jnp.float8_e4m3fn): 448.0, jnp.dtype(jnp.float8_e5m2): 57344.0},
        )
    raise ValueError(f"unknown quantization {quantization!r}: one of {', '.join(QUANTIZATIONS)}")


def quantized_dot(quantization: str) -> Any:
    """``y = x @ w.T`` (x [..., in], w [out, in]) with 8-bit operands in the forward dot and in
    both backward dots, per-channel absmax scales, and results in x's / w's dtypes."""
    import jax
    import jax.numpy as jnp

    forward_dtype, grad_dtype, accumulate, largest = _dtypes(quantization)

    def quantize(t: Any, axes: tuple[int, ...], dtype: Any) -> tuple[Any, Any]:
        # One scale per channel: the absolute maximum over the contraction axes maps to the
        # largest value the 8-bit type holds.
        wide = t.astype(jnp.float32)
        amax = jnp.max(jnp.abs(wide), axis=axes, keepdims=True)
        scale = jnp.where(amax > 0, amax / largest[jnp.dtype(dtype)], 1.0)
        scaled = wide / scale
        if jnp.issubdtype(dtype, jnp.integer):
            scaled = jnp.clip(jnp.round(scaled), -127, 127)
        return scaled.astype(dtype), scale

    def dot(a: Any, b: Any, contract_a: tuple[int, ...], contract_b: tuple[int, ...]) -> Any:
        out = jax.lax.dot_general(a, b, ((contract_a, contract_b), ((), ())), preferred_element_type=accumulate)
        return out.astype(jnp.float32)

    @jax.custom_vjp
    def linear(x: Any, w: Any) -> Any:
        return _forward(x, w)[0]

    def _forward(x: Any, w: Any) -> tuple[Any, Any]:
        xq, xs = quantize(x, (x.ndim - 1,), forward_dtype)  # a scale per token
        wq, ws = quantize(w, (1,), forward_dtype)  # a scale per output channel
        y = dot(xq, wq, (x.ndim - 1,), (1,)) * xs * ws[:, 0]
        return y.astype(x.dtype), (x, w)

    def _backward(residuals: Any, g: Any) -> tuple[Any, Any]:
        x, w = residuals
        lead = tuple(range(x.ndim - 1))
        # dlhs: dx = g @ w, contracting the output channels.
        gq, gs = quantize(g, (g.ndim - 1,), grad_dtype)
        wq, ws = quantize(w, (0,), forward_dtype)
        dx = dot(gq, wq, (g.ndim - 1,), (0,)) * gs * ws[0]
        # drhs: dw = g^T @ x, contracting the tokens (every leading axis).
        gq, gs = quantize(g, lead, grad_dtype)
        xq, xs = quantize(x, lead, forward_dtype)
        dw = dot(gq, xq, lead, lead) * gs.reshape(-1, 1) * xs.reshape(1, -1)
        return dx.astype(x.dtype), dw.astype(w.dtype)

    linear.defvjp(_forward, _backward)
    return linear


def install_quantized_linear(env: Any, quantization: str, scope: BlockScope) -> None:
    """Replace `F.linear` in torchax's environment: inside a decoder block (`scope`) with the
    quantized dot, elsewhere (the output head, MaxText's unquantized logits) as torch defines it."""
    import jax.numpy as jnp
    import torch.nn.functional as F
    from torchax.interop import jax_view, torch_view

    dot = quantized_dot(quantization)

    def linear(input, weight, bias=None):
        x, w = jax_view(input), jax_view(weight)
        y = dot(x, w) if scope.inside else jnp.einsum("...i,oi->...o", x, w)
        if bias is not None:
            y = y + jax_view(bias)
        return torch_view(y)

    env.override_op_definition(F.linear, linear)


__all__ = ["QUANTIZATIONS", "BlockScope", "install_quantized_linear", "quantized_dot"]
