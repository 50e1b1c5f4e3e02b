"""Typed exceptions. Library code raises these; only the CLI turns them into exit statuses."""

from __future__ import annotations

from pathlib import Path


class TpuTuneError(Exception):
    """Base class of every error tpu-tune raises on purpose."""

    exit_status = 1


class UserInputError(TpuTuneError):
    """Bad input from the user (a file, a flag, a value): the CLI exits with status 2."""

    exit_status = 2

    def __init__(self, message: str, path: str | Path | None = None) -> None:
        self.path = str(path) if path is not None else None
        # One line whatever was typed: a flag's value may hold a line break, and the refusal
        # quotes it (found by tests/test_fuzz_parsers.py).
        text = f"{self.path}: {message}" if self.path else message
        super().__init__(text.replace("\r", "\\r").replace("\n", "\\n"))


class WorkloadError(UserInputError):
    """The model file cannot be loaded or its workload does not run."""


class DefinitionError(UserInputError):
    """An agent or search-space TOML file is missing or malformed."""


class BackendError(TpuTuneError):
    """A device backend was requested that is not present or cannot run."""

    exit_status = 2


def first_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message (its type alone
    where it has no message: a compiler's message-less error must not become an IndexError)."""
    line = first_text_line(str(exc))
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def first_text_line(text: str) -> str:
    """The first line of `text` with something on it, stripped; "" for a blank text."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")
