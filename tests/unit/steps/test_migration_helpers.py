from __future__ import annotations

import pytest

from promshift.adapters.prometheus import parse_query_response
from promshift.core.promql import widest_range_s
from promshift.steps.migration import scrape_interval_s


@pytest.mark.parametrize("query,seconds", [
    ("sum by (Hostname) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m]))", 300.0),
    ("avg(DCGM_FI_DEV_GPU_UTIL)", None),
    ("max_over_time(x[1h:1m]) + rate(y[30s])", 3600.0),
])
def test_range_selector_width(query: str, seconds: float | None) -> None:
    assert widest_range_s(query) == seconds


def test_scrape_interval_from_config_defaults_to_prometheus_default() -> None:
    assert scrape_interval_s("global:\n  scrape_interval: 15s\n") == 15.0
    assert scrape_interval_s("scrape_configs: []\n") == 60.0


def test_server_time_prefers_exec_total_time() -> None:
    body = {"status": "success", "data": {"resultType": "matrix", "result": [],
                                          "stats": {"timings": {"evalTotalTime": 0.2, "execQueueTime": 0.05,
                                                                "execTotalTime": 0.25}}}}
    assert parse_query_response("q", body, elapsed_s=0.3, http_status=200, size=10).server_time_s == 0.25
    del body["data"]["stats"]["timings"]["execTotalTime"]
    assert parse_query_response("q", body, elapsed_s=0.3, http_status=200, size=10).server_time_s == 0.2
