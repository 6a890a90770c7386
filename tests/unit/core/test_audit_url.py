"""Which database the Airflow shell audits and routes in: PROMSHIFT_AUDIT_URL, then the
connection ``promshift_audit``'s ``extra.url``, then SQLite under PROMSHIFT_HOME; never a password in a log."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException

from promshift.orchestration.wiring import audit_url

KEY = "key-from-the-promshift_audit-connection"
PW = "db-pw-7f3a9c"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PROMSHIFT_AUDIT_URL", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_PROMSHIFT_AUDIT", raising=False)
    return tmp_path / "home"


def set_conn(monkeypatch: pytest.MonkeyPatch, **fields: object) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_AUDIT", json.dumps({"conn_type": "generic", **fields}))


def test_without_either_it_is_sqlite_under_promshift_home(home: Path) -> None:
    assert audit_url() == f"sqlite:///{home / 'audit.db'}"


def test_a_connection_with_only_the_key_keeps_the_sqlite_default(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(monkeypatch, password=KEY)
    assert audit_url() == f"sqlite:///{home / 'audit.db'}"


def test_the_connections_extra_url_names_the_database(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = "postgresql+psycopg://promshift@db.internal:5432/promshift"
    set_conn(monkeypatch, password=KEY, extra={"url": url})
    assert audit_url() == url


def test_the_environment_overrides_the_connection(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(monkeypatch, password=KEY, extra={"url": "postgresql+psycopg://promshift@db.internal/promshift"})
    monkeypatch.setenv("PROMSHIFT_AUDIT_URL", f"sqlite:///{home / 'override.db'}")
    assert audit_url() == f"sqlite:///{home / 'override.db'}"


def test_not_the_connections_own_uri_whose_password_is_the_audit_key(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A postgres-typed connection with host and login still names no database: its password is the HMAC key."""
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_AUDIT", json.dumps(
        {"conn_type": "postgres", "host": "db.internal", "login": "promshift", "password": KEY, "schema": "promshift"}))
    assert audit_url() == f"sqlite:///{home / 'audit.db'}"


@pytest.mark.parametrize("source", ["connection", "environment"])
def test_the_database_password_never_reaches_a_log_line_and_is_masked(
        home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, source: str) -> None:
    from airflow.sdk._shared.secrets_masker import redact

    pw = f"{PW}-{source}"  # one per case: the masker is process-wide
    url = f"postgresql+psycopg://promshift:{pw}@db.internal:5432/promshift"
    if source == "connection":
        set_conn(monkeypatch, password=KEY, extra={"url": url})
    else:
        monkeypatch.setenv("PROMSHIFT_AUDIT_URL", url)
    caplog.set_level(logging.DEBUG)
    assert audit_url() == url
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "db.internal" in logged and pw not in logged and "***" in logged
    # Registered with Airflow's masker: a task log line that prints the URL anyway shows no password.
    assert pw not in str(redact(f"connecting to {url}"))


@pytest.mark.parametrize("bad", [42, "", "not a url at all"])
def test_an_extra_url_that_is_no_url_fails_the_task_without_echoing_it(
        home: Path, monkeypatch: pytest.MonkeyPatch, bad: object) -> None:
    set_conn(monkeypatch, password=KEY, extra={"url": bad})
    with pytest.raises(AirflowFailException, match="extra.url") as excinfo:
        audit_url()
    assert "not a url at all" not in str(excinfo.value)
