"""A recipe's XLA / libtpu flags (`tpu-tune plan --xla-flags`): read as LIBTPU_INIT_ARGS spells
them, passed to the TPU compile as its options, and written back the same way."""

from __future__ import annotations

from tpu_tuner.core.errors import UserInputError


def parse_xla_flags(text: str) -> tuple[tuple[str, bool | int | str], ...]:
    """--xla-flags: a recipe's XLA / libtpu flags as LIBTPU_INIT_ARGS spells them
    ("--xla_tpu_scoped_vmem_limit_kib=81920 --xla_enable_async_all_gather=true"), as the TPU
    compile's options: true / false as booleans, whole numbers as integers, the rest as text."""
    flags: list[tuple[str, bool | int | str]] = []
    for token in text.split():
        name, equals, value = token.removeprefix("--").partition("=")
        if not token.startswith("--") or not equals or not name.startswith("xla_") or not value:
            raise UserInputError(f"--xla-flags takes --xla_NAME=VALUE words separated by spaces, not {token!r}")
        typed: bool | int | str = value
        if value.lower() in ("true", "false"):
            typed = value.lower() == "true"
        elif value.lstrip("-").isdigit():
            typed = int(value)
        flags.append((name, typed))
    return tuple(flags)


def xla_flags_text(flags: tuple[tuple[str, bool | int | str], ...]) -> list[str]:
    """`flags` as LIBTPU_INIT_ARGS spells them (what parse_xla_flags reads)."""
    return [f"--{name}={str(value).lower() if isinstance(value, bool) else value}" for name, value in flags]
