"""The threads agent: the CPU intra-op thread count (the `intra_op_threads` knob).

It reads the profile's verdict: a step that is overhead-bound, whose ops are tiny on average, or
whose step times spread (other work on the cores) is where fewer threads than cores can win, so
the fewest-thread choices are seeded; otherwise the knob is only searched (TPE may still try it).
On a host with one usable core the knob has one choice and is not searched at all.
"""

from __future__ import annotations

from tpu_tuner.core.host import usable_cores
from tpu_tuner.knobs.intra_op_threads import ALL, IntraOpThreadsKnob
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.tuning.agents.base import Agent
from tpu_tuner.tuning.agents.levers import not_searched
from tpu_tuner.tuning.agents.schema import ThreadsDefinition
from tpu_tuner.tuning.search.search_space import SearchSpace

KNOB = "intra_op_threads"


class ThreadsAgent(Agent):
    name = "threads"
    definition_schema = ThreadsDefinition
    definition: ThreadsDefinition

    def reasons(self, profile: Profile) -> list[str]:
        """Why fewer threads may win on this profile (empty: no sign that they would)."""
        rules, verdict = self.definition.seeds, profile.verdict
        found = []
        if verdict.dispatch_share is not None and verdict.dispatch_share >= rules.overhead_share_min:
            found.append(f"dispatch explains {verdict.dispatch_share:.0%} of the step (overhead-bound)")
        if verdict.ops_per_step:
            per_op_us = verdict.step_seconds / verdict.ops_per_step * 1e6
            if per_op_us <= rules.op_microseconds_max:
                found.append(f"{verdict.ops_per_step} ops per step average {per_op_us:.1f} us each (small ops)")
        if verdict.step_cv is not None and verdict.step_cv >= rules.contention_cv_min:
            found.append(f"the step times spread (robust CV {verdict.step_cv:.0%}): other work may share the cores")
        return found

    def diagnose(self, profile: Profile, space: SearchSpace | None = None) -> list[str]:
        if not IntraOpThreadsKnob().applies_to(self.device_kind):
            return [f"intra-op threads are a CPU setting: not searched on {self.device_kind}"]
        threads = profile.environment.get("threads", "?")
        head = f"torch runs {threads} intra-op threads on {usable_cores()} usable cores"
        if usable_cores() <= 1:
            return [head + ": one core, so the thread count is not searched"]
        left_out = self.left_out(KNOB, profile, space, lambda c: c != ALL)
        if left_out is not None:
            return [head + "; " + not_searched("fewer threads", left_out)]
        reasons = self.reasons(profile)
        if reasons:
            return [head + "; fewer threads are seeded: " + "; ".join(reasons)]
        return [head + "; ops are large and the step quiet: fewer threads are searched, not seeded"]

    def seeds(self, profile: Profile | None, space: SearchSpace) -> list[dict[str, str]]:
        """The fewer-thread choices, fewest first, when the profile shows a reason for them."""
        param = next((p for p in self.params(space) if p.name == KNOB), None)
        if param is None or profile is None or not self.reasons(profile):
            return []
        fewer = sorted((c for c in param.choices if c != ALL), key=int)
        return [{KNOB: choice} for choice in fewer]
