"""The memory agent: activation checkpointing, against the study's memory constraint.

Checkpointing repeated blocks trades step time (one more forward of each checkpointed block)
for peak memory, so it is tried only when the baseline's measured peak is close to the limit a
trial must stay under (`tpu_tuner.tuning.search.memory_limit`): there it is seeded; elsewhere a setting
with it is rejected unmeasured (it could only be slower; docs/knobs.md has the measured cost).
An inference step has no backward pass: the search space leaves both memory knobs out there
(knobs/traits.py), and this agent rejects them should a space still hold them. Its findings
seed or suggest a memory knob only where the space searches it (`levers.py`).
"""

from __future__ import annotations

from tpu_tuner.core.units import binary_bytes
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.tuning.agents.base import Agent
from tpu_tuner.tuning.agents.levers import not_searched
from tpu_tuner.tuning.agents.schema import MemoryDefinition
from tpu_tuner.tuning.search.memory_limit import MemoryLimit
from tpu_tuner.tuning.search.search_space import SearchSpace

KNOB = "activation_checkpointing"
# Gradient accumulation (tpu_tuner/knobs/micro_batches.py): the other memory knob of a training
# step; k smaller passes are slower by construction, so it is reasoned about like checkpointing.
MICRO_BATCHES = "micro_batches"
TPU_COMPILE = "tpu"  # the `execution` value of torch.compile(backend="tpu")


class MemoryAgent(Agent):
    name = "memory"
    definition_schema = MemoryDefinition
    definition: MemoryDefinition
    limit: MemoryLimit | None = None  # set by the study once the baseline profile names the device
    _training: bool | None = None  # from the profile diagnose/seeds saw; None before
    _pressed: bool | None = None  # whether that profile's peak is near the limit; None before
    _batch: int | None = None  # the global batch of that profile's step

    def diagnose(self, profile: Profile, space: SearchSpace | None = None) -> list[str]:
        self._training = profile.workload.training
        batch = profile.workload.batch_size
        self._batch = int(batch) if isinstance(batch, int) else None
        self._pressed = self._near_limit(profile)
        peak = profile.memory.peak_bytes
        # In report.md's units (core/units.py): one run, one figure ("857 MiB", not also "0.78 GiB").
        measured = binary_bytes(peak) if peak is not None else "not measured"
        if self.limit is None:
            against = (
                "no memory limit on this device (CPU without --trial-memory-gb): the search does not constrain memory"
            )
        else:
            share = f", {peak / self.limit.bytes:.0%} of it" if peak is not None else ""
            against = f"limit {binary_bytes(self.limit.bytes)} ({self.limit.source}){share}"
        findings = [f"baseline peak memory {measured} ({profile.memory.method}); {against}"]
        if not self._training:
            findings.append(
                "inference step: no activations are kept for a backward pass, so activation checkpointing is skipped"
            )
        else:
            findings.append(self._training_finding(profile, space))
        return findings

    def _training_finding(self, profile: Profile, space: SearchSpace | None) -> str:
        """A training step: checkpointing and micro-batches, seeded near the limit and otherwise
        not tried / searched; either said as not searched (and why) where the space leaves it out."""
        checkpointing = self.left_out(KNOB, profile, space, lambda c: c != "none")
        split = self.left_out(MICRO_BATCHES, profile, space, lambda c: c != "1")
        if profile.fitted_to_memory.get(KNOB, "none") != "none" and split is None:
            return (
                "the step was fitted to memory with checkpointing: every second block checkpointed (half the "
                "recompute), then no checkpointing with the batch in 4 or 2 micro-batches (none), are seeded; with "
                "other seeds' savings, such as bf16 parameters, they can fit where fp32 needed every block "
                "checkpointed (one that does not is refused by its memory estimate)"
            )
        if self._near_limit(profile):
            head = f"the baseline is within {1 - self.definition.seeds.near_limit_share:.0%} of the limit: "
            recompute = "checkpointing repeated blocks"
            slices = "splitting the batch into micro-batches"
            if checkpointing is None and split is None:
                return (
                    f"{head}{recompute} is seeded (less activation memory, one more forward of each block), and "
                    f"so is {slices} (one slice's activations alive at a time, k smaller passes)"
                )
            parts = [
                f"{recompute} is seeded" if checkpointing is None else not_searched(recompute, checkpointing),
                f"{slices} is seeded" if split is None else not_searched(slices, split),
            ]
            return head + "; ".join(parts)
        parts = [
            "activation checkpointing is not tried (it only trades a forward of each block for memory the step "
            "does not need; give --trial-memory-gb to search it under a limit)"
            if checkpointing is None
            else "activation checkpointing is not tried (the step does not need the memory; "
            + not_searched("checkpointing", checkpointing)
            + ")",
            "micro-batching is searched, not seeded (k smaller passes, which can also run faster where "
            "activations fit in cache)"
            if split is None
            else not_searched("micro-batching", split),
        ]
        return "the baseline is not near a memory limit: " + ", ".join(parts)

    def _near_limit(self, profile: Profile) -> bool:
        peak = profile.memory.peak_bytes
        return (
            self.limit is not None
            and peak is not None
            and peak >= self.definition.seeds.near_limit_share * self.limit.bytes
        )

    def seeds(self, profile: Profile | None, space: SearchSpace) -> list[dict[str, str]]:
        """Checkpointing alone, and two micro-batches alone, for a training step whose baseline
        peak is near the limit; for a step fitted to memory with checkpointing, the fit's
        recompute traded back (`_unfitted`)."""
        if profile is None:
            return []
        self._training = profile.workload.training
        self._pressed = self._near_limit(profile)
        choice = self.definition.seeds.activation_checkpointing
        param = next((p for p in self.params(space) if p.name == KNOB), None)
        split = next((p for p in self.params(space) if p.name == MICRO_BATCHES), None)
        if not self._training:
            return []
        if profile.fitted_to_memory.get(KNOB, "none") != "none" and param is not None and "none" in param.choices:
            return self._unfitted(param.choices, split.choices if split is not None else ())
        if not self._near_limit(profile):
            return []
        seeds = [{KNOB: choice}] if param is not None and choice in param.choices else []
        if split is not None:
            seeds.append({MICRO_BATCHES: split.choices[1]})  # the smallest split: the least time lost
        return seeds

    @staticmethod
    def _unfitted(checkpointing: tuple[str, ...], splits: tuple[str, ...]) -> list[dict[str, str]]:
        """The fit's recompute traded back: every second block checkpointed (half the extra
        forward), then no checkpointing with the batch in the most micro-batches first (k smaller
        passes recompute nothing). What other agents' seeds keep less of (bf16 parameters halve
        the weights, gradients and optimizer states) can make these fit where fp32 needed every
        block checkpointed. On the chip a 335M decoder at batch 8 x 2048, fitted with checkpointed
        blocks, ran 637 ms with bf16 parameters and checkpointing: 28.9% MFU against JAX's 50.5%
        (docs/torchtpu.md). A setting that does not fit is refused before it runs by its memory
        estimate; split steps under TorchTPU's compile backend by `validate`."""
        half = [{KNOB: "every_2nd"}] if "every_2nd" in checkpointing else []
        return half + [{KNOB: "none", MICRO_BATCHES: k} for k in sorted(splits, key=int, reverse=True) if k != "1"]

    def validate(self, candidate: Candidate) -> str | None:
        if self._training is False and candidate[KNOB] != "none":
            return (
                "activation checkpointing skipped: an inference step keeps no activations for a backward "
                "pass, so there is nothing to recompute"
            )
        if self._training and self._pressed is False and candidate[KNOB] != "none":
            return (
                "activation checkpointing skipped: the baseline is not near a memory limit, and recomputing "
                "blocks only trades step time for memory the step does not need"
            )
        if self._training is False and candidate[MICRO_BATCHES] != "1":
            return "micro_batches skipped: an inference step has no backward pass or optimizer step to accumulate over"
        return self._compiled_accumulation_refusal(candidate) or self._slice_refusal(candidate)

    def _compiled_accumulation_refusal(self, candidate: Candidate) -> str | None:
        """Micro-batches under TorchTPU's compile backend fail every step after the first on torch-tpu
        0.2.0 (docs/torchtpu.md, "On a real chip"): refused unmeasured, not found after a compile."""
        if self.device_kind != "tpu" or candidate[MICRO_BATCHES] == "1" or candidate["execution"] != TPU_COMPILE:
            return None
        return (
            f"micro_batches {candidate[MICRO_BATCHES]} skipped under execution {TPU_COMPILE}: gradients accumulated "
            'over micro-batches by a torch.compile(backend="tpu") step fail from the second step with '
            "'a required argument is in a failed state' (torch-tpu 0.2.0 on a v5e chip, at every matmul "
            "precision and with launch blocking; eager accumulation and compiled single batches run)"
        )

    def _slice_refusal(self, candidate: Candidate) -> str | None:
        """Micro-batches split each rank's slice of the batch, which a sharding layout makes
        smaller than the batch the search space narrowed the counts by."""
        from tpu_tuner.knobs.layout import layout_in

        k = int(candidate[MICRO_BATCHES])
        layout = layout_in(candidate)
        data, fsdp = layout.data, layout.fsdp
        if self._batch is None or k == 1 or data * fsdp == 1:
            return None
        local = self._batch // (data * fsdp)
        if local % k == 0:
            return None
        return (
            f"micro_batches {k} skipped: under layout {layout.short()} each rank runs {local} of the batch's "
            f"{self._batch} samples, which do not split into {k} equal micro-batches"
        )
