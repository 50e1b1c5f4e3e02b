"""Fuzzed user input, parser by parser: every text a user can type either works (and what it gives
is usable) or is refused with a one-line `UserInputError` (a `ValueError` where that is the parser's
stated refusal, turned into one by its caller), never another exception.

Budgets: the `fuzz-quick` / `fuzz-full` Hypothesis profiles (tests/conftest.py; TPU_TUNE_FUZZ=full
runs the large one). The inputs are near-valid (tests/helpers/fuzz_strategies.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from helpers.fuzz_strategies import (
    DURATION,
    LAYOUT,
    LENGTHS_TEXT,
    PRICE,
    REMAT,
    TOPOLOGY,
    budget,
    joined,
    key_values,
    mutated,
    near,
    numbers,
    write,
)
from hypothesis import example, given
from hypothesis import strategies as st

from tpu_tuner.core.errors import UserInputError


def refused_in_one_line(exc: BaseException) -> None:
    """A refusal's message: one non-empty line."""
    message = str(exc)
    assert message.strip(), f"{type(exc).__name__} without a message"
    assert "\n" not in message, f"a refusal of more than one line: {message!r}"


# --- --time-budget -----------------------------------------------------------------------------


@given(near(st.one_of(DURATION, st.sampled_from(["none", "off", "0", "10m", "1h30m", "90s"]))))
def test_time_budget(text: str) -> None:
    """--time-budget as the CLI reads it: parse_duration, then the options' check."""
    from tpu_tuner.core.units import parse_duration
    from tpu_tuner.tuning.options.tune_options import SearchOptions

    try:
        seconds = parse_duration(text)
        SearchOptions(time_budget_s=seconds)
    except UserInputError as exc:
        refused_in_one_line(exc)
        return
    assert seconds is None or seconds > 0


# --- --layout (the planner's) and the layout knob's values ------------------------------------


@given(near(LAYOUT), st.booleans())
def test_layout(text: str, context: bool) -> None:
    from tpu_tuner.model.meshes.layouts import parse_layout

    try:
        layout = parse_layout(text, context=context)
    except ValueError as exc:  # its stated refusal; `tpu-tune plan` and the knob make it a UserInputError
        refused_in_one_line(exc)
        assert repr(text) in str(exc), f"the refusal does not name the layout: {exc}"
        return
    sizes = (layout.data, layout.fsdp, layout.tensor, layout.context, layout.dcn_data, layout.dcn_fsdp)
    assert all(isinstance(size, int) and size >= 1 for size in sizes), layout
    assert layout.short() and layout.name()


# --- --topology and --slices --------------------------------------------------------------------


@given(near(TOPOLOGY), st.one_of(st.integers(-2, 8), st.integers()))
def test_topology(text: str, slices: int) -> None:
    from tpu_tuner.planner.topology import parse_topology

    try:
        topology = parse_topology(text).with_slices(slices)
    except UserInputError as exc:
        refused_in_one_line(exc)
        return
    assert topology.chips >= 1 and topology.devices >= 1 and topology.devices_per_chip >= 1, topology
    assert topology.chips <= topology.chip.max_chips * slices
    assert topology.describe() and topology.jax_name
    assert topology.hbm_bytes_per_device > 0 and topology.peak_flops_per_device > 0


# --- --price GEN=USD ----------------------------------------------------------------------------


@given(st.lists(near(joined(PRICE, ",", 3)), max_size=3))
def test_price_flags(flags: list[str]) -> None:
    from tpu_tuner.planner.plans.prices import parse_price_flags, price_table

    try:
        given_prices = parse_price_flags(flags)
    except UserInputError as exc:
        refused_in_one_line(exc)
        return
    assert all(math.isfinite(usd) and usd > 0 for usd in given_prices.values()), given_prices
    table = price_table(given_prices)
    assert all(table[generation].usd_per_chip_hour == usd for generation, usd in given_prices.items())


# --- --remat, --accumulations / --contexts ------------------------------------------------------


@given(near(REMAT))
def test_remat(text: str) -> None:
    from tpu_tuner.planner.compiler.remat import parse_remat

    try:
        policy = parse_remat(text, "--remat")
    except UserInputError as exc:
        refused_in_one_line(exc)
        return
    assert parse_remat(policy.name).name == policy.name  # the canonical name reads back as itself


@given(st.sampled_from(["accumulations", "contexts"]), near(joined(numbers(), ",", 4)))
def test_plan_sizes(flag: str, text: str) -> None:
    from tpu_tuner.planner.plans.plan_options import PlanSearch, comma_ints

    try:
        sizes = comma_ints(f"--{flag}", text)
        PlanSearch(**{flag: sizes})
    except UserInputError as exc:
        refused_in_one_line(exc)
        return
    assert sizes and all(isinstance(size, int) and size >= 1 for size in sizes)


# --- --lengths files (tpu-tune buckets, tune --lengths) -----------------------------------------


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@given(near(LENGTHS_TEXT), st.sampled_from([1, 8, 128]))
def test_lengths_file(scratch: Path, text: str, align: int) -> None:
    """A --lengths file as `tpu-tune buckets` reads it: the sample, its histogram, the probe lengths."""
    from tpu_tuner.model.buckets.lengths import bucket_histogram, probe_lengths

    file = scratch / "lengths.csv"
    write(file, text)
    try:
        histogram = bucket_histogram(None, file)
    except UserInputError as exc:
        refused_in_one_line(exc)
        assert str(file) in str(exc), f"the refusal does not name the file: {exc}"
        return
    assert histogram.total >= 1 and histogram.lengths.min() >= 1
    probes = probe_lengths(histogram, align)
    assert len(probes) >= 2 and all(p % align == 0 and p >= 1 for p in probes)


# --- key=value lists, hf: sources -------------------------------------------------------------

HF_KEYS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
           "vocab_size", "max_position_embeddings", "head_dim", "rope_theta", "n_embd", "n_layer", "sliding_window",
           "hidden_act", "tie_word_embeddings", "layer_types", "num_local_experts"]  # fmt: skip
HF_TYPES = ["llama", "gpt2", "qwen2", "mistral", "gemma2", "gpt_neox", "qwen3", "llamma", "bert"]
HF_LOCATION = st.one_of(
    st.sampled_from(HF_TYPES), st.sampled_from(["./no-such-folder/", "/", "~", ".", "org/name", "a/b/c", ""])
)
HF_FRAGMENT = joined(
    st.sampled_from(["inference", "weights", "task=causal-lm", "task=seq2seq", "task=", "weights=no", "x"]), ",", 3
)
HF_SOURCE = st.tuples(HF_LOCATION, key_values(HF_KEYS), HF_FRAGMENT).map(
    lambda p: f"hf:{p[0]}" + (f"?{p[1]}" if p[1] else "") + (f"#{p[2]}" if p[2] else "")
)


@pytest.fixture(scope="module")
def offline() -> None:
    """No hub: a hub id is refused from the local cache in a moment, as on a machine without network."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    yield
    mp.undo()


@budget(0.3)
@given(near(HF_SOURCE))
@example(text="hf:~0")  # a `~user` with no such user: Path.expanduser's RuntimeError, found by the full budget
def test_hf_source(offline: None, text: str) -> None:
    """An ``hf:`` source: parsed, its config made (model types and folders; no network), and read
    as the generic decoder's shape or refused as not expressible (the planner then traces it)."""
    pytest.importorskip("transformers")
    from tpu_tuner.model.decoders.hf_decoder import NotExpressible, decoder_shape
    from tpu_tuner.model.workloads.hf_source import load_config, parse

    if not text.startswith("hf:"):
        text = "hf:" + text
    try:
        source = parse(text)
        assert source.name is not None and source.with_options(inference=True).startswith("hf:")
        config = load_config(source)
    except UserInputError as exc:
        refused_in_one_line(exc)
        return
    try:
        shape = decoder_shape(config)
    except NotExpressible as exc:
        refused_in_one_line(exc)
        return
    assert shape.layers >= 1 and shape.d_model >= 1


# --- decoder: shapes, inline and in a TOML file -------------------------------------------------

SHAPE_KEYS = ["vocab", "d_model", "layers", "heads", "mlp", "kv_heads", "head_dim", "gated", "activation", "norm",
              "positions", "experts", "top_k", "capacity_factor", "max_seq_len", "sliding_window", "global_every",
              "rotary_fraction", "dense_layers", "kv_lora_rank", "router", "moe_every", "no_such_key"]  # fmt: skip
SHAPE_VALUE = st.one_of(numbers(), st.sampled_from(["silu", "gelu", "layer", "rms", "learned", "true", "sigmoid"]))
VALID_SHAPE = "vocab=256,d_model=64,layers=2,heads=4,mlp=128"
INLINE_SHAPE = st.one_of(
    st.just(VALID_SHAPE),
    key_values(SHAPE_KEYS, lambda: SHAPE_VALUE).map(lambda extra: f"{VALID_SHAPE},{extra}"),
    key_values(SHAPE_KEYS, lambda: SHAPE_VALUE),
).map(lambda spec: "decoder:" + spec)


def _check_shape_read(where: str | Path) -> None:
    """read_shape(where) works with every field of its declared type, or is refused in one line."""
    import dataclasses

    from tpu_tuner.model.decoders.decoder_shape import read_shape

    try:
        shape, sizes, name = read_shape(where)
    except UserInputError as exc:
        refused_in_one_line(exc)
        return
    for field in dataclasses.fields(shape):
        value = getattr(shape, field.name)
        if field.type in ("int", "int | None") and value is not None:
            assert type(value) is int, f"{field.name} = {value!r}"
        if field.type == "float":
            assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if field.type == "bool":
            assert type(value) is bool, f"{field.name} = {value!r}"
    assert shape.layers >= 1 and shape.n_head_dim >= 1 and name
    assert all(size >= 1 for size in sizes.values()), sizes
    if shape.layers <= 64:
        shape.layer_groups()


@given(near(INLINE_SHAPE))
def test_inline_decoder_shape(text: str) -> None:
    if not text.startswith("decoder:"):
        text = "decoder:" + text
    _check_shape_read(text)


def _toml_value() -> st.SearchStrategy[object]:
    return st.one_of(
        st.integers(-2, 300),
        st.integers(),
        st.floats(allow_nan=True),
        st.booleans(),
        st.sampled_from(["silu", "gelu", "rms", "x"]),
        st.lists(st.integers(-1, 4), max_size=3),
    )


SHAPE_TABLE = st.fixed_dictionaries({}, optional={key: _toml_value() for key in SHAPE_KEYS}).map(
    lambda extra: {"vocab": 256, "d_model": 64, "layers": 2, "heads": 4, "mlp": 128, **extra}
)
RUN_TABLE = st.dictionaries(st.sampled_from(["batch_size", "seq_len", "steps"]), _toml_value(), max_size=2)


@given(
    st.one_of(
        st.tuples(SHAPE_TABLE, RUN_TABLE).map(lambda p: {"model": p[0], "run": p[1]}),
        st.dictionaries(st.sampled_from(["model", "run", "x"]), _toml_value(), max_size=2),
    ),
    st.booleans(),
    st.data(),
)
def test_decoder_shape_file(scratch: Path, data: dict, mutate: bool, draw: st.DataObject) -> None:
    import tomli_w

    text = tomli_w.dumps(data)
    if mutate:
        text = draw.draw(mutated(st.just(text), 4))
    file = scratch / "shape.toml"
    write(file, text)
    _check_shape_read(file)


# --- search spaces (search_spaces/*.toml, --space FILE) -----------------------------------------

BUILTIN_SPACE = (Path(__file__).parent.parent / "search_spaces" / "default.toml").read_text()
KNOB_NAMES = ["execution", "matmul_precision", "autocast", "layout", "intra_op_threads", "no_such_knob"]
CHOICE = st.one_of(
    st.sampled_from(
        ["eager", "inductor", "inductor:max-autotune", "highest", "bfloat16", "none", "1x1x1", "data", "4"]
    ),
    st.integers(-1, 8),
    st.text(max_size=6),
)
CHOICES = st.one_of(
    st.dictionaries(st.sampled_from(["cpu", "cuda", "tpu"]), st.one_of(st.lists(CHOICE, max_size=3), CHOICE)),
    st.lists(CHOICE, max_size=2),
    CHOICE,
)
PARAM = st.fixed_dictionaries(
    {"name": st.sampled_from(KNOB_NAMES), "choices": CHOICES},
    optional={"agent": st.sampled_from(["compile", "precision", "x"]), "help": st.one_of(st.text(max_size=5), CHOICE)},
)
# Mostly well-formed files with random entries; now and then a table or key of the wrong kind.
SPACE = st.one_of(
    st.fixed_dictionaries({"param": st.lists(PARAM, max_size=4)}),
    st.fixed_dictionaries(
        {"param": st.lists(PARAM, max_size=4)},
        optional={"space": st.fixed_dictionaries({}, optional={"name": CHOICE, "description": CHOICE})},
    ),
    st.fixed_dictionaries(
        {},
        optional={
            "space": st.one_of(st.fixed_dictionaries({}, optional={"name": CHOICE}), CHOICE),
            "param": st.one_of(
                st.lists(st.one_of(PARAM, st.dictionaries(st.text(max_size=5), CHOICE)), max_size=3), PARAM, CHOICE
            ),
            "other": st.integers(),
        },
    ),
)


@budget(0.3)
@given(st.one_of(SPACE, st.none()), st.booleans(), st.sampled_from(["cpu", "cuda", "tpu"]), st.data())
def test_search_space_file(scratch: Path, data: dict | None, mutate: bool, device: str, draw: st.DataObject) -> None:
    import tomli_w

    from tpu_tuner.tuning.search.search_space import SearchSpace

    text = BUILTIN_SPACE if data is None else tomli_w.dumps(data)
    if mutate or data is None:
        text = draw.draw(mutated(st.just(text), 6))
    file = scratch / "space.toml"
    write(file, text)
    try:
        space = SearchSpace.load(file, device)
    except UserInputError as exc:
        refused_in_one_line(exc)
        assert str(file) in str(exc), f"the refusal does not name the file: {exc}"
        return
    assert space.params and all(p.choices and all(isinstance(c, str) for c in p.choices) for p in space.params)
    assert space.size() >= 1
