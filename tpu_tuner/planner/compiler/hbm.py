"""The TPU compiler's own HBM limit per device: what "fits" means.

Google's spec pages state HBM per chip in round numbers whose units are easy to misread (v5e's
"16 GB" is 16 GiB, not 16e9 bytes), and the compiler does not offer the whole of it. The compiler
states its limit when a program does not fit: "... exceeds available HBM (95.74G)". So the planner
compiles, once per topology, a one-operation program whose operand (1 TiB) fits nowhere and reads
the limit from the refusal (well under a second; the limits per generation: docs/planner.md,
"What fits").

The figure is XLA's human-readable byte count (binary units, two decimals): exact to 0.005 GiB
(5 MiB), far below any margin the plan reports.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from tpu_tuner.core.errors import first_line

log = logging.getLogger(__name__)

_LIMIT = re.compile(r"exceeds available HBM \((?P<value>[\d.]+)(?P<unit>[KMGTP]?)i?B?\)")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}
PROBE_BYTES = 2**40  # fits no TPU made


def parse_hbm_limit(message: str) -> int | None:
    """The HBM limit (bytes) a compiler out-of-memory message states, or None."""
    found = _LIMIT.search(message)
    if found is None:
        return None
    return int(float(found.group("value")) * _UNITS[found.group("unit")])


def compiler_hbm_limit(device: Any) -> int | None:
    """The HBM bytes the TPU compiler gives one program on `device` (a compile-only TPU device),
    read from its refusal of a program too big for any TPU; None (logged) when it says nothing
    parseable, and the caller falls back on the published capacity."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    operand = jax.ShapeDtypeStruct((PROBE_BYTES // 4,), jnp.float32, sharding=SingleDeviceSharding(device))
    try:
        jax.jit(lambda x: x * 2 + 1).lower(operand).compile()
    except Exception as exc:
        limit = parse_hbm_limit(str(exc))
        if limit is None:
            log.warning("the TPU compiler's refusal stated no HBM limit (%s)", first_line(exc)[:200])
        return limit
    log.warning("the TPU compiler accepted a %d-byte program: no HBM limit read", PROBE_BYTES)
    return None


__all__ = ["compiler_hbm_limit", "parse_hbm_limit"]
