"""A frozen follower host (issue 39 item 3): its agent stopped (SIGSTOP) in the middle of a job that
spans two hosts on loopback (tests/test_multi_host.py's simulated hosts). Its heartbeat stops, so
the driver fails the job within `hosts.SILENT_S` as a HANG naming the frozen agent (it runs on this
machine, where its state can be read), measured again; continued (SIGCONT), the agent finds the
run over and exits, and no process is left."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest
from helpers.common import Hosts, both_hosts_mid_job, json_lines, output_of, wait_for_nothing_left

from tpu_tuner.core.failures import FailureKind
from tpu_tuner.runner.hosts import BEAT_S, SILENT_S


@pytest.mark.slow  # two simulated hosts run two jobs: about 40 s on 2 cores
@pytest.mark.timed  # the driver's silence limit (SILENT_S, 6 s) measured from the SIGSTOP
def test_a_frozen_follower_agent_fails_its_job_as_a_hang_and_exits_once_continued(tmp_path) -> None:
    hosts = Hosts(tmp_path, "frozen", "--node-rank", "1")
    try:
        driver, follower, deadline = both_hosts_mid_job(hosts, tmp_path, "frozen")
        os.kill(follower.pid, signal.SIGSTOP)  # the agent only: its ranks run on
        stopped_at = time.monotonic()
        while len([line for line in json_lines(driver) if isinstance(line.get("job"), dict)]) < 2:
            assert driver.poll() is None and time.monotonic() < deadline, output_of(driver)
            time.sleep(0.1)
        detected = time.monotonic() - stopped_at
        print(f"frozen follower agent: its job failed {detected:.1f} s after SIGSTOP (silence limit {SILENT_S:g} s)")
        os.kill(follower.pid, signal.SIGCONT)
        assert driver.wait(timeout=120) == 0, output_of(driver)
        assert follower.wait(timeout=120) != 0  # it found the run over (the store gone with the driver)
        second = [line["job"] for line in json_lines(driver) if isinstance(line.get("job"), dict)][1]
        assert second["kind"] == FailureKind.HANG, second
        me = socket.gethostname()
        assert second["message"].startswith(
            f"host {me} (node 1, agent pid {follower.pid}) stopped answering during this trial (no heartbeat for "
        ), second
        assert "its agent froze (stopped, SIGSTOP)" in second["message"], second
        # Silence counts from the agent's last beat, up to a beat before the stop.
        assert SILENT_S - BEAT_S <= detected < SILENT_S + 10, detected
        wait_for_nothing_left(hosts)
    finally:
        for process in hosts.started:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
        hosts.cleanup()
