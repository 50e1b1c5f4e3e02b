"""The optimizer of the planner's training step: MaxText's opt_type "adamw" or "sgd".

MaxText's optimizers.py (https://github.com/AI-Hypercomputer/maxtext/blob/e591f30cbbf217ed67ef71263ec0538239f9c3b8/src/maxtext/optimizers/optimizers.py,
`get_optimizer`) builds "adamw" as optax.adamw (two moments a parameter: the first in mu_dtype,
the second in the weights' dtype) and "sgd" as ``optax.sgd(learning_rate_schedule)``: no
momentum, so optax chains `identity()` with the learning rate's scale and keeps no state a
parameter (only the schedule's scalar step count, which the planner leaves out as it does
AdamW's). Its update is one multiply-add a weight.
"""

from __future__ import annotations

from typing import Any

from tpu_tuner.core.errors import UserInputError

OPTIMIZERS = ("adamw", "sgd")


def check_optimizer(name: str, flag: str = "--optimizer") -> str:
    """`name` if the planner compiles it, else a one-line refusal (UserInputError)."""
    if name not in OPTIMIZERS:
        raise UserInputError(f"{flag} takes {' or '.join(OPTIMIZERS)}, not {name!r}")
    return name


def state_bytes_per_parameter(optimizer: str, first_moment_bytes: int = 4, weight_bytes: int = 4) -> int:
    """The optimizer state's bytes a parameter: AdamW's first moment in its own dtype and second in
    the weights'; none for SGD."""
    return first_moment_bytes + weight_bytes if check_optimizer(optimizer) == "adamw" else 0


def initial_state(optimizer: str, params: Any, first_moment_dtype: str) -> Any:
    """The optimizer state as the compiler sees it (ShapeDtypeStructs sharded as `params`): AdamW's
    (first, second) moments, or SGD's empty tuple."""
    import jax
    import jax.numpy as jnp

    if check_optimizer(optimizer) == "sgd":
        return ()
    first = jax.tree.map(
        lambda p: jax.ShapeDtypeStruct(p.shape, jnp.dtype(first_moment_dtype), sharding=p.sharding), params
    )
    return first, params


def apply_update(optimizer: str, weights: Any, state: Any, grads: Any) -> tuple[Any, Any]:
    """One optimizer step: the new weights and state (each in its stored dtype)."""
    import jax

    if check_optimizer(optimizer) == "sgd":
        return jax.tree.map(lambda w, g: (w - 1e-4 * g).astype(w.dtype), weights, grads), ()
    first, second = state
    first = jax.tree.map(lambda m, g: (0.9 * m + 0.1 * g).astype(m.dtype), first, grads)
    second = jax.tree.map(lambda v, g: (0.95 * v + 0.05 * g * g).astype(v.dtype), second, grads)
    # AdamW with its epsilon inside the square root (optax's eps_root): a reciprocal square
    # root instead of a square root and a divide, whose code is long: the same FLOPs, bytes and
    # memory, and less compile time (docs/planner.md, "Speed").
    weights = jax.tree.map(
        lambda w, m, v: (w - 1e-4 * (m * jax.lax.rsqrt(v + 1e-16) + 0.1 * w)).astype(w.dtype), weights, first, second
    )
    return weights, (first, second)


__all__ = ["OPTIMIZERS", "apply_update", "check_optimizer", "initial_state", "state_bytes_per_parameter"]
