"""A chaos benchmark (issue 39 item 6): four workers on one PostgreSQL study, with a random fault every
20-40 s, then the invariants a shared study must keep.

Four `tpu-tune` processes (the CLI, as an operator starts them) tune benchmarks/studies/chaos_model.py on one
study of a Debian PostgreSQL server started as tests/helpers/postgres_server.py does: a 12-setting space
(matmul precision x autocast x intra-op threads; on a CPU the precision agent rejects "high" and
"medium" unmeasured, so 4 are measured), ``--trials 12``, no warm start, trials of about a second.
When a study's workers have all finished, the next study starts (a fresh name), until
``--minutes`` have passed; the study running then is let finish. Every 20-40 s (a seeded random
draw) one fault:

- ``kill``: SIGKILL a worker (its process only, as ``kill -9 PID``);
- ``freeze``: SIGSTOP a worker, SIGCONT 10-25 s later (a frozen process, a paused VM);
- ``db-restart``: ``pg_ctl restart -m fast`` of the database (every connection dropped).

A worker that exits with a non-zero status (killed, or dead from a fault it did not survive) is
started again with the same command, as an operator would: it joins the same study. Before the
faults, one study runs without any: the reference best. Then, per study:

- every setting measured at most once (COMPLETE trials' settings unique, verification repeats aside);
- no trial left RUNNING;
- no orphan: once a study's workers have exited, no process that carries the study's marker in its
  environment is left (a scan of /proc);
- the best feasible setting equals the fault-free study's (the model's speed is known: bf16
  autocast on one thread), its step time within 25% of the reference's.

It prints each fault, each worker that died and its last line, and the invariants with their figures.

    python benchmarks/studies/chaos.py [--minutes 20] [--workers 4] [--seed 0]

Network partitions between hosts are not injected here: tests/test_partition.py cuts a link between
two hosts that are network namespaces (docs/run-safety.md, "Partition").
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

MODEL = Path(__file__).with_name("chaos_model.py")
MARK = "TPU_TUNE_CHAOS_MARK"
TRIALS = 12
FAULT_EVERY_S = (20.0, 40.0)
THAW_AFTER_S = (10.0, 25.0)
STUDY_LIMIT_S = 900.0  # a study not done by then is stopped and counted as not finished
RELAUNCHES = 20  # per study: past this, a worker that keeps dying is left dead
NOISE = 0.25
SPACE = """\
# benchmarks/studies/chaos.py: 12 settings
[space]
name = "chaos"

[[param]]
name = "matmul_precision"
agent = "precision"
choices.cpu = ["highest", "high", "medium"]

[[param]]
name = "autocast"
agent = "precision"
choices.cpu = ["none", "bfloat16"]

[[param]]
name = "intra_op_threads"
agent = "threads"
choices.cpu = ["all", "1"]
"""


@dataclass
class Study:
    """One study's workers: slot -> the process running now, and what happened to them."""

    name: str
    started: float
    mark: str = field(default_factory=lambda: uuid.uuid4().hex)
    workers: dict[int, subprocess.Popen] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)
    relaunches: int = 0
    deaths: list[str] = field(default_factory=list)


class Chaos:
    def __init__(self, url: str, data: Path, out: Path, workers: int, rng: random.Random) -> None:
        self.url, self.data, self.out, self.n, self.rng = url, data, out, workers, rng
        self.space = out / "space.toml"
        self.space.write_text(SPACE)
        self.faults: list[str] = []
        self.frozen: list[tuple[float, subprocess.Popen]] = []
        self.t0 = time.monotonic()
        self.next_fault: float | None = None
        self.launched: list[subprocess.Popen] = []

    def stop_all(self) -> None:
        """Stop every worker still running (the benchmark itself stopped early)."""
        for process in self.launched:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def say(self, line: str) -> None:
        print(f"{time.monotonic() - self.t0:7.1f} s  {line}", flush=True)

    # --- workers ---------------------------------------------------------------------------------

    def launch(self, study: Study, slot: int) -> None:
        folder = self.out / study.name / f"w{slot}"
        folder.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "TPU_TUNE_STORAGE"}
        env.update({MARK: study.mark, "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])})
        command = [sys.executable, "-m", "tpu_tuner.cli", str(MODEL), "--device", "cpu", "--study", study.name]
        command += ["--storage", self.url, "--space", str(self.space), "--trials", str(TRIALS), "--cold"]
        command += ["--time-budget", "none", "--no-prune", "--verify-rounds", "2", "--out", "results"]
        log = (folder / f"out-{study.relaunches}.txt").open("w")
        study.workers[slot] = subprocess.Popen(
            command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        study.workers[slot].log = log.name  # type: ignore[attr-defined]  # its output file, kept on the process
        self.launched.append(study.workers[slot])

    def start(self, name: str) -> Study:
        study = Study(name, time.monotonic())
        for slot in range(self.n):
            self.launch(study, slot)
        return study

    def tick(self, study: Study) -> bool:
        """Relaunch the workers that died; True once every slot's worker exited with status 0."""
        for slot, process in study.workers.items():
            code = process.poll()
            if code is None or slot in study.finished:
                continue
            if code == 0:
                study.finished.add(slot)
                self.say(f"{study.name}: worker {slot} (pid {process.pid}) finished")
                continue
            output = Path(process.log)  # type: ignore[attr-defined]  # set by launch()
            lines = output.read_text(errors="replace").strip().splitlines()
            last = lines[-1][:200] if lines else ""
            study.deaths.append(f"worker {slot} exited {code}: {last}")
            self.say(f"{study.name}: worker {slot} (pid {process.pid}) exited {code}: {last}")
            if study.relaunches < RELAUNCHES:
                study.relaunches += 1
                self.launch(study, slot)
                self.say(f"{study.name}: worker {slot} relaunched (pid {study.workers[slot].pid})")
            else:
                study.finished.add(slot)
        return len(study.finished) == self.n

    # --- faults ----------------------------------------------------------------------------------

    def inject(self, study: Study) -> None:
        alive = [(s, p) for s, p in study.workers.items() if p.poll() is None and p not in dict(self.frozen).values()]
        kinds = ["db-restart"] + (["kill", "freeze"] if alive else [])
        kind = self.rng.choice(kinds)
        if kind == "db-restart":
            from helpers.postgres_server import _as_postgres, binaries

            started = time.monotonic()
            # -l: the new server's output to the log, not to this pipe (which it would hold open forever).
            log = str(self.data.parent / "server.log")
            restart = [str(binaries() / "pg_ctl"), "-D", str(self.data), "-l", log, "-m", "fast", "-w", "-t", "60"]
            _as_postgres([*restart, "restart"], timeout=120)
            note = f"pg_ctl restart -m fast ({time.monotonic() - started:.1f} s)"
        else:
            slot, process = self.rng.choice(alive)
            if kind == "kill":
                os.kill(process.pid, signal.SIGKILL)
                note = f"SIGKILL worker {slot} (pid {process.pid})"
            else:
                os.kill(process.pid, signal.SIGSTOP)
                thaw = self.rng.uniform(*THAW_AFTER_S)
                self.frozen.append((time.monotonic() + thaw, process))
                note = f"SIGSTOP worker {slot} (pid {process.pid}), SIGCONT in {thaw:.0f} s"
        self.faults.append(kind)
        self.say(f"fault {len(self.faults)}: {kind}: {note}")

    def thaw(self, everyone: bool = False) -> None:
        now = time.monotonic()
        for due, process in list(self.frozen):
            if everyone or now >= due:
                if process.poll() is None:
                    os.kill(process.pid, signal.SIGCONT)
                self.frozen.remove((due, process))

    # --- one study -------------------------------------------------------------------------------

    def run(self, name: str, until: float | None) -> tuple[Study, bool]:
        """Run study `name` to its end; with `until`, inject faults until then. Whether it finished."""
        study = self.start(name)
        # One schedule over the studies: a fault may land on any phase of one.
        if until is not None and self.next_fault is None:
            self.next_fault = time.monotonic() + self.rng.uniform(*FAULT_EVERY_S)
        while not self.tick(study):
            now = time.monotonic()
            if now - study.started > STUDY_LIMIT_S:
                for process in study.workers.values():
                    if process.poll() is None:
                        os.killpg(process.pid, signal.SIGKILL)
                self.thaw(everyone=True)
                return study, False
            if until is not None and now < until and self.next_fault is not None and now >= self.next_fault:
                self.inject(study)
                self.next_fault = now + self.rng.uniform(*FAULT_EVERY_S)
            self.thaw(everyone=until is None or now >= until)
            time.sleep(0.25)  # the operator's polling loop: a fault's timing is its own, not an event's
        self.thaw(everyone=True)
        return study, True


def orphans(mark: str, grace_s: float = 30.0) -> list[str]:
    """Processes carrying `mark` still alive `grace_s` after their study's workers exited."""
    deadline = time.monotonic() + grace_s
    while True:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if f"{MARK}={mark}".encode() in environ and state != "Z":
                    found.append(f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def check(url: str, study: Study) -> dict[str, object]:
    """The invariants of one study, as figures."""
    import optuna

    from tpu_tuner.studies.liveness import read_storage
    from tpu_tuner.tuning.search.tuning_trial import TuningTrial

    # A server study is tpu-tune's journal (studies/journal.py), not Optuna's RDB tables.
    stored = optuna.load_study(study_name=study.name, storage=read_storage(url)).get_trials(deepcopy=False)
    trials = TuningTrial.all(stored)
    originals = [t for t in trials if t.state.name == "COMPLETE" and not t.is_repeat]
    settings = Counter(tuple(sorted(t.params.items())) for t in originals)
    feasible = [t for t in originals if t.feasible and t.value is not None]
    best = min(feasible, key=lambda t: t.objective) if feasible else None
    left = orphans(study.mark)
    return {
        "trials": len(trials),
        "measured": len(settings),
        "doubled": sum(count - 1 for count in settings.values()),
        "running": sum(1 for t in trials if t.state.name == "RUNNING"),
        "failed": sum(1 for t in trials if t.state.name == "FAIL"),
        "orphans": left,
        "best": {k: best.params.get(k) for k in ("autocast", "intra_op_threads")} if best else None,
        "best_s": best.objective if best else None,
        "deaths": len(study.deaths),
    }


def _phases(
    chaos: Chaos, url: str, minutes: float
) -> tuple[dict[str, object], list[tuple[Study, bool, dict[str, object]]]]:
    """The fault-free reference study, then studies under faults for `minutes`."""
    reference, done = chaos.run(f"chaos-ref-{uuid.uuid4().hex[:6]}", until=None)
    ref = check(url, reference)
    chaos.say(f"reference (no faults): finished {done}, {ref}")
    until = time.monotonic() + 60 * minutes
    results = []
    while time.monotonic() < until:
        study, done = chaos.run(f"chaos-{len(results)}-{uuid.uuid4().hex[:6]}", until=until)
        figures = check(url, study)
        results.append((study, done, figures))
        chaos.say(f"{study.name}: finished {done}, {figures}")
    return ref, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="how long faults are injected (default 20)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="the faults' random draw")
    parser.add_argument(
        "--keep", type=Path, help="keep the workers' folders and output here (default: a temporary folder)"
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(143))  # leave through the server's clean-up
    from chaos_model import BEST
    from helpers.postgres_server import running_server

    with tempfile.TemporaryDirectory(prefix="tpu-tune-chaos-") as folder, running_server() as server:
        out = (args.keep or Path(folder)).resolve()
        out.mkdir(parents=True, exist_ok=True)
        chaos = Chaos(server.url(), server.folder / "data", out, args.workers, random.Random(args.seed))
        try:
            ref, results = _phases(chaos, server.url(), args.minutes)
        finally:
            chaos.stop_all()
    ref_s = ref["best_s"]
    print(
        f"\n{args.workers} workers, {len(results)} studies of {TRIALS} trials, "
        f"{args.minutes:g} min of faults (seed {args.seed})"
    )
    print(f"faults injected: {len(chaos.faults)} ({dict(Counter(chaos.faults))})")
    print(f"workers that died and were relaunched: {sum(len(s.deaths) for s, _, _ in results)}")

    def held(name: str, ok: bool, figure: str) -> None:
        print(f"  {'held' if ok else 'BROKEN':6} {name}: {figure}")

    print(
        f"the fault-free reference: {ref['measured']} settings measured, {ref['doubled']} doubled, "
        f"{ref['running']} RUNNING, orphans {ref['orphans']}"
    )
    print("invariants, over the studies with faults:")
    held("every study finished", all(d for _, d, _ in results), f"{sum(d for _, d, _ in results)} of {len(results)}")
    held(
        "no setting measured twice",
        all(f["doubled"] == 0 for *_, f in results),
        f"{sum(f['doubled'] for *_, f in results)} doubled",
    )
    held(
        "no trial left RUNNING",
        all(f["running"] == 0 for *_, f in results),
        f"{sum(f['running'] for *_, f in results)} RUNNING",
    )
    held(
        "no orphan process",
        all(not f["orphans"] for *_, f in results),
        f"{[o for *_, f in results for o in f['orphans']]}",
    )
    measured = [f["measured"] for *_, f in results]
    held(
        f"no setting lost (the reference measured {ref['measured']})",
        all(m >= ref["measured"] for m in measured),
        f"measured per study {measured}",
    )
    same = [f["best"] == BEST for *_, f in results]
    held(f"best setting = the fault-free one ({ref['best']})", all(same), f"{sum(same)} of {len(same)}")
    if isinstance(ref_s, float):
        close = [isinstance(f["best_s"], float) and abs(f["best_s"] / ref_s - 1) <= NOISE for *_, f in results]
        values = ", ".join(
            f"{f['best_s'] * 1e3:.2f}" if isinstance(f["best_s"], float) else "none" for *_, f in results
        )
        held(f"best step within {NOISE:.0%} of the reference's {ref_s * 1e3:.2f} ms", all(close), f"{values} ms")


if __name__ == "__main__":
    main()
