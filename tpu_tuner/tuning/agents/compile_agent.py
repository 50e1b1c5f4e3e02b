"""The compile agent: eager, TorchTPU eager modes, or torch.compile.

Its findings name a lever (compiling, channels_last, inductor's options, the loss compiled with
the model, a fused optimizer) only where the search space holds it for the profiled workload;
otherwise they say it is not searched, and why (`levers.py`).
"""

from __future__ import annotations

import shutil

import tpu_tuner.tuning.agents.attention as attention
import tpu_tuner.tuning.agents.compiler_options as compiler_options
import tpu_tuner.tuning.agents.loss_scope as loss_scope
import tpu_tuner.tuning.agents.step_trace as step_trace
import tpu_tuner.tuning.agents.training_step as training_step
from tpu_tuner.knobs import registry as knobs
from tpu_tuner.knobs.attention_kernel import SPLASH
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.compile_scope import STEP
from tpu_tuner.knobs.execution import compile_options
from tpu_tuner.knobs.layout import layout_in
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.profiling.verdict import Verdict
from tpu_tuner.tuning.agents.base import Agent
from tpu_tuner.tuning.agents.levers import not_searched
from tpu_tuner.tuning.agents.schema import CompileDefinition
from tpu_tuner.tuning.search.search_space import SearchSpace

# channels_last is seeded when convolutions take at least this share of the profiled self time:
# then the NHWC kernels (no layout conversion around each convolution) can move the step.
CONV_SEED_SHARE = 0.3
AUTOTUNED = "better kernels (a compiler's autotuned ones)"


def convolution_share(profile: Profile) -> float:
    """The share of profiled operator self time spent in convolution kernels."""
    return sum(op.share for op in profile.operators if "conv" in op.name.lower())


class CompileAgent(Agent):
    name = "compile"
    _conv_share: float | None = None  # from the profile diagnose/seeds saw; None before
    _training: bool | None = None  # whether that profile is a training step; None before
    definition_schema = CompileDefinition
    definition: CompileDefinition

    def diagnose(self, profile: Profile, space: SearchSpace | None = None) -> list[str]:
        verdict = profile.verdict
        findings = [
            f"{verdict.ops_per_step} aten ops per step; first call {profile.warmup.first_call_seconds * 1e3:.0f} ms "
            f"against a {profile.timing.median * 1e3:.1f} ms step"
        ]
        if verdict.uncertain:
            findings.append(f"the step time spread too much (CV {verdict.step_cv:.0%}) for a firm verdict")
        # What a compiler could do is said only where the space searches a compiling execution.
        compiling = self.left_out("execution", profile, space, lambda c: compile_options(c) is not None)
        if verdict.bound == "overhead-bound" and self.definition.diagnose.overhead_bound_hint:
            findings.append(self._overhead_bound(verdict, compiling))
        elif verdict.bound == "memory-bound":
            findings.append(
                "memory-bound: "
                + (
                    "compiler fusion removes intermediate reads and writes"
                    if compiling is None
                    else not_searched("compiler fusion", compiling)
                )
            )
        elif verdict.bound == "compute-bound":
            findings.append("compute-bound: a compiler helps little unless it picks faster matmul kernels")
        else:
            findings.append(self._below_roofline(verdict, compiling, self._kernel_levers(profile, space, compiling)))
        if knobs.get("memory_format").applies_to(self.device_kind):
            findings.append(self._layout_finding(profile, self.left_out("memory_format", profile, space)))
        self._training = profile.workload.training
        findings += training_step.findings(
            profile, self.left_out(training_step.KNOB, profile, space, lambda c: c == "fused")
        )
        findings += loss_scope.findings(profile, self.left_out(loss_scope.KNOB, profile, space))
        if knobs.get("compile_options").applies_to(self.device_kind):
            findings += compiler_options.findings(profile, self.left_out(compiler_options.KNOB, profile, space))
        if knobs.get(attention.KNOB).applies_to(self.device_kind):
            splash = self.left_out(attention.KNOB, profile, space, lambda c: c == SPLASH)
            findings += attention.findings(splash, compiling)
        if self.device_kind == "tpu":  # the one device with a whole-step tracer (Backend.step_tracer)
            traced = self.left_out(step_trace.KNOB, profile, space, lambda c: c == STEP)
            findings += step_trace.findings(profile.workload.training, traced is None, traced)
        return findings

    def _layout_finding(self, profile: Profile, left_out: str | None = None) -> str:
        share = self._conv_share = convolution_share(profile)
        if share > 0 and left_out is not None:
            return f"convolutions take {share:.0%} of profiled self time; " + not_searched("channels_last", left_out)
        if share >= CONV_SEED_SHARE:
            return (
                f"convolutions take {share:.0%} of profiled self time: channels_last memory format is seeded "
                "(NHWC kernels, no layout conversion around each convolution)"
            )
        if share > 0:
            return f"convolutions take only {share:.0%} of profiled self time: channels_last is searched, not seeded"
        return "no convolution operators in the profile: channels_last memory format is skipped"

    def seeds(self, profile: Profile | None, space: SearchSpace) -> list[dict[str, str]]:
        """The definition's execution seeds; on a convolution-heavy profile each also with
        channels_last first (so the agents' combined seed carries it), and channels_last alone."""
        seeds = super().seeds(profile, space)
        if profile is not None:
            self._conv_share = convolution_share(profile)
            self._training = profile.workload.training
        choices = {p.name: p.choices for p in self.params(space)}
        execution = list(seeds)
        # The variants in the order of what they gave on a v5e chip (docs/knobs.md, "TorchTPU's
        # levers"): the traced step 2.31x, splash 1.05-1.22x, the loss compiled 1.07x; a fused
        # optimizer and compiler options unmeasured there or slower. A short run reaches the first.
        seeds += step_trace.seeds(choices, execution)
        seeds += attention.seeds(choices, execution)
        seeds += loss_scope.seeds(profile, choices, execution)
        seeds += training_step.seeds(profile, choices)
        seeds += compiler_options.seeds(profile, choices)
        layout = next((p for p in self.params(space) if p.name == "memory_format"), None)
        if layout is None or "channels_last" not in layout.choices or (self._conv_share or 0.0) < CONV_SEED_SHARE:
            return seeds
        return (
            [{**seed, "memory_format": "channels_last"} for seed in seeds]
            + [{"memory_format": "channels_last"}]
            + seeds
        )

    @staticmethod
    def _overhead_bound(verdict: Verdict, compiling: str | None = None) -> str:
        """What makes the step overhead-bound, by what was measured: the device's idle share where
        its busy time was traced, else ops x the per-op dispatch cost (which never exceeds the step)."""
        if verdict.device_busy_share is not None:
            cause = (
                f"the device is idle {1 - verdict.device_busy_share:.0%} of the step waiting on the host "
                "(the profiler's device events)"
            )
        elif verdict.dispatch_seconds_per_op is not None and verdict.dispatch_share is not None:
            cause = (
                f"{verdict.ops_per_step} ops x {verdict.dispatch_seconds_per_op * 1e6:.2g} us measured dispatch cost "
                f"explain {verdict.dispatch_share:.0%} of the step"
            )
        else:
            cause = f"{verdict.ops_per_step} ops per step"
        if compiling is not None:
            return f"overhead-bound: {cause}; " + not_searched("fusing ops with a compiler", compiling)
        return f"overhead-bound: {cause}; fusing ops with a compiler should cut dispatch time"

    def _kernel_levers(self, profile: Profile, space: SearchSpace | None, compiling: str | None) -> list[str]:
        """The levers on slow matmul / convolution kernels that the space searches, in words."""
        lower = self.left_out("autocast", profile, space, lambda c: c == "bfloat16") is None or (
            self.left_out("matmul_precision", profile, space, lambda c: c == "medium") is None
        )
        layout = self.left_out("memory_format", profile, space, lambda c: c == "channels_last") is None
        named = (("lower precision", lower), ("memory format", layout), (AUTOTUNED, compiling is None))
        return [words for words, searched in named if searched]

    @staticmethod
    def _below_roofline(verdict: Verdict, compiling: str | None = None, levers: list[str] | None = None) -> str:
        """What a compiler can do for kernels that run below the roofline, by which kernels they are."""
        top = ", ".join(f"{name} {share:.0%}" for name, share in verdict.top_operators) or "no operator table"
        dispatch = (
            f"; dispatch explains only {verdict.dispatch_share:.0%}" if verdict.dispatch_share is not None else ""
        )
        head = f"below the roofline: the kernels reach {verdict.compute_share:.1%} of the peak ({top}){dispatch}"
        if verdict.compute_kernels_dominate:
            levers = ["lower precision", "memory format", AUTOTUNED] if levers is None else levers
            if not levers:
                return head + (
                    "; matmul/convolution kernels dominate, so fusion cuts little, and none of lower precision, "
                    "memory format or a compiler's autotuned kernels is searched here"
                )
            listed = " or ".join([", ".join(levers[:-1]), levers[-1]] if len(levers) > 1 else levers)
            return (
                head + f"; matmul/convolution kernels dominate, so fusion cuts little: {listed} "
                f"{'is' if len(levers) == 1 else 'are'} what can help"
            )
        if compiling is not None:
            return (
                head + "; elementwise / data-movement kernels dominate; " + not_searched("compiler fusion", compiling)
            )
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
        if candidate["memory_format"] == "channels_last" and self._conv_share == 0.0:
            return (
                "channels_last skipped: the profile shows no convolution operator, and the setting only "
                "re-lays 4-D convolution weights and inputs"
            )
        if candidate["memory_format"] == "channels_last" and layout_in(candidate).fsdp > 1:
            # The memory format re-lays the weights before the layout shards them, and FSDP2 takes
            # contiguous parameters only (examples/cnn.py on 2 ranks failed so on every rank).
            return (
                f"channels_last skipped: under fsdp (layout {candidate['layout']}) FSDP2 refuses the "
                "non-contiguous convolution weights channels_last makes"
            )
        return (
            compiler_options.validate(candidate, self._training, self.device_kind)
            or step_trace.validate(candidate)
            or training_step.validate(candidate, self._training)
        )
