"""The `libtpu_flags` knob: named sets of XLA TPU compiler flags from published recipes, put in
``LIBTPU_INIT_ARGS`` (read once, when libtpu starts: a trial of one runs in a fresh worker).

Only flags that act within one chip (collective, DCN, SparseCore-offload and host-offload flags
change nothing on one chip). The sets, each as the recipe spells it (sources: docs/knobs.md,
"TorchTPU's levers"): ``vmem_dense`` (``--xla_tpu_scoped_vmem_limit_kib=98304``, MaxText's
``DENSE_VMEM_LIMIT_FLAG``), ``vmem_moe`` (``=81920``, its ``MOE_VMEM_LIMIT_FLAG``) and
``no_bundle_cost_model`` (``--xla_tpu_use_bundle_aware_cost_model_for_fusions=false``, its
``DISABLE_BUNDLE_AWARE_COST_MODEL``).

The user's own ``LIBTPU_INIT_ARGS`` is kept and the set appended; a flag of the user's that the
set also names is replaced by the set's (logged), so the trial measures the set. libtpu refuses
a flag it does not know at start-up: on a libtpu without one, the trial fails with its message.
Not measured on a chip: in the opt-in ``torchtpu`` space only.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tpu_tuner.knobs.base import BackendLike, Knob
from tpu_tuner.knobs.capabilities import StartupEnvironment

if TYPE_CHECKING:
    from torch import nn

log = logging.getLogger(__name__)

DEFAULT = "default"
VARIABLE = "LIBTPU_INIT_ARGS"
FLAG_SETS: dict[str, tuple[str, ...]] = {
    "vmem_dense": ("--xla_tpu_scoped_vmem_limit_kib=98304",),
    "vmem_moe": ("--xla_tpu_scoped_vmem_limit_kib=81920",),
    "no_bundle_cost_model": ("--xla_tpu_use_bundle_aware_cost_model_for_fusions=false",),
}


class LibtpuFlagsKnob(Knob, StartupEnvironment):
    """``default`` (libtpu's flags as the user set them) or a named set of `FLAG_SETS`."""

    name = "libtpu_flags"
    agent = "compile"
    default = DEFAULT
    position = 13
    values = (DEFAULT, *FLAG_SETS)
    device_kinds = ("tpu",)
    described = "libtpu flags {value}"

    def check(self, value: str) -> str:
        if not isinstance(value, str) or value not in self.values:
            raise ValueError(f"libtpu_flags must be one of {', '.join(self.values)}, not {value!r}")
        return value

    def environment(self, value: str, backend: BackendLike) -> dict[str, str]:
        if value == DEFAULT:
            return {}
        return {VARIABLE: with_flags(os.environ.get(VARIABLE, ""), FLAG_SETS[value])}

    def code(self, value: str, device_kind: str) -> list[str]:
        if value == DEFAULT:
            return []
        # The variable itself is in the config's start-up instructions (`environment`).
        return [f"# libtpu flags {value}: {' '.join(FLAG_SETS[value])} in {VARIABLE} before torch is imported"]

    def observe(self, model: nn.Module, forward: Callable[..., Any], backend: BackendLike) -> str | None:
        return in_force(os.environ.get(VARIABLE, ""))


def _flag_name(token: str) -> str:
    return token.split("=", 1)[0]


def with_flags(current: str, flags: tuple[str, ...]) -> str:
    """`current` (the user's value) with `flags` appended; a token of `current` naming one of
    `flags`' flags gives way to it. Idempotent: the result given again is unchanged."""
    names = {_flag_name(flag) for flag in flags}
    kept = []
    for token in current.split():
        if _flag_name(token) in names and token not in flags:
            log.warning("%s: %s replaced by the measured set's %s", VARIABLE, token, _flag_name(token))
            continue
        if token not in flags:
            kept.append(token)
    return " ".join([*kept, *flags])


def in_force(current: str) -> str:
    """The set whose flags `current` holds (``default`` where none is)."""
    tokens = set(current.split())
    return next((name for name, flags in FLAG_SETS.items() if set(flags) <= tokens), DEFAULT)
