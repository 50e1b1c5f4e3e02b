"""Issue 56, item 5 and issue 69, item 7: the default clock fits what a setting costs on the device
at hand, one rule for every device (on a v5e a process that opens the chip and a compile from nothing
cost 25-40 s a setting; on a 2-core AMD EPYC host a 9.0 s step left room for the baseline alone),
while a clock the user gave stays as it is."""

from __future__ import annotations

import argparse

import pytest

from tpu_tuner.cli import tune as tune_cli
from tpu_tuner.tuning.options.search_options import DefaultBudget, SearchOptions
from tpu_tuner.tuning.run.clock import WRAP_UP_S
from tpu_tuner.tuning.run.fitted_clock import FINISH_SETTINGS, LONGEST_FITTED_S, MIN_SEARCH_SETTINGS, fit_default_clock


def _search_options(*argv: str) -> SearchOptions:
    parser = argparse.ArgumentParser()
    tune_cli.add_arguments(parser)
    return tune_cli.options_from(parser.parse_args(["model.py", *argv])).search


def test_the_default_clock_is_marked_and_a_given_one_is_plain_even_in_the_defaults_own_words() -> None:
    assert isinstance(_search_options().time_budget_s, DefaultBudget)
    assert _search_options().time_budget_s == 240.0
    # Built at run time, as argv's words are (a literal "4m" would be the interned constant itself).
    given = "".join(["4", "m"])
    held = _search_options("--time-budget", given).time_budget_s
    assert held == 240.0 and not isinstance(held, DefaultBudget)
    assert _search_options("--time-budget", "none").time_budget_s is None


@pytest.mark.parametrize("kind", ["tpu", "cpu", "cuda"])
def test_a_default_clock_grows_to_hold_the_settings_at_the_measured_cost_on_every_device(kind: str) -> None:
    fitted = fit_default_clock(DefaultBudget(240.0), kind, elapsed_s=35.0)
    assert fitted is not None
    needed = 35.0 + (MIN_SEARCH_SETTINGS + FINISH_SETTINGS) * 35.0 + WRAP_UP_S
    assert fitted.budget_s == pytest.approx(needed)
    assert "default 4.0 min fitted to 7.2 min" in fitted.words and "took 35.0 s" in fitted.words
    assert f"on this {kind}" in fitted.words


def test_what_the_profile_did_once_for_the_machine_is_not_a_cost_of_every_setting() -> None:
    # A cold CPU peak probe of 20 s inside a 25 s profile: the settings cost 5 s each, and the
    # default holds them (a README example's first run must not grow its clock for the probe).
    assert fit_default_clock(DefaultBudget(240.0), "cpu", elapsed_s=25.0, once_s=20.0) is None
    assert fit_default_clock(DefaultBudget(240.0), "cpu", elapsed_s=25.0) is not None


def test_a_fitted_clock_is_never_longer_than_its_limit_and_says_so() -> None:
    fitted = fit_default_clock(DefaultBudget(240.0), "tpu", elapsed_s=300.0)
    assert fitted is not None and fitted.budget_s == LONGEST_FITTED_S
    assert "held to 20.0 min" in fitted.words and "--time-budget" in fitted.words


@pytest.mark.parametrize(
    ("budget", "kind", "elapsed"),
    [
        (240.0, "tpu", 35.0),  # given by the user: held to
        (None, "tpu", 35.0),  # no clock
        (DefaultBudget(240.0), "tpu", 5.0),  # the default already holds the settings
        (DefaultBudget(240.0), "cpu", 18.0),
    ],
)
def test_the_clock_is_left_alone(budget: float | None, kind: str, elapsed: float) -> None:
    assert fit_default_clock(budget, kind, elapsed) is None
