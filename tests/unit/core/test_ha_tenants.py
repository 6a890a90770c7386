"""HA pairs (core.ha: dedup labels on the write path, the replica the target kept, a doubled target) and tenants
(core.tenants: the label-set limit's pre-flight and its workspace entry; steps.tenants), with the catalog's
``replicas:`` and ``tenant:`` sections and the strict lab's rules they rely on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import yaml

from promshift.adapters.k8s_deploy import cr_remote_write_entry
from promshift.core.catalog import CatalogError, ReplicaPolicy, TenantPolicy, parse_catalog
from promshift.core.ha import REPLICAS_MEASUREMENT, dedup_relabel, doubled_replicas, elect, elected_replica
from promshift.core.ingest_limits import LABEL_SET_LIMIT, WorkspaceLimits
from promshift.core.parity import ParityResult
from promshift.core.render import remote_write_entry
from promshift.core.tenants import current_limit, merged_limits, tenant_entry, tenant_preflight
from promshift.core.verdicts import Measurement, Verdict
from promshift.local.stack.amp_ingest import Series, WorkspaceIngest, encode_write_request, snappy_compress
from promshift.steps.tenants import TenantRefused, apply_tenant

T0 = 1_700_000_000_000
PAIR = ReplicaPolicy(replica_label="prometheus_replica", cluster_label="cluster",
                     sources=(("source-0", "src0"), ("source-1", "src1")))


def relabel(labels: Mapping[str, str], rules: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Prometheus's ``replace`` (default regex ``(.*)``, replacement ``$1``) and ``labeldrop`` (anchored)."""
    import re

    out = dict(labels)
    for rule in rules:
        if rule["action"] == "replace":
            value = ";".join(out.get(name, "") for name in rule["source_labels"])
            if value:
                out[rule["target_label"]] = value
        elif rule["action"] == "labeldrop":
            out = {k: v for k, v in out.items() if not re.fullmatch(rule["regex"], k)}
    return out


def test_a_replicated_sources_entry_carries_amps_dedup_labels_and_none_without_replicas() -> None:
    plain = remote_write_entry(group_name="g", name_regex="m", url="http://t/api/v1/write")
    assert remote_write_entry(group_name="g", name_regex="m", url="http://t/api/v1/write",
                              replicas=ReplicaPolicy()) == plain
    entry = remote_write_entry(group_name="g", name_regex="m", url="http://t/api/v1/write", replicas=PAIR,
                               drop_labels=("UUID",))
    rules = entry["write_relabel_configs"]
    assert rules[:2] == plain["write_relabel_configs"] + [{"regex": "UUID", "action": "labeldrop"}]
    external = {"__name__": "m", "gpu": "0", "cluster": "fleet", "prometheus_replica": "source-1"}
    assert relabel(external, rules[2:]) == {"__name__": "m", "gpu": "0", "cluster": "fleet",
                                            "__replica__": "source-1"}
    # a cluster label named otherwise becomes AMP's ``cluster``
    other = ReplicaPolicy(replica_label="replica", cluster_label="k8s_cluster")
    assert relabel({"__name__": "m", "k8s_cluster": "c", "replica": "r1"}, dedup_relabel(other)) == {
        "__name__": "m", "cluster": "c", "__replica__": "r1"}
    # the k8s-cr and git shapes: the operator's spelling of the same rules
    cr = cr_remote_write_entry(entry)
    assert {"sourceLabels": ["prometheus_replica"], "targetLabel": "__replica__", "action": "replace"} \
        in cr["writeRelabelConfigs"]


def test_two_replicas_relabelled_for_dedup_are_stored_once_by_the_strict_workspace() -> None:
    rules = dedup_relabel(PAIR)
    series = [Series(tuple(sorted(relabel({"__name__": "m", "gpu": "0", "cluster": "fleet",
                                           "prometheus_replica": r}, rules).items())), [(T0 + i, float(i))])
              for i, r in enumerate(("source-0", "source-1"))]
    ws = WorkspaceIngest()
    out = ws.ingest(snappy_compress(encode_write_request(series)), WorkspaceLimits(), 0.0)
    assert out.status == 200
    assert [dict(s.labels) for s in out.accepted] == [{"__name__": "m", "cluster": "fleet", "gpu": "0"}]
    assert ws.ha.leaders["fleet"][0] == "source-0" and ws.deduped == 1
    # the same pair written without the dedup labels: two series (the replica label tells them apart)
    plain = [Series((("__name__", "m"), ("cluster", "fleet"), ("gpu", "0"), ("prometheus_replica", r)), [(T0, 1.0)])
             for r in ("source-0", "source-1")]
    assert len(WorkspaceIngest().ingest(snappy_compress(encode_write_request(plain)), WorkspaceLimits(),
                                        0.0).accepted) == 2


def result(verdict: Verdict, mismatches: int = 0, reason: str = "") -> ParityResult:
    return ParityResult(verdict, (Measurement("samples", verdict, reason or verdict.value),), mismatches=mismatches)


def test_elect_keeps_the_replica_the_target_matches_and_records_it() -> None:
    got = elect({"source-0": result(Verdict.FAILED, 40, "11 of 17 points differ"),
                 "source-1": result(Verdict.SUCCESSFUL)})
    assert got.verdict == Verdict.SUCCESSFUL and elected_replica(got) == "source-1"
    note = next(m for m in got.measurements if m.name == REPLICAS_MEASUREMENT)
    assert note.name == REPLICAS_MEASUREMENT and note.numbers["replicas"] == {"source-0": "FAILED",
                                                                              "source-1": "SUCCESSFUL"}
    both = elect({"source-0": result(Verdict.SUCCESSFUL), "source-1": result(Verdict.SUCCESSFUL)})
    assert both.verdict == Verdict.SUCCESSFUL and elected_replica(both) is None  # they agree: not told apart
    assert both.measurements[-1].numbers["matching"] == ["source-0", "source-1"]
    assert "cannot be told apart" in both.measurements[-1].reason


def test_a_target_matching_no_replica_fails_naming_each() -> None:
    got = elect({"source-0": result(Verdict.FAILED, 40, "points differ"),
                 "source-1": result(Verdict.FAILED, 3, "points differ")})
    assert got.verdict == Verdict.FAILED and elected_replica(got) is None
    note = next(m for m in got.measurements if m.name == REPLICAS_MEASUREMENT)
    assert "matches none of the replicas source-0, source-1" in note.reason and note.numbers["closest"] == "source-1"
    with pytest.raises(ValueError):
        elect({})


def test_a_target_holding_both_replicas_fails_on_coverage_whatever_the_other_layers_say() -> None:
    doubled = doubled_replicas({"source-0": 32, "source-1": 32}, replica_label="prometheus_replica", query="q")
    assert doubled is not None and doubled.verdict == Verdict.FAILED and doubled.layer.value == "coverage"
    assert "series count doubled" in doubled.reason and "source-0, source-1" in doubled.reason
    assert "64 series where one replica has 32" in doubled.reason
    got = elect({"source-0": result(Verdict.SUCCESSFUL)}, doubled=doubled)
    assert got.verdict == Verdict.FAILED and got.measurements[-1] is doubled
    # the dedup kept one: no replica label stored (""), or one replica's only
    assert doubled_replicas({"": 32}, replica_label="prometheus_replica") is None
    assert doubled_replicas({"source-1": 32, "source-0": 0}, replica_label="prometheus_replica") is None


def catalog(extra: dict[str, Any]) -> str:
    return yaml.safe_dump({"version": 1, "defaults": {"latency": {"windows": [{"range": "1h", "slo_p95": "2s"}]}},
                           "groups": [{"name": "g", "owners": ["o"], "approvers": ["a", "b"], "metrics": ["m"],
                                       "latency": {"queries": ["sum(m)"]}, **extra}]}, sort_keys=False)


def test_the_catalog_reads_replicas_and_tenant_and_names_bad_values() -> None:
    g = parse_catalog(catalog({"replicas": {"replica_label": "prometheus_replica",
                                            "sources": {"source-0": "prom_a", "source-1": "prom_b"}},
                               "tenant": {"label_set": {"team": "ml"}, "max_series": 5000}})).get("g")
    assert g.replicas == ReplicaPolicy("prometheus_replica", "cluster", (("source-0", "prom_a"),
                                                                          ("source-1", "prom_b")))
    assert g.tenant == TenantPolicy((("team", "ml"),), 5000) and g.tenant.enabled
    assert not parse_catalog(catalog({})).get("g").replicas.enabled
    with pytest.raises(CatalogError) as bad:
        parse_catalog(catalog({"replicas": {"replica_label": "9x", "sources": {"a": "bad conn"}},
                               "tenant": {"label_set": {"bad-label": "x"}, "max_series": -1}}))
    text = "\n".join(bad.value.problems)
    for field in ("replicas.replica_label", "replicas.sources.a", "tenant.label_set.bad-label", "tenant.max_series"):
        assert field in text, text
    with pytest.raises(CatalogError) as half:
        parse_catalog(catalog({"replicas": {"sources": {"source-0": "prom_a"}}, "tenant": {"max_series": 5}}))
    assert any("'replicas.sources': needs replicas.replica_label" in p for p in half.value.problems), half.value
    assert any("'tenant.max_series': needs tenant.label_set" in p for p in half.value.problems), half.value


TEAM = TenantPolicy((("team", "ml"),), 100)


def test_the_tenant_entry_is_merged_into_the_workspaces_others() -> None:
    others = [{"labelSet": {"team": "infra"}, "limits": {"maxSeries": 7}}]
    assert merged_limits(others, TEAM) == [*others, tenant_entry(TEAM)]
    assert merged_limits([{"labelSet": {"team": "ml"}, "limits": {"maxSeries": 1}}, *others], TEAM) == [
        {"labelSet": {"team": "ml"}, "limits": {"maxSeries": 100}}, *others]
    assert current_limit(others, TEAM) is None and current_limit(merged_limits(others, TEAM), TEAM) == 100


def test_the_tenant_preflight_refuses_a_limit_the_group_would_outrun_or_never_reach() -> None:
    ok = tenant_preflight(TEAM, group_series=40, group_series_in_set=40, label_set_series=50)
    assert ok.ok and ok.numbers["projected"] == 90
    over = tenant_preflight(TEAM, group_series=40, group_series_in_set=40, label_set_series=70)
    assert not over.ok and "110 series once the group lands (70 held + 40 of the group) > maxSeries 100" in over.reason
    none = tenant_preflight(TEAM, group_series=40, group_series_in_set=0, label_set_series=0)
    assert not none.ok and "none of the group's 40 series carry the label set" in none.reason


class FakeWorkspace:
    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries, self.updates = entries, 0

    def label_set_limits(self) -> list[dict[str, Any]]:
        return [dict(e) for e in self.entries]

    def set_label_set_limits(self, entries: Sequence[Mapping[str, Any]]) -> None:
        self.entries, self.updates = [dict(e) for e in entries], self.updates + 1


def test_apply_tenant_sets_the_limit_once_and_refuses_with_nothing_set() -> None:
    g = parse_catalog(catalog({"tenant": {"label_set": {"team": "ml"}, "max_series": 100}})).get("g")
    ws = FakeWorkspace([{"labelSet": {"team": "infra"}, "limits": {"maxSeries": 7}}])
    counts = {'{team="ml", __name__=~"m"}': 40.0, '{__name__=~"m"}': 40.0, '{team="ml"}': 10.0}
    evidence = apply_tenant(g, ws, source_count=counts.__getitem__, target_count=counts.__getitem__)
    assert evidence["set"] and ws.updates == 1 and len(ws.entries) == 2
    assert apply_tenant(g, ws, source_count=counts.__getitem__, target_count=counts.__getitem__)["set"] is False
    assert ws.updates == 1  # a retry reaches the same end
    counts['{team="ml"}'] = 90.0
    with pytest.raises(TenantRefused, match=r"^tenant pre-flight refused: "):
        apply_tenant(g, FakeWorkspace([]), source_count=counts.__getitem__, target_count=counts.__getitem__)


def test_the_strict_workspace_throttles_only_the_tenant_past_its_limit() -> None:
    limits = WorkspaceLimits(label_set_limits=(((("team", "ml"),), 2),))
    ws = WorkspaceIngest()
    spike = [Series((("__name__", "m"), ("gpu", str(i)), ("team", "ml")), [(T0, 1.0)]) for i in range(5)]
    other = [Series((("__name__", "m"), ("gpu", str(i)), ("team", "infra")), [(T0, 1.0)]) for i in range(5)]
    out = ws.ingest(snappy_compress(encode_write_request(spike + other)), limits, 0.0)
    assert out.status == 429 and "per-labelset series limit of 2 exceeded" in out.message
    kept = [dict(s.labels)["team"] for s in out.accepted]
    assert kept.count("ml") == 2 and kept.count("infra") == 5
    assert ws.discards.counts == {LABEL_SET_LIMIT: 3}
