"""Hypothesis strategies for the fuzz tests (tests/test_fuzz_*.py): near-valid inputs.

Random text rarely gets past a parser's first check; these start from the input's grammar with
random values (numbers of every kind: huge, negative, NaN, inf, unicode digits, empty) and then
mutate the result as a typing hand would (drop, duplicate, swap, insert or replace characters),
so the examples reach the checks deep inside each parser."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

# Characters a mutation inserts: the grammars' own separators, whitespace, quotes and a few
# characters that are digits or letters only to unicode (Arabic-Indic three, a fraction, infinity).
# A lone surrogate stands for a byte that is no UTF-8: Python reads such a byte in argv or a file
# name as one (surrogateescape), and a file written with it (surrogatepass) is not UTF-8 text.
NASTY_CHARS = [*",=x:?#-.+_/\\ \t\n'\"[]{}()$%@*\x00é٣½∞ß\u200b", "\udcff"]

NUMBER_WORDS = (
    "0", "1", "-1", "2", "8", "64", "0.5", "-0", "+3", "1e3", "1e30", "1e400", "-1e400", "nan", "NaN", "inf",
    "-inf", "Infinity", "0x10", "1_000", "٣", "½", "", " ", "true", "none", "9" * 40, "007", "1.", ".5",
)  # fmt: skip


def numbers() -> st.SearchStrategy[str]:
    """Number-like text: small and huge integers, floats of every kind, words that only look like one."""
    return st.one_of(
        st.integers(-3, 300).map(str),
        st.integers(0, 9).map(str),
        st.integers().map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.sampled_from(NUMBER_WORDS),
    )


def values() -> st.SearchStrategy[Any]:
    """Python values as an API caller might pass them: of the right kind or not."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-5, 100),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=12),
        st.sampled_from(["10m", "none", "1x2x1", "cpu", "tpe"]),
        st.lists(st.integers(-2, 10), max_size=3),
    )


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[str], max_edits: int = 3) -> str:
    """`base`'s text with up to `max_edits` character edits."""
    text = draw(base)
    for _ in range(draw(st.integers(0, max_edits))):
        edit = draw(st.sampled_from(("drop", "duplicate", "swap", "insert", "replace")))
        if not text:
            edit = "insert"
        i = draw(st.integers(0, max(0, len(text) - 1)))
        char = draw(st.one_of(st.sampled_from(NASTY_CHARS), st.characters()))
        if edit == "drop":
            text = text[:i] + text[i + 1 :]
        elif edit == "duplicate":
            text = text[: i + 1] + text[i:]
        elif edit == "swap" and i + 1 < len(text):
            text = text[:i] + text[i + 1] + text[i] + text[i + 2 :]
        elif edit == "insert":
            text = text[:i] + char + text[i:]
        else:
            text = text[:i] + char + text[i + 1 :]
    return text


def near(grammar: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """The grammar's own texts (half the examples), their mutations, and a few arbitrary texts."""
    return st.one_of(grammar, grammar, grammar, mutated(grammar), mutated(grammar), mutated(grammar, 8), st.text())


def joined(parts: st.SearchStrategy[str], separator: str, max_size: int = 4) -> st.SearchStrategy[str]:
    """Up to `max_size` of `parts` joined by `separator`."""
    return st.lists(parts, max_size=max_size).map(separator.join)


def key_values(keys: list[str], value: Callable[[], st.SearchStrategy[str]] = numbers) -> st.SearchStrategy[str]:
    """``key=value,...`` with keys mostly from `keys` and values from `value`."""
    key = st.one_of(st.sampled_from(keys), st.text(max_size=8))
    return joined(st.tuples(key, value()).map(lambda kv: f"{kv[0]}={kv[1]}"), ",", 6)


def budget(share: float) -> settings:
    """This test's share of the loaded profile's examples (tests/conftest.py): a test whose
    example costs a config or a space load takes fewer than one that parses a flag."""
    return settings(max_examples=max(10, round(settings.default.max_examples * share)))


def write(file: Path, text: str) -> Path:
    """`text` into `file` as UTF-8, a lone surrogate as the bytes no UTF-8 reader accepts."""
    file.write_bytes(text.encode("utf-8", "surrogatepass"))
    return file


# --- the grammars of what a user types (tests/test_fuzz_parsers.py, test_fuzz_cli.py) -------------

# --time-budget
DURATION = joined(st.tuples(numbers(), st.sampled_from(["h", "m", "s", "", " m", "min", "ms"])).map("".join), "", 3)
# --layout (the planner's) and the layout knob's values
AXIS_SIZES = joined(numbers(), "x", 5)
NAMED_AXIS = st.tuples(
    st.sampled_from(["fsdp_transpose", "expert", "dcn_data", "dcn_fsdp", "dcn_pipeline", "tensor", ""]), numbers()
).map(lambda pair: f"{pair[0]}={pair[1]}")
LAYOUT = st.tuples(AXIS_SIZES, st.lists(NAMED_AXIS, max_size=3)).map(lambda p: ",".join([p[0], *p[1]]))
# --topology and --price GEN=USD
GENERATIONS = ["v4", "v5e", "v5p", "v5litepod", "v6e", "tpu7x", "v7x", "v3", "V5P"]
TOPOLOGY = st.one_of(
    st.tuples(st.sampled_from(GENERATIONS), numbers()).map("-".join),
    st.tuples(st.sampled_from(GENERATIONS), joined(numbers(), "x", 4)).map(":".join),
)
PRICE = st.tuples(st.sampled_from([*GENERATIONS, "v6e ", ""]), numbers()).map("=".join)
# --remat
REMAT = st.one_of(
    st.sampled_from(["full", "minimal", "none", "save_qkv_proj", "save_dot_except_mlpwi", "qkv_proj_offloaded"]),
    key_values(["query_proj", "key_proj", "decoder_layer_input", "mlpwi", "out_proj"], lambda: st.sampled_from(
        ["device", "offload", "remat", "", "DEVICE"]
    )).map(lambda pairs: "custom:" + pairs),
)  # fmt: skip
# --lengths files (tpu-tune buckets, tune --lengths)
LENGTH_ROW = st.one_of(numbers(), joined(numbers(), ",", 3), st.sampled_from(["length", "tokens,id", "id,name"]))
LENGTHS_TEXT = st.lists(near(LENGTH_ROW), max_size=8).map("\n".join)
