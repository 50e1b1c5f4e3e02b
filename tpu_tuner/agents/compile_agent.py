"""The compile agent: eager, TorchTPU eager modes, or torch.compile."""

from __future__ import annotations

import shutil

from tpu_tuner.agents.base import Agent
from tpu_tuner.agents.schema import CompileDefinition
from tpu_tuner.candidate import Candidate
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.profiling.verdict import Verdict


class CompileAgent(Agent):
    name = "compile"
    definition_schema = CompileDefinition
    definition: CompileDefinition

    def diagnose(self, profile: Profile) -> list[str]:
        verdict = profile.verdict
        findings = [
            f"{verdict.ops_per_step} aten ops per step; first call {profile.warmup.first_call_seconds * 1e3:.0f} ms "
            f"against a {profile.timing.median * 1e3:.1f} ms step"
        ]
        if verdict.uncertain:
            findings.append(f"the step time spread too much (CV {verdict.step_cv:.0%}) for a firm verdict")
        if verdict.bound == "overhead-bound" and self.definition.diagnose.overhead_bound_hint:
            findings.append(
                f"overhead-bound: {verdict.ops_per_step} ops x {verdict.dispatch_seconds_per_op * 1e6:.2g} us measured "
                f"dispatch cost explain {verdict.dispatch_share:.0%} of the step; fusing ops with a compiler "
                "should cut dispatch time")
        elif verdict.bound == "memory-bound":
            findings.append("memory-bound: compiler fusion removes intermediate reads and writes")
        elif verdict.bound == "compute-bound":
            findings.append("compute-bound: a compiler helps little unless it picks faster matmul kernels")
        else:
            findings.append(self._below_roofline(verdict))
        return findings

    @staticmethod
    def _below_roofline(verdict: Verdict) -> str:
        """What a compiler can do for kernels that run below the roofline, by which kernels they are."""
        top = ", ".join(f"{name} {share:.0%}" for name, share in verdict.top_operators) or "no operator table"
        dispatch = (f"; dispatch explains only {verdict.dispatch_share:.0%}" if verdict.dispatch_share is not None
                    else "")
        head = f"below the roofline: the kernels reach {verdict.compute_share:.1%} of the peak ({top}){dispatch}"
        if verdict.compute_kernels_dominate:
            return (head + "; matmul/convolution kernels dominate, so fusion cuts little: lower precision, "
                    "memory format or better kernels (a compiler's autotuned ones) are what can help")
        return head + "; elementwise / data-movement kernels dominate, so compiler fusion can help"

    def _seed_param(self) -> str:
        return "execution"

    def validate(self, candidate: Candidate) -> str | None:
        rules = self.definition.validate
        if (
            self.device_kind == "cpu"
            and candidate["execution"].partition(":")[0] == "inductor"
            and rules.require_cxx_for_inductor_on_cpu
            and not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++"))
        ):
            return "inductor on CPU needs a C++ compiler and none is on PATH"
        return None
