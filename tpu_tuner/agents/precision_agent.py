"""The precision agent: matmul precision and autocast."""

from __future__ import annotations

from tpu_tuner.agents.base import Agent
from tpu_tuner.candidate import Candidate
from tpu_tuner.profiling.profile import Profile


class PrecisionAgent(Agent):
    name = "precision"

    def diagnose(self, profile: Profile) -> list[str]:
        verdict = profile.verdict
        matmul_share = sum(op.share for op in profile.operators if _is_matmul(op.name))
        findings = [
            f"matmul-like operators take {matmul_share:.0%} of profiled self time; "
            f"compute explains {verdict.compute_share:.0%} of the step at the {profile.peak_dtype} peak"
        ]
        hint = self.definition.get("diagnose", {}).get("compute_share_hint", 0.3)
        if verdict.compute_share >= hint or matmul_share >= hint:
            findings.append("matmul-heavy: bf16 matmuls (autocast or lower matmul precision) should pay off")
        return findings

    def validate(self, candidate: Candidate) -> str | None:
        rules = self.definition.get("validate", {})
        if self.device_kind == "cpu" and candidate.matmul_precision == "high" and rules.get("skip_high_on_cpu", True):
            return "matmul precision 'high' is identical to 'highest' on CPU (no TF32)"
        if self.device_kind == "cpu" and candidate.autocast_dtype == "float16" and rules.get("skip_float16_on_cpu", True):
            return "float16 autocast is not a fast path on CPU"
        return None


def _is_matmul(name: str) -> bool:
    return any(key in name for key in ("mm", "matmul", "linear", "conv", "attention"))
