"""The planner against the real TPU compiler (libtpu, compile-only) and JAX on this CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import tomllib

import numpy as np
import pytest
from conftest import EXAMPLES
from helpers.common import ScriptedPool
from helpers.tiny_planner import run_planner_python

from tpu_tuner.planner.plans.plan_options import PlanEnumeration, PlanStep, PlanTarget

# Find, don't import: a plain `import torchax` fails on torch 2.13 (see torchax_compat).
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torchax") is None or importlib.util.find_spec("libtpu") is None,
    reason="the planner extra is not installed: pip install -e '.[plan]'",
)


@pytest.mark.slow  # ranks or compilers end to end: .ci/run's full pass
def test_torchax_runs_a_torch_model_on_jax_with_the_same_outputs() -> None:
    out = run_planner_python(f"""
        import json
        import jax.numpy as jnp, numpy as np, torch
        from tpu_tuner.model.workloads.loader import load_workload
        from tpu_tuner.planner.compiler.torchax_compat import SKIPPED, import_torchax
        torchax = import_torchax()
        from torchax.interop import JittableModule
        workload = load_workload({str(EXAMPLES / "llama.py")!r})
        torch.manual_seed(0)
        model = workload.model_for_preset("tiny").eval()
        tokens = torch.randint(0, 4096, (2, 32))
        expected = model(tokens).detach().numpy()
        jittable = JittableModule(model)
        env = torchax.default_env()
        params = {{k: jnp.asarray(v.detach().numpy()) for k, v in jittable.params.items()}}
        buffers = {{k: jnp.asarray(v.detach().numpy()) for k, v in jittable.buffers.items()}}
        p, b, t = env.j2t_iso((params, buffers, jnp.asarray(tokens.numpy())))
        with env:
            got = np.asarray(env.t2j_iso(jittable.functional_call("forward", p, b, t)))
        print(json.dumps({{"error": float(np.abs(got - expected).max() / np.abs(expected).max()), "skipped": SKIPPED}}))
    """)
    data = json.loads(out)
    assert data["skipped"] and all("imname" in name or "names" in name for name in data["skipped"])
    assert data["error"] < 1e-4


# Slow: whole `tpu-tune plan` runs, JAX compiles in worker processes (tens of seconds each). The quick run
# compiles for real in test_memory_truth_from_the_compiler and the compile pool's tests, and covers the command,
# the search and its resume with a scripted compiler (tests/test_planner_search.py).
@pytest.mark.slow
def test_plan_command_end_to_end(tmp_path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpu_tuner.cli",
            "-q",
            "plan",
            str(EXAMPLES / "llama.py"),
            "--preset",
            "tiny",
            "--topology",
            "v5e-4",
            "--global-batch",
            "8",
            "--seq",
            "128",
            "--layout",
            "1x4x1",
            "--layout",
            "1x2x2",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    data = json.loads((run_dir / "plan.json").read_text())
    assert data["topology"]["jax_name"] == "v5e:2x2" and data["topology"]["devices"] == 4
    # "Fits" is judged against the compiler's own limit (15.75 GiB of v5e's 16 GiB), not a spec figure.
    assert data["topology"]["hbm_from"] == "compiler"
    assert data["topology"]["hbm_bytes_per_device"] == pytest.approx(15.75 * 2**30, abs=0.01 * 2**30)
    assert len(data["plans"]) == 2
    for entry in data["plans"]:
        assert entry["fits"] and entry["compiled"]["flops"] > 0 and entry["prediction"]["mfu"] > 0
    # Tensor parallelism adds collectives over the tensor axis that pure FSDP does not need.
    by_layout = {(p["layout"]["fsdp"], p["layout"]["tensor"]): p for p in data["plans"]}
    assert sum(c["count"] for c in by_layout[(2, 2)]["compiled"]["collectives"] if c["kind"] == "all-reduce") > 0
    config = tomllib.loads((run_dir / "sharding_config.toml").read_text())
    assert config["sharding"]["mesh"]["data"] == 1
    assert config["sharding"]["placements"]["layers.0.attention.wq.weight"] == "tensor/fsdp"
    assert (run_dir / "plan.md").read_text().count("| data 1 x fsdp") == 2
    assert "best:" in result.stdout
    # Quiet: libtpu's start-up complaints went to the run folder's log, not the terminal.
    assert "TPU_WORKER_HOSTNAMES" in (run_dir / "compiler.log").read_text()
    assert "TPU_WORKER_HOSTNAMES" not in result.stdout + result.stderr
    # The plan's sharding_config.toml, unchanged, shards the model on as many gloo ranks as its
    # mesh has devices (through `apply_sharding`, which `tpu_tuner.apply` calls), and the sharded
    # step's loss and gradients match the single-device fp32 step.
    from tpu_tuner.runner.sharded_check import check_layout

    checked = check_layout(
        EXAMPLES / "llama.py", str(run_dir / "sharding_config.toml"), nproc=4, batch_size=4, timeout_s=300
    )
    assert checked.ok, checked.failure
    assert checked.reports[0]["loss_error"] < 1e-5 and checked.reports[0]["gradient_error"] < 1e-5


def test_the_compiler_states_its_device_count_and_hbm_limit_for_every_generation() -> None:
    """libtpu's compile-only topologies as the planner asks for them: v4 as megacore (one device per
    chip, both TensorCores: topology.MEGACORE), TPU7x two per chip; the HBM limit each states
    (planner/compiler/hbm.py) is what a layout must fit in."""
    out = run_planner_python("""
        import json
        from tpu_tuner.planner.compiler.compile_request import topology_devices
        from tpu_tuner.planner.compiler.hbm import compiler_hbm_limit
        from tpu_tuner.planner.topology import parse_topology
        seen = {}
        for name in ("v4-8", "v5e-4", "v5p-8", "v6e-4", "tpu7x:2x2x1"):
            topology = parse_topology(name)
            devices = topology_devices(topology.jax_name)
            compiled = topology.as_compiled(len(devices), compiler_hbm_limit(devices[0]))
            seen[name] = [compiled.devices_per_chip, compiled.hbm_bytes_per_device / 2**30]
        print(json.dumps(seen))
    """)
    seen = json.loads(out)
    assert {name: per_chip for name, (per_chip, _) in seen.items()} == {
        "v4-8": 1,
        "v5e-4": 1,
        "v5p-8": 1,
        "v6e-4": 1,
        "tpu7x:2x2x1": 2,
    }
    limits = {name: gib for name, (_, gib) in seen.items()}
    assert limits == pytest.approx(
        {"v4-8": 30.75, "v5e-4": 15.75, "v5p-8": 95.74, "v6e-4": 31.25, "tpu7x:2x2x1": 94.75}, abs=0.01
    )


@pytest.mark.slow  # a whole run end to end: .ci/run's full pass
def test_memory_truth_from_the_compiler() -> None:
    """A batch that cannot fit in 16 GB of v5e HBM is reported as not fitting, with the buffers."""
    out = run_planner_python(f"""
        import json
        from tpu_tuner.model.meshes.layouts import Layout
        from tpu_tuner.planner.plans.plan_options import PlanEnumeration, PlanOptions, PlanStep, PlanTarget
        from tpu_tuner.planner.plans.plan import plan
        result = plan({str(EXAMPLES / "llama.py")!r}, PlanOptions(PlanTarget("v5e-4"),
                      step=PlanStep(preset="tiny", global_batch=16384, seq_len=1024, remat="none"),
                      enumeration=PlanEnumeration(layouts=[Layout(1, 4, 1)])))
        (entry,) = result.plans
        print(json.dumps({{"fits": entry.fits, "why": entry.why, "best": result.best is not None}}))
    """)
    data = json.loads(out)
    assert not data["fits"] and not data["best"]
    assert "HBM" in data["why"] or "memory" in data["why"].lower()


# Slow (20 s): a cross-check of the CPU emulation the default run does not need.
@pytest.mark.slow
def test_emulated_cpu_devices_agree_with_the_tpu_compile() -> None:
    """Same layouts, same program as the plan compiles (scanned blocks, their loops measured in
    the HLO), on 8 emulated CPU devices: the same per-device FLOPs split between layouts and the
    same collectives (kind and group size) as the TPU compiler."""
    script = textwrap.dedent(f"""
        import os, json, sys
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
        import jax
        from jax.experimental import topologies
        from tpu_tuner.model.workloads.loader import load_workload
        from tpu_tuner.model.meshes.layouts import Layout
        from tpu_tuner.planner.compiler.compiled_step import add_loop_iterations
        from tpu_tuner.planner.compiler.program import compile_step
        from tpu_tuner.planner.compiler.compile_request import CompileJob, CompileModel, CompileTarget, StepSettings
        from tpu_tuner.planner.plans.plan_space import PlanPoint
        w = load_workload({str(EXAMPLES / "llama.py")!r})
        tpu = topologies.get_topology_desc(topology_name="v5p:2x2x2", platform="tpu").devices
        out = {{}}
        for name, devices in (("cpu", jax.devices("cpu")), ("tpu", tpu)):
            for layout in (Layout(1, 8, 1), Layout(1, 4, 2), Layout(2, 2, 2)):
                job = CompileJob(CompileModel("llama", "tiny", 256, 4, scan=True), CompileTarget(name),
                                 StepSettings(16, 128), PlanPoint(layout, "full"))
                step = compile_step(job, lambda: w.model_for_preset("tiny"), devices)
                r = add_loop_iterations(step, 4)
                collectives = [[c.kind, c.group_size] for c in r.collectives if c.group_size > 1 and c.count]
                out[f"{{name}} {{layout.data}}x{{layout.fsdp}}x{{layout.tensor}}"] = {{
                    "flops": r.flops, "collectives": sorted(collectives)}}
        print(json.dumps(out))
    """)
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads(result.stdout.strip().splitlines()[-1])
    layouts = ["1x8x1", "1x4x2", "2x2x2"]
    cpu = np.array([data[f"cpu {layout}"]["flops"] for layout in layouts])
    tpu = np.array([data[f"tpu {layout}"]["flops"] for layout in layouts])
    np.testing.assert_allclose(cpu / cpu[0], tpu / tpu[0], rtol=0.05)
    for layout in layouts:
        assert data[f"cpu {layout}"]["collectives"] == data[f"tpu {layout}"]["collectives"], layout
    # Tensor parallelism brings collectives over the tensor axis (groups of 2) that pure FSDP lacks.
    assert ["all-reduce", 2] in data["tpu 1x4x2"]["collectives"] and ["all-reduce", 2] not in data["tpu 1x8x1"][
        "collectives"
    ]


# Slow (14 s): the ground truth for loop_costs; the default run checks the loop arithmetic
# (scripted) and the micro-batch loop against one batch on the compiler.
@pytest.mark.slow
def test_scanned_blocks_count_the_same_work_as_unrolled_ones() -> None:
    """The plan's depth methods against the same model compiled with its four blocks unrolled, on
    a TPU topology: the scanned program plus its loops' other iterations measured in its HLO (the
    plan's), and the fallback (ends-only program + depth x the difference), give the same FLOPs and
    all-gather traffic, and the scanned program's memory is no larger. HBM bytes: the added
    iterations are XLA's generic count, which leaves out the TPU analysis's tile padding and matmul
    re-reads, so the plan's figure lies between the scanned program's own (one block) and the
    fallback's (every block counted by the TPU analysis)."""
    out = run_planner_python(f"""
        import json
        from tpu_tuner.model.workloads.loader import load_workload
        from tpu_tuner.planner.compiler.compile_request import topology_devices
        from tpu_tuner.model.meshes.layouts import Layout
        from tpu_tuner.planner.compiler.compiled_step import add_loop_iterations, combine_scanned
        from tpu_tuner.planner.compiler.program import compile_step
        from tpu_tuner.planner.compiler.compile_request import CompileJob, CompileModel, CompileTarget, StepSettings
        from tpu_tuner.planner.plans.plan_space import PlanPoint
        w = load_workload({str(EXAMPLES / "llama.py")!r})
        devices = topology_devices("v5p:2x2x2")
        tiny = lambda: w.model_for_preset("tiny")
        compile = lambda blocks, scan: compile_step(CompileJob(
            CompileModel("llama", "tiny", 256, blocks, scan), CompileTarget("v5p:2x2x2"), StepSettings(16, 256),
            PlanPoint(Layout(1, 8, 1), "full")), tiny, devices)
        unrolled, scanned = compile(4, False), compile(4, True)
        gathered = lambda step: sum(c.bytes for c in step.collectives if c.kind == "all-gather")
        print(json.dumps({{name: [step.flops, gathered(step), step.bytes_accessed, step.peak_bytes] for name, step in (
            ("unrolled", unrolled), ("scanned alone", scanned), ("one compile", add_loop_iterations(scanned, 4)),
            ("with ends", combine_scanned(compile(0, True), scanned, 4)))}}))
    """)
    data = json.loads(out)
    flops, gathered, _, peak = data.pop("unrolled")
    for method in ("one compile", "with ends"):
        method_flops, method_gathered, _, method_peak = data[method]
        assert method_flops == pytest.approx(flops, rel=0.01), method
        assert method_gathered == pytest.approx(gathered, rel=0.01), method
        assert method_peak <= peak, method
    assert data["scanned alone"][2] < data["one compile"][2] <= data["with ends"][2]


@pytest.mark.slow  # a whole run end to end: .ci/run's full pass
def test_a_compiler_process_that_dies_costs_only_its_own_layout(tmp_path) -> None:
    """A worker killed mid-job (as libtpu's SIGFPE on some 8192-device layouts does) gives that job
    an error naming the signal; a fresh worker compiles the next job."""
    crashing = tmp_path / "crashing.py"
    crashing.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGFPE)\n")
    out = run_planner_python(f"""
        import json
        from tpu_tuner.planner.compiler.compile_pool import CompilePool
        from tpu_tuner.model.meshes.layouts import Layout
        from tpu_tuner.planner.compiler.compile_request import CompileJob, CompileModel, CompileTarget, StepSettings
        from tpu_tuner.planner.plans.plan_space import PlanPoint
        jobs = [CompileJob(CompileModel(path, "tiny", 256, 1), CompileTarget("v5e:2x2"), StepSettings(8, 128),
                           PlanPoint(Layout(1, 4, 1), "full"), fast=True)
                for path in ({str(crashing)!r}, {str(EXAMPLES / "llama.py")!r})]
        with CompilePool(1) as pool:
            results = pool.compile(jobs)
        print(json.dumps([[results[j].error, results[j].flops] for j in jobs]))
    """)
    (crash_error, _), (ok_error, ok_flops) = json.loads(out)
    assert "SIGFPE" in crash_error
    assert ok_error is None and ok_flops > 0


def test_plan_falls_back_to_an_ends_program_only_where_the_loops_were_not_measured() -> None:
    """A layout whose scanned program came back without a measured loop iteration gets a second,
    block-less program and the difference as one block; a layout with one needs no second compile."""
    import time

    from tpu_tuner.model.meshes.layouts import Layout
    from tpu_tuner.planner.compiler.compiled_step import CompiledStep
    from tpu_tuner.planner.compiler.loop_costs import LoopIteration
    from tpu_tuner.planner.plans.plan import PlanOptions, enumerated
    from tpu_tuner.planner.plans.plan_problem import build_problem
    from tpu_tuner.planner.prediction.collectives import Collective
    from tpu_tuner.planner.topology import parse_topology

    measured, unmeasured = Layout(1, 8, 1), Layout(1, 4, 2)

    def answer(job):
        if job.model.blocks == 0:
            return CompiledStep(1e9, 1e6, 1e6, 1e6, 1e6, 1e6, [Collective("all-gather", 8, 2, 100)])
        iteration = (
            LoopIteration(5e9, 5e6, [Collective("all-gather", 8, 3, 300)], loops=2)
            if job.point.layout == measured
            else None
        )
        return CompiledStep(
            6e9, 6e6, 1e6, 1e6, 1e6, 1e6, [Collective("all-gather", 8, 5, 400)], loop_iteration=iteration
        )

    pool = ScriptedPool(answer)
    options = PlanOptions(
        PlanTarget(topology="v5p:2x2x2"),
        step=PlanStep(global_batch=16, seq_len=128, preset="tiny"),
        enumeration=PlanEnumeration(layouts=[measured, unmeasured]),
    )
    said: list[str] = []
    problem = build_problem(EXAMPLES / "llama.py", options, parse_topology("v5p:2x2x2"), said.append)
    result = enumerated(problem, options, pool, said.append, time.perf_counter())
    assert sorted((j.point.layout.name(), j.model.blocks) for j in pool.jobs) == sorted(
        [(measured.name(), 4), (unmeasured.name(), 4), (unmeasured.name(), 0)]
    )
    by_layout = {p.layout: p.compiled for p in result.plans}
    # Measured: the program's totals + 3 more iterations. Unmeasured: ends + 4 x (scanned - ends).
    assert by_layout[measured].flops == 6e9 + 3 * 5e9
    assert by_layout[measured].collectives == [Collective("all-gather", 8, 5 + 3 * 3, 400 + 3 * 300)]
    assert by_layout[unmeasured].flops == 1e9 + 4 * 5e9
    assert by_layout[unmeasured].collectives == [Collective("all-gather", 8, 2 + 4 * 3, 100 + 4 * 300)]
    assert "1 program's block loops could not be measured in its HLO: compiling its ends alone" in said


@pytest.mark.slow  # a whole `tpu-tune plan` run (see test_plan_command_end_to_end)
def test_a_shape_without_code_plans(tmp_path) -> None:
    """A GPT-3-style shape (ungated GELU MLP, LayerNorm, learned positions, tied embeddings), here
    with a mixture of 4 experts, from a TOML file, through the generic decoder: compiled for a TPU
    topology like a user's file, the stacked expert weights split as MaxText splits them."""
    shape = tmp_path / "gpt3_style.toml"
    shape.write_text(
        "[model]\nvocab = 4096\nd_model = 256\nlayers = 2\nheads = 8\nmlp = 1024\ngated = false\n"
        'activation = "gelu"\nnorm = "layer"\npositions = "learned"\ntied_embeddings = true\n'
        "max_seq_len = 512\nexperts = 4\ntop_k = 2\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpu_tuner.cli",
            "-q",
            "plan",
            str(shape),
            "--topology",
            "v5e-4",
            "--global-batch",
            "8",
            "--seq",
            "128",
            "--layout",
            "1x4x1",
            "--fast",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "out").iterdir()
    assert run_dir.name.startswith("gpt3_style-plan-v5e-4")
    plan = json.loads((run_dir / "plan.json").read_text())
    (entry,) = plan["plans"]
    assert entry["fits"] and entry["compiled"]["flops"] > 0 and entry["prediction"]["mfu"] > 0
    assert plan["placements"]["layers.0.feed_forward.w_up"] == "-/fsdp/tensor"
    assert plan["placements"]["layers.0.feed_forward.w_down"] == "-/tensor/fsdp"


@pytest.mark.slow  # six real compiles of a four-block model
def test_remat_policies_micro_batches_and_context_compile_as_they_should() -> None:
    """MaxText's named policies keep what they name (the compiler's temporaries order them),
    host offload moves bytes to host memory, micro-batches cut activation memory but not the
    work, a context axis splits the sequence and gathers K/V; the HBM lower bound holds for all."""
    out = run_planner_python(f"""
        import json
        from dataclasses import replace
        from tpu_tuner.planner.compiler.compile_pool import CompilePool
        from tpu_tuner.model.meshes.layouts import Layout
        from tpu_tuner.planner.compiler.compiled_step import add_loop_iterations
        from tpu_tuner.planner.compiler.compile_request import CompileJob, CompileModel, CompileTarget, StepSettings
        from tpu_tuner.planner.plans.plan_space import PlanPoint, memory_lower_bound
        from tpu_tuner.model.meshes.layouts import ModelShape
        path = {str(EXAMPLES / "llama.py")!r}
        offload = "custom:decoder_layer_input=offload,query_proj=offload,key_proj=offload,value_proj=offload"
        cases = {{"full": ("full", 1, Layout(1, 4, 1)), "minimal": ("minimal", 1, Layout(1, 4, 1)),
                  "qkv": ("save_qkv_proj", 1, Layout(1, 4, 1)), "offload": (offload, 1, Layout(1, 4, 1)),
                  "micro": ("full", 4, Layout(1, 4, 1)), "context": ("full", 1, Layout(1, 2, 1, 2))}}
        jobs = {{name: CompileJob(CompileModel(path, "tiny", 256, 4, scan=True), CompileTarget("v5e:2x2"),
                                  StepSettings(16, 256), PlanPoint(layout, remat, acc), fast=True)
                for name, (remat, acc, layout) in cases.items()}}
        with CompilePool(1) as pool:
            steps = pool.compile(list(jobs.values()))
        shape = ModelShape(256, 8, 2, 768, 4096, 4)
        out = {{}}
        for name, job in jobs.items():
            step = steps[job]
            assert step.error is None, (name, step.error)
            point = job.point
            full = add_loop_iterations(step, 4, None, point.accumulation)
            bound = memory_lower_bound(point, 3_100_000, shape, 16, 256).total
            out[name] = [full.flops, full.temp_bytes, full.host_temp_bytes, full.peak_bytes, bound,
                         [[c.kind, c.group_size] for c in full.collectives]]
        print(json.dumps(out))
    """)
    data = json.loads(out)
    flops, temp, host, peak, bound = ({k: v[i] for k, v in data.items()} for i in range(5))
    assert temp["minimal"] > temp["qkv"] > temp["full"]  # what each keeps between forward and backward
    assert flops["minimal"] < flops["qkv"] < flops["full"]  # and so what each recomputes
    assert host["offload"] > 0 == host["qkv"] and temp["offload"] < temp["qkv"]
    assert flops["micro"] == pytest.approx(flops["full"], rel=0.01) and temp["micro"] < temp["full"]
    assert flops["context"] == pytest.approx(flops["full"], rel=0.05)
    assert ["all-gather", 2] in data["context"][5]  # keys and values gathered over the context pair
    assert all(bound[k] <= peak[k] for k in data), (bound, peak)


@pytest.mark.slow  # two whole `tpu-tune plan --budget` runs (see test_plan_command_end_to_end)
def test_plan_search_end_to_end_resumes_from_its_study(tmp_path) -> None:
    """`--budget` searches with Optuna, one compile a trial, one terminal line each; the same
    command again finds the study spent and compiles nothing; plan.json keeps every trial."""
    command = [
        sys.executable,
        "-m",
        "tpu_tuner.cli",
        "-q",
        "plan",
        str(EXAMPLES / "llama.py"),
        "--preset",
        "tiny",
        "--topology",
        "v5e-4",
        "--global-batch",
        "8",
        "--seq",
        "128",
        "--fast",
        "--budget",
        "3",
        "--sampler",
        "random",
        "--remats",
        "full,save_qkv_proj",
        "--accumulations",
        "1,2",
        "--contexts",
        "1",
        "--out",
        str(tmp_path),
    ]
    env = {**os.environ, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    first = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert len([line for line in first.stdout.splitlines() if "] trial " in line]) == 3
    again = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "] trial " not in again.stdout  # nothing compiled: the study's budget is spent
    newest = sorted(p for p in tmp_path.iterdir() if p.is_dir())[-1]
    plan = json.loads((newest / "plan.json").read_text())
    assert plan["search"]["compiled"] == 3 and len(plan["plans"]) == 3
    assert {t["outcome"] for t in plan["search"]["trials"]} <= {
        "compiled",
        "refused",
        "invalid",
        "lower_bound",
        "repeat",
        "released",
    }
    assert (tmp_path / "plans.db").exists()
