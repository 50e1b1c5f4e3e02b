"""The buffers gloo allocates for FSDP2's collectives, in a rank's estimate (execution/gloo_buffers.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tpu_tuner.devices import get_backend  # noqa: E402
from tpu_tuner.execution.gloo_buffers import WorkerBuffers, as_gloo  # noqa: E402
from tpu_tuner.execution.heap_model import MMAP_THRESHOLD_MAX  # noqa: E402
from tpu_tuner.execution.rank_memory import estimate_rank_memory, fake_group  # noqa: E402
from tpu_tuner.knobs.candidate import Candidate  # noqa: E402
from tpu_tuner.model.workloads.loader import load_workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024


def _tracked_peak(collective: str, gloo: bool) -> tuple[int, WorkerBuffers | None]:
    """The tensor peak torch's tracker sees over one collective of 1 MiB per rank on the fake group."""
    import contextlib

    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    with fake_group(0, 2), as_gloo(2) if gloo else contextlib.nullcontext() as workers, FakeTensorMode():
        whole, shard = torch.empty(MIB // 2), torch.empty(MIB // 4)  # 2 MiB and 1 MiB of float32
        tracker = MemTracker()
        tracker.track_external(whole, shard)
        with tracker:
            if collective == "reduce_scatter":
                dist.reduce_scatter_single(shard, whole)
            else:
                dist.all_gather_single(whole, shard)
        peak = max(snap["Total"] for snap in tracker.get_tracker_snapshot("peak").values())
    return int(peak), workers


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_on_gloo_a_collective_holds_a_copy_of_the_whole_message_on_the_calling_thread(collective: str) -> None:
    fake, _ = _tracked_peak(collective, gloo=False)
    real, workers = _tracked_peak(collective, gloo=True)
    assert fake == 3 * MIB  # the fake group allocates nothing of its own
    assert real == fake + 2 * MIB  # gloo: the reduce-scatter's clone of its input, the all-gather's flat output
    assert workers is not None
    # The all-gather's worker gathers into a flat tensor of the whole output too.
    assert workers.sizes == ([2 * MIB] if collective == "all_gather" else [])
    assert not torch.distributed.is_initialized()


def test_each_worker_thread_keeps_the_largest_buffer_its_arena_served() -> None:
    assert WorkerBuffers(2, [3 * MIB, 9 * MIB, 3 * MIB]).arena_bytes() == 18 * MIB
    # A buffer over glibc's largest mmap threshold is mapped and returned when freed: not kept.
    assert WorkerBuffers(2, [2 * MMAP_THRESHOLD_MAX, MIB]).arena_bytes() == 2 * MIB
    assert WorkerBuffers(2, []).arena_bytes() == 0


@pytest.mark.slow  # two FSDP estimates on the fake group: about 8 s on 2 cores
def test_an_fsdp_rank_on_gloo_estimates_gloo_s_buffers_and_one_on_another_group_does_not(monkeypatch) -> None:
    workload, backend = load_workload(str(ROOT / "tests" / "fixtures" / "tiny_llama.py")), get_backend("cpu")
    backend.ranks = 2
    try:
        gloo = estimate_rank_memory(workload, backend, Candidate(layout="1x2x1"), None, None, 0, 2)
        monkeypatch.setattr(type(backend), "process_group_backend", "nccl")
        other = estimate_rank_memory(workload, backend, Candidate(layout="1x2x1"), None, None, 0, 2)
    finally:
        backend.ranks = 1
    assert gloo.step_bytes and other.step_bytes and gloo.peak_bytes and other.peak_bytes
    assert other.arena_bytes == 0 and gloo.arena_bytes > 0
    assert gloo.step_bytes >= other.step_bytes  # the calling thread's copies may raise the peak
    assert len(gloo.changes) > len(other.changes)  # they are among the storage changes replayed


RANKS = textwrap.dedent(
    """
    import os, sys
    import torch, torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
    whole, shard = torch.empty(1 << 20), torch.ones(1 << 19)  # 4 MiB gathered, 2 MiB a rank
    dist.all_gather_single(whole, shard)  # the group's first call sets up its connections
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        dist.all_gather_single(whole, shard)
        dist.reduce_scatter_single(shard, whole)
    if rank == 0:  # the calling thread: the one the collectives' own events are on
        calling = {e.thread for e in prof.events() if e.name.startswith("c10d::")}
        # The allocations themselves (an event's usage counts its children's too).
        leaves = ("aten::empty", "aten::empty_strided")
        print(sorted((e.name, e.cpu_memory_usage) for e in prof.events() if e.name in leaves and e.thread in calling))
    dist.destroy_process_group()
    """
)


@pytest.mark.slow  # two gloo ranks: about 10 s on 2 cores
def test_gloo_s_collectives_allocate_the_whole_message_on_the_calling_thread(tmp_path: Path) -> None:
    """What `as_gloo` stands for, read from the installed torch: the all-gather's flat output and
    the reduce-scatter's clone, each the whole message, on the calling thread."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    store = tmp_path / "store"
    ranks = [
        subprocess.Popen([sys.executable, str(script), str(r), str(store)], stdout=subprocess.PIPE, text=True)
        for r in (0, 1)
    ]
    out = [p.communicate(timeout=120)[0] for p in ranks]
    assert all(p.returncode == 0 for p in ranks), out
    # The all-gather's flat output (aten::empty) and the reduce-scatter's clone (empty_strided).
    assert out[0].strip() == str([("aten::empty", 4 * MIB), ("aten::empty_strided", 4 * MIB)])
