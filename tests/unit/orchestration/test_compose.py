"""``compose.aggregation_rule_file``: what the file path deploys on the source for a group's aggregations."""

from __future__ import annotations

from pathlib import Path

import yaml

from promshift.core.catalog import Aggregate, MetricGroup
from promshift.orchestration.compose import aggregation_rule_file


def test_a_group_without_aggregations_deploys_no_rule_file(tmp_path: Path) -> None:
    assert aggregation_rule_file(MetricGroup(name="g", metrics=("A",)), tmp_path / "prometheus.yml") is None


def test_the_rule_file_sits_beside_the_config_and_records_each_operation_at_the_scrape_interval(
        tmp_path: Path) -> None:
    group = MetricGroup(name="gpu-power", metrics=("A", "B_total"), scrape_interval_s=15.0,
                        aggregations=(Aggregate("A", ("Hostname",), ("sum", "count")),
                                      Aggregate("B_total", ("job",), ("max",), rate_s=120.0)))
    rules = aggregation_rule_file(group, tmp_path / "prometheus.yml")
    assert rules is not None
    assert rules.path == tmp_path / "rules" / "promshift-aggregate-gpu-power.yml"
    assert rules.listed == "rules/promshift-aggregate-gpu-power.yml" and rules.group == "promshift-aggregate-gpu-power"
    assert rules.records == ("Hostname:A:sum", "Hostname:A:count", "job:B_total:max_rate2m")
    doc = yaml.safe_load(rules.data)
    (rule_group,) = doc["groups"]
    assert rule_group["name"] == rules.group and rule_group["interval"] == "15s"
    assert rule_group["rules"] == [
        {"record": "Hostname:A:sum", "expr": "sum by (Hostname) (A)"},
        {"record": "Hostname:A:count", "expr": "count by (Hostname) (A)"},
        {"record": "job:B_total:max_rate2m", "expr": "max by (job) (rate(B_total[2m]))"}]
    # The keep filter ships exactly the recorded series plus what is not aggregated (nothing here).
    assert all(group.claims(r) for r in rules.records) and not group.claims("A") and not group.claims("B_total")
