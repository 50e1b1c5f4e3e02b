"""Figures of docs/planner.md, "Mixtures of experts as run, and latent attention" (issue 36, item 2).

1. **kernels**: one grouped matmul (2048 rows, 256 -> 512, 8 groups) compiled for one v5e device:
   FLOPs of the forward, the input gradient and the weights' gradient, as multiples of 2 m k n,
   with ``jax.lax.ragged_dot`` and with JAX's megablox ``gmm`` (the planner's kernel), and the
   ragged_dot forward on XLA's CPU backend (the planner's emulated-CPU cross-check);
2. **routing**: the planner's compiled step (v5e:2x2, fsdp 4, no remat, global batch 8 x 256, a
   2-layer d_model 128 decoder with 8 experts of width 512) for dropless top-1, dropless top-2
   and the dropping router at capacity factor 1, top-2: FLOPs per device, the model-FLOPs formula
   per device, HBM temporaries, compile seconds;
3. **latent**: an MLA decoder compiled on 4 emulated CPU devices (textbook attention): compiled FLOPs
   against the formula as the value heads (32 -> 96) or the keys' part without positions
   (64 -> 128) widen;
4. **deepseek**: DeepSeek-V3's shape on the meta device: its parameters against transformers'
   deepseek_v3 default config, its active matmul parameters N, model FLOPs per token at 4096.

    python benchmarks/planner/moe_mla_figures.py [--parts kernels routing latent deepseek]

Each part runs in a fresh interpreter with this checkout first on PYTHONPATH and prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

KERNELS = """
import json, jax, jax.numpy as jnp
from jax.experimental import topologies
from jax.experimental.pallas.ops.tpu.megablox import ops
device = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices[0]
m, k, n, groups = 2048, 256, 512, 8
spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.SingleDeviceSharding(device))
args = (spec((m, k), jnp.bfloat16), spec((groups, k, n), jnp.bfloat16), spec((groups,), jnp.int32))
kernels = {"ragged_dot": lambda x, w, s: jax.lax.ragged_dot(x, w, s),
           "megablox gmm": lambda x, w, s: ops.gmm(x, w, s, jnp.bfloat16, (512, 256, 512))}
out = {}
for name, mm in kernels.items():
    parts = {"forward": lambda x, w, s: mm(x, w, s),
             "input gradient": lambda x, w, s: jax.vjp(lambda a: mm(a, w, s), x)[1](jnp.ones((m, n), x.dtype))[0],
             "weight gradient": lambda x, w, s: jax.vjp(lambda b: mm(x, b, s), w)[1](jnp.ones((m, n), x.dtype))[0]}
    for part, fn in parts.items():
        cost = jax.jit(fn).lower(*args).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        out[f"{name} {part}"] = round(cost["flops"] / (2 * m * k * n), 3)
cpu = jax.devices("cpu")[0]
spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.SingleDeviceSharding(cpu))
cost = jax.jit(kernels["ragged_dot"]).lower(spec((m, k), jnp.float32), spec((groups, k, n), jnp.float32),
                                            spec((groups,), jnp.int32)).compile().cost_analysis()
out["ragged_dot forward, XLA CPU"] = round((cost[0] if isinstance(cost, list) else cost)["flops"] / (2 * m * k * n), 3)
print(json.dumps(out))
"""

ROUTING = """
import json, re, time, torch
import tpu_tuner.planner.compiler.program as program
from tpu_tuner.planner.compiler.compile_pool import run_job, _workload
from tpu_tuner.planner.compiler.compile_request import CompileJob, CompileModel, CompileTarget, StepSettings
from tpu_tuner.planner.plans.plan_space import PlanPoint
from tpu_tuner.model.meshes.layouts import Layout
from tpu_tuner.planner.compiler.compiled_step import add_loop_iterations
from tpu_tuner.metrics.flops import matmul_parameters, transformer_model_flops
texts, parse = [], program.parse_collectives
program.parse_collectives = lambda text: (texts.append(text), parse(text))[1]
base = "decoder:vocab=256,d_model=128,layers=2,heads=4,mlp=256,experts=8,expert_mlp=512,max_seq_len=512"
out = {}
for name, extra in (("dropless top-1", ",top_k=1,moe_routing=dropless"),
                    ("dropless top-2", ",top_k=2,moe_routing=dropless"),
                    ("dropping top-2, capacity 1", ",top_k=2,capacity_factor=1")):
    start = time.perf_counter()
    step = run_job(CompileJob(CompileModel(base + extra, None, 128, 2, scan=True), CompileTarget("v5e:2x2"),
                              StepSettings(8, 256), PlanPoint(Layout(1, 4, 1), "none"), fast=True))
    assert step.error is None, step.error
    full = add_loop_iterations(step, 2)
    workload = _workload(base + extra)
    with torch.device("meta"):
        model = workload.build_model()
    formula = transformer_model_flops(matmul_parameters(model), workload.transformer, 8, 256, True).per_step / 4
    out[name] = {"flops": full.flops, "formula": formula, "temp_MiB": round(full.temp_bytes / 2**20, 1),
                 "gmm kernels": len(re.findall(r"jit\\(gmm\\)", texts[-1])) > 0,
                 "compile_s": round(time.perf_counter() - start, 1)}
one, two = out["dropless top-1"], out["dropless top-2"]
out["top-1 -> top-2: compiled / formula added"] = round(
    (two["flops"] - one["flops"]) / (two["formula"] - one["formula"]), 3)
out["dropping / dropless, top-2"] = round(out["dropping top-2, capacity 1"]["flops"] / two["flops"], 3)
print(json.dumps(out))
"""

LATENT = """
import os, json
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, torch
from tpu_tuner.model.workloads.loader import load_workload
from tpu_tuner.model.meshes.layouts import Layout
from tpu_tuner.planner.compiler.compiled_step import add_loop_iterations
from tpu_tuner.planner.compiler.program import compile_step
from tpu_tuner.planner.compiler.compile_request import CompileJob, CompileModel, CompileTarget, StepSettings
from tpu_tuner.planner.plans.plan_space import PlanPoint
from tpu_tuner.metrics.flops import matmul_parameters, transformer_model_flops
base = ("decoder:vocab=256,d_model=128,layers=2,heads=4,mlp=256,max_seq_len=512,"
        "q_lora_rank=64,kv_lora_rank=32,qk_rope_head_dim=32")
out = {}
for name, extra in (("v 32", ",qk_nope_head_dim=64,v_head_dim=32"), ("v 96", ",qk_nope_head_dim=64,v_head_dim=96"),
                    ("nope 128", ",qk_nope_head_dim=128,v_head_dim=32")):
    w = load_workload(base + extra)
    with torch.device("meta"):
        m = w.build_model()
    job = CompileJob(CompileModel(name, None, 128, 2, scan=True), CompileTarget("cpu"), StepSettings(8, 256),
                     PlanPoint(Layout(1, 4, 1), "none"))
    r = add_loop_iterations(compile_step(job, w.build_model, jax.devices("cpu")), 2)
    formula = transformer_model_flops(matmul_parameters(m), w.transformer, 8, 256, True).per_step
    out[name] = {"compiled": r.flops * 4, "formula": formula}
for wider in ("v 96", "nope 128"):
    out[f"v 32 -> {wider}: compiled / formula added"] = round(
        (out[wider]["compiled"] - out["v 32"]["compiled"]) / (out[wider]["formula"] - out["v 32"]["formula"]), 3)
out["v 32: compiled / formula"] = round(out["v 32"]["compiled"] / out["v 32"]["formula"], 3)
print(json.dumps(out))
"""

DEEPSEEK = """
import json, pathlib, torch, transformers
from tpu_tuner.model.workloads.loader import load_workload
from tpu_tuner.metrics.flops import matmul_parameters, transformer_model_flops
path = pathlib.Path("examples/deepseek_v3.toml")  # the shipped shape (cwd: the checkout)
workload = load_workload(path)
with torch.device("meta"):
    model = workload.build_model()
    config = transformers.AutoConfig.for_model("deepseek_v3")
    theirs = transformers.AutoModelForCausalLM.from_config(config).num_parameters()
n = matmul_parameters(model)
flops = transformer_model_flops(n, workload.transformer, 1, 4096, True)
print(json.dumps({"parameters": sum(p.numel() for p in model.parameters()), "transformers deepseek_v3": theirs,
                  "active matmul parameters N": n, "training FLOPs per token at 4096": flops.per_step / 4096,
                  "of which attention": flops.attention_per_step / 4096, "formula": flops.formula}))
"""

PARTS = {"kernels": KERNELS, "routing": ROUTING, "latent": LATENT, "deepseek": DEEPSEEK}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    args = parser.parse_args()
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }
    for part in args.parts:
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(PARTS[part])],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=1800,
        )
        if result.returncode:
            print(f"{part}: failed\n{result.stderr[-2000:]}")
            continue
        print(f"{part}: {result.stdout.strip().splitlines()[-1]}")


if __name__ == "__main__":
    main()
