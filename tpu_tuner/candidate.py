"""A `Candidate`: a frozen, serialisable description of *how* to run a workload.

It names abstract knobs; each backend maps them onto its device's real settings. The profiler
runs one candidate (the default is the untuned baseline: eager, fp32 "highest", no autocast).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

MATMUL_PRECISIONS = ("highest", "high", "medium")
EAGER_MODES = ("strict", "debug", "defer_and_fuse")
AUTOCAST_DTYPES = ("bfloat16", "float16")


@dataclass(frozen=True)
class Candidate:
    """How to run: eager mode, compile settings and precision.

    * ``eager_mode``: TorchTPU's execution mode (strict, debug, defer_and_fuse); ignored off TPU.
    * ``compile_backend``: None for eager, else a ``torch.compile`` backend name
      ("inductor", "aot_eager", "tpu", ...); ``compile_mode`` its mode ("default",
      "max-autotune", ...).
    * ``matmul_precision``: ``torch.set_float32_matmul_precision`` value.
    * ``autocast_dtype``: None, or the dtype of ``torch.autocast``.
    """

    eager_mode: str = "strict"
    compile_backend: str | None = None
    compile_mode: str | None = None
    matmul_precision: str = "highest"
    autocast_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(f"matmul_precision must be one of {MATMUL_PRECISIONS}")
        if self.eager_mode not in EAGER_MODES:
            raise ValueError(f"eager_mode must be one of {EAGER_MODES}")
        if self.autocast_dtype is not None and self.autocast_dtype not in AUTOCAST_DTYPES:
            raise ValueError(f"autocast_dtype must be None or one of {AUTOCAST_DTYPES}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Candidate":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown candidate settings: {sorted(unknown)}")
        return cls(**data)

    def compile_options(self) -> dict[str, Any] | None:
        """Keyword arguments of ``torch.compile`` for this candidate; None means eager."""
        if self.compile_backend is None:
            return None
        options: dict[str, Any] = {"backend": self.compile_backend}
        if self.compile_mode:
            options["mode"] = self.compile_mode
        return options

    def describe(self) -> str:
        """A short human label, e.g. "eager, fp32 highest" or "inductor, medium, autocast bf16"."""
        parts = [self.compile_backend or "eager"]
        if self.compile_mode:
            parts[0] += f"({self.compile_mode})"
        if self.eager_mode != "strict":
            parts.append(f"eager mode {self.eager_mode}")
        parts.append(f"matmul {self.matmul_precision}")
        if self.autocast_dtype:
            parts.append(f"autocast {self.autocast_dtype}")
        return ", ".join(parts)
