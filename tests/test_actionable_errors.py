"""Errors a newcomer can act on (issue 55, item 12): a missing model refused in one line before
torch (or anything heavy) is imported, a decoder shape's error naming the rule broken and the
keys missing, and a "did you mean" only for a close name."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from tpu_tuner.cli import main
from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.model.decoders.decoder_shape import DecoderShape, read_shape
from tpu_tuner.model.decoders.shape_keys import REQUIRED_KEYS

HEAVY = ("torch", "numpy", "optuna", "transformers", "jax")
BAD_SHAPE = "decoder:d_model=100,layers=2,heads=3"


def test_a_missing_model_is_refused_in_one_line_before_anything_heavy_is_imported(tmp_path: Path) -> None:
    """Each command that takes a model refuses a missing one with status 2 and one line, with none
    of torch, numpy, optuna, transformers or JAX imported and no run folder made (all of it took
    4 to 19 s before: `plan` and `buckets` import torch to build their flags)."""
    commands = [
        ["nosuch.py"],
        ["profile", "nosuch.py"],
        ["plan", "nosuch.py", "--topology", "v5e-8"],
        ["buckets", "nosuch.py"],
        ["-q", "tune", "nosuch.py", "--device", "cpu"],
        ["tune", "nosuch.toml"],
        ["profile", "hf:./no-such-folder/"],
        ["plan", BAD_SHAPE, "--topology", "v5e-8"],
    ]
    code = (
        "import json, sys\n"
        "from tpu_tuner.cli import main\n"
        f"statuses = [main(argv) for argv in {commands!r}]\n"
        f"print(json.dumps([statuses, [m for m in {HEAVY!r} if m in sys.modules]]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300, check=True
    )
    statuses, heavy = json.loads(done.stdout)
    lines = done.stderr.strip().splitlines()
    assert statuses == [2] * len(commands) and heavy == [], (statuses, heavy, done.stderr)
    assert len(lines) == len(commands) and all(line.startswith("tpu-tune: error: ") for line in lines), lines
    assert lines[0] == "tpu-tune: error: nosuch.py: file not found"
    assert "nosuch.toml: file not found" in lines[5] and "no such folder" in lines[6]
    assert "heads (3) must divide d_model (100)" in lines[7]
    assert list(tmp_path.iterdir()) == []  # no results folder


def test_a_model_named_after_flags_is_refused_before_the_worker_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where flags come before the model, the check runs once the flags are parsed: still one
    line, and no worker started (the worker found it before, seconds later)."""
    import tpu_tuner.runner.isolated_profile as isolated

    def no_worker(*args: object, **kwargs: object) -> None:
        raise AssertionError("a worker was started for a missing model file")

    monkeypatch.setattr(isolated, "profile_in_worker", no_worker)
    out = tmp_path / "results"
    assert main(["profile", "--device", "cpu", str(tmp_path / "nosuch.py"), "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == f"tpu-tune: error: {tmp_path / 'nosuch.py'}: file not found"
    assert not out.exists()


def test_each_command_is_the_module_of_its_name() -> None:
    """The CLI imports a command's module by its name only when a parser is built."""
    import importlib

    from tpu_tuner.cli import COMMANDS

    assert [importlib.import_module(f"tpu_tuner.cli.{name}").NAME for name in COMMANDS] == list(COMMANDS)


def test_an_incomplete_shape_names_the_missing_keys_and_the_rule_broken() -> None:
    with pytest.raises(WorkloadError) as info:
        read_shape(BAD_SHAPE)
    text = str(info.value)
    assert "__init__" not in text and "positional" not in text and len(text.splitlines()) == 1
    assert text.startswith(f"{BAD_SHAPE}: incomplete shape: missing vocab (") and " and mlp (" in text
    assert "heads (3) must divide d_model (100)" in text


@pytest.mark.parametrize(
    ("spec", "said", "unsaid"),
    [
        ("decoder:vocab=8,d_model=100,layers=2,heads=3,mlp=8", "heads (3) must divide d_model (100)", "missing"),
        ("decoder:d_model=96,layers=2,heads=3", "missing vocab", "must divide"),
        ("decoder:layers=2", "missing vocab (", "must divide"),
    ],
)
def test_a_shape_error_says_what_is_wrong_and_nothing_else(spec: str, said: str, unsaid: str) -> None:
    with pytest.raises(WorkloadError) as info:
        read_shape(spec)
    assert said in str(info.value) and unsaid not in str(info.value)


def test_every_required_shape_key_has_a_meaning() -> None:
    required = {f.name for f in fields(DecoderShape) if f.default is MISSING and f.default_factory is MISSING}
    assert set(REQUIRED_KEYS) == required


def test_a_model_type_is_suggested_only_when_close() -> None:
    pytest.importorskip("transformers")
    from tpu_tuner.core.errors import UserInputError
    from tpu_tuner.model.workloads.hf_source import load_config, parse

    def refusal(text: str) -> str:
        with pytest.raises(UserInputError) as info:
            load_config(parse(text))
        return str(info.value)

    far = refusal("hf:not_a_real_model_type")
    assert far == "hf:not_a_real_model_type: unknown transformers model type 'not_a_real_model_type'"
    assert re.search(r"did you mean llama\b", refusal("hf:lama"))
    assert "did you mean hidden_size?" in refusal("hf:llama?hiden_size=64")  # not hidden_act as well
    assert "did you mean num_hidden_layers?" in refusal("hf:llama?num_layers=2")  # its words, in order
    assert "did you mean" not in refusal("hf:llama?foo_bar=1")
