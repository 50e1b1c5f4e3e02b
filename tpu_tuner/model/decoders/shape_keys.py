"""The decoder shape's required keys, what each means, and the refusal of a shape missing some.

Kept apart from model/decoders/decoder_shape.py (which calls `refuse_incomplete` from `read_shape`) so that
module stays under the size limit. A shape missing keys is refused naming each one with its
meaning, and with the first rule the keys given already break (checked with stand-ins for the
missing sizes): ``decoder:d_model=100,layers=2,heads=3`` says that vocab and mlp are missing
and that heads (3) must divide d_model (100), not what a constructor's TypeError said.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from tpu_tuner.core.errors import WorkloadError

# In the order a shape states them; a test checks these are exactly the fields without a default.
REQUIRED_KEYS = {
    "vocab": "the vocabulary size, how many token ids",
    "d_model": "the model width, each token's vector",
    "layers": "how many transformer blocks",
    "heads": "the attention heads of each layer",
    "mlp": "the MLP's hidden width, often 4 x d_model",
}
# Stand-ins for missing keys that no rule of `check` but 'at least 1' reads, so that a rule the
# given keys break is reported beside the missing keys. d_model, heads and layers have none:
# the width, head and layer rules read them.
_NEUTRAL = {"vocab": 1, "mlp": 1}


class _Shape(Protocol):
    def check(self, where: str | Path) -> None: ...


def refuse_incomplete(shape_class: type[_Shape], model: dict[str, Any], where: str | Path) -> None:
    """A one-line `WorkloadError` naming `where` when `model` lacks a required key: each missing
    key with its meaning, then the first rule the keys given break (where it can be checked)."""
    missing = [key for key in REQUIRED_KEYS if key not in model]
    if not missing:
        return
    named = [f"{key} ({REQUIRED_KEYS[key]})" for key in missing]
    message = "incomplete shape: missing " + (
        named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
    )
    broken = _rule_broken(shape_class, model, missing, where)
    raise WorkloadError(message + (f"; also {broken}" if broken else ""), where)


def _rule_broken(shape_class: type[_Shape], model: dict[str, Any], missing: list[str], where: str | Path) -> str:
    if not set(missing) <= set(_NEUTRAL):
        return ""
    try:
        shape_class(**{**_NEUTRAL, **model}).check(where)
    except WorkloadError as exc:
        return str(exc).removeprefix(f"{where}: ")
    return ""


__all__ = ["REQUIRED_KEYS", "refuse_incomplete"]
