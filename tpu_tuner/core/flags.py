"""Command-line flags declared on the options dataclasses: one field, one flag.

A field of an options section names its flag in its metadata (`option(default, "--name", ...)`): the spelling, help,
metavar, choices, argparse's `type`, and `convert` from what argparse parsed to the field's value.
`add_section` adds a section's flags to a parser, their defaults read from the fields (each default
is stated once); `section_from` builds the section back from the parsed arguments. A flag several
commands share is defined once below (`DEVICE`, `STORAGE`, ...) and named by each command's field.
Standard library only: the options modules import it before torch or optuna.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_tuner.core.errors import UserInputError

# The metadata key a field's `Flag` is stored under.
FLAG = "flag"
_UNSET: Any = object()


class DefaultWords(str):
    """A flag's default as its help shows it ("4m"), told apart from the same words given on the
    command line: argparse hands this very object back only when the flag was not given, so a
    field whose default means something of its own (a clock fitted to the device) sees the choice."""

    def __str__(self) -> str:
        return self  # argparse's str() of the default keeps this object, not a plain copy


@dataclass(frozen=True)
class Flag:
    """How one option field is spelled on the command line (`names[0]`, then its aliases)."""

    names: tuple[str, ...]
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    type: Callable[[str], Any] = str  # argparse's conversion of the text (int, float, Path)
    convert: Callable[[Any], Any] | None = None  # the parsed value to the field's; errors are UserInputError
    typed: Any = _UNSET  # the default as typed, where it is not the field's own ("auto", "4m")
    append: bool = False  # repeatable: a list of every value given
    required: bool = False

    def adapted(self, **changes: Any) -> Flag:
        """The same flag with a command's own words (what its default means there) or choices."""
        return dataclasses.replace(self, **changes)


def option(default: Any, *names: str, help: str, factory: bool = False, **spelling: Any) -> Any:
    """A section's field with its flag: ``trials: int | None = option(None, "--trials", type=int, help=...)``
    (`factory`: `default` is called for each instance, a dataclass's default_factory; MISSING: none)."""
    metadata = {FLAG: Flag(names, help, **spelling)}
    if factory:
        return dataclasses.field(default_factory=default, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def uses(default: Any, shared: Flag, **words: Any) -> Any:
    """A section's field whose flag is defined once for several commands: ``uses(None, SEQ_LEN)``,
    with a command's own `words` where they differ (its help, metavar or choices)."""
    return dataclasses.field(default=default, metadata={FLAG: shared.adapted(**words) if words else shared})


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def add_flag(parser: argparse._ActionsContainer, spec: Flag, dest: str, default: Any = None) -> None:
    """One flag; a boolean field (`default` True or False) is a switch that sets the other value."""
    default = default if spec.typed is _UNSET else spec.typed
    if isinstance(default, bool):
        action = "store_false" if default else "store_true"
        parser.add_argument(*spec.names, dest=dest, action=action, default=default, help=spec.help)
        return
    parser.add_argument(
        *spec.names,
        dest=dest,
        default=default,
        help=spec.help,
        metavar=spec.metavar,
        choices=spec.choices,
        action="append" if spec.append else "store",
        required=spec.required,
        type=spec.type,
    )


def add_section(parser: argparse._ActionsContainer, section: type) -> None:
    """The flags of every field of `section` that names one; each flag's dest is its field's name."""
    taken = {action.dest for action in parser._actions}
    for f in dataclasses.fields(section):
        spec = f.metadata.get(FLAG)
        if spec is not None:
            # One namespace for every section of a command: two fields of one name would share a flag's value.
            assert f.name not in taken, f"{section.__name__}.{f.name}: another section's field has this name"
            add_flag(parser, spec, f.name, _field_default(f))


def section_from(args: argparse.Namespace, section: type, **values: Any) -> Any:
    """`section` built from the parsed flags, `values` for fields without one; a flag left at its
    default gives the field's default, a given one its converted value. The section's
    __post_init__ checks the whole."""
    for f in dataclasses.fields(section):
        spec = f.metadata.get(FLAG)
        if spec is None or f.name in values:
            continue
        value, default = getattr(args, f.name), _field_default(f)
        if spec.typed is _UNSET:
            unset = value == default
        else:  # the default's own words given on the command line count as given (`DefaultWords`)
            unset = value is spec.typed if isinstance(spec.typed, DefaultWords) else value == spec.typed
        if unset:
            values[f.name] = default
        else:
            values[f.name] = spec.convert(value) if spec.convert is not None else value
    return section(**values)


def sections_from(args: argparse.Namespace, sections: Mapping[str, type]) -> dict[str, Any]:
    """Every section of an options class, by its attribute name."""
    return {name: section_from(args, cls) for name, cls in sections.items()}


def device_or_none(device: str) -> str | None:
    """`--device auto` is the options' None: the best device present."""
    return None if device == "auto" else device


def comma_list(text: str) -> tuple[str, ...]:
    """`a,b,c` as its non-empty entries."""
    return tuple(entry.strip() for entry in text.split(",") if entry.strip())


def at_least(minimum: int, *named: tuple[str, int | None]) -> None:
    """Refuse a (flag, value) below `minimum` (None is unset): a section's check."""
    for name, value in named:
        # "2" or True from the Python API: no TypeError below (an int subclass marking a default is an int)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise UserInputError(f"{name} must be a whole number, not {value!r}")
        if value is not None and value < minimum:
            raise UserInputError(f"{name} must be at least {minimum}, not {value}")


def positive(*named: tuple[str, float | None]) -> None:
    """Refuse a (flag, value) that is not above 0 (None is unset): a section's check."""
    for name, value in named:
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise UserInputError(f"{name} must be a number, not {value!r}")
        if value is not None and not value > 0:
            raise UserInputError(f"{name} must be positive, not {value:g}")


# The flags several commands share, defined once.
DEVICE = Flag(("--device",), "auto (default: the best present), tpu, cuda or cpu", typed="auto", convert=device_or_none)
BATCH_SIZE = Flag(("--batch-size",), "batch size (default: the file's BATCH_SIZE)", type=int)
SEQ_LEN = Flag(("--seq-len", "--seq"), "sequence length (default: the file's SEQ_LEN)", type=int)
STORAGE = Flag(("--storage",), "Optuna storage URL (default: $TPU_TUNE_STORAGE, else SQLite in the results folder)")
STUDY = Flag(("--study",), "the study's name in the storage", metavar="NAME")
SAMPLER = Flag(("--sampler",), "Optuna sampler (default %(default)s)")
SEED = Flag(("--seed",), "the sampler's seed (default %(default)s)", type=int)
ATTENTION = Flag(
    ("--attention",), "attention FLOPs convention for MFU (default %(default)s)", choices=("full", "causal")
)
LENGTHS = Flag(
    ("--lengths",),
    "input length sample: CSV (a 'length' column) or one number a line (default: the file's sample_lengths())",
    metavar="LENGTHS",
    type=Path,
)
MAX_BUCKETS = Flag(("--max-buckets",), "most compiled shapes when inputs vary (default %(default)s)", type=int)
OUT = Flag(("--out",), "results folder (default: %(default)s/)", type=Path)

__all__ = [
    "ATTENTION",
    "BATCH_SIZE",
    "DEVICE",
    "FLAG",
    "LENGTHS",
    "MAX_BUCKETS",
    "OUT",
    "SAMPLER",
    "SEED",
    "SEQ_LEN",
    "STORAGE",
    "STUDY",
    "Flag",
    "add_flag",
    "at_least",
    "positive",
    "add_section",
    "comma_list",
    "device_or_none",
    "option",
    "section_from",
    "sections_from",
    "uses",
]
