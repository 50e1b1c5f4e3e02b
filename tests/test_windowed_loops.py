"""The windowed einsums' loops (XLA's collective matmuls) counted at their trip count.

XLA's cost analysis counts a while loop's body once. The TPU compiler decomposes an FSDP
all-gather or reduce-scatter around a matmul into such a loop (a few iterations, its counter
stepping by 2 from 0 to 8 in the 8B v6e-16 calibration program: docs/planner.md, "What the
windowed einsums hide"). These HLO modules have that loop's shape, small enough for the CPU
client's HloCostAnalysis to measure."""

from __future__ import annotations

import importlib.util

import pytest

from tpu_tuner.planner.compiler.loop_costs import block_loop_iteration, windowed_uncounted
from tpu_tuner.planner.prediction.collectives import parse_collectives

# Not importorskip: importing jax at collection installs its gc callback in every test worker, and
# an exception a signal raises inside a gc callback is dropped (test_early_stop's compile deadline).
needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax measures the loop bodies")

DOT_FLOPS = 2 * 8 * 8 * 8  # one f32[8,8] x f32[8,8] dot
STATE = "(f32[8,8]{1,0}, f32[8,8]{1,0}, u32[], u32[])"

WINDOWED = """
%windowed_dot_general_cond (wide.param.1: (f32[8,8], f32[8,8], u32[], u32[])) -> pred[] {
  %constant.10 = u32[] constant(LIMIT)
  %wide.param.1 = STATE parameter(0)
  %get-tuple-element.11 = u32[] get-tuple-element(%wide.param.1), index=2
  %get-tuple-element.13 = u32[] get-tuple-element(%wide.param.1), index=3
  ROOT %compare.12 = pred[] compare(%get-tuple-element.11, BOUND), direction=LT
}

%windowed_dot_general_body (wide.param.2: (f32[8,8], f32[8,8], u32[], u32[])) -> STATE {
  %wide.param.2 = STATE parameter(0)
  %lhs = f32[8,8]{1,0} get-tuple-element(%wide.param.2), index=0
  %rhs = f32[8,8]{1,0} get-tuple-element(%wide.param.2), index=1
  %step = u32[] get-tuple-element(%wide.param.2), index=2
  %other = u32[] get-tuple-element(%wide.param.2), index=3
  %dot.24 = f32[8,8]{1,0} dot(%lhs, %rhs), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %constant.25 = u32[] constant(2)
  %add.26 = u32[] add(%step, %constant.25), control-predecessors={%dot.24}
  ROOT %tuple.27 = STATE tuple(%dot.24, %rhs, %add.26, /*index=3*/%other)
}
"""

# The windowed loop started at START (through a copy, as the compiler writes it) in CALLER.
LOOP = """  %constant.3 = u32[] constant(START)
  %copy.4 = u32[] copy(%constant.3)
  %constant.5 = u32[] constant(7)
  %tuple.6 = STATE tuple(ACTIVATION, %Arg_1.2, %copy.4, %constant.5)
  %while.7 = STATE while(%tuple.6), condition=%windowed_dot_general_cond, body=%windowed_dot_general_body
  %get-tuple-element.8 = f32[8,8]{1,0} get-tuple-element(%while.7), index=0
"""

FLAT = """HloModule jit_train_step, entry_computation_layout={(f32[8,8]{1,0}, f32[8,8]{1,0})->f32[8,8]{1,0}}
WINDOWED
ENTRY %main.30 (Arg_0.1: f32[8,8], Arg_1.2: f32[8,8]) -> f32[8,8] {
  %Arg_0.1 = f32[8,8]{1,0} parameter(0)
  %Arg_1.2 = f32[8,8]{1,0} parameter(1)
LOOP  ROOT %copy.9 = f32[8,8]{1,0} copy(%get-tuple-element.8)
}
"""

# A scan of blocks (JAX's "/while") whose body holds the windowed loop.
SCANNED = """HloModule jit_train_step, entry_computation_layout={(f32[8,8]{1,0}, f32[8,8]{1,0})->f32[8,8]{1,0}}
WINDOWED
%cond (param.40: (s32[], f32[8,8], f32[8,8])) -> pred[] {
  %param.40 = (s32[], f32[8,8]{1,0}, f32[8,8]{1,0}) parameter(0)
  %get-tuple-element.41 = s32[] get-tuple-element(%param.40), index=0
  %constant.42 = s32[] constant(4)
  ROOT %compare.43 = pred[] compare(%get-tuple-element.41, %constant.42), direction=LT
}

%block (param.50: (s32[], f32[8,8], f32[8,8])) -> (s32[], f32[8,8], f32[8,8]) {
  %param.50 = (s32[], f32[8,8]{1,0}, f32[8,8]{1,0}) parameter(0)
  %get-tuple-element.51 = s32[] get-tuple-element(%param.50), index=0
  %get-tuple-element.52 = f32[8,8]{1,0} get-tuple-element(%param.50), index=1
  %Arg_1.2 = f32[8,8]{1,0} get-tuple-element(%param.50), index=2
  %constant.53 = s32[] constant(1)
  %add.54 = s32[] add(%get-tuple-element.51, %constant.53)
LOOP  ROOT %tuple.55 = (s32[], f32[8,8]{1,0}, f32[8,8]{1,0}) tuple(%add.54, %get-tuple-element.8, %Arg_1.2)
}

ENTRY %main.30 (Arg_0.1: f32[8,8], Arg_1.2: f32[8,8]) -> f32[8,8] {
  %Arg_0.1 = f32[8,8]{1,0} parameter(0)
  %Arg_1.2 = f32[8,8]{1,0} parameter(1)
  %constant.60 = s32[] constant(0)
  %tuple.61 = (s32[], f32[8,8]{1,0}, f32[8,8]{1,0}) tuple(%constant.60, %Arg_0.1, %Arg_1.2)
  %while.62 = SCAN while(%tuple.61), condition=%cond, body=%block, metadata={op_name="jit(train_step)/while"}
  ROOT %get-tuple-element.63 = f32[8,8]{1,0} get-tuple-element(%while.62), index=1
}
"""


def _module(template: str, start: int = 0, bound: str = "%constant.10", activation: str = "%Arg_0.1") -> str:
    windowed = WINDOWED.replace("LIMIT", "8").replace("BOUND", bound)
    loop = LOOP.replace("START", str(start)).replace("ACTIVATION", activation)
    module = template.replace("WINDOWED", windowed).replace("LOOP", loop).replace("STATE", STATE)
    return module.replace("SCAN", "(s32[], f32[8,8]{1,0}, f32[8,8]{1,0})")


@needs_jax
def test_a_windowed_loop_counts_every_iteration():
    # From 0 to 8 in steps of 2: 4 iterations, of which the cost analysis counted one.
    uncounted = windowed_uncounted(_module(FLAT))
    assert uncounted is not None and uncounted.loops == 1
    assert uncounted.flops == pytest.approx(3 * (DOT_FLOPS + 1))  # the dot and the counter's add
    assert uncounted.bytes_accessed == 0  # HBM bytes stay the once-counted body's (loop_costs says why)


@needs_jax
def test_the_trip_count_reads_the_counters_start():
    uncounted = windowed_uncounted(_module(FLAT, start=4))  # 4, 6: two iterations
    assert uncounted is not None and uncounted.flops == pytest.approx(DOT_FLOPS + 1)


@needs_jax
def test_a_loop_without_a_readable_count_stays_counted_once():
    # The bound is a loop-carried value, not a constant: nothing can be said of the trips.
    assert windowed_uncounted(_module(FLAT, bound="%get-tuple-element.13")) is None


@needs_jax
def test_a_block_iteration_holds_its_windowed_loops_whole():
    text = _module(SCANNED, activation="%get-tuple-element.52")
    iteration = block_loop_iteration(text)
    assert iteration is not None and iteration.loops == 1
    # The block body: its own counter add, the windowed loop once as the cost analysis counts it
    # (its dot, its add, its condition's compare), plus the loop's 3 other iterations.
    assert iteration.flops == pytest.approx(1 + (DOT_FLOPS + 2) + 3 * (DOT_FLOPS + 1))
    whole_program = windowed_uncounted(text)
    assert whole_program is not None and whole_program.flops == pytest.approx(3 * (DOT_FLOPS + 1))


def test_a_permute_start_is_counted_by_its_buffer_not_its_context_scalars():
    line = (
        "  %collective-permute-start.80 = (bf16[4096,1,256]{2,0,1:T(8,128)(2,1)}, "
        "bf16[4096,1,256]{2,0,1:T(8,128)(2,1)}, u32[]{:S(2)}, u32[]{:S(2)}) "
        "collective-permute-start(%get-tuple-element.4644), channel_id=3, source_target_pairs={{0,1},{1,0}}"
    )
    (permute,) = parse_collectives(line)
    assert (permute.kind, permute.group_size, permute.count) == ("collective-permute", 2, 1)
    assert permute.bytes == 4096 * 256 * 2
