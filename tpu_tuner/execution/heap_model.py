"""The resident memory glibc's malloc keeps for a step's tensors, from their order of allocation.

A CPU tensor's storage comes from malloc. glibc serves a request at or above its mmap threshold
with a fresh mapping, returned to the system when freed; a smaller one from the heap, whose freed
chunks stay resident for the next request. The threshold starts at 128 KiB and rises to the size of
each mapped chunk freed, up to 32 MiB (the dynamic threshold of mallopt(3), M_MMAP_THRESHOLD:
https://man7.org/linux/man-pages/man3/mallopt.3.html). So after a step's first large frees, most of
its activations come from the heap, and the heap stays as large as the most it ever held at once:
the process's resident set is the heap's high-water mark plus the mapped tensors alive now, which
is more than the peak of live tensors when the two peak at different times.

`replay` runs a step's allocations and frees through that model. It leaves out chunk headers
and fragmentation (a freed chunk too small for the next request), so it is a lower bound on what
glibc holds: the estimate replays the same changes through the process's own malloc
(`malloc_replay.py`) and keeps this model as its floor and for where that cannot run;
docs/tuning.md ("Memory before measurement") has the measured errors of both.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MMAP_THRESHOLD_START = 128 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MIN
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit hosts


@dataclass(frozen=True)
class Change:
    """One storage's bytes changing: allocated (`before` 0), freed (`after` 0) or resized."""

    storage: int  # an identity, the same for every change of one storage
    before: int
    after: int
    timed: bool = False  # inside the step whose peak is measured (the warm one)


@dataclass(frozen=True)
class Peaks:
    """The most bytes held at once during the timed changes: by the heap and the live mapped
    tensors (`resident`, what the process's resident set counts), and by live tensors (`live`)."""

    resident: int
    live: int

    @property
    def retained(self) -> int:
        """What the heap keeps beyond the tensors' own peak."""
        return self.resident - self.live


def replay(changes: Iterable[Change], free_heap_bytes: int = 0) -> Peaks:
    """The changes replayed in glibc's model. `free_heap_bytes`: heap already resident and free
    when the step starts (mallinfo2's fordblks), which the step's first heap requests reuse before
    the heap grows (and which its mapped tensors cannot use)."""
    threshold = MMAP_THRESHOLD_START
    mapped: dict[int, int] = {}  # storage -> bytes of a live mapping
    in_heap: dict[int, int] = {}  # storage -> bytes of a live heap chunk
    heap_live = mapped_live = 0
    heap_high = free_heap_bytes
    resident = live = 0
    for change in changes:
        old = mapped.pop(change.storage, None)
        if old is not None:
            mapped_live -= old
            if threshold < old <= MMAP_THRESHOLD_MAX:
                threshold = old  # glibc's dynamic threshold follows the mapped chunk freed
        else:
            heap_live -= in_heap.pop(change.storage, 0)
        if change.after > 0:
            if change.after >= threshold:
                mapped[change.storage] = change.after
                mapped_live += change.after
            else:
                in_heap[change.storage] = change.after
                heap_live += change.after
                heap_high = max(heap_high, heap_live)
        if change.timed:
            resident = max(resident, heap_high + mapped_live)
            live = max(live, heap_live + mapped_live)
    return Peaks(resident, live)
