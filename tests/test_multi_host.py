"""Trials that span hosts (``--nnodes M --nproc N --rdzv HOST:PORT``), on loopback: each simulated
host is a launcher process tree of its own (``python -m tpu_tuner.cli`` in a working directory of
its own), the hosts meet through torch's c10d rendezvous on 127.0.0.1, and the study lives in a
SQLite file both reach. Process clean-up is checked by scanning /proc for a marker that every
process the test starts inherits in its environment (other sessions' ranks do not carry it)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections import Counter

import pytest
from conftest import FIXTURES, wait_until
from helpers.common import (
    Hosts,
    both_hosts_mid_job,
    json_lines,
    listening,
    marked_processes,
    output_of,
    ranks_of,
    ranks_up,
    study_trials,
    wait_for_nothing_left,
)

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.model.meshes.host_mesh import axes_within_hosts, describe_on_hosts
from tpu_tuner.model.meshes.layouts import parse_layout
from tpu_tuner.runner.hosts import HostsError, assign_nodes
from tpu_tuner.studies import records

# --- pieces without processes -----------------------------------------------------------------


def _claim(host: str, pid: int, want: int | None = None, store_host: bool = False) -> dict:
    return {"host": host, "pid": pid, "want": want, "store_host": store_host, "generation": "g"}


def test_node_ranks_keep_claims_give_the_store_host_node_0_and_refuse_a_rank_claimed_twice() -> None:
    # No claims: the agent serving the store drives (node 0), the rest follow the rendezvous's order.
    assert assign_nodes([_claim("a", 1), _claim("b", 2, store_host=True), _claim("c", 3)]) == [1, 0, 2]
    # A survivor of a re-rendezvous keeps its node, a newcomer takes the free one.
    assert assign_nodes([_claim("new", 9), _claim("driver", 1, want=0, store_host=True), _claim("c", 3, want=2)]) == [
        1,
        0,
        2,
    ]
    # --node-rank (or TorchTPU's NODE_RANK) wins over the store's host.
    assert assign_nodes([_claim("a", 1, want=0), _claim("b", 2, store_host=True)]) == [0, 1]
    with pytest.raises(HostsError, match="node rank 1 is claimed by both a .pid 1. and b .pid 2."):
        assign_nodes([_claim("a", 1, want=1), _claim("b", 2, want=1)])


def test_the_mesh_maps_onto_hosts_and_tensor_groups_stay_within_one_by_default() -> None:
    from tpu_tuner.tuning.search.search_space import SearchSpace

    assert axes_within_hosts(parse_layout("1x2x2", context=False), 2) == {"fsdp": False, "tensor": True}
    assert axes_within_hosts(parse_layout("2x2x2", context=False), 4) == {"data": False, "fsdp": True, "tensor": True}
    assert axes_within_hosts(parse_layout("1x1x4", context=False), 2) == {"tensor": False}
    assert describe_on_hosts(parse_layout("1x2x2", context=False), 2, 2, ["a", "b"]) == (
        "1x2x2: node 0 (a) ranks 0-1 = fsdp 0 x tensor 0-1; node 1 (b) ranks 2-3 = fsdp 1 x tensor 0-1; "
        "fsdp across hosts, tensor within a host"
    )
    # Two hosts of two ranks: the layouts of four ranks, less those whose tensor axis spans hosts.
    space = SearchSpace.load(FIXTURES / "layout_space.toml", "cpu", ranks=4).tensor_within_hosts(2)
    assert next(p for p in space.params if p.name == "layout").choices == ("4x1x1", "1x4x1", "1x2x2")
    assert space.left_out == (
        "layout: 1x1x4: the tensor axis would span hosts (2 ranks a host; --tensor-across-hosts allows it)",
    )


def test_the_host_flags_are_checked_before_anything_runs() -> None:
    from tpu_tuner.tuning.options.tune_options import RunnerOptions, StoreOptions, TuneOptions

    good = dict(nnodes=2, nproc=1, rdzv="127.0.0.1:29400")
    assert TuneOptions(runner=RunnerOptions(**good), store=StoreOptions(study="s")).runner.ranks == 2
    with pytest.raises(UserInputError, match="give --study NAME"):
        TuneOptions(runner=RunnerOptions(**good))  # the hosts meet under a study's name
    for change, says in (
        (dict(rdzv=None), "give --rdzv HOST:PORT"),
        (dict(rdzv="head-host"), "expected HOST:PORT"),
        (dict(node_rank=2), "--node-rank 2: expected 0 to 1"),
        (dict(max_restarts=-1), "--max-restarts must be at least 0"),
        (dict(nnodes=1, node_rank=0), "--node-rank join hosts into one run"),
        (dict(nnodes=0), "--nnodes must be at least 1"),
    ):
        with pytest.raises(UserInputError, match=says):
            RunnerOptions(**{**good, **change})


def test_a_trial_a_lost_host_cut_short_teaches_nothing_and_covers_no_setting() -> None:
    import optuna

    from tpu_tuner.execution.measurement import TrialFailure
    from tpu_tuner.runner.multi_host import LOST_HOST
    from tpu_tuner.studies.coverage import covered_settings
    from tpu_tuner.studies.trial_record import TrialRecord
    from tpu_tuner.tuning.search.failure_learning import evidence_of
    from tpu_tuner.tuning.search.trial_attrs import record_failure
    from tpu_tuner.tuning.search.tuning_trial import TuningTrial

    assert LOST_HOST == records.INTERRUPTED
    study = optuna.create_study()
    trial = study.ask({"layout": optuna.distributions.CategoricalDistribution(["2x1x1", "1x2x1"])})
    TrialRecord.of(trial).update({records.MEASURED: True})
    record_failure(trial, TrialFailure(LOST_HOST, "host b (node 1, agent pid 7) stopped answering"))
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    frozen = study.get_trials()
    read = TuningTrial.all(frozen)
    assert evidence_of(read, 1e-2) == [] and covered_settings(frozen) == {} and not read[0].failed_to_run


# --- hosts as process trees on loopback -------------------------------------------------------


def test_a_host_that_never_arrives_times_out_with_one_line_naming_what_is_missing(tmp_path) -> None:
    hosts = Hosts(tmp_path, "alone", "--rdzv-timeout", "3")
    try:
        alone = hosts.start("a")
        assert alone.wait(timeout=120) == 2
        lines = [line for line in output_of(alone).splitlines() if line.startswith("tpu-tune: error:")]
        assert len(lines) == 1, output_of(alone)
        assert f"s at 127.0.0.1:{hosts.port} for 2 hosts; 1 joined (--rdzv-timeout 3 s" in lines[0]
        assert not listening(hosts.port) and marked_processes(hosts.mark) == []
        assert not (tmp_path / "a" / "results").exists()  # nothing written before the hosts met
    finally:
        hosts.cleanup()


@pytest.mark.slow  # about 40 s on 2 cores; the study test below kills a host the same way through the CLI
@pytest.mark.timed  # heartbeats: a host silent for SILENT_S (6 s) fails its trial
def test_jobs_run_on_both_hosts_ranks_and_a_sigkilled_host_fails_its_job_naming_it(tmp_path) -> None:
    """A driver (tests/fixtures/host_driver.py, node 0) runs two measure jobs on both hosts; the
    follower is the `tpu-tune` command itself (--node-rank 1). The first job is measured on both
    hosts' ranks; the follower's agent is killed with SIGKILL during the second, which fails
    naming it, and the runner refuses to go on (no restart left); no process is left."""
    hosts = Hosts(tmp_path, "jobs", "--node-rank", "1")
    try:
        driver, follower, deadline = both_hosts_mid_job(hosts, tmp_path, "jobs")
        os.kill(follower.pid, signal.SIGKILL)
        assert driver.wait(timeout=120) == 0, output_of(driver)
        follower.wait()
        lines = json_lines(driver)
        me = socket.gethostname()
        assert lines[0] == {
            "joined": 0,
            "hosts": [f"host {me} (node 0, agent pid {driver.pid})", f"host {me} (node 1, agent pid {follower.pid})"],
        }
        first, second = (line["job"] for line in lines if isinstance(line.get("job"), dict))
        assert first["ok"] and first["hosts"] == lines[0]["hosts"] and first["step_s"] > 0, first
        assert second["kind"] == records.INTERRUPTED, second
        assert second["message"].startswith(
            f"host {me} (node 1, agent pid {follower.pid}) stopped answering during this trial (no heartbeat for "
        ), second
        assert lines[-1]["usable"] is False and "no restart left (--max-restarts 0)" in lines[-1]["error"]
        wait_for_nothing_left(hosts)
    finally:
        hosts.cleanup()


def _pair_with_the_follower_killed_in_trial_2(hosts: Hosts) -> tuple[subprocess.Popen, subprocess.Popen]:
    """Start both hosts of a 2-trial study; SIGKILL host b's agent once trial 2 runs on its ranks."""
    a, b = hosts.start_pair()
    deadline = time.monotonic() + 400
    while "] running" not in output_of(a).partition("| budget 2/2 |")[2] or not ranks_of(b.pid) or ranks_up(hosts) < 2:
        assert a.poll() is None and time.monotonic() < deadline, output_of(a)  # mid-trial: both hosts' ranks up
        time.sleep(0.1)
    os.kill(b.pid, signal.SIGKILL)
    return a, b


@pytest.mark.slow  # two 2-host studies, one cut short by a kill: over a minute on 2 cores (the full CI run has it)
@pytest.mark.timed  # heartbeats: a host silent for SILENT_S (6 s) fails its trial
def test_two_hosts_run_a_study_a_sigkilled_host_fails_its_trial_and_a_relaunch_completes_it(tmp_path) -> None:
    """Two simulated hosts tune a 2-trial study: the first trial runs on both hosts' ranks, host b's
    agent is SIGKILLed during the second, which fails naming it (one line; no process or port
    left). The same two commands again resume the study: the lost setting is measured on both
    hosts, nothing measured before is measured again, and the report maps the mesh onto hosts."""
    flags = ("--trials", "2", "--verify-rounds", "2", "--space", str(FIXTURES / "layout_space.toml"), "--no-prune")
    hosts = Hosts(tmp_path, "killed", *flags)
    try:
        a, b = _pair_with_the_follower_killed_in_trial_2(hosts)
        assert a.wait(timeout=180) == 1, output_of(a)
        b.wait()
        errors = [line for line in output_of(a).splitlines() if line.startswith("tpu-tune: error:")]
        assert len(errors) == 1 and f"(node 1, agent pid {b.pid}) stopped answering" in errors[0], output_of(a)
        assert "no restart left (--max-restarts 0)" in errors[0]
        wait_for_nothing_left(hosts)
        before = study_trials(tmp_path, "killed")
        interrupted = [t for t in before if records.attrs(t).get(records.FAILURE_KIND) == records.INTERRUPTED]
        assert len(interrupted) == 1 and f"agent pid {b.pid}" in records.attrs(interrupted[0])[records.FAILURE_MESSAGE]
        done_before = {t.number: t.params for t in before if t.state.name == "COMPLETE"}
        assert len(done_before) == 1  # the first trial completed before the kill
        on_both = [
            f"host {socket.gethostname()} (node 0, agent pid {a.pid})",
            f"host {socket.gethostname()} (node 1, agent pid {b.pid})",
        ]
        assert all(records.attrs(t)[records.HOSTS] == on_both for t in before if t.number in done_before)

        relaunched = Hosts(tmp_path, "killed", *flags)
        a2, b2 = relaunched.start_pair()
        assert a2.wait(timeout=600) == 0, output_of(a2)
        assert b2.wait(timeout=60) == 0, output_of(b2)
        assert f"the study ended on the driver (host {socket.gethostname()} (node 0, agent pid {a2.pid}))" in output_of(
            b2
        )
        wait_for_nothing_left(relaunched)
    finally:
        hosts.cleanup()
    after = study_trials(tmp_path, "killed")
    assert {t.number: t.params for t in after if t.number in done_before} == done_before
    measured = [
        tuple(sorted(t.params.items()))
        for t in after
        if t.state.name == "COMPLETE" and records.REPEAT_OF not in records.attrs(t)
    ]
    assert len(measured) == 2 and max(Counter(measured).values()) == 1  # nothing measured twice, the budget met
    (new,) = [t for t in after if t.number not in done_before and t.state.name == "COMPLETE"]
    assert records.attrs(new)[records.HOSTS] == [
        f"host {socket.gethostname()} (node 0, agent pid {a2.pid})",
        f"host {socket.gethostname()} (node 1, agent pid {b2.pid})",
    ]
    report = max((tmp_path / "a" / "results").glob("tiny_llama-tune-*/report.md"), key=lambda p: p.stat().st_mtime)
    text = report.read_text()
    assert "Every trial ran on 2 ranks (2 hosts of 1" in text
    assert "2x1x1: node 0 (" in text and "data across hosts" in text
    assert "layout: 1x1x2: the tensor axis would span hosts" in text
    assert json.loads((report.parent / "result.json").read_text())["options"]["nnodes"] == 2


@pytest.mark.slow  # a host killed and started again mid-study: about a minute on 2 cores
@pytest.mark.timed  # heartbeats: a host silent for SILENT_S (6 s) fails its trial
def test_with_a_restart_left_the_driver_waits_for_the_lost_host_and_the_study_goes_on(tmp_path) -> None:
    """--max-restarts 1: host b's agent SIGKILLed during trial 2 fails that trial naming it; the
    driver waits at a re-rendezvous, the same command started again on b joins it, and the study
    ends with its budget measured on both hosts, nothing measured twice, nothing left running."""
    flags = (
        "--trials",
        "2",
        "--verify-rounds",
        "2",
        "--space",
        str(FIXTURES / "layout_space.toml"),
        "--no-prune",
        "--max-restarts",
        "1",
        "--rdzv-timeout",
        "120",
    )
    hosts = Hosts(tmp_path, "restarted", *flags)
    try:
        a, b = _pair_with_the_follower_killed_in_trial_2(hosts)
        b.wait()
        wait_until(lambda: "re-rendezvous 1 of 1" in output_of(a) or a.poll() is not None, 120, lambda: output_of(a))
        assert a.poll() is None, output_of(a)  # the driver waits for the host, not exits
        b2 = hosts.start("b")
        assert a.wait(timeout=600) == 0, output_of(a)
        assert b2.wait(timeout=60) == 0, output_of(b2)
        wait_for_nothing_left(hosts)
    finally:
        hosts.cleanup()
    trials = study_trials(tmp_path, "restarted")
    interrupted = [t for t in trials if records.attrs(t).get(records.FAILURE_KIND) == records.INTERRUPTED]
    assert len(interrupted) == 1 and f"agent pid {b.pid}" in records.attrs(interrupted[0])[records.FAILURE_MESSAGE]
    measured = [t for t in trials if t.state.name == "COMPLETE" and records.REPEAT_OF not in records.attrs(t)]
    settings = [tuple(sorted(t.params.items())) for t in measured]
    assert len(settings) == 2 and max(Counter(settings).values()) == 1
    assert any(records.attrs(t)[records.HOSTS][1].endswith(f"agent pid {b2.pid})") for t in measured)
