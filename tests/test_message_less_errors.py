"""Issue 58, item 5: an exception with an empty message (a compiler's, a library's) must be
reported as its type, not replaced by "list index out of range" from a hand-written "first line
of the error": every such copy now goes through `core.errors.first_line` / `first_text_line`."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tpu_tuner.core.errors import first_line, first_text_line


class MessageLess(RuntimeError):
    """What a compiler may raise: no message at all."""


def test_first_line_of_a_message_less_error_is_its_type() -> None:
    assert first_line(MessageLess()) == "MessageLess"
    assert first_line(ValueError("\n  \nsecond line first\nthird")) == "ValueError: second line first"
    assert first_text_line("") == "" and first_text_line(" \n x \n") == "x"


def test_a_compile_worker_reports_a_message_less_compiler_error_by_its_type(monkeypatch: pytest.MonkeyPatch) -> None:
    from tpu_tuner.planner.compiler import compile_pool

    def fail(job: Any) -> Any:
        raise MessageLess()

    monkeypatch.setattr(compile_pool, "run_job", fail)
    assert compile_pool.compile_or_fail(object()).error == "MessageLess"  # type: ignore[arg-type]


def test_a_loop_body_the_cost_analysis_refuses_without_a_message_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("jax")
    import jaxlib._hlo as hlo

    from tpu_tuner.planner.compiler import loop_costs

    def refuse(text: str) -> Any:
        raise MessageLess()

    monkeypatch.setattr(hlo, "hlo_module_from_text", refuse)
    with caplog.at_level(logging.WARNING, logger=loop_costs.__name__):
        assert loop_costs._cost_as_entry("HloModule m", "body") is None
    assert "MessageLess" in caplog.text


def test_a_message_less_hbm_refusal_is_logged_by_its_type(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("jax")
    import jax

    from tpu_tuner.planner.compiler import hbm

    def refuse(fn: Any) -> Any:
        raise MessageLess()

    monkeypatch.setattr(jax, "jit", refuse)
    with caplog.at_level(logging.WARNING, logger=hbm.__name__):
        assert hbm.compiler_hbm_limit(jax.devices("cpu")[0]) is None
    assert "MessageLess" in caplog.text
