"""AMP monthly cost projection: hand-computed numbers, validation, estimated vs measured samples."""

from __future__ import annotations

import json
import pickle

import pytest

from promshift.core.cost import (
    MONTH_S,
    AmpPrices,
    CostConfigError,
    QueryCost,
    estimate_range_samples,
    estimate_samples,
    project_monthly_cost,
    samples_from_stats,
)

# Round example prices (USD), not a claim about any region's current list price.
PRICES = {
    "ingest_per_10m_samples": 0.90,
    "storage_per_gb_month": 0.03,
    "query_per_billion_samples": 0.10,
    "bytes_per_sample": 1.5,
}

# A `stats=all` answer exactly as Debian's Prometheus 2.42 returned it (data.stats).
PROM_242_STATS = {
    "timings": {
        "evalTotalTime": 8.7821e-05,
        "resultSortTime": 8.02e-07,
        "queryPreparationTime": 5.5943e-05,
        "innerEvalTime": 2.3174e-05,
        "execQueueTime": 4.5878e-05,
        "execTotalTime": 0.000142513,
    },
    "samples": {"totalQueryableSamples": 610, "peakSamples": 71},
}


def test_month_is_730_hours() -> None:
    assert MONTH_S == 2_628_000


def test_projection_matches_hand_computed_numbers() -> None:
    # 2,000 nodes x 8 GPUs x 20 metrics = 320,000 series, 30 s scrape, 150 days retention.
    measured = QueryCost("sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)", 3600, 2_000_000, True)
    estimated = QueryCost("avg(quantile_over_time(0.9, DCGM_FI_DEV_GPU_UTIL[1h]))", 3600,
                          estimate_samples(16_000, 3600, 30), False)
    p = project_monthly_cost(active_series=320_000, scrape_interval_s=30, retention_days=150,
                             queries=[measured, estimated], dashboard_refresh_s=60, dashboard_viewers=10,
                             prices=AmpPrices.from_mapping(PRICES))
    # Ingestion: 320,000 x 2,628,000 / 30 = 28,032,000,000 samples = 2,803.2 x 10M x $0.90.
    assert p.ingestion_samples_per_month == pytest.approx(28_032_000_000)
    assert p.ingestion_usd == pytest.approx(2_522.88)
    # Storage: 320,000 x 150 x 86,400 / 30 = 138.24e9 samples x 1.5 B = 207.36 GB x $0.03.
    assert p.storage_gb == pytest.approx(207.36)
    assert p.storage_usd == pytest.approx(6.2208)
    # Query: 10 viewers x 2,628,000 / 60 = 438,000 executions of each query.
    # measured: 2e6 x 438,000 = 876e9 samples -> $87.60; estimated: 16,000 x 3,600 / 30 = 1.92e6
    # per execution -> 840.96e9 samples -> $84.096.
    assert [line.executions_per_month for line in p.queries] == [pytest.approx(438_000)] * 2
    assert p.queries[0].usd == pytest.approx(87.60)
    assert p.queries[1].samples_per_execution == pytest.approx(1_920_000)
    assert p.queries[1].usd == pytest.approx(84.096)
    assert p.query_samples_per_month == pytest.approx(876e9 + 840.96e9)
    assert p.query_usd == pytest.approx(171.696)
    assert p.total_usd == pytest.approx(2_522.88 + 6.2208 + 171.696)
    assert p.estimated_queries == 1


def test_to_dict_is_json_shaped_and_complete() -> None:
    p = project_monthly_cost(active_series=1_000, scrape_interval_s=15, retention_days=30,
                             queries=[QueryCost("up", 0, 1_000, True)], dashboard_refresh_s=30,
                             dashboard_viewers=2, prices=AmpPrices(**PRICES))
    d = p.to_dict()
    assert set(d) == {"ingestion", "storage", "query", "total_usd"}
    assert d["total_usd"] == pytest.approx(p.total_usd)
    assert d["ingestion"] == {"samples_per_month": p.ingestion_samples_per_month, "usd": p.ingestion_usd}
    assert d["storage"] == {"gb": p.storage_gb, "usd": p.storage_usd}
    assert d["query"]["estimated_queries"] == 0
    assert d["query"]["queries"][0]["query"] == "up" and d["query"]["queries"][0]["measured"] is True
    json.dumps(d)  # nothing in it needs a custom encoder


def test_no_viewers_or_no_queries_cost_nothing_to_query() -> None:
    base = {"active_series": 10, "scrape_interval_s": 30, "retention_days": 1, "dashboard_refresh_s": 60,
            "prices": AmpPrices(**PRICES)}
    nobody = project_monthly_cost(queries=[QueryCost("up", 0, 5, True)], dashboard_viewers=0, **base)
    assert nobody.query_usd == 0 and nobody.query_samples_per_month == 0
    empty = project_monthly_cost(queries=[], dashboard_viewers=5, **base)
    assert empty.query_usd == 0 and empty.queries == () and empty.total_usd == pytest.approx(
        empty.ingestion_usd + empty.storage_usd)


def test_prices_double_the_bill_linearly() -> None:
    kwargs = {"active_series": 5_000, "scrape_interval_s": 30, "retention_days": 90,
              "queries": [QueryCost("q", 3600, 1e6, True)], "dashboard_refresh_s": 60, "dashboard_viewers": 3}
    one = project_monthly_cost(prices=AmpPrices(**PRICES), **kwargs)
    two = project_monthly_cost(prices=AmpPrices(**{k: v * 2 for k, v in PRICES.items()}), **kwargs)
    # bytes_per_sample doubled too, so storage quadruples; the other two dimensions double.
    assert two.ingestion_usd == pytest.approx(2 * one.ingestion_usd)
    assert two.query_usd == pytest.approx(2 * one.query_usd)
    assert two.storage_usd == pytest.approx(4 * one.storage_usd)


# ---------------------------------------------------------------------------- validation


def test_prices_from_mapping_reports_every_problem() -> None:
    with pytest.raises(CostConfigError) as err:
        AmpPrices.from_mapping({"ingest_per_10m_samples": "0.90", "storage_per_gb_mont": 0.03,
                                "query_per_billion_samples": -0.1, "bytes_per_sample": 0})
    problems = err.value.problems
    assert "missing key 'storage_per_gb_month'" in problems
    assert any(p.startswith("unknown key 'storage_per_gb_mont'") for p in problems)
    assert "'ingest_per_10m_samples' must be a number, got '0.90' (str)" in problems
    assert "'query_per_billion_samples' must be >= 0, got -0.1" in problems
    assert "'bytes_per_sample' must be > 0, got 0" in problems
    assert len(problems) == 5
    assert "invalid AMP prices (5 problems)" in str(err.value)
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize("bad", [True, float("nan"), float("inf"), None, [1]])
def test_prices_refuse_non_numbers(bad: object) -> None:
    with pytest.raises(CostConfigError, match="ingest_per_10m_samples"):
        AmpPrices.from_mapping({**PRICES, "ingest_per_10m_samples": bad})


def test_prices_from_mapping_accepts_ints_and_a_free_dimension() -> None:
    prices = AmpPrices.from_mapping({**PRICES, "storage_per_gb_month": 0, "bytes_per_sample": 2})
    assert prices.storage_per_gb_month == 0.0 and isinstance(prices.bytes_per_sample, float)
    assert prices.to_dict()["bytes_per_sample"] == 2.0


def test_prices_validate_on_direct_construction_and_non_mapping() -> None:
    with pytest.raises(CostConfigError, match="'storage_per_gb_month' must be >= 0"):
        AmpPrices(ingest_per_10m_samples=1, storage_per_gb_month=-1, query_per_billion_samples=1,
                  bytes_per_sample=1)
    with pytest.raises(CostConfigError, match="expected a mapping of prices, got list"):
        AmpPrices.from_mapping([("ingest_per_10m_samples", 1)])  # type: ignore[arg-type]


def test_errors_survive_pickling() -> None:
    # Airflow ships task exceptions across processes.
    err = CostConfigError("AMP prices", ["missing key 'x'"])
    again = pickle.loads(pickle.dumps(err))
    assert again.problems == err.problems and str(again) == str(err)


def test_query_cost_validation() -> None:
    with pytest.raises(CostConfigError) as err:
        QueryCost(" ", -1, float("nan"), 1)  # type: ignore[arg-type]
    assert len(err.value.problems) == 4


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("active_series", -1, "'active_series' must be >= 0"),
        ("active_series", 10.5, "'active_series' must be an integer"),
        ("scrape_interval_s", 0, "'scrape_interval_s' must be > 0"),
        ("retention_days", -3, "'retention_days' must be >= 0"),
        ("dashboard_refresh_s", 0, "'dashboard_refresh_s' must be > 0"),
        ("dashboard_viewers", True, "'dashboard_viewers' must be an integer"),
        ("prices", {"ingest_per_10m_samples": 1}, "'prices' must be AmpPrices"),
        ("queries", ["up"], "queries[0] must be a QueryCost"),
    ],
)
def test_projection_inputs_are_validated(field: str, value: object, message: str) -> None:
    kwargs: dict[str, object] = {"active_series": 1, "scrape_interval_s": 30, "retention_days": 1, "queries": [],
                                 "dashboard_refresh_s": 60, "dashboard_viewers": 1, "prices": AmpPrices(**PRICES)}
    kwargs[field] = value
    with pytest.raises(CostConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        project_monthly_cost(**kwargs)  # type: ignore[arg-type]


# ------------------------------------------------------------------ estimated vs measured samples


def test_estimate_samples_is_series_times_window_over_interval() -> None:
    assert estimate_samples(16_000, 3600, 30) == 1_920_000
    assert estimate_samples(0, 3600, 30) == 0
    assert estimate_samples(3, 0, 15) == 0
    with pytest.raises(CostConfigError, match="scrape_interval_s"):
        estimate_samples(1, 60, 0)
    with pytest.raises(CostConfigError, match="series"):
        estimate_samples(-1, 60, 15)


def test_range_estimate_counts_per_step_like_prometheus() -> None:
    # Measured on Prometheus 2.42 (1 s scrape, 60 s range, 1 s step): `up` -> 61, `rate(up[10s])` -> 610.
    assert estimate_range_samples(series=1, range_s=60, step_s=1, scrape_interval_s=1) == 61
    assert estimate_range_samples(series=1, range_s=60, step_s=1, scrape_interval_s=1, selector_window_s=10) == 610
    # A range query over a range selector processes many times what estimate_samples() counts once.
    per_step = estimate_range_samples(series=8_000, range_s=3600, step_s=15, scrape_interval_s=30,
                                      selector_window_s=300)
    assert per_step == 8_000 * 241 * 10
    assert per_step > 10 * estimate_samples(8_000, 3600, 30)


def test_samples_from_prometheus_242_stats() -> None:
    assert samples_from_stats(PROM_242_STATS) == 610.0
    # The whole response body or its data object work too.
    assert samples_from_stats({"status": "success", "data": {"result": [], "stats": PROM_242_STATS}}) == 610.0
    assert samples_from_stats({"result": [], "stats": PROM_242_STATS}) == 610.0


def test_samples_from_stats_per_step_and_absent() -> None:
    amp = {"samples": {"totalQueryableSamplesPerStep": [[1652382537, 3], [1652383537, 4]]}}
    assert samples_from_stats(amp) == 7.0
    assert samples_from_stats({}) is None  # asked without stats=all, or a backend without stats
    assert samples_from_stats({"timings": {"evalTotalTime": 0.1}}) is None
    assert samples_from_stats({"samples": {"totalQueryableSamples": 0}}) == 0.0
    with pytest.raises(ValueError, match="totalQueryableSamples"):
        samples_from_stats({"samples": {"totalQueryableSamples": -5}})
    with pytest.raises(ValueError, match="malformed"):
        samples_from_stats({"samples": {"totalQueryableSamplesPerStep": [[1]]}})


def test_measured_and_estimated_costs_differ_and_are_labelled() -> None:
    # The same query: measured per-step count vs the once-per-sample estimate.
    measured = QueryCost("rate", 3600, estimate_range_samples(series=100, range_s=3600, step_s=15,
                                                              scrape_interval_s=30, selector_window_s=300), True)
    estimated = QueryCost("rate", 3600, estimate_samples(100, 3600, 30), False)
    p = project_monthly_cost(active_series=100, scrape_interval_s=30, retention_days=1,
                             queries=[measured, estimated], dashboard_refresh_s=60, dashboard_viewers=1,
                             prices=AmpPrices(**PRICES))
    m, e = p.queries
    assert (m.measured, e.measured) == (True, False) and p.estimated_queries == 1
    assert m.samples_per_execution == 100 * 241 * 10 and e.samples_per_execution == 12_000
    assert m.usd / e.usd == pytest.approx(241 * 10 / 120)
