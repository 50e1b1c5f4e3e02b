"""The compile agent: eager, TorchTPU eager modes, or torch.compile."""

from __future__ import annotations

import shutil

from tpu_tuner.agents.base import Agent
from tpu_tuner.candidate import Candidate
from tpu_tuner.profiling.profile import Profile


class CompileAgent(Agent):
    name = "compile"

    def diagnose(self, profile: Profile) -> list[str]:
        verdict = profile.verdict
        findings = [
            f"{verdict.ops_per_step} aten ops per step; first call {profile.warmup.first_call_seconds * 1e3:.0f} ms "
            f"against a {profile.timing.median * 1e3:.1f} ms step"
        ]
        if verdict.bound == "overhead-bound" and self.definition.get("diagnose", {}).get("overhead_bound_hint", True):
            findings.append("overhead-bound: fusing ops with a compiler should cut dispatch time")
        elif verdict.bound == "memory-bound":
            findings.append("memory-bound: compiler fusion removes intermediate reads and writes")
        else:
            findings.append("compute-bound: a compiler helps little unless it picks faster matmul kernels")
        return findings

    def _seed_param(self) -> str:
        return "execution"

    def validate(self, candidate: Candidate) -> str | None:
        rules = self.definition.get("validate", {})
        if (
            self.device_kind == "cpu"
            and candidate.compile_backend == "inductor"
            and rules.get("require_cxx_for_inductor_on_cpu", True)
            and not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++"))
        ):
            return "inductor on CPU needs a C++ compiler and none is on PATH"
        return None
