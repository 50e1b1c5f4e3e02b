"""TorchTPU's tuned MFU beside the planner's JAX program of the same decoder, on the same chip.

Issue 56, item 4. For one decoder shape (default: the Llama-class ~0.4B decoder at batch 2 x 2048,
a training step), one run on one TPU chip gives, one process after the other (only one program
may hold the chip):

1. ``jax``: the planner's JAX training step of that shape for ``v5e-1`` (exported by
   benchmarks/chip/tpu_chip_check.py's ``export``, on the planning host beforehand or here in a JAX
   subprocess), timed by tpu_chip_check.py's ``run`` in a process WITHOUT the TorchTPU site folder
   on its path (JAX 0.10.2 needs libtpu 0.0.42; torch-tpu brings 0.0.52: docs/torchtpu.md,
   "One environment?");
2. ``torchtpu``: ``tpu-tune`` on the same decoder with ``--device tpu`` under ``--time-budget``;
   its tuned (and baseline) step comes from the run folder's tuned_config.toml ([provenance]) and
   its model FLOPs from profile.json;
3. ``obvious``: ``tpu-tune profile`` with ``torch.compile(backend="tpu")`` and bf16 autocast, the
   recipe a user would try first, as a reference;

and the planner's predicted step (predicted.json, from the plan's own best point). Every MFU here
divides the planner's model FLOPs by the planner's peak for the chip: both sides count
6N + 12LHQT x tokens with full attention (N: the matmul parameters), and the script checks that
tpu-tune's profile counted the same FLOPs (it notes any difference). Writes beside_jax.json.

    python benchmarks/chip/tpu_mfu_beside_jax.py --dry-run   # here: export the JAX step, print the chip's commands
    python benchmarks/chip/tpu_mfu_beside_jax.py [--torchtpu-site /tmp/torchtpu-site] [--time-budget 5m]   # on the chip
    python benchmarks/chip/tpu_mfu_beside_jax.py --table              # the table again from --out's files, runs nothing
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# tpu_tuner from this checkout (the chip host's JAX python has it uninstalled), and the sibling check.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import tpu_chip_check

from tpu_tuner.core.tpu_host import tpu_chips_on_host

REPO = Path(__file__).resolve().parents[2]
CHECK = Path(tpu_chip_check.__file__).resolve()
SHAPE = "decoder:vocab=32000,d_model=2048,layers=6,heads=16,kv_heads=4,mlp=5632,max_seq_len=2048"
PARTS = ("jax", "torchtpu", "obvious")  # run in this order: the JAX step first, on a chip no torch has touched
RESULT = "beside_jax.json"
TARGET = 0.90  # issue 56: TorchTPU's tuned MFU at least 90% of JAX's
FLOPS_AGREE = 1e-3  # relative difference under which both sides counted the same model FLOPs


def refusal() -> str:
    """The one line said on a host without a TPU chip."""
    return (
        "tpu_mfu_beside_jax: no TPU chip on this host's PCI bus: run it on a TPU host "
        '(docs/benchmarks.md, "MFU beside JAX on the chip"), or give --dry-run to export the JAX step '
        "here and print the chip's commands"
    )


def chip_commands(args: argparse.Namespace) -> dict[str, list[str]]:
    """The command of each part (and of the JAX export), run from the repository root."""
    out, batch, seq = args.out, str(args.batch_size), str(args.seq)
    sizes = ["--batch-size", batch, "--seq", seq]
    return {
        "export": [
            *(args.jax_python, str(CHECK), "export", "--out", str(out / "jax"), "--shape", args.shape),
            *("--topology", args.topology, "--global-batch", batch, "--seq", seq, "--remats", args.remat),
            *("--flash-block", str(args.flash_block)),
        ],
        "jax": [args.jax_python, str(CHECK), "run", "--out", str(out / "jax"), "--remats", args.remat]
        + ["--steps", str(args.steps)],
        "torchtpu": [args.torchtpu_python, "-m", "tpu_tuner.cli", "-q", args.shape, "--device", "tpu", *sizes]
        + ([] if args.time_budget == "default" else ["--time-budget", args.time_budget])
        + (["--space", args.space] if args.space else [])
        + ["--out", str(out / "torchtpu")],
        "obvious": [args.torchtpu_python, "-m", "tpu_tuner.cli", "profile", args.shape, "--device", "tpu", *sizes]
        + ["--compile", "tpu", "--autocast", "bfloat16", "--out", str(out / "obvious")],
    }


def environments(environ: Mapping[str, str], site: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """The JAX processes' environment and the TorchTPU processes': the TorchTPU site folder (`site`,
    and any PYTHONPATH entry holding torch_tpu) first on the TorchTPU path and off the JAX one, so
    that JAX loads its own libtpu 0.0.42, never torch-tpu's 0.0.52."""
    entries = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sites = {os.path.normpath(p) for p in entries if (Path(p) / "torch_tpu").is_dir()}
    if site:
        sites.add(os.path.normpath(site))
    jax_env, torch_env = dict(environ), dict(environ)
    kept = [p for p in entries if os.path.normpath(p) not in sites]
    if kept:
        jax_env["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        jax_env.pop("PYTHONPATH", None)
    front = [site] if site else []
    torch_path = front + [p for p in entries if not site or os.path.normpath(p) != os.path.normpath(site)]
    if torch_path:
        torch_env["PYTHONPATH"] = os.pathsep.join(torch_path)
    return jax_env, torch_env


def run_part(name: str, command: list[str], env: Mapping[str, str], out: Path, runs_under: Path | None) -> None:
    """Run one part to its end, its output in OUT/<name>.log, and write OUT/<name>.exit.json: the
    command, exit status, wall time, last line and the run folder it made (the newest new folder
    under `runs_under`), so the table can be rebuilt from the files alone (--table)."""
    before = set(runs_under.iterdir()) if runs_under and runs_under.is_dir() else set()
    log = out / f"{name}.log"
    print(f"[{name}] {' '.join(command)}", flush=True)
    start = time.perf_counter()
    with log.open("w") as sink:
        done = subprocess.run(command, cwd=REPO, env=dict(env), stdout=sink, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - start
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    new = sorted(set(runs_under.iterdir()) - before, key=lambda p: p.stat().st_mtime) if runs_under else []
    record: dict[str, Any] = {
        "command": command,
        "exit_status": done.returncode,
        "wall_s": round(wall, 1),
        "last_line": lines[-1] if lines else "",
        "run_dir": str(new[-1]) if new else None,
    }
    (out / f"{name}.exit.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"[{name}] exit status {done.returncode} after {wall:.0f} s: {record['last_line'][:160]}", flush=True)


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _failure(out: Path, name: str) -> str:
    """Why a part has no figures, from its exit record."""
    record = _read_json(out / f"{name}.exit.json")
    if record is None:
        return "not run"
    return f"exit status {record['exit_status']}: {record['last_line'][:200]}"


def summarise(out: Path, remat: str) -> dict[str, Any]:
    """Every figure the table shows, from OUT's files: one FLOP count and one peak for every MFU."""
    predicted = _read_json(out / "jax" / remat / tpu_chip_check.PREDICTED_FILE)
    if predicted is None:
        raise SystemExit(f"tpu_mfu_beside_jax: no {out / 'jax' / remat / tpu_chip_check.PREDICTED_FILE}: export first")
    flops, peak = float(predicted["model_flops_per_step"]), float(predicted["peak_tflops_per_device"]) * 1e12

    def row(step_s: float | None, **extra: Any) -> dict[str, Any]:
        mfu = flops / step_s / peak if step_s else None
        return {"step_s": step_s, "mfu": mfu, **extra}

    rows: dict[str, dict[str, Any]] = {}
    measured = _read_json(out / "jax" / remat / tpu_chip_check.MEASURED_FILE)
    jax_exit = _read_json(out / "jax.exit.json")
    if measured is not None and (jax_exit is None or jax_exit["exit_status"] == 0):
        spread = [measured["step_s_min"], measured["step_s_max"]]
        rows["jax"] = row(measured["step_s_median"], device=measured["device"], step_s_min_max=spread)
    else:
        rows["jax"] = row(None, failure=_failure(out, "jax"))
    notes: list[str] = []
    rows.update(_torchtpu_rows(out, flops, row, notes))
    rows["planner"] = row(
        predicted["predicted_step_s"], mfu_stated=predicted["predicted_mfu"], band_points=predicted["band_points"]
    )
    jax_mfu, tuned_mfu = rows["jax"]["mfu"], rows["torchtpu_tuned"]["mfu"]
    ratio = tuned_mfu / jax_mfu if jax_mfu and tuned_mfu else None
    return {
        "shape": predicted["shape"],
        "topology": predicted["topology"],
        "global_batch": predicted["global_batch"],
        "seq_len": predicted["seq_len"],
        "jax_program": f"remat {predicted['remat']}, flash blocks {predicted['flash_block'] or 128}, "
        f"{predicted['layout']}",
        "model_flops_per_step": flops,
        "peak_flops_per_s": peak,
        "flops_convention": "the planner's model FLOPs (6N + 12LHQT x tokens, full attention, N = matmul "
        "parameters) over the planner's bf16 peak per chip, for every row",
        "rows": rows,
        "tuned_over_jax_mfu": ratio,
        "target": TARGET,
        "target_met": None if ratio is None else ratio >= TARGET,
        "notes": notes,
    }


def _torchtpu_rows(out: Path, flops: float, row: Any, notes: list[str]) -> dict[str, dict[str, Any]]:
    """The tuned and baseline steps of the tpu-tune run and the obvious recipe's profile; a note
    where tpu-tune's own model FLOPs differ from the planner's (its MFU is kept as stated)."""
    rows: dict[str, dict[str, Any]] = {}
    tune_dir = _run_dir(out, "torchtpu")
    if tune_dir is not None and (tune_dir / "tuned_config.toml").is_file():
        config = tomllib.loads((tune_dir / "tuned_config.toml").read_text())
        provenance = config["provenance"]
        _check_flops("tpu-tune's run", _read_json(tune_dir / "profile.json") or {}, flops, notes)
        for side in ("tuned", "baseline"):
            figures = provenance.get(side) or {}
            rows[f"torchtpu_{side}"] = row(
                figures.get("step_median_s"),
                mfu_stated=figures.get("mfu"),
                step_source=figures.get("step_source"),
                verdict=provenance["verification"]["message"],
                settings=config["settings"] if side == "tuned" else None,
                run_dir=str(tune_dir),
            )
    else:
        rows["torchtpu_tuned"] = rows["torchtpu_baseline"] = row(None, failure=_failure(out, "torchtpu"))
    obvious_dir = _run_dir(out, "obvious")
    profile = _read_json(obvious_dir / "profile.json") if obvious_dir is not None else None
    if profile is not None:
        _check_flops("the obvious recipe's profile", profile, flops, notes)
        rows["torchtpu_obvious"] = row(profile["timing"]["median"], mfu_stated=profile["mfu"], run_dir=str(obvious_dir))
    else:
        rows["torchtpu_obvious"] = row(None, failure=_failure(out, "obvious"))
    return rows


def _run_dir(out: Path, name: str) -> Path | None:
    """The run folder a part's run made, from its exit record (None: not run, or it made none)."""
    found = (_read_json(out / f"{name}.exit.json") or {}).get("run_dir")
    return Path(found) if found else None


def _check_flops(what: str, profile: Mapping[str, Any], flops: float, notes: list[str]) -> None:
    counted = (profile.get("flops") or {}).get("model_per_step")
    if counted and abs(counted / flops - 1) > FLOPS_AGREE:
        notes.append(
            f"{what} counted {counted:.4g} model FLOPs a step ({profile['flops'].get('model_formula')}) against "
            f"the planner's {flops:.4g}: its stated MFU differs by that ratio; the table's uses the planner's"
        )


LABELS = {
    "jax": "JAX (the planner's program)",
    "torchtpu_tuned": "TorchTPU tuned",
    "torchtpu_baseline": "TorchTPU baseline (tpu-tune's)",
    "torchtpu_obvious": "TorchTPU tpu compile + bf16 autocast",
    "planner": "planner's prediction",
}


def table(summary: Mapping[str, Any]) -> str:
    """The summary as lines to print: each row's step, MFU and step against JAX's and the plan's."""
    rows = summary["rows"]
    jax_step, planned = rows["jax"]["step_s"], rows["planner"]["step_s"]
    lines = [
        f"{summary['shape']}, batch {summary['global_batch']} x {summary['seq_len']}, training step, on "
        f"{rows['jax'].get('device') or summary['topology']}; JAX program: {summary['jax_program']}",
        f"every MFU: {summary['model_flops_per_step'] / 1e12:.4g} TFLOP a step over "
        f"{summary['peak_flops_per_s'] / 1e12:.4g} TFLOP/s ({summary['flops_convention']})",
        f"{'':40} {'step (s)':>9} {'MFU':>7} {'step / JAX':>11} {'step / planned':>15}",
    ]
    for name, label in LABELS.items():
        r = rows[name]
        if r["step_s"] is None:
            lines.append(f"{label:40} n/a ({r.get('failure', 'no figures')})")
            continue
        vs_jax = f"{r['step_s'] / jax_step:.3f}" if jax_step else "n/a"
        lines.append(
            f"{label:40} {r['step_s']:9.4f} {r['mfu']:7.1%} {vs_jax:>11} {r['step_s'] / planned:15.3f}"
            + (f"  (band +- {r['band_points']:.1f} points)" if name == "planner" and r.get("band_points") else "")
        )
    ratio = summary["tuned_over_jax_mfu"]
    verdict = "n/a" if ratio is None else f"{ratio:.1%} ({'met' if summary['target_met'] else 'NOT met'})"
    lines.append(f"TorchTPU tuned MFU / JAX MFU: {verdict}; target >= {summary['target']:.0%}")
    tuned = rows["torchtpu_tuned"]
    if tuned.get("verdict"):
        lines.append(f"tpu-tune: {tuned['verdict']}")
    lines.extend(f"note: {note}" for note in summary["notes"])
    return "\n".join(lines)


def write_summary(out: Path, remat: str) -> dict[str, Any]:
    """Summarise OUT, write beside_jax.json and print the table."""
    summary = summarise(out, remat)
    (out / RESULT).write_text(json.dumps(summary, indent=1) + "\n")
    print(table(summary))
    print(f"wrote {out / RESULT}")
    return summary


def _shown(part: object) -> str:
    """A command's part as the chip host would read it: paths from the repository root, `python`
    for this interpreter (the chip host's own are its --jax-python and --torchtpu-python)."""
    text = str(part)
    return "python" if text == sys.executable else text.replace(f"{REPO}{os.sep}", "")


def _shown_options(argv: Sequence[str] | None) -> list[str]:
    """This run's options without --dry-run: the chip's command line."""
    return [_shown(a) for a in (sys.argv[1:] if argv is None else argv) if a != "--dry-run"]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default=SHAPE, help="a decoder: spec (default: the Llama-class ~0.4B decoder)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--topology", default="v5e-1", help="the one-chip topology the JAX step is planned for")
    parser.add_argument("--remat", default="full", help="the JAX program's remat policy (tpu-tune plan's default)")
    parser.add_argument("--flash-block", type=int, default=512, help="the JAX program's flash blocks (0: 128)")
    parser.add_argument("--steps", type=int, default=20, help="JAX steps timed (the first 3 left out)")
    parser.add_argument(
        "--time-budget",
        default="5m",
        help="tpu-tune's clock (default 5m: a lent chip's command runs 10 min at most; "
        "'default': tpu-tune's own, which on a TPU fits the measured cost of a setting)",
    )
    parser.add_argument("--space", help="tpu-tune's search space (e.g. torchtpu: TorchTPU's levers; default: its own)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="which parts run")
    parser.add_argument("--torchtpu-site", help="the folder TorchTPU was installed into (carried onto the chip)")
    parser.add_argument("--jax-python", default=sys.executable, help="the JAX environment's python")
    parser.add_argument("--torchtpu-python", default=sys.executable, help="the TorchTPU environment's python")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "tpu_mfu_beside_jax")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--dry-run", action="store_true", help="no TPU needed: export the JAX step, print commands")
    modes.add_argument("--table", action="store_true", help="print the table of --out's files, run nothing")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    args.out = args.out.resolve()
    step_dir = args.out / "jax" / args.remat
    if args.table:
        write_summary(args.out, args.remat)
        return 0
    if not args.dry_run and not tpu_chips_on_host():
        print(refusal(), file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    commands = chip_commands(args)
    jax_env, torch_env = environments(os.environ, args.torchtpu_site)
    if args.dry_run:
        if not (step_dir / tpu_chip_check.STEP_FILE).exists():  # the planner, here: JAX compiles for v5e-1 on CPU
            tpu_chip_check.export(
                step_dir, args.shape, args.topology, args.batch_size, args.seq, args.remat, args.flash_block or None
            )
        predicted = _read_json(step_dir / tpu_chip_check.PREDICTED_FILE)
        if predicted is None:
            print(f"tpu_mfu_beside_jax: nothing the planner compiled fits {args.topology}", file=sys.stderr)
            return 1
        print(
            f"planner: {predicted['shape']} on {predicted['topology']}, batch {predicted['global_batch']} x "
            f"{predicted['seq_len']}: predicted step {predicted['predicted_step_s']:.4f} s, MFU "
            f"{predicted['predicted_mfu']:.1%} +- {predicted['band_points']:.1f} points; exported {step_dir}"
        )
        chip = ["python", "benchmarks/chip/tpu_mfu_beside_jax.py", *_shown_options(argv)]
        site = "" if args.torchtpu_site else " (and --torchtpu-site DIR where TorchTPU has a folder of its own)"
        print(f"on the chip, with {_shown(args.out)} carried along: {' '.join(chip)}{site}")
        print("which runs, one after the other, from the repository root:")
        for name in args.parts:
            where = (
                "without the TorchTPU site folder on PYTHONPATH" if name == "jax" else "TorchTPU's site folder first"
            )
            print(f"  [{name}] ({where}) {' '.join(_shown(part) for part in commands[name])}")
        return 0
    if not (step_dir / tpu_chip_check.STEP_FILE).exists():
        # Not exported on the planning host: the planner needs torch and the planner's JAX in one
        # environment, which a chip host may lack. Without the plan nothing compares: stop here.
        run_part("export", commands["export"], jax_env, args.out, None)
        if not (step_dir / tpu_chip_check.STEP_FILE).exists():
            print(
                f"tpu_mfu_beside_jax: no exported JAX step in {step_dir} (see {args.out / 'export.log'}): "
                "run --dry-run on the planning host and carry --out's folder here",
                file=sys.stderr,
            )
            return 1
    for name in args.parts:
        runs_under = {"jax": None, "torchtpu": args.out / "torchtpu", "obvious": args.out / "obvious"}[name]
        if runs_under is not None:
            runs_under.mkdir(parents=True, exist_ok=True)
        run_part(name, commands[name], jax_env if name == "jax" else torch_env, args.out, runs_under)
    write_summary(args.out, args.remat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
