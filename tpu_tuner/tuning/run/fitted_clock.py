"""The default clock fitted to what a setting costs on the device at hand: one rule for every device.

A setting can be expensive before its first timed step: on a TPU a process opens the chip and a
compile runs from nothing (on a v5e, 25-40 s a setting against a 4-minute default, so the README
example measured 8 settings and a Llama-class model 3; docs/torchtpu.md); on a slow CPU a large
model's steps alone fill the clock (KernelBench's MiniGPTBlock on a 2-core AMD EPYC host, a 9.0 s
step: "undecided: only the baseline fit in 4.0 min"). A fixed default then spends itself on one
or two settings and verifies nothing. So where the user left the clock at its default, on any
device, it is sized after the baseline's load and profile, from what they took: room for
`MIN_SEARCH_SETTINGS` settings and the finish's `FINISH_SETTINGS`, each costed as the baseline's
load and profile measured (less what was done once for the machine, the CPU's peak probe), never
shorter than the default and never longer than `LONGEST_FITTED_S`. A fast model keeps the
default (the README example's load and profile take seconds). A given --time-budget is never
changed.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_tuner.core.units import duration, parse_duration
from tpu_tuner.tuning.options.search_options import LONGEST_FITTED_BUDGET, DefaultBudget
from tpu_tuner.tuning.run.clock import WRAP_UP_S

# Settings the search should measure within a fitted clock: the baseline and the agents' first
# proposals, the few a verdict needs (on CPU the default clock measures about 12).
MIN_SEARCH_SETTINGS = 8
# The finish compares the baseline and the best (and a leader in a race), each built once more.
FINISH_SETTINGS = 3
# Past this the user chooses: a longer default would hold a shared chip for longer than asked.
LONGEST_FITTED_S = parse_duration(LONGEST_FITTED_BUDGET) or 0.0


@dataclass(frozen=True)
class FittedClock:
    """The clock a run keeps: its seconds and, where it was fitted, the words that say why."""

    budget_s: float
    words: str = ""


def fit_default_clock(
    budget_s: float | None, device_kind: str, elapsed_s: float, once_s: float = 0.0
) -> FittedClock | None:
    """The clock for a run whose baseline was loaded and profiled in `elapsed_s` (the run's clock
    so far: a worker started, the device opened, the model built, the baseline warmed up and
    timed), `once_s` of it on what no later setting pays again (a peak probe then cached); None
    where the budget stays as it is (none, given by the user, or the default already room enough)."""
    if budget_s is None or not isinstance(budget_s, DefaultBudget):
        return None
    per_setting = max(elapsed_s - max(once_s, 0.0), 0.0)
    needed = elapsed_s + (MIN_SEARCH_SETTINGS + FINISH_SETTINGS) * per_setting + WRAP_UP_S
    if needed <= budget_s:
        return None
    fitted = min(needed, LONGEST_FITTED_S)
    held = "" if fitted == needed else f", held to {duration(LONGEST_FITTED_S)} (give --time-budget for more)"
    return FittedClock(
        fitted,
        f"the default {duration(budget_s)} fitted to {duration(fitted)} on this {device_kind}: loading and "
        f"profiling the baseline took {duration(elapsed_s)}, and {MIN_SEARCH_SETTINGS} settings and the "
        f"verification at that cost each need about {duration(needed)}{held}",
    )
