"""The sharding agent: the data x fsdp x tensor layout of an N-rank step (`layout`), training or
inference.

With a plan (``--plan DIR``, `sharding.from_plan`) its seeds are the plan's fitting layouts in the
plan's order, mapped onto the local rank count, so that what the compile-only planner ranked
first is measured first, before it is trusted. Without one, the definition's families are
seeded (fully sharded first for a training step, tensor parallel first for an inference step).
Layouts other than the baseline that the model's shapes cannot run are left out of the search
space (`knobs/layout.py`; report.md says which and why); a layout that fails when measured alone
is given up (`learn`).
"""

from __future__ import annotations

from typing import Any

from tpu_tuner.core.failures import FailureKind
from tpu_tuner.devices.roofline_probe import RooflineProbe
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.layout import expand
from tpu_tuner.parallel.from_plan import MappedLayout
from tpu_tuner.profiling.profile import Profile
from tpu_tuner.tuning.agents.base import Agent
from tpu_tuner.tuning.agents.schema import ShardingDefinition
from tpu_tuner.tuning.search.search_space import SearchSpace

KNOB = "layout"


class ShardingAgent(Agent):
    name = "sharding"
    definition_schema = ShardingDefinition
    definition: ShardingDefinition
    ranks: int = 1  # set by the study: the processes every trial runs on (--nproc)
    planned: list[MappedLayout] | None = None  # set by the study from --plan: the plan's layouts, mapped
    plan_source: str = ""  # the plan folder, for the findings
    training: bool = True  # whether the profiled step trains (read in `diagnose`)

    def __init__(self, definition: Any, device_kind: str, probe: RooflineProbe | None = None) -> None:
        super().__init__(definition, device_kind, probe)
        # Layouts that failed on their own: layout -> (trial, the error's first line).
        self._dead: dict[str, tuple[int, str]] = {}

    def diagnose(self, profile: Profile, space: SearchSpace | None = None) -> list[str]:
        if self.ranks == 1:
            return ["one process per trial: no sharding layout to search (--nproc N runs every trial on N ranks)"]
        self.training = profile.workload.training
        baseline = (
            "DDP"
            if self.training
            else "replicas of the model, each a slice of the batch: an inference step has no gradient to synchronise"
        )
        findings = [
            f"every trial runs on {self.ranks} ranks, one process each, on the global batch of "
            f"{profile.workload.batch_size}; the baseline is data parallel ({self.ranks}x1x1, {baseline})"
        ]
        if self.planned is not None:
            if not self.planned:
                findings.append(f"the plan in {self.plan_source} has no fitting layout to seed")
            for mapped in self.planned:
                mfu = f", predicted MFU {mapped.predicted_mfu:.1%}" if mapped.predicted_mfu is not None else ""
                findings.append(f"from the plan in {self.plan_source}: {mapped.describe()}{mfu}")
        return findings

    def seeds(self, profile: Profile | None, space: SearchSpace) -> list[dict[str, str]]:
        """The plan's layouts (those the space holds), else the definition's families."""
        param = next((p for p in self.params(space) if p.name == KNOB), None)
        if param is None:
            return []
        if self.planned:
            wanted = [m.local.short() for m in self.planned[: self.definition.seeds.plan_top]]
        else:
            training = profile.workload.training if profile is not None else self.training
            families = self.definition.seeds.families if training else self.definition.seeds.inference_families
            wanted = [next(iter(expand(family, space.ranks)), "") for family in families]
        return [
            {KNOB: value} for value in dict.fromkeys(wanted) if value in param.choices and value != param.choices[0]
        ]

    def learn(self, candidate: Candidate, trial: int, failure_kind: str, message: str) -> list[dict[str, str]]:
        """A layout's error is the layout's own only where every other knob was at its baseline:
        then the layout is given up (the model cannot run it, such as a fused q/k/v projection
        under tensor parallelism). An error with other knobs set may be theirs (the foreach
        optimizer cannot step tensor-parallel parameters, while other optimizers can), so the
        layout alone is asked for next, which decides it."""
        layout = candidate[KNOB]
        if (
            self.ranks == 1
            or layout == f"{self.ranks}x1x1"
            or failure_kind != FailureKind.ERROR
            or layout in self._dead
            or not self.definition.validate.measure_alone_after_error
        ):
            return []  # the baseline layout (DDP) is never given up: its failure is the workload's
        if set(candidate.changed) <= {KNOB}:
            self._dead[layout] = (trial, message)
            return []
        return [{KNOB: layout}]

    def validate(self, candidate: Candidate) -> str | None:
        """A layout that failed with an error on its own (every other knob at its baseline)."""
        if candidate[KNOB] not in self._dead:
            return None
        trial, message = self._dead[candidate[KNOB]]
        return (
            f"layout {candidate[KNOB]} failed on its own (every other knob at its baseline) in trial {trial} "
            f"({message[:160]}): the model cannot run it, so it is not measured again"
        )
