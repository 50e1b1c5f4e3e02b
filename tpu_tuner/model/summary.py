"""What the parent `tpu-tune` process knows about a model file, learnt without importing it.

The parent never executes user code: a file that segfaults or calls `os._exit` at import would
take tpu-tune down with it. A worker imports and validates the file ("load" job) and sends back
a small picklable `WorkloadSummary`; the parent uses that instead of a `Workload`. A worker that
dies while importing becomes a `WorkloadError` ("the process died with SIGSEGV while importing").
See docs/run-safety.md.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpu_tuner.core.errors import UserInputError, WorkloadError

if TYPE_CHECKING:
    from tpu_tuner.runner.pool import JobResult, TrialRunner

# Importing a file is quick; a minute covers `import torch` plus a model module on a busy machine.
LOAD_TIMEOUT_S = 120.0


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

    def length_source(self) -> Any:
        """What `model.lengths.bucket_histogram` reads: ``source`` and ``sample_lengths()``
        (answered from the values the worker computed)."""
        import types

        def sample_lengths() -> tuple[int, ...]:
            if self.sample_lengths_error is not None:
                raise _SampleLengthsFailed(self.sample_lengths_error)
            return self.sample_lengths or ()

        return types.SimpleNamespace(source=self.source,
                                     sample_lengths=sample_lengths if self.has_sample_lengths else None)


class _SampleLengthsFailed(Exception):
    """sample_lengths() raised in the worker; the message is its error."""


# ---------------------------------------------------------------------------------------------
# Worker side


def summarize(state: Any, _payload: Any, options: dict[str, Any]) -> WorkloadSummary:
    """The "load" job: the worker has imported the file (WorkerState); describe it."""
    workload, backend = state.workload, state.backend
    lengths: tuple[int, ...] | None = None
    lengths_error = None
    if workload.sample_lengths is not None and options.get("sample_lengths", True):
        try:
            lengths = tuple(int(x) for x in workload.sample_lengths())
        except Exception as exc:  # noqa: BLE001 - reported where the sample is used
            lengths_error = f"{type(exc).__name__}: {exc}"
    return WorkloadSummary(
        name=workload.name, source=workload.source, convention=workload.convention,
        step_kind=workload.step_kind, is_training=workload.is_training,
        batch_size=workload.batch_size, seq_len=workload.seq_len, presets=tuple(workload.presets),
        has_sample_lengths=workload.sample_lengths is not None, sample_lengths=lengths,
        sample_lengths_error=lengths_error, device_kind=backend.kind, device_name=_device_name(backend),
        inputs=input_signature(workload, options.get("batch_size"), options.get("seq_len")),
        notes=list(workload.notes),
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
            batch = workload.make_batch(batch_size if batch_size is not None else workload.batch_size,
                                        seq_len if seq_len is not None else workload.seq_len)
    except UserInputError:
        raise  # e.g. --seq-len on a benchmark-style file: refused now, not after profiling
    except Exception:  # noqa: BLE001 - not describable on meta; the profile will show the shapes
        return None
    return leaf(batch)


def _device_name(backend: Any) -> str:
    """The device's marketing name, without probing its peak (Backend.info() may)."""
    try:
        if backend.kind == "cpu":
            from tpu_tuner.core.host import cpu_model_name

            return cpu_model_name()
        if backend.kind == "cuda":
            import torch

            return str(torch.cuda.get_device_name(backend.device))
        if backend.kind == "tpu":
            import torch

            return str(torch.tpu.get_device_name())  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a name is nice to have, never worth failing for
        pass
    return backend.kind


# ---------------------------------------------------------------------------------------------
# Parent side


def load_summary(runner: TrialRunner, model_file: str | Path, batch_size: int | None = None,
                 seq_len: int | None = None, sample_lengths: bool = True) -> WorkloadSummary:
    """Import and validate `model_file` in `runner`'s worker; raise `WorkloadError` for a bad
    file, including one whose import kills the process."""
    result = runner.run("load", None, {"batch_size": batch_size, "seq_len": seq_len, "sample_lengths": sample_lengths},
                        timeout_s=max(LOAD_TIMEOUT_S, runner.timeout_s))
    if result.ok:
        return result.value
    raise load_failure(result, model_file)


def load_failure(result: JobResult, model_file: str | Path) -> UserInputError:
    """The error a failed "load" job means, naming the file."""
    failure = result.failure
    assert failure is not None
    if failure.kind == "refused":  # the loader's own WorkloadError/UserInputError, already naming the file
        return WorkloadError(failure.message)
    code = result.exit_code
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return WorkloadError(f"the process died with {name} while importing", model_file)
    if code is not None:
        return WorkloadError(f"the process exited with status {code} while importing", model_file)
    if failure.kind == "timeout":
        return WorkloadError(f"importing took longer than {LOAD_TIMEOUT_S:.0f} s ({failure.message})", model_file)
    return WorkloadError(f"error while importing: {failure.message}", model_file)


__all__ = ["WorkloadSummary", "input_signature", "load_failure", "load_summary", "summarize"]
