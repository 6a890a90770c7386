"""The plan's aggregation pass: which reads allow a recording rule, which block it, and what it saves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from promshift.adapters.usage import ReadNotes, query_log_paths, read_query_log
from promshift.core.aggregation import decide, read_shapes
from promshift.core.catalog import check_catalog
from promshift.core.cost import AmpPrices, CostConfigError, ingest_usd, monthly_bill
from promshift.core.plan import Reader, UsageCollector, label_reads, metric_stats, recommend
from promshift.core.plan_aggregation import aggregate_plan, shape_index
from promshift.core.plan_render import catalog_draft, plan_markdown

REPO = Path(__file__).resolve().parents[3]
PRICES = AmpPrices.from_mapping(yaml.safe_load((REPO / "catalog" / "amp_prices.yaml").read_text()))
LABELS = {"Hostname", "gpu", "UUID", "instance", "job", "modelName"}
NODES, GPUS = 4, 8


def _decide(metric: str, exprs: list[str], type_: str = "gauge") -> Any:
    shapes = [(f"read {i}", s) for i, e in enumerate(exprs) for s in read_shapes(e) if s.metric == metric]
    return decide(metric, shapes, LABELS, type_=type_)


# --------------------------------------------------------------------------- one metric's decision


def test_sum_reads_record_a_sum_at_the_labels_they_keep_and_a_fleet_sum_re_aggregates_it() -> None:
    a = _decide("P", ["sum by (Hostname) (P)", 'sum(P{Hostname="n1"})'])
    assert a.recommended and a.family == "sum" and a.level == ("Hostname",)
    assert [(r.record, r.expr) for r in a.rules] == [("Hostname:P:sum", "sum by (Hostname) (P)")]
    assert dict((r, w) for r, _, w in a.rewrites) == {
        "read 0": "sum by (Hostname) (Hostname:P:sum)", "read 1": 'sum (Hostname:P:sum{Hostname="n1"})'}


def test_avg_is_recorded_as_sum_and_count_and_read_as_their_ratio() -> None:
    a = _decide("U", ["avg by (Hostname) (U)", "count(U)"])
    assert [r.record for r in a.rules] == ["Hostname:U:sum", "Hostname:U:count"]
    assert [r.expr for r in a.rules] == ["sum by (Hostname) (U)", "count by (Hostname) (U)"]
    rewrites = dict((r, w) for r, _, w in a.rewrites)
    assert rewrites["read 0"] == "(sum by (Hostname) (Hostname:U:sum) / sum by (Hostname) (Hostname:U:count))"
    assert rewrites["read 1"] == "sum (Hostname:U:count)"  # a count of series is a sum of counts


def test_max_is_recorded_as_max_and_min_is_another_family() -> None:
    a = _decide("T", ["max by (Hostname) (T)", "max(T)"])
    assert [r.record for r in a.rules] == ["Hostname:T:max"] and a.family == "max"
    blocked = _decide("T", ["max by (Hostname) (T)", "min by (Hostname) (T)"])
    assert not blocked.recommended
    assert blocked.blockers[0].reader == "read 1" and "min" in blocked.blockers[0].why


def test_counters_are_recorded_as_rate_over_the_reads_window_never_as_a_sum_of_raw_counters() -> None:
    a = _decide("E_total", ["sum by (Hostname) (rate(E_total[5m]))", "sum(increase(E_total[5m]))"], "counter")
    assert [(r.record, r.expr) for r in a.rules] == [("Hostname:E_total:rate5m",
                                                      "sum by (Hostname) (rate(E_total[5m]))")]
    assert dict((r, w) for r, _, w in a.rewrites)["read 1"] == "(sum (Hostname:E_total:rate5m) * 300)"
    raw = _decide("E_total", ["sum by (Hostname) (E_total)"], "counter")
    assert not raw.recommended and "raw counter" in raw.blockers[0].why
    windows = _decide("E_total", ["sum(rate(E_total[5m]))", "sum(rate(E_total[1h]))"], "counter")
    assert not windows.recommended and "one window" in windows.blockers[0].why


@pytest.mark.parametrize(("expr", "why"), [
    ('U{instance=~".*", gpu=~".*"}', "no aggregation"),
    ("topk(5, U)", "topk() hands back the series"),
    ('avg by (Hostname) (U{gpu=~"0|1"})', "selects on gpu"),
    ("avg by (Hostname) (U * 100)", "binary operation"),
    ("avg by (Hostname) (avg_over_time(U[5m]))", "avg_over_time() over the raw series"),
    ("avg by (Hostname) (U offset 1h)", "offset"),
    ("quantile(0.9, U)", "quantile()"),
])
def test_a_read_that_needs_the_raw_series_blocks_the_metric_and_is_named(expr: str, why: str) -> None:
    a = _decide("U", ["avg by (Hostname) (U)", expr])
    assert not a.recommended and not a.rules
    assert a.blockers[0].reader == "read 1" and why in a.blockers[0].why, a.blockers


def test_topk_over_the_aggregate_reads_only_the_aggregate() -> None:
    assert _decide("U", ["topk(3, avg by (Hostname) (U))"]).recommended


# --------------------------------------------------------------------------- the plan


def _series(name: str) -> list[dict[str, str]]:
    return [{"__name__": name, "Hostname": f"n{n}", "gpu": str(g), "UUID": f"GPU-{n}-{g}", "instance": f"n{n}:9400",
             "job": "dcgm", "modelName": "H100"} for n in range(NODES) for g in range(GPUS)]


def _dashboard(title: str, expr: str, variables: dict[str, str] | None = None) -> dict[str, Any]:
    return {"templating": {"list": [{"name": k, "current": {"value": v}} for k, v in (variables or {}).items()]},
            "panels": [{"title": title, "targets": [{"expr": expr}]}]}


FLEET_VIEW = [("Node utilisation", "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)"),
              ("Fleet utilisation", "avg(DCGM_FI_DEV_GPU_UTIL)"),
              ("Hottest node", "max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)"),
              ("Node power", "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)"),
              ("Energy", "sum by (Hostname) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m]))")]
TYPES = {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter"}


def _plan(extra: list[tuple[str, str, str]] = ()) -> tuple[dict[str, Any], Any]:
    """(plan dict, Plan) for the fleet view plus ``extra`` dashboards ``(file, panel, expr)``."""
    u = UsageCollector()
    for title, expr in FLEET_VIEW:
        u.add_dashboard(_dashboard(title, expr), "fleet.json", builtins={})
    for file, title, expr in extra:
        u.add_dashboard(_dashboard(title, expr), file, builtins={})
    u.add("max by (Hostname) (DCGM_FI_DEV_GPU_TEMP) > 85", Reader("rule", "gpu / NodeHot"), count=100)
    index, reads = shape_index(u), label_reads(u)
    metrics = {}
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
                 "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"):
        series = _series(name)
        type_ = TYPES.get(name, "gauge")
        metrics[name] = metric_stats(name, series, candidates=reads.candidates(name, LABELS, ["job"]), type_=type_,
                                     default_interval_s=15.0, level=index.level(name, LABELS, type_))
    plan = recommend(metrics, u, prices=PRICES, retention_days=150, period_s=30 * 86_400, now=0,
                     protected_labels=["job", "Hostname"], default_interval_s=15.0)
    plan = aggregate_plan(plan, metrics, u, prices=PRICES, retention_days=150, index=index)
    return plan.to_dict(), plan


def test_every_fleet_read_aggregates_per_node_so_the_target_gets_8x_fewer_series() -> None:
    plan, _ = _plan()
    aggs = {a["metric"]: a for a in plan["aggregations"]}
    assert all(a["recommended"] for a in aggs.values()), aggs
    util = aggs["DCGM_FI_DEV_GPU_UTIL"]
    assert [r["record"] for r in util["rules"]] == ["Hostname:DCGM_FI_DEV_GPU_UTIL:sum",
                                                   "Hostname:DCGM_FI_DEV_GPU_UTIL:count"]
    temp = aggs["DCGM_FI_DEV_GPU_TEMP"]
    assert temp["series_before"] == NODES * GPUS and temp["series_after"] == NODES  # one max per node: 8x fewer
    assert temp["samples_per_s_before"] == pytest.approx(NODES * GPUS / 15) and temp["evaluation_interval_s"] == 15
    assert temp["samples_per_s_after"] == pytest.approx(NODES / 15, rel=1e-5)
    assert util["series_after"] == 2 * NODES  # sum and count per node
    assert aggs["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]["rules"][0]["record"] == (
        "Hostname:DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION:rate5m")
    assert temp["saved_usd"] > 0 and temp["cost_after_usd"] < temp["cost_before_usd"]
    bill = plan["bill"]
    assert bill["aggregated"]["series"] == sum(a["series_after"] for a in aggs.values())
    assert bill["aggregated"]["ingest_samples"] < bill["read"]["ingest_samples"] / 3
    # 128 GPUs' month fits AMP's free tier either way: the workspace's bill (free tier taken off once) saves nothing,
    # though each metric's own cost (no free tier) does.
    assert bill["read"]["ingest_samples"] < PRICES.free_ingest_samples
    assert bill["read"]["total_usd"] == bill["aggregated"]["total_usd"] == bill["saved_by_aggregation_usd"] == 0
    group = next(g for g in plan["groups"] if "DCGM_FI_DEV_GPU_TEMP" in g["metrics"])
    assert "DCGM_FI_DEV_GPU_TEMP" in group["aggregations"]
    assert group["cost_aggregated"]["series"] < group["cost_after"]["series"]
    md = plan_markdown(plan)
    assert "Hostname:DCGM_FI_DEV_GPU_TEMP:max" in md and "price table dated 2026-12-06" in md
    assert "32 → 4" in md
    assert "| rule: gpu / NodeHot | `max by (Hostname) (DCGM_FI_DEV_GPU_TEMP) > 85` | " \
           "`max by (Hostname) (Hostname:DCGM_FI_DEV_GPU_TEMP:max) > 85` |" in md
    draft = catalog_draft(plan, host_label="Hostname", scrape_interval_s=15)
    assert "# -> Hostname:DCGM_FI_DEV_GPU_TEMP:max" in draft
    # The draft carries each aggregation as a catalog field, and passes the catalog's own check.
    check = check_catalog(draft)
    assert check.ok, check.problems
    shipped = {a.metric: a for g in check.catalog.groups for a in g.aggregations}
    assert shipped["DCGM_FI_DEV_GPU_UTIL"].operations == ("sum", "count")
    assert shipped["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].rate_s == 300
    assert shipped["DCGM_FI_DEV_GPU_TEMP"].recorded == ("Hostname:DCGM_FI_DEV_GPU_TEMP:max",)
    owner = next(g for g in check.catalog.groups if g.aggregate_of("DCGM_FI_DEV_GPU_TEMP"))
    # The keep filter ships the recorded series, not the raw metric; the golden queries read what is shipped.
    assert owner.claims("Hostname:DCGM_FI_DEV_GPU_TEMP:max") and not owner.claims("DCGM_FI_DEV_GPU_TEMP")
    assert owner.reads("DCGM_FI_DEV_GPU_TEMP")


def test_one_dashboard_reading_the_metric_per_gpu_blocks_it_and_the_plan_names_that_read() -> None:
    per_gpu = ("gpu-detail.json", "GPU utilisation per GPU", 'DCGM_FI_DEV_GPU_UTIL{Hostname=~"n1"}')
    plan, _ = _plan([per_gpu])
    aggs = {a["metric"]: a for a in plan["aggregations"]}
    util = aggs["DCGM_FI_DEV_GPU_UTIL"]
    assert not util["recommended"] and util["rules"] == []
    assert util["blocked_by"][0]["reader"] == "dashboard: gpu-detail.json / GPU utilisation per GPU"
    assert "no aggregation" in util["blocked_by"][0]["why"]
    assert aggs["DCGM_FI_DEV_GPU_TEMP"]["recommended"]  # the other metrics' reads still allow theirs
    md = plan_markdown(plan)
    assert "Not aggregated" in md and "gpu-detail.json / GPU utilisation per GPU" in md


def test_a_dashboard_variable_without_a_value_blocks_the_metric() -> None:
    plan, _ = _plan([("vars.json", "Picked GPUs", 'avg by (Hostname) (DCGM_FI_DEV_GPU_TEMP{Hostname=~"$node"})')])
    temp = next(a for a in plan["aggregations"] if a["metric"] == "DCGM_FI_DEV_GPU_TEMP")
    assert not temp["recommended"] and "$node" in temp["blocked_by"][0]["why"]


def test_a_selector_without_a_metric_name_blocks_what_it_may_read() -> None:
    u_plan, _ = _plan([("all.json", "Everything", '{__name__=~"DCGM_FI_DEV_GPU_T.*"}')])
    temp = next(a for a in u_plan["aggregations"] if a["metric"] == "DCGM_FI_DEV_GPU_TEMP")
    assert not temp["recommended"] and "without a metric name" in temp["blocked_by"][0]["why"]


# --------------------------------------------------------------------------- cost and usage


def test_ingestion_is_priced_tier_by_tier_and_the_free_tier_is_taken_off_once() -> None:
    assert ingest_usd(2e9, PRICES) == pytest.approx(180.0)  # 200 x 10M at $0.90
    assert ingest_usd(3e9, PRICES) == pytest.approx(180.0 + 35.0)  # the next billion at $0.35
    assert ingest_usd(1e9, PRICES, already=2e9) == pytest.approx(35.0)
    bill = monthly_bill(ingest_samples=40e6, storage_gb=10, query_samples=200e9, prices=PRICES)
    assert bill["total_usd"] == 0  # exactly the free tier
    paid = monthly_bill(ingest_samples=1e9, storage_gb=20, query_samples=300e9, prices=PRICES, collectors=2)
    assert paid["ingest_usd"] == pytest.approx((1e9 - 40e6) / 1e7 * 0.90)
    assert paid["storage_usd"] == pytest.approx(10 * 0.03) and paid["query_usd"] == pytest.approx(100 * 0.10)
    assert paid["collector_usd"] == pytest.approx(2 * 730 * 0.04 + 1e9 / 1e7 * 0.10)


def test_a_bad_tier_table_is_refused_with_every_problem() -> None:
    base = yaml.safe_load((REPO / "catalog" / "amp_prices.yaml").read_text())
    with pytest.raises(CostConfigError) as err:
        AmpPrices.from_mapping({**base, "ingest_tiers": [{"up_to": 5, "per_10m_samples": 1},
                                                         {"up_to": 2, "per_10m_samples": 0.5}],
                                "free_tier": {"ingest_samples": -1}})
    text = str(err.value)
    assert "must grow" in text and "the last tier has no up_to" in text and "free_tier.ingest_samples" in text


def test_rotated_query_logs_are_read_as_one_period(tmp_path: Path) -> None:
    def line(q: str, ts: str) -> str:
        return json.dumps({"params": {"end": ts, "query": q, "start": ts, "step": 0}, "ts": ts}) + "\n"

    (tmp_path / "query.log").write_text(line("max(a)", "2026-12-05T01:00:00.000Z"))
    (tmp_path / "query.log.1").write_text(line("max(a)", "2026-11-20T01:00:00.000Z"))
    notes = ReadNotes()
    paths = query_log_paths([str(tmp_path / "query.log*"), str(tmp_path / "query.log"),
                             str(tmp_path / "none*")], notes)
    assert paths == [str(tmp_path / "query.log"), str(tmp_path / "query.log.1")]
    assert notes.missing == [f"query log {tmp_path / 'none*'}: no file matches"]
    u = UsageCollector()
    for p in paths:
        read_query_log(p, u, notes, since=1764547200.0)  # 2025-12-01: a month back from the newest line
    assert u.reads[("max(a)", Reader("query_log", "ad-hoc and dashboard API queries"))].count == 2


# --------------------------------------------------------------------------- whole reads rewritten


def test_a_whole_read_is_rewritten_byte_for_byte_around_its_aggregations() -> None:
    from promshift.core.aggregation import rewrite_expression
    from promshift.core.promql import PromQLError

    a = _decide("T", ["max by (Hostname) (T) > 85", "max(T)"])
    assert rewrite_expression("max by (Hostname) (T) > 85", a, LABELS) == "max by (Hostname) (Hostname:T:max) > 85"
    text = 'topk(1, MAX by(Hostname)(T{Hostname=~"n.*"}))  # hottest node\n  / 2'
    assert rewrite_expression(text, a, LABELS) == (
        'topk(1, max by (Hostname) (Hostname:T:max{Hostname=~"n.*"}))  # hottest node\n  / 2')
    for unserved in ("max(T) without ()", "min(T)", 'max(T{gpu="1"})', "T > 85"):
        with pytest.raises(PromQLError):
            rewrite_expression(unserved, a, LABELS)


def test_a_group_counts_what_it_will_ship_before_its_recording_rules_exist() -> None:
    from promshift.core.catalog import Aggregate, MetricGroup

    plain = MetricGroup(name="g", metrics=("A", "B"))
    assert plain.shipped_series_query() == f"count({plain.selector()})"
    group = MetricGroup(name="g", metrics=("A", "B", "C"), metric_regex="D_.*",
                        aggregations=(Aggregate("A", ("job", "Hostname"), ("sum", "count")),
                                      Aggregate("C", (), ("max",))))
    assert group.shipped_series_query() == (
        '(count({__name__=~"B|D_.*"}) or vector(0)) + (count(count by (Hostname, job) (A)) * 2 or vector(0)) + '
        "(count(count (C)) * 1 or vector(0))")
    from promshift.core.promql import parse

    parse(group.shipped_series_query())  # Prometheus' parser takes it
    assert group.name_regex() == r"B|Hostname_job\:A\:sum|Hostname_job\:A\:count|\:C\:max|D_.*"
    assert group.claims(":C:max") and not group.claims("A") and group.reads("A") and group.reads("D_x")
