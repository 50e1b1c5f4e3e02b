"""benchmarks/chip/tpu_step_profile.py: a setting's wall step beside the device's busy time and its
top operators (on the chip, where the 335M decoder's step goes); here on CPU, where the trace has
no device events and the table says so."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers.common import benchmark_script

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks" / "chip"
TINY = Path(__file__).parent / "fixtures" / "tiny_gpt.py"


@pytest.fixture(scope="module")
def profiler():
    """The script as a module; its siblings (tpu_levers, tpu_lever_settings) found beside it."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield benchmark_script(BENCHMARKS / "tpu_step_profile.py", "tpu_step_profile_under_test")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_table_puts_the_device_busy_time_beside_the_step(profiler) -> None:
    operator = {"name": "xla::program", "calls_per_step": 2.0, "self_ms_per_step": 380.0, "share": 0.95}
    allocator = {
        "step_built": {"memory_allocated": 12 * 2**30, "memory_reserved": 14 * 2**30},
        "released": {"memory_allocated": 2**30, "memory_reserved": None},
    }
    result = {
        "model": "m",
        "device": "TPU v5e",
        "base": {"param_dtype": "bfloat16"},
        "settings": {
            "splash": {"step_s": 0.491, "device_busy_s": 0.40, "operators": [operator], "allocator_bytes": allocator},
            "reference": {"failure": "RuntimeError: out of memory"},
        },
    }
    text = profiler.table(result)
    assert "splash: step 491.0 ms, device busy 400.0 ms (81% of the step)" in text
    assert "| xla::program | 2.0 | 380.00 | 95.0% |" in text
    assert "allocator, allocated / reserved GiB: step built 12.00 / 14.00, released 1.00 / -" in text
    assert "reference: failed: RuntimeError: out of memory" in text


def test_bad_sizes_and_a_bad_base_exit_2_with_one_line(profiler, capsys) -> None:
    assert profiler.main(["--device", "cpu", "--steps", "0"]) == 2
    assert profiler.main(["--device", "cpu", "--base", "param_dtype=bf16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "param_dtype must be one of" in err[1]


@pytest.mark.slow  # builds and times a tiny model's step on CPU (about 8 s)
def test_a_cpu_run_times_and_profiles_the_setting(profiler, tmp_path: Path, capsys) -> None:
    out = tmp_path / "profile.json"
    argv = ["--device", "cpu", "--model", str(TINY), "--batch-size", "2", "--seq", "32"]
    argv += ["--base", "execution=eager", "autocast=none", "--steps", "3", "--top", "4", "--out", str(out)]
    assert profiler.main(argv) == 0
    found = json.loads(out.read_text())["settings"]["reference"]
    assert found["step_s"] > 0 and found["device_busy_s"] is None  # a CPU trace has no device events
    assert set(found["allocator_bytes"]) == {"step_built", "step_freed", "released"}
    # The top rows are operators, or the optimizer's profiler range (torch.optim names its step so).
    assert 0 < len(found["operators"]) <= 4 and any(op["name"].startswith("aten::") for op in found["operators"])
    assert "reference: step" in capsys.readouterr().out


def test_the_host_ranges_say_what_the_host_does_a_step(profiler) -> None:
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def event(name: str, inclusive_us: float, self_us: float, device=DeviceType.CPU):
        return SimpleNamespace(name=name, device_type=device, cpu_time_total=inclusive_us, self_cpu_time_total=self_us)

    events = [
        event("Optimizer.step#AdamW.step", 60_000, 1_000),
        event("Optimizer.step#AdamW.step", 64_000, 1_000),
        event("aten::_foreach_mul_", 20_000, 20_000),
        event("Torch-Compiled Region", 10_000, 500),
        event("xla::program", 400_000, 400_000, device=DeviceType.PrivateUse1),  # the device's: not host time
    ]
    rows = profiler.host_ranges(events, steps=2, top=2)
    assert [row["name"] for row in rows] == ["Optimizer.step#AdamW.step", "aten::_foreach_mul_"]
    assert rows[0] == {
        "name": "Optimizer.step#AdamW.step",
        "calls_per_step": 1.0,
        "inclusive_ms_per_step": 62.0,
        "self_ms_per_step": 1.0,
    }
    result = {
        "model": "m",
        "device": "TPU v5e",
        "base": {},
        "settings": {"splash": {"step_s": 0.53, "device_busy_s": 0.37, "operators": [], "host_ranges": rows}},
    }
    assert "| Optimizer.step#AdamW.step | 1.0 | 62.00 | 1.00 |" in profiler.table(result)
