"""The run's published report, linked from its task in the Airflow UI (an operator extra link).

Registered through the provider info (``extra-links``), so the API server, which renders links
from the serialized DAG, knows the class. The link is read from the task's ``report`` XCom (what
``report_store.publish_report`` recorded) and points at the board's route that serves the
stored file only while it hashes as the audit recorded.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

from promshift.core.urls import URL_PREFIX


def report_link(base_url: str, group: str, run_id: str, file: str = "report.md") -> str:
    """The board's route serving ``file`` of the report ``run_id`` of ``group`` published."""
    run = f"{URL_PREFIX}/groups/{quote(group, safe='')}/runs/{quote(run_id, safe='')}"
    return f"{base_url.rstrip('/')}{run}/report/{file}"


class MigrationReportLink(BaseOperatorLink):
    """``Migration report``: the report this task published (empty until it did)."""

    name = "Migration report"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from airflow.configuration import conf
        from airflow.sdk.execution_time.xcom import XCom

        record = XCom.get_value(key="report", ti_key=ti_key)
        if not record or not record.get("group"):
            return ""
        return report_link(conf.get("api", "base_url", fallback="") or "", str(record["group"]), ti_key.run_id)
