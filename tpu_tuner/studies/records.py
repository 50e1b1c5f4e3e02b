"""The trial record: the user-attribute keys a trial of any tpu-tune study stores, named once.

Both features keep their results in Optuna trial attributes, so that a study's storage alone
rebuilds a run (the tuner's report, the planner's plan). The strings below are a file format:
studies written by earlier versions are read with them, so a value never changes, only a name.
Plain constants, no Optuna import: the options and the dashboard read them cheaply.

A trial of either feature keeps its keys in ONE user attribute, `RECORD` (a dict of the keys
below, written by studies/trial_record.py in one storage call a write), which names its layout
under `VERSION` (`RECORD_VERSION`). Earlier layouts: each key its own attribute (every planner
trial, tuning trials before issue 26), and a tuning record without a version (issue 26 to 37).
`attrs` reads all three.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Protocol

from tpu_tuner.core.failures import FailureKind

# Who ran a trial, and where (every trial the loop asks; studies/loop.py).
WORKER = "worker"
HOST = "host"
# The hosts whose ranks ran a trial that spans hosts ("host (node k, agent pid p)" each).
HOSTS = "hosts"

# The loop's claims (the tuner's record): a trial answered from an earlier one's result names it;
# one whose setting another worker was measuring also says so; one asked when the budget was
# already spoken for was released unmeasured.
REPEAT_OF = "repeat_of"
IN_FLIGHT_ELSEWHERE = "in_flight_elsewhere"
OVER_BUDGET = "over_budget"

# How a tuning trial ended when it measured nothing useful (a lost worker records none of them:
# liveness.is_lost), and who turned it away before it ran.
FAILURE_KIND = "failure_kind"
FAILURE_MESSAGE = "failure_message"
REJECTED_BY = "rejected_by"
INTERRUPTED = FailureKind.INTERRUPTED  # the failure kind of a trial left RUNNING by an interrupted run

# Failure learning (tuning/search/failure_learning.py): a trial asked for a setting the study had excluded names
# the cause (it is not measured); a probe queued to tell two suspects apart names what it tests;
# the study keeps each cause found under EXCLUSION_PREFIX + its key (a study user attribute).
EXCLUDED_BY = "excluded_by"
PROBE_FOR = "probe_for"
EXCLUSION_PREFIX = "exclusion:"
# A trial whose measurement stopped early, hopeless against the best so far (tuning/search/pruning.py):
# why, and what it measured until then (an EarlyStop's fields).
STOPPED_EARLY = "stopped_early"
EARLY_STOP = "early_stop"

# A tuning trial's measurement and what it says.
MEASURED = "measured"
MEASUREMENT = "measurement"
TRIAL_WALL_S = "trial_wall_s"
FEASIBLE = "feasible"
CANDIDATE = "candidate"
ACCURACY_ERROR = "accuracy_error"  # against the fp32 reference
# The baseline's error against the fp32 reference, the trial's against the baseline's outputs, and
# what the guardrail judges: its error against fp32 beyond the baseline's (execution/measurement.py).
BASELINE_ACCURACY_ERROR = "baseline_accuracy_error"
ACCURACY_ERROR_VS_BASELINE = "accuracy_error_vs_baseline"
ACCURACY_EXCESS = "accuracy_excess"
PEAK_MEMORY_BYTES = "peak_memory_bytes"
# The study's memory limit the trial was judged under (the device's, or --trial-memory-gb): the
# finish's clock knows from it which settings a window cannot keep side by side.
MEMORY_LIMIT_BYTES = "memory_limit_bytes"
# The peak estimated on fake tensors before the trial ran, its error against the measured peak,
# and why there was none (execution/memory_estimate.py).
ESTIMATED_PEAK_BYTES = "estimated_peak_bytes"
ESTIMATE_ERROR = "estimate_error"
ESTIMATE_NOTE = "estimate_note"
STEP_MEDIAN_S = "step_median_s"
COMPILE_S = "compile_s"
# Where the rest of a measured trial's wall time went (studies/trial_costs.py): its worker's
# start-up, its steps at their steady speed, and the overhead left.
WORKER_START_S = "worker_start_s"
STEPS_S = "steps_s"
OVERHEAD_S = "overhead_s"
REFERENCE_S = "reference_s"  # of the overhead: the fp32 reference's and the baseline's outputs
# Of the overhead too, each measured in the trial's worker: the step's memory estimate on fake
# tensors, building the model, optimizer and batch, and the accuracy check's comparison.
ESTIMATE_S = "estimate_s"
BUILD_S = "build_s"
JUDGE_S = "judge_s"
# The start-up variables the trial's worker was started with ("NAME=value" strings, sorted; none:
# any worker runs it): settings with different ones are compared in processes of their own.
START_ENV = "start_env"
AMORTISED_STEP_S = "amortised_step_s"
MFU = "mfu"
BUCKETS = "buckets"
PADDING_WASTE = "padding_waste"
# How a setting was queued from an earlier study (tuning/search/warm_start.py); kept by a lost trial's retry.
WARM_START = "warm_start"
# Not stored on the trial (a finished trial's attributes are fixed): trials.csv's columns for a
# trial that a window (the race, the verification) timed again, from result.json: its step and
# MFU there, and whether they supersede the search's figures (tuning/verify/window_marks.py).
WINDOW_STEP_S = "window_step_s"
WINDOW_MFU = "window_mfu"
SUPERSEDED = "search_figure_superseded"
FIGURE_NOTE = "figure_note"

# The planner's record: what became of a trial ("outcome", a `PlanOutcome`), why, the point it
# holds, whether it holds a compile of the budget, and the compiler's figures.
OUTCOME = "outcome"
REASON = "reason"
POINT = "point"
COMPILING = "compiling"
COMPILED_STEP = "compiled"
FIT_EFFORT = "fit_effort"  # which compile decided "fits": "fast", "full", or full near the limit
CONSTRAINT_VALUE = "constraint"


class PlanOutcome(StrEnum):
    """What became of a planner trial (the stored word); only the first two compiled."""

    COMPILED = "compiled"
    REFUSED = "refused"  # by the compiler (out of memory, mostly)
    INVALID = "invalid"  # sizes that do not divide
    LOWER_BOUND = "lower_bound"  # its HBM lower bound exceeds the device's
    REPEAT = "repeat"  # compiled, or compiling, in an earlier trial
    RELEASED = "released"  # asked when other workers' compiles had filled the budget


# The one user attribute that holds a trial's record (a dict of the keys above), and the key in
# it naming the record's layout.
RECORD = "record"
VERSION = "record_version"
RECORD_VERSION = 2


class _HasUserAttrs(Protocol):
    @property
    def user_attrs(self) -> dict[str, Any]: ...


def attrs(trial: _HasUserAttrs) -> Mapping[str, Any]:
    """A trial's record as flat keys: its user attributes with the structured `RECORD` merged
    in (its keys win: it is written last). A trial of an earlier version (no `RECORD`) reads as
    it was stored. Read only: the result may be the trial's own dict."""
    user = trial.user_attrs
    record = user.get(RECORD)
    if not isinstance(record, dict):
        return user
    merged = {key: value for key, value in user.items() if key != RECORD}
    merged.update((key, value) for key, value in record.items() if key != VERSION)
    return merged


__all__ = [name for name in dir() if name.isupper()] + ["PlanOutcome", "attrs"]
