"""Public on-demand prices of TPU chips (US dollars per chip-hour), for ranking slices by tokens per
dollar: the shipped `tpu_prices.toml` (each price with its source and the date it was read), and
`--price GEN=USD` given on the command line, which overrides or adds one.

Standard library only: the parent process of `tpu-tune plan` checks the flags with it before any
compiler starts.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.hardware import TPU_CHIPS

PRICES_FILE = Path(__file__).with_name("tpu_prices.toml")
# The other spellings parse_topology accepts for a generation (topology.py).
_ALIASES = {"v5litepod": "v5e", "v7x": "tpu7x"}
_FIELDS = ("usd_per_chip_hour", "source", "states", "read")


@dataclass(frozen=True)
class Price:
    """One generation's price per chip-hour and where it comes from."""

    generation: str
    usd_per_chip_hour: float
    source: str  # a public URL, or "--price" for a price given on the command line
    states: str = ""  # what the source says, in its words where they are short
    read: str = ""  # the date the source was read (ISO), or the date of the run for --price

    @property
    def given(self) -> bool:
        """True for a price from the command line rather than the shipped file."""
        return self.source == "--price"


def generation_of(text: str) -> str | None:
    """The generation key (``v5e``) `text` names, aliases included; None if it names none."""
    key = text.strip().lower()
    key = _ALIASES.get(key, key)
    return key if key in TPU_CHIPS else None


def load_prices(path: Path = PRICES_FILE) -> dict[str, Price]:
    """The prices of a price file, keyed by generation. A malformed file raises `UserInputError`
    naming it and the entry (the shipped one is checked by the tests)."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserInputError(f"cannot read the price file: {exc}", path) from exc
    prices = {}
    for name, entry in data.items():
        generation = generation_of(name)
        if generation is None or not isinstance(entry, dict):
            raise UserInputError(f"[{name}] is not a TPU generation ({', '.join(TPU_CHIPS)})", path)
        missing = [key for key in _FIELDS if key not in entry]
        if missing:
            raise UserInputError(f"[{name}] lacks {', '.join(missing)}", path)
        usd = entry["usd_per_chip_hour"]
        if not _positive(usd):
            raise UserInputError(f"[{name}] usd_per_chip_hour must be a positive number, not {usd!r}", path)
        prices[generation] = Price(
            generation, float(usd), str(entry["source"]), str(entry["states"]), str(entry["read"])
        )
    return prices


def parse_price_flags(values: list[str] | None) -> dict[str, float]:
    """``--price`` values (repeatable, each one or more ``GEN=USD`` separated by commas) as
    {generation: USD per chip-hour}; a malformed item, an unknown generation, a price that is not
    a positive number or a generation priced twice raises `UserInputError` in one line."""
    given: dict[str, float] = {}
    for value in values or ():
        for item in value.split(","):
            name, sep, number = item.partition("=")
            if not sep or not name.strip() or not number.strip():
                raise UserInputError(f"--price takes GEN=USD_PER_CHIP_HOUR, e.g. v6e=2.70, not {item.strip()!r}")
            generation = generation_of(name)
            if generation is None:
                raise UserInputError(
                    f"--price {item.strip()}: unknown TPU generation {name.strip()!r} (known: {', '.join(TPU_CHIPS)})"
                )
            try:
                usd = float(number)
            except ValueError:
                usd = math.nan
            if not _positive(usd):
                raise UserInputError(
                    f"--price {item.strip()}: the price must be a positive number of US dollars per chip-hour"
                )
            if generation in given:
                raise UserInputError(f"--price gives {generation} twice")
            given[generation] = usd
    return given


def price_table(given: dict[str, float] | None = None, path: Path = PRICES_FILE) -> dict[str, Price]:
    """The file's prices with `given` (from `parse_price_flags`) overriding or adding their own."""
    prices = load_prices(path)
    today = date.today().isoformat()
    for generation, usd in (given or {}).items():
        prices[generation] = Price(generation, usd, "--price", "given on the command line", today)
    return prices


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


__all__ = ["PRICES_FILE", "Price", "generation_of", "load_prices", "parse_price_flags", "price_table"]
