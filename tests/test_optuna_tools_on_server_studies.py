"""Issue 58, item 6: a study on a PostgreSQL server opens in Optuna's own tools. tpu-tune keeps
server studies in its journal tables (studies/journal.py), which `optuna.load_study(storage=URL)`
and `optuna-dashboard URL` cannot open ("Record does not exist"); `tpu_tuner.study_storage(URL)`
opens it for both, and `tpu-tune study dashboard --storage URL` serves optuna-dashboard over it.
On a real server (the `postgres` fixture), never a stand-in."""

from __future__ import annotations

import io
import json
import uuid
from typing import Any
from wsgiref.util import setup_testing_defaults

import optuna
import pytest
from helpers.postgres_server import PASSWORD

import tpu_tuner
from tpu_tuner.cli import main
from tpu_tuner.studies.liveness import open_storage


def _study_on_the_server(url: str) -> str:
    """A study written through tpu-tune's own storage (its journal), with two finished trials."""
    name = f"tools-{uuid.uuid4().hex[:8]}"
    study = optuna.create_study(study_name=name, storage=open_storage(url), direction="minimize")
    for value in (0.2, 0.1):
        trial = study.ask({"execution": optuna.distributions.CategoricalDistribution(["eager", "inductor"])})
        study.tell(trial, value)
    return name


def test_optuna_load_study_reads_a_server_study_through_study_storage(postgres) -> None:
    url = postgres.url("secret", PASSWORD)
    name = _study_on_the_server(url)
    loaded = optuna.load_study(study_name=name, storage=tpu_tuner.study_storage(url))  # the documented one-liner
    assert [t.value for t in loaded.trials] == [0.2, 0.1] and loaded.best_value == 0.1


def test_optuna_dashboard_shows_a_server_study_through_study_storage(postgres) -> None:
    optuna_dashboard = pytest.importorskip("optuna_dashboard")
    url = postgres.url("secret", PASSWORD)
    name = _study_on_the_server(url)
    app = optuna_dashboard.wsgi(tpu_tuner.study_storage(url))  # what `tpu-tune study dashboard` serves
    answer: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        answer["status"] = status

    environ: dict[str, Any] = {"PATH_INFO": "/api/studies", "wsgi.errors": io.StringIO()}
    setup_testing_defaults(environ)  # a GET as a WSGI server hands it over, no socket
    body = b"".join(app(environ, start_response))
    assert answer["status"].startswith("200"), environ["wsgi.errors"].getvalue()[-2000:]
    studies = {s["study_name"]: s for s in json.loads(body)["study_summaries"]}
    assert name in studies


def test_the_dashboard_command_names_what_is_missing_in_one_line(monkeypatch, capsys, tmp_path) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "optuna_dashboard" else real(n, *a))
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    assert main(["study", "dashboard", "--storage", storage]) == 2
    assert "pip install optuna-dashboard" in capsys.readouterr().err
