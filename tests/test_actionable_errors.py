"""Errors a newcomer can act on (issue 55, item 12): a missing model refused in one line before
torch (or anything heavy) is imported, a decoder shape's error naming the rule broken and the
keys missing, and a "did you mean" only for a close name."""

from __future__ import annotations

import re
from dataclasses import MISSING, fields

import pytest

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.model.decoder_shape import DecoderShape, read_shape
from tpu_tuner.model.shape_keys import REQUIRED_KEYS

BAD_SHAPE = "decoder:d_model=100,layers=2,heads=3"


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
    from tpu_tuner.model.hf_source import load_config, parse

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
