"""Bad starts, run as a user would: every one must be refused in seconds with exit status 2,
leaving no secret, no stray run folder and no changed file behind (issue 12; docs/run-safety.md).

    python benchmarks/tuning/trust.py [--keep]

Each case is a real `tpu-tune` subprocess in a fresh results folder. The wrong-model resume
case first makes a tiny finished run of examples/mlp.py (2 trials, 2 verification rounds), then
resumes it with examples/cnn.py. Printed per case: exit status, seconds to refuse, whether the
password appears anywhere under the results folder, whether a run folder was left behind, and
(resume) whether any file of the resumed run changed; then the first line of the error.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECRET = "SECRETPASS"
LIMIT_S = 10.0


@dataclass
class Case:
    name: str
    args: list[str]
    resume_of: Path | None = None  # a finished run folder this case must leave untouched


@dataclass
class Outcome:
    case: str
    status: int
    seconds: float
    secret_written: bool
    folder_left: bool
    resumed_changed: bool | None
    message: str

    @property
    def ok(self) -> bool:
        return (
            self.status == 2
            and self.seconds < LIMIT_S
            and not self.secret_written
            and not self.folder_left
            and not self.resumed_changed
        )


def tpu_tune(args: list[str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpu_tuner.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def has_secret(folder: Path) -> bool:
    return any(SECRET.encode() in p.read_bytes() for p in folder.rglob("*") if p.is_file())


def run_case(case: Case, work: Path) -> Outcome:
    out = work / case.name.replace(" ", "_")
    out.mkdir()
    before = snapshot(case.resume_of) if case.resume_of else None
    start = time.perf_counter()
    done = tpu_tune([*case.args, "--out", str(out)], timeout=120)
    seconds = time.perf_counter() - start
    secret = (
        SECRET in done.stdout + done.stderr or has_secret(out) or bool(case.resume_of and has_secret(case.resume_of))
    )
    changed = snapshot(case.resume_of) != before if case.resume_of else None
    lines = [line for line in done.stderr.splitlines() if line.startswith("tpu-tune: error:")]
    message = lines[0].removeprefix("tpu-tune: error: ") if lines else (done.stderr.strip().splitlines() or ["-"])[-1]
    return Outcome(case.name, done.returncode, seconds, secret, any(out.iterdir()), changed, message)


def finished_mlp_run(work: Path) -> Path:
    """A tiny finished tuning run of examples/mlp.py to resume with the wrong model."""
    out = work / "finished"
    done = tpu_tune(
        ["tune", "examples/mlp.py", "--trials", "2", "--verify-rounds", "2", "--steps", "100", "--out", str(out)]
    )
    if done.returncode != 0:
        sys.exit(f"the tiny mlp run failed ({done.returncode}):\n{done.stderr[-2000:]}")
    (run_dir,) = out.iterdir()
    return run_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder and print its path")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tpu-tune-trust-"))
    fixtures = ROOT / "tests" / "fixtures"
    try:
        print("making a tiny finished run of examples/mlp.py to resume ...", flush=True)
        started = time.perf_counter()
        finished = finished_mlp_run(work)
        print(f"  {finished.name} in {time.perf_counter() - started:.1f} s", flush=True)
        cases = [
            Case("trials 0", ["tune", "examples/mlp.py", "--trials", "0"]),
            Case("bad space", ["tune", "examples/mlp.py", "--space", "no-such-space"]),
            Case("bad storage", ["tune", "examples/mlp.py", "--storage", "notadb://x"]),
            Case("storage folder missing", ["tune", "examples/mlp.py", "--storage", "sqlite:////no/such/dir/s.db"]),
            Case(
                "storage with password",
                ["tune", "examples/mlp.py", "--storage", f"postgresql://user:{SECRET}@127.0.0.1:9/optuna"],
            ),
            Case("segfault at import (tune)", ["tune", str(fixtures / "segfault_at_import.py")]),
            Case("os._exit(3) at import (tune)", ["tune", str(fixtures / "exit_at_import.py")]),
            Case("segfault at import (profile)", ["profile", str(fixtures / "segfault_at_import.py")]),
            Case("os._exit(3) at import (buckets)", ["buckets", str(fixtures / "exit_at_import.py")]),
            Case("wrong-model resume", ["tune", "examples/cnn.py", "--resume", str(finished)], resume_of=finished),
        ]
        outcomes = [run_case(case, work) for case in cases]
    finally:
        if args.keep:
            print(f"scratch folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    def yes_no(value: bool | None) -> str:
        return "-" if value is None else "YES" if value else "no"

    header = (
        f"{'case':34} {'exit':>4} {'seconds':>8}  {'secret written':14} {'folder left':11} {'resumed run changed':19}"
    )
    print()
    print(header)
    print("-" * len(header))
    for o in outcomes:
        print(
            f"{o.case:34} {o.status:>4} {o.seconds:8.2f}  {yes_no(o.secret_written):14} {yes_no(o.folder_left):11} "
            f"{yes_no(o.resumed_changed):19}"
        )
    print()
    for o in outcomes:
        print(f"{o.case}: {o.message}")
    bad = [o.case for o in outcomes if not o.ok]
    print()
    print(
        f"{len(outcomes) - len(bad)}/{len(outcomes)} cases refused with exit 2 in under {LIMIT_S:.0f} s with nothing "
        "secret or stale written" + (f"; NOT: {', '.join(bad)}" if bad else "")
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
