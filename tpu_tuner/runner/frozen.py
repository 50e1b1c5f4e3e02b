"""Frozen children: a worker or a rank that is stopped (SIGSTOP, a debugger's job control) rather than dead.

A stopped process neither replies nor exits, so without a look at its state a trial waits for its
whole deadline (300 s by default) and then reads as a TIMEOUT, a verdict on the setting. The parent
instead reads each child's state from ``/proc/PID/stat`` (the field after the command name: ``T``
is "stopped by a signal", proc(5)) while it waits, and a child stopped for `FROZEN_GRACE_S` is
killed (SIGKILL ends a stopped process too) and its job failed as a HANG, measured again. A
process traced by a debugger (``t``) is not counted: somebody is looking at it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

# Seconds a child may stay stopped before it counts as frozen: longer than a pause someone makes
# on purpose to look at it (``kill -STOP``, then ``-CONT``), far shorter than a trial's deadline.
FROZEN_GRACE_S = 5.0
# Seconds between looks at the children's state while waiting for a reply, and a gap between two
# looks long enough to mean that the watching process was stopped itself.
LOOK_S = 0.25
PARENT_AWAY_S = 2.0


def is_stopped(pid: int) -> bool:
    """Whether process `pid` is stopped by a signal (state ``T``); False where it is gone or not Linux."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return False
    # The command name is in parentheses and may hold spaces or parentheses: the state follows the last ")".
    fields = text[text.rfind(b")") + 1 :].split()
    return bool(fields) and fields[0] == b"T"


@dataclass(frozen=True)
class Frozen:
    """A child found stopped for `seconds` (at least `FROZEN_GRACE_S`): `pid`, and `name` in failure messages."""

    pid: int
    name: str
    seconds: float

    def describe(self) -> str:
        """The failure message's words: "rank 1 (pid 4242) froze: stopped (SIGSTOP) for 5 s, and was killed"."""
        return f"{self.name} (pid {self.pid}) froze: stopped (SIGSTOP) for {self.seconds:.0f} s, and was killed"


class FrozenWatch:
    """Since when each watched child has been stopped, by this process's monotonic clock."""

    def __init__(self, grace_s: float = FROZEN_GRACE_S) -> None:
        self.grace_s = grace_s
        self._stopped_since: dict[int, float] = {}
        self._last_look: float | None = None

    def look(self, children: Iterable[tuple[int, str]], now: float | None = None) -> Frozen | None:
        """The first of `children` (pid, name) stopped for at least the grace, else None; a child
        seen running again starts from zero."""
        now = time.monotonic() if now is None else now
        if self._last_look is not None and now - self._last_look > PARENT_AWAY_S:
            # This process was itself stopped in between (Ctrl-Z stops the whole foreground group,
            # `fg` continues it): what it saw before says nothing of the children now.
            self._stopped_since.clear()
        self._last_look = now
        found = None
        for pid, name in children:
            if not is_stopped(pid):
                self._stopped_since.pop(pid, None)
                continue
            since = self._stopped_since.setdefault(pid, now)
            if found is None and now - since >= self.grace_s:
                found = Frozen(pid, name, now - since)
        return found


__all__ = ["FROZEN_GRACE_S", "LOOK_S", "Frozen", "FrozenWatch", "is_stopped"]
