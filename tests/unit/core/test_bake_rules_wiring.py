"""The bake watch reads the moved rules' health on the target (``lifecycle.moved_rules`` and ``observe``)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters import rules_deploy
from promshift.adapters.audit_store import AuditStore
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.adapters.routing import RoutingStore
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.core.bake import MovedRule, judge
from promshift.core.rules import LoadedRule, RuleKind
from promshift.core.verdicts import Verdict
from promshift.orchestration.compose import compose_migration
from promshift.steps.lifecycle import GroupLifecycle, moved_rules
from promshift.steps.migration import Backends, GroupMigration

GROUP = "gpu-memory"
T0 = datetime(2026, 12, 1, tzinfo=UTC)
MOVED = [{"kind": "record", "name": "gpu:fb_used:ratio", "group": "gpu-memory"},
         {"kind": "alert", "name": "GpuMemoryNearlyFull", "group": "gpu-memory"}]
LABELS = ["record gpu:fb_used:ratio (/srv/rules/gpu-memory.yml: group 'gpu-memory', rule 1)",
          "alert GpuMemoryNearlyFull (/srv/rules/gpu-memory.yml: group 'gpu-memory', rule 2)"]


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    yield store
    store.engine.dispose()


def migration(tmp_path: Path, audit: AuditStore) -> GroupMigration:
    group = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get(GROUP)
    refused = PrometheusClient("http://127.0.0.1:9", timeout_s=2)  # nothing listens: every read is an error
    backends = Backends(source=refused, target=refused, source_config_path=str(tmp_path / "prometheus.yml"),
                        target_remote_write_url="")
    return compose_migration(group, backends, audit=audit, routing=RoutingStore(audit.url), snapshots_dir=tmp_path,
                          run_id="scheduled__bake")


def record(audit: AuditStore, kind: str, evidence: dict[str, Any], at: datetime = T0) -> None:
    audit.append(group=GROUP, run_id="manual__migrate", kind=kind, actor="test", at=at, evidence=evidence)


def test_no_handoff_or_nothing_moved_means_no_rules_to_watch(tmp_path: Path, audit: AuditStore) -> None:
    assert moved_rules(migration(tmp_path, audit)) is None
    record(audit, "rules_moved", {"moved": False, "rules": 0, "records": 0, "alerts": 0})
    assert moved_rules(migration(tmp_path, audit)) is None


def test_the_latest_handoff_names_the_rules_and_when(tmp_path: Path, audit: AuditStore) -> None:
    record(audit, "rules_moved", {"moved": True, "rules": 2, "moved_rules": MOVED})
    rules, at = moved_rules(migration(tmp_path, audit))
    assert rules == [MovedRule("record", "gpu:fb_used:ratio", "gpu-memory"),
                     MovedRule("alert", "GpuMemoryNearlyFull", "gpu-memory")]
    assert at == T0


def test_an_older_event_gives_the_rules_from_the_targets_labels(tmp_path: Path, audit: AuditStore) -> None:
    record(audit, "rules_moved", {"moved": True, "rules": 2, "target": {"details": {"rules": LABELS}}})
    rules, _ = moved_rules(migration(tmp_path, audit))
    assert [(r.kind, r.name, r.group) for r in rules] == [("record", "gpu:fb_used:ratio", "gpu-memory"),
                                                          ("alert", "GpuMemoryNearlyFull", "gpu-memory")]


def test_an_event_naming_none_of_its_rules_is_an_error(tmp_path: Path, audit: AuditStore) -> None:
    record(audit, "rules_moved", {"moved": True, "rules": 2})
    with pytest.raises(ValueError, match="names none of its 2 rules"):
        moved_rules(migration(tmp_path, audit))


def test_rules_restored_after_the_handoff_leave_nothing_to_watch(tmp_path: Path, audit: AuditStore) -> None:
    record(audit, "rules_moved", {"moved": True, "rules": 2, "moved_rules": MOVED})
    record(audit, "rules_restored", {"changed": True}, at=T0 + timedelta(minutes=5))
    assert moved_rules(migration(tmp_path, audit)) is None


def observe(tmp_path: Path, audit: AuditStore, now: datetime) -> Any:
    life = GroupLifecycle(migration(tmp_path, audit), parity_check=lambda _s, _n: (Verdict.SUCCESSFUL, "ok"))
    return life.observe(now)


def test_observe_reads_the_moved_rules_on_the_target(tmp_path: Path, audit: AuditStore,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    record(audit, "rules_moved", {"moved": True, "rules": 2, "moved_rules": MOVED})
    seen: list[str] = []

    def loaded(client: PrometheusClient) -> list[LoadedRule]:
        seen.append(client.base_url)
        return [LoadedRule("amp-ws-promshift-gpu-memory.yml", "gpu-memory", RuleKind.RECORD, "gpu:fb_used:ratio",
                           health="ok", last_evaluation="2026-12-01T00:09:58Z", interval_s=5.0),
                LoadedRule("amp-ws-promshift-gpu-memory.yml", "gpu-memory", RuleKind.ALERT, "GpuMemoryNearlyFull",
                           health="err", last_error="many-to-many matching not allowed",
                           last_evaluation="2026-12-01T00:09:59Z", interval_s=5.0)]

    monkeypatch.setattr(rules_deploy, "loaded_rules", loaded)
    obs = observe(tmp_path, audit, T0 + timedelta(minutes=10))
    assert seen == ["http://127.0.0.1:9"]
    assert obs.rules.loaded_age_s == 600
    assert [(r.name, r.health, r.last_evaluation_age_s) for r in obs.rules.rules] == [
        ("gpu:fb_used:ratio", "ok", 2.0), ("GpuMemoryNearlyFull", "err", 1.0)]
    assert "rules" not in dict(obs.errors)
    rules = judge(obs, load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get(GROUP).bake)
    line = {m.name: m for m in rules.measurements}["rules"]
    assert line.verdict == Verdict.FAILED
    assert line.reason == "alert GpuMemoryNearlyFull health err: many-to-many matching not allowed"


def test_an_unreadable_rules_api_is_an_error_entry(tmp_path: Path, audit: AuditStore,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    record(audit, "rules_moved", {"moved": True, "rules": 2, "moved_rules": MOVED})

    def refused(client: PrometheusClient) -> list[LoadedRule]:
        raise PrometheusError(client.base_url, "HTTP 503 for rules")

    monkeypatch.setattr(rules_deploy, "loaded_rules", refused)
    obs = observe(tmp_path, audit, T0 + timedelta(minutes=10))
    assert obs.rules is None and "HTTP 503 for rules" in dict(obs.errors)["rules"]


def test_a_group_that_moved_no_rules_is_not_asked_about_rules(tmp_path: Path, audit: AuditStore,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def never(client: PrometheusClient) -> list[LoadedRule]:
        raise AssertionError("the rules API was read for a group that moved no rules")

    monkeypatch.setattr(rules_deploy, "loaded_rules", never)
    obs = observe(tmp_path, audit, T0 + timedelta(minutes=10))
    assert obs.rules is None and "rules" not in dict(obs.errors)


def test_observe_checks_a_firing_moved_alert_in_the_targets_alertmanager(tmp_path: Path, audit: AuditStore,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from promshift.adapters.alertmanager import AlertmanagerError, DeliveredAlert

    record(audit, "rules_moved", {"moved": True, "rules": 2, "moved_rules": MOVED})
    now = T0 + timedelta(minutes=10)
    monkeypatch.setattr(rules_deploy, "loaded_rules", lambda _c: [])
    monkeypatch.setattr(rules_deploy, "firing_alerts", lambda _c: [("GpuMemoryNearlyFull", now.timestamp() - 200),
                                                                  ("NotMoved", now.timestamp() - 900)])
    asked: list[str] = []

    def held(name: str) -> list[DeliveredAlert]:
        asked.append(name)
        return [DeliveredAlert({"alertname": name}, "active", ("promshift-local-oncall",))]

    m = migration(tmp_path, audit)
    m.backends = dataclasses.replace(m.backends, target_alerts=held)
    obs = GroupLifecycle(m, parity_check=lambda _s, _n: (Verdict.SUCCESSFUL, "ok")).observe(now)
    assert asked == ["GpuMemoryNearlyFull"]
    assert [(a.name, a.firing_s, a.held, a.receivers) for a in obs.delivery.alerts] == [
        ("GpuMemoryNearlyFull", 200.0, 1, ("promshift-local-oncall",))]
    policy = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get(GROUP).bake
    assert {x.name: x.verdict for x in judge(obs, policy).measurements}["delivery"] == Verdict.SUCCESSFUL

    def unreadable(_name: str) -> list[DeliveredAlert]:
        raise AlertmanagerError("Alertmanager http://am/api/v2/alerts: HTTP 503")

    m.backends = dataclasses.replace(m.backends, target_alerts=unreadable)
    obs = GroupLifecycle(m, parity_check=lambda _s, _n: (Verdict.SUCCESSFUL, "ok")).observe(now)
    assert dict(obs.errors)["delivery"] == "Alertmanager http://am/api/v2/alerts: HTTP 503"
