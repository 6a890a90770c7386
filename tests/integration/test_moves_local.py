"""Rules and a provisioned dashboard move with their group on the local stack, through the DAG's operators.

Its own 2-node stack (the source config names ``rules/*.yml``: gpu-memory's recording rule and alert; the
target reloads through its lifecycle API; the DCGM dashboard provisioned under PROMSHIFT_HOME), the production
connections (source ``extra.rules: true``, ``grafana_default`` with ``extra.read_path.files``): snapshot ->
deploy -> recording rules after the warm-up -> cut-over (rules handoff, dashboard switch) -> the run's rollback,
or the full rollback by hand in another DAG run; either leaves the source config, its rule file, the target's
config and the dashboard byte-identical to before.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.rules_deploy import loaded_rules
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.core.stages import Stage
from promshift.local.group_dag import build_group_dag
from promshift.local.stack.local import LocalStack, StackConfig
from tests.fakes import FakeTI, fed

pytestmark = pytest.mark.integration

CATALOG = REPO_ROOT / "catalog" / "metric_groups.yaml"
GROUP = "gpu-memory"
RUN_ID = "manual__test-moves-local"


@pytest.fixture(scope="module")
def stack(stack_config_factory: Callable[..., StackConfig]) -> Iterator[LocalStack]:
    stack = LocalStack(stack_config_factory(nodes=2, scrape_interval="1s"))
    try:
        stack.up(timeout=90)
        yield stack
    finally:
        stack.down()


@pytest.fixture
def wired(stack: LocalStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The connections a deployment configures for rules and dashboards; PROMSHIFT_HOME and audit in tmp."""
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PROMSHIFT_AUDIT_URL", f"sqlite:///{tmp_path / 'audit.db'}")
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps({
        "conn_type": "prometheus", "host": stack.source_url,
        "extra": {"config_path": str(stack.source_config_path), "rules": True}}))
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "prometheus", "host": stack.target_url,
        "extra": {"config_path": str(stack.target_config_path), "remote_write_url": stack.target_remote_write_url}}))
    monkeypatch.setenv("AIRFLOW_CONN_GRAFANA_DEFAULT", json.dumps({
        "conn_type": "http", "host": "http://127.0.0.1:1",
        "extra": {"read_path": {"source_datasource": {"uid": "prometheus", "name": "Prometheus"},
                                "target_datasource": {"uid": "amp-local", "name": "AMP"},
                                "files": [str(stack.dashboards_dir / "*.json")]}}}))
    return tmp_path


def context() -> dict[str, Any]:
    """What the tasks read from a run's context; ``outlet_events`` is Airflow's own (the cut-over emits through it)."""
    from airflow.sdk.execution_time.context import OutletEventAccessors

    # The cut-over comes seconds into dual-write: the run accepts short history, or the history horizon would
    # hold the alert (for: 1m) and the dashboard (15 min) back (tests/integration/test_horizon_local.py).
    return {"run_id": RUN_ID, "ti": FakeTI(), "dag_run": None, "params": {"accept_short_history": True},
            "outlet_events": OutletEventAccessors()}


def files(stack: LocalStack) -> dict[str, bytes | None]:
    paths = {"source config": stack.source_config_path, "source rules": stack.source_rules_path,
             "target config": stack.target_config_path,
             "target rules": stack.target_config_path.parent / "rules" / "promshift-gpu-memory.yml",
             "dashboard": stack.dashboards_dir / "dcgm-exporter-dashboard.json"}
    return {name: p.read_bytes() if p.exists() else None for name, p in paths.items()}


def names(client: PrometheusClient) -> set[str]:
    return {r.name for r in loaded_rules(client)}


def cut_over(stack: LocalStack, audit: AuditStore) -> tuple[Any, dict[str, Any], dict[str, bytes | None]]:
    """snapshot -> deploy -> warm-up (the recording rules) -> gate and approval (recorded) -> cut-over."""
    source, target = PrometheusClient(stack.source_url), PrometheusClient(stack.target_url)
    before = files(stack)
    assert before["source rules"] and before["dashboard"] and before["target rules"] is None
    assert {"gpu:fb_used:ratio", "GpuMemoryNearlyFull"} <= names(source) and not names(target)
    dag = build_group_dag(load_catalog(CATALOG, profile="demo").get(GROUP), catalog_path=CATALOG, profile="demo")
    snap = dag.get_task("snapshot").execute(context())
    assert files(stack) == before  # a snapshot changes nothing
    fed(dag, "deploy_dual_write", snapshot=snap).execute(context())
    warm_up = dag.get_task("warm_up")
    warm_up.migration(context()).start_warmup(datetime.now(UTC))
    warm_up.execute_complete(context(), {"status": "ready", "reason": "test"})
    assert names(target) == {"gpu:fb_used:ratio"}  # the recording rule only: no alert on both sides
    for stage in (Stage.VERIFIED, Stage.APPROVED):  # the gate and the approval, as those tasks record them
        audit.append(group=GROUP, run_id=RUN_ID, kind=f"test_{stage.value}", actor="test", at=datetime.now(UTC),
                     evidence={}, stage_from=audit.stage_of(GROUP), stage_to=stage)
    ctx = context()
    dag.get_task("cutover").execute(ctx)
    emitted = [e for accessor in ctx["outlet_events"].values() for e in accessor.asset_alias_events]
    assert [(e.source_alias_name, e.dest_asset_key.name, e.extra["group"]) for e in emitted] == [
        ("promshift-cut-over", f"promshift://group/{GROUP}/cut_over", GROUP)]  # the group's asset, via the alias
    after = files(stack)
    assert {"gpu:fb_used:ratio", "GpuMemoryNearlyFull"} <= names(target)
    assert not {"gpu:fb_used:ratio", "GpuMemoryNearlyFull"} & names(source)
    assert after["dashboard"] != before["dashboard"] and b'"uid": "amp-local"' in after["dashboard"]
    assert after["target rules"] is not None and after["source rules"] != before["source rules"]
    kinds = [e.kind for e in audit.events(group=GROUP, run_id=RUN_ID)]
    assert kinds.index("rules_moved") < kinds.index("read_path_switched") < kinds.index("cut_over")
    moved = next(e for e in audit.events(group=GROUP) if e.kind == "rules_moved").evidence_data
    assert (moved["rules"], moved["records"], moved["alerts"]) == (2, 1, 1)
    return dag, snap, before


def test_rules_and_dashboard_move_at_cutover_and_the_rollback_restores_every_byte(
        stack: LocalStack, wired: Path) -> None:
    source, target = PrometheusClient(stack.source_url), PrometheusClient(stack.target_url)
    audit = AuditStore()
    try:
        dag, snap, before = cut_over(stack, audit)
        result = fed(dag, "rollback", snapshot=snap).execute(context())
        assert result["restored_identical"] is True
        assert files(stack) == before  # every byte: configs, rule files (the target's gone again), dashboard
        assert {"gpu:fb_used:ratio", "GpuMemoryNearlyFull"} <= names(source) and not names(target)
        kinds = [e.kind for e in audit.events(group=GROUP, run_id=RUN_ID)]
        assert kinds.index("read_path_restored") < kinds.index("rules_restored") < kinds.index("rolled_back")
    finally:
        audit.engine.dispose()


def test_the_full_rollback_by_hand_in_another_run_restores_rules_and_dashboard_too(
        stack: LocalStack, wired: Path) -> None:
    """The ``promshift__rollback`` DAG's run finds the cut-over run's snapshots through the audit."""
    from promshift.orchestration.dag_factory import build_by_hand_dags

    source, target = PrometheusClient(stack.source_url), PrometheusClient(stack.target_url)
    audit = AuditStore()
    try:
        _dag, _snap, before = cut_over(stack, audit)
        rollback = build_by_hand_dags(load_catalog(CATALOG, profile="demo").groups, catalog_path=CATALOG,
                                      profile="demo")[2]
        ctx = {**context(), "run_id": "manual__full-rollback", "params": {"group": GROUP, "reason": "test"}}
        result = rollback.get_task("rollback").execute(ctx)
        assert set(result["restored"]) == {"routing", "read_path", "rules"}
        assert result["restored"]["rules"]["restored_identical"] is True
        assert files(stack) == before  # the entry removed by name leaves the source config as it was
        assert {"gpu:fb_used:ratio", "GpuMemoryNearlyFull"} <= names(source) and not names(target)
        assert audit.stage_of(GROUP) == Stage.ROLLED_BACK
    finally:
        audit.engine.dispose()
