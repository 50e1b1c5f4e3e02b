"""TPU chips read from a PCI tree, and the environment that keeps libtpu quiet without one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tpu_tuner.core.tpu_host import child_environment, settle_tpu_environment, tpu_chips_on_host


def _pci_tree(root: Path, devices: dict[str, tuple[str, str]]) -> Path:
    for address, (vendor, device) in devices.items():
        folder = root / address
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(vendor + "\n")
        (folder / "device").write_text(device + "\n")
    return root


def test_chips_are_google_tpu_device_ids_not_every_google_device(tmp_path: Path) -> None:
    tree = _pci_tree(
        tmp_path / "pci",
        {
            "0000:00:04.0": ("0x1ae0", "0x0062"),
            "0000:00:05.0": ("0x1ae0", "0x0062"),  # two v5p chips
            "0000:00:06.0": ("0x1ae0", "0x0042"),  # GCE's gVNIC: Google's vendor id, not a TPU
            "0000:00:07.0": ("0x8086", "0x1237"),
        },
    )
    assert tpu_chips_on_host(tree) == {"v5p": 2}
    assert tpu_chips_on_host(tmp_path / "absent") == {}


def test_without_a_chip_libtpu_is_told_not_to_ask_the_metadata_server(tmp_path: Path, monkeypatch) -> None:
    no_chip = _pci_tree(tmp_path / "cpu-host", {"0000:00:07.0": ("0x8086", "0x1237")})
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",  # torch-tpu installed: its autoload goes too
        lambda name, *a: object() if name == "torch_tpu" else real_find_spec(name, *a),
    )
    both = {"TPU_SKIP_MDS_QUERY": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    environ: dict[str, str] = {}
    assert settle_tpu_environment(environ, no_chip, torch_imported=False) == both and environ == both
    # Once torch is imported the autoload has happened: only libtpu's variable is worth setting.
    environ = {}
    assert settle_tpu_environment(environ, no_chip, torch_imported=True) == {"TPU_SKIP_MDS_QUERY": "1"}
    assert child_environment({}, no_chip) == both
    # The user's own value wins.
    environ = {"TPU_SKIP_MDS_QUERY": "0"}
    assert settle_tpu_environment(environ, no_chip, torch_imported=True) == {}
    assert environ == {"TPU_SKIP_MDS_QUERY": "0"}
    assert child_environment({"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}, no_chip) == {"TPU_SKIP_MDS_QUERY": "1"}
    # Without torch-tpu the autoload switch stays alone: it would turn off other torch plugins too.
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch_tpu" else real_find_spec(name, *a)
    )
    assert child_environment({}, no_chip) == {"TPU_SKIP_MDS_QUERY": "1"}


def test_a_tpu_host_keeps_libtpus_own_discovery(tmp_path: Path) -> None:
    tpu_vm = _pci_tree(tmp_path / "tpu-vm", {"0000:00:04.0": ("0x1ae0", "0x006f")})
    environ: dict[str, str] = {}
    assert settle_tpu_environment(environ, tpu_vm, torch_imported=False) == {} and environ == {}
    assert child_environment({}, tpu_vm) == {}


def test_devices_command_names_each_backend_and_the_installed_versions() -> None:
    import importlib.util
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "tpu_tuner.cli", "devices", "--json"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    import json

    report = json.loads(result.stdout)
    rows = {row["kind"]: row for row in report["backends"]}
    assert list(rows) == ["tpu", "cuda", "cpu"] and rows["cpu"]["available"]
    assert report["versions"]["torch"].startswith("2.13.0")
    if importlib.util.find_spec("torch_tpu") is None:  # the default environment
        assert rows["tpu"] == {
            "kind": "tpu",
            "available": False,
            "detail": "torch-tpu is not installed (pip install -e '.[tpu]')",
        }
        assert report["torchtpu_api_ok"] is None and report["versions"]["torch-tpu"] is None
        assert report["torchtpu_api"] == "TorchTPU: not installed (pip install -e '.[tpu]')"
    else:
        assert report["torchtpu_api_ok"] is True and not report["torchtpu_missing"]
