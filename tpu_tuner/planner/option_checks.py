"""`PlanOptions` as the Python API receives them (`tpu_tuner.plan`): each field of its type and
within its range, else one `UserInputError` line, before a compiler process starts. The CLI
refuses its flags with their own names first (cli/plan.py); this is the same guard for a caller
who builds the options in Python."""

from __future__ import annotations

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.field_types import check_field_types
from tpu_tuner.model.layouts import Layout
from tpu_tuner.planner.optimizer import check_optimizer
from tpu_tuner.planner.options import PlanOptions
from tpu_tuner.planner.remat import parse_remat
from tpu_tuner.planner.search import PLAN_SAMPLERS

QUANTIZATIONS = (None, "int8", "fp8")  # planner/quantized_matmul.py's, without importing torch here
DTYPES = ("float32", "bfloat16")


def check_plan_options(options: PlanOptions) -> None:
    """Refuse options no plan can use, in one line naming the field."""
    check_field_types(options)
    at_least = {"slices": 1, "accumulation": 1, "vocab_tiling": 1, "max_layouts": 1, "workers": 1, "seed": 0}
    for name, least in at_least.items():
        if getattr(options, name) < least:
            raise UserInputError(f"PlanOptions: {name} must be at least {least}, not {getattr(options, name)}")
    for name in ("global_batch", "seq_len", "budget"):
        if getattr(options, name) is not None and getattr(options, name) < 1:
            raise UserInputError(f"PlanOptions: {name} must be at least 1, not {getattr(options, name)}")
    for name, allowed in (
        ("weight_dtype", DTYPES),
        ("first_moment_dtype", DTYPES),
        ("quantization", QUANTIZATIONS),
        ("sampler", PLAN_SAMPLERS),
    ):
        if getattr(options, name) not in allowed:
            raise UserInputError(f"PlanOptions: {name} must be one of {allowed}, not {getattr(options, name)!r}")
    check_optimizer(options.optimizer, "PlanOptions: optimizer")
    for policy in (options.remat, *options.remats):
        parse_remat(policy, "PlanOptions: remat")
    for name in ("accumulations", "contexts"):
        if not getattr(options, name) or min(getattr(options, name)) < 1:
            raise UserInputError(f"PlanOptions: {name} must be sizes of at least 1, not {getattr(options, name)}")
    layouts = options.layouts
    if layouts is not None and not (isinstance(layouts, (list, tuple)) and all(isinstance(x, Layout) for x in layouts)):
        raise UserInputError("PlanOptions: layouts must be Layout values (tpu_tuner.model.layouts.parse_layout)")


__all__ = ["check_plan_options"]
