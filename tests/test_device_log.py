"""A quiet terminal on a TPU host (issue 69, item 4; core/device_log.py): what TorchTPU and libtpu
write in the `tpu-tune` process itself (torch-tpu's autoload at ``import torch``: absl lines on
file descriptor 2, prints to sys.stderr, tagged warnings) goes to the run folder's device.log, and
the terminal's first line is tpu-tune's own; a failure before the folder exists keeps the lines
and names their file; a CPU host is untouched.

A fake TPU host: the parent's PCI bus reads a chip (`tpu_chips_on_host` replaced in a wrapper
process) and a stand-in torch-tpu, installed on PYTHONPATH with the real package's
``torch.backends`` entry point, writes each kind of line as torch-tpu 0.2.0 does (its sources:
``torch_tpu/__init__.py``, ``_loader.py``). The last test does it with the released torch-tpu
(its environment, ``-m torchtpu``), whose own PCI scan is shown a chip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES

from tpu_tuner.core.run_folder import DEVICE_LOG, WORKERS_LOG
from tpu_tuner.core.tpu_host import loads_torch_tpu

REPO = FIXTURES.parent.parent
MARK = "FAKE-TPU"

# torch-tpu's start-up, each line written the way the released package writes it.
FAKE_INIT = """\
import os
import warnings

warnings.warn("<TorchTpu/Performance/TcMalloc/> tcmalloc is not loaded (FAKE-TPU warning)", UserWarning)
ABSL = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR (FAKE-TPU absl)\\n"
os.write(2, ABSL)
"""
FAKE_LOADER = """\
import atexit
import os
import sys


def load():
    os.write(2, b"I0000 00:00:1796601743.903388    4830 pjrt_api.cc:119] GetPjrtApi was found (FAKE-TPU absl)\\n")
    print("Successfully renamed PrivateUse1 backend to 'tpu'. (FAKE-TPU print)", file=sys.stderr)
    print("Registered Python module for 'tpu'. (FAKE-TPU print)", file=sys.stderr)
    print("Initializing TPU distributed runtime (FAKE-TPU print)", file=sys.stderr)
    print("libtpu not found. (FAKE-TPU stdout)")
    # A line long after start-up, when the run folder exists: the runtime's teardown.
    atexit.register(os.write, 2, b"I0000 pjrt_c_api_client.cc:201] PjRtCApiClient destroyed (FAKE-TPU teardown)\\n")
"""
FAKE_LINES = [
    "FAKE-TPU warning",
    "FAKE-TPU absl",  # absl's "All log messages before ..."
    "FAKE-TPU absl",  # GetPjrtApi
    "FAKE-TPU print",
    "FAKE-TPU print",
    "FAKE-TPU print",
    "FAKE-TPU stdout",
]

# `tpu-tune` as on a TPU host: its PCI bus reads a chip. The autoload stays on (the environment's
# TORCH_DEVICE_BACKEND_AUTOLOAD=1, as a TPU host leaves it), in the parent and its workers.
TPU_HOST_CLI = """\
import sys
import tpu_tuner.core.tpu_host as host
host.tpu_chips_on_host = lambda pci_devices=None: {"v5e": 1}
from tpu_tuner.cli import main
sys.exit(main())
"""


def _fake_torch_tpu(site: Path) -> Path:
    """The stand-in installed in `site`: the package and its metadata with the real entry point's group."""
    (site / "torch_tpu").mkdir(parents=True)
    (site / "torch_tpu" / "__init__.py").write_text(FAKE_INIT)
    (site / "torch_tpu" / "_loader.py").write_text(FAKE_LOADER)
    info = site / "torch_tpu-0.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-tpu\nVersion: 0.2.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntorch_tpu = torch_tpu._loader:load\n")
    return site


def _fake_lines(text: str) -> list[str]:
    """The stand-in's lines in `text`, by the kind in their parentheses (a warning's indented
    source line is left out)."""
    return [line.split("(")[-1].rstrip(")") for line in text.splitlines() if MARK in line and not line.startswith(" ")]


def _tpu_host(args: list[str], site: Path, tmp: Path, prelude: str = "") -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "1",
        "TMPDIR": str(tmp),  # where a capture file is kept
    }
    return subprocess.run(
        [sys.executable, "-c", prelude + TPU_HOST_CLI, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )


def _fast_agent(tmp_path: Path) -> Path:
    agent = tmp_path / "fast.toml"
    agent.write_text("[timing]\nmin_steps = 10\nmin_seconds = 0\n[operators]\nprofiled_steps = 1\ntop = 5\n")
    return agent


def test_a_profile_on_a_tpu_host_keeps_torchtpus_lines_in_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import use_probe

    use_probe(monkeypatch, tmp_path / "cache")  # no roofline measurement in the worker
    site = _fake_torch_tpu(tmp_path / "site")
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "results"
    args = ["profile", str(FIXTURES / "noisy_mlp.py"), "--device", "cpu", "--out", str(out)]
    done = _tpu_host([*args, "--agent", str(_fast_agent(tmp_path))], site, tmp_path / "tmp")
    assert done.returncode == 0, done.stderr[-3000:]
    # The terminal: tpu-tune's lines only, the profile's table first; nothing of TorchTPU's.
    assert done.stdout.splitlines()[0].split()[0] == "workload", done.stdout[:2000]
    assert MARK not in done.stdout + done.stderr and done.stderr == ""
    (run_dir,) = out.iterdir()
    device = (run_dir / DEVICE_LOG).read_text()
    # Written at exit, the teardown's too: the descriptors point at device.log to the end.
    assert _fake_lines(device) == [*FAKE_LINES, "FAKE-TPU teardown"], device
    assert "UserWarning: <TorchTpu/Performance/TcMalloc/>" in device
    # The workers' own start-up lines stay in their log, and so do the model file's own prints,
    # as on CPU: the model runs in workers, never in the tpu-tune process.
    workers = (run_dir / WORKERS_LOG).read_text()
    assert "Initializing TPU distributed runtime (FAKE-TPU print)" in workers
    assert "NOISY-IMPORT through print" in workers and "NOISY" not in device
    assert not list((tmp_path / "tmp").glob("tpu-tune-device-*")), "the temporary file moved into the folder"


def test_a_failure_before_the_run_folder_keeps_the_lines_and_names_their_file(tmp_path: Path) -> None:
    site = _fake_torch_tpu(tmp_path / "site")
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "results"
    done = _tpu_host(
        ["profile", str(FIXTURES / "import_error.py"), "--device", "cpu", "--out", str(out)], site, tmp_path / "tmp"
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stdout == "" and not out.exists()
    error, where = done.stderr.splitlines()
    assert error.startswith("tpu-tune: error: ") and "boom at import" in error
    (kept,) = (tmp_path / "tmp").glob("tpu-tune-device-*.log")
    assert where == f"tpu-tune: what TorchTPU and libtpu wrote in this process is in {kept}"
    assert _fake_lines(kept.read_text()) == [*FAKE_LINES, "FAKE-TPU teardown"]


def test_help_shows_alone_and_leaves_no_file(tmp_path: Path) -> None:
    site = _fake_torch_tpu(tmp_path / "site")
    (tmp_path / "tmp").mkdir()
    done = _tpu_host(["buckets", "--help"], site, tmp_path / "tmp")  # its flags import torch
    assert done.returncode == 0 and done.stdout.startswith("usage: tpu-tune buckets"), done.stderr[-3000:]
    assert done.stderr == "" and not list((tmp_path / "tmp").glob("tpu-tune-device-*"))


# The capture's rules, in a process of its own (it takes this process's descriptors 1 and 2).
ROUTING = r"""
import os, sys, warnings
from pathlib import Path
from tpu_tuner.core import device_log

folder = Path(sys.argv[1])
log = device_log.start()
temporary = log.path
print("tpu-tune's first line")
os.write(2, b"native before the folder\n")
torchtpu = {"__name__": "torch_tpu._loader"}  # code of TorchTPU's: its prints and its warnings
code = 'print("a TorchTPU print", file=sys.stderr)\nwarnings.warn("<TorchTpu/ApiStage/> experimental")'
exec(code, torchtpu | {"sys": sys, "warnings": warnings})
warnings.warn("<TorchTpu/Performance/> from C++, no TorchTPU frame")
print("tpu-tune quotes <TorchTpu/Performance/> in its own message", file=sys.stderr)
assert device_log.move_into(folder) == folder / "device.log" and not temporary.exists()
os.write(1, b"native after the folder\n")
print("tpu-tune's last line", flush=True)
assert log.finish(keep=True) is None  # the run folder has them
raise RuntimeError("a traceback of tpu-tune's")
"""


def test_the_device_runtimes_writes_follow_the_descriptors_and_tpu_tunes_reach_the_terminal(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / DEVICE_LOG).write_text("an earlier run's line\n")  # a resumed run appends
    done = subprocess.run(
        [sys.executable, "-c", ROUTING, str(tmp_path / "run")], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 1
    assert done.stdout == "tpu-tune's first line\ntpu-tune's last line\n"
    assert done.stderr.startswith("tpu-tune quotes <TorchTpu/Performance/> in its own message\nTraceback")
    assert done.stderr.rstrip().endswith("RuntimeError: a traceback of tpu-tune's")
    logged = (tmp_path / "run" / DEVICE_LOG).read_text().splitlines()
    assert [line.split("UserWarning: ")[-1] for line in logged if not line.startswith(" ")] == [
        "an earlier run's line",
        "native before the folder",
        "a TorchTPU print",
        "<TorchTpu/ApiStage/> experimental",
        "<TorchTpu/Performance/> from C++, no TorchTPU frame",
        "native after the folder",
    ]


MOVES = r"""
import os, sys
from pathlib import Path
from tpu_tuner.core import device_log

root = Path(sys.argv[1])
log = device_log.start()
first = log.path
os.write(2, b"help's start-up\n")
assert log.finish(keep=False) is None and not first.exists()  # a success without a folder: nothing to keep
assert device_log.start() is log and log.path != first  # the next command, a new file
assert log.finish(keep=True) is None and not log.path.exists()  # nothing written: nothing to name
device_log.start()
os.write(2, b"a full disk's line\n")
assert device_log.move_into(root / "no-such-folder") == log.path and log.temporary  # the move failed
assert log.finish(keep=False) == log.path  # so the file is kept, named even for a success
print(log.path.read_text(), end="")
"""


def test_a_capture_that_cannot_move_keeps_its_file_and_one_with_nothing_leaves_none(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", MOVES, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "a full disk's line\n"
    assert "could not be written" in done.stderr  # said on the terminal (a log record of the library's)
    (kept,) = tmp_path.glob("tpu-tune-device-*")
    assert kept.read_text() == "a full disk's line\n"


def _pci_tree(root: Path, device: str) -> Path:
    (root / "0000:00:04.0").mkdir(parents=True)
    (root / "0000:00:04.0" / "vendor").write_text("0x1ae0\n")
    (root / "0000:00:04.0" / "device").write_text(device + "\n")
    return root


def test_only_a_tpu_host_with_torch_tpu_is_quieted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from tpu_tuner.cli import main
    from tpu_tuner.core import device_log

    tpu_vm, gvnic_only = _pci_tree(tmp_path / "tpu", "0x0063"), _pci_tree(tmp_path / "cpu", "0x0042")
    real_find_spec = importlib.util.find_spec
    installed = {"torch_tpu": True}
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (
            (object() if installed["torch_tpu"] else None) if name == "torch_tpu" else real_find_spec(name, *a)
        ),
    )
    assert loads_torch_tpu(tpu_vm) and not loads_torch_tpu(gvnic_only)
    installed["torch_tpu"] = False
    assert not loads_torch_tpu(tpu_vm)
    # This host (no chip): the CLI begins no capture, and its streams are the terminal's as before.
    stdout = sys.stdout
    assert main(["profile", str(tmp_path / "missing.py")]) == 2
    assert device_log.current() is None and sys.stdout is stdout


# Slow: a whole tuning run (~20 s here); its run folder is made in the tuning phases, after the
# first worker loaded the model.
@pytest.mark.slow
def test_a_tuning_run_on_a_tpu_host_keeps_torchtpus_lines_in_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import use_probe

    use_probe(monkeypatch, tmp_path / "cache", medium_relative_error=2.5e-3)
    site = _fake_torch_tpu(tmp_path / "site")
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "results"
    args = ["--trials", "2", "--time-budget", "none", "--verify-rounds", "2", "--space", "precision"]
    done = _tpu_host(
        [str(FIXTURES / "noisy_mlp.py"), "--device", "cpu", *args, "--out", str(out)], site, tmp_path / "tmp"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("[profile |") and MARK not in done.stdout + done.stderr, done.stdout[:2000]
    (run_dir,) = out.iterdir()
    assert _fake_lines((run_dir / DEVICE_LOG).read_text()) == [*FAKE_LINES, "FAKE-TPU teardown"]
    assert "NOISY-IMPORT through print" in (run_dir / WORKERS_LOG).read_text()


# The released torch-tpu, shown a chip by its own PCI scan (``_scan_pci_tpus``, read when
# ``_loader.load`` decides whether to start the device): its real start-up lines.
REAL_CHIP = """\
import importlib.abc, importlib.machinery, sys


class _Chip(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch_tpu._internal.utils.hardware":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            module._scan_pci_tpus = lambda: (1, {1: "1,1,1"})

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Chip())
"""


@pytest.mark.torchtpu
def test_the_released_torch_tpus_start_up_lines_go_to_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import use_probe

    use_probe(monkeypatch, tmp_path / "cache")
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "results"
    args = ["profile", str(FIXTURES / "noisy_mlp.py"), "--device", "cpu", "--out", str(out)]
    done = _tpu_host([*args, "--agent", str(_fast_agent(tmp_path))], tmp_path, tmp_path / "tmp", prelude=REAL_CHIP)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[0].split()[0] == "workload" and done.stderr == "", done.stdout[:2000]
    (run_dir,) = out.iterdir()
    device = (run_dir / DEVICE_LOG).read_text()
    for line in (
        "UserWarning: <TorchTpu/Performance/TcMalloc/> tcmalloc is not loaded",
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "pjrt_api.cc:119] GetPjrtApi was found for TPU",
        "Successfully renamed PrivateUse1 backend to 'tpu'",
        "Registered Python module for 'tpu'.",
        "Device type: tpu, Device index: default",
        "Initializing TPU distributed runtime",
        "libtpu_version.cc:63] Setting libtpu version to",
    ):
        assert line in device, device
