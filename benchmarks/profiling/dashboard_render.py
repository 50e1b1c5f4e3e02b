"""How long the dashboard takes for 200 runs, and how big the page is (issue 6: < 5 s, < 5 MB).

There are not 200 real runs on this machine, so the 200 run folders are synthesised from the real
ones in SOURCE (default results/): every copy of a real profile folder or tuning run folder keeps
its files and shapes, with the model name (8 models), device kind (cpu/cuda/tpu), date (spread over
8 weeks) and MFU / step times scaled by a seeded random factor, so that the plots have many lines
and points. study.db is not copied (the dashboard reads trials.csv, not the storage). Four planner
results (two slice sizes of two models) and two bucketing results are written as JSON of the shape
PlanResult.to_dict() / BucketResult.to_dict() produce. The numbers on the page are therefore not
measurements; only the timing and the size are.

    python benchmarks/profiling/dashboard_render.py [--source results] [--runs 200] [--repeat 3]
    python benchmarks/profiling/dashboard_render.py --screenshot docs/dashboard.png   # of SOURCE itself, real data

Timing: collect (read every folder) + render (plots and HTML) + write, in this process, after the
imports (the median of --repeat); and, once, the whole `tpu-tune dashboard` command as a subprocess,
which adds Python start-up and the imports (tpu_tuner imports torch).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tpu_tuner.dashboard import collect, make_server, write_dashboard

MODELS = ["gpt", "llama_1b", "bert", "vit", "t5_small", "mlp", "resnet50", "encoder"]
DEVICES = ["cpu", "cuda", "tpu"]


def _scale_profile(text: str, model: str, device: str, created: datetime, factor: float) -> str:
    data = json.loads(text)
    data["workload"]["name"] = model
    data["device"]["kind"] = device
    data["created"] = created.isoformat(timespec="seconds")
    data["mfu"] = min(0.95, data["mfu"] * factor)
    data["achieved_flops_per_s"] *= factor
    return json.dumps(data)


def _scale_tune(folder: Path, model: str, device: str, created: datetime, factor: float) -> None:
    config = (folder / "tuned_config.toml").read_text()
    config = re.sub(r'^device_kind = ".*"$', f'device_kind = "{device}"', config, flags=re.M)
    config = re.sub(r'^created = ".*"$', f'created = "{created.isoformat(timespec="seconds")}"', config, flags=re.M)
    config = re.sub(r'(\[provenance\.workload\]\nname = )".*"', rf'\1"{model}"', config)
    config = re.sub(r"^mfu = (.*)$", lambda m: f"mfu = {min(0.95, float(m.group(1)) * factor)!r}", config, flags=re.M)
    (folder / "tuned_config.toml").write_text(config)
    import pandas as pd

    trials = pd.read_csv(folder / "trials.csv")
    for column in ("amortised_step_s", "step_median_s"):
        trials[column] = trials[column] / factor
    trials["mfu"] = (trials["mfu"] * factor).clip(upper=0.95)
    trials.to_csv(folder / "trials.csv", index=False)


def _plan(model: str, topology: str, chips: int, rng: random.Random) -> dict:
    plans = []
    for tensor in (1, 2, 4, 8):
        step = rng.uniform(0.8, 2.0)
        compute = step * rng.uniform(0.5, 0.8)
        exposed = step * rng.uniform(0.0, 0.2)
        fits = tensor > 1 or chips > 8
        plans.append(
            {
                "layout": {"data": 1, "fsdp": chips // tensor, "tensor": tensor},
                "compiled": {
                    "flops": 1e15,
                    "bytes_accessed": 1e12,
                    "argument_bytes": 1e9,
                    "output_bytes": 1e9,
                    "temp_bytes": 3e10,
                    "alias_bytes": 1e9,
                    "collectives": [],
                    "compile_seconds": 20.0,
                    "error": None,
                    "host_temp_bytes": 0.0,
                },
                "fits": fits,
                "margin_bytes": 1e9 if fits else -4e9,
                "why": "" if fits else "over HBM by 3.7 GiB",
                "prediction": {
                    "compute_seconds": compute,
                    "memory_seconds": compute * 0.6,
                    "comm_seconds": exposed * 3,
                    "exposed_comm_seconds": exposed,
                    "step_seconds": step,
                    "alignment": 1.0,
                    "mfu": compute / step * 0.7,
                    "tokens_per_second": 1e6 / step,
                },
            }
        )
    best = max((p for p in plans if p["fits"]), key=lambda p: p["prediction"]["mfu"])
    return {
        "workload": model,
        "preset": "70b",
        "topology": {"name": topology, "jax_name": "TPU v5p", "chips": chips, "devices": chips, "generation": "v5p"},
        "global_batch": 256,
        "seq_len": 4096,
        "remat": "full",
        "attention_convention": "full",
        "model_flops_per_step": 1e18,
        "matmul_parameters": 7e10,
        "plans": plans,
        "rejected": [],
        "placements": {},
        "method": "compiled",
        "seconds": 60.0,
        "best": "data {data} x fsdp {fsdp} x tensor {tensor}".format(**best["layout"]),
    }


def _buckets(model: str, rng: random.Random) -> dict:
    lengths = list(range(16, 513, 8))
    counts = [int(1000 * rng.random() * (1 - n / 600)) + 1 for n in lengths]
    chosen = {
        "strategy": {"name": "optimal", "bounds": [96, 192, 320, 512], "note": ""},
        "compiled_shapes": 4,
        "padding_waste": 0.11,
        "compile_seconds": 40.0,
        "step_seconds": 0.2,
        "total_seconds": 4040.0,
        "within_limits": True,
    }
    return {
        "workload": model,
        "device": "cpu",
        "compile_backend": "inductor",
        "samples": sum(counts),
        "distinct_lengths": len(lengths),
        "length_summary": {},
        "steps": 20000,
        "max_buckets": 8,
        "align": 8,
        "cost_model": {},
        "chosen": chosen,
        "table": [chosen],
        "oracle_seconds": 4000.0,
        "optimiser_seconds": 0.1,
        "histogram": {"lengths": lengths, "counts": counts},
        "replays": [],
        "replay_note": "",
        "seconds": 9.0,
        "chosen_buckets": [96, 192, 320, 512],
    }


def synthesise(source: Path, target: Path, runs: int, seed: int = 0) -> None:
    """Write `runs` run folders under `target` from the real profile and tuning folders in `source`."""
    real = collect(source).runs
    templates = [Path(p) for p in real.loc[(real["status"] == "ok") & real["kind"].isin(["tune", "profile"]), "path"]]
    if not templates:
        raise SystemExit(f"{source} holds no readable profile or tuning run to copy")
    rng = random.Random(seed)
    start = datetime(2026, 10, 1, tzinfo=UTC)
    for index in range(runs):
        template = templates[index % len(templates)]
        model, device = MODELS[index % len(MODELS)], DEVICES[(index // len(MODELS)) % len(DEVICES)]
        created = start + timedelta(hours=rng.uniform(0, 8 * 7 * 24))
        factor = rng.uniform(0.6, 1.3)
        kind = "tune-" if (template / "tuned_config.toml").exists() else ""
        folder = target / f"{model}-{kind}{created:%Y%m%d-%H%M%S}-{index}"
        shutil.copytree(template, folder, ignore=shutil.ignore_patterns("study.db", "*.png"))
        (folder / "profile.json").write_text(
            _scale_profile((folder / "profile.json").read_text(), model, device, created, factor)
        )
        if kind:
            _scale_tune(folder, model, device, created, factor)
    for model in ("gpt", "llama"):
        for topology, chips in (("v5p-8", 4), ("v5p-64", 32)):
            folder = target / f"{model}_70b-plan-{topology}-20261120-000000"
            folder.mkdir()
            (folder / "plan.json").write_text(json.dumps(_plan(model, topology, chips, rng)))
    for model in ("encoder", "t5_small"):
        folder = target / f"{model}-buckets-20261121-000000"
        folder.mkdir()
        (folder / "buckets.json").write_text(json.dumps(_buckets(model, rng)))


def screenshot(source: Path, path: Path) -> None:
    """Serve `source` and save a headless Chromium screenshot of the page (the README's image)."""
    from playwright.sync_api import sync_playwright

    server = make_server(source, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path="/usr/bin/chromium",
                args=[
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-quic",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                ],
            )
            page = browser.new_page(viewport={"width": 1400, "height": 1500})
            page.goto(server.url, wait_until="load")
            path.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(path), full_page=True)  # every section: runs, MFU, tuning, plans, buckets
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    print(f"screenshot of {source}: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=Path("results"), help="real run folders to copy")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--screenshot", type=Path, help="only save a screenshot of SOURCE's page here")
    args = parser.parse_args()
    if args.screenshot:
        screenshot(args.source, args.screenshot)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "results"
        root.mkdir()
        synthesise(args.source, root, args.runs)
        folders = sum(1 for _ in root.iterdir())
        timings, cpu_times = [], []
        for _ in range(args.repeat):
            started, cpu = time.perf_counter(), time.process_time()
            collection = collect(root)
            collected = time.perf_counter()
            page = write_dashboard(root, collection=collection)
            timings.append((collected - started, time.perf_counter() - collected))
            cpu_times.append(time.process_time() - cpu)
        size = page.stat().st_size
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "tpu_tuner.cli", "-q", "dashboard", str(root)], check=True, stdout=subprocess.DEVNULL
        )
        command = time.perf_counter() - started
    total = [c + r for c, r in timings]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores while measuring")
    print(f"{folders} run folders ({args.runs} profile/tuning copies, 4 plans, 2 bucketing results)")
    print(f"collect     {statistics.median(c for c, _ in timings):.2f} s (median of {args.repeat})")
    print(f"render      {statistics.median(r for _, r in timings):.2f} s (plots + HTML + write)")
    print(
        f"total       {statistics.median(total):.2f} s  (budget 5 s; all runs: {', '.join(f'{t:.2f}' for t in total)})"
    )
    print(
        f"cpu time    {statistics.median(cpu_times):.2f} s  (this process's CPU seconds: what the machine's other load "
        "does not inflate)"
    )
    print(f"command     {command:.2f} s  (`tpu-tune dashboard`, with interpreter start and imports)")
    print(f"page size   {size / 1e6:.2f} MB  (budget 5 MB)")


if __name__ == "__main__":
    main()
