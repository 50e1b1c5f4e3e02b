"""Shared test set-up: a private roofline cache, fast profiler settings, fixture paths."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir

from tpu_tuner.execution.measurement import Measurement
from tpu_tuner.profiling import ProfilerSettings

if TYPE_CHECKING:
    from helpers.postgres_server import PostgresServer

    from tpu_tuner.devices.roofline import RooflineProbe

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLES = Path(__file__).parent.parent / "examples"


# The fuzz tests' budgets (tests/test_fuzz_*.py, docs/testing.md "Fuzzing"): a small one in the quick
# run, a large one (at least 10,000 inputs in all) with TPU_TUNE_FUZZ=full, as .ci/run's full pass sets.
# No example database: a failure prints the input and the seed that reproduce it.
FUZZ_EXAMPLES = {"quick": 60, "full": 1200}
for _name, _examples in FUZZ_EXAMPLES.items():
    settings.register_profile(
        f"fuzz-{_name}",
        max_examples=_examples,
        deadline=None,  # a loaded host's pauses are no finding
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture],
    )
# Hypothesis's own cache (.hypothesis/) goes to the temporary folder, not into the checkout.
set_hypothesis_home_dir(str(Path(tempfile.gettempdir()) / "tpu-tune-hypothesis"))
settings.load_profile("fuzz-full" if os.environ.get("TPU_TUNE_FUZZ") == "full" else "fuzz-quick")


MAX_XDIST_WORKERS = 4
# A run of this few named test files stays in the pytest process: a worker's start (torch
# imported again) costs about 10 s, more than such a run gains.
FILES_RUN_IN_PROCESS = 2


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n logical` (pyproject.toml): one worker per core this process may use, at most
    `MAX_XDIST_WORKERS` (every worker imports torch and starts model workers of its own, so a
    large host would otherwise spend its memory on dozens of them); none (0: in this process)
    for a run of one or two named test files."""
    files = {arg.split("::")[0] for arg in config.args}
    if all(name.endswith(".py") for name in files) and len(files) <= FILES_RUN_IN_PROCESS:
        return 0
    return max(1, min(len(os.sched_getaffinity(0)), MAX_XDIST_WORKERS))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A `timed` test is a slow one too (pyproject.toml's markers): .ci/run's slow passes select
    `slow and timed` (a pass of their own, after the rest) and `not timed` (the rest of the suite)."""
    loose = [item.nodeid for item in items if item.get_closest_marker("timed") and not item.get_closest_marker("slow")]
    if loose:
        raise pytest.UsageError(f"marked timed but not slow (pyproject.toml's markers): {loose}")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Longest first: xdist hands tests out in this order, so a slow test left to the end of a
        # pass would keep one worker busy while the other idles (docs/testing.md, "Longest first").
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def wait_until(condition: Callable[[], object], timeout_s: float, what: Callable[[], str] = lambda: "") -> None:
    """Poll `condition` until it holds; fail naming `what()` once `timeout_s` passes. The timeout is
    a bound for a stuck test on a loaded host, never the thing that makes the awaited event happen."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what()}"
        time.sleep(0.05)


class FakeClock:
    """A stand-in for a module's `time` (monotonic, sleep), moved by the test: the intervals a
    test checks are exact however loaded the host is."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep the roofline cache out of the user's home; measured once per test session."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TPU_TUNE_CACHE_DIR", str(tmp_path_factory.mktemp("tpu-tune-cache")))
    yield
    mp.undo()


def use_probe(monkeypatch: pytest.MonkeyPatch, cache_dir: Path, **figures: float) -> RooflineProbe:
    """Make `figures` (RooflineProbe fields: float32_flops_per_s, bfloat16_flops_per_s,
    medium_relative_error, ...) this machine's cached probe, in a private cache that worker
    processes inherit: tests decide which kind of host they run on, whatever this one is."""
    import json
    from dataclasses import asdict

    import torch

    from tpu_tuner.devices import roofline

    values = dict(
        float32_flops_per_s=300e9,
        bfloat16_flops_per_s=1200e9,
        copy_bytes_per_s=20e9,
        matmul_size=8,
        copy_bytes=8,
        repeats=1,
        measured_at="injected",
        dispatch_seconds_per_op=1e-6,
        medium_relative_error=2.5e-3,
        measured_at_epoch=time.time(),
    )
    values.update(figures)
    probe = roofline.RooflineProbe(**values)
    monkeypatch.setenv("TPU_TUNE_CACHE_DIR", str(cache_dir))
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = roofline.machine_key(torch.device("cpu"))
    (cache_dir / "roofline.json").write_text(json.dumps({key: asdict(probe)}))
    return probe


@pytest.fixture
def fast_settings() -> ProfilerSettings:
    """Profiler settings that keep a tiny model's profile to about a second."""
    return ProfilerSettings(
        warmup_min_steps=2,
        warmup_max_steps=10,
        timing_min_steps=10,
        timing_min_seconds=0.0,
        timing_max_steps=50,
        profiled_steps=1,
        top_operators=5,
        explained_share_min=0.5,
    )


@contextmanager
def serving(root: Path) -> Iterator:
    """A dashboard server for `root` on a free loopback port, serving from a thread until the block ends."""
    from tpu_tuner.dashboard import make_server

    server = make_server(root, port=0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every figure the dashboard's page embeds, as drawn (captured on its way to a PNG)."""
    import tpu_tuner.dashboard.plots as plots

    drawn: list[Any] = []
    to_png = plots.to_data_uri

    def capture(fig: Any) -> str:
        uri = to_png(fig)  # draws it: tick labels and legends exist from here on
        drawn.append(fig)
        return uri

    monkeypatch.setattr(plots, "to_data_uri", capture)
    return drawn


def processes_running(marker: str) -> list[int]:
    """The pids of this host's processes whose command line holds `marker` (not this one) and that
    were started by this pytest worker: what a test of process clean-up expects to be empty.

    Under xdist another worker may be running the same kind of child at this moment, so a process
    counts only when its environment carries this worker's PYTEST_XDIST_WORKER (children inherit
    it; an orphan that outlived its parent still has it)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if marker not in cmdline:
                continue
            environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if worker is None or f"PYTEST_XDIST_WORKER={worker}".encode() in environment:
            found.append(int(pid))
    return found


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server on a free loopback port for the session (tests/helpers/postgres_server.py)."""
    from helpers.postgres_server import running_server

    with running_server() as server:
        yield server


def steady_measurement(candidate: dict, step: float, **fields: Any) -> Measurement:
    """A trial's measurement of `candidate` whose every step took `step` seconds (no compile, an
    MFU of 10% of a 1 FLOP/s peak, no accuracy figure): the tests' stand-in for a worker's, with
    `fields` replacing any of it."""
    values: dict[str, Any] = dict(
        candidate=candidate,
        step_median=step,
        step_p10=step,
        step_p90=step,
        samples=[step],
        first_call_seconds=step,
        warmup_seconds=0.0,
        compile_seconds=0.0,
        compiles={},
        model_flops_per_step=1.0,
        peak_flops_per_s=1.0,
        peak_dtype="float32",
        mfu=0.1,
        peak_memory_bytes=None,
        accuracy_errors={},
    )
    return Measurement(**{**values, **fields})
