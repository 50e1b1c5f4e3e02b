"""Which network interface a multi-host run's gloo ranks offer their peers.

Gloo's default device takes the address this host's name resolves to (torch's
`ProcessGroupGloo.create_default_device`); where the name resolves to loopback (a common
/etc/hosts: ``127.0.1.1 myhost``) every rank offers 127.0.0.1, and a peer on another host fails
with "Gloo connectFullMesh failed ... Connection refused, remote=[127.0.0.1]". torch's remedy is
``GLOO_SOCKET_IFNAME`` (https://pytorch.org/docs/stable/distributed.html, "Choosing the network
interface to use"): `pin_gloo_interface` sets it, for this process's ranks, to the interface this
host reaches the rendezvous through, unless it is set already or the name resolves elsewhere.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import socket
import struct

log = logging.getLogger(__name__)

VARIABLE = "GLOO_SOCKET_IFNAME"
_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address (netdevice(7))


def pin_gloo_interface(address: str, port: int) -> str | None:
    """Set GLOO_SOCKET_IFNAME to the interface that routes to `address` (the rendezvous), where the
    host name resolves to loopback and the rendezvous is not; the interface chosen, or None."""
    if VARIABLE in os.environ or not name_is_loopback():
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((address, port))  # a datagram socket: routes, sends nothing
            local = probe.getsockname()[0]
    except OSError:
        return None
    if ipaddress.ip_address(local).is_loopback:
        return None  # the hosts meet on loopback: gloo's default is right
    interface = interface_holding(local)
    if interface is not None:
        os.environ[VARIABLE] = interface
        log.info("this host's name resolves to loopback: gloo's ranks use %s (%s)", interface, local)
    return interface


def interface_holding(address: str) -> str | None:
    """The name of the interface that holds IPv4 `address`, if one does."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as query:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(query.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on it
            if socket.inet_ntoa(answer[20:24]) == address:
                return name
    return None


def name_is_loopback() -> bool:
    """Whether every address this host's name resolves to is a loopback one (as one /etc/hosts line can make it)."""
    try:
        return all(
            ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(socket.gethostname(), None)
        )
    except (OSError, ValueError):
        return False


__all__ = ["VARIABLE", "interface_holding", "pin_gloo_interface"]
