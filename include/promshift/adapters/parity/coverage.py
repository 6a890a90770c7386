"""Layer 1, coverage: series counts per metric and per host at the window's start, middle and end."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import re2

from promshift.adapters.parity.common import ParityLayer, on_both, refused_for_size, with_sizing
from promshift.adapters.parity.sized import Partition, RefusedForSize
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.parity import count_hosts, coverage_measurement, credit_edges
from promshift.core.promql import promql_string
from promshift.core.verdicts import Measurement, Verdict


def _rows_at(answer: Any, first: float, step: float, k: int) -> dict[tuple[tuple[str, str], ...], float]:
    """A ``count by`` range answer's rows at its ``k``-th instant, keyed by their sorted labels."""
    return {tuple(sorted(series.labels.items())): v for series in answer.series for ts, v in series.points
            if round((ts - first) / step) == k}


class CoverageLayer(ParityLayer):
    """``coverage`` and ``host_coverage``; records what it saw of the hosts in the context."""

    def measure(self, start: float, end: float) -> list[Measurement]:
        """Series counts per metric and per host at the window's start, middle and end.

        One ``count by (__name__, host)`` per side, evaluated at the three instants by one range
        query, serves both measurements: each query touches every series of the group, so
        asking twice costs twice.
        """
        hosts = self.ctx.host_labels
        expr = f"count by (__name__, {', '.join(hosts.names)}) ({self.group.selector()})"
        instants = sorted({start, (start + end) / 2, end})
        per_metric, per_host = [], []
        # Per side: undeclared name of the host label -> hosts found only under it, at any instant.
        under: tuple[dict[str, set[str]], dict[str, set[str]]] = ({}, {})
        in_use: tuple[set[str], set[str]] = (set(), set())
        # Per side: every name of the host label -> the hosts sending it (a host mid-rename is under both).
        per_name: tuple[dict[str, set[str]], dict[str, set[str]]] = ({}, {})
        # One range query per side evaluates every instant: each series is read once, not once per
        # instant (at 2,000 nodes x 4 metrics: 4.9-6.1 s of server time against 12.7-13.4 s for three instant queries).
        step = (instants[-1] - instants[0]) / (len(instants) - 1) if len(instants) > 1 else 1.0
        sized = self.ctx.sizer()
        selector = self.group.selector()

        def ask(client: PrometheusClient) -> SimpleNamespace:
            # Too large for one query: one instant at a time, then the group's metrics in shards.
            series, _warnings = sized.range_query(
                client, expr, start=instants[0], end=instants[-1], step=step, series=self.ctx.series_of(),
                build=lambda _d, x: f"count by (__name__, {', '.join(hosts.names)}) ({selector[:-1]}{x}}})",
                partition=self._by_metric(start, end))
            return SimpleNamespace(series=series)

        queries = [expr]
        credited = 0
        try:
            ranged = on_both(self.source, self.target, ask)
            edges = self.ctx.edges(start, end)
            wide = None
            if edges:
                # independent_scraper: also the series with a sample within the edge allowance of each instant
                # (``last_over_time`` keeps the metric name), so an outage's edge seen apart is not a missing host.
                reach = edges["edge_s"]
                wide_expr = (f"count by (__name__, {', '.join(hosts.names)}) (last_over_time({self.group.selector()}"
                             f"[{math.ceil((self.ctx.scrape_interval or self.policy.step_s) + 2 * reach)}s]))")
                queries.append(f"{wide_expr} at each instant + {reach:g}s")
                wide = on_both(self.source, self.target, lambda c: SimpleNamespace(series=sized.range_query(
                    c, wide_expr, start=instants[0] + reach, end=instants[-1] + reach, step=step,
                    series=self.ctx.series_of())[0]))
            for k, t in enumerate(instants):
                metric_sides: list[dict[str, float]] = [{}, {}]
                host_sides: list[dict[str, float]] = [{}, {}]
                at_k = [_rows_at(answer, instants[0], step, k) for answer in ranged]
                if wide is not None:
                    src_rows, tgt_rows, gained = credit_edges((at_k[0], at_k[1]),
                                                              (_rows_at(wide[0], instants[0] + reach, step, k),
                                                               _rows_at(wide[1], instants[0] + reach, step, k)))
                    at_k, credited = [src_rows, tgt_rows], credited + gained
                for i in range(2):
                    rows = [(dict(key), v) for key, v in at_k[i].items() if v]
                    for labels, n in rows:
                        name = labels.get("__name__", "")
                        metric_sides[i][name] = metric_sides[i].get(name, 0.0) + n
                    host_sides[i], variants = count_hosts(rows, hosts)
                    in_use[i].update(n for n in hosts.declared if any(labels.get(n) for labels, _ in rows))
                    for labels, _ in rows:
                        for n in hosts.names:
                            if labels.get(n):
                                per_name[i].setdefault(n, set()).add(labels[n])
                    for variant, found in variants.items():
                        under[i].setdefault(variant, set()).update(found)
                per_metric.append((t, metric_sides[0], metric_sides[1]))
                per_host.append((t, host_sides[0], host_sides[1]))
        except RefusedForSize as exc:
            return [refused_for_size(name, exc, queries) for name in ("coverage", "host_coverage")]
        except PrometheusError as exc:
            return [Measurement(name, Verdict.ERROR, str(exc), tuple(queries))
                    for name in ("coverage", "host_coverage")]
        self.ctx.series_per_metric = {name: max(max(sides[1].get(name, 0.0), sides[2].get(name, 0.0))
                                                for sides in per_metric)
                                      for name in {n for _, a, b in per_metric for n in (*a, *b)}}
        # The source's hosts at the window's end are also the population the sample is drawn from.
        self.ctx.hosts_at_end = [h for h in per_host[-1][1] if h]
        self.ctx.host_names_in_use = ([n for n in hosts.declared if n in in_use[0]] or [hosts.name],
                                   [n for n in hosts.declared if n in in_use[1]] or [hosts.name])
        self.ctx.undeclared = under
        self.ctx.hosts_per_name = {side: {n: len(found) for n, found in names.items()}
                                for side, names in zip(("source", "target"), per_name, strict=True)}
        limit = self.policy.max_missing_series_ratio
        host = coverage_measurement(per_host, max_missing_ratio=limit, queries=queries, name="host_coverage",
                                    key="host", key_label=hosts.name, under_variants=under)
        both = [with_sizing(coverage_measurement(per_metric, max_missing_ratio=limit, queries=queries,
                                                 name="coverage", key="metric"), sized),
                self.ctx.with_hosts_per_name(host)]
        if wide is not None:
            for m in both:
                m.numbers["edge_credited_series"] = credited
        return both

    def _by_metric(self, start: float, end: float) -> Partition:
        """Shards of the group's series by metric name (the source's names in the window; any other in one more)."""
        def shards(n: int) -> list[str] | None:
            names = sorted(self.ctx.metric_names(start, end))
            if n < 2 or not names:
                return None
            groups = [names[i::n] for i in range(n)]
            out = [f", __name__=~{promql_string('|'.join(re2.escape(m) for m in g))}" for g in groups if g]
            return [*out, f", __name__!~{promql_string('|'.join(re2.escape(m) for m in names))}"]

        return shards
