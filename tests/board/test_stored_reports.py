"""Reports published through ObjectStoragePath (a local file:// base here): written by the run's last task,
audited with their hashes, linked from the task and the board, and served only while they hash as recorded."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from airflow.api_fastapi import app as airflow_app
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.security import get_user
from airflow.models.dag import DagModel
from fastapi.testclient import TestClient

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.settings import default_catalog_path, load_catalog
from promshift.board.app import BoardSource, create_app
from promshift.core.render import sha256_bytes
from promshift.orchestration.links import MigrationReportLink
from promshift.orchestration.report_store import ReportStore, ReportTampered, publish_report, read_published
from tests.board.auth_manager import DENIED_DAG, SCOPED_USER, GroupScopedAuthManager
from tests.board.history import write_history

RUNS = {"gpu-utilization": "manual__2026-12-01T09:00:00+00:00", "gpu-power-thermal": "r2", "gpu-memory": "r3"}
GROUP, RUN = "gpu-utilization", RUNS["gpu-utilization"]


@pytest.fixture
def audit(tmp_path: Path, board_catalog: Path) -> AuditStore:
    """The board tests' history over ``scoped_catalog`` (gpu-memory alone on the target whose DAG is denied)."""
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    write_history(store, load_catalog(), datetime(2026, 12, 1, tzinfo=UTC), RUNS)
    return store


@pytest.fixture
def published(audit: AuditStore, tmp_path: Path) -> dict[str, Any]:
    """The cut-over run's report, published as ``done`` does it, and its audit event."""
    record = publish_report(audit, ReportStore(f"file://{tmp_path / 'reports'}"), group=GROUP, run_id=RUN)
    audit.append(group=GROUP, run_id=RUN, kind="report_published", actor="test", at=datetime.now(UTC),
                 evidence=record)
    return record


def test_a_published_report_is_every_file_under_the_run_with_its_hash(published: dict[str, Any],
                                                                     tmp_path: Path) -> None:
    # The run id (':' and '+') is one quoted path segment under the group.
    run_dir = tmp_path / "reports" / GROUP / "manual__2026-12-01T09%3A00%3A00%2B00%3A00"
    assert published["url"] == f"file://{run_dir}"
    assert published["group"] == GROUP and published["final_stage"] == "cut_over"
    assert sorted(published["files"]) == ["latency.png", "report.json", "report.md"]
    for name, meta in published["files"].items():
        data = (run_dir / name).read_bytes()
        assert meta == {"sha256": sha256_bytes(data), "bytes": len(data)}
    assert (run_dir / "latency.png").read_bytes()[:4] == b"\x89PNG"
    assert '"final_stage": "cut_over"' in (run_dir / "report.json").read_text()
    assert read_published(published, "report.md") == (run_dir / "report.md").read_bytes()


def test_a_stored_file_changed_after_publishing_is_refused(published: dict[str, Any], tmp_path: Path) -> None:
    path = Path(published["url"].removeprefix("file://")) / "report.json"
    path.write_text(path.read_text().replace("cut_over", "rolled_back"))
    with pytest.raises(ReportTampered, match="report.json no longer matches the sha256"):
        read_published(published, "report.json")
    with pytest.raises(FileNotFoundError, match="has no passwords.json"):
        read_published(published, "passwords.json")


@pytest.fixture
def client_as(audit: AuditStore, published: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator:
    monkeypatch.setattr(airflow_app._AuthManagerState, "instance", GroupScopedAuthManager())
    monkeypatch.setattr(DagModel, "get_team_name", staticmethod(lambda dag_id, **_: None))
    app = create_app(BoardSource(catalog_path=default_catalog_path(), audit_url=audit.url, profile=None,
                                 run_states=lambda dag_id, run_ids: {}))

    def as_user(name: str | None, role: str = "viewer") -> TestClient:
        if name is None:
            app.dependency_overrides.clear()
        else:
            app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username=name, role=role)
        return TestClient(app)

    yield as_user
    app.dependency_overrides.clear()


def test_the_board_links_and_serves_the_stored_report(client_as, published: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    viewer = client_as("viewer-victor")
    page = viewer.get(f"/groups/{GROUP}")
    href = f"/groups/{GROUP}/runs/manual__2026-12-01T09%3A00%3A00%2B00%3A00/report/report.md"
    assert href in page.text
    md = viewer.get(href)
    assert md.status_code == 200 and md.headers["content-type"].startswith("text/plain")
    assert sha256_bytes(md.content) == published["files"]["report.md"]["sha256"]
    png = viewer.get(href.replace("report.md", "latency.png"))
    assert png.headers["content-type"] == "image/png" and png.content[:4] == b"\x89PNG"
    assert viewer.get(f"/groups/{GROUP}/runs/no-such-run/report/report.md").status_code == 404
    assert viewer.get(href.replace("report.md", "standalone.log")).status_code == 404
    # Tampered after publishing: the board refuses to serve it as evidence.
    path = Path(published["url"].removeprefix("file://")) / "report.md"
    path.write_bytes(path.read_bytes() + b"\nall good, approve\n")
    tampered = viewer.get(href)
    assert tampered.status_code == 409 and "approve" not in tampered.text.split("no longer")[0]


def test_stored_reports_are_not_served_to_anonymous_or_denied_callers(client_as) -> None:  # type: ignore[no-untyped-def]
    path = f"/groups/{GROUP}/runs/{RUN}/report/report.json"
    anonymous = client_as(None).get(path)
    assert anonymous.status_code == 401 and "cut_over" not in anonymous.text
    assert DENIED_DAG == load_catalog().get("gpu-memory").dag_id != load_catalog().get(GROUP).dag_id
    denied = client_as(SCOPED_USER).get("/groups/gpu-memory/runs/r3/report/report.json")
    assert denied.status_code == 403
    assert client_as(SCOPED_USER).get(path).status_code == 200  # her other target's DAG stays readable


def test_the_tasks_extra_link_points_at_the_boards_stored_report(published: dict[str, Any],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.execution_time import xcom

    asked: list[tuple[str, Any]] = []

    def get_value(*, key: str, ti_key: Any) -> Any:
        asked.append((key, ti_key))
        return published if key == "report" else None

    monkeypatch.setattr(xcom.XCom, "get_value", staticmethod(get_value))
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://127.0.0.1:28080")
    ti_key = type("Key", (), {"run_id": RUN, "dag_id": "promshift__migrate__promshift_target", "task_id": "done"})()
    link = MigrationReportLink().get_link(None, ti_key=ti_key)
    assert link == ("http://127.0.0.1:28080/promshift/groups/gpu-utilization/runs/"
                    "manual__2026-12-01T09%3A00%3A00%2B00%3A00/report/report.md")
    assert asked == [("report", ti_key)]
    monkeypatch.setattr(xcom.XCom, "get_value", staticmethod(lambda **_: None))
    assert MigrationReportLink().get_link(None, ti_key=ti_key) == ""
