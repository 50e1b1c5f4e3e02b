"""Many workers, one study (issue 15): the storage's cost per trial, and a 12-trial study on 1 and
on 2 workers.

1. **Storage overhead per trial.** The real search loop (`run_search`, TPE as tpu-tune builds it)
   runs on one study with a runner that answers every "measure" job at once with a realistic
   `Measurement` (50 timed samples, a training step's accuracy errors): each trial does what a
   real one does in the storage (ask, its claim: worker and host, a heartbeat, the loop's
   `fail_lost_trials` and `get_trials`, the measurement's record and constraint, tell) and
   nothing else. Per-trial milliseconds = wall time / measured trials, for an in-memory study
   (no storage: the loop and the sampler alone), SQLite (a file in a temporary folder) and
   PostgreSQL (a loopback server, tests/helpers/postgres_server.py); the storages alternate, repeated.
   The same on PostgreSQL and SQLite with 2 workers (forked processes, started together on one
   study; wall from the start to the last one's end).
2. **A 12-trial study on 1 and on 2 workers.** Separate `tune` processes on one PostgreSQL study
   (`--study`), the model tests/fixtures/synthetic_speed.py (it sleeps 3-18 ms a step, so the
   2 cores are not what limits), a 12-setting space on a 2-core host (matmul precision x
   autocast x intra-op threads `all`/`1`; 18 settings where `half` is not 1 thread; no agents:
   every setting measured; budget 12), about 1.5 s of timed steps a trial, 4
   verification rounds, no warm start. 1-worker and 2-worker studies alternate (fresh study names);
   wall time from starting the processes to the last one's exit, and its phases from the
   workers' progress lines (timestamped here).

    python benchmarks/studies/many_workers.py [--trials 40 --repeats 5] [--study-repeats 3] [--only overhead|study]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tpu_tuner.tuning.options.tune_options import (
    ObjectiveOptions,
    OutputOptions,
    RunnerOptions,
    SearchOptions,
    StoreOptions,
)

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

STUDY_SPACE = """\
# benchmarks/studies/many_workers.py: 12 settings on a 2-core CPU (intra_op_threads: all, 1)
[space]
name = "many-workers"

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
choices.cpu = ["all", "half", "1"]
"""

# --- 1. storage overhead per trial ---------------------------------------------------------------


class InstantRunner:
    """Answers every "measure" job at once with a realistic measurement of the asked setting."""

    workers_started = 0

    def check_usable(self) -> None:
        pass  # the Runner protocol: every job can run here

    def run(self, request, env=None, timeout_s=None):
        from tpu_tuner.execution.measurement import Measurement
        from tpu_tuner.runner.trial_runner import JobResult

        samples = [0.2 + 0.001 * (i % 7) for i in range(50)]
        m = Measurement(
            candidate=dict(request.candidate),
            step_median=0.2031,
            step_p10=0.2004,
            step_p90=0.2058,
            samples=samples,
            first_call_seconds=1.83,
            warmup_seconds=0.90,
            compile_seconds=1.36,
            compiles={"torch_compile_graphs": 1},
            model_flops_per_step=7.1e10,
            peak_flops_per_s=8.9e11,
            peak_dtype="bfloat16",
            mfu=0.174,
            peak_memory_bytes=1_148_354_560,
            accuracy_errors={"loss": 1.2e-3, "gradients": 2.9e-3},
            compute_dtype="float32",
        )
        return JobResult(value=m, seconds=0.001)


def _loop_options(trials: int):
    from tpu_tuner.tuning import TuneOptions

    return TuneOptions(search=SearchOptions(trials=trials, agents=(), sampler="tpe", seed=0))


def _space():
    from tpu_tuner.tuning.search.search_space import SearchSpace

    return SearchSpace.load("default", "cpu")  # thousands of settings: 40 trials never cover it


def _run_loop(url: str | None, name: str, trials: int, shared: bool) -> tuple[float, float, int, int, int]:
    """One worker's search loop on study `name`: (start, end, trials it measured, SQL statements
    it sent, transactions it committed), times as `time.time()` (comparable across processes and
    with the trials' completion times). The heartbeat thread's are counted too (same engine). A
    transaction costs a round trip or two besides its statements (BEGIN, COMMIT), which the
    statement count does not see."""
    import optuna

    from tpu_tuner.runner.requests import MeasureRequest
    from tpu_tuner.studies.liveness import Worker, open_storage
    from tpu_tuner.studies.study_trial import StudyTrial
    from tpu_tuner.tuning.search.seeding import build_sampler
    from tpu_tuner.tuning.search.trials import run_search

    space, options = _space(), _loop_options(trials)
    storage = open_storage(url, 1) if url else None
    study = optuna.load_study(
        study_name=name, storage=storage, sampler=build_sampler(options, space, shared=shared, first=not shared)
    )
    worker = Worker.this_process(storage)
    statements, commits = [0], [0]
    if storage is not None:
        from sqlalchemy import event

        def executed(connection, cursor, statement, *args) -> None:
            statements[0] += 1
            # The journal's statements are transactions of their own (autocommit): count its writes.
            autocommit = connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
            commits[0] += autocommit and statement.lstrip().upper().startswith(("INSERT", "UPDATE", "SELECT TPU_TUNE"))

        event.listen(storage.engine, "before_cursor_execute", executed)
        event.listen(storage.engine, "commit", lambda *args: commits.__setitem__(0, commits[0] + 1))
    started = time.time()
    run_search(
        study,
        space,
        [],
        InstantRunner(),
        MeasureRequest(),
        options,
        lambda event: None,
        time.perf_counter(),
        worker=worker,
    )
    ended = time.time()
    counted, committed = statements[0], commits[0]
    mine = sum(
        1 for t in StudyTrial.all(study.get_trials(deepcopy=False)) if t.claims.worker == worker.id and t.measured
    )
    if storage is not None:
        storage.engine.dispose()
    return started, ended, mine, counted, committed


def _child(url: str, name: str, trials: int, barrier, results) -> None:
    barrier.wait()
    results.put(_run_loop(url, name, trials, shared=True))


def overhead_once(url: str | None, trials: int, workers: int) -> tuple[float, float, float, float, float, float]:
    """Milliseconds per measured trial of one study of `trials` trials on `workers` workers:
    from the start to the last worker's end; to the last trial's completion (the difference: a
    worker that found the rest of the budget running elsewhere sleeps one poll, `Worker.poll_s`,
    before it looks again and ends); over the first and the last quarter of the trials (does a
    trial cost more as the study grows? the loop reads the whole study every trial); and the SQL
    statements sent and transactions committed per measured trial."""
    import optuna

    from tpu_tuner.runner.requests import MeasureRequest
    from tpu_tuner.studies.liveness import Worker, open_storage
    from tpu_tuner.studies.study_trial import StudyTrial
    from tpu_tuner.tuning.search.seeding import build_sampler
    from tpu_tuner.tuning.search.trials import run_search

    name = f"overhead-{uuid.uuid4().hex[:8]}"
    if url is None:  # in memory: one process, no storage, no heartbeat
        space, options = _space(), _loop_options(trials)
        study = optuna.create_study(direction="minimize", sampler=build_sampler(options, space))
        start = time.time()
        run_search(
            study,
            space,
            [],
            InstantRunner(),
            MeasureRequest(),
            options,
            lambda event: None,
            time.perf_counter(),
            worker=Worker.this_process(None),
        )
        spans = [(start, time.time(), sum(1 for t in StudyTrial.all(study.trials) if t.measured), 0, 0)]
        done = study.get_trials(deepcopy=False)
    else:
        storage = open_storage(url, 1)
        optuna.create_study(storage=storage, study_name=name, direction="minimize")
        storage.engine.dispose()
        if workers == 1:
            spans = [_run_loop(url, name, trials, shared=False)]
        else:
            context = multiprocessing.get_context("fork")
            barrier, results = context.Barrier(workers), context.Queue()
            children = [
                context.Process(target=_child, args=(url, name, trials, barrier, results)) for _ in range(workers)
            ]
            for child in children:
                child.start()
            spans = [results.get(timeout=600) for _ in children]
            for child in children:
                child.join()
        reader = open_storage(url, 1)
        done = optuna.load_study(study_name=name, storage=reader).get_trials(deepcopy=False)
        reader.engine.dispose()
    measured = sum(s[2] for s in spans)
    assert measured == trials, (measured, trials)
    start = min(s[0] for s in spans)
    told = sorted(
        t.datetime_complete.timestamp() for t in StudyTrial.all(done) if t.datetime_complete is not None and t.measured
    )
    quarter = max(1, trials // 4)
    first_q = (told[quarter - 1] - start) * 1e3 / quarter
    last_q = (told[-1] - told[-quarter - 1]) * 1e3 / quarter
    return (
        (max(s[1] for s in spans) - start) * 1e3 / measured,
        (told[-1] - start) * 1e3 / measured,
        first_q,
        last_q,
        sum(s[3] for s in spans) / measured,
        sum(s[4] for s in spans) / measured,
    )


def overhead(trials: int, repeats: int) -> None:
    from helpers.postgres_server import running_server

    with tempfile.TemporaryDirectory() as folder, running_server() as server:
        sqlite = f"sqlite:///{folder}/studies.db"
        configs = [
            ("in memory", None, 1),
            ("SQLite", sqlite, 1),
            ("PostgreSQL", server.url("tune"), 1),
            ("SQLite", sqlite, 2),
            ("PostgreSQL", server.url("tune"), 2),
        ]
        overhead_once(sqlite, 5, 1)  # warm up: imports, the schema created in both storages
        overhead_once(server.url("tune"), 5, 1)
        figures: dict[int, list[tuple[float, ...]]] = {i: [] for i in range(len(configs))}
        for repeat in range(repeats):
            for i, (_label, url, workers) in enumerate(configs):  # interleaved
                figures[i].append(overhead_once(url, trials, workers))
            print(
                f"repeat {repeat + 1}/{repeats} (load {_load()}): "
                + ", ".join(
                    f"{configs[i][0]} x{configs[i][2]} {figures[i][-1][0]:.1f} ({figures[i][-1][1]:.1f})"
                    for i in figures
                ),
                flush=True,
            )
    quarter = max(1, trials // 4)
    print(
        f"\nms per measured trial, {trials} trials a study, {repeats} interleaved repeats (median, min-max): wall "
        f"to the last worker's end; to the last trial told; over the first and the last {quarter} trials"
    )
    print(
        f"{'storage':12} {'workers':>7} {'to end':>8} {'range':>13} {'to last tell':>13} {'range':>13} "
        f"{'first ' + str(quarter):>9} {'last ' + str(quarter):>9} {'SQL/trial':>9} {'txn/trial':>9}"
    )
    for i, (label, _, workers) in enumerate(configs):
        ends, tells = [f[0] for f in figures[i]], [f[1] for f in figures[i]]
        print(
            f"{label:12} {workers:>7} {statistics.median(ends):8.1f} {f'{min(ends):.1f}-{max(ends):.1f}':>13} "
            f"{statistics.median(tells):13.1f} {f'{min(tells):.1f}-{max(tells):.1f}':>13} "
            f"{statistics.median(f[2] for f in figures[i]):9.1f} {statistics.median(f[3] for f in figures[i]):9.1f} "
            f"{statistics.median(f[4] for f in figures[i]):9.0f} {statistics.median(f[5] for f in figures[i]):9.0f}"
        )


# --- 2. a 12-trial study on 1 and 2 workers -------------------------------------------------------


def study_worker(study: str, out: str, storage: str, space: str) -> None:
    """One tune process of the shared study (run as `many_workers.py --_worker ...`)."""
    print(f"{time.time():.3f} [start] imported nothing yet", flush=True)
    from tpu_tuner.api import tune
    from tpu_tuner.profiling import ProfilerSettings
    from tpu_tuner.tuning.options.tune_options import TuneOptions

    settings = ProfilerSettings(
        warmup_min_steps=1,
        warmup_max_steps=3,
        timing_min_steps=10,
        timing_min_seconds=1.5,
        timing_max_steps=400,
        profiled_steps=1,
        top_operators=5,
        explained_share_min=0.5,
    )
    options = TuneOptions(
        search=SearchOptions(trials=12, sampler="tpe", agents=(), space=Path(space), warm_start=False),
        objective=ObjectiveOptions(verify_rounds=4),
        store=StoreOptions(url=storage, study=study),
        outputs=OutputOptions(out=Path(out)),
        runner=RunnerOptions(trial_settings=settings),
    )
    print(f"{time.time():.3f} [imported] tpu_tuner and torch", flush=True)
    result = tune(
        REPO / "tests" / "fixtures" / "synthetic_speed.py",
        options,
        progress=lambda event: print(f"{time.time():.3f} [{event.phase}] {event.message}", flush=True),
    )
    print(f"{time.time():.3f} [exit] verified={result.verified}", flush=True)


def _events(log: str) -> list[tuple[float, str, str]]:
    out = []
    for line in log.splitlines():
        stamp, _, rest = line.partition(" ")
        try:
            t = float(stamp)
        except ValueError:
            continue
        phase, _, message = rest.partition("] ")
        out.append((t, phase.lstrip("["), message))
    return out


def _phases(events: list[tuple[float, str, str]], start: float) -> dict[str, float]:
    """Seconds from the study's start to each milestone of one worker."""

    def first(pred) -> float | None:
        return next((t - start for t, p, m in events if pred(p, m)), None)

    def last(pred) -> float | None:
        found = [t - start for t, p, m in events if pred(p, m)]
        return found[-1] if found else None

    return {
        "imported": first(lambda p, m: p == "imported"),
        "profile": first(lambda p, m: p == "profile"),
        "budget": first(lambda p, m: p == "budget"),
        "first trial": first(lambda p, m: p == "trial" and m.startswith("running")),
        "last trial": last(lambda p, m: p == "trial" and not m.startswith(("running", "the rest"))),
        "verify": first(lambda p, m: p == "verify"),
        "exit": first(lambda p, m: p == "exit"),
    }


def _split(workers: list[dict[str, float]]) -> dict[str, float]:
    """One study's phases from its workers' milestones; they add up to the wall time."""
    start_up = min(p["profile"] for p in workers)  # the first "profile" line: profiling, or waiting for it
    profiled = min(p["budget"] for p in workers)  # the first worker's budget line follows its profile
    search_end = max(p["last trial"] for p in workers)
    wall = workers[0]["wall"]
    return {
        "start-up": start_up,
        "profile": profiled - start_up,
        "search": search_end - profiled,
        "end": wall - search_end,
        "wall": wall,
    }


def study_once(url: str, workers: int, space: Path, out: Path) -> tuple[float, list[dict[str, float]], int]:
    """Wall seconds of one 12-trial study on `workers` processes; each worker's milestones; and
    the settings measured."""
    import optuna

    from tpu_tuner.studies.study_trial import StudyTrial

    name = f"mw{workers}-{uuid.uuid4().hex[:8]}"
    logs = [out / f"{name}-{i}.log" for i in range(workers)]
    env = {k: v for k, v in os.environ.items() if k != "TPU_TUNE_STORAGE"}
    start = time.time()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--_worker", name, str(out), url, str(space)],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        for log in logs
    ]
    codes = [p.wait(timeout=900) for p in procs]
    wall = time.time() - start
    if any(codes):
        raise SystemExit(f"a worker failed ({codes}): see {logs}")
    phases = [_phases(_events(log.read_text()), start) for log in logs]
    from tpu_tuner.studies.liveness import read_storage  # the journal on PostgreSQL

    trials = optuna.load_study(study_name=name, storage=read_storage(url)).get_trials(deepcopy=False)
    measured = sum(1 for t in StudyTrial.all(trials) if t.measured and not t.is_repeat)
    return wall, phases, measured


def studies(repeats: int) -> None:
    from helpers.postgres_server import running_server

    with tempfile.TemporaryDirectory() as folder, running_server() as server:
        space = Path(folder) / "space.toml"
        space.write_text(STUDY_SPACE)
        url = server.url("tune")
        walls: dict[int, list[float]] = {1: [], 2: []}
        split: dict[int, list[list[dict[str, float]]]] = {1: [], 2: []}
        for repeat in range(repeats):
            for workers in (1, 2):  # interleaved
                wall, phases, measured = study_once(url, workers, space, Path(folder))
                walls[workers].append(wall)
                split[workers].append([{**p, "wall": wall} for p in phases])
                print(
                    f"repeat {repeat + 1}/{repeats}, {workers} worker(s): {wall:.1f} s, {measured} settings measured "
                    f"(load {_load()})",
                    flush=True,
                )
                for i, p in enumerate(phases):
                    print(
                        f"    worker {i}: " + ", ".join(f"{k} {v:.1f}" for k, v in p.items() if v is not None),
                        flush=True,
                    )
    print(
        "\nphases (s, median over repeats): start-up = processes started to the first worker's baseline "
        "profile starting (interpreter, torch and tpu_tuner imports, the trial worker loading the model); profile = "
        "the first worker's baseline profile (joiners wait for it); search = profile done to the last trial done, over "
        "the workers; end = last trial done to the last worker's exit (verification on one worker, "
        "the run folder's report and plots)"
    )
    print(f"{'workers':>7} {'start-up':>9} {'profile':>8} {'search':>7} {'end':>6} {'wall':>6}")
    for workers in (1, 2):
        rows = [_split(p) for p in split[workers]]
        print(
            f"{workers:>7} "
            + " ".join(
                f"{statistics.median(r[k] for r in rows):{w}.1f}"
                for k, w in (("start-up", 9), ("profile", 8), ("search", 7), ("end", 6), ("wall", 6))
            )
        )
    one, two = statistics.median(walls[1]), statistics.median(walls[2])
    ratios = [a / b for a, b in zip(walls[1], walls[2])]
    print(f"\n12-trial study on PostgreSQL, {repeats} interleaved repeats (s: median, min-max)")
    for workers in (1, 2):
        print(
            f"{workers} worker(s): {statistics.median(walls[workers]):6.1f}  "
            f"({min(walls[workers]):.1f}-{max(walls[workers]):.1f})"
        )
    print(f"speedup (median 1 / median 2): {one / two:.2f}x; per repeat {', '.join(f'{r:.2f}' for r in ratios)}")


def _load() -> str:
    """The 1-minute load average: above the workers' own share, something else ran alongside."""
    return f"{os.getloadavg()[0]:.2f}"


def main() -> None:
    # Stopped with SIGTERM: leave through the context managers (the PostgreSQL server is stopped).
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(143))
    if len(sys.argv) > 1 and sys.argv[1] == "--_worker":
        study_worker(*sys.argv[2:6])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40, help="trials of each storage-overhead study")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats of the storage overhead")
    parser.add_argument("--study-repeats", type=int, default=3, help="interleaved repeats of the 1- / 2-worker study")
    parser.add_argument("--only", choices=("overhead", "study"))
    args = parser.parse_args()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    amx = "amx_tile" in open("/proc/cpuinfo").read()
    print(f"host: {os.cpu_count()} CPUs, {cpu}, AMX {'yes' if amx else 'no'}")
    if args.only in (None, "overhead"):
        overhead(args.trials, args.repeats)
    if args.only in (None, "study"):
        print()
        studies(args.study_repeats)


if __name__ == "__main__":
    main()
