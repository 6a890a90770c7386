"""core.retire: the agent subset of a source's config and command line, and what retiring ends."""

from __future__ import annotations

import pytest
import yaml

from promshift.core.retire import (
    RetireEnds,
    RetireError,
    agent_argv,
    agent_config,
    allowed_gap_s,
    is_agent_argv,
    longest_gap,
    parse_acceptances,
    refused_sections,
    retire_decision,
    unowned_metrics,
)

CONFIG = b"""\
# my source, my comments
global:
  scrape_interval: 15s   # keep me

rule_files:
  - rules/*.yml
  # a commented rule file

alerting:
  alertmanagers:
    - static_configs:
        - targets: ['am:9093']
remote_read: [{url: 'http://r/api/v1/read'}]
scrape_configs:
  - job_name: node
    static_configs: [{targets: ['n:9100']}]

remote_write:
  - url: http://amp/api/v1/remote_write
"""


def test_the_agent_subset_drops_only_what_agent_mode_refuses_and_keeps_every_other_byte() -> None:
    edited = agent_config(CONFIG)
    assert refused_sections(edited) == []
    before, after = yaml.safe_load(CONFIG), yaml.safe_load(edited)
    assert after == {k: v for k, v in before.items() if k not in ("rule_files", "alerting", "remote_read")}
    for kept in (b"# my source, my comments\n", b"  scrape_interval: 15s   # keep me\n", b"  # a commented rule file\n",
                 b"scrape_configs:\n  - job_name: node\n", b"remote_write:\n  - url: http://amp/api/v1/remote_write\n"):
        assert kept in edited
    assert edited.count(b"# promshift retire: removed") == 3
    assert agent_config(edited) == edited  # idempotent


def test_a_config_it_cannot_cut_cleanly_is_refused_in_one_line() -> None:
    with pytest.raises(RetireError, match="not a YAML mapping"):
        agent_config(b"- a\n- b\n")
    with pytest.raises(RetireError, match="not YAML we can edit"):
        agent_config(b"global: [\n")
    # an anchor defined in a refused section and used elsewhere: cutting it would change the rest
    with pytest.raises(RetireError, match="cannot be cut out"):
        agent_config(b"rule_files: &r [a.yml]\nscrape_configs: []\nx: *r\n")


def test_agent_argv_drops_server_only_flags_and_adds_the_switch_for_the_version() -> None:
    server = ("/usr/bin/prometheus", "--config.file=/c.yml", "--storage.tsdb.path=/d",
              "--storage.tsdb.retention.time=15d", "--rules.alert.resend-delay=5s", "--web.enable-lifecycle",
              "--alertmanager.notification-queue-capacity=10", "--query.timeout=1m")
    two = agent_argv(server, "/agent")
    assert two == ("/usr/bin/prometheus", "--enable-feature=agent", "--config.file=/c.yml", "--web.enable-lifecycle",
                   "--storage.agent.path=/agent")
    assert is_agent_argv(two) and not is_agent_argv(server)
    assert agent_argv(two, "/agent") == two
    assert agent_argv(server, "/agent", major_version=3)[1] == "--agent"


def test_every_thing_retiring_ends_blocks_until_accepted_by_its_exact_name() -> None:
    ends = RetireEnds(rules=("g/r",), reads=("m",), unowned_metrics=("x",), history=("gpu/panel:7d",))
    assert ends.names() == ["rule:g/r", "read:m", "metric:x", "history:gpu/panel:7d"]
    blocked = retire_decision(ends, parse_acceptances("rule:g/r, metric:X\n"))
    assert not blocked.ok and blocked.blocking == ("read:m", "metric:x", "history:gpu/panel:7d")
    assert blocked.unknown_acceptances == ("metric:X",)
    assert "read:m" in blocked.line()
    assert retire_decision(ends, parse_acceptances(["rule:g/r", "read:m", "metric:x", "history:gpu/panel:7d"])).ok
    assert retire_decision(RetireEnds(), ()).ok


def test_unowned_metrics_leave_out_prometheus_own_and_what_a_group_claims() -> None:
    stored = ["up", "scrape_duration_seconds", "go_goroutines", "DCGM_A", "DCGM_B", "node_load1"]
    assert unowned_metrics(stored, lambda m: m.startswith("DCGM_")) == ("node_load1",)


def test_a_gap_counts_the_window_edges_and_no_data_never_passes() -> None:
    assert longest_gap([], since=0, until=10) is None
    assert longest_gap([5.0], since=0, until=10) is None
    assert longest_gap([1.0, 3.0, 9.0], since=0, until=10) == 6.0
    assert longest_gap([1.0, 2.0], since=0, until=30) == 28.0  # the series stopped: the gap runs to the end
    assert allowed_gap_s(5) == 20.0 and allowed_gap_s(60) < 300


# -- the k8s-cr path: a PrometheusAgent for a Prometheus resource ------------------------------------------------

PROMETHEUS = {
    "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
    "metadata": {"name": "k8s", "namespace": "monitoring", "labels": {"prometheus": "k8s"},
                 "annotations": {"owner": "fleet"}, "resourceVersion": "117", "uid": "u-1",
                 "creationTimestamp": "2026-12-01T00:00:00Z", "generation": 4},
    "spec": {"replicas": 2, "retention": "15d", "ruleSelector": {}, "evaluationInterval": "30s",
             "alerting": {"alertmanagers": [{"namespace": "monitoring", "name": "am", "port": "web"}]},
             "serviceMonitorSelector": {"matchLabels": {"team": "gpu"}}, "externalLabels": {"cluster": "a"},
             "remoteWrite": [{"url": "http://127.0.0.1:9/w", "name": "promshift-gpu"}]},
    "status": {"availableReplicas": 2},
}


def test_the_agent_keeps_every_field_an_agent_has_and_saves_the_server_as_its_owner_wrote_it() -> None:
    from promshift.core.retire import (
        SAVED_PROMETHEUS_ANNOTATION,
        agent_resource,
        canonical,
        saved_prometheus,
        user_content,
    )

    agent, dropped = agent_resource(PROMETHEUS)
    assert dropped == ["alerting", "evaluationInterval", "retention", "ruleSelector"]
    assert (agent["apiVersion"], agent["kind"]) == ("monitoring.coreos.com/v1alpha1", "PrometheusAgent")
    assert agent["spec"] == {"replicas": 2, "serviceMonitorSelector": {"matchLabels": {"team": "gpu"}},
                             "externalLabels": {"cluster": "a"}, "remoteWrite": PROMETHEUS["spec"]["remoteWrite"]}
    assert agent["metadata"]["labels"] == {"prometheus": "k8s"} and agent["metadata"]["annotations"]["owner"] == "fleet"
    assert "resourceVersion" not in agent["metadata"] and "status" not in agent
    saved = saved_prometheus(agent)
    assert saved == user_content(PROMETHEUS) and "status" not in saved
    assert set(saved["metadata"]) == {"name", "namespace", "labels", "annotations"}
    assert canonical(saved) == canonical(user_content({**PROMETHEUS, "metadata": {
        **PROMETHEUS["metadata"], "resourceVersion": "999", "uid": "u-2"}}))  # what the API sets never counts
    assert SAVED_PROMETHEUS_ANNOTATION not in saved["metadata"]["annotations"]
    again, _ = agent_resource(saved)  # idempotent: an agent made from the saved resource carries the same save
    assert again == agent


def test_a_resource_too_large_for_an_annotation_or_without_a_name_is_refused() -> None:
    from promshift.core.retire import RetireError, agent_resource, saved_prometheus

    huge = {**PROMETHEUS, "spec": {**PROMETHEUS["spec"], "externalLabels": {f"k{i}": "v" * 100 for i in range(3000)}}}
    with pytest.raises(RetireError, match="too large to keep in an annotation"):
        agent_resource(huge)
    with pytest.raises(RetireError, match="no metadata.name"):
        agent_resource({**PROMETHEUS, "metadata": {}})
    assert saved_prometheus({"metadata": {"annotations": {"promshift.io/retired-prometheus": "{not json"}}}) is None
    assert saved_prometheus({"metadata": {}}) is None
