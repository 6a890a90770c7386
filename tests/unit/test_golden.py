from __future__ import annotations

import json
from pathlib import Path

import pytest

from promshift.core.golden import (
    GoldenQueryError,
    dashboard_queries,
    grafana_builtins,
    queries_for_group,
    substitute,
)

DASHBOARD = json.loads((Path(__file__).resolve().parents[2] / "catalog/dashboards/dcgm-exporter-dashboard.json")
                       .read_text())


def test_real_dashboard_queries_are_extracted() -> None:
    queries = dashboard_queries(DASHBOARD)
    assert len(queries) == 8
    assert queries[0].panel == "GPU Temperature"
    assert queries[0].expr == 'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}'


def test_rows_nest_panels() -> None:
    dash = {"panels": [{"type": "row", "title": "r", "panels": [{"title": "p", "targets": [{"expr": "up"}]}]}]}
    assert [q.panel for q in dashboard_queries(dash)] == ["p"]


def test_queries_for_group_keep_only_the_groups_metrics() -> None:
    power = {"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP"}
    picked = queries_for_group(DASHBOARD, power.__contains__)
    assert [q.panel for q in picked] == ["GPU Temperature", "GPU Avg. Temp", "GPU Power Usage", "GPU Power Total"]


@pytest.mark.parametrize("expr,expected", [
    ('avg(m{instance=~"$instance", gpu=~"$gpu"})', 'avg(m{instance=~".+", gpu=~"0|1"})'),
    ('m{gpu=~"${gpu}"}', 'm{gpu=~"0|1"}'),
    ('m{gpu=~"${gpu:regex}"}', 'm{gpu=~"0|1"}'),
    ('m{gpu=~"[[gpu]]"}', 'm{gpu=~"0|1"}'),
    ("rate(m[$__rate_interval])", "rate(m[60s])"),
])
def test_substitution(expr: str, expected: str) -> None:
    assert substitute(expr, {"instance": ".+", "gpu": "0|1"}, builtins=grafana_builtins(15, 3600)) == expected


def test_variable_without_value_is_named() -> None:
    with pytest.raises(GoldenQueryError, match=r"\$Hostname has no value"):
        substitute('m{Hostname=~"$Hostname"}', {"gpu": ".+"})
