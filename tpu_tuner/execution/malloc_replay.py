"""What a step's storages make glibc's heap grow by, found by replaying them through this process's
own malloc: every allocation and free of the fake step, in order, with nothing written.

`heap_model.replay` follows glibc's mmap threshold but lets every freed heap byte serve the next
request, so it leaves out fragmentation: a freed chunk that is too small for the next request,
or split by one, while the heap grows beside it. The real allocator places chunks as it will for
the real step, on the heap this process holds now (its free chunks, its top, its threshold), so the
growth it shows includes that fragmentation. The storages are requested as torch's CPU allocator
requests them (`posix_memalign`, 64-byte alignment) and never touched: a page becomes resident
only when written, so the replay costs address space, not memory; glibc writes only the chunk
headers. The growth is read as the main heap's break (`sbrk(0)`, what a heap pushed beyond its
top will make resident) plus the live chunks glibc mapped on their own, at each timed change.

The steady state is what the timed steps measure, after the first call and the warm-up, so the
timed step is replayed `repeats` times, each repetition freeing the storages the one before left
(matched by size in order of allocation). Measured on the examples (docs/tuning.md, "Memory before
measurement"); what it still leaves out: a kernel's scratch outside the dispatcher and the small
objects (Python's, autograd's) that the real step places between the storages.
"""

from __future__ import annotations

import ctypes
import threading
from array import array
from collections import defaultdict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from tpu_tuner.execution.heap_model import Change

ALIGNMENT = 64  # c10's CPU allocator: posix_memalign(64, nbytes) (c10/core/impl/alloc_cpu.cpp)
IS_MMAPPED = 0x2  # the chunk header's bit glibc sets on a chunk it mapped on its own
# Timed steps replayed: the steady state follows the first step's frees. Measured on llama
# (one process): the growth was 150 MiB at 1, 2 and 3, 152 at 5; at 3 it costs 5-10 ms.
REPEATS = 3
NONE = -1  # no chunk in an operation's slot


@dataclass(frozen=True)
class Plan:
    """The replay as operations on numbered chunks, all worked out before the first request: the
    replay's own bookkeeping then allocates nothing from the heap it measures (a dictionary
    growing mid-replay would take a chunk from a hole the next request might have used)."""

    allocate: list[int]  # the slot allocated by each operation (NONE: none)
    sizes: list[int]  # its bytes
    release: list[int]  # the slot freed after it (NONE: none): a resize allocates first
    timed: list[bool]
    slots: int


def plan(changes: Sequence[Change], repeats: int = REPEATS) -> Plan:
    """`changes`, then the timed ones `repeats - 1` times more, each repetition freeing the
    storages the one before left alive (matched by size in order of allocation)."""
    slot_of: dict[Hashable, int] = {}
    allocate: list[int] = []
    sizes: list[int] = []
    release: list[int] = []
    timed: list[bool] = []

    def add(key: Hashable, change: Change, is_timed: bool) -> None:
        old = slot_of.pop(key, NONE) if change.before > 0 else NONE
        new = NONE
        if change.after > 0:
            new = slot_of[key] = len(allocate)  # the operation's number: one a chunk
        allocate.append(new)
        sizes.append(change.after)
        release.append(old)
        timed.append(is_timed)

    for change in changes:
        add((0, change.storage), change, change.timed)
    steady = [c for c in changes if c.timed]
    made_here = {c.storage for c in steady if c.before == 0 and c.after > 0}
    for repetition in range(1, repeats):
        # The storages the previous repetition left alive, by size in allocation order: the
        # next step frees them as the recorded step freed the ones before it.
        left: dict[int, deque[Hashable]] = defaultdict(deque)
        for c in steady:
            if c.storage in made_here and (repetition - 1, c.storage) in slot_of:
                left[c.after].append((repetition - 1, c.storage))
        for c in steady:
            key: Hashable = (repetition, c.storage)
            if c.storage not in made_here:
                key = left[c.before].popleft() if left.get(c.before) else (0, c.storage)
            add(key, c, True)
    return Plan(allocate, sizes, release, timed, len(allocate))


def heap_growth(changes: Sequence[Change], repeats: int = REPEATS) -> int | None:
    """The most the heap's top and the live mapped chunks grow by over the timed changes (bytes;
    below 0 where the step fits in the free heap and glibc trims its top), or None where they
    cannot be replayed here (not glibc, not the main thread whose heap `sbrk` reads, or a request
    the address space refuses); everything replayed is freed before it returns."""
    if not changes or threading.current_thread() is not threading.main_thread():
        return None  # another thread allocates from another arena than the break shows
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not hasattr(libc, "mallinfo2"):  # not glibc >= 2.33, whose chunk headers are read here
        return None
    return _run(libc, plan(changes, repeats))


def _run(libc: ctypes.CDLL, steps: Plan) -> int | None:
    memalign, free, sbrk = libc.posix_memalign, libc.free, libc.sbrk
    memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
    free.argtypes = [ctypes.c_void_p]
    sbrk.restype, sbrk.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t]
    word = ctypes.sizeof(ctypes.c_size_t)
    # Preallocated before the first request (see `Plan`): address and mapped bytes by slot.
    addresses = array("Q", bytes(8 * steps.slots))
    mapped_of = array("Q", bytes(8 * steps.slots))
    address = ctypes.c_void_p()
    start = int(sbrk(0) or 0)
    mapped = 0
    peak: int | None = None
    failed = False
    try:
        for new, size, old, timed in zip(steps.allocate, steps.sizes, steps.release, steps.timed, strict=True):
            if new != NONE:
                if memalign(ctypes.byref(address), ALIGNMENT, size) or not address.value:
                    failed = True
                    break
                addresses[new] = address.value
                # glibc's chunk header sits a word before the address; its IS_MMAPPED bit says
                # the chunk is a mapping of its own (returned when freed), not part of the heap.
                if ctypes.c_size_t.from_address(address.value - word).value & IS_MMAPPED:
                    mapped_of[new] = size
                    mapped += size
            if old != NONE and addresses[old]:
                free(addresses[old])
                mapped -= mapped_of[old]
                addresses[old] = mapped_of[old] = 0
            if timed:
                growth = int(sbrk(0) or 0) - start + mapped
                peak = growth if peak is None else max(peak, growth)
    finally:
        for held in addresses:  # every chunk still held, freed
            if held:
                free(held)
    return None if failed else peak
