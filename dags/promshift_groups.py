"""
### promshift: one Airflow migration DAG per metric group

Generated from the reviewed catalog (`catalog/metric_groups.yaml`, or `PROMSHIFT_CATALOG`).
Trigger a group's DAG from the UI to move it forward; the on-call approval appears in
the UI as a required action. `PROMSHIFT_PROFILE=demo` selects the catalog's short
demo timings. Parsing reads only the catalog file: no network, no database.
"""

from __future__ import annotations

from promshift.orchestration.dag_factory import build_group_dag
from promshift.settings import default_catalog_path, default_profile, load_catalog

CATALOG_PATH = default_catalog_path()
PROFILE = default_profile()

for _group in load_catalog(CATALOG_PATH, profile=PROFILE).groups:
    globals()[_group.dag_id] = build_group_dag(_group, catalog_path=CATALOG_PATH, profile=PROFILE)
