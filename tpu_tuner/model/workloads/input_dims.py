"""Which sizes of a workload's inputs are its batch and its sequence, and how that was decided.

The sizes are said from what the workload itself declares, each with where it came from (not
dimension 0 of a benchmark file's first input, the sequence of a recurrent model without
``batch_first``: issue 55, docs/tuning.md, "Reading a run"):

* a native file declares ``BATCH_SIZE`` (and ``SEQ_LEN``), or the run's ``--batch-size`` /
  ``--seq-len`` replaced them: "batch 8 (BATCH_SIZE), seq 128 (SEQ_LEN)";
* a benchmark file's first input is read against the file's own module-level sizes
  (``batch_size``, ``seq_len``, ``sequence_length``, ...: KernelBench declares them): a size is
  placed at the one dimension of that size; where none or several fit, the model's first
  recurrent layer (``nn.RNN``/``LSTM``/``GRU``) places a 3-D input's batch and sequence by its
  ``batch_first``; what neither decides is not claimed: "first input dims (512, 10, 64)".

`read_dims` runs in the worker that imported the file (the parent never does); `recorded_dims` is
what a parent can say from a run's stored facts alone (its convention, sizes and input shapes).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

# Module-level names a benchmark file declares its sizes by, in the order they are looked up.
BATCH_NAMES = ("batch_size", "BATCH_SIZE", "batch", "BATCH")
SEQ_NAMES = ("seq_len", "SEQ_LEN", "sequence_length", "SEQUENCE_LENGTH", "seq_length", "SEQ_LENGTH")
INTEGER_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "long", "int")


@dataclass(frozen=True)
class SizeOf:
    """One size of the step: its value, the first input's dimension holding it (None: not one of
    its dimensions, or a native file's declared size) and how it was decided, in words."""

    size: int
    dim: int | None
    how: str


@dataclass(frozen=True)
class InputDims:
    """The step's batch and sequence where they are known, and the first input's shape."""

    first_input: tuple[int, ...] | None = None
    batch: SizeOf | None = None
    seq: SizeOf | None = None

    def describe(self) -> str:
        """The header's words: "batch 8 (BATCH_SIZE), seq 128 (SEQ_LEN)", "first input (512, 10,
        128): batch 10 at dim 1 (the file's batch_size), ...", or "first input dims (512, 10, 64)"."""
        sizes = [(label, s) for label, s in (("batch", self.batch), ("seq", self.seq)) if s is not None]
        said = ", ".join(
            f"{label} {s.size}" + (f" at dim {s.dim}" if s.dim is not None else "") + f" ({s.how})"
            for label, s in sizes
        )
        shape = _shape(self.first_input) if self.first_input is not None else None
        if not sizes:
            return f"first input dims {shape}" if shape is not None else ""
        placed = any(s.dim is not None for _, s in sizes)
        return f"first input {shape}: {said}" if placed and shape is not None else said

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InputDims:
        """From `to_dict`'s form (profile.json); KeyError/TypeError when malformed."""

        def size(value: Any) -> SizeOf | None:
            return None if value is None else SizeOf(int(value["size"]), value.get("dim"), str(value["how"]))

        first = data.get("first_input")
        return cls(
            None if first is None else tuple(int(d) for d in first), size(data.get("batch")), size(data.get("seq"))
        )


def first_input_shape(signature: Any) -> tuple[int, ...] | None:
    """The shape of the first tensor in an input signature (`summary.input_signature`'s
    ``[[shape...], dtype]`` leaves, nested in lists and dicts); None where there is none."""
    found = _first_leaf(signature)
    return None if found is None else tuple(found[0])


def recorded_dims(
    convention: str,
    batch_size: int | None,
    seq_len: int | None,
    signature: Any = None,
    requested: tuple[int | None, int | None] = (None, None),
) -> InputDims:
    """What can be said without the file: a native file's declared sizes (`requested`: the run's
    --batch-size and --seq-len, which replace them), else the first input's dims, no batch claimed."""
    first = first_input_shape(signature)
    if convention != "native":
        return InputDims(first)
    flag_batch, flag_seq = requested
    batch = None if batch_size is None else SizeOf(batch_size, None, "--batch-size" if flag_batch else "BATCH_SIZE")
    seq = None if seq_len is None else SizeOf(seq_len, None, "--seq-len" if flag_seq else "SEQ_LEN")
    return InputDims(first, batch, seq)


def read_dims(workload: Any, signature: Any, requested: tuple[int | None, int | None] = (None, None)) -> InputDims:
    """The module's rules on a loaded `workload` (in the worker that imported it), whose one batch
    has the input signature `signature`; `requested`: the run's --batch-size and --seq-len."""
    if workload.convention == "native":
        batch_size = requested[0] if requested[0] is not None else workload.batch_size
        seq_len = requested[1] if requested[1] is not None else workload.seq_len
        return recorded_dims("native", batch_size, seq_len, signature, requested)
    leaf = _first_leaf(signature)
    if leaf is None:
        return InputDims()
    shape, dtype = tuple(int(d) for d in leaf[0]), str(leaf[1])
    model = _meta_model(workload)
    declared = _declared(model)
    recurrent = _recurrent(model, shape, dtype)
    sizes: list[SizeOf | None] = []
    for which, names in ((0, BATCH_NAMES), (1, SEQ_NAMES)):
        name, value = next(((n, declared[n]) for n in names if n in declared), (None, None))
        fits = [d for d, size in enumerate(shape) if size == value] if value is not None else []
        if len(fits) == 1:
            sizes.append(SizeOf(shape[fits[0]], fits[0], f"the file's {name}"))
        elif recurrent is not None and all(s is None or s.dim != recurrent[0][which] for s in sizes):
            dim = recurrent[0][which]
            sizes.append(SizeOf(shape[dim], dim, recurrent[1]))
        else:
            sizes.append(None)
    return InputDims(shape, *sizes)


def _first_leaf(signature: Any) -> tuple[list[int], str] | None:
    """The first ``[[shape...], dtype]`` leaf of a tensor of one dimension or more."""
    if isinstance(signature, list) and len(signature) == 2 and isinstance(signature[1], str):
        shape = signature[0]
        if isinstance(shape, list) and shape and all(isinstance(d, int) for d in shape):
            return shape, signature[1]
        return None
    values = signature.values() if isinstance(signature, dict) else signature if isinstance(signature, list) else ()
    return next((leaf for value in values if (leaf := _first_leaf(value)) is not None), None)


def _meta_model(workload: Any) -> Any:
    """The workload's model built on the meta device (no memory, no compute), or None where it
    cannot be built there."""
    import torch

    try:
        with torch.device("meta"):
            return workload.build_model()
    except Exception:
        return None


def _declared(model: Any) -> dict[str, int]:
    """The positive integers the file declares at module level under the module's names: read
    from the module that defines the model's class (a benchmark file's ``Model``)."""
    module = sys.modules.get(type(model).__module__) if model is not None else None
    found = {}
    for name in (*BATCH_NAMES, *SEQ_NAMES):
        value = getattr(module, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            found[name] = value
    return found


def _recurrent(model: Any, shape: tuple[int, ...], dtype: str) -> tuple[tuple[int, int], str] | None:
    """((batch dim, sequence dim), why) of the first input by the model's first recurrent layer,
    where one decides: a 3-D input, or a 2-D one of token ids (an embedding before the layer)."""
    if model is None:
        return None
    from torch import nn

    layer = next((m for m in model.modules() if isinstance(m, nn.RNNBase)), None)
    tokens = len(shape) == 2 and dtype in INTEGER_DTYPES
    if layer is None or not (len(shape) == 3 or tokens):
        return None
    kind = f"nn.{type(layer).__name__}"
    if layer.batch_first:
        return (0, 1), f"{kind} with batch_first takes (batch, seq{'' if tokens else ', features'})"
    return (1, 0), f"{kind} without batch_first takes (seq, batch{'' if tokens else ', features'})"


def _shape(dims: Sequence[int]) -> str:
    return f"({', '.join(str(d) for d in dims)}{',' if len(dims) == 1 else ''})"


__all__ = ["InputDims", "SizeOf", "first_input_shape", "read_dims", "recorded_dims"]
