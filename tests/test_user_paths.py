"""Inputs the fuzz tests' full budget found unrefused: a `~user` path naming no user
(`core/user_paths.py`: `hf:~0` ended in `RuntimeError: Could not determine home directory`), and the
Python API's plan layouts of any type (`core/field_types.py` did not check `list[...]`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.user_paths import expand_user
from tpu_tuner.studies.storage import check_storage

NO_USER = "~no-such-user-0"


def test_a_home_that_does_not_exist_is_a_user_input_error() -> None:
    with pytest.raises(UserInputError, match=r"hf:~no-such-user-0/x: '~no-such-user-0': no such user's home folder"):
        expand_user(f"{NO_USER}/x", f"hf:{NO_USER}/x")
    assert str(expand_user("~/x")).endswith("/x") and not str(expand_user("~/x")).startswith("~")


def test_a_storage_under_no_user_s_home_is_refused_in_one_line() -> None:
    with pytest.raises(UserInputError, match="no such user's home folder"):
        check_storage(f"sqlite:///{NO_USER}/plans.db")


def test_the_plan_command_refuses_an_hf_folder_under_no_user_with_status_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tpu_tuner.cli", "plan", f"hf:{NO_USER}", "--topology", "v5e-4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no such user's home folder" in lines[0] and "Traceback" not in done.stderr


@pytest.mark.parametrize("layouts", [True, "0", ["1x4x1"], [object()]])
def test_the_api_s_plan_layouts_must_be_a_list_of_layouts(layouts) -> None:
    """`list[Layout]` was not checked (only tuples were): `PlanEnumeration(layouts=True)` reached a
    `for` loop and raised TypeError (found by tests/test_fuzz_cli.py's full budget)."""
    from tpu_tuner.planner.plans.plan_options import PlanEnumeration, PlanOptions, PlanTarget

    with pytest.raises(
        UserInputError, match=r"PlanEnumeration: layouts must be a list, each item Layout or none, not "
    ):
        PlanOptions(PlanTarget("v4-8"), enumeration=PlanEnumeration(layouts=layouts))
