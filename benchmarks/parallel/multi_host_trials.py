"""Trials that span hosts, measured on loopback: what spanning hosts costs a trial, and what a
SIGKILLed host costs a study.

    python benchmarks/parallel/multi_host_trials.py trials [--model examples/gpt.py] [--rounds 4]
    python benchmarks/parallel/multi_host_trials.py kill [--model examples/gpt.py] [--trials 3]

``trials``: the same measure job (a trial's own `MeasureRequest`, the default trial settings) of
each layout, run as 1 host x 2 ranks (`RankedTrialRunner`: one launcher, a file rendezvous, both
cores) and as 2 hosts x 1 rank (`MultiHostTrialRunner` here as the driver, node 0, on the first
core; the follower is the `tpu-tune` command itself in a process tree and folder of its own, node
1, on the second; the ranks meet in the c10d rendezvous store), interleaved over rounds in a
rotating order. Each simulated host has the same share of the machine as each single-host rank.
Per trial: the wall time the runner saw (start-up of the ranks, the measurement, the outcome
gathered: the per-trial overhead is its paired difference) and the measured step (slowest rank's median).

``kill``: a study of 2 hosts x 1 rank (``tpu-tune MODEL --nnodes 2 --nproc 1``, the layout and
bf16-autocast space of tests/fixtures/layout_space.toml), the follower's agent killed with SIGKILL
during the second trial, then the same two commands again: what the study held before, what the
killed trial recorded, what the relaunch measured, and whether any setting was measured twice.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYOUTS = ("2x1x1", "1x2x1")  # gpt's fused q/k/v cannot run tensor parallel; tensor spans hosts anyway


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def _follower(
    model: str, port: int, study: str, folder: Path, *extra: str, cores: set[int] | None = None
) -> subprocess.Popen:
    """The `tpu-tune` command of one simulated host, in its own folder (on `cores` only, if given)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "out.txt", "a") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tpu_tuner.cli",
                model,
                "--device",
                "cpu",
                "--nnodes",
                "2",
                "--nproc",
                "1",
                "--rdzv",
                f"127.0.0.1:{port}",
                "--study",
                study,
                "--out",
                "results",
                *extra,
            ],
            cwd=folder,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
        )


def trials(args: argparse.Namespace) -> None:
    from tpu_tuner.knobs.candidate import Candidate
    from tpu_tuner.metrics.paired import paired_speedup
    from tpu_tuner.runner.host_jobs import farewell
    from tpu_tuner.runner.hosts import HostGroup
    from tpu_tuner.runner.multi_host import MultiHostTrialRunner
    from tpu_tuner.runner.ranked_runner import RankedTrialRunner
    from tpu_tuner.runner.requests import MeasureRequest
    from tpu_tuner.tuning.options.tune_options import default_trial_settings

    def request(layout: str) -> MeasureRequest:
        return MeasureRequest(
            candidate=Candidate(layout=layout).to_dict(),
            settings=default_trial_settings(),
            peak_flops_per_s={"float32": 1e11},
            model_flops_per_step=1e8,
        )

    # Two simulated hosts of one core each against one host of both: each host's ranks run on its
    # own cores (the launcher gives a rank its share of the cores its affinity allows).
    everything = os.sched_getaffinity(0)
    if len(everything) < 2:
        raise SystemExit("needs 2 cores: one for each simulated host")
    first, second = sorted(everything)[:2]
    host_cores = {"1 host x 2 ranks": {first, second}, "2 hosts x 1 rank": {first}}
    port, study = _free_port(), f"bench-{uuid.uuid4().hex[:8]}"
    folder = Path(tempfile.mkdtemp(prefix="tpu-tune-bench-hosts-"))
    follower = _follower(args.model, port, study, folder / "b", "--node-rank", "1", cores={second})
    group = HostGroup(f"127.0.0.1:{port}", study, nnodes=2, nproc=1, timeout_s=120, node_rank=0)
    started = time.perf_counter()
    group.join()
    print(f"2 hosts met at 127.0.0.1:{port} in {time.perf_counter() - started:.1f} s (agent start-up included)")
    shapes = {
        "1 host x 2 ranks": RankedTrialRunner(args.model, "cpu", 2, timeout_s=600),
        "2 hosts x 1 rank": MultiHostTrialRunner(args.model, "cpu", group, timeout_s=600),
    }
    for runner in shapes.values():
        runner.device_kind = "cpu"
    walls = {(shape, layout): [] for shape in shapes for layout in LAYOUTS}
    steps = {(shape, layout): [] for shape in shapes for layout in LAYOUTS}
    try:
        runs = [(shape, layout) for layout in LAYOUTS for shape in shapes]
        for round_index in range(args.rounds):
            for shape, layout in runs[round_index % len(runs) :] + runs[: round_index % len(runs)]:
                os.sched_setaffinity(0, host_cores[shape])  # this process launches the shape's (first) host
                result = shapes[shape].run(request(layout))
                if not result.ok:
                    raise SystemExit(f"{shape} {layout} failed in round {round_index + 1}: {result.failure.message}")
                walls[shape, layout].append(result.seconds)
                steps[shape, layout].append(result.value.step_median)
    finally:
        os.sched_setaffinity(0, everything)
        farewell(group, "the benchmark is done", failed=False)
        group.close()
        for runner in shapes.values():
            runner.close()
        follower.wait(timeout=60)
    print(f"\n{args.model}, {args.rounds} interleaved rounds, one measure job (a trial) per shape and layout a round:")
    for layout in LAYOUTS:
        for shape in shapes:
            print(
                f"  {layout} {shape}: trial wall {statistics.median(walls[shape, layout]):6.2f} s "
                f"(median; {min(walls[shape, layout]):.2f}-{max(walls[shape, layout]):.2f}), step "
                f"{statistics.median(steps[shape, layout]) * 1e3:7.1f} ms (median of rounds' medians)"
            )
        one, two = "1 host x 2 ranks", "2 hosts x 1 rank"
        extra = [b - a for a, b in zip(walls[one, layout], walls[two, layout])]
        print(
            f"  {layout} spanning hosts adds {statistics.median(extra):+.2f} s a trial (paired median); "
            f"step 2 hosts against 1 host: {paired_speedup(steps[one, layout], steps[two, layout]).describe()}"
        )


def kill(args: argparse.Namespace) -> None:
    import optuna

    from tpu_tuner.studies.study_trial import StudyTrial

    root = Path(tempfile.mkdtemp(prefix="tpu-tune-bench-kill-"))
    study = f"kill-{uuid.uuid4().hex[:8]}"
    flags = [
        "--storage",
        f"sqlite:///{root / 'study.db'}",
        "--trials",
        str(args.trials),
        "--verify-rounds",
        "2",
        "--space",
        str(REPO / "tests" / "fixtures" / "layout_space.toml"),
        "--time-budget",
        "none",
        "--no-prune",
    ]

    def pair() -> tuple[subprocess.Popen, subprocess.Popen, int]:
        port = _free_port()
        a = _follower(args.model, port, study, root / "a", *flags)
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        return a, _follower(args.model, port, study, root / "b", *flags), port

    def stored() -> list[optuna.trial.FrozenTrial]:
        return optuna.load_study(study_name=study, storage=f"sqlite:///{root / 'study.db'}").get_trials()

    started = time.perf_counter()
    a, b, _ = pair()
    while "] running" not in (root / "a" / "out.txt").read_text().partition("[trial 2/")[2]:
        if a.poll() is not None:
            raise SystemExit((root / "a" / "out.txt").read_text())
        time.sleep(0.2)
    time.sleep(3.0)  # mid-trial
    killed_at = time.perf_counter()
    os.kill(b.pid, signal.SIGKILL)
    b.wait()
    status = a.wait(timeout=600)
    print(
        f"killed node 1 (pid {b.pid}) {killed_at - started:.0f} s in; the driver exited {status} "
        f"{time.perf_counter() - killed_at:.1f} s later:"
    )
    print("  " + [line for line in (root / "a" / "out.txt").read_text().splitlines() if "error" in line][-1])
    before = stored()
    done = {t.number: t.params for t in before if t.state.name == "COMPLETE"}
    for t in StudyTrial.all(before):
        if t.failure is not None and t.failure.kind:
            print(f"  trial {t.number} {t.params}: {t.failure.kind}: {t.failure.message}")
    print(
        f"  before the relaunch: {len(done)} measured ({sorted(done)}), "
        f"{sum(t.state.name == 'WAITING' for t in before)} queued"
    )
    relaunched = time.perf_counter()
    a, b, _ = pair()
    print(
        f"relaunched: driver exited {a.wait(timeout=1800)}, follower {b.wait(timeout=120)}, "
        f"{time.perf_counter() - relaunched:.0f} s"
    )
    after = stored()
    kept = {t.number: t.params for t in after if t.number in done}
    measured = Counter(
        tuple(sorted(t.params.items())) for t in StudyTrial.all(after) if t.state.name == "COMPLETE" and not t.is_repeat
    )
    print(
        f"  earlier measurements kept: {kept == done}; measured settings {sum(measured.values())} "
        f"(budget {args.trials}); measured twice: {[dict(k) for k, n in measured.items() if n > 1] or 'none'}"
    )
    for t in StudyTrial.all(after):
        if t.number not in done and t.state.name == "COMPLETE":
            print(f"  trial {t.number} {t.params} on {list(t.claims.hosts) or None}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("trials", "kill"))
    parser.add_argument("--model", default=str(REPO / "examples" / "gpt.py"))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    (trials if args.part == "trials" else kill)(args)


if __name__ == "__main__":
    main()
