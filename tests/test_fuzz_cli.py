"""Fuzzed input through the command line and the Python API: a command either gets past every
check (where the test stops it: nothing is tuned, planned or compiled) or ends with exit status 2
and one line on stderr, no traceback and no results folder; an API call either starts or raises a
one-line `UserInputError`. A few cases run `tpu-tune` as a real process.

Budgets as tests/test_fuzz_parsers.py's (tests/conftest.py's profiles)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

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
    near,
    numbers,
    values,
    write,
)
from hypothesis import given
from hypothesis import strategies as st

import tpu_tuner
from tpu_tuner.cli import main
from tpu_tuner.core.errors import UserInputError

REPO = Path(__file__).parent.parent
MODEL = str(REPO / "examples" / "mlp.py")


class Accepted(Exception):
    """Raised where a command or call would start its real work: every check passed."""


def _accept(*args: Any, **kwargs: Any) -> Any:
    raise Accepted


@pytest.fixture(scope="module")
def stopped_before_work() -> Any:
    """The commands' and the API's real work replaced by `Accepted`: the checks before it run as
    they are, and nothing is tuned, planned or measured."""
    mp = pytest.MonkeyPatch()
    mp.setattr("tpu_tuner.tuning.run.tune_run.trial_runner", _accept)
    mp.setattr("tpu_tuner.plan_api.plan_to_folder", _accept)
    mp.setattr("tpu_tuner.plan_api.rank_to_folder", _accept)
    mp.setattr("tpu_tuner.planner.plans.plan.CompilePool", _accept)
    mp.setattr("tpu_tuner.bucketing.study.TrialRunner", _accept)
    mp.delenv("TPU_TUNE_STORAGE", raising=False)
    yield
    mp.undo()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-cli")


def run_cli(argv: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`tpu-tune ARGV --out OUT` in this process: accepted, or refused with status 2 in one line."""
    capsys.readouterr()
    try:
        status = main([*argv, "--out", str(out)])
    except Accepted:
        return
    except SystemExit as exc:  # argparse's refusal of a flag's syntax: its usage, then one error line
        status = exc.code
    err = capsys.readouterr().err
    assert status == 2, f"exit status {status} for {argv}: {err}"
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert lines and (lines[-1].startswith("tpu-tune: error: ") or ": error: " in lines[-1]), err
    if not lines[0].startswith("usage:"):
        assert len(lines) == 1, f"a refusal of {len(lines)} lines: {err}"
    assert not out.exists(), f"a refused command left {out} behind"


def optional(flag: str, value: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return st.one_of(st.just([]), value.map(lambda text: [flag, text]))


TUNE_ARGS = st.tuples(
    optional("--time-budget", near(DURATION)),
    optional("--space", st.sampled_from(["default", "precision", "nope", "x.toml", ""])),
    optional("--trials", numbers()),
    optional("--timeout", numbers()),
    optional("--nproc", numbers()),
    optional("--tolerance", numbers()),
    optional("--sampler", st.sampled_from(["tpe", "random", "grid", "x"])),
).map(lambda parts: [word for part in parts for word in part])


@budget(0.25)
@given(TUNE_ARGS, st.one_of(st.none(), near(LENGTHS_TEXT)))
def test_tune_flags(
    stopped_before_work: None, scratch: Path, capsys: Any, args: list[str], lengths: str | None
) -> None:
    extra = ["--lengths", str(write(scratch / "lengths.txt", lengths))] if lengths is not None else []
    run_cli(["tune", MODEL, "--device", "cpu", *args, *extra], scratch / "out", capsys)


PLAN_ARGS = st.tuples(
    st.one_of(near(TOPOLOGY), joined(TOPOLOGY, ",", 3)),
    st.lists(near(joined(PRICE, ",", 2)), max_size=2).map(lambda prices: [w for p in prices for w in ("--price", p)]),
    optional("--slices", numbers()),
    optional("--layout", near(LAYOUT)),
    optional("--remat", near(REMAT)),
    optional("--accumulation", numbers()),
).map(lambda p: ["--topology", p[0], *p[1], *p[2], *p[3], *p[4], *p[5]])
DECODER = st.one_of(
    st.just("decoder:vocab=256,d_model=64,layers=2,heads=4,mlp=128"),
    key_values(["vocab", "d_model", "layers", "heads", "mlp"]).map(lambda spec: "decoder:" + spec),
)


@budget(0.25)
@given(DECODER, PLAN_ARGS)
def test_plan_flags(stopped_before_work: None, scratch: Path, capsys: Any, model: str, args: list[str]) -> None:
    run_cli(["plan", model, *args], scratch / "out", capsys)


@budget(0.25)
@given(near(LENGTHS_TEXT), optional("--align", numbers()), optional("--max-buckets", numbers()))
def test_buckets_flags(
    stopped_before_work: None, scratch: Path, capsys: Any, lengths: str, align: list[str], buckets: list[str]
) -> None:
    file = write(scratch / "lengths.csv", lengths)
    run_cli(["buckets", MODEL, "--lengths", str(file), *align, *buckets], scratch / "out", capsys)


# --- the Python API's options -----------------------------------------------------------------


def sectioned(options: type, required: dict[str, Any] | None = None) -> st.SearchStrategy[Any]:
    """A call building `options` (a sectioned options class: its `SECTIONS`) with up to three
    fields of random sections set to random values; `required` fields given first."""
    import dataclasses

    classes: dict[str, type] = sys.modules[options.__module__].SECTIONS
    fields = [(section, f.name) for section, cls in classes.items() for f in dataclasses.fields(cls)]

    def build(chosen: dict[tuple[str, str], Any]) -> Any:
        given: dict[str, dict[str, Any]] = {section: dict((required or {}).get(section, {})) for section in classes}
        for (section, name), value in chosen.items():
            given[section][name] = value
        return lambda: options(**{section: classes[section](**values) for section, values in given.items()})

    return st.dictionaries(st.sampled_from(fields), values(), max_size=3).map(build)


def api_refused(call: Any) -> None:
    """`call()` starts (Accepted) or raises a one-line UserInputError."""
    try:
        call()
    except Accepted:
        return
    except UserInputError as exc:
        assert str(exc) and "\n" not in str(exc), str(exc)


@budget(0.5)
@given(st.data())
def test_api_tune(stopped_before_work: None, scratch: Path, data: st.DataObject) -> None:
    out = scratch / "api-tune"
    required = {"runner": {"device": "cpu"}, "outputs": {"out": out}}
    build = data.draw(sectioned(tpu_tuner.TuneOptions, required))
    api_refused(lambda: tpu_tuner.tune(MODEL, build()))
    assert not out.exists()


@budget(0.5)
@given(st.one_of(near(TOPOLOGY), values()), st.data())
def test_api_plan(stopped_before_work: None, topology: Any, data: st.DataObject) -> None:
    build = data.draw(sectioned(tpu_tuner.PlanOptions, {"target": {"topology": topology}}))
    api_refused(lambda: tpu_tuner.plan(MODEL, build()))


@budget(0.5)
@given(st.data())
def test_api_plan_buckets(stopped_before_work: None, data: st.DataObject) -> None:
    build = data.draw(sectioned(tpu_tuner.BucketOptions))
    api_refused(lambda: tpu_tuner.plan_buckets(MODEL, build()))


# --- tpu-tune itself, a few cases -------------------------------------------------------------


# `plan` starts the planner's imports (seconds each on a loaded host): its cases run in the slow pass.
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(
            ["plan", "decoder:vocab=256,d_model=abc,layers=2,heads=4,mlp=128", "--topology", "v5e-8"],
            marks=SLOW,
            id="decoder-type",
        ),
        pytest.param(["plan", MODEL, "--topology", "v4:0x0x0"], marks=SLOW, id="zero-topology"),
        pytest.param(
            ["plan", MODEL, "--topology", "v5e-8,v6e-8", "--price", "v\n5e=1"], marks=SLOW, id="price-newline"
        ),
        pytest.param(["tune", MODEL, "--time-budget", "1h\n3x"], id="budget-newline"),
        pytest.param(["tune", MODEL, "--device", "cpu", "--space", "pyproject.toml"], id="space-not-a-space"),
    ],
)
def test_command_refuses_in_one_line(tmp_path: Path, argv: list[str]) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "tpu_tuner.cli", *argv, "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("tpu-tune: error: "), done.stderr
    assert not out.exists()
