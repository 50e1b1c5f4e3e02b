"""The error of a layout that cannot apply (its own module, so that every module of `parallel/`
can raise it without importing another)."""

from __future__ import annotations

from tpu_tuner.core.errors import UserInputError


class LayoutError(UserInputError):
    """A layout that cannot apply to this model on this many ranks."""
