"""The TorchTPU adapter's own logic against a stand-in ``torch.tpu`` (the default environment has
no torch-tpu). The stand-in has the shapes of the released 0.2.0's names (an EagerMode enum, the
``set_eager_mode`` context manager, ``_get_cache_stats`` returning counters as attributes);
tests/test_torchtpu_contract.py checks those names against the real package."""

from __future__ import annotations

import contextlib
import enum
import importlib.util
import sys
import types

import pytest
import torch

from tpu_tuner.core.errors import BackendError
from tpu_tuner.devices import get_backend
from tpu_tuner.devices.torchtpu import EAGER_MODE_ENV, TorchTpuBackend
from tpu_tuner.knobs.candidate import Candidate


class EagerMode(enum.Enum):
    DEFER_AND_FUSE = 0
    DEFER_NEVER = 1
    DEFER_NEVER_AND_LAUNCH_BLOCKING = 2


@pytest.fixture
def fake_tpu(monkeypatch):
    state = types.SimpleNamespace(mode=EagerMode.DEFER_NEVER)

    @contextlib.contextmanager
    def set_eager_mode(mode):
        previous, state.mode = state.mode, mode
        try:
            yield
        finally:
            state.mode = previous

    tpu = types.SimpleNamespace(
        EagerMode=EagerMode,
        set_eager_mode=set_eager_mode,
        get_device_name=lambda: "TPU v5p",
        get_device_properties=lambda: types.SimpleNamespace(total_memory=95 * 1024**3),
        _get_cache_stats=lambda: types.SimpleNamespace(num_compilations=3, num_cache_reqs=10, num_cache_hits=7),
    )
    hardware = types.ModuleType("torch_tpu._internal.utils.hardware")
    hardware.get_bf16_flops_per_device = lambda: None  # unknown to the runtime: our table answers
    for name in ("torch_tpu", "torch_tpu._internal", "torch_tpu._internal.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "torch_tpu._internal.utils.hardware", hardware)
    monkeypatch.setattr(torch, "tpu", tpu, raising=False)
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 4)
    return state


def test_peak_comes_from_the_spec_table_where_the_runtime_has_none(fake_tpu) -> None:
    info = TorchTpuBackend().info()
    assert (info.kind, info.name, info.count) == ("tpu", "TPU v5p", 4)
    assert info.peak.flops_per_s["bfloat16"] == 459e12
    assert info.peak.memory_bytes_per_s == 2765e9
    assert "Google TPU spec table (v5p)" in info.peak.source
    assert info.memory_bytes == 95 * 1024**3


def test_a_tpu7x_device_has_half_its_chips_peak_and_bandwidth(fake_tpu) -> None:
    torch.tpu.get_device_name = lambda: "TPU v7"  # torch-tpu 0.2.0's name for a TPU7x device
    info = TorchTpuBackend().info()
    assert info.peak.flops_per_s["bfloat16"] == pytest.approx(2307e12 / 2)
    assert info.peak.memory_bytes_per_s == pytest.approx(7380e9 / 2)  # the chip's two devices share its HBM


def test_an_unknown_generation_is_an_error_not_a_guess(fake_tpu) -> None:
    torch.tpu.get_device_name = lambda: "TPU"  # what 0.2.0 answers for a chip it does not know
    with pytest.raises(BackendError, match="unknown TPU generation 'TPU'"):
        TorchTpuBackend().info()


def test_eager_mode_and_precision_are_applied_and_restored(fake_tpu) -> None:
    backend = TorchTpuBackend()
    before = torch.get_float32_matmul_precision()
    with Candidate(execution="eager:defer_and_fuse", matmul_precision="medium").process(backend):
        assert fake_tpu.mode is EagerMode.DEFER_AND_FUSE
        assert torch.get_float32_matmul_precision() == "medium"
    assert fake_tpu.mode is EagerMode.DEFER_NEVER
    assert torch.get_float32_matmul_precision() == before
    assert EAGER_MODE_ENV["defer_and_fuse"] == {"TORCH_TPU_DEFER_AND_FUSE": "1"}
    assert EAGER_MODE_ENV["debug"] == {"TORCH_TPU_LAUNCH_BLOCKING": "1"}


def test_compile_events_read_the_cache_counters(fake_tpu) -> None:
    events = TorchTpuBackend().compile_events()
    assert (events["tpu_compilations"], events["tpu_cache_requests"], events["tpu_cache_hits"]) == (3, 10, 7)
    assert TorchTpuBackend().default_compile_backend() == "tpu"
    # MFU on TPU is quoted against the bf16 peak, whatever the matmul precision.
    assert Candidate(matmul_precision="highest").compute_dtype(TorchTpuBackend()) == "bfloat16"


def test_a_mode_on_the_tpu_compile_backend_is_refused() -> None:
    # torch passes mode on to the backend, and torch-tpu 0.2.0 raises TypeError on it.
    with pytest.raises(ValueError, match="TorchTPU's compile backend takes no mode"):
        Candidate(execution="tpu:max-autotune")
    assert Candidate(execution="tpu")["execution"] == "tpu"


@pytest.mark.skipif(importlib.util.find_spec("torch_tpu") is not None, reason="torch-tpu is installed here")
def test_not_available_without_the_package_and_says_why() -> None:
    assert TorchTpuBackend.unavailable_reason() == "torch-tpu is not installed (pip install -e '.[tpu]')"
    with pytest.raises(BackendError, match="'tpu' is not available here: torch-tpu is not installed"):
        get_backend("tpu")


def test_unavailable_says_which_requirement_is_missing(monkeypatch, tmp_path) -> None:
    from importlib import metadata

    import tpu_tuner.devices.torchtpu as adapter

    versions = {"torch-tpu": "0.3.0", "libtpu": "0.0.52"}

    def version(name: str) -> str:
        if name not in versions:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(adapter, "installed_version", lambda: versions.get("torch-tpu"))
    monkeypatch.setattr(adapter, "package_folder", lambda: tmp_path)
    monkeypatch.setattr(adapter.metadata, "version", version)
    monkeypatch.setattr(adapter, "tpu_chips_on_host", lambda: {})
    assert TorchTpuBackend.unavailable_reason() == (
        "torch-tpu 0.3.0 is outside the releases tpu-tune was checked against (0.2.x)"
    )
    versions["torch-tpu"] = "0.2.0"
    versions["libtpu"] = "0.0.42.1"  # the planner's libtpu, installed over torch-tpu's
    assert TorchTpuBackend.unavailable_reason() == "libtpu 0.0.42.1 is older than torch-tpu 0.2.0 needs (>= 0.0.50)"
    del versions["libtpu"]
    assert TorchTpuBackend.unavailable_reason() == "libtpu is not installed (torch-tpu 0.2.0 needs libtpu >= 0.0.50)"
    versions["libtpu"] = "0.0.52"
    assert TorchTpuBackend.unavailable_reason() == "no TPU chip on this host's PCI bus"
    # A TPU host whose TorchTPU cannot run is an error for --device auto, never a silent CPU run.
    monkeypatch.setattr("tpu_tuner.core.tpu_host.tpu_chips_on_host", lambda: {"v5p": 4})
    monkeypatch.setattr(TorchTpuBackend, "unavailable_reason", classmethod(lambda cls: "libtpu 0.0.42 is older"))
    with pytest.raises(BackendError, match="this host has TPU chips but TorchTPU cannot run here: libtpu 0.0.42"):
        get_backend("auto")


def test_launch_environment_hands_the_ranks_torchtpus_variables_and_keeps_the_parents(fake_tpu, monkeypatch) -> None:
    import os

    from tpu_tuner.core.errors import UserInputError

    def set_tpu_launch_env(*, nproc_per_node: int) -> None:  # fills unset variables, as 0.2.0's does
        if nproc_per_node == 3:
            raise RuntimeError("no TPU topology for 3 devices")
        os.environ.setdefault("TORCH_TPU_TOPOLOGY", "2,2,1")
        os.environ["TORCH_TPU_SLICEBUILDER_ADDRESSES"] = "localhost:8070,localhost:8071"

    torch.tpu.distributed = types.SimpleNamespace(set_tpu_launch_env=set_tpu_launch_env)
    monkeypatch.delenv("TORCH_TPU_TOPOLOGY", raising=False)
    monkeypatch.setenv("TORCH_TPU_SLICEBUILDER_ADDRESSES", "mine")
    before = dict(os.environ)
    assert TorchTpuBackend.launch_environment(4) == {
        "TORCH_TPU_TOPOLOGY": "2,2,1",
        "TORCH_TPU_SLICEBUILDER_ADDRESSES": "localhost:8070,localhost:8071",
    }
    assert dict(os.environ) == before
    with pytest.raises(UserInputError, match="--nproc 3: TorchTPU cannot lay out 3 ranks"):
        TorchTpuBackend.launch_environment(3)
    assert dict(os.environ) == before


def test_on_several_hosts_set_tpu_launch_env_gets_nnodes_and_decides_the_host_s_node_rank(
    fake_tpu, monkeypatch
) -> None:
    import os

    from tpu_tuner.core.errors import UserInputError

    calls = []

    def set_tpu_launch_env(*, nproc_per_node: int, nnodes: int | None = None) -> None:  # 0.2.0's keywords
        calls.append((nnodes, nproc_per_node))
        if nnodes == 3:
            raise ValueError("expected nnodes to match the number of hosts in TPU_WORKER_HOSTNAMES (2)")
        os.environ.setdefault("NODE_RANK", "1")
        os.environ["TORCH_TPU_SLICEBUILDER_ADDRESSES"] = "a:8070,a:8071,b:8070,b:8071"

    torch.tpu.distributed = types.SimpleNamespace(set_tpu_launch_env=set_tpu_launch_env)
    monkeypatch.delenv("NODE_RANK", raising=False)
    before = dict(os.environ)
    assert TorchTpuBackend.launch_environment(2, nnodes=2) == {
        "NODE_RANK": "1",
        "TORCH_TPU_SLICEBUILDER_ADDRESSES": "a:8070,a:8071,b:8070,b:8071",
    }
    assert TorchTpuBackend.host_node_rank(2, 2) == 1 and dict(os.environ) == before
    monkeypatch.setenv("NODE_RANK", "0")  # pinned by an operator: TorchTPU keeps it, and so does the adapter
    assert TorchTpuBackend.host_node_rank(2, 2) == 0
    assert calls == [(2, 2), (2, 2), (2, 2)]
    with pytest.raises(UserInputError, match="--nproc 2 --nnodes 3: TorchTPU cannot lay out 2 ranks a host on 3 hosts"):
        TorchTpuBackend.launch_environment(2, nnodes=3)


def test_the_runtimes_peak_wins_over_the_table(fake_tpu) -> None:
    sys.modules["torch_tpu._internal.utils.hardware"].get_bf16_flops_per_device = lambda: 4.59e14
    info = TorchTpuBackend().info()
    assert info.peak.flops_per_s["bfloat16"] == 4.59e14
    assert info.peak.source == "torch_tpu hardware table (get_bf16_flops_per_device)"
