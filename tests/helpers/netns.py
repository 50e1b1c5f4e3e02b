"""Two hosts with addresses of their own on one machine: two Linux network namespaces joined by a
veth pair (`ip netns`, `ip link add ... type veth`; iproute2, which `.ci/run` installs), each end
holding an address of 10.77.0.0/24. A process started with `HostPair.exec(side)` runs inside one
namespace (``ip netns exec`` switches namespace and then execs the command: the process keeps its
pid), so the two hosts reach each other only over the veth pair, and `cut()` takes the link down
(both ends lose carrier: a partition, no packet passes either way) until `heal()`.

`host_pair()` removes both namespaces (and so the veth pair) at the end, however the block ended.
Creating namespaces needs root (CAP_SYS_ADMIN); `permitted()` says why not where it is refused.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

ADDRESSES = ("10.77.0.1", "10.77.0.2")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass(frozen=True)
class HostPair:
    """Namespaces `names[i]` holding `ADDRESSES[i]` on veth end `links[i]`."""

    names: tuple[str, str]
    links: tuple[str, str]

    def exec(self, side: int) -> list[str]:
        """The prefix that runs a command inside host `side`'s namespace."""
        return ["ip", "netns", "exec", self.names[side]]

    def cut(self) -> None:
        """Take host 1's end of the link down: neither host reaches the other."""
        _ip("-n", self.names[1], "link", "set", self.links[1], "down")

    def heal(self) -> None:
        _ip("-n", self.names[1], "link", "set", self.links[1], "up")

    def reaches(self, side: int, port: int) -> bool:
        """Whether something listens on `port` of host `side`'s address, seen from host 1 - `side`."""
        probe = f"exec 3<>/dev/tcp/{ADDRESSES[side]}/{port}"
        done = subprocess.run([*self.exec(1 - side), "bash", "-c", probe], capture_output=True, timeout=10)
        return done.returncode == 0


def permitted() -> str | None:
    """None where this process may create network namespaces, else why not."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (.ci/run installs it)"
    name = f"tt-probe-{uuid.uuid4().hex[:8]}"
    try:
        _ip("netns", "add", name)
    except subprocess.CalledProcessError as exc:
        return f"`ip netns add` is not permitted here: {exc.stderr.strip() or exc}"
    _ip("netns", "del", name)
    return None


@contextlib.contextmanager
def host_pair() -> Iterator[HostPair]:
    """Two namespaces joined by a veth pair, up, with loopback up in each; removed at the end."""
    tag = uuid.uuid4().hex[:8]
    names = (f"tt-{tag}-a", f"tt-{tag}-b")
    links = (f"tt{tag}a", f"tt{tag}b")  # interface names: 15 characters at most
    try:
        for name in names:
            _ip("netns", "add", name)
        _ip("link", "add", links[0], "netns", names[0], "type", "veth", "peer", "name", links[1], "netns", names[1])
        for name, link, address in zip(names, links, ADDRESSES, strict=True):
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", name, "link", "set", link, "up")
            _ip("-n", name, "link", "set", "lo", "up")
        yield HostPair(names, links)
    finally:
        for name in names:  # a namespace's veth end goes with it, and its peer with that end
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", name)


def namespaces() -> set[str]:
    """The named network namespaces there are now (`ip netns list`)."""
    listed = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True).stdout
    return {line.split()[0] for line in listed.splitlines() if line.strip()}
