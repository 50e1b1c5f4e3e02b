"""Whether a lever an agent's finding would suggest is searched for the profiled workload on the
agent's device, and if not, why (issue 55: a profile said "int8 quantized linears (torchao) may
pay off" for a model whose search space then left quantization out).

A finding names a lever only where the search space holds it: `left_out` says why it does not,
and the finding says that instead. Given the space (`Agent.diagnose(profile, space)`), its own
notes decide (`SearchSpace.left_out`, or the space not listing the knob at all); without it,
the checks `SearchSpace.for_workload` applies do (the knob's devices, the profiled workload's
traits, a choice that cannot run here, such as torchao not installed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tpu_tuner.knobs import registry as knobs
from tpu_tuner.knobs.capabilities import NarrowedByWorkload
from tpu_tuner.knobs.traits import WorkloadTraits, of_profile
from tpu_tuner.model.workloads.profiled import ProfiledWorkload
from tpu_tuner.tuning.search.search_space import SearchSpace

Wanted = Callable[[str], bool]
"""Which of a knob's choices make the lever (quantization: any but "none"); None: any choice."""


def left_out(
    knob: str, device_kind: str, profile: Any, space: SearchSpace | None, wanted: Wanted | None = None
) -> str | None:
    """Why the lever (`knob`, a `wanted` choice of it) is not searched for `profile`'s workload on
    `device_kind`; None where it is. From `space` where given, else from the knob's own checks."""
    if space is not None:
        return _left_out_of(space, knob, wanted)
    try:
        spec = knobs.get(knob)
    except KeyError:
        return None  # not a registered knob: nothing known to leave it out
    if not spec.applies_to(device_kind):
        return f"{knob} is not a setting on {device_kind}"
    traits = _traits(profile)
    if traits is None or not isinstance(spec, NarrowedByWorkload):
        return None
    if not spec.applies_to_workload(traits):
        return spec.not_applicable
    choices = [c for c in (spec.values or ()) if c != spec.default and (wanted is None or wanted(c))]
    refusals = [reason for c in choices if (reason := spec.choice_refusal(spec.check(c), traits)) is not None]
    return refusals[0] if choices and len(refusals) == len(choices) else None


def _left_out_of(space: SearchSpace, knob: str, wanted: Wanted | None) -> str | None:
    param = next((p for p in space.searched if p.name == knob), None)
    # The first choice is the baseline's: a lever is a choice the search can move to.
    if param is not None and any(wanted is None or wanted(c) for c in param.choices[1:]):
        return None
    notes = [line.split(": ", 1)[1] for line in space.left_out if line.startswith(f"{knob}: ")]
    if notes:
        return "; ".join(notes)
    return f"the search space {space.name!r} does not search it on {space.device_kind}"


def _traits(profile: Any) -> WorkloadTraits | None:
    """The profiled workload's traits; None where the profile recorded none (or is a stand-in)."""
    workload = getattr(profile, "workload", None)
    if isinstance(workload, ProfiledWorkload | Mapping):
        return of_profile(workload)
    return None


def not_searched(lever: str, reason: str) -> str:
    """A lever said as left out of the search, with why, in place of suggesting it: "int8
    quantized linears (torchao): not searched here (torchao is not installed ...)"."""
    return f"{lever}: not searched here ({reason})"


__all__ = ["Wanted", "left_out", "not_searched"]
