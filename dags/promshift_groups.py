"""
### promshift: the migration DAGs of the catalog's metric groups

Generated from the reviewed catalog (`catalog/metric_groups.yaml`, or `PROMSHIFT_CATALOG`).
One migration DAG per target workspace, `promshift__migrate__<target connection>`: trigger it from
the UI and choose the group in its form (with dry_run, change_ticket, warmup_override, reason); the
on-call approval appears in the UI as a required action. `promshift__waves` starts a group that
depends on others when they have all cut over (their `cut_over` assets). `promshift__bake_watch`
checks cut-over groups until they are baked; `promshift__decommission`, `promshift__recommission`
and `promshift__rollback` act on the group chosen in their form. `PROMSHIFT_PROFILE=demo` selects
the catalog's short demo timings. Parsing reads only the catalog file: no network, no database.

A worker that parses this file to run one task builds only that task's DAG (Airflow's parsing context);
the DAG processor builds them all, a fixed handful however many groups the catalog has.

A group with problems is left out of the forms: the `promshift__catalog_errors` DAG lists every
problem (in its docs, and one task that fails with them) and the other groups keep their DAGs. A
catalog that cannot be read at all gives that DAG alone, with a one-line reason.
"""

from __future__ import annotations

import logging
from pathlib import Path

from airflow.sdk import get_parsing_context

from promshift.adapters.settings import (
    ProductionSettingsMissing,
    check_catalog_file,
    default_catalog_path,
    default_profile,
)
from promshift.core.catalog import CATALOG_ERRORS_DAG_ID, migration_dag_id, unreadable_catalog
from promshift.core.memory import cyclic_gc_paused
from promshift.orchestration.dag_factory import (
    BAKE_WATCH_DAG_ID,
    DECOMMISSION_DAG_ID,
    FULL_ROLLBACK_DAG_ID,
    RECOMMISSION_DAG_ID,
    RETIRE_DAG_ID,
    UNRETIRE_DAG_ID,
    WAVES_DAG_ID,
    build_bake_watch_dag,
    build_by_hand_dags,
    build_catalog_errors_dag,
    build_migration_dag,
    build_retire_dags,
    build_waves_dag,
    migration_targets,
)

log = logging.getLogger(__name__)

try:
    CATALOG_PATH: Path | str = default_catalog_path()
    _UNNAMED: str | None = None
except ProductionSettingsMissing as _exc:  # production without PROMSHIFT_CATALOG: no guess beside site-packages
    CATALOG_PATH, _UNNAMED = "(PROMSHIFT_CATALOG is not set)", str(_exc)
PROFILE = default_profile()
# Set when a worker parses the file to run a task of one DAG: every other DAG of a 1,000-group catalog would be
# built for nothing (seconds per task). None for the DAG processor, which needs them all.
_ONLY_DAG_ID = get_parsing_context().dag_id


def _wanted(dag_id: str) -> bool:
    # The catalog-errors DAG lists what building the others found: it needs them all built.
    return _ONLY_DAG_ID in (None, dag_id, CATALOG_ERRORS_DAG_ID)


def _one_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


# Airflow's objects are all alive until the file is done, so the cyclic collector finds nothing to free, yet its
# full passes walk every object made so far: a quarter of the build at 1,000 groups.
with cyclic_gc_paused():
    try:
        _check = (unreadable_catalog(_UNNAMED) if _UNNAMED is not None
                  else check_catalog_file(CATALOG_PATH, profile=PROFILE))
    except Exception as _exc:  # a bug in the checker must not take every DAG down with a traceback
        _check = unreadable_catalog(f"catalog check failed: {_one_line(_exc)}")

    _problems = list(_check.problems)
    # Problems in the YAML, defaults or profiles reach every group.
    _missing = ["every group"] if _check.catalog_problems else [label for label, _ in _check.group_problems]
    # One migration DAG per target workspace connection, the group chosen in its form. Airflow refusing one (what
    # the catalog check let through) leaves that target's groups without a DAG; the other targets keep theirs.
    for _target, _members in migration_targets(_check.catalog.groups).items():
        _dag_id = migration_dag_id(_target)
        if not _wanted(_dag_id):
            continue
        try:
            globals()[_dag_id] = build_migration_dag(_members, target=_target, catalog_path=CATALOG_PATH,
                                                     profile=PROFILE)
        except Exception as _exc:  # noqa: BLE001
            _problems.append(f"target {_target!r}: Airflow refused its migration DAG: {_one_line(_exc)}")
            _missing.extend(f"group {_g.name!r}" for _g in _members)
    # One DAG per by-hand action (decommission, recommission, full rollback), the group chosen in its form.
    if _check.catalog.groups and any(map(_wanted, (DECOMMISSION_DAG_ID, RECOMMISSION_DAG_ID, FULL_ROLLBACK_DAG_ID))):
        try:
            for _dag in build_by_hand_dags(_check.catalog.groups, catalog_path=CATALOG_PATH, profile=PROFILE):
                globals()[_dag.dag_id] = _dag
        except Exception as _exc:  # noqa: BLE001 - the migration DAGs must survive a bad by-hand DAG
            _problems.append(f"the by-hand DAGs: Airflow refused them: {_one_line(_exc)}")
    # Retire a whole source (and undo it), the source chosen in the form.
    if _check.catalog.groups and any(map(_wanted, (RETIRE_DAG_ID, UNRETIRE_DAG_ID))):
        try:
            for _dag in build_retire_dags(_check.catalog.groups, catalog_path=CATALOG_PATH, profile=PROFILE):
                globals()[_dag.dag_id] = _dag
        except Exception as _exc:  # noqa: BLE001 - the migration DAGs must survive a bad by-hand DAG
            _problems.append(f"the retire DAGs: Airflow refused them: {_one_line(_exc)}")
    # The waves and the bake watch, each over every good group.
    for _dag_id, _build, _label in ((WAVES_DAG_ID, build_waves_dag, "the waves DAG"),
                                    (BAKE_WATCH_DAG_ID, build_bake_watch_dag, "the bake watch")):
        if not (_check.catalog.groups and _wanted(_dag_id)):
            continue
        try:
            globals()[_dag_id] = _build(_check.catalog.groups, catalog_path=CATALOG_PATH, profile=PROFILE)
        except Exception as _exc:  # noqa: BLE001 - the migration DAGs must survive a bad one
            _problems.append(f"{_label}: Airflow refused its DAG: {_one_line(_exc)}")

    if _problems:
        for _problem in _problems:
            log.error("promshift catalog %s: %s", CATALOG_PATH, _problem)
        log.error("promshift catalog %s: %d problem(s), listed in DAG %s; groups without a DAG: %s",
                  CATALOG_PATH, len(_problems), CATALOG_ERRORS_DAG_ID, ", ".join(_missing) or "none")
        globals()[CATALOG_ERRORS_DAG_ID] = build_catalog_errors_dag(
            problems=_problems, catalog_path=CATALOG_PATH, missing_groups=_missing)
