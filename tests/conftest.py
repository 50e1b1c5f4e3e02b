"""Shared test set-up: a private roofline cache, fast profiler settings, fixture paths."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tpu_tuner.profiling import ProfilerSettings

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep the roofline cache out of the user's home; measured once per test session."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TPU_TUNE_CACHE_DIR", str(tmp_path_factory.mktemp("tpu-tune-cache")))
    yield
    mp.undo()


@pytest.fixture
def fast_settings() -> ProfilerSettings:
    """Profiler settings that keep a tiny model's profile to about a second."""
    return ProfilerSettings(
        warmup_min_steps=2, warmup_max_steps=10, timing_min_steps=10, timing_min_seconds=0.0,
        timing_max_steps=50, profiled_steps=1, top_operators=5, explained_share_min=0.5,
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
