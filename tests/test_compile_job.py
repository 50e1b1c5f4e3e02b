"""A compile job carries compile_step's arguments by name (planner/compile_pool.run_job passes them so)."""

from __future__ import annotations

import inspect
from dataclasses import fields

from tpu_tuner.planner.compile_pool import _DEVICE_FIELDS, CompileJob
from tpu_tuner.planner.program import compile_step


def test_every_field_but_the_model_and_devices_is_an_argument_of_compile_step() -> None:
    arguments = {f.name for f in fields(CompileJob)} - set(_DEVICE_FIELDS)
    assert arguments == set(inspect.signature(compile_step).parameters) - {"build_meta_model", "devices"}
