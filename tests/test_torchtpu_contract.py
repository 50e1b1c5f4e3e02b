"""The TorchTPU adapter against the released torch-tpu, installed (no TPU needed).

Runs in the TorchTPU environment (``pip install -e ".[tpu,test]"``; `.ci/run` makes it in
.venv-tpu and runs ``pytest -m torchtpu`` there); the default environment deselects it. It does not
skip where torch-tpu is missing: selected without the package, it fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tpu_tuner.devices.torchtpu_api import (
    COMPILE_OPTIONS,
    ENUM_MEMBERS,
    ENVIRONMENT_VARIABLES,
    LAUNCH_VARIABLES,
    PUBLIC_NAMES,
    TESTED_VERSION,
    check_api,
)

pytestmark = pytest.mark.torchtpu


def _python(code: str, env: dict[str, str] | None = None, timeout: float = 180, drop: tuple[str, ...] = ()) -> str:
    base = {k: v for k, v in os.environ.items() if k not in drop}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**base, **(env or {})},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_every_name_the_adapter_uses_is_in_the_installed_package() -> None:
    check = check_api()
    assert check.version == TESTED_VERSION
    assert check.ok, check.summary()
    kinds = {c.kind for c in check.checks}
    assert kinds == {
        "public name",
        "enum member",
        "parameter",
        "result field",
        "private name",
        "compile backend",
        "compile option",
        "process group backend",
        "environment variable",
        "launch variable",
    }
    assert check.summary() == f"TorchTPU {TESTED_VERSION}: {len(check.checks)} names used, all present"


def test_a_name_that_moved_fails_the_check_naming_it() -> None:
    check = check_api(
        public_names=(*PUBLIC_NAMES, ("torch.tpu", "eager_mode_v2")),
        enum_members={**ENUM_MEMBERS, "EagerMode": (*ENUM_MEMBERS["EagerMode"], "DEFER_ALWAYS")},
        compile_options=(*COMPILE_OPTIONS, "dynamic_buckets"),
        environment_variables=(*ENVIRONMENT_VARIABLES, "TORCH_TPU_EAGER_MODE"),
        process_group_backend="xla_dist",
        launch_variables=(*LAUNCH_VARIABLES, "TPU_WORKER_ID"),
    )
    assert not check.ok
    assert {c.name: c.detail for c in check.missing} == {
        "torch.tpu.eager_mode_v2": "not in torch_tpu's public API table",
        "torch.tpu.EagerMode.DEFER_ALWAYS": "no such member",
        "options={'dynamic_buckets': ...}": "not read by the tpu backend",
        "TORCH_TPU_EAGER_MODE": "not in its libraries",
        'init_process_group("xla_dist")': "never registered",
        "TPU_WORKER_ID": "not read or set by set_tpu_launch_env",
    }
    assert "6 missing: torch.tpu.eager_mode_v2 (not in torch_tpu's public API table)" in check.summary()


def test_the_eager_modes_map_onto_the_real_enum_in_process_and_at_start_up() -> None:
    from tpu_tuner.devices.torchtpu import EAGER_MODE_ENUM, EAGER_MODE_ENV, TorchTpuBackend, torch_tpu_module

    tpu = torch_tpu_module()
    before = tpu.eager_mode
    with TorchTpuBackend().eager_mode("defer_and_fuse"):
        assert tpu.eager_mode == tpu.EagerMode.DEFER_AND_FUSE
    assert tpu.eager_mode == before == tpu.EagerMode.DEFER_NEVER
    # The start-up variables: read once by the C++ runtime, so each mode in a fresh process.
    for mode, variables in EAGER_MODE_ENV.items():
        seen = _python("import torch, torch_tpu; print(torch.tpu.eager_mode.name)", env=variables)
        assert seen == EAGER_MODE_ENUM[mode], (mode, variables, seen)


def test_the_tpu_compile_backend_is_registered_and_refuses_a_mode() -> None:
    import torch
    import torch_tpu  # noqa: F401
    from torch._dynamo.backends.registry import lookup_backend

    graph = torch.fx.symbolic_trace(lambda x: x * 2)
    with pytest.raises(TypeError, match="mode"):  # why the execution knob refuses "tpu:<mode>"
        lookup_backend("tpu")(graph, [torch.ones(2)], mode="max-autotune")
    with pytest.raises(ValueError, match="num_dynamic_buckets"):  # the bucketing's option, range 1..8
        lookup_backend("tpu")(graph, [torch.ones(2)], options={"num_dynamic_buckets": 9})


def test_the_fused_adamw_the_tpu_space_offers_has_a_kernel_for_the_device() -> None:
    """`optimizer_impl = fused` on TPU (search_spaces/default.toml) runs torch's fused AdamW, which
    torch-tpu implements for its device: the dispatcher holds a kernel for the device's key."""
    code = """
        import torch, torch_tpu
        print(torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_adamw_", "PrivateUse1"))
    """
    assert _python(code, env={"TPU_SKIP_MDS_QUERY": "1"}) == "True"


def test_a_multi_host_slice_s_launch_environment_comes_from_set_tpu_launch_env_with_nnodes() -> None:
    """TorchTPU's own multi-host path, run without a chip: two workers named in
    TPU_WORKER_HOSTNAMES, this one JOB_COMPLETION_INDEX 1 (a JobSet's second pod). The adapter
    hands the ranks the slice-builder addresses of both hosts' devices and reads this host's node
    rank from TorchTPU's NODE_RANK; its own environment is left as it was."""
    out = _python(
        """
        import json, os
        from tpu_tuner.devices.torchtpu import TorchTpuBackend
        before = dict(os.environ)
        env = TorchTpuBackend.launch_environment(4, 2)
        node = TorchTpuBackend.host_node_rank(4, 2)
        print(json.dumps({"env": env, "node": node, "kept": dict(os.environ) == before}))
    """,
        env={"TPU_WORKER_HOSTNAMES": "host-a,host-b", "JOB_COMPLETION_INDEX": "1"},
        drop=("NODE_RANK", "NNODES", "TORCH_TPU_SLICEBUILDER_ADDRESSES", "MASTER_ADDR"),
    )
    import json

    seen = json.loads(out)
    assert seen["node"] == 1 and seen["kept"]
    assert seen["env"]["NODE_RANK"] == "1" and seen["env"]["NNODES"] == "2"
    assert seen["env"]["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",") == [
        f"{host}:{8070 + i}" for host in ("host-a", "host-b") for i in range(4)
    ]


def test_on_a_host_without_a_chip_the_backend_says_so_and_a_backward_pass_does_not_hang() -> None:
    from tpu_tuner.devices.torchtpu import TorchTpuBackend

    assert TorchTpuBackend.unavailable_reason() == "no TPU chip on this host's PCI bus"
    # With torch-tpu autoloaded, the first backward pass starts libtpu, which without
    # TPU_SKIP_MDS_QUERY asks the metadata server for minutes; importing tpu_tuner sets it (this
    # process already has it from its own import, so the child starts without it).
    out = _python(
        """
        import time, torch, tpu_tuner
        start = time.perf_counter()
        torch.nn.Linear(4, 4)(torch.randn(2, 4)).sum().backward()
        print(hasattr(torch, "tpu"), torch.accelerator.device_count(), round(time.perf_counter() - start, 1))
    """,
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"},
        timeout=120,
        drop=("TPU_SKIP_MDS_QUERY",),
    )
    autoloaded, devices, seconds = out.split()
    assert (autoloaded, devices) == ("True", "0") and float(seconds) < 30


def test_devices_command_lists_each_backend_and_the_api_check() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tpu_tuner.cli", "devices"], capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["backend", "available", "device", "/", "why", "not"]
    assert lines[1].split(None, 2) == ["tpu", "no", "no TPU chip on this host's PCI bus"]
    assert lines[3].startswith("cpu ") and " yes " in lines[3]
    assert f"torch-tpu {TESTED_VERSION}" in result.stdout and "libtpu 0.0." in result.stdout
    assert lines[-1].startswith(f"TorchTPU {TESTED_VERSION}: ") and lines[-1].endswith("names used, all present")
