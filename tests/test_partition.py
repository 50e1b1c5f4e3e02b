"""A network partition between hosts: the two-host study of tests/test_multi_host.py run as two hosts
with addresses of their own (network namespaces joined by a veth pair, tests/helpers/netns.py), the link
cut for 20 s while a trial runs on both hosts' ranks. The trial fails naming the host that stopped
answering (its heartbeat, `runner/hosts.py`), the study goes on or stops per --max-restarts, nothing
measured is lost or measured twice, no trial is left RUNNING, and the namespaces are removed."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FIXTURES, wait_until
from helpers import netns
from helpers.common import REPO, Hosts, marked_processes, output_of, ranks_of, ranks_up, study_trials

from tpu_tuner.studies import records

PORT = 29400  # any: nothing else listens in a namespace of the test's own
CUT_S = 20.0

_why_not = netns.permitted()
needs_netns = pytest.mark.skipif(_why_not is not None, reason=_why_not or "")


@pytest.fixture
def pair() -> Iterator[netns.HostPair]:
    """Two hosts as network namespaces, removed afterwards even when the test fails."""
    with netns.host_pair() as hosts:
        yield hosts
    assert not set(hosts.names) & netns.namespaces()


class NamespacedHosts(Hosts):
    """`Hosts` whose host k runs in namespace k of `pair` and meets at host a's own address."""

    def __init__(self, root: Path, study: str, pair: netns.HostPair, *flags: str) -> None:
        super().__init__(root, study, *flags)
        self.pair, self.port = pair, PORT
        at = self.command.index("--rdzv") + 1
        self.command[at] = f"{netns.ADDRESSES[0]}:{PORT}"
        self.sides = {"a": 0, "b": 1}

    def start(self, name: str, *extra: str) -> subprocess.Popen:
        command, env, side = self.command, self.env, self.sides[name]
        self.command = [*self.pair.exec(side), *command]  # `ip netns exec` keeps the pid
        # The host name resolves to loopback here (one /etc/hosts for both): gloo's ranks would offer
        # their peers 127.0.0.1. Naming the interface is torch's way (GLOO_SOCKET_IFNAME), as on such hosts.
        self.env = {**env, "GLOO_SOCKET_IFNAME": self.pair.links[side]}
        try:
            return super().start(name, *extra)
        finally:
            self.command, self.env = command, env

    def start_pair(self, *extra: str) -> tuple[subprocess.Popen, subprocess.Popen]:
        a = self.start("a", *extra)
        wait_until(lambda: a.poll() is not None or self.pair.reaches(0, PORT), 120, lambda: output_of(a))
        assert a.poll() is None, output_of(a)
        return a, self.start("b", *extra)


@needs_netns
def test_two_namespaces_reach_each_other_only_over_their_link_and_each_host_knows_its_address(pair) -> None:
    listener = subprocess.Popen([*pair.exec(0), sys.executable, "-m", "http.server", "-b", netns.ADDRESSES[0], "8000"])
    try:
        wait_until(lambda: pair.reaches(0, 8000), 30)
        pair.cut()
        assert not pair.reaches(0, 8000)
        pair.heal()
        wait_until(lambda: pair.reaches(0, 8000), 30)
    finally:
        listener.kill()
        listener.wait()
    # The agent at the rendezvous's address serves its store though its host name resolves elsewhere,
    # and each host's gloo ranks offer the address on its link, not the loopback its name may resolve to.
    probe = (
        "import sys; from tpu_tuner.runner.hosts import is_this_machine as m; "
        "from tpu_tuner.runner.gloo_interface import interface_holding as i; "
        "print(m(sys.argv[1]), m(sys.argv[2]), i(sys.argv[1]), i(sys.argv[2]))"
    )
    for side in (0, 1):
        said = subprocess.run(
            [*pair.exec(side), sys.executable, "-c", probe, *netns.ADDRESSES],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONPATH": str(REPO)},
        ).stdout.split()
        mine = str(side == 0), str(side == 1)
        assert said == [*mine, *(pair.links[side] if m == "True" else "None" for m in mine)]
    # Host b's agent pins gloo to its link where its name resolves to loopback (here, one /etc/hosts).
    pin = (
        "import sys; from tpu_tuner.runner.gloo_interface import pin_gloo_interface as p, name_is_loopback as l; "
        "print(l(), p(sys.argv[1], 29400))"
    )
    loopback, pinned = subprocess.run(
        [*pair.exec(1), sys.executable, "-c", pin, netns.ADDRESSES[0]],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO)},
    ).stdout.split()
    assert pinned == (pair.links[1] if loopback == "True" else "None")


@needs_netns
@pytest.mark.slow  # a 2-host study with a 20 s partition, the driver waiting for the host: about 2 minutes on 2 cores
@pytest.mark.timed  # a 20 s cut against the 6 s heartbeat silence limit
@pytest.mark.parametrize("restarts", [1, 0])
def test_a_partition_mid_trial_fails_it_naming_the_host_and_the_study_goes_on_or_stops(
    tmp_path, pair, restarts
) -> None:
    flags = ("--trials", "2", "--verify-rounds", "2", "--space", str(FIXTURES / "layout_space.toml"), "--no-prune")
    flags += ("--max-restarts", str(restarts), "--rdzv-timeout", "120")
    hosts = NamespacedHosts(tmp_path, "cut", pair, *flags)
    try:
        a, b = hosts.start_pair()
        deadline = time.monotonic() + 400
        while (
            "] running" not in output_of(a).partition("| budget 2/2 |")[2] or not ranks_of(b.pid) or ranks_up(hosts) < 2
        ):
            assert a.poll() is None and time.monotonic() < deadline, output_of(a)  # mid-trial: both hosts' ranks up
            time.sleep(0.1)
        pair.cut()
        healed_at = time.monotonic() + CUT_S
        # The driver names the silent host within its heartbeat's grace, while the link is still down.
        wait_until(lambda: "stopped answering" in output_of(a), CUT_S, lambda: output_of(a))
        wait_until(lambda: time.monotonic() >= healed_at, CUT_S + 1)  # the partition lasts its 20 s
        pair.heal()
        if restarts:
            assert a.wait(timeout=600) == 0, output_of(a)
            assert b.wait(timeout=60) == 0, output_of(b)
            assert "re-rendezvous 1 of 1" in output_of(a)
        else:
            assert a.wait(timeout=180) == 1, output_of(a)
            errors = [line for line in output_of(a).splitlines() if line.startswith("tpu-tune: error:")]
            assert len(errors) == 1 and f"(node 1, agent pid {b.pid}) stopped answering" in errors[0], output_of(a)
            assert "no restart left (--max-restarts 0)" in errors[0]
            assert b.wait(timeout=180) != 0, output_of(b)  # the follower finds the driver gone once the link is back
            said = [line for line in output_of(b).splitlines() if line.startswith("tpu-tune: error:")]
            assert len(said) == 1, output_of(b)
        wait_until(lambda: marked_processes(hosts.mark) == [], 60, lambda: f"left: {marked_processes(hosts.mark)}")
    finally:
        hosts.cleanup()
    trials = study_trials(tmp_path, "cut")
    assert not [t.number for t in trials if t.state.name == "RUNNING"]
    (cut,) = [t for t in trials if records.attrs(t).get(records.FAILURE_KIND) == records.INTERRUPTED]
    message = records.attrs(cut)[records.FAILURE_MESSAGE]
    assert f"(node 1, agent pid {b.pid}) stopped answering during this trial (no heartbeat for" in message
    measured = [t for t in trials if t.state.name == "COMPLETE" and records.REPEAT_OF not in records.attrs(t)]
    settings = [tuple(sorted(t.params.items())) for t in measured]
    assert max(Counter(settings).values()) == 1 and len(settings) == (2 if restarts else 1)
