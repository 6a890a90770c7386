"""
### promshift: plan the migration from real usage (one Airflow DAG, `promshift__plan`)

Trigger by hand: reads the source (`promshift_source`), its query logs and dashboards, and writes a catalog
draft, `plan.md`, `plan.json` and a cost chart to the report store. Parsing needs nothing live.
"""

from __future__ import annotations

from promshift.orchestration.plan_dag import PLAN_DAG_ID, build_plan_dag

globals()[PLAN_DAG_ID] = build_plan_dag()
