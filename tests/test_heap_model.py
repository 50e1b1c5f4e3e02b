"""The resident set glibc's malloc keeps for a step's tensors (execution/heap_model.py)."""

from __future__ import annotations

from tpu_tuner.execution.heap_model import MMAP_THRESHOLD_MAX, Change, replay

KIB, MIB = 1024, 1024 * 1024


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
