"""Multi-slice plans: the slice count, the hybrid mesh, DCN collectives from the compiled program,
their cost at the generation's DCN bandwidth, and the ranking it gives (docs/planner.md, "The whole
mesh")."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest

from tpu_tuner.cli import main
from tpu_tuner.core.errors import UserInputError
from tpu_tuner.model.meshes.layouts import Layout, ModelShape, enumerate_layouts
from tpu_tuner.planner.compiler.compiled_step import CompiledStep, add_loop_iterations
from tpu_tuner.planner.compiler.loop_costs import LoopIteration
from tpu_tuner.planner.compiler.mesh import mesh_devices
from tpu_tuner.planner.prediction.collectives import Collective, device_slices, parse_collectives, ring_seconds
from tpu_tuner.planner.prediction.predict import CostModel, predict
from tpu_tuner.planner.topology import parse_topology

TINY = "decoder:vocab=256,d_model=128,layers=2,heads=4,mlp=256"


def test_a_topology_of_several_slices_counts_every_chip_and_its_dcn_bandwidth() -> None:
    two = parse_topology("v5p-16").with_slices(2)
    assert (two.chips, two.devices, two.shape, two.jax_name) == (16, 16, (2, 2, 2), "v5p:2x2x2")
    assert two.dcn_bytes_per_s_per_device == 50e9 / 8  # Google: 50 Gbps of DCN per v5p chip
    assert parse_topology("v5e-16").with_slices(2).dcn_bytes_per_s_per_device == 25e9 / 8  # 2 x 100 Gbps per 8 chips
    assert parse_topology("v6e-16").dcn_bytes_per_s_per_device == 100e9 / 8  # 4 x 200 Gbps per 8 chips
    tpu7x = parse_topology("tpu7x:2x2x1")
    assert not tpu7x.dcn_stated and tpu7x.dcn_bytes_per_s_per_device == 50e9 / 8 / 2  # v5p's figure, 2 devices a chip
    assert "x 2 slices over DCN (50 Gbit/s per chip)" in two.describe()
    with pytest.raises(UserInputError, match="--slices must be at least 1, not 0"):
        parse_topology("v5p-16").with_slices(0)


# The two spellings of a DCN transfer's target the TPU compiler wrote for v5e:2x2 x 2 and x 4 slices
# (libtpu 0.0.42): slices x local devices, and explicit global device ids per group.
_HLO = (
    "\n"
    "  %recv = (bf16[128,8,128]{2,1,0:T(8,128)(2,1)}, u32[], token[]) recv(%after-all), channel_id=1, "
    'is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",'
    '_xla_host_transfer_rendezvous="all-reduce.1_0",_xla_megascale_reduce_operation="SUM",'
    '_xla_megascale_target="{1,2}x{0:3}",_xla_megascale_transfer_type="ALL_REDUCE"}\n'
    "  %send = (bf16[128,8,128]{2,1,0:T(8,128)(2,1)}, u32[], token[]) send(%bitcast.1, %after-all), channel_id=2, "
    'is_host_transfer=true, frontend_attributes={_xla_megascale_target="{1,2}x{0:3}",'
    '_xla_megascale_transfer_type="ALL_REDUCE"}\n'
    "  %recv.1 = (bf16[128,1024]{1,0:T(8,128)(2,1)}, u32[], token[]) recv(%after-all.1), channel_id=3, "
    "is_host_transfer=true, frontend_attributes={_xla_megascale_target={{100000,200000},{100001,200001}},"
    '_xla_megascale_transfer_type="ALL_GATHER"}\n'
    "  %recv.2 = (bf16[64,128]{1,0}, u32[], token[]) recv(%after-all.2), channel_id=5, is_host_transfer=true, "
    "frontend_attributes={_xla_megascale_target={{100000,100001,200000,200001}},"
    '_xla_megascale_transfer_type="ALL_TO_ALL"}\n'
    "  %all-gather.13 = bf16[512,512]{1,0} all-gather(%convert), channel_id=2, replica_groups={{0,1,2,3}}, "
    "dimensions={0}\n"
)


@dataclass(frozen=True)
class _Device:
    id: int
    slice_index: int


def test_dcn_collectives_are_read_from_the_compilers_megascale_transfers() -> None:
    devices = [_Device(100000 * (s + 1) + i, s) for s in range(2) for i in range(2)]
    with device_slices(devices):
        found = parse_collectives(_HLO)
    assert found == [
        Collective("all-gather", 2, 1, 128 * 1024 * 2, "dcn"),  # one recv a transfer (the send is its other half)
        Collective("all-gather", 4, 1, 512 * 512 * 2, "ici"),
        Collective("all-reduce", 2, 1, 128 * 8 * 128 * 2, "dcn"),
        Collective("all-to-all", 2, 1, 64 * 128 * 2, "dcn"),  # four devices, two slices
    ]
    # Without the devices' slices, an explicit group counts each member as a slice (an upper bound).
    assert Collective("all-to-all", 4, 1, 64 * 128 * 2, "dcn") in parse_collectives(_HLO)


def test_the_whole_step_keeps_dcn_and_ici_collectives_of_one_kind_apart() -> None:
    ici, dcn = Collective("all-reduce", 2, 1, 100), Collective("all-reduce", 2, 1, 10, "dcn")
    step = CompiledStep(
        1e9, 1e6, 1e6, 1e6, 1e6, 0, [ici, dcn], loop_iteration=LoopIteration(1e8, 1e5, [ici, dcn], loops=2)
    )
    whole = add_loop_iterations(step, blocks=4)
    assert whole.collectives == [Collective("all-reduce", 2, 4, 40, "dcn"), Collective("all-reduce", 2, 4, 400)]


def test_dcn_time_is_a_ring_over_the_slices_at_each_devices_dcn_share_and_reported_apart() -> None:
    topology = parse_topology("v5p-16").with_slices(2)
    shape = ModelShape(d_model=1024, n_heads=8, n_kv_heads=8, mlp_hidden=4096, vocab=32000, n_layers=4)
    gradients = Collective("all-reduce", 2, 10, 2**30, "dcn")
    kept = CompiledStep(1e12, 1e9, 1e9, 1e9, 1e9, 0, [Collective("all-reduce", 2, 10, 2**30)])
    across = CompiledStep(1e12, 1e9, 1e9, 1e9, 1e9, 0, [gradients])
    model = CostModel()
    on_ici = predict(kept, topology, Layout(2, 8, 1), shape, 128, 1e12, 65536, model)
    on_dcn = predict(across, topology, Layout(2, 8, 1, dcn_data=2), shape, 128, 1e12, 65536, model)
    assert on_ici.dcn_seconds == 0 and on_ici.exposed_dcn_seconds == 0
    # 2 (n-1)/n of 1 GiB through 6.25 GB/s: 0.172 s, against microseconds of compute.
    assert on_dcn.dcn_seconds == pytest.approx(ring_seconds(gradients, 50e9 / 8)) == pytest.approx(2**30 / 6.25e9)
    assert on_dcn.comm_seconds == 0  # the ICI column holds ICI alone
    assert on_dcn.step_seconds == pytest.approx(
        on_ici.step_seconds - on_ici.exposed_comm_seconds + on_dcn.exposed_comm_seconds
    )
    assert on_dcn.exposed_dcn_seconds > 0.9 * on_dcn.dcn_seconds > 0
    assert on_dcn.step_seconds > 10 * on_ici.step_seconds


def test_the_hybrid_mesh_puts_dcn_ways_outer_and_keeps_each_slice_in_its_own_order() -> None:
    devices = [_Device(100000 * (s + 1) + i, s) for s in range(2) for i in range(4)]
    data = mesh_devices(devices, Layout(2, 4, 1, dcn_data=2))
    assert data.shape == (2, 4, 1, 1, 1, 1)
    assert [d.slice_index for d in data[0].flat] == [0] * 4 and [d.slice_index for d in data[1].flat] == [1] * 4
    assert [d.id for d in data[0].flat] == [100000, 100001, 100002, 100003]
    fsdp = mesh_devices(devices, Layout(1, 8, 1, dcn_fsdp=2)).reshape(8)
    assert [d.slice_index for d in fsdp] == [0, 0, 0, 0, 1, 1, 1, 1]  # fsdp's DCN ways outer along its axis
    mixed = mesh_devices(devices, Layout(2, 2, 2, dcn_data=2))  # data over DCN, fsdp x tensor in each slice
    assert {d.slice_index for d in mixed[1].flat} == {1}
    # A layout whose DCN ways are not the slice count is refused before any mesh (Topology.check_layout).
    with pytest.raises(UserInputError, match="spans 1 slice"):
        parse_topology("v5e:2x2").with_slices(2).check_layout(Layout(2, 4, 1))


def test_enumerated_layouts_spread_the_slices_over_data_or_fsdp() -> None:
    shape = ModelShape(d_model=128, n_heads=4, n_kv_heads=4, mlp_hidden=256, vocab=256, n_layers=2)
    valid, _ = enumerate_layouts(8, shape, 16, 128, slices=2)
    assert all(layout.slices == 2 for layout in valid)
    assert Layout(2, 4, 1, dcn_data=2) in valid and Layout(1, 8, 1, dcn_fsdp=2) in valid
    assert Layout(2, 4, 1, dcn_fsdp=2) in valid  # fsdp 4 = 2 across slices x 2 inside
    assert enumerate_layouts(8, shape, 16, 128)[0] == [x for x in enumerate_layouts(8, shape, 16, 128, slices=1)[0]]


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--slices", "0"], "--slices must be at least 1, not 0"),
        (
            ["--slices", "2", "--layout", "2x4x1"],
            "--layout 2x4x1 spans 1 slice(s) (dcn_data x dcn_fsdp), --slices is 2",
        ),
        (["--slices", "2", "--layout", "4x2x1,dcn_data=2,dcn_fsdp=2"], "spans 4 slice(s)"),
        (["--slices", "2", "--layout", "2x4x1,dcn_dta=2"], "unknown axis 'dcn_dta'"),
        (
            ["--layout", "1x4x1,dcn_pipeline=2", "--slices", "2"],
            "dcn_pipeline (pipeline stages across slices) is not compiled",
        ),
        (["--layout", "1x2x1"], "--layout 1x2x1 places 2 devices; v5e:2x2 has 4"),
        (["--slices", "2", "--layout", "2x4x2,dcn_data=2"], "places 16 devices; v5e:2x2 x 2 slices has 8"),
    ],
)
def test_a_slice_count_the_layout_cannot_form_is_one_line_and_status_2(tmp_path, capsys, args, problem) -> None:
    status = main(["-q", "plan", TINY, "--topology", "v5e:2x2", "--seq", "128", "--out", str(tmp_path), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and err[0].startswith("tpu-tune: error: ")
    assert problem in err[0]


_PLANNER = importlib.util.find_spec("torchax") is not None and importlib.util.find_spec("libtpu") is not None


@pytest.mark.slow  # two compiles of a two-slice program (~25 s each here)
@pytest.mark.skipif(not _PLANNER, reason="the planner extra is not installed: pip install -e '.[plan]'")
def test_fsdp_across_slices_ranks_below_data_across_slices_as_the_compiled_program_says(tmp_path) -> None:
    """v5e:2x2 x 2 slices, a tiny decoder: fsdp 8 with its DCN ways across slices puts every block's
    weight all-gathers on DCN; data 2 across slices x fsdp 4 inside keeps them on ICI and sends only
    the gradients' all-reduce across. The compiled programs say so, and the plan ranks it so."""
    code = f"""
        import json
        from pathlib import Path
        from tpu_tuner.model.meshes.layouts import parse_layout
        from tpu_tuner.outputs.plan_report import render_terminal
        from tpu_tuner.plan_api import plan_to_folder
        from tpu_tuner.planner.plans.plan_options import PlanCompile, PlanEnumeration, PlanOptions, PlanStep, PlanTarget
        options = PlanOptions(PlanTarget("v5e:2x2", slices=2), step=PlanStep(global_batch=16, seq_len=128),
                              compile=PlanCompile(fast_compile=True, workers=2),
                              enumeration=PlanEnumeration(layouts=[parse_layout("1x8x1,dcn_fsdp=2"),
                                                                   parse_layout("2x4x1,dcn_data=2")]))
        run_dir, result = plan_to_folder("{TINY}", options, Path({str(tmp_path)!r}))
        print(json.dumps({{"table": render_terminal(result), "md": (run_dir / "plan.md").read_text(),
                          "plan": json.loads((run_dir / "plan.json").read_text())}}))
    """
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    plans = {Layout.from_mesh(p["layout"]).short(): p for p in report["plan"]["plans"]}
    fsdp, data = plans["1x8x1,dcn_fsdp=2"], plans["2x4x1,dcn_data=2"]

    def dcn(plan: dict, kind: str) -> int:
        return sum(c["count"] for c in plan["compiled"]["collectives"] if c["network"] == "dcn" and c["kind"] == kind)

    assert dcn(data, "all-gather") == 0 and dcn(data, "all-reduce") > 0  # the gradients alone cross slices
    assert dcn(fsdp, "all-gather") > 0  # the weight gathers cross slices
    assert fsdp["prediction"]["dcn_seconds"] > 2 * data["prediction"]["dcn_seconds"] > 0
    assert fsdp["prediction"]["exposed_dcn_seconds"] > data["prediction"]["exposed_dcn_seconds"]
    assert fsdp["prediction"]["step_seconds"] > data["prediction"]["step_seconds"]
    assert report["plan"]["best"].startswith("data 2 x fsdp 4 x tensor 1 (across slices: data 2)")
    assert report["plan"]["topology"]["slices"] == 2 and report["plan"]["topology"]["devices"] == 8
    assert "DCN collectives (exposed)" in report["table"] and "DCN collectives (exposed)" in report["md"]
    assert "DCN across 2 slices" in report["md"] and "25 Gbit/s of DCN per chip" in report["md"]


def test_the_search_offers_the_slices_split_only_over_several_slices() -> None:
    from tpu_tuner.planner.plans.plan_space import default_space, point_of, valid_points

    shape = ModelShape(d_model=128, n_heads=4, n_kv_heads=4, mlp_hidden=256, vocab=256, n_layers=2)
    one = default_space(8, shape, 128, remats=("full",), accumulations=(1,), contexts=(1,))
    assert "dcn" not in one.describe() and all(p.layout.slices == 1 for p in valid_points(one, 8, shape, 16, 128))
    two = default_space(8, shape, 128, remats=("full",), accumulations=(1,), contexts=(1,), slices=2)
    assert two.describe()["dcn"] == ["2x1", "1x2"]
    points = valid_points(two, 8, shape, 16, 128)
    assert all(p.layout.slices == 2 for p in points) and len(points) > len(valid_points(one, 8, shape, 16, 128))
    assert point_of(dict(tensor=1, context=1, data=1, remat="full", accumulation=1, dcn="2x1"), 8) is None  # data 1
    assert point_of(dict(tensor=1, context=1, data=1, remat="full", accumulation=1, dcn="1x2"), 8).layout == Layout(
        1, 8, 1, dcn_fsdp=2
    )
