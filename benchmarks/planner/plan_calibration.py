"""The planner against published TPU training runs (docs/planner.md, "Calibration").

The rows are the published MaxText / tpu-recipes runs of benchmarks/planner/published_runs.toml that the
planner can express exactly (benchmarks/planner/published_calibration.py builds them and says why each
other run is left out): each run's shape, slice, mesh, remat policy, per-device batch, optimizer
(AdamW or SGD), AdamW first-moment dtype and FLOPs convention. Each row is compiled for its topology at full effort;
its compiler figures are kept per row in benchmarks/planner/calibration_compiled.json as soon as it is
compiled, so a rerun compiles only the rows not there yet. Then the rows the prediction needs go
to tpu_tuner/planner/calibration/calibration_rows.json (the planner fits its constants to that file) and the
report prints every row's fit verdict and each efficiency model's leave-one-out table.

    python benchmarks/planner/plan_calibration.py [--only ID ...] [--recompile]   # compiles what is missing
    python benchmarks/planner/plan_calibration.py --refit                          # no compiles
    python benchmarks/planner/plan_calibration.py --list                           # the rows and the runs left out

Targets (issue 29): leave-one-out MAE at most 3 points over at least 20 rows; at least 90% of
the leave-one-out predictions inside their own band; every row's fit verdict right.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import time
from dataclasses import asdict
from pathlib import Path

from published_calibration import Row, load_runs, moe_kind, published_rows

from tpu_tuner.metrics.flops import transformer_model_flops
from tpu_tuner.model.decoders.decoder_shape import read_shape
from tpu_tuner.model.decoders.transformer_dims import TransformerDims
from tpu_tuner.model.meshes.layouts import parse_layout
from tpu_tuner.planner.calibration.calibration_store import FIT_FILE, store_fit
from tpu_tuner.planner.calibration.fitting import (
    ADOPTED,
    EFFICIENCY_MODELS,
    RERUNS_FILE,
    ROWS_FILE,
    CalibrationRow,
    band_check,
    errors,
    fit,
    leave_one_out,
    noise_floor,
)
from tpu_tuner.planner.compiler.xla_flags import parse_xla_flags
from tpu_tuner.planner.plans.plan_options import PlanCompile, PlanEnumeration, PlanTarget
from tpu_tuner.planner.prediction.band import ErrorBand, coverage_and_width
from tpu_tuner.planner.prediction.collectives import Collective, latency_steps
from tpu_tuner.planner.prediction.novelty import layout_kind
from tpu_tuner.planner.prediction.predict import MXU_WIDTH, alignment, causal_score_elements, routed_seconds

COMPILED = Path(__file__).resolve().parent / "calibration_compiled.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=None, help="row ids to compile (default: every row)")
    parser.add_argument("--recompile", action="store_true", help="compile the rows again even where kept")
    parser.add_argument("--refit", action="store_true", help="fit from the kept figures without compiling")
    parser.add_argument("--list", action="store_true", help="list the rows and the runs left out, and stop")
    parser.add_argument(
        "--refloor",
        action="store_true",
        help="rescale each kept row's FLOPs to the current analytical floor (no compiles), then refit",
    )
    parser.add_argument("--compiled", type=Path, default=COMPILED, help="the per-row compiler figures (read, written)")
    parser.add_argument(
        "--rows-file",
        type=Path,
        default=ROWS_FILE,
        help="where the prediction's rows are written (default: the package's)",
    )
    args = parser.parse_args()
    rows, excluded = published_rows()
    if args.list:
        for row in rows:
            print(
                f"{row.id:>36} {row.topology:>12} {row.layout.short():>9} pdb {row.per_device_batch:<5g} "
                f"seq {row.seq:<6} {row.remat_family:>8} {row.attention:>6} MFU {row.published_mfu:.1%}"
                + (f" {row.optimizer}" if row.optimizer != "adamw" else "")
            )
        for run_id, reason in excluded:
            print(f"{'left out':>36}: {run_id}: {reason}")
        return
    kept = json.loads(args.compiled.read_text()) if args.compiled.exists() else {}
    if args.refloor:
        for row in rows:
            if row.id in kept and "error" not in kept[row.id]:
                kept[row.id] = refloored(row, kept[row.id])
        args.compiled.write_text(json.dumps(kept, indent=1, sort_keys=True))
    if not args.refit and not args.refloor:
        todo = [r for r in rows if (args.only is None or r.id in args.only) and (args.recompile or r.id not in kept)]
        print(f"{len(rows)} rows, {len(todo)} to compile ({len(excluded)} published runs left out: --list)", flush=True)
        for row in todo:
            try:
                figures = compile_row(row)
            except Exception as exc:
                print(f"{row.id}: not compiled: {type(exc).__name__}: {exc}", flush=True)
                continue
            if figures is not None:
                kept[row.id] = figures
                args.compiled.write_text(json.dumps(kept, indent=1, sort_keys=True))  # each row as soon as it is done
    runs = {run["id"]: run for run in load_runs()}
    reruns = [
        {
            "id": run["id"],
            "current": run["superseded_by"],
            "difference_points": round((run["mfu"] - runs[run["superseded_by"]]["mfu"]) * 100, 2),
        }
        for run in runs.values()
        if run["superseded_by"]
    ]
    if args.rows_file == ROWS_FILE:
        RERUNS_FILE.write_text(json.dumps(reruns, indent=1))
    calibration = [
        calibration_row({**kept[r.id], "alignment": aligned(r)}, runs[r.id])
        for r in rows
        if r.id in kept and "error" not in kept[r.id]
    ]
    args.rows_file.write_text(json.dumps([asdict(r) for r in calibration], indent=1))
    print(f"{len(calibration)} rows written to {args.rows_file}")
    if args.rows_file == ROWS_FILE:  # the planner's rows: keep the adopted model's fit of them beside
        kept_fit = store_fit()
        print(f"the adopted {kept_fit['kind']} fit of them kept in {FIT_FILE}")
    report(calibration)


def compile_row(row: Row) -> dict | None:
    """Compile `row` at full effort; its compiler figures (or the refusal) as a JSON-able dict."""
    from tpu_tuner.planner.plans.plan import PlanOptions, plan
    from tpu_tuner.planner.prediction.predict import CostModel

    start = time.perf_counter()
    # An uncalibrated cost model: only the compiler's figures are kept, never a prediction.
    result = plan(
        row.spec,
        PlanOptions(
            PlanTarget(topology=row.topology, slices=row.slices),
            step=row.plan_step(remat=row.remat),
            enumeration=PlanEnumeration(layouts=[row.layout]),
            compile=PlanCompile(workers=1, cost_model=CostModel(), xla_flags=parse_xla_flags(row.xla_flags)),
        ),
    )
    (p,) = result.plans
    seconds = time.perf_counter() - start
    meta = {
        "id": row.id,
        "generation": row.generation,
        "topology": row.topology,
        "layout": row.layout.short(),
        "seq": row.seq,
        "per_device_batch": row.per_device_batch,
        "remat": row.remat,
        "remat_family": row.remat_family,
        "optimizer": row.optimizer,
        "attention": row.attention,
        "published_mfu": row.published_mfu,
        "effort": "full",
        "seconds": round(seconds, 1),
        **({"xla_flags": row.xla_flags} if row.xla_flags else {}),
    }
    if p.prediction is None:
        print(f"{row.id}: compiler refused: {p.why} ({seconds:.0f} s)", flush=True)
        return {**meta, "error": p.why}
    topology, pr, c = result.topology, p.prediction, p.compiled
    peak = topology.peak_flops_per_device
    figures = {
        **meta,
        "fits": p.fits,
        "peak_bytes": c.peak_bytes,
        "hbm_bytes": topology.hbm_bytes_per_device,
        "argument_bytes": c.argument_bytes,
        "temp_bytes": c.temp_bytes,
        "host_temp_bytes": c.host_temp_bytes,
        "compiled_flops": c.flops,
        # The FLOPs the prediction used (the larger of the compiler's and the analytical hardware count).
        "flops": pr.compute_seconds * peak * CostModel().efficiency(row.generation) * pr.alignment,
        "model_flops": result.model_flops_per_step / topology.devices - attention_not_counted(row),
        "bytes_accessed": c.bytes_accessed,
        "comm_seconds": pr.comm_seconds,
        "alignment": pr.alignment,
        "peak_flops": peak,
        "hbm_bytes_per_s": topology.hbm_bytes_per_s_per_device,  # per device: half the chip's on TPU7x
        "devices": topology.devices,
        "devices_per_chip": topology.devices_per_chip,
        "loop_peeled": c.loop_peeled,
        "collectives": [
            {"kind": k.kind, "group": k.group_size, "count": k.count, "bytes": k.bytes, "network": k.network}
            for k in c.collectives
        ],
    }
    print(
        f"{row.id}: fits {p.fits}, peak {c.peak_bytes / 2**30:.2f} / {topology.hbm_bytes_per_device / 2**30:.2f} GiB, "
        f"host {c.host_temp_bytes / 2**30:.1f} GiB, FLOPs {figures['flops']:.3e} (model {figures['model_flops']:.3e}), "
        f"published MFU {row.published_mfu:.1%} ({seconds:.0f} s)",
        flush=True,
    )
    return figures


def refloored(row: Row, figures: dict) -> dict:
    """`figures` with the FLOPs the prediction uses taken again from the analytical floor as the
    planner computes it now (`PlanProblem.hardware_flops`; no compile: the compiler's own count is
    kept). The kept FLOPs are max(compiled, floor) x the row's 8-bit factor (predict.py), so they
    scale by the ratio of the new max to the old; the floor is kept as `floor_flops`, so run once
    under the floor a row was compiled with (it records it), then under a changed one."""
    from tpu_tuner.planner.plans.plan import PlanOptions
    from tpu_tuner.planner.plans.plan_problem import build_problem
    from tpu_tuner.planner.prediction.predict import CostModel

    options = PlanOptions(
        PlanTarget(topology=row.topology, slices=row.slices),
        step=row.plan_step(remat=row.remat),
        enumeration=PlanEnumeration(layouts=[row.layout]),
        compile=PlanCompile(workers=1, cost_model=CostModel()),
    )
    problem = build_problem(row.spec, options, options.target.slice(), lambda message: None)
    floor = problem.hardware_flops(row.remat) / problem.topology.devices
    compiled = figures["compiled_flops"]
    # A row without a kept floor was compiled under the floor as it is now: its FLOPs stand.
    old = max(compiled, figures.get("floor_flops", floor))
    scale = max(compiled, floor) / old
    print(f"{row.id}: floor {floor:.4e}, compiled {compiled:.4e}, FLOPs x {scale:.3f}", flush=True)
    return {**figures, "flops": figures["flops"] * scale, "floor_flops": floor}


def attention_not_counted(row: Row) -> float:
    """The causal attention FLOPs per device a step that a row's convention leaves out: all of
    them under A0 (MaxText before 2023-06-02 counted 6 x parameters x tokens only), else none.
    The planner's own causal count (tpu_tuner/metrics/flops.py), so the two cannot drift apart."""
    if row.attention != "none":
        return 0.0
    shape, _, _ = read_shape(row.spec)
    dims = TransformerDims(shape.layers, shape.heads, shape.n_head_dim, causal=True)
    return transformer_model_flops(0, dims, row.per_device_batch, row.seq, True, "causal").attention_per_step


def aligned(row: Row) -> float:
    """The row's MXU alignment as the prediction computes it now (predict.alignment, attention's
    own matmuls included), from its shape: the kept figures' `alignment` may predate a term, and
    a refit must divide the FLOPs by what a plan would (no compile needed, the shape suffices)."""
    import torch

    from tpu_tuner.model.decoders.decoder import Decoder
    from tpu_tuner.model.workloads.structure import read_dims

    shape, _, _ = read_shape(row.spec)
    with torch.device("meta"):
        dims = read_dims(Decoder(shape), shape.heads)
    return alignment(dims.shape, row.layout, dims.head_dim, MXU_WIDTH.get(row.generation, 128), row.seq)


def calibration_row(f: dict, run: dict) -> CalibrationRow:
    """What the prediction needs of one row's compiler figures (seconds per step, per device)."""
    scores = causal_score_elements(run["layers"], run["heads"], f["seq"], f["seq"] * f["per_device_batch"])
    return CalibrationRow(
        number=0,
        generation=f["generation"],
        fits=f["fits"],
        peak_bytes=f["peak_bytes"],
        hbm_bytes=f["hbm_bytes"],
        compute_at_full_efficiency=f["flops"] / (f["peak_flops"] * f["alignment"]),
        memory_seconds=f["bytes_accessed"] / f["hbm_bytes_per_s"],
        comm_seconds=f["comm_seconds"],
        model_seconds_at_peak=f["model_flops"] / f["peak_flops"],
        published_mfu=f["published_mfu"],
        id=f["id"],
        remat_family=f["remat_family"],
        seq=f["seq"],
        per_device_batch=f["per_device_batch"],
        host_gbytes=2 * f["host_temp_bytes"] * f["devices_per_chip"] / 1e9,  # the chip's: its devices share it
        score_seconds=scores / f["peak_flops"],
        dcn_steps=sum(
            latency_steps(Collective(k["kind"], k["group"], k["count"], k["bytes"], k["network"]))
            for k in f["collectives"]
            if k.get("network") == "dcn"
        ),
        moe=moe_kind(run),
        slices=run["slices"],
        source=source_of(run),
        family=model_family(run["model"]),
        chips=run["chips"] // run["slices"],
        layout=layout_kind(parse_layout(f["layout"])),
        route_seconds=route_of(f, run),
    )


def route_of(f: dict, run: dict) -> float:
    """One HBM pass over a dropless row's routed tokens (predict.routed_seconds, what a plan of its
    shape is charged per pass); 0 for a dense or dropping row."""
    if moe_kind(run) != "dropless":
        return 0.0
    moe_layers = (run["layers"] - (run.get("first_dense_layers") or 0)) // run["moe_layer_interval"]
    tokens = f["per_device_batch"] * f["seq"]
    return routed_seconds(tokens, run["top_k"] * run["d_model"] * moe_layers, f["hbm_bytes_per_s"])


def source_of(run: dict) -> str:
    """The published table or log a run comes from: its repository and file, less a slice's own
    folder ("v6e-32/", "2x-v6e-256/": one recipe's READMEs per slice are one source) and the
    README name ("tpu-recipes:training/trillium/Llama3.1-8B-MaxText")."""
    path = re.sub(r"(^|/)README\.md$", "", run["source_file"])
    path = re.sub(r"/(\d+x-)?v\d+[a-z]*-\d+$", "", path)
    return f"{run['source_repo'].split('/')[-1]}:{path or 'README.md'}"


def model_family(model: str) -> str:
    """A model's family: its name up to the first word with a digit, the first word always kept
    ("llama3.1-70b" -> "llama3.1", "gpt-oss-120b" -> "gpt-oss", "gemma4-e2b" -> "gemma4")."""
    first, *rest = model.split("-")
    kept = list(itertools.takewhile(lambda w: not re.search(r"\d", w), rest))
    return "-".join([first, *kept])


def report(rows: list[CalibrationRow]) -> None:
    """Every row's fit verdict, then each efficiency model's fit and leave-one-out error."""
    unfit = [r.id for r in rows if not r.fits]
    print(f"fit in HBM: {sum(r.fits for r in rows)} of {len(rows)} rows" + (f" (NOT: {unfit})" if unfit else ""))
    for kind in EFFICIENCY_MODELS:
        fitted = fit(rows, kind)
        loo = leave_one_out(rows, kind)
        adopted = " (adopted)" if kind == ADOPTED else ""
        print(
            f"\n{kind + adopted}: fitted to all {len(rows)}: {fitted.describe()}; in-sample MAE "
            f"{statistics.mean(abs(e) for e in errors(rows, fitted)):.2f} points"
        )
        for r, e in zip(rows, loo):
            print(
                f"  {r.id:>36} {r.generation:>5} {r.remat_family:>8} seq {r.seq:<6} pdb {r.per_device_batch:<5g} "
                f"published {r.published_mfu:6.1%}  LOO {e:+6.1f}"
            )
        print(
            f"  leave-one-out MAE {statistics.mean(abs(e) for e in loo):.2f} points over {len(rows)} rows (target <= 3)"
        )
    floor = noise_floor()
    print(f"\nnoise floor of every band: {floor:.2f} points (published recipes measured again: {RERUNS_FILE.name})")
    for kind in dict.fromkeys(("per_generation", ADOPTED)):
        checked = band_check(rows, kind, floor)
        print(f"\n{kind}: each row's leave-one-out error against the band made from the other rows alone:")
        print_bands(rows, checked)


def print_bands(rows: list[CalibrationRow], checked: list[tuple[float, ErrorBand]]) -> None:
    """Each row's error and band, then the coverage and median band, overall and per generation
    (issue 57's targets: at least 90% inside, a median band of at most 6 points)."""
    for r, (e, b) in zip(rows, checked):
        print(
            f"  {r.id:>36} LOO {e:+6.1f}  band {b.points:5.1f} {'inside ' if abs(e) <= b.points else 'OUTSIDE'}"
            + (f"  ({'; '.join(b.reasons)})" if b.reasons else "")
        )
    for generation in [None, *sorted({r.generation for r in rows})]:
        mine = [c for r, c in zip(rows, checked) if generation in (None, r.generation)]
        share, median = coverage_and_width(mine)
        inside = sum(abs(e) <= b.points for e, b in mine)
        print(
            f"  {generation or 'all':>6}: inside their band {inside} of {len(mine)} ({share:.0%}; target >= 90%), "
            f"median band +-{median:.2f} points (target <= 6)"
        )


if __name__ == "__main__":
    main()
