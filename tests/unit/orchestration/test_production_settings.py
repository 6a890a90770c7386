"""Production fails closed (issue 37 item 1; docs/deployment.md#production-fails-closed).

Under ``PROMSHIFT_ENV=production`` a missing audit database, key, anchor, snapshot or report store is one line at
start: the board (on the API server) answers every route with it, a worker's ``validate`` fails with it, and
nothing is created: no SQLite file, no ``.state`` in the working directory. The lab (``PROMSHIFT_ENV`` unset or
``lab``) keeps its defaults under ``PROMSHIFT_HOME``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException
from fastapi.testclient import TestClient

from promshift.adapters import settings
from promshift.adapters.audit_store import AuditStore
from promshift.adapters.settings import ProductionSettingsMissing, load_catalog, require_production_settings
from promshift.board.app import create_app
from promshift.local.group_dag import build_group_dag
from tests.unit.orchestration.test_operators import CATALOG, GROUP, PROFILE, make_context

STORES = ("PROMSHIFT_AUDIT_URL", "PROMSHIFT_AUDIT_KEY", "PROMSHIFT_AUDIT_KEY_FILE", "PROMSHIFT_AUDIT_ANCHOR_URL",
          "PROMSHIFT_SNAPSHOTS_URL", "PROMSHIFT_REPORTS_URL", "PROMSHIFT_HOME", "AIRFLOW_CONN_PROMSHIFT_AUDIT",
          "PROMSHIFT_CATALOG")
NAMED = {"PROMSHIFT_AUDIT_URL": "postgresql+psycopg://promshift@db.internal:5432/promshift",
         "PROMSHIFT_AUDIT_KEY": "k" * 32,
         "PROMSHIFT_AUDIT_ANCHOR_URL": "s3://promshift-anchors/audit",
         "PROMSHIFT_SNAPSHOTS_URL": "s3://promshift-state/snapshots",
         "PROMSHIFT_REPORTS_URL": "s3://promshift-state/reports",
         "PROMSHIFT_CATALOG": "/opt/airflow/catalog/metric_groups.yaml"}


@pytest.fixture
def production(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PROMSHIFT_ENV=production, no store named, an empty working directory (returned)."""
    for var in STORES:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PROMSHIFT_ENV", "production")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_the_board_refuses_at_start_in_one_line_and_creates_no_file(production: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    app = create_app()
    for path in ("/", "/api/groups", "/metrics", "/groups/gpu-memory"):
        response = TestClient(app).get(path)
        assert response.status_code == 503, path
        line = response.text
        assert line.count("\n") == 1 and line.startswith("the migration board: PROMSHIFT_ENV=production refuses")
        assert "no audit database (PROMSHIFT_AUDIT_URL" in line and "no audit anchor" in line
        assert "no snapshot store" in line and "no report store" in line and "no audit key" in line
        assert "no catalog (PROMSHIFT_CATALOG)" in line  # never the lab's default beside site-packages
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [line.strip()]
    assert tree(production) == []  # no .state, no audit.db


def test_a_worker_refuses_at_validate_in_one_line_and_creates_no_file(production: Path) -> None:
    group = load_catalog(CATALOG, profile=PROFILE).get(GROUP)
    dag = build_group_dag(group, catalog_path=CATALOG, profile=PROFILE)
    with pytest.raises(AirflowFailException) as excinfo:
        dag.get_task("validate").execute(make_context())
    line = str(excinfo.value)
    assert "\n" not in line and line.startswith("validate validate: PROMSHIFT_ENV=production refuses to start: ")
    assert "no audit database (PROMSHIFT_AUDIT_URL or connection promshift_audit's extra.url)" in line
    assert tree(production) == []


def test_every_other_step_refuses_too_never_a_sqlite_default(production: Path) -> None:
    """A step that skips validate (a retry, a by-hand run) still opens no lab default."""
    from promshift.orchestration.wiring import audit_url

    with pytest.raises(AirflowFailException, match=r"^PROMSHIFT_ENV=production: no audit database .*extra.url"):
        audit_url()
    with pytest.raises(ProductionSettingsMissing, match="no audit database"):
        AuditStore()
    with pytest.raises(ProductionSettingsMissing, match=r"no snapshot store \(PROMSHIFT_SNAPSHOTS_URL\)"):
        settings.snapshots_url()
    with pytest.raises(ProductionSettingsMissing, match=r"no report store \(PROMSHIFT_REPORTS_URL\)"):
        settings.reports_url()
    assert tree(production) == []


def test_the_lab_key_file_is_never_read_in_production(production: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = production / "home"
    home.mkdir()
    (home / settings.AUDIT_KEY_FILE_NAME).write_text("x" * 32)
    os.chmod(home / settings.AUDIT_KEY_FILE_NAME, 0o600)
    monkeypatch.setenv("PROMSHIFT_HOME", str(home))
    assert settings.audit_key() is None
    monkeypatch.setenv("PROMSHIFT_ENV", "lab")
    assert settings.audit_key() == b"x" * 32


@pytest.mark.parametrize(("var", "value", "problem"), [
    ("PROMSHIFT_AUDIT_URL", "sqlite:////shared/audit.db", "the audit database is SQLite"),
    ("PROMSHIFT_AUDIT_URL", "sqlite+pysqlite:///audit.db", "the audit database is SQLite"),
    ("PROMSHIFT_SNAPSHOTS_URL", "file:///var/promshift/snapshots", "snapshot store PROMSHIFT_SNAPSHOTS_URL is a local"),
    ("PROMSHIFT_REPORTS_URL", "/var/promshift/reports", "report store PROMSHIFT_REPORTS_URL is a local path"),
    ("PROMSHIFT_AUDIT_ANCHOR_URL", "", "no audit anchor"),
    ("PROMSHIFT_AUDIT_KEY", "", "no audit key"),
    ("PROMSHIFT_CATALOG", "", "no catalog (PROMSHIFT_CATALOG)"),
])
def test_each_store_is_checked(var: str, value: str, problem: str) -> None:
    env = {**NAMED, "PROMSHIFT_ENV": "production", var: value}
    with pytest.raises(ProductionSettingsMissing) as excinfo:
        require_production_settings("validate", env)
    assert problem in str(excinfo.value) and "; " not in str(excinfo.value)  # only that one


def test_all_named_passes_and_the_connection_counts() -> None:
    require_production_settings("validate", {**NAMED, "PROMSHIFT_ENV": "production"})
    env = {k: v for k, v in NAMED.items() if k not in ("PROMSHIFT_AUDIT_URL", "PROMSHIFT_AUDIT_KEY")}
    require_production_settings("validate", {**env, "PROMSHIFT_ENV": "production"},
                                audit_url=NAMED["PROMSHIFT_AUDIT_URL"], audit_key_given=True)


def test_the_connection_satisfies_a_worker(production: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from promshift.orchestration.wiring import require_production_settings as worker_check

    for var in ("PROMSHIFT_AUDIT_ANCHOR_URL", "PROMSHIFT_SNAPSHOTS_URL", "PROMSHIFT_REPORTS_URL", "PROMSHIFT_CATALOG"):
        monkeypatch.setenv(var, NAMED[var])
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_AUDIT", json.dumps(
        {"conn_type": "generic", "password": "k" * 32, "extra": {"url": NAMED["PROMSHIFT_AUDIT_URL"]}}))
    worker_check("validate")  # nothing missing
    assert tree(production) == []


@pytest.mark.parametrize("value", ["", "lab"])
def test_the_lab_keeps_its_defaults(value: str) -> None:
    require_production_settings("validate", {"PROMSHIFT_ENV": value})


def test_an_unknown_environment_is_refused_not_read_as_the_lab() -> None:
    with pytest.raises(ProductionSettingsMissing, match=r"PROMSHIFT_ENV='prod' is neither 'lab' nor 'production'"):
        require_production_settings("validate", {"PROMSHIFT_ENV": "prod"})
