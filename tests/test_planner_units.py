"""Planner pieces that need no compiler: slice names, layouts, placements, collectives, costs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import EXAMPLES

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.model.meshes.layouts import Layout, ModelShape, enumerate_layouts, partition_spec, placements
from tpu_tuner.model.workloads.loader import load_workload
from tpu_tuner.model.workloads.structure import read_dims
from tpu_tuner.planner.compiler.compiled_step import CompiledStep, add_loop_iterations, combine_scanned
from tpu_tuner.planner.compiler.loop_costs import LoopIteration, block_loop_iteration
from tpu_tuner.planner.prediction.collectives import Collective, parse_collectives, ring_seconds
from tpu_tuner.planner.prediction.predict import ring_bandwidth
from tpu_tuner.planner.topology import parse_topology


@pytest.mark.parametrize(
    ("name", "chips", "devices", "jax_name"),
    [
        ("v5p-256", 128, 128, "v5p:4x4x8"),  # v5p names count TensorCores: 2 per chip
        ("v4-64", 32, 32, "v4:2x4x4"),
        ("v6e-64", 64, 64, "v6e:8x8"),  # v5e / v6e names count chips
        ("v5e-16", 16, 16, "v5e:4x4"),
        ("tpu7x-128", 128, 256, "tpu7x:4x4x8"),  # TPU7x: 2 devices per chip
        ("v5p:16x16x32", 8192, 8192, "v5p:16x16x32"),
        ("tpu7x:2x2x1", 4, 8, "tpu7x:2x2x1"),
    ],
)
def test_slice_names(name: str, chips: int, devices: int, jax_name: str) -> None:
    topology = parse_topology(name)
    assert (topology.chips, topology.devices, topology.jax_name) == (chips, devices, jax_name)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("v9-8", "unknown topology"),
        ("v5p-7", "even number"),
        ("v6e:4x4x4", "2D torus"),
        ("v6e-512", "no standard v6e slice"),
    ],
)
def test_bad_slice_names(name: str, problem: str) -> None:
    with pytest.raises(UserInputError, match=problem):
        parse_topology(name)


def test_layouts_divide_or_say_why() -> None:
    shape = ModelShape(d_model=256, n_heads=8, n_kv_heads=2, mlp_hidden=768, vocab=4096, n_layers=4)
    valid, rejected = enumerate_layouts(8, shape, global_batch=16)
    assert all(layout.devices == 8 for layout in valid + [r[0] for r in rejected])
    assert Layout(1, 8, 1) in valid and Layout(1, 4, 2) in valid and Layout(8, 1, 1) in valid
    reasons = dict(rejected)
    assert "2 KV heads" in reasons[Layout(1, 2, 4)]
    valid_small_batch, rejected_small = enumerate_layouts(8, shape, global_batch=4)
    assert "global batch 4" in dict(rejected_small)[Layout(1, 8, 1)]


def test_placements_follow_the_model_structure() -> None:
    workload = load_workload(EXAMPLES / "llama.py")
    with torch.device("meta"):
        model = workload.model_for_preset("tiny")
    placed = placements(model, d_model=256)
    assert placed["layers.0.attention.wq.weight"] == "colwise"
    assert placed["layers.0.attention.wk.weight"] == "colwise"
    assert placed["layers.0.attention.wo.weight"] == "rowwise"  # square d -> d, last of its module
    assert placed["layers.0.feed_forward.w_gate.weight"] == "colwise"
    assert placed["layers.0.feed_forward.w_down.weight"] == "rowwise"
    assert placed["output.weight"] == "colwise"
    assert placed["tok_embeddings.weight"] == "embedding"
    assert placed["layers.0.attention_norm.weight"] == "replicated"
    assert partition_spec("colwise", 2) == ("tensor", "fsdp") and partition_spec("rowwise", 2) == ("fsdp", "tensor")
    gpt = load_workload(EXAMPLES / "gpt.py").build_model()
    gpt_placed = placements(gpt, d_model=256)
    assert gpt_placed["blocks.0.attn.qkv.weight"] == "colwise" and gpt_placed["blocks.0.attn.proj.weight"] == "rowwise"
    assert gpt_placed["blocks.0.mlp.0.weight"] == "colwise" and gpt_placed["blocks.0.mlp.2.weight"] == "rowwise"


def test_dims_of_the_70b_preset_without_materialising_it() -> None:
    workload = load_workload(EXAMPLES / "llama.py")
    with torch.device("meta"):
        model = workload.model_for_preset("70b")
    dims = read_dims(model)
    assert dims.shape == ModelShape(8192, 64, 8, 28672, 128256, 80) and dims.head_dim == 128


def test_collectives_from_hlo_text() -> None:
    hlo = "\n".join(
        [
            "%all-gather.1 = bf16[8,1024]{1,0} all-gather(bf16[1,1024]{1,0} %p), channel_id=1, "
            "replica_groups=[2,8]<=[16], dimensions={0}",
            "%all-gather-start = (bf16[1,1024]{1,0}, bf16[4,1024]{1,0}) all-gather-start(%q), "
            "replica_groups={{0,1,2,3},{4,5,6,7}}",
            "%all-reduce.2 = f32[256]{0} all-reduce(f32[256]{0} %g), "
            "replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0','axis_1'}",
            "%reduce-scatter = f32[16]{0} reduce-scatter(f32[64]{0} %h), replica_groups=[4,4]<=[16], dimensions={0}",
            "%add.3 = f32[16]{0} add(f32[16]{0} %a, f32[16]{0} %b)",
        ]
    )
    found = {(c.kind, c.group_size): c for c in parse_collectives(hlo)}
    assert found[("all-gather", 8)] == Collective("all-gather", 8, 1, 8 * 1024 * 2)
    assert found[("all-gather", 4)] == Collective("all-gather", 4, 1, 4 * 1024 * 2)  # async: result counted once
    assert found[("all-reduce", 8)].bytes == 256 * 4
    assert found[("reduce-scatter", 4)].bytes == 16 * 4
    assert len(found) == 4


def test_ring_costs() -> None:
    gb = 1e9
    assert ring_seconds(Collective("all-gather", 4, 1, 4 * 10**9), gb) == pytest.approx(3.0)
    assert ring_seconds(Collective("reduce-scatter", 4, 1, 10**9), gb) == pytest.approx(3.0)
    assert ring_seconds(Collective("all-reduce", 4, 1, 10**9), gb) == pytest.approx(1.5)
    assert ring_seconds(Collective("all-reduce", 1, 1, 10**9), gb) == 0.0
    v5p = parse_topology("v5p:16x16x32")
    # One axis (32 chips fit along the 32-long axis) gets a third of the chip's 1200 GB/s; the whole
    # slice spans all three axes.
    assert ring_bandwidth(v5p, 32) == pytest.approx(400e9)
    assert ring_bandwidth(v5p, 8192) == pytest.approx(1200e9)


def test_scanned_program_scales_one_block_to_the_depth() -> None:
    """The scanned program holds the loop body once: per-block work is it minus the ends, times
    the depth; memory is the scanned program's own."""
    ends = CompiledStep(
        10.0, 100.0, 1.0, 1.0, 5.0, 1.0, [Collective("all-gather", 8, 3, 300), Collective("all-reduce", 4, 1, 50)]
    )
    scanned = CompiledStep(16.0, 150.0, 2.0, 2.0, 7.0, 2.0, [Collective("all-gather", 8, 5, 500)])
    full = combine_scanned(ends, scanned, 80)
    assert full.flops == 10 + 80 * 6 and full.bytes_accessed == 100 + 80 * 50
    assert (full.argument_bytes, full.temp_bytes, full.alias_bytes) == (2.0, 7.0, 2.0)
    assert full.collectives == [
        Collective("all-gather", 8, 3 + 80 * 2, 300 + 80 * 200),
        Collective("all-reduce", 4, 1, 50),
    ]


def test_scanned_program_never_counts_negative_work() -> None:
    """The ends fused differently inside the scanned program (fewer bytes there) is not a block
    that frees bytes: the per-block difference stops at zero."""
    ends = CompiledStep(10.0, 100.0, 1.0, 1.0, 5.0, 1.0, [])
    scanned = CompiledStep(16.0, 90.0, 2.0, 2.0, 5.1, 2.0, [])
    assert combine_scanned(ends, scanned, 80).bytes_accessed == 100.0


def test_one_compile_adds_the_loops_other_iterations() -> None:
    """The compiler's totals hold the loops once; the other depth - 1 iterations are added, the
    collectives per (kind, group) included; memory stays the program's own."""
    iteration = LoopIteration(6.0, 50.0, [Collective("all-gather", 8, 2, 200)], loops=2)
    scanned = CompiledStep(
        16.0,
        150.0,
        2.0,
        2.0,
        7.0,
        2.0,
        [Collective("all-gather", 8, 5, 500), Collective("all-reduce", 4, 1, 50)],
        loop_iteration=iteration,
    )
    full = add_loop_iterations(scanned, 80)
    assert full.flops == 16 + 79 * 6 and full.bytes_accessed == 150 + 79 * 50
    assert (full.argument_bytes, full.temp_bytes, full.alias_bytes) == (2.0, 7.0, 2.0)
    assert full.collectives == [
        Collective("all-gather", 8, 5 + 79 * 2, 500 + 79 * 200),
        Collective("all-reduce", 4, 1, 50),
    ]
    with pytest.raises(ValueError, match="not measured"):
        add_loop_iterations(CompiledStep(1, 1, 1, 1, 1, 1), 80)


def test_loop_iterations_measured_in_hlo_add_up_to_the_unrolled_program() -> None:
    """A real XLA program (JAX on this CPU): a scan over 6 layers of matmul + tanh counts, with its
    other 5 iterations added, the FLOPs of the same layers unrolled; a program with no scan has
    no loop to measure."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    def layer(h, w):
        return jnp.tanh(h @ w), None

    def scanned(h, ws):
        return jax.lax.scan(layer, h, ws)[0].sum()

    def unrolled(h, ws):
        for i in range(ws.shape[0]):
            h = layer(h, ws[i])[0]
        return h.sum()

    h, ws = jnp.ones((64, 128)), jnp.ones((6, 128, 128))
    # Gradients for the input too: otherwise the unrolled program drops the first layer's input
    # gradient, which a scan body cannot.
    compiled = {f.__name__: jax.jit(jax.grad(f, argnums=(0, 1))).lower(h, ws).compile() for f in (scanned, unrolled)}
    iteration = block_loop_iteration(compiled["scanned"].as_text())
    assert iteration is not None and iteration.loops == 2  # the forward scan and its transpose
    assert iteration.flops >= 3 * 2 * 64 * 128 * 128  # three matmuls an iteration: forward, two in backward

    def flops(c: Any) -> float:
        return (c.cost_analysis()[0] if isinstance(c.cost_analysis(), list) else c.cost_analysis())["flops"]

    assert flops(compiled["scanned"]) + 5 * iteration.flops == pytest.approx(flops(compiled["unrolled"]), rel=0.02)
    assert block_loop_iteration(compiled["unrolled"].as_text()) is None


def test_the_compilers_hbm_limit_is_read_from_its_refusal() -> None:
    from tpu_tuner.planner.compiler.hbm import parse_hbm_limit

    message = (
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
        "(1.00T) exceeds available HBM (95.74G)."
    )
    assert parse_hbm_limit(message) == int(95.74 * 2**30)
    assert parse_hbm_limit("exceeds available HBM (512M)") == 512 * 2**20
    assert parse_hbm_limit("some other failure") is None


def test_a_topology_as_the_compiler_sees_it() -> None:
    from tpu_tuner.core.errors import UserInputError
    from tpu_tuner.planner.topology import parse_topology

    v4 = parse_topology("v4-8")  # 8 TensorCores: 4 chips
    assert (v4.chips, v4.devices) == (4, 4)
    compiled = v4.as_compiled(8, 15 * 2**30)  # libtpu's compile-only v4: one device per core
    assert (compiled.devices, compiled.devices_per_chip, compiled.hbm_bytes_per_device) == (8, 2, 15 * 2**30)
    assert compiled.peak_flops_per_device == pytest.approx(275e12 / 2)
    assert compiled.hbm_bytes_per_s_per_device == pytest.approx(1200e9 / 2)  # the chip's bandwidth, shared
    assert parse_topology("tpu7x-8").hbm_bytes_per_s_per_device == pytest.approx(7380e9 / 2)
    assert parse_topology("v5e-4").hbm_bytes_per_device == 16 * 2**30  # GiB, as TorchTPU's table has it
    with pytest.raises(UserInputError, match="the TPU compiler sees 6 devices for 4 v4 chips"):
        v4.as_compiled(6, None)
