"""The host link as a roofline (docs/planner.md, "an eighth session"): a step that offloads is no
shorter than its host traffic at the fastest host rate a calibration row sustained, from at least
`MIN_COMPARABLE` offloading rows; the fit and the planner charge it alike."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tpu_tuner.model.meshes.layouts import Layout, ModelShape
from tpu_tuner.planner.calibration.fitting import CalibrationRow, errors, fit
from tpu_tuner.planner.calibration.host_link import host_link_bound, sustained_host_rate
from tpu_tuner.planner.compiler.compiled_step import CompiledStep
from tpu_tuner.planner.prediction.band import MIN_COMPARABLE
from tpu_tuner.planner.prediction.predict import CostModel, predict
from tpu_tuner.planner.topology import parse_topology


def _row(number: int, host_gbytes: float, step: float = 10.0, compute: float = 5.0) -> CalibrationRow:
    """A v6e row whose published step is `step` seconds (model time at peak 4 s), moving
    `host_gbytes` a chip between its chips and its host."""
    row = CalibrationRow(number, "v6e", True, 1.0, 2.0, compute, 0.5, 0.01, 4.0, 4.0 / step)
    return replace(row, host_gbytes=host_gbytes)


def test_the_bound_is_the_fastest_rate_a_row_sustained_from_enough_offloading_rows() -> None:
    rows = [_row(n, 10.0 * n) for n in range(1, MIN_COMPARABLE + 1)] + [_row(99, 0.0)]
    assert sustained_host_rate(rows[2]) == pytest.approx(3.0)  # 30 GB over a 10 s step
    assert sustained_host_rate(rows[-1]) == 0.0
    assert host_link_bound(rows) == pytest.approx(MIN_COMPARABLE)
    # Fewer offloading rows bound the link too loosely: no roofline.
    assert host_link_bound(rows[1:]) == 0.0


def test_a_step_is_predicted_no_shorter_than_its_host_traffic_at_the_bound() -> None:
    """Left out, a row that moves 3x the others' fastest rate at their efficiency is predicted at
    its host traffic's time over that rate; the others' predictions do not move."""
    rows = [_row(n, 5.0 + n) for n in range(1, MIN_COMPARABLE + 2)]  # up to 1.5 GB/s, 10 s steps
    heavy = _row(50, 300.0, step=30.0)  # 10 GB/s over its published 30 s
    held = fit(rows, "per_generation+dcn+route+link")
    assert held.host_link_gbytes_per_s == pytest.approx(1.5)
    plain = fit(rows, "per_generation+dcn+route")
    assert errors(rows, held) == pytest.approx(errors(rows, plain))
    # At 1.5 GB/s the heavy row's 300 GB take 200 s: MFU 4 / 200 against its published 4 / 30.
    assert errors([heavy], held)[0] == pytest.approx((4 / 200 - 4 / 30) * 100)
    assert errors([heavy], plain)[0] > 0  # without the roofline its 5 s of compute run at the rows' pace


def test_the_planner_charges_the_host_link_as_the_fit_does() -> None:
    topology = parse_topology("v6e-8")
    step = CompiledStep(1e14, 1e11, 1e9, 0, 1e9, 0, [], host_temp_bytes=50e9)
    shape = ModelShape(4096, 32, 8, 14336, 128256, 32)
    args = (step, topology, Layout(1, 8, 1), shape, 128, 8e13, 8 * 8192)
    free = predict(*args, CostModel(efficiency_by_generation=(("v6e", 0.6),)))
    bound = predict(*args, CostModel(efficiency_by_generation=(("v6e", 0.6),), host_link_gbytes_per_s=10.0))
    assert bound.host_link_seconds == pytest.approx(2 * 50e9 / 10e9)  # forward out, backward back
    assert bound.step_seconds == pytest.approx(max(free.step_seconds, 10.0))
    assert bound.step_seconds > free.step_seconds


def test_the_plan_names_its_host_bound_points() -> None:
    from tpu_tuner.planner.plans.plan_result import LayoutPlan, host_bound_said

    topology = parse_topology("v6e-8")
    step = CompiledStep(1e14, 1e11, 1e9, 0, 1e9, 0, [], host_temp_bytes=50e9)
    shape = ModelShape(4096, 32, 8, 14336, 128256, 32)
    args = (step, topology, Layout(1, 8, 1), shape, 128, 8e13, 8 * 8192)
    model = CostModel(efficiency_by_generation=(("v6e", 0.6),), host_link_gbytes_per_s=10.0)
    bound = LayoutPlan(Layout(1, 8, 1), step, True, 0.0, "", predict(*args, model))
    free = LayoutPlan(Layout(1, 8, 1), step, True, 0.0, "", predict(*args, replace(model, host_link_gbytes_per_s=0.0)))
    assert "1 point host-bound" in host_bound_said(10.0, [bound, free])
    assert host_bound_said(10.0, [free]) == ""


def test_the_plan_table_shows_each_points_host_link_time_where_a_point_offloads() -> None:
    from types import SimpleNamespace

    from tpu_tuner.outputs.plan_report import HOST_LINK_HEADER, header, host_link_cell
    from tpu_tuner.planner.plans.plan_result import LayoutPlan

    topology = parse_topology("v6e-8")
    shape = ModelShape(4096, 32, 8, 14336, 128256, 32)
    model = CostModel(efficiency_by_generation=(("v6e", 0.6),), host_link_gbytes_per_s=10.0)

    def plan(host_bytes: float) -> LayoutPlan:
        step = CompiledStep(1e14, 1e11, 1e9, 0, 1e9, 0, [], host_temp_bytes=host_bytes)
        prediction = predict(step, topology, Layout(1, 8, 1), shape, 128, 8e13, 8 * 8192, model)
        return LayoutPlan(Layout(1, 8, 1), step, True, 0.0, "", prediction)

    bound, plain = plan(50e9), plan(0.0)
    assert bound.prediction is not None and bound.prediction.host_link_seconds > 0
    assert host_link_cell(bound).endswith("(sets the step)") and host_link_cell(plain) == "none"
    with_offload = SimpleNamespace(plans=[bound, plain], topology=SimpleNamespace(slices=1))
    without = SimpleNamespace(plans=[plain], topology=SimpleNamespace(slices=1))
    assert header(with_offload)[-1] == HOST_LINK_HEADER  # type: ignore[arg-type]
    assert HOST_LINK_HEADER not in header(without)  # type: ignore[arg-type]
