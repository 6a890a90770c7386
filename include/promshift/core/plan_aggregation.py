"""The plan's aggregation pass: per read metric a recording-rule recommendation or the reads that block it, priced.

Runs after :func:`promshift.core.plan.recommend` on the same inventory and usage (``core/aggregation.py`` says
what a read allows). Per recommended metric: series and samples per second before (every raw series) and after
(the recorded series: one per level value and recorded operation, evaluated at the metric's scrape interval),
and the monthly AMP cost of each. Per group: the metrics it records and the group's cost with them. For the
workspace: the month's bill moving every metric of the groups, moving what was read, and moving it aggregated,
each with AMP's ingestion tiers, the free tier (once, for the whole workspace) and the managed collector's fee.

Pure, like ``core/plan.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from promshift.core.aggregation import Aggregation, Blocker, ShapeIndex, decide
from promshift.core.cost import BYTES_PER_GB, MONTH_S, AmpPrices, monthly_bill
from promshift.core.plan import MetricStats, Plan, UsageCollector, _cost, _nameless_matches

__all__ = ["aggregate_plan", "shape_index"]


def shape_index(usage: UsageCollector) -> ShapeIndex:
    """Every read's shapes (one parse per distinct expression), with the dashboard variables that had no value."""
    index = ShapeIndex()
    by_expr: dict[str, dict[frozenset[str], list[str]]] = {}
    for expr, reader in usage.reads:
        unknown = usage.unknown_variables.get((expr, reader), frozenset())
        by_expr.setdefault(expr, {}).setdefault(unknown, []).append(reader.text())
    for expr, groups in by_expr.items():
        for unknown, readers in groups.items():
            index.add(expr, readers, unknown=unknown)
    return index


def _volume(series: float, samples_per_s: float, retention_days: float, prices: AmpPrices) -> tuple[float, float]:
    """(samples ingested per month, GB stored at retention) for this many samples per second."""
    return samples_per_s * MONTH_S, samples_per_s * retention_days * 86_400.0 * prices.bytes_per_sample / BYTES_PER_GB


def aggregate_plan(plan: Plan, metrics: Mapping[str, MetricStats], usage: UsageCollector, *, prices: AmpPrices,
                   retention_days: float, index: ShapeIndex | None = None, collectors: int = 0) -> Plan:
    """``plan`` with its aggregations, each group's aggregated cost and the workspace's bill."""
    index = shape_index(usage) if index is None else index
    entries: list[dict[str, Any]] = []
    per_group: dict[str, dict[str, Any]] = {}
    totals = {"all": [0.0, 0.0], "read": [0.0, 0.0], "aggregated": [0.0, 0.0]}  # [series, samples/s]
    query_samples = 0.0
    for g in plan.groups:
        qs = g.cost_after["query_samples_per_month"]
        query_samples += qs
        recorded: list[str] = []
        series = rate = 0.0
        totals["all"][0] += g.series_all
        totals["read"][0] += g.series
        for name in g.metrics:
            m = metrics[name]
            entry = _one(m, index, prices, retention_days)
            entry["group"] = g.name
            entries.append(entry)
            if entry["recommended"]:
                recorded.append(name)
                series += entry["series_after"]
                rate += entry["samples_per_s_after"]
            else:
                series += m.series
                rate += m.samples_per_s
        totals["all"][1] += sum(metrics[n].samples_per_s for n in (*g.metrics, *g.left_behind) if n in metrics)
        totals["read"][1] += g.samples_per_s
        totals["aggregated"][0] += series
        totals["aggregated"][1] += rate
        per_group[g.name] = {"aggregations": recorded,
                             "cost_aggregated": _cost(int(series), rate, qs, prices, retention_days)}
    bill: dict[str, Any] = {}
    for key, (series, rate) in totals.items():
        ingest, stored = _volume(series, rate, retention_days, prices)
        bill[key] = {"series": int(series), "samples_per_s": round(rate, 3),
                     **monthly_bill(ingest_samples=ingest, storage_gb=stored, query_samples=query_samples,
                                    prices=prices, collectors=collectors)}
    # What one managed collector would add, for a reader who scrapes with AMP's collector instead of a Prometheus.
    ingest, _ = _volume(*totals["aggregated"], retention_days, prices)
    one = monthly_bill(ingest_samples=ingest, storage_gb=0.0, query_samples=0.0, prices=prices, collectors=1,
                       free_tier=False)["collector_usd"]
    bill["one_managed_collector_usd"] = one
    bill["saved_by_aggregation_usd"] = round(bill["read"]["total_usd"] - bill["aggregated"]["total_usd"], 4)
    entries.sort(key=lambda e: (not e["recommended"], -e.get("saved_usd", 0.0), e["metric"]))
    return dataclasses.replace(plan, aggregations=tuple(entries), group_aggregations=per_group, bill=bill,
                               prices_date=prices.prices_date)


def _one(m: MetricStats, index: ShapeIndex, prices: AmpPrices, retention_days: float) -> dict[str, Any]:
    shapes = index.by_metric.get(m.name, [])
    nameless = [Blocker(reader, s.expr, "a selector without a metric name may read its raw series")
                for reader, s in index.nameless if s.selector is not None and _nameless_matches(s.selector, m)]
    agg = decide(m.name, shapes, m.labels, type_=m.type, extra_blockers=nameless)
    entry: dict[str, Any] = {**agg.to_dict(), "type": m.type, "series_before": m.series,
                             "samples_per_s_before": round(m.samples_per_s, 6)}
    if not agg.recommended:
        if not agg.blockers:
            entry["blocked_by"] = [{"reader": "-", "expr": "", "why": "no read of it could be analysed"}]
        return entry
    if m.level != agg.level:
        return _not(entry, agg, "the recorded level's series were not counted in the inventory")
    recorded = m.level_series * len(agg.rules)
    if recorded >= m.series:
        return _not(entry, agg, f"no saving: {recorded:,} recorded series for {m.series:,} raw ones (the level "
                                "keeps them apart)")
    interval = m.series / m.samples_per_s if m.samples_per_s > 0 else 30.0
    rate = recorded / interval
    before = _cost(m.series, m.samples_per_s, 0.0, prices, retention_days)
    after = _cost(recorded, rate, 0.0, prices, retention_days)
    entry.update(series_after=recorded, samples_per_s_after=round(rate, 6), evaluation_interval_s=interval,
                 cost_before_usd=before["total_usd"], cost_after_usd=after["total_usd"],
                 saved_usd=round(before["total_usd"] - after["total_usd"], 4))
    return entry


def _not(entry: dict[str, Any], agg: Aggregation, why: str) -> dict[str, Any]:
    entry.update(recommended=False, rules=[], rewrites=[], reads=[],
                 blocked_by=[{"reader": "-", "expr": "", "why": why}], level=list(agg.level))
    return entry
