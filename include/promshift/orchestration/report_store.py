"""Run reports where every worker and the board can read them: Airflow's ``ObjectStoragePath``.

A run's ``done`` (or ``rollback``) task builds the report from the audit log, as the demo does,
and writes ``report.json``, ``report.md`` and ``latency.png`` under
``<PROMSHIFT_REPORTS_URL>/<group>/<run id>/``: a local directory by default, ``s3://...`` in
production (any fsspec protocol Airflow's object storage knows). The ``report_published``
audit event records each file's sha256, so the board serves a stored file only while it still
hashes as recorded: an object store is not tamper-evident, the audit chain is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from promshift.adapters.audit_store import AuditStore
from promshift.core.render import sha256_bytes
from promshift.core.report import build_report, render_markdown

REPORT_FILES = {"report.json": "application/json", "report.md": "text/plain; charset=utf-8",
                "latency.png": "image/png"}


class ReportTampered(RuntimeError):
    """A stored report file no longer hashes as its ``report_published`` audit event recorded."""


def render_report_files(report: Mapping[str, Any]) -> dict[str, bytes]:
    """The report's files as bytes: ``report.json``, ``report.md``, and ``latency.png`` when windows were timed."""
    from promshift.adapters.charts import latency_chart_png

    files: dict[str, bytes] = {}
    chart = None
    if report["latency"]["windows"]:
        files["latency.png"] = latency_chart_png(
            report["latency"]["windows"], title=f"{report['group']}: query time per window, source vs target")
        chart = "latency.png"
    files["report.json"] = json.dumps(report, indent=2, default=str).encode()
    files["report.md"] = render_markdown(report, chart_file=chart).encode()
    return files


class ReportStore:
    """Reports under one ``ObjectStoragePath`` base (``file://...`` or ``s3://...``)."""

    def __init__(self, base_url: str) -> None:
        from airflow.sdk import ObjectStoragePath

        self.base_url = base_url.rstrip("/")
        self.base = ObjectStoragePath(self.base_url)

    def run_dir(self, group: str, run_id: str) -> Any:
        # Run ids hold ':' and '+'; quoted, a run is one path segment on any store.
        return self.base / quote(group, safe="") / quote(run_id, safe="")

    def write(self, group: str, run_id: str, files: Mapping[str, bytes]) -> dict[str, Any]:
        """Write every file (overwriting a retried task's); return what the audit records: url and hashes."""
        directory = self.run_dir(group, run_id)
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (directory / name).write_bytes(data)
        return {"url": str(directory),
                "files": {name: {"sha256": sha256_bytes(data), "bytes": len(data)} for name, data in files.items()}}


def read_published(published: Mapping[str, Any], name: str) -> bytes:
    """One file of a published report (its ``report_published`` record), refused unless it hashes as recorded."""
    from airflow.sdk import ObjectStoragePath

    recorded = (published.get("files") or {}).get(name)
    if name not in REPORT_FILES or recorded is None:
        raise FileNotFoundError(f"the report at {published.get('url')} has no {name}")
    data = (ObjectStoragePath(str(published["url"])) / name).read_bytes()
    if sha256_bytes(data) != recorded["sha256"]:
        raise ReportTampered(f"{published.get('url')}/{name} no longer matches the sha256 its report_published "
                             "audit event recorded")
    return data


def publish_report(audit: AuditStore, store: ReportStore, *, group: str, run_id: str) -> dict[str, Any]:
    """Build the run's report from its audit events and write it to ``store`` (returns the write's record)."""
    report = build_report(group=group, run_id=run_id, events=audit.events(group=group, run_id=run_id),
                          final_stage=audit.stage_of(group).value, chain=audit.verify())
    record = store.write(group, run_id, render_report_files(report))
    record.update(group=group, final_stage=report["final_stage"])
    return record
