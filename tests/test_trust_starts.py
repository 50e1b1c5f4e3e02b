"""Issue 12, items 1, 2, 3 and 9: secrets kept, crashes at import contained, resume checked,
bad starts refused in seconds, dead runs shown as failed or incomplete (docs/run-safety.md)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, FIXTURES, serving
from tpu_tuner.cli import main
from tpu_tuner.core.credentials import redact, without_password
from tpu_tuner.core.errors import UserInputError, WorkloadError
from tpu_tuner.runner.trial_runner import TrialRunner
from tpu_tuner.studies import run_file
from tpu_tuner.tuning.options.tune_options import OutputOptions, SearchOptions, StoreOptions

SECRET = "SECRETPASS"
PG_URL = f"postgresql://user:{SECRET}@localhost:5432/optuna"


# --- 1. secrets -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        (PG_URL, "postgresql://user:***@localhost:5432/optuna"),
        (
            f"cannot open 'postgresql+psycopg://me:{SECRET}@db/x': refused",
            "cannot open 'postgresql+psycopg://me:***@db/x': refused",
        ),
        (f"mysql://a:p@ss{SECRET}@h/d", "mysql://a:***@h/d"),
        (f"postgresql://u@h/d?password={SECRET}&sslmode=require", "postgresql://u@h/d?password=***&sslmode=require"),
        ("postgresql://h:5432/db and sqlite:////tmp/a.db", "postgresql://h:5432/db and sqlite:////tmp/a.db"),
    ],
)
def test_redact_removes_passwords_from_urls_in_text(text: str, expected: str) -> None:
    assert redact(text) == expected
    assert without_password(PG_URL) == "postgresql://user@localhost:5432/optuna"


def test_run_json_never_holds_the_password_but_resume_gets_it_back(tmp_path: Path) -> None:
    from tpu_tuner.tuning.options.tune_options import TuneOptions
    from tpu_tuner.tuning.run.run_location import run_location

    fingerprint = {"model_file": "m.py", "sha256": "0" * 64}
    location = run_location(
        "m", TuneOptions(store=StoreOptions(url=PG_URL), outputs=OutputOptions(out=tmp_path)), fingerprint
    )
    run_dir, storage = location.run_dir, location.storage
    assert storage == PG_URL  # what the process connects with
    assert SECRET not in (run_dir / "run.json").read_text()
    assert json.loads((run_dir / "run.json").read_text())["storage"] == without_password(PG_URL)
    # Resume: the password comes from --storage given again, which must name the same database.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("tpu_tuner.tuning.run.run_location.check_storage", lambda url: None)
        resumed = run_location("m", TuneOptions(store=StoreOptions(resume=run_dir, url=PG_URL)), fingerprint)
        assert resumed.storage == PG_URL and resumed.resumed and not resumed.shared
        with pytest.raises(UserInputError, match="is not the run's storage") as info:
            run_location(
                "m", TuneOptions(store=StoreOptions(resume=run_dir, url=PG_URL.replace("optuna", "other"))), fingerprint
            )
        assert SECRET not in str(info.value)


def test_log_lines_are_redacted_by_the_cli_filter(caplog) -> None:
    import logging

    from tpu_tuner.core.credentials import RedactingFilter

    record = logging.LogRecord("tpu_tuner.x", logging.WARNING, __file__, 1, "opening %s failed", (PG_URL,), None)
    assert RedactingFilter().filter(record)
    assert SECRET not in record.getMessage() and "user:***@localhost" in record.getMessage()


def test_storage_url_with_password_is_refused_at_once_without_leaking(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(TrialRunner, "_start", _no_worker)
    status = main(["tune", str(EXAMPLES / "mlp.py"), "--storage", PG_URL, "--out", str(tmp_path / "results")])
    err = capsys.readouterr().err
    assert status == 2
    assert SECRET not in err and "user:***@localhost" in err
    assert not (tmp_path / "results").exists()


def test_dashboard_server_never_serves_a_password_from_old_run_folders(tmp_path: Path) -> None:
    old = tmp_path / "mlp-tune-20250101-000000"
    old.mkdir()
    (old / "run.json").write_text(json.dumps({"storage": PG_URL, "study_name": old.name}))
    (old / "report.md").write_text(f"storage: {PG_URL}\n")
    with serving(tmp_path) as server:
        for name in ("run.json", "report.md"):
            body = urllib.request.urlopen(f"{server.url}{old.name}/{name}").read().decode()
            assert SECRET not in body and "user:***@" in body
        assert SECRET not in urllib.request.urlopen(server.url).read().decode()


# --- 2. the parent never runs user code -------------------------------------------------------


# Each command once and each way to die at least once: the three share one screening worker.
@pytest.mark.parametrize(
    "command, fixture, expected",
    [
        (["tune"], "segfault_at_import.py", "the process died from SIGSEGV while importing"),
        (["profile"], "exit_at_import.py", "the process exited with status 3 while importing"),
        (["buckets"], "segfault_at_import.py", "the process died from SIGSEGV while importing"),
    ],
)
def test_a_crash_while_importing_is_reported_not_fatal(
    tmp_path: Path, command: list[str], fixture: str, expected: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tpu_tuner.cli", *command, str(FIXTURES / fixture), "--out", str(tmp_path / "results")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert f"{FIXTURES / fixture}: {expected}" in done.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.slow  # a whole `tpu-tune plan` command (JAX and libtpu loaded): about 15 s on 2 loaded cores
def test_plan_screens_the_file_in_a_worker_first(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpu_tuner.cli",
            "plan",
            str(FIXTURES / "segfault_at_import.py"),
            "--topology",
            "v5p-8",
            "--out",
            str(tmp_path / "results"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "the process died from SIGSEGV while importing" in done.stderr
    assert not any((tmp_path / "results").glob("*"))


def test_tune_and_buckets_do_not_import_the_model_file_in_this_process(monkeypatch) -> None:
    import tpu_tuner.model.workloads.loader

    def refuse(*args, **kwargs):
        raise AssertionError("the parent imported the model file")

    monkeypatch.setattr(tpu_tuner.model.workloads.loader, "_import_file", refuse)
    from tpu_tuner.bucketing.study import BucketOptions, plan_buckets

    # The worker loads the file (its own process, not patched); a file without a length sample is
    # then refused in the parent, from the worker's summary.
    with pytest.raises(UserInputError, match="no length sample"):
        plan_buckets(EXAMPLES / "mlp.py", BucketOptions())


# --- 3. resume checks the workload --------------------------------------------------------------


def test_resume_with_another_model_is_refused_and_rewrites_nothing(tmp_path: Path) -> None:
    from tpu_tuner.api import tune
    from tpu_tuner.runner.load import load_summary
    from tpu_tuner.studies.fingerprint import fingerprint
    from tpu_tuner.tuning.options.tune_options import TuneOptions
    from tpu_tuner.tuning.run.run_location import run_location

    with TrialRunner(str(EXAMPLES / "mlp.py")) as runner:
        summary = load_summary(runner, EXAMPLES / "mlp.py")
    run_dir = run_location(
        "mlp", TuneOptions(outputs=OutputOptions(out=tmp_path)), fingerprint(EXAMPLES / "mlp.py", summary, None, None)
    ).run_dir
    (run_dir / "tuned_config.toml").write_text("# the earlier run's result\n")
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    with pytest.raises(UserInputError, match=r"resume refused: model file differs \(.*cnn.py sha256") as info:
        tune(EXAMPLES / "cnn.py", TuneOptions(store=StoreOptions(resume=run_dir), search=SearchOptions(trials=1)))
    assert "\n" not in str(info.value)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before


def test_the_fingerprint_compares_the_sizes_that_run() -> None:
    """--batch-size 32 on a file whose BATCH_SIZE is 32 resumes; --batch-size 16 does not."""
    from tpu_tuner.model.workloads.summary import WorkloadSummary
    from tpu_tuner.studies.fingerprint import differences, fingerprint

    summary = WorkloadSummary(
        name="mlp",
        source=EXAMPLES / "mlp.py",
        convention="native",
        step_kind="training step",
        is_training=True,
        batch_size=32,
        seq_len=None,
    )
    default = fingerprint(EXAMPLES / "mlp.py", summary, None, None)
    assert differences(default, fingerprint(EXAMPLES / "mlp.py", summary, 32, None)) == []
    assert differences(default, fingerprint(EXAMPLES / "mlp.py", summary, 16, None)) == [
        "--batch-size differs (16 vs 32 recorded)"
    ]


# --- 9. bad options fail in seconds; dead runs are marked --------------------------------------


def _no_worker(self, env):
    raise AssertionError("a worker was started: the model would have run")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--trials", "0"], "--trials must be at least 1"),
        (["--space", "no-such-space"], "no-such-space"),
        (["--storage", "notadb://x"], "unknown database kind 'notadb'"),
        (["--storage", "sqlite:////no/such/folder/study.db"], "does not exist"),
        (["--storage", "mysql://u@localhost/db"], "driver is not installed"),
        (["--trial-timeout", "-1"], "--trial-timeout must be positive"),
        (["--resume", "/no/such/run"], "not a tuning run folder"),
    ],
)
def test_bad_options_are_refused_before_any_model_runs(
    tmp_path: Path, capsys, monkeypatch, args: list[str], message: str
) -> None:
    monkeypatch.setattr(TrialRunner, "_start", _no_worker)
    status = main(["tune", str(EXAMPLES / "mlp.py"), "--out", str(tmp_path / "results"), *args])
    assert status == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """`code` run by a fresh interpreter in the repository (what it imports is its own)."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parent.parent
    )


def test_bad_options_are_refused_before_torch_is_imported() -> None:
    done = _python(
        "import sys; from tpu_tuner.cli import main; status = main(['tune', 'examples/mlp.py', '--storage', "
        "'notadb://x']); print(status, 'torch' in sys.modules)"
    )
    assert done.stdout.split() == ["2", "False"], done.stderr


def test_a_run_that_dies_is_marked_failed_and_shown_failed(tmp_path: Path) -> None:
    from tpu_tuner.api import tune
    from tpu_tuner.dashboard import collect
    from tpu_tuner.tuning.options.tune_options import TuneOptions

    # The worker's own one-line error, naming the file and what failed in it.
    with pytest.raises(WorkloadError, match=r"bad_forward.py: the first step failed: RuntimeError: mat1 and mat2"):
        tune(
            FIXTURES / "bad_forward.py",
            TuneOptions(outputs=OutputOptions(out=tmp_path), search=SearchOptions(trials=1)),
        )
    (run_dir,) = tmp_path.iterdir()
    state = json.loads((run_dir / "run.json").read_text())
    assert state["status"] == "failed" and "the first step failed" in state["reason"]
    row = collect(tmp_path).runs.iloc[0]
    assert row["status"] == "failed" and "the first step failed" in row["reason"]
    assert not collect(tmp_path).live  # no auto-refresh for a dead run


def test_a_run_whose_process_is_gone_is_incomplete_not_running(tmp_path: Path) -> None:
    from tpu_tuner.dashboard import collect

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for name, pid in (("dead-tune-20250101-000000", gone.pid), ("live-tune-20250101-000000", os.getpid())):
        (tmp_path / name).mkdir()
        run_file.write(
            tmp_path / name,
            {
                "storage": "sqlite:///x",
                "study_name": name,
                "status": "running",
                "pid": pid,
                "host": socket.gethostname(),
            },
        )
    runs = collect(tmp_path).runs.set_index("run")
    assert runs.loc["dead-tune-20250101-000000", "status"] == "incomplete"
    assert runs.loc["live-tune-20250101-000000", "status"] == "running"


def test_the_top_level_help_lists_the_commands_without_importing_torch() -> None:
    # Every command's flags are built only when that command is named (plan's import the planner).
    done = _python(
        "import sys; from tpu_tuner.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as done:\n    print(done.code, 'torch' in sys.modules)"
    )
    assert done.stdout.split()[-2:] == ["0", "False"], done.stderr
    assert all(command in done.stdout for command in ("profile", "tune", "plan", "buckets", "dashboard", "apply"))
