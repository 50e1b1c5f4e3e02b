"""A backend is one module and its registration: a fake backend registered in a fresh interpreter
reaches `tpu-tune devices`, the profile's device facts, the agents' definitions, the study's memory
limit and the tuned config, with no other edit (docs/design.md, "Adding a backend")."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import FIXTURES

FAKE_BACKEND = textwrap.dedent("""\
    import contextlib, io, json, pathlib, sys
    import torch
    from tpu_tuner import devices
    from tpu_tuner.core.errors import DefinitionError
    from tpu_tuner.devices.base import Backend, DeviceInfo, DevicePeak
    from tpu_tuner.tuning.agents.schema import load_tuning_agent_definition, seeds_for

    folder, fixtures = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    (folder / "compile.toml").write_text(
        (pathlib.Path("agents") / "compile.toml").read_text().replace('cpu = ["inductor"]', 'fake = ["inductor"]'))
    try:  # before it is registered, the agents' schema refuses the name
        load_tuning_agent_definition("compile", folder / "compile.toml")
        refused_before = False
    except DefinitionError:
        refused_before = True

    class FakeBackend(Backend):
        kind, label, memory_bounds_trials = "fake", "the fake runtime", True

        @classmethod
        def is_available(cls):
            return True

        @property
        def device(self):
            return torch.device("cpu")

        def info(self):
            peak = DevicePeak(flops_per_s={"float32": 2e12, "bfloat16": 8e12}, memory_bytes_per_s=5e11,
                              source="the fake datasheet")
            return DeviceInfo(kind="fake", name="Fake Accelerator 9000", count=4, memory_bytes=3 * 2**30, peak=peak)

        def synchronize(self):
            return None

        def matmul_dtype(self, precision):
            return "bfloat16"

        def peak_memory_bytes(self):
            return 2**20, "the fake allocator"

    devices.register(FakeBackend)

    from tpu_tuner.cli import main
    from tpu_tuner.knobs.tuned_config import TunedConfig
    from tpu_tuner.profiling.profile import profile
    from tpu_tuner.profiling.settings import ProfilerSettings
    from tpu_tuner.tuning.search.memory_limit import memory_limit
    from tpu_tuner.tuning.search.search_space import SearchSpace

    listing = io.StringIO()
    with contextlib.redirect_stdout(listing):
        main(["devices", "--json"])
    fake_row = next(row for row in json.loads(listing.getvalue())["backends"] if row["kind"] == "fake")
    settings = ProfilerSettings(warmup_min_steps=2, warmup_max_steps=5, timing_min_steps=5, timing_min_seconds=0.0,
                                timing_max_steps=10, profiled_steps=1, top_operators=5, explained_share_min=0.5)
    profiled = profile(fixtures / "tiny_gpt.py", device="fake", settings=settings)
    (folder / "space.toml").write_text('[[param]]\\nname = "matmul_precision"\\nagent = "precision"\\n'
                                       'choices.fake = ["highest", "medium"]\\n')
    space = SearchSpace.load(folder / "space.toml", "fake")
    saved = TunedConfig(space.to_candidate({"matmul_precision": "medium"}), "fake").save(folder / "tuned_config.toml")
    loaded = TunedConfig.load(saved)
    print(json.dumps({
        "devices": fake_row,
        "profile": [profiled.device.kind, profiled.device.name, profiled.device.count, profiled.device.peak.source],
        "refused_before": refused_before,
        "seeds": list(seeds_for(load_tuning_agent_definition("compile", folder / "compile.toml").seeds, "fake")),
        "memory_limit": memory_limit(None, "fake", 3 * 2**30).source,
        "tuned_config": [loaded.device_kind, loaded.candidate["matmul_precision"]],
    }))
    """)


def test_a_backend_registered_in_a_fresh_interpreter_reaches_devices_profile_agents_and_tuned_config(
    tmp_path: Path,
) -> None:
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", FAKE_BACKEND, str(tmp_path), str(FIXTURES)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "devices": {"kind": "fake", "available": True, "detail": "Fake Accelerator 9000 x 4"},
        "profile": ["fake", "Fake Accelerator 9000", 4, "the fake datasheet"],
        "refused_before": True,
        "seeds": ["inductor"],
        "memory_limit": "the device's memory",
        "tuned_config": ["fake", "medium"],
    }
    assert 'device_kind = "fake"' in (tmp_path / "tuned_config.toml").read_text()


def test_the_registry_and_the_agents_schema_list_backends_without_importing_torch() -> None:
    script = (
        "import sys; from tpu_tuner import devices; from tpu_tuner.tuning.agents.schema import "
        "load_tuning_agent_definition as load; seeds = load('compile').seeds; "
        "print(devices.names(), sorted(seeds), 'torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parent.parent,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == "('tpu', 'cuda', 'cpu') ['cpu', 'cuda', 'tpu'] False"
