"""The resident set glibc's malloc keeps for a step's tensors (execution/heap_model.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tpu_tuner.execution.heap_model import MMAP_THRESHOLD_MAX, Change, replay

KIB, MIB = 1024, 1024 * 1024
ROOT = Path(__file__).resolve().parents[1]


def alloc(storage: int, size: int, timed: bool = False) -> Change:
    return Change(storage, 0, size, timed)


def free(storage: int, size: int, timed: bool = False) -> Change:
    return Change(storage, size, 0, timed)


def test_after_a_large_free_smaller_tensors_come_from_the_heap_and_stay_resident() -> None:
    changes = [
        alloc(1, 8 * MIB),  # mapped (over the 128 KiB start), freed: the threshold rises to 8 MiB
        free(1, 8 * MIB),
        alloc(2, 4 * MIB),  # now from the heap, and its chunk stays when freed
        free(2, 4 * MIB),
        alloc(3, 16 * MIB, timed=True),  # mapped: on top of the heap's 4 MiB
    ]
    assert replay(changes).resident == 20 * MIB
    assert replay(changes).live == 16 * MIB and replay(changes).retained == 4 * MIB
    # Without the first free the threshold stays at 128 KiB: both are mapped, freed at once.
    assert replay(changes[2:]).resident == 16 * MIB


def test_the_threshold_stops_rising_at_32_mib() -> None:
    big = 2 * MMAP_THRESHOLD_MAX
    changes = [alloc(1, big), free(1, big), alloc(2, 4 * MIB), free(2, 4 * MIB), alloc(3, 1 * MIB, timed=True)]
    assert replay(changes).resident == 1 * MIB  # both stayed mapped: nothing left in the heap


def test_free_heap_is_reused_by_small_requests_but_not_by_mapped_ones() -> None:
    small = [alloc(1, 64 * KIB, timed=True), alloc(2, 64 * KIB, timed=True)]
    assert replay(small, free_heap_bytes=10 * MIB).resident == 10 * MIB  # fits in the free heap
    mapped = [alloc(1, 40 * MIB, timed=True)]
    assert replay(mapped, free_heap_bytes=10 * MIB).resident == 50 * MIB


def test_only_the_timed_changes_count_but_the_heap_they_inherit_does() -> None:
    changes = [
        alloc(1, 1 * MIB),
        free(1, 1 * MIB),  # threshold 1 MiB
        alloc(2, 512 * KIB),
        alloc(3, 512 * KIB),
        free(2, 512 * KIB),
        free(3, 512 * KIB),  # the heap held 1 MiB at once
        alloc(4, 256 * KIB, timed=True),
    ]
    assert replay(changes).resident == 1 * MIB
    assert replay(changes[:-1]).resident == 0  # nothing timed: no peak


def test_a_resize_frees_and_allocates_the_storage() -> None:
    # FSDP2 frees a gathered parameter by resizing its storage to 0 and gathers it again by a resize.
    changes = [alloc(1, 2 * MIB), Change(1, 2 * MIB, 0), Change(1, 0, 2 * MIB, timed=True)]
    assert replay(changes).resident == 2 * MIB


# Each replay in a fresh interpreter (no torch): pytest's process, or an earlier replay, leaves
# freed heap of its own that would serve the requests. A chunk mapped and freed raises glibc's
# threshold to 8 MiB; then 16 pairs of 1 MiB chunks from the heap, the first of each pair freed:
# 16 holes of 1 MiB. Eight 2 MiB requests (timed, then freed: a step's temporaries) fit in none
# of the holes when the pairs interleave, so the heap grows by 16 MiB more; they fit in the one
# hole of 16 MiB when the freed chunks were allocated together. The replay requests 64-byte
# alignment, so glibc splits a small remainder off each chunk; with its per-thread cache on, how many
# remainders it keeps (blocking the holes' merging) depends on the interpreter's start-up heap, which
# moved with the checkout's path (40 MiB instead of 32 in one clone). The cache is off in these runs.
FRAGMENTED = """
import json, sys
from tpu_tuner.execution.heap_model import Change, replay
from tpu_tuner.execution.malloc_replay import heap_growth

MIB = 1024 * 1024
interleaved, repeats = sys.argv[1] == "interleaved", int(sys.argv[2])
first, second = list(range(10, 26)), list(range(30, 46))
order = [s for pair in zip(first, second) for s in pair] if interleaved else first + second
step = [Change(1, 0, 8 * MIB), Change(1, 8 * MIB, 0)] + [Change(s, 0, MIB) for s in order]
step += [Change(s, MIB, 0) for s in first]
step += [Change(50 + i, 0, 2 * MIB, True) for i in range(8)] + [Change(50 + i, 2 * MIB, 0, True) for i in range(8)]
print(json.dumps({"model": replay(step).resident, "malloc": heap_growth(step, repeats)}))
"""


def fragmented(order: str, repeats: int) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", FRAGMENTED, order, str(repeats)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT), "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"},
    )
    found: dict[str, int] = json.loads(done.stdout)
    return found


def test_the_replay_through_malloc_sees_the_fragmentation_the_model_leaves_out() -> None:
    interleaved, together = fragmented("interleaved", 1), fragmented("together", 1)
    assert interleaved["model"] == together["model"] == 32 * MIB  # the model reuses every freed byte
    # glibc's own heap: 48 MiB where the holes are too small, 32 where they are one (its padding,
    # and a request that a chunk's alignment pushes beyond the hole, aside).
    assert 47 * MIB <= interleaved["malloc"] <= 49 * MIB, interleaved
    assert 31 * MIB <= together["malloc"] <= 35 * MIB, together
    # The timed step replayed again frees what it allocated: not a step's more. Within a MiB of one
    # replay, not "no less": two processes' heaps differ by pages (one run of the quick suite under
    # load measured 16 KiB less after three replays than after one).
    repeated = fragmented("interleaved", 3)["malloc"]
    assert interleaved["malloc"] - MIB <= repeated < 64 * MIB, repeated
