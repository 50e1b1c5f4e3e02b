"""The precision agent: matmul precision and autocast, decided from the measured hardware.

On a device with a measured probe it skips what the probe shows cannot help: "medium" where it
leaves fp32 matmul numerics unchanged (the same kernels as "highest"), and bf16 autocast where
bf16 matmuls run well below the fp32 rate (no fast bf16 units). Every skip says why, with the
measured figures, in the findings and in the rejected trial's reason. Quantized linears
(torchao, inference) are seeded only where linear layers dominate the profiled time. A finding
names a lever (autocast, lower matmul precision, quantized linears) only where the search space
holds it for the workload; otherwise it says the lever is not searched, and why.
"""

from __future__ import annotations

from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.profiling.verdict import is_matmul_like
from tpu_tuner.tuning.agents.base import Agent
from tpu_tuner.tuning.agents.levers import not_searched
from tpu_tuner.tuning.agents.schema import PrecisionDefinition
from tpu_tuner.tuning.search.search_space import SearchSpace

# Profiled operators that are a linear layer's matmul (aten::linear runs as addmm / mm).
LINEAR_OPERATORS = ("aten::linear", "aten::addmm", "aten::mm")
QUANTIZED_LINEARS = "int8 quantized linears (torchao)"


def linear_share(profile: Profile) -> float:
    """The share of profiled self time in linear layers' matmuls."""
    return sum(op.share for op in profile.operators if op.name.lower().startswith(LINEAR_OPERATORS))


class PrecisionAgent(Agent):
    name = "precision"
    definition_schema = PrecisionDefinition
    definition: PrecisionDefinition

    def diagnose(self, profile: Profile, space: SearchSpace | None = None) -> list[str]:
        verdict = profile.verdict
        matmul_share = sum(op.share for op in profile.operators if is_matmul_like(op.name))
        findings = [
            f"matmul-like operators take {matmul_share:.0%} of profiled self time; "
            f"compute explains {verdict.compute_share:.0%} of the step at the {profile.peak_dtype} peak"
        ]
        autocast = self.left_out("autocast", profile, space, lambda c: c == "bfloat16")
        findings += self._hardware_findings(autocast)
        hint = self.definition.diagnose.compute_share_hint
        if self._linears_dominate(profile):
            linears = f"linear layers take {linear_share(profile):.0%} of profiled self time"
            # A model whose space leaves quantization out (training, no nn.Linear modules, no
            # torchao, TPU) is told so, not that quantized linears may pay off.
            why = self.left_out("quantization", profile, space, lambda c: c.startswith("int8"))
            findings.append(
                f"{linears}: {QUANTIZED_LINEARS} may pay off, under the accuracy guardrail"
                if why is None
                else f"{linears}; " + not_searched(QUANTIZED_LINEARS, why)
            )
        if verdict.compute_share >= hint or matmul_share >= hint:
            findings.append(self._lower_precision_finding(profile, space, autocast))
        return findings

    def _lower_precision_finding(self, profile: Profile, space: SearchSpace | None, autocast: str | None) -> str:
        """A matmul-heavy step: which of bf16 autocast and a lower matmul precision (those the
        space searches) should pay off, by the measured bf16 rate."""
        ratio = self._bf16_ratio()
        if ratio is not None and ratio < self.definition.hardware.seed_bf16_min_ratio:
            return (
                "matmul-heavy, but this host's bf16 matmuls are no faster than fp32: "
                "lower precision is not expected to pay off here"
            )
        lower = not self._medium_without_effect() and (
            self.left_out("matmul_precision", profile, space, lambda c: c == "medium") is None
        )
        if autocast is None:
            means = "autocast or lower matmul precision" if lower else "bf16 autocast"
        elif lower:
            means = "lower matmul precision"
        else:
            return "matmul-heavy; " + not_searched("bf16 autocast and lower matmul precision", autocast)
        return f"matmul-heavy: bf16 matmuls ({means}) should pay off"

    def seeds(self, profile: Profile | None, space: SearchSpace) -> list[dict[str, str]]:
        """The definition's seeds, less those the measured hardware rules out."""
        return [
            seed
            for seed in super().seeds(profile, space)
            if not self._seed_skip_reason(seed) and ("quantization" not in seed or self._linears_dominate(profile))
        ]

    def _linears_dominate(self, profile: Profile | None) -> bool:
        hint = self.definition.diagnose.compute_share_hint
        return profile is not None and not profile.workload.training and linear_share(profile) >= hint

    def validate(self, candidate: Candidate) -> str | None:
        rules = self.definition.validate
        if self.device_kind == "cpu" and candidate["matmul_precision"] == "high" and rules.skip_high_on_cpu:
            return "matmul precision 'high' is identical to 'highest' on CPU (no TF32)"
        if self.device_kind == "cpu" and candidate["autocast"] == "float16" and rules.skip_float16_on_cpu:
            return "float16 autocast is not a fast path on CPU"
        if candidate["matmul_precision"] == "medium" and self._medium_without_effect():
            return self._medium_reason()
        if candidate["autocast"] == "bfloat16" and self._bf16_too_slow():
            return self._bf16_reason("rejected")
        return None

    # --- decisions from the measured probe -------------------------------------------------

    def _bf16_ratio(self) -> float | None:
        return self.probe.bf16_speed_ratio if self.probe is not None else None

    def _medium_without_effect(self) -> bool:
        return (
            self.probe is not None
            and self.probe.medium_changes_numerics is False
            and self.definition.hardware.skip_medium_without_effect
        )

    def _bf16_too_slow(self) -> bool:
        ratio = self._bf16_ratio()
        return ratio is not None and ratio < self.definition.hardware.reject_bf16_below_ratio

    def _seed_skip_reason(self, seed: dict[str, str]) -> str | None:
        if seed.get("matmul_precision") == "medium" and self._medium_without_effect():
            return self._medium_reason()
        ratio = self._bf16_ratio()
        min_ratio = self.definition.hardware.seed_bf16_min_ratio
        if seed.get("autocast") == "bfloat16" and ratio is not None and ratio < min_ratio:
            return self._bf16_reason("not seeded" if not self._bf16_too_slow() else "rejected")
        return None

    def _medium_reason(self) -> str:
        assert self.probe is not None and self.probe.medium_relative_error is not None
        return (
            f"matmul precision 'medium' skipped: it leaves fp32 matmuls unchanged on this host (measured relative "
            f"error {self.probe.medium_relative_error:.1e}, fp32 rounding; a bf16 pass gives ~1e-3): "
            "it runs the same kernels as 'highest'"
        )

    def _bf16_reason(self, action: str) -> str:
        assert self.probe is not None
        return (
            f"bf16 autocast {action}: bf16 matmuls run at {self.probe.bfloat16_flops_per_s / 1e9:.0f} GFLOP/s "
            f"against {self.probe.float32_flops_per_s / 1e9:.0f} GFLOP/s in fp32 on this host "
            f"({self.probe.bf16_speed_ratio:.2f}x): no fast bf16 matmul units"
        )

    def _hardware_findings(self, autocast: str | None = None) -> list[str]:
        """What the probe says about each precision choice, with the measured figures; bf16
        autocast is called worth trying only where it is searched (`autocast`: why not)."""
        if self.probe is None:
            return []
        probe = self.probe
        findings = []
        if probe.medium_changes_numerics is not None:
            if self._medium_without_effect():
                findings.append(self._medium_reason())
            elif probe.medium_changes_numerics:
                findings.append(
                    f"matmul precision 'medium' runs fp32 matmuls as bf16 here (measured relative "
                    f"error {probe.medium_relative_error:.1e})"
                )
        ratio = probe.bf16_speed_ratio
        if ratio < self.definition.hardware.seed_bf16_min_ratio:
            findings.append(self._bf16_reason("rejected" if self._bf16_too_slow() else "not seeded"))
        else:
            rates = (
                f"bf16 matmuls run at {probe.bfloat16_flops_per_s / 1e9:.0f} GFLOP/s against "
                f"{probe.float32_flops_per_s / 1e9:.0f} GFLOP/s fp32 ({ratio:.2f}x)"
            )
            worth = (
                ": bf16 autocast is worth trying"
                if autocast is None
                else "; " + not_searched("bf16 autocast", autocast)
            )
            findings.append(rates + worth)
        return findings
