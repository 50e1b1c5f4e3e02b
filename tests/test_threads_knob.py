"""The `intra_op_threads` knob (torch.set_num_threads on CPU) and the threads agent.

Its choices are resolved on the host at hand; the count is in force inside the trial worker
while a trial is measured (and restored after), after `tpu_tuner.apply`, and in the printed code;
the agent seeds fewer threads only when the profile shows small ops, overhead or contention.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers.common import pin_cores, threads_profile
from torch import nn

from tpu_tuner.core.host import usable_cores
from tpu_tuner.knobs import registry as knobs
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.tuned_config import TunedConfig, apply
from tpu_tuner.runner.requests import MeasureRequest
from tpu_tuner.runner.trial_runner import TrialRunner
from tpu_tuner.tuning.agents import load_agents
from tpu_tuner.tuning.search.search_space import SearchSpace

FIXTURES = Path(__file__).parent / "fixtures"
KNOB = knobs.get("intra_op_threads")
ENTRY = {"choices": {"cpu": ["all", "half", "1"]}}


@pytest.mark.parametrize(
    ("cores", "expected"), [(1, ("all",)), (2, ("all", "1")), (3, ("all", "1")), (8, ("all", "4", "1"))]
)
def test_choices_are_resolved_on_the_host_at_hand(monkeypatch, cores: int, expected: tuple[str, ...]) -> None:
    pin_cores(monkeypatch, cores)
    assert KNOB.choices("cpu", ENTRY) == expected
    assert KNOB.choices("cuda", ENTRY) == () and not KNOB.applies_to("tpu")
    searched = {p.name for p in SearchSpace.load("default", "cpu").searched}
    assert ("intra_op_threads" in searched) == (cores > 1)  # one core: one choice, not searched
    with pytest.raises(ValueError, match="positive thread count"):
        KNOB.check("0")


def test_thread_count_inside_the_worker_during_a_measured_trial(tmp_path, monkeypatch, fast_settings) -> None:
    """A real worker process measures the 1-thread candidate: every forward it times runs on 1
    thread; the next trial (the baseline) runs on torch's default again."""
    if usable_cores() < 2:
        pytest.skip("one usable core: nothing fewer to set")
    log = tmp_path / "threads.log"
    monkeypatch.setenv("TPU_TUNE_TEST_THREADS_LOG", str(log))
    options = MeasureRequest(
        settings=fast_settings, model_flops_per_step=1.0, peak_flops_per_s={"float32": 1e18, "bfloat16": 1e18}
    )
    runner = TrialRunner(str(FIXTURES / "threads_probe.py"), "cpu", timeout_s=120)
    try:
        one = runner.run(replace(options, candidate=Candidate(intra_op_threads="1").to_dict()))
        assert one.ok, one.failure
        during = [int(line) for line in log.read_text().split()]
        log.write_text("")
        baseline = runner.run(replace(options, candidate=Candidate().to_dict()))
        assert baseline.ok, baseline.failure
        after = [int(line) for line in log.read_text().split()]
    finally:
        runner.close()
    # The first call of the first trial is the fp32 reference (baseline settings, default threads).
    assert len(during) > 10 and set(during[1:]) == {1}
    assert set(after) == {torch.get_num_threads()} and torch.get_num_threads() > 1
    assert one.value.candidate["intra_op_threads"] == "1"


def test_apply_sets_the_thread_count_and_restore_puts_it_back(tmp_path) -> None:
    if usable_cores() < 2:
        pytest.skip("one usable core: nothing fewer to set")
    before = torch.get_num_threads()
    path = TunedConfig(Candidate(intra_op_threads="1"), "cpu").save(tmp_path / "tuned_config.toml")
    assert 'intra_op_threads = "1"' in path.read_text()
    applied = apply(nn.Linear(4, 4), path)
    try:
        assert torch.get_num_threads() == 1
        assert KNOB.observe(applied.model, applied.model, None) == "1"
    finally:
        applied.restore()
    assert torch.get_num_threads() == before
    assert KNOB.observe(nn.Linear(4, 4), None, None) == "all"
    # The printed `tpu-tune apply` code sets it too, in a fresh interpreter.
    code = "\n".join(Candidate(intra_op_threads="1").code("cpu"))
    assert "torch.set_num_threads(1)" in code
    script = (
        "import torch\nmodel = torch.nn.Linear(4, 4)\ninputs = torch.randn(2, 4)\n"
        + code
        + "\nprint(torch.get_num_threads())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env={**os.environ}
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "1"


@pytest.mark.parametrize(
    ("profile", "seeded"),
    [
        (threads_profile(0.7, 200, 2e-3, 0.02), True),  # overhead-bound
        (threads_profile(0.1, 400, 4e-3, 0.02), True),  # 10 us per op: small ops
        (threads_profile(0.1, 20, 20e-3, 0.40), True),  # large ops, but the step times spread: contention
        (threads_profile(0.1, 20, 20e-3, 0.02), False),  # large ops, quiet: searched, not seeded
        (threads_profile(None, 20, 20e-3, None), False),
    ],
)
def test_threads_agent_seeds_fewer_threads_only_with_a_reason(monkeypatch, profile, seeded: bool) -> None:
    pin_cores(monkeypatch, 8)
    space = SearchSpace.load("default", "cpu")
    (agent,) = load_agents(["threads"], "cpu")
    seeds = agent.seeds(profile, space)
    assert seeds == ([{"intra_op_threads": "1"}, {"intra_op_threads": "4"}] if seeded else [])
    finding = agent.diagnose(profile)[0]
    assert ("fewer threads are seeded" in finding) == seeded
    assert "8 usable cores" in finding


def test_threads_agent_on_one_core_and_off_cpu(monkeypatch) -> None:
    pin_cores(monkeypatch, 1)
    profile = threads_profile(0.9, 400, 1e-3, 0.5)
    (agent,) = load_agents(["threads"], "cpu")
    assert agent.seeds(profile, SearchSpace.load("default", "cpu")) == []
    assert "not searched" in agent.diagnose(profile)[0]
    (agent,) = load_agents(["threads"], "cuda")
    assert agent.seeds(profile, SearchSpace.load("default", "cuda")) == []
    assert "not searched on cuda" in agent.diagnose(profile)[0]


def test_a_typo_in_the_threads_agent_toml_is_refused(tmp_path) -> None:
    from tpu_tuner.core.errors import DefinitionError
    from tpu_tuner.tuning.agents.schema import load_tuning_agent_definition

    text = (Path(__file__).parents[1] / "agents" / "threads.toml").read_text()
    bad = tmp_path / "threads.toml"
    bad.write_text(text.replace("contention_cv_min", "contention_cv_mni"))
    with pytest.raises(DefinitionError, match="unknown key \\[seeds\\].contention_cv_mni"):
        load_tuning_agent_definition("threads", bad)
