"""Options of a tuning run, with the documented defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tpu_tuner.profiling.settings import ProfilerSettings

SAMPLERS = ("tpe", "random", "grid")


@dataclass
class TuneOptions:
    """How long to search, what to search, and the guardrails.

    * ``planned_steps``: the length of the run the user plans; compile time is spread over it
      in the objective (amortised step time = steady step + compile time / planned_steps).
    * ``tolerance``: the largest relative error against the fp32 eager reference a chosen
      config may have (outputs for inference; loss and gradients for training). 1e-2 admits
      bf16 autocast on the examples (measured 2.9e-3 on gpt's gradients, 2.1e-3 on cnn's logits).
    """

    trials: int = 12
    timeout_s: float | None = None
    sampler: str = "tpe"
    seed: int = 0
    space: str | Path = "default"
    agents: tuple[str, ...] = ("compile", "precision")
    planned_steps: int = 5000
    tolerance: float = 1e-2
    trial_timeout_s: float = 300.0
    memory_limit_bytes: int | None = None
    verify_rounds: int = 12
    device: str | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    storage: str | None = None
    out: Path = Path("results")
    resume: Path | None = None
    # Varying input lengths (bucketing/knob.py): a length sample file, else the workload's
    # sample_lengths(); the bucket limits the per-trial optimiser respects.
    lengths_file: Path | None = None
    max_buckets: int = 8
    bucket_align: int = 8
    trial_settings: ProfilerSettings = field(
        default_factory=lambda: ProfilerSettings(timing_min_steps=10, timing_min_seconds=0.5, timing_max_steps=100)
    )

    def validate(self) -> None:
        from tpu_tuner.errors import UserInputError

        if self.sampler not in SAMPLERS:
            raise UserInputError(f"unknown sampler {self.sampler!r}; choose {', '.join(SAMPLERS)}")
        for name in ("trials", "planned_steps", "verify_rounds", "max_buckets", "bucket_align"):
            if getattr(self, name) < 1:
                raise UserInputError(f"--{name.replace('_', '-')} must be at least 1")
        if self.verify_rounds < 2:
            raise UserInputError("--verify-rounds must be at least 2")
        if not self.tolerance > 0:
            raise UserInputError("--tolerance must be positive")
