"""A path the user typed, with its `~` expanded, or a one-line refusal.

`Path.expanduser` raises RuntimeError for `~name` when no user `name` exists (found by
tests/test_fuzz_parsers.py: `hf:~0` ended in a traceback, not exit status 2)."""

from __future__ import annotations

from pathlib import Path

from tpu_tuner.core.errors import UserInputError


def expand_user(path: str | Path, source: str | None = None) -> Path:
    """`path` with a leading `~` or `~user` expanded; `UserInputError` (naming `source`, the text
    the user typed) where that user does not exist or no home folder is known."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise UserInputError(f"{str(path).split('/')[0]!r}: no such user's home folder", source) from None


__all__ = ["expand_user"]
