"""A plan's layouts for a big slice, mapped onto the ranks at hand, in the plan's order."""

from __future__ import annotations

import json

import pytest

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.model.meshes.layouts import Layout
from tpu_tuner.parallel.from_plan import planned_layouts, scale_to


def test_the_dominant_axis_survives_scaling_down() -> None:
    assert scale_to(Layout(1, 64, 4), 2) == Layout(1, 2, 1)
    assert scale_to(Layout(1, 64, 4), 8) == Layout(1, 8, 1)  # 16 planned fsdp devices per tensor one
    assert scale_to(Layout(2, 1, 128), 4) == Layout(1, 1, 4)
    assert scale_to(Layout(256, 1, 1), 2) == Layout(2, 1, 1)
    assert scale_to(Layout(1, 2, 2), 4) == Layout(1, 2, 2)  # already the right size
    assert scale_to(Layout(1, 1, 1), 2) == Layout(2, 1, 1)  # fewer devices planned: data takes the rest
    assert scale_to(Layout(1, 3, 1), 2) == Layout(2, 1, 1)


def test_planned_layouts_keep_the_plan_s_order_skip_what_does_not_fit_and_say_how(tmp_path) -> None:
    def entry(data: int, fsdp: int, tensor: int, fits: bool, mfu: float | None) -> dict:
        return {
            "layout": {"data": data, "fsdp": fsdp, "tensor": tensor},
            "fits": fits,
            "prediction": {"mfu": mfu} if mfu is not None else None,
        }

    plans = [
        entry(1, 64, 4, True, 0.41),
        entry(1, 128, 2, True, 0.40),
        entry(1, 32, 8, True, 0.39),
        entry(256, 1, 1, False, None),
        entry(2, 1, 128, True, 0.30),
    ]
    (tmp_path / "plan.json").write_text(json.dumps({"plans": plans}))
    mapped = planned_layouts(tmp_path, 2)
    # 1x64x4, 1x128x2 and 1x32x8 all become fsdp 2 (kept once); 2x1x128 keeps its tensor axis.
    assert [m.local for m in mapped] == [Layout(1, 2, 1), Layout(1, 1, 2)]
    assert mapped[0].predicted_mfu == 0.41
    assert "from the plan's data 1 x fsdp 64 x tensor 4 (256 devices" in mapped[0].describe()
    with pytest.raises(UserInputError, match="not a plan folder"):
        planned_layouts(tmp_path / "missing", 2)
