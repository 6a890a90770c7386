"""The source connection names the PrometheusRule objects its rules live in (issue 37 item 6)."""

from __future__ import annotations

import pytest

from promshift.adapters.k8s_rules import PrometheusRuleSource, spec_of, spec_text
from promshift.core.deploy import DeployError
from promshift.core.deploy_kinds import kubernetes_source_of

BASE = {"deploy": "k8s-cr", "kubernetes": {"namespace": "monitoring", "name": "k8s", "in_cluster": True}}


def with_rules(value: object) -> dict:
    return {**BASE, "kubernetes": {**BASE["kubernetes"], "prometheus_rules": value}}


def test_prometheus_rules_are_namespace_slash_name() -> None:
    source = kubernetes_source_of(with_rules(["monitoring/gpu-rules", "kube-system/node.rules"]))
    assert source is not None
    assert source.prometheus_rules == (("monitoring", "gpu-rules"), ("kube-system", "node.rules"))
    assert kubernetes_source_of(BASE).prometheus_rules == ()  # rule files on disk, as before


@pytest.mark.parametrize("bad", [["gpu-rules"], ["Monitoring/x"], ["a/b/c"], "monitoring/gpu-rules", [""]])
def test_anything_else_is_one_line(bad: object) -> None:
    with pytest.raises(ValueError, match=r"extra.kubernetes.prometheus_rules must list \"namespace/name\""):
        kubernetes_source_of(with_rules(bad))


def test_a_spec_reads_as_a_rule_file_and_back() -> None:
    spec = {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up == 0 # 'quoted': yes\n",
                                                "annotations": {"summary": "{{ $labels.x }}: ünïcode"}}]}]}
    assert spec_of(spec_text(spec)) == spec
    assert spec_text(None) == "groups: []\n"


def test_naming_no_object_is_refused() -> None:
    with pytest.raises(DeployError, match="no PrometheusRule named"):
        PrometheusRuleSource(None, [], None)  # type: ignore[arg-type]
