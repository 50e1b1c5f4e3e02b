"""``key=value,key=value`` lists typed on a command line (an ``hf:`` source's overrides, an inline
``decoder:`` shape): each value read as the bool, None, int or float it spells, else kept as text."""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from tpu_tuner.core.errors import UserInputError


def parse_key_values(items: str, source: str, error: type[UserInputError] = UserInputError) -> dict[str, Any]:
    """The pairs of the comma-separated `items`; an item without ``=`` or a key raises `error`
    naming `source` (the text the user typed)."""
    pairs: dict[str, Any] = {}
    for item in filter(None, items.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise error(f"{item!r} is not key=value", source)
        pairs[key.strip()] = typed_value(value.strip())
    return pairs


def typed_value(text: str) -> Any:
    """`text` as the value it spells: true / false, none / null, an int, a float, else the text."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for cast in (int, float):
        with suppress(ValueError):
            return cast(text)
    return text


__all__ = ["parse_key_values", "typed_value"]
