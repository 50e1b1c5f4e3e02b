"""Hugging Face models (issues 27, 36): ten families at a small size on this host, through the real CLI.

For each family, a transformers model built from a config with overrides (`hf:TYPE?...`):

1. **profile**: counted FLOPs (FlopCounterMode) against the 6N + 12LHQT formula of the config's
   declared layers, heads and head dimension (target: within 1%), and the wall time;
2. **tune**: a short tune (`--trials`, `--time-budget`): the verified speedup with its 95% CI and
   what was chosen, the wall time;
3. **layouts** (`--nproc 2`, the layouts alone: benchmarks/models/spaces/layouts.toml): every layout the
   search measured on 2 ranks, its steady step;
4. **refusals**: each bad source of the issue (an unknown model type, a folder without
   config.json, a hub id neither cached nor reachable, a config with no head to run) through the
   CLI: its exit status, its one line and its wall time (target: under 10 s, no folder left);
5. **planner**: the parameter count of the decoder the planner maps the config to, against
   `num_parameters()` of the transformers model built from the same config (on the meta device).

    python benchmarks/models/hf_models.py [--families llama qwen2 ...] [--parts profile tune layouts plan]
                                   [--trials 6] [--time-budget 3m] [--out DIR]

Each command runs as `python -m tpu_tuner.cli` with the package of this checkout on PYTHONPATH.
Figures in docs/hf-models.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SMALL = (
    "hidden_size=128,intermediate_size=344,num_hidden_layers=2,num_attention_heads=4,num_key_value_heads=2,"
    "vocab_size=2048,max_position_embeddings=1024"
)
FAMILIES = {
    "llama": f"hf:llama?{SMALL}",
    "qwen2": f"hf:qwen2?{SMALL}",
    "gemma2": f"hf:gemma2?{SMALL},head_dim=32",
    "mixtral": f"hf:mixtral?{SMALL},num_local_experts=4,num_experts_per_tok=2",
    "gpt2": "hf:gpt2?n_embd=128,n_layer=2,n_head=4,vocab_size=2048,n_positions=1024",
    # Today's families (issue 36): local attention in a pattern, dropless experts, latent attention.
    "gemma3": f"hf:gemma3_text?{SMALL},num_hidden_layers=6,head_dim=32,sliding_window=64",
    "llama4": f"hf:llama4_text?{SMALL},num_hidden_layers=4,head_dim=32,intermediate_size_mlp=344,"
    "num_local_experts=4,num_experts_per_tok=1,interleave_moe_layer_step=2,attention_chunk_size=64",
    "qwen3_moe": f"hf:qwen3_moe?{SMALL},num_experts=4,num_experts_per_tok=2,moe_intermediate_size=128",
    "deepseek_v3": "hf:deepseek_v3?hidden_size=128,intermediate_size=344,moe_intermediate_size=128,num_hidden_layers=2,"
    "num_attention_heads=4,n_routed_experts=4,num_experts_per_tok=2,n_shared_experts=1,"
    "first_k_dense_replace=1,q_lora_rank=64,kv_lora_rank=32,qk_nope_head_dim=32,qk_rope_head_dim=16,"
    "v_head_dim=32,n_group=1,topk_group=1,vocab_size=2048,max_position_embeddings=1024",
    # gpt-oss: biased router and experts, clamped SwiGLU, sinks, window 64 alternating with global layers.
    "gpt_oss": f"hf:gpt_oss?{SMALL},head_dim=32,num_local_experts=4,num_experts_per_tok=2,sliding_window=64",
}
SIZES = ("--batch-size", "4", "--seq", "128")


def _cli(args: list[str], log: Path) -> tuple[int, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, "-m", "tpu_tuner.cli", "-q", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=3600,
        )
    return done.returncode, time.monotonic() - started


def _only_run(folder: Path) -> Path:
    runs = sorted(p for p in folder.iterdir() if p.is_dir())
    if len(runs) != 1:
        raise SystemExit(f"expected one run folder in {folder}, found {len(runs)}")
    return runs[0]


def profile_part(name: str, source: str, out: Path) -> str:
    status, wall = _cli(["profile", source, *SIZES, "--out", str(out / f"{name}-profile")], out / f"{name}-profile.log")
    if status != 0:
        return f"{name:8} profile failed ({status}): see {out / f'{name}-profile.log'}"
    flops = json.loads((_only_run(out / f"{name}-profile") / "profile.json").read_text())["flops"]
    counted, model = flops["counted_per_step"], flops["model_per_step"]
    off = abs(model - counted) / counted
    return (
        f"{name:8} profile: counted {counted / 1e9:.3f} GFLOP, formula {model / 1e9:.3f} GFLOP ({off:.2%} apart: "
        f"{'PASS' if off <= 0.01 else 'FAIL'} within 1%), N={flops['matmul_parameters']:,}, wall {wall:.0f} s"
    )


def tune_part(name: str, source: str, out: Path, trials: int, budget: str) -> str:
    folder = out / f"{name}-tune"
    status, wall = _cli(
        [source, *SIZES, "--trials", str(trials), "--time-budget", budget, "--out", str(folder)],
        out / f"{name}-tune.log",
    )
    if status != 0:
        return f"{name:8} tune failed ({status}): see {out / f'{name}-tune.log'}"
    verification = json.loads((_only_run(folder) / "result.json").read_text())["verification"]
    s, chosen = verification["speedup"], verification["chosen"]
    if s is None:
        return f"{name:8} tune: {verification['message']}, wall {wall:.0f} s"
    changed = {
        k: v
        for k, v in chosen.items()
        if v not in ("default", "none", "1", "1x1x1", "contiguous", "highest", "eager", "all")
    }
    return (
        f"{name:8} tune: verified {s['speedup']:.2f}x (95% CI {s['ci_low']:.2f}-{s['ci_high']:.2f}, "
        f"{s['rounds']} rounds) with {changed or 'the baseline'}, wall {wall:.0f} s"
    )


def layouts_part(name: str, source: str, out: Path, trials: int, budget: str) -> str:
    folder = out / f"{name}-layouts"
    status, wall = _cli(
        [
            source,
            *SIZES,
            "--nproc",
            "2",
            "--space",
            str(Path(__file__).with_name("spaces") / "layouts.toml"),
            "--trials",
            str(trials),
            "--time-budget",
            budget,
            "--out",
            str(folder),
        ],
        out / f"{name}-layouts.log",
    )
    if status != 0:
        return f"{name:8} layouts failed ({status}): see {out / f'{name}-layouts.log'}"
    run = _only_run(folder)
    steps: dict[str, list[float]] = {}
    for row in csv.DictReader((run / "trials.csv").open()):
        if row.get("step_median_s"):
            steps.setdefault(row.get("layout", "?"), []).append(float(row["step_median_s"]))
    verification = json.loads((run / "result.json").read_text())["verification"]
    s = verification["speedup"] or {"speedup": 1.0, "ci_low": float("nan"), "ci_high": float("nan")}
    table = ", ".join(f"{layout} {min(v) * 1e3:.1f} ms" for layout, v in sorted(steps.items()))
    return (
        f"{name:8} layouts on 2 ranks (fastest measured step per layout): {table}; verified "
        f"{s['speedup']:.2f}x ({s['ci_low']:.2f}-{s['ci_high']:.2f}), wall {wall:.0f} s"
    )


REFUSALS = {
    "unknown model type": ["hf:lama"],
    "folder without config.json": ["hf:{empty}"],
    "hub id, no cache, no network": ["hf:Qwen/Qwen2.5-0.5B"],
    "config with no head": ["hf:vit"],
}


def refusals_part(out: Path) -> list[str]:
    (out / "empty").mkdir(exist_ok=True)
    lines = []
    for what, args in REFUSALS.items():
        results = out / "refused"
        log = out / "refusal.log"
        status, wall = _cli(["tune", *(a.format(empty=out / "empty") for a in args), "--out", str(results)], log)
        said = log.read_text().strip().splitlines()
        ok = status == 2 and len(said) == 1 and not results.exists() and wall < 10
        lines.append(
            f"refusal  {what}: exit {status}, {len(said)} line, {wall:.1f} s, folder left: {results.exists()} "
            f"({'PASS' if ok else 'FAIL'}): {said[-1] if said else ''}"
        )
    return lines


def plan_part(name: str, source: str) -> str:
    sys.path.insert(0, str(REPO))
    import torch
    from transformers import AutoModelForCausalLM

    from tpu_tuner.model.decoders.decoder import Decoder
    from tpu_tuner.model.decoders.hf_decoder import decoder_shape
    from tpu_tuner.model.workloads.hf_source import load_config, parse

    config = load_config(parse(source))
    started = time.monotonic()
    with torch.device("meta"):
        expected = AutoModelForCausalLM.from_config(config).num_parameters()
        planned = sum(p.numel() for p in Decoder(decoder_shape(config)).parameters())
    return (
        f"{name:8} planner: decoder {planned:,} parameters, transformers {expected:,} "
        f"({'PASS equal' if planned == expected else 'FAIL'}), {time.monotonic() - started:.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", choices=sorted(FAMILIES), default=list(FAMILIES))
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=("refusals", "plan", "profile", "tune", "layouts"),
        default=["refusals", "plan", "profile", "tune", "layouts"],
    )
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--time-budget", default="4m")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="hf-models-"))
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    from tpu_tuner.core.host import cpu_model_name

    print(f"host: {cpu_model_name()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; runs in {out}", flush=True)
    if "refusals" in args.parts:
        print("\n".join(refusals_part(out)), flush=True)
    for name in args.families:
        source = FAMILIES[name]
        if "plan" in args.parts:
            print(plan_part(name, source), flush=True)
        if "profile" in args.parts:
            print(profile_part(name, source, out), flush=True)
        if "tune" in args.parts:
            print(tune_part(name, source, out, args.trials, args.time_budget), flush=True)
        if "layouts" in args.parts:
            print(layouts_part(name, source, out, args.trials, args.time_budget), flush=True)
    print(f"done (load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
