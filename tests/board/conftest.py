"""The board's routes with Airflow's auth dependencies against an auth manager that denies one user one DAG.

``client_as(name, role)``: a TestClient as that user on an app over an audit history of four groups
(tests/board/history.py), with the catalog ``scoped_catalog`` (gpu-memory alone on its own target, so its
migration DAG is the denied one); see test_board_access.py for what is replaced and why.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from airflow.api_fastapi import app as airflow_app
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.security import get_user
from airflow.models.dag import DagModel
from fastapi.testclient import TestClient

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.settings import default_catalog_path, load_catalog
from promshift.board.app import BoardSource, create_app
from tests.board.auth_manager import GroupScopedAuthManager, scoped_catalog
from tests.board.history import write_history

RUNS = {"gpu-utilization": "r1", "gpu-power-thermal": "r2", "gpu-memory": "r3"}
HISTORY_START = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture
def board_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``scoped_catalog`` as the catalog of everything in this test (``PROMSHIFT_CATALOG``)."""
    folder = tmp_path / "catalog"
    folder.mkdir()
    path = scoped_catalog(folder)
    monkeypatch.setenv("PROMSHIFT_CATALOG", str(path))
    assert default_catalog_path() == path
    return path


@pytest.fixture
def client_as(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, board_catalog: Path) -> Iterator:
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    write_history(AuditStore(url), load_catalog(), HISTORY_START, RUNS)
    monkeypatch.setattr(airflow_app._AuthManagerState, "instance", GroupScopedAuthManager())
    monkeypatch.setattr(DagModel, "get_team_name", staticmethod(lambda dag_id, **_: None))
    app = create_app(BoardSource(catalog_path=default_catalog_path(), audit_url=url, profile=None,
                                 run_states=lambda dag_id, run_ids: {}))

    def as_user(name: str, role: str) -> TestClient:
        app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username=name, role=role)
        return TestClient(app)

    yield as_user
    app.dependency_overrides.clear()
