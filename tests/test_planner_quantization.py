"""The step's precision in the planner: --weight-dtype and --quantization (docs/planner.md,
"Precision of the step"): compiled memory, the 8-bit dots in the compiled HLO, the prediction, and
the one-line refusals."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from helpers.tiny_planner import TINY, TINY_MATRIX_PARAMETERS, needs_planner, planner_env, run_planner_python

from tpu_tuner.model.meshes.layouts import Layout, ModelShape
from tpu_tuner.planner.compiler.compiled_step import CompiledStep
from tpu_tuner.planner.plans.plan_space import PlanPoint, memory_lower_bound
from tpu_tuner.planner.prediction.predict import QUANTIZED_PEAK_TFLOPS, CostModel, predict, quantized_peak_refusal
from tpu_tuner.planner.topology import parse_topology


def _run_python(code: str, timeout: int = 900) -> dict:
    """Planner code in a fresh interpreter with `dots` pasted in for __DOTS__; its JSON line."""
    return json.loads(run_planner_python(textwrap.dedent(code).replace("__DOTS__", _DOTS), timeout))


def _plan_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tpu_tuner.cli", "plan", TINY, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=planner_env(),
    )


def test_8bit_peaks_are_googles_and_other_generations_are_refused() -> None:
    assert QUANTIZED_PEAK_TFLOPS == {"int8": {"v5e": 393.0, "v6e": 1836.0}, "fp8": {"tpu7x": 4614.0}}
    assert quantized_peak_refusal("tpu7x", "fp8") is None
    assert quantized_peak_refusal("v6e", "int8") is None
    for generation in ("v4", "v5e", "v5p", "v6e"):
        assert "no fp8 matmul units" in quantized_peak_refusal(generation, "fp8")
    for generation in ("v4", "v5p", "tpu7x"):
        assert f"no int8 peak for {generation}" in quantized_peak_refusal(generation, "int8")
    assert "unknown quantization 'int4'" in quantized_peak_refusal("v5e", "int4")


def test_the_memory_lower_bound_follows_the_weights_dtype() -> None:
    point = PlanPoint(Layout(1, 4, 1), "full")
    shape = ModelShape(128, 4, 4, 256, 256, 2)
    fp32 = memory_lower_bound(point, 1_000_000, shape, 8, 256)
    bf16 = memory_lower_bound(point, 1_000_000, shape, 8, 256, first_moment_bytes=2, weight_bytes=2)
    assert fp32.weights_and_moments == 12 * 1_000_000 / 4  # weight, first and second moment: 4 bytes each
    assert bf16.weights_and_moments == 6 * 1_000_000 / 4
    assert bf16.block_inputs == fp32.block_inputs


def test_fp8_runs_the_quantized_share_at_tpu7xs_fp8_peak_and_mfu_stays_against_bf16() -> None:
    topology = parse_topology("tpu7x:2x2x1")
    shape = ModelShape(4096, 32, 32, 16384, 1024, 2)
    # A compute-bound step: 1 TFLOP per device, few bytes, no collectives.
    step = CompiledStep(1e12, 1e9, 0, 0, 0, 0)
    model = CostModel(mxu_efficiency=0.5, memory_overlap=0.0, overlap=1.0)
    args = (step, topology, Layout(1, 8, 1), shape, 128, 0.9e12, 8 * 2048, model)
    bf16 = predict(*args)
    fp8 = predict(*args, quantization="fp8", quantized_share=0.75)
    peak = 2307e12 / 2  # per device: two devices a chip
    assert bf16.compute_seconds == pytest.approx(1e12 / (peak * 0.5), rel=1e-9)
    assert fp8.compute_seconds == pytest.approx(1e12 * (0.25 / peak + 0.75 / (4614e12 / 2)) / 0.5, rel=1e-9)
    assert fp8.step_seconds < bf16.step_seconds
    assert fp8.tokens_per_second / bf16.tokens_per_second == pytest.approx(bf16.step_seconds / fp8.step_seconds)
    # MFU: the same model FLOPs against the same bf16 peak, so it rises with the shorter step.
    assert fp8.mfu == pytest.approx(0.9e12 / fp8.step_seconds / peak)


def test_the_precision_is_part_of_a_searchs_study_record() -> None:
    from dataclasses import replace

    from tpu_tuner.model.workloads.structure import Dims
    from tpu_tuner.planner.compiler.compile_request import StepSettings
    from tpu_tuner.planner.plans.plan_problem import PlanProblem
    from tpu_tuner.planner.plans.plan_records import plan_record
    from tpu_tuner.planner.plans.plan_space import PlanSpace

    shape = ModelShape(128, 4, 4, 256, 256, 2)
    problem = PlanProblem(
        source="shape",
        workload="decoder",
        preset=None,
        topology=parse_topology("tpu7x:2x2x1"),
        step=StepSettings(8, 256),
        dims=Dims(shape, 32),
        gated=True,
        matmul_parameters=1,
        parameters=1,
        model_flops=1.0,
        attention="full",
        fast=True,
        cost_model=CostModel(),
        placements={},
        model_digest="0" * 64,
    )
    space = PlanSpace(tensors=(1,))
    records = [
        plan_record(p, space)
        for p in (
            problem,
            replace(problem, step=replace(problem.step, quantization="fp8")),
            replace(problem, step=replace(problem.step, weight_dtype="bfloat16")),
        )
    ]
    assert "quantization" not in records[0] and "weight_dtype" not in records[0]  # earlier studies keep their names
    assert records[1]["quantization"] == "fp8" and records[2]["weight_dtype"] == "bfloat16"
    assert len({json.dumps(r, sort_keys=True) for r in records}) == 3


REFUSALS = [
    (["--topology", "v5e:2x2", "--quantization", "fp8"], "v5e has no fp8 matmul units"),
    (["--topology", "tpu7x:2x2x1", "--quantization", "int8"], "no int8 peak for tpu7x"),
    (["--topology", "v5e:2x2", "--quantization", "int4"], "--quantization takes int8 or fp8, not 'int4'"),
    (["--topology", "v5e:2x2", "--weight-dtype", "float16"], "--weight-dtype takes float32 or bfloat16"),
]


@needs_planner
def test_bad_precision_is_refused_in_one_line_with_exit_2() -> None:
    """Each refusal through the command's entry point, all in one interpreter (one start-up):
    exit status 2 and a single line on stderr naming the problem."""
    code = textwrap.dedent(f"""
        import contextlib, io, json, sys
        from tpu_tuner.cli import main
        results = []
        for flags in {[flags for flags, _ in REFUSALS]!r}:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                try:
                    status = main(["plan", {TINY!r}, *flags, "--seq", "256", "--fast"])
                except SystemExit as exit:
                    status = exit.code
            results.append([status, err.getvalue()])
        print(json.dumps(results))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=planner_env())
    assert done.returncode == 0, done.stderr[-2000:]
    for (status, stderr), (_, words) in zip(json.loads(done.stdout.strip().splitlines()[-1]), REFUSALS):
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert status == 2 and len(lines) == 1 and words in lines[0], stderr[-2000:]


# Pasted into the subprocesses' code: the operand and result types of every dot / convolution in
# the optimised HLO (the TPU compiler lowers dots to convolutions).
_DOTS = r"""def dots(text):
    types = dict(re.findall(r"%([\w.\-]+) = (\w+)\[", text))
    found = re.findall(r"= (\w+)\[[^\]]*\]\S* (?:convolution|dot)\(%([\w.\-]+), %([\w.\-]+)\)", text)
    return Counter(f"{types.get(a)} x {types.get(b)} -> {out}" for out, a, b in found)
"""


@needs_planner
def test_the_quantized_dot_alone_compiles_int8_forward_and_backward() -> None:
    out = _run_python(r"""
        import json, re
        from collections import Counter
        import jax, jax.numpy as jnp
        from jax.sharding import Mesh, NamedSharding, PartitionSpec
        from tpu_tuner.planner.compiler.compile_request import topology_devices
        from tpu_tuner.planner.compiler.quantized_matmul import quantized_dot
        __DOTS__
        mesh = Mesh(topology_devices("v5e:2x2"), ("fsdp",))
        dot = quantized_dot("int8")
        x = jax.ShapeDtypeStruct((4, 256, 512), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec("fsdp")))
        w = jax.ShapeDtypeStruct((1024, 512), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec("fsdp")))
        step = jax.jit(jax.value_and_grad(lambda x, w: (dot(x, w).astype(jnp.float32) ** 2).sum(), argnums=(0, 1)))
        text = step.lower(x, w).compile().as_text()
        print(json.dumps(dots(text)))
    """)
    # The forward dot, the activations' gradient and the weights' gradient: all int8 with int32 sums.
    assert out == {"s8 x s8 -> s32": 3}


_COMPILE = r"""
    import json, re, sys
    from collections import Counter
    import jax._src.stages as stages
    texts = []
    as_text = stages.Compiled.as_text
    stages.Compiled.as_text = lambda self, *a, **k: texts.append(as_text(self, *a, **k)) or texts[-1]
    from tpu_tuner.model.meshes.layouts import Layout
    from tpu_tuner.planner.compiler.compile_request import topology_devices
    from tpu_tuner.planner.plans.hf_plan import planned_workload
    from tpu_tuner.planner.compiler.program import compile_step
    from tpu_tuner.planner.compiler.compile_request import CompileJob, CompileModel, CompileTarget, StepSettings
    from tpu_tuner.planner.plans.plan_space import PlanPoint

    __DOTS__

    workload = planned_workload(__MODEL__)
    out = {}
    for name, topology, weights, quantization in __RUNS__:
        devices = topology_devices(topology)
        layout = Layout(1, len(devices), 1)
        settings = StepSettings(8, 256, first_moment_dtype=weights, weight_dtype=weights, quantization=quantization)
        job = CompileJob(CompileModel("shape", None, 128, 2, scan=True), CompileTarget(topology), settings,
                         PlanPoint(layout), fast=True)
        step = compile_step(job, lambda: workload.model_for_preset(None), devices)
        assert step.error is None, step.error
        out[name] = {"arguments": step.argument_bytes, "peak": step.peak_bytes, "dots": dots(texts[-1])}
    print(json.dumps(out))
"""


def _compile_code(runs: list[tuple[str, str, str, str | None]]) -> str:
    """The tiny decoder compiled once a run (name, topology, weights' dtype, quantization)."""
    return _COMPILE.replace("__MODEL__", repr(TINY)).replace("__RUNS__", repr(runs))


@needs_planner
@pytest.mark.slow  # two compiles of the tiny decoder in a fresh interpreter: 20-30 s here
def test_bf16_weights_compile_smaller_by_the_weights_and_moments_share() -> None:
    out = _run_python(_compile_code([("fp32", "v5e:2x2", "float32", None), ("bf16", "v5e:2x2", "bfloat16", None)]))
    fp32, bf16 = out["fp32"], out["bf16"]
    # Weights, first and second moment each 2 bytes a parameter less, split over fsdp 4 (1-D
    # parameters, replicated, add a little on top).
    saved = 3 * 2 * TINY_MATRIX_PARAMETERS / 4
    assert fp32["arguments"] - bf16["arguments"] == pytest.approx(saved, rel=0.02)
    # The peak falls by at least that: the gradients are bf16 too.
    assert fp32["peak"] - bf16["peak"] >= 0.98 * saved
    assert set(bf16["dots"]) == {"bf16 x bf16 -> bf16"}


@needs_planner
@pytest.mark.slow  # two compiles on two topologies: about 50 s here
def test_int8_and_fp8_steps_compile_8bit_dots_in_the_blocks_and_keep_the_logits_bf16() -> None:
    out = _run_python(_compile_code([("int8", "v5e:2x2", "float32", "int8"), ("fp8", "tpu7x:2x2x1", "float32", "fp8")]))
    int8, fp8 = out["int8"]["dots"], out["fp8"]["dots"]
    # Seven linear layers a block, each with a forward dot (twice under full remat) and two backward
    # dots, in the scanned block loops; the logits matmul's three dots stay bf16 (as MaxText's).
    assert set(int8) == {"s8 x s8 -> s32", "bf16 x bf16 -> bf16"}
    assert int8["s8 x s8 -> s32"] >= 3 * 7 and int8["bf16 x bf16 -> bf16"] == 3
    # fp8: e4m3 activations and weights forward; the gradients in e5m2 against e4m3 backward.
    assert fp8["f8e4m3fn x f8e4m3fn -> f32"] >= 7
    assert fp8.get("f8e5m2 x f8e4m3fn -> f32", 0) + fp8.get("f8e4m3fn x f8e5m2 -> f32", 0) >= 2 * 7
    assert fp8["bf16 x bf16 -> bf16"] == 3
    assert sum(fp8.values()) == sum(int8.values())


@needs_planner
@pytest.mark.slow  # two plans of a 2-block d_model 2048 decoder (about 20 s each here)
def test_fp8_on_tpu7x_plans_a_shorter_step_than_bf16_where_the_step_is_compute_bound() -> None:
    out = _run_python("""
        import json
        from tpu_tuner.model.meshes.layouts import Layout
        from tpu_tuner.planner.plans.plan_options import PlanCompile, PlanEnumeration, PlanOptions, PlanStep, PlanTarget
        from tpu_tuner.planner.plans.plan import plan
        runs = {}
        for quantization in (None, "fp8"):
            # data 2 x fsdp 4: at fsdp 8 the compiler's fp8 program moves 2.4x the bytes and plans slower;
            # d_model 2048: at 1024 a TPU7x device's bandwidth (half its chip's) leaves the fp8 step
            # memory-bound (docs/planner.md, "Precision of the step").
            options = PlanOptions(PlanTarget("tpu7x:2x2x1"),
                                  step=PlanStep(global_batch=16, seq_len=1024, quantization=quantization),
                                  enumeration=PlanEnumeration(layouts=[Layout(2, 4, 1)]),
                                  compile=PlanCompile(fast_compile=True, workers=1))
            best = plan("decoder:vocab=1024,d_model=2048,layers=2,heads=16,mlp=8192", options).plans[0]
            prediction = best.prediction
            runs[str(quantization)] = {"step": prediction.step_seconds, "tokens": prediction.tokens_per_second,
                                       "compute": prediction.compute_seconds, "mfu": prediction.mfu}
        print(json.dumps(runs))
    """)
    bf16, fp8 = out["None"], out["fp8"]
    assert fp8["compute"] < bf16["compute"]
    assert fp8["step"] < bf16["step"] and fp8["tokens"] > bf16["tokens"]
    assert fp8["mfu"] / bf16["mfu"] == pytest.approx(bf16["step"] / fp8["step"], rel=1e-6)
