"""The ``promshift__plan`` DAG: ``promshift plan`` by hand from the Airflow UI, outputs in the report store.

Triggered by hand with a form (``plan_params``): where the source's query logs are (``file://`` or
``s3://`` URLs, read through Airflow's ``ObjectStoragePath``, so any worker reads the same objects), the
dashboards, the usage period and the trimming options. The source is the ``promshift_source``
connection. One task reads the source, recommends, and writes ``metric_groups.draft.yaml``,
``plan.md``, ``plan.json`` and ``plan-cost.png`` under ``<PROMSHIFT_REPORTS_URL>/plan/<run id>/``; its
return value (an XCom) is that folder's URL with each file's sha256 and what the plan could not read.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, BaseOperator, Param

log = logging.getLogger(__name__)

PLAN_DAG_ID = "promshift__plan"
PLAN_REPORT_GROUP = "plan"  # the report store's folder for plans (no metric group is named so: names have a-z0-9-)


def plan_params() -> dict[str, Param]:
    return {
        "query_log_urls": Param([], type="array", items={"type": "string", "maxLength": 2000}, maxItems=50,
                                title="Query logs", description="the query_log_file(s): file:// or s3:// URLs"),
        "dashboards": Param([], type="array", items={"type": "string", "maxLength": 2000}, maxItems=50,
                            title="Dashboards", description="dashboard JSON files or folders on the workers"),
        "period": Param("30d", type="string", pattern="^[0-9]+(ms|s|m|h|d|w|y)([0-9]+(ms|s|m|h|d|w|y))*$",
                        title="Usage period", description="query-log lines this recent count"),
        "series_window": Param("1h", type="string", pattern="^[0-9]+(ms|s|m|h|d|w|y)([0-9]+(ms|s|m|h|d|w|y))*$",
                               title="Series window", description="series seen this recently make the inventory"),
        "max_group_metrics": Param(12, type="integer", minimum=1, maximum=1000, title="Largest group"),
        "keep_labels": Param(["job"], type="array", items={"type": "string", "maxLength": 200}, maxItems=50,
                             title="Labels never dropped"),
        "host_label": Param("Hostname", type="string", maxLength=200, title="Host label (never dropped)"),
        "previous_plan_url": Param("", type="string", maxLength=2000, title="Previous plan.json",
                                   description="an earlier run's plan.json URL: the plan says what changed"),
    }


class PlanOperator(BaseOperator):
    """Build the plan and write its four files to the report store; return the store's record."""

    def __init__(self, *, prometheus_conn_id: str = "promshift_source", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.prometheus_conn_id = prometheus_conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.sdk import ObjectStoragePath

        from promshift.adapters.settings import amp_prices, reports_url
        from promshift.adapters.usage import PlanInputs, build_plan, plan_files
        from promshift.core.durations import parse_duration
        from promshift.core.plan import diff_plans
        from promshift.orchestration.hooks import PrometheusHook
        from promshift.orchestration.report_store import ReportStore

        params = context["params"]
        previous = None
        if params.get("previous_plan_url"):
            previous = json.loads(ObjectStoragePath(params["previous_plan_url"]).read_text())
        inputs = PlanInputs(query_logs=[ObjectStoragePath(u) for u in params["query_log_urls"]],
                            dashboards=list(params["dashboards"]), period_s=parse_duration(params["period"]),
                            series_window_s=parse_duration(params["series_window"]),
                            protected_labels=[*params["keep_labels"], params["host_label"]],
                            max_group_metrics=int(params["max_group_metrics"]))
        hook = PrometheusHook(self.prometheus_conn_id)
        outcome = build_plan(hook.get_conn(), inputs, prices=amp_prices(), now=time.time())
        plan = outcome.plan.to_dict()
        for line in plan["not_read"]:
            self.log.warning("not read: %s", line)
        diff = diff_plans(previous, plan) if previous is not None else None
        files = plan_files(plan, caveats=outcome.caveats, diff=diff, source=hook.base_url,
                           host_label=params["host_label"], scrape_interval_s=outcome.default_interval_s)
        record = ReportStore(reports_url()).write(PLAN_REPORT_GROUP, context["run_id"], files)
        record.update(partial=plan["partial"], not_read=plan["not_read"], groups=[g["name"] for g in plan["groups"]])
        return record


def build_plan_dag() -> DAG:
    with DAG(
        dag_id=PLAN_DAG_ID,
        description="Plan the migration from real usage: groups, waves, safe label drops, AMP cost",
        doc_md=__doc__,
        schedule=None,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        max_active_runs=1,
        params=plan_params(),
        tags=["promshift", "plan"],
        default_args={"retries": 1, "retry_delay": timedelta(seconds=30), "owner": "promshift"},
    ) as dag:
        # A backstop for a hung worker: the plan's reads of the source (TSDB status, series, rules, metadata)
        # each have their own budget and end well before it.
        PlanOperator(task_id="plan", execution_timeout=timedelta(minutes=30))
    return dag


__all__ = ["PLAN_DAG_ID", "PlanOperator", "build_plan_dag", "plan_params"]
