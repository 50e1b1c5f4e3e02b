"""Options in one style: frozen sections that check themselves, flags generated from their fields."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from tpu_tuner.bucketing.options import BucketChoice, BucketMeasurement, BucketOptions
from tpu_tuner.cli import build_parser
from tpu_tuner.cli.tune import options_from
from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.flags import DEVICE, FLAG
from tpu_tuner.tuning.options.tune_options import (
    ObjectiveOptions,
    RunnerOptions,
    SearchOptions,
    StoreOptions,
    TuneOptions,
    default_trial_settings,
)


def _parsed(command: str, *words: str):
    return build_parser(command).parse_args([command, *words])


def test_the_tune_flags_build_the_sections_they_name() -> None:
    args = _parsed(
        "tune", "m.py", "--trials", "7", "--time-budget", "10m", "--trial-memory-gb", "2", "--cold", "--no-prune"
    )
    options = options_from(args)
    assert options.search == SearchOptions(trials=7, time_budget_s=600.0, warm_start=False, prune=False)
    assert options.objective == ObjectiveOptions(memory_limit_bytes=2 * 1024**3)
    assert options.runner.device is None  # --device auto: the best device present
    assert options.runner.trial_settings is None  # resolved by the run: building it imports torch
    # Left out, every flag gives its field's default: the options a bare TuneOptions() holds.
    assert options_from(_parsed("tune", "m.py")) == TuneOptions()
    assert options_from(_parsed("tune", "m.py", "--device", "cpu", "--seq", "64")).runner == RunnerOptions(
        device="cpu", seq_len=64
    )


def test_the_buckets_flags_build_its_sections_and_share_the_device_flag() -> None:
    from tpu_tuner.bucketing.options import SECTIONS
    from tpu_tuner.core.flags import sections_from

    args = _parsed("buckets", "m.py", "--device", "cpu", "--align", "128", "--replay", "50")
    options = BucketOptions(**sections_from(args, SECTIONS))
    assert options.choice == BucketChoice(align=128)
    assert options.measure == BucketMeasurement(device="cpu")
    assert options.choice.planned_steps == 20_000 and options.replay.steps == 50
    # One definition of --device for every command that has it.
    for section, name in ((RunnerOptions, "device"), (BucketMeasurement, "device")):
        assert {f.name: f for f in dataclasses.fields(section)}[name].metadata[FLAG] is DEVICE


@pytest.mark.parametrize(
    "build, says",
    [
        (lambda: SearchOptions(trials=0), "--trials must be at least 1, not 0"),
        (lambda: SearchOptions(sampler="annealing"), "unknown sampler 'annealing'"),
        (lambda: ObjectiveOptions(verify_rounds=1), "--verify-rounds must be at least 2, not 1"),
        (lambda: RunnerOptions(nproc=65), "--nproc must be at most 64"),
        (lambda: StoreOptions(heartbeat_interval_s=10, grace_period_s=5), "--grace-period (5 s) must be longer"),
        (lambda: TuneOptions(search=SearchOptions(plan=Path("p"))), "--plan seeds sharding layouts"),
        (lambda: BucketChoice(align=0), "--align must be at least 1, not 0"),
    ],
)
def test_a_section_refuses_bad_values_when_built(build, says) -> None:
    with pytest.raises(UserInputError, match=says.replace("(", r"\(").replace(")", r"\)")):
        build()


def test_the_stored_form_is_flat_and_loads_back() -> None:
    options = TuneOptions(
        search=SearchOptions(trials=5),
        runner=RunnerOptions(device="cpu", trial_settings=default_trial_settings()),
        store=StoreOptions(url="postgresql://u:secret@host/db", study="s"),
    )
    plain = options.to_plain()
    assert plain["trials"] == 5 and plain["device"] == "cpu" and plain["study"] == "s"
    assert plain["storage"] == "postgresql://u@host/db"  # a record never holds the password
    assert plain["trial_settings"]["timing_min_steps"] == 5  # a mapping, as result.json keeps it
    back = TuneOptions.from_plain(plain)
    assert back == dataclasses.replace(options, store=dataclasses.replace(options.store, url="postgresql://u@host/db"))


def test_tune_options_import_and_build_without_torch() -> None:
    code = (
        "import sys; from tpu_tuner.tuning.options.tune_options import TuneOptions; TuneOptions(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
