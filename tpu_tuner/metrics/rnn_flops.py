"""FLOP formulas for the fused recurrent kernels that torch's FLOP counter cannot see.

On CPU, ``nn.LSTM`` runs as one ``aten::mkldnn_rnn_layer`` per layer and direction; on CUDA,
LSTM, GRU and RNN (tanh / relu) run as one ``aten::_cudnn_rnn`` for the whole stack. Torch's
registry has no formula for either, so a step made of them counted (almost) zero FLOPs.

Convention (the one FlopCounterMode uses for ``nn.Linear``): matmul FLOPs only, ``2 m n k`` per
GEMM; gate nonlinearities, biases and elementwise cell updates are not counted. Every recurrent
weight matrix multiplies every token once, so one layer and direction does ``2 * tokens *
(|W_ih| + |W_hh| + |W_hr|)`` FLOPs forward (``|W|`` its element count; ``W_hr`` is the LSTM
projection). Backward computes the weight gradients (the forward figure again) and the data
gradients (the forward figure again), except the ones autograd does not ask for, exactly as the
decomposed (unfused) path computes them: no input gradient for a first-layer input that needs
none, and no gradient of the initial hidden state at the first time step when it needs none.
So the fused and the decomposed path of the same module count the same FLOPs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

aten = torch.ops.aten


def _tokens(input: torch.Tensor) -> int:
    """Time steps x batch: a (T, B, F) / (B, T, F) input or a packed (sum(batch_sizes), F) one."""
    return input.numel() // input.shape[-1] if input.shape[-1] else 0


def _initial_rows(hx: torch.Tensor) -> int:
    """Rows of the initial hidden state of one layer and direction (the batch size)."""
    return hx.numel() // hx.shape[-1] if hx.dim() and hx.shape[-1] else 0


def _raw(formula: Any) -> Any:
    # FlopCounterMode hands a custom formula shapes unless it is marked raw; these need the
    # tensors themselves (weights lists, requires_grad of the saved input and state).
    formula._get_raw = True
    return formula


@_raw
def mkldnn_rnn_layer_flops(
    input: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, *args: Any, out_val: Any = None, **kwargs: Any
) -> int:
    """``aten::mkldnn_rnn_layer``: one layer, one direction of an LSTM on CPU (no projections)."""
    return 2 * _tokens(input) * (w_ih.numel() + w_hh.numel())


@_raw
def mkldnn_rnn_layer_backward_flops(
    input: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    b_ih: torch.Tensor,
    b_hh: torch.Tensor,
    hx: torch.Tensor,
    *args: Any,
    out_val: Any = None,
    **kwargs: Any,
) -> int:
    """``aten::mkldnn_rnn_layer_backward``: weight and data gradients of one layer and direction."""
    return _backward(
        _tokens(input),
        _initial_rows(hx),
        [(w_ih, w_hh, None)],
        input_grad=input.requires_grad,
        state_grad=hx.requires_grad,
    )


def _layer_weights(weights: Sequence[torch.Tensor], stride: int) -> list[tuple[Any, Any, Any]]:
    """(W_ih, W_hh, W_hr or None) of each layer and direction from cuDNN's flat weight list.

    Per layer and direction cuDNN takes `stride` tensors: W_ih, W_hh, then the biases if any,
    then W_hr if the LSTM projects; the biases are the 1-D ones.
    """
    groups = []
    for start in range(0, len(weights), stride):
        matrices = [w for w in weights[start : start + stride] if w.dim() == 2]
        groups.append((matrices[0], matrices[1], matrices[2] if len(matrices) > 2 else None))
    return groups


def _forward(tokens: int, groups: list[tuple[Any, Any, Any]]) -> int:
    return sum(2 * tokens * sum(w.numel() for w in group if w is not None) for group in groups)


def _backward(
    tokens: int,
    initial_rows: int,
    groups: list[tuple[Any, Any, Any]],
    input_grad: bool,
    state_grad: bool,
    weight_grad: bool = True,
    directions: int = 1,
) -> int:
    """Data gradients plus weight gradients; see the module docstring for what is left out.

    `groups` lists the layers' directions in order, so the first `directions` read the input.
    """
    forward = _forward(tokens, groups)
    data = forward
    if not input_grad:
        data -= sum(2 * tokens * w_ih.numel() for w_ih, _, _ in groups[:directions])
    if not state_grad:
        # The first step's recurrent matmul of every layer and direction reads the initial state.
        data -= sum(2 * initial_rows * w_hh.numel() for _, w_hh, _ in groups)
    return data + (forward if weight_grad else 0)


@_raw
def cudnn_rnn_flops(
    input: torch.Tensor,
    weight: Sequence[torch.Tensor],
    weight_stride0: int,
    *args: Any,
    out_val: Any = None,
    **kwargs: Any,
) -> int:
    """``aten::_cudnn_rnn``: every layer and direction of an LSTM / GRU / RNN on CUDA."""
    return _forward(_tokens(input), _layer_weights(weight, weight_stride0))


@_raw
def cudnn_rnn_backward_flops(
    input: torch.Tensor,
    weight: Sequence[torch.Tensor],
    weight_stride0: int,
    weight_buf: Any,
    hx: torch.Tensor,
    cx: Any,
    output: Any,
    grad_output: Any,
    grad_hy: Any,
    grad_cy: Any,
    mode: int,
    hidden_size: int,
    proj_size: int,
    num_layers: int,
    batch_first: bool,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_sizes: Any,
    dropout_state: Any,
    reserve: Any,
    output_mask: Sequence[bool],
    out_val: Any = None,
) -> int:
    """``aten::_cudnn_rnn_backward``; `output_mask` says which gradients autograd asked for:
    (input, hx, cx, weights)."""
    groups = _layer_weights(weight, weight_stride0)
    # hx is (layers * directions, batch, hidden): one layer's initial rows are the batch.
    rows = hx.shape[-2] if hx.dim() >= 2 else 0
    return _backward(
        _tokens(input),
        rows,
        groups,
        input_grad=bool(output_mask[0]),
        state_grad=bool(output_mask[1]),
        weight_grad=bool(output_mask[3]),
        directions=2 if bidirectional else 1,
    )


RNN_FLOP_FORMULAS: dict[Any, Any] = {
    aten.mkldnn_rnn_layer: mkldnn_rnn_layer_flops,
    aten.mkldnn_rnn_layer_backward: mkldnn_rnn_layer_backward_flops,
    aten._cudnn_rnn: cudnn_rnn_flops,
    aten._cudnn_rnn_backward: cudnn_rnn_backward_flops,
}
