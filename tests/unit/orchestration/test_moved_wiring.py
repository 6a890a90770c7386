"""Rules and dashboards moving with a group, through the operators of the production DAGs.

The dashboards are real provisioned files switched by the real ``DashboardFilesSwitch`` (configured by a
``grafana_default`` connection, as in production); the rules move is a recording fake (its real pieces need
promtool and two Prometheus servers: tests/integration). Connections, audit store and snapshot store are real.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.rules_deploy import RulesSnapshot
from promshift.adapters.settings import REPO_ROOT
from promshift.core.deploy import DeploySnapshot
from promshift.core.report import build_report
from promshift.core.rules import RuleKind
from promshift.core.stages import Stage
from tests.fakes import fed
from tests.unit.orchestration.test_operators import (  # noqa: F401 - fixtures
    GROUP,
    RUN_ID,
    UP_TO_CUT_OVER,
    audit,
    bake_check,
    bake_dag,
    dag,
    env,
    make_context,
    new_events,
    seed,
    task,
)

DCGM = REPO_ROOT / "catalog" / "dashboards" / "dcgm-exporter-dashboard.json"
UP_TO_APPROVED = UP_TO_CUT_OVER[:-1]
READ_PATH = {"source_datasource": {"uid": "prom-src", "name": "Prometheus"},
             "target_datasource": {"uid": "amp-ws1", "name": "AMP"}}


@pytest.fixture
def dashboards(env: Path, monkeypatch: pytest.MonkeyPatch) -> Path:  # noqa: F811
    """A provisioned dashboard folder and the ``grafana_default`` connection naming it (file mode)."""
    folder = env / "dashboards"
    folder.mkdir()
    (folder / "dcgm.json").write_bytes(DCGM.read_bytes())
    monkeypatch.setenv("AIRFLOW_CONN_GRAFANA_DEFAULT", json.dumps({
        "conn_type": "http", "host": "http://127.0.0.1:1",
        "extra": {"read_path": {**READ_PATH, "files": [str(folder / "*.json")]}}}))
    return folder / "dcgm.json"


@dataclass
class FakeMove:
    """A ``RulesMove`` that records what it was asked, with the snapshot it was given each time."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    fail_rollback: bool = False

    SNAP = RulesSnapshot(DeploySnapshot("rules-source", "/src/rules/gpu.yml", "groups: []\n", {"existed": True}),
                         DeploySnapshot("rules-prometheus", "/tgt/rules/promshift-gpu-memory.yml", "",
                                        {"existed": False}))

    def snapshot(self) -> RulesSnapshot:
        self.calls.append(("snapshot", {}))
        return self.SNAP

    def plan(self, snap: RulesSnapshot) -> Any:
        rules = (SimpleNamespace(name="gpu:fb_used:ratio", kind=RuleKind.RECORD, group="gpu"),
                 SimpleNamespace(name="GpuMemoryExhausted", kind=RuleKind.ALERT, group="gpu"))

        def only(kind: RuleKind) -> Any:
            return SimpleNamespace(rules=tuple(r for r in rules if r.kind is kind))

        return SimpleNamespace(selection=SimpleNamespace(rules=rules, only=only, files=("/src/rules/gpu.yml",)),
                               empty=False, checks={"document": "SUCCESS"})

    def add_records(self, plan: Any, snap: RulesSnapshot, now: Any) -> None:
        self.calls.append(("add_records", snap.to_dict()))

    def handoff(self, plan: Any, snap: RulesSnapshot, now: Any) -> dict[str, Any]:
        self.calls.append(("handoff", snap.to_dict()))
        return {"rules": 2, "gap_s": 0.1, "source": {}, "target": {}}

    def rollback(self, snap: RulesSnapshot, now: Any) -> dict[str, Any]:
        self.calls.append(("rollback", snap.to_dict()))
        if self.fail_rollback:
            raise RuntimeError("target refused the restore")
        return {"target": {}, "source": {}, "restored_identical": True}

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


@pytest.fixture
def rules(env: Path, monkeypatch: pytest.MonkeyPatch) -> FakeMove:  # noqa: F811
    """Every operator's rules step moves through one FakeMove (the snapshot store is the real one)."""
    from promshift.adapters.blobs import LocalBlobs
    from promshift.orchestration.operators import _GroupStep
    from promshift.steps.moves import RulesStep

    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps({
        "conn_type": "prometheus", "host": "http://127.0.0.1:1",
        "extra": {"config_path": str(env / "prometheus.yml"), "rules": True}}))
    move = FakeMove()
    monkeypatch.setattr(_GroupStep, "rules_step",
                        lambda self, migration: RulesStep(migration, move, LocalBlobs(env / "snapshots")))
    return move


def kinds(audit: AuditStore, history: list[Stage]) -> list[str]:  # noqa: F811
    return [e.kind for e in new_events(audit, history)]


def cut_over(dag: Any, audit: AuditStore) -> None:  # noqa: F811
    """Up to approved, then the snapshot step's moved part and the cut-over, as the DAG runs them."""
    seed(audit, UP_TO_APPROVED)
    task(dag, "snapshot")._snapshot_moved(make_context())
    task(dag, "cutover").execute(make_context())


def test_without_rules_or_grafana_nothing_moves_and_the_report_says_not_configured(
        dag: Any, audit: AuditStore) -> None:  # noqa: F811
    op = task(dag, "cutover")
    migration = op.migration(make_context())
    assert op.rules_step(migration) is None and op.read_path_step(migration) is None
    assert op.moved_restorers(migration) == []
    cut_over(dag, audit)
    assert kinds(audit, UP_TO_APPROVED) == ["cut_over"]  # exactly what a cut-over recorded before
    report = build_report(group=GROUP, run_id=RUN_ID, events=audit.events(group=GROUP, run_id=RUN_ID),
                          final_stage="cut_over", chain=audit.verify())
    assert report["rules"]["reason"] == report["read_path"]["reason"] == "not configured"
    assert report["rules"]["moved"] == 0 and report["read_path"]["switched"] is False


def test_a_grafana_connection_without_read_path_is_not_configured(dag: Any, env: Path,  # noqa: F811
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_GRAFANA_DEFAULT", json.dumps({"conn_type": "http", "host": "http://127.0.0.1:1"}))
    op = task(dag, "cutover")
    assert op.read_path_step(op.migration(make_context())) is None


def test_rules_on_a_self_hosted_target_need_its_config_path(dag: Any, env: Path,  # noqa: F811
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from promshift.adapters.rules_deploy import PrometheusRulesTarget

    config = env / "prometheus.yml"
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps({
        "conn_type": "prometheus", "host": "http://127.0.0.1:1", "extra": {"config_path": str(config), "rules": True}}))
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "prometheus", "host": "http://127.0.0.1:1",
        "extra": {"remote_write_url": "http://127.0.0.1:1/api/v1/write"}}))
    op = task(dag, "cutover")
    with pytest.raises(AirflowFailException, match="'promshift_target' needs extra.config_path"):
        op.rules_step(op.migration(make_context()))
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "prometheus", "host": "http://127.0.0.1:1",
        "extra": {"config_path": str(env / "target.yml"), "rules_dir": str(env / "trules"),
                  "remote_write_url": "http://127.0.0.1:1/api/v1/write"}}))
    op = task(dag, "validate")  # a fresh operator: hooks are cached per operator
    step = op.rules_step(op.migration(make_context()))
    assert isinstance(step.move.target, PrometheusRulesTarget)
    assert step.move.target.rule_path == env / "trules" / "promshift-gpu-memory.yml"
    assert step.move.source.config_path == config


def test_cutover_moves_rules_then_dashboards_then_routes_once_per_run(
        dag: Any, audit: AuditStore, dashboards: Path, rules: FakeMove) -> None:  # noqa: F811
    before = dashboards.read_bytes()
    cut_over(dag, audit)
    assert kinds(audit, UP_TO_APPROVED) == ["rules_snapshot", "read_path_snapshot", "rules_moved",
                                            "read_path_switched", "cut_over"]
    assert rules.names() == ["snapshot", "handoff"]
    assert rules.calls[1][1] == FakeMove.SNAP.to_dict()  # the handoff got the snapshot back from the store
    assert dashboards.read_bytes() != before and b'"uid": "amp-ws1"' in dashboards.read_bytes()
    events = {e.kind: e.evidence_data for e in audit.events(group=GROUP)}
    assert (events["rules_moved"]["rules"], events["rules_moved"]["records"], events["rules_moved"]["alerts"]) == \
        (2, 1, 1)
    assert events["read_path_switched"]["dashboards"] == 1 and events["read_path_switched"]["panels"] == 1
    assert "content" not in json.dumps(events["read_path_snapshot"])  # the store keeps the bytes, not the audit
    # A retried cut-over hands nothing off and switches nothing again.
    switched = dashboards.read_bytes()
    task(dag, "cutover").execute(make_context())
    assert rules.names() == ["snapshot", "handoff"] and dashboards.read_bytes() == switched
    assert kinds(audit, UP_TO_APPROVED)[-1] == "cut_over" and kinds(audit, UP_TO_APPROVED).count("rules_moved") == 1
    report = build_report(group=GROUP, run_id=RUN_ID, events=audit.events(group=GROUP, run_id=RUN_ID),
                          final_stage="cut_over", chain=audit.verify())
    assert report["rules"]["moved"] > 0 and report["read_path"] == {
        "configured": True, "switched": True, "dashboards": 1, "panels": 1, "restored": False, "reason": None,
        "kind": "grafana-files"}


def test_the_warmup_puts_the_recording_rules_on_the_target(dag: Any, audit: AuditStore, rules: FakeMove) -> None:  # noqa: F811
    seed(audit, [Stage.DUAL_WRITING, Stage.WARMING])
    task(dag, "snapshot")._snapshot_moved(make_context())
    task(dag, "warm_up").execute_complete(make_context(), {"status": "ready", "reason": "caught up"})
    assert rules.names() == ["snapshot", "add_records"]
    assert kinds(audit, [Stage.DUAL_WRITING, Stage.WARMING])[-1] == "rules_records_added"


def test_the_rollback_restores_dashboards_and_rules_byte_for_byte(
        dag: Any, audit: AuditStore, dashboards: Path, rules: FakeMove) -> None:  # noqa: F811
    before = dashboards.read_bytes()
    cut_over(dag, audit)
    fed(dag, "rollback").execute(make_context())
    assert dashboards.read_bytes() == before
    assert rules.names() == ["snapshot", "handoff", "rollback"] and rules.calls[2][1] == FakeMove.SNAP.to_dict()
    assert kinds(audit, UP_TO_APPROVED)[5:7] == ["read_path_restored", "rules_restored"]
    # Again (a retried task): nothing left to restore, nothing recorded twice.
    fed(dag, "rollback").execute(make_context())
    assert rules.names().count("rollback") == 1
    assert kinds(audit, UP_TO_APPROVED).count("read_path_restored") == 1


def test_a_rules_restore_that_fails_fails_the_rollback_after_the_rest_was_restored(
        dag: Any, audit: AuditStore, dashboards: Path, rules: FakeMove) -> None:  # noqa: F811
    before = dashboards.read_bytes()
    cut_over(dag, audit)
    rules.fail_rollback = True
    with pytest.raises(AirflowFailException, match="rules: RuntimeError: target refused the restore"):
        fed(dag, "rollback").execute(make_context())
    assert dashboards.read_bytes() == before
    assert "rules_restore_failed" in kinds(audit, UP_TO_APPROVED)


def test_a_failed_bake_check_returns_dashboards_and_rules_with_the_reads(
        dag: Any, bake_dag: Any, audit: AuditStore, dashboards: Path, rules: FakeMove) -> None:  # noqa: F811
    """The bake watch runs in its own DAG run: the snapshots are found through the audit, not the run id."""
    from promshift.adapters.routing import RoutingStore

    before = dashboards.read_bytes()
    cut_over(dag, audit)
    assert RoutingStore(audit.url).read_from(GROUP) == "target"
    ctx = {**make_context(), "run_id": "scheduled__bake"}
    [watched] = task(bake_dag, "watched").execute(ctx)  # the cut-over group, with its connections
    with pytest.raises(AirflowFailException, match="reads returned to the source"):
        bake_check(bake_dag, watched).execute(ctx)  # closed ports: the check is ERROR
    assert dashboards.read_bytes() == before
    assert rules.names()[-1] == "rollback"
    restored = next(e for e in audit.events(group=GROUP) if e.kind == "reads_rolled_back").evidence_data["restored"]
    assert set(restored) == {"routing", "read_path", "rules"}  # (the audit keeps keys sorted)
    after = kinds(audit, UP_TO_APPROVED)[5:]
    assert after[:5] == ["bake_started", "bake_check", "read_path_restored", "rules_restored", "reads_rolled_back"]
    assert restored["rules"]["snapshot_run_id"] == restored["read_path"]["snapshot_run_id"] == RUN_ID
    assert audit.stage_of(GROUP) == Stage.ROLLED_BACK_READS
    assert RoutingStore(audit.url).read_from(GROUP) == "source"


def parity_inputs() -> dict[str, Any]:
    """The reducer's inputs: the plan's XCom ``plan``, and no shards."""
    from promshift.core.parity import Measurement, ParityPlan, ParityWindow
    from promshift.core.verdicts import Verdict

    plan = ParityPlan(ParityWindow(1000.0, 1600.0, 30.0), (Measurement("coverage", Verdict.SUCCESSFUL, "ok"),))
    return {"plan": plan.to_dict(), "shards": []}


def test_the_rules_layer_joins_the_parity_result_when_rules_move(
        dag: Any, audit: AuditStore, rules: FakeMove, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from promshift.adapters import rules_deploy
    from promshift.core.verdicts import Measurement, Verdict

    asked: list[dict[str, Any]] = []

    def fake_parity(source: Any, target: Any, selection: Any, **window: Any) -> list[Measurement]:
        asked.append({"rules": [r.name for r in selection.rules], **window})
        return [Measurement("rules", Verdict.FAILED, "1 failed of 2 rules"),
                Measurement("rules[GpuMemoryExhausted]", Verdict.FAILED, "values differ")]

    monkeypatch.setattr(rules_deploy, "rules_parity", fake_parity)
    seed(audit, [Stage.DUAL_WRITING, Stage.WARMING])
    task(dag, "snapshot")._snapshot_moved(make_context())
    result = fed(dag, "parity", **parity_inputs()).execute(make_context())
    assert asked and asked[0]["rules"] == ["gpu:fb_used:ratio", "GpuMemoryExhausted"]
    assert (asked[0]["start"], asked[0]["end"], asked[0]["step"]) == (1000.0, 1600.0, 30.0)
    layers = {m["name"]: m["verdict"] for m in result["measurements"]}
    assert layers["rules"] == "FAILED" and layers["rules[GpuMemoryExhausted]"] == "FAILED"
    assert result["verdict"] == "FAILED"  # a rule that does not match fails the gate like any layer


def test_no_rules_layer_without_rules_and_an_error_layer_when_they_cannot_be_compared(
        dag: Any, audit: AuditStore, monkeypatch: pytest.MonkeyPatch, env: Path) -> None:  # noqa: F811
    result = fed(dag, "parity", **parity_inputs()).execute(make_context())
    assert not any(m["name"].startswith("rules") for m in result["measurements"])
    # Configured, but this run took no rules snapshot: the layer is ERROR, never a silent pass.
    from promshift.adapters.blobs import LocalBlobs
    from promshift.orchestration.operators import _GroupStep
    from promshift.steps.moves import RulesStep

    monkeypatch.setattr(_GroupStep, "rules_step",
                        lambda self, migration: RulesStep(migration, FakeMove(), LocalBlobs(env / "snapshots")))
    result = fed(dag, "parity", **parity_inputs()).execute(make_context())
    rules_layer = next(m for m in result["measurements"] if m["name"] == "rules")
    assert rules_layer["verdict"] == "ERROR" and "took no rules snapshot" in rules_layer["reason"]


def test_a_dry_run_compares_the_rules_it_would_move_and_keeps_nothing(
        dag: Any, audit: AuditStore, rules: FakeMove, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from promshift.adapters import rules_deploy
    from promshift.core.verdicts import Measurement, Verdict

    monkeypatch.setattr(rules_deploy, "rules_parity", lambda *_a, **_k: [
        Measurement("rules", Verdict.SUCCESSFUL, "2 successful of 2 rules")])
    result = fed(dag, "parity", **parity_inputs()).execute(make_context(params={"dry_run": True}))
    assert {m["name"]: m["verdict"] for m in result["measurements"]}["rules"] == "SUCCESSFUL"
    assert rules.names() == ["snapshot"]  # read, never stored or moved
    assert not [e for e in audit.events(group=GROUP) if e.kind.startswith("rules_")]


def test_a_failed_handoff_is_recorded_and_named_by_the_rollback(
        dag: Any, audit: AuditStore, dashboards: Path, rules: FakeMove, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from promshift.adapters.routing import RoutingStore

    def refuse(plan: Any, snap: Any, now: Any) -> None:
        raise RuntimeError("promtool refused the target document")

    monkeypatch.setattr(rules, "handoff", refuse)
    before = dashboards.read_bytes()
    with pytest.raises(RuntimeError, match="promtool refused"):
        cut_over(dag, audit)
    assert kinds(audit, UP_TO_APPROVED)[-1] == "rules_move_failed"
    assert dashboards.read_bytes() == before  # nothing after the rules was touched, not even the routing
    assert RoutingStore(audit.url).read_from(GROUP) != "target"
    fed(dag, "rollback").execute(make_context())
    [rolled] = [e for e in audit.events(group=GROUP) if e.kind in ("rollback_not_needed", "rolled_back")]
    assert rolled.evidence_data["reason"] == ("rules handoff failed: RuntimeError: promtool refused the target "
                                              "document")
