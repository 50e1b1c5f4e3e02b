"""What the parent `tpu-tune` process knows about a model file, learnt without importing it.

The parent never executes user code: a file that segfaults or calls `os._exit` at import would
take tpu-tune down with it. A worker imports and validates the file (the load job,
`runner/load.py`) and sends back a small picklable `WorkloadSummary`; the parent uses that instead
of a `Workload`. See docs/run-safety.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.model.workloads.input_dims import InputDims, read_dims


@dataclass(frozen=True)
class WorkloadSummary:
    """A loaded workload's facts, without its functions (picklable, safe in the parent)."""

    name: str
    source: Path
    convention: str  # "native" | "benchmark"
    step_kind: str  # "training step" | "inference (forward)"
    is_training: bool
    batch_size: int | None
    seq_len: int | None
    presets: tuple[str, ...] = ()
    has_sample_lengths: bool = False
    # sample_lengths() evaluated in the worker (None when the file has none or it failed).
    sample_lengths: tuple[int, ...] | None = None
    sample_lengths_error: str | None = None
    device_kind: str = ""
    device_name: str = ""
    # The inputs of one batch at the run's options, as [[shape...], dtype] leaves; None when
    # they could not be made on the meta device (see input_signature).
    inputs: list[Any] | None = None
    notes: list[str] = field(default_factory=list)
    # Which input sizes are the batch and the sequence, as the file declares them (model/workloads/input_dims.py);
    # None where they could not be read.
    dims: InputDims | None = None

    def length_source(self) -> Any:
        """What `model.buckets.lengths.bucket_histogram` reads: ``source`` and ``sample_lengths()``
        (answered from the values the worker computed)."""
        import types

        def sample_lengths() -> tuple[int, ...]:
            if self.sample_lengths_error is not None:
                raise _SampleLengthsFailed(self.sample_lengths_error)
            return self.sample_lengths or ()

        return types.SimpleNamespace(
            source=self.source, sample_lengths=sample_lengths if self.has_sample_lengths else None
        )


class _SampleLengthsFailed(Exception):
    """sample_lengths() raised in the worker; the message is its error."""


def summarize(
    workload: Any, backend: Any, batch_size: int | None, seq_len: int | None, sample_lengths: bool = True
) -> WorkloadSummary:
    """The load job, in the worker that imported the file: describe `workload` on `backend`,
    its inputs at `batch_size` x `seq_len`, and its sample_lengths() when `sample_lengths`."""
    lengths: tuple[int, ...] | None = None
    lengths_error = None
    if workload.sample_lengths is not None and sample_lengths:
        try:
            lengths = tuple(int(x) for x in workload.sample_lengths())
        except Exception as exc:
            lengths_error = f"{type(exc).__name__}: {exc}"
    inputs = input_signature(workload, batch_size, seq_len)
    try:
        dims: InputDims | None = read_dims(workload, inputs, (batch_size, seq_len))
    except Exception:  # the header's words are never worth failing a load for
        dims = None
    return WorkloadSummary(
        name=workload.name,
        source=workload.source,
        convention=workload.convention,
        step_kind=workload.step_kind,
        is_training=workload.is_training,
        batch_size=workload.batch_size,
        seq_len=workload.seq_len,
        presets=tuple(workload.presets),
        has_sample_lengths=workload.sample_lengths is not None,
        sample_lengths=lengths,
        sample_lengths_error=lengths_error,
        device_kind=backend.kind,
        device_name=device_name_or_kind(backend),
        inputs=inputs,
        notes=list(workload.notes),
        dims=dims,
    )


def input_signature(workload: Any, batch_size: int | None, seq_len: int | None) -> list[Any] | None:
    """Shapes and dtypes of one batch, made on the meta device (no memory, no compute: files
    whose inputs need many GB are described in milliseconds). None when the file's batch
    cannot be made there (it calls something that needs real data)."""
    import torch

    def leaf(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return [list(value.shape), str(value.dtype).removeprefix("torch.")]
        if isinstance(value, (list, tuple)):
            return [leaf(v) for v in value]
        if isinstance(value, dict):
            return {str(k): leaf(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
        return type(value).__name__ if not isinstance(value, (int, float, bool, str)) else value

    try:
        with torch.device("meta"):
            batch = workload.make_batch(
                batch_size if batch_size is not None else workload.batch_size,
                seq_len if seq_len is not None else workload.seq_len,
            )
    except UserInputError:
        raise  # e.g. --seq-len on a benchmark-style file: refused now, not after profiling
    except Exception:
        return None
    return leaf(batch)


def device_name_or_kind(backend: Any) -> str:
    """The device's name (`Backend.device_name`, which measures nothing), else its kind: a report
    names what it measured, and a backend that cannot name its device still measured."""
    try:
        return str(backend.device_name())
    except Exception:
        return str(backend.kind)


__all__ = ["WorkloadSummary", "device_name_or_kind", "input_signature", "summarize"]
