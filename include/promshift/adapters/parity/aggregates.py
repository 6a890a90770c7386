"""Layer 1b, aggregates: per-host window aggregates of every host, computed in PromQL (finds a drifted host
the sample missed)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from promshift.adapters.parity.common import ParityLayer, on_both, on_each, refused_for_size, with_sizing
from promshift.adapters.parity.sized import Partition, RefusedForSize, SizedQueries
from promshift.adapters.parity.sized import labels_key as _key
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.parity import aggregate_measurement, count_hosts, independent_aggregate_measurement
from promshift.core.promql import promql_string
from promshift.core.query_limits import combine_avg
from promshift.core.verdicts import Measurement, Verdict


class AggregatesLayer(ParityLayer):
    """``aggregates``: one number per metric and host over the whole window, on both sides."""

    def measure(self, start: float, end: float, *, explained: Sequence[str] = ()) -> Measurement:
        """Per host over the whole window, per metric, computed in PromQL.

        ``dual_write``: ``sum_over_time`` — the same samples on both sides, so a value drift and a
        gap both change the sum. ``independent_scraper``: each side scraped on its own clock, so
        the sample counts differ; gauges compare as ``avg_over_time`` and counters as ``rate``
        over the window (reset-aware), within the tolerance. One query per metric and side
        (range functions drop the metric name, so metrics cannot share a query).
        """
        hosts = self.ctx.host_labels
        span = f"{max(1, int(end - start))}s"
        by = ", ".join(hosts.names)
        independent = self.policy.mode != "dual_write"
        rows = []
        queries = []
        # independent_scraper: per metric and host, the variance of the window aggregate each side's own samples
        # give it (the source's, counted for both sides): the noise model's floor of expected difference.
        model_var: dict[str, dict[str, float]] = {}
        edge_share: dict[str, dict[str, float]] = {}
        reads: dict[str, dict[str, float]] = {}
        sized = self.ctx.sizer()
        seconds = max(1, int(end - start))
        per_series = self.ctx.samples_per_series(seconds)
        partition = self.ctx.host_partition()
        try:
            for metric in self.ctx.metric_names(start, end):
                fn = "sum_over_time"
                name = promql_string(metric)
                sel = f"{{__name__={name}}}"
                noise_expr = None
                if independent:
                    step = max(1, int(self.policy.step_s))
                    if self.ctx.metric_kinds(start, end)[metric]["kind"] == "counter":
                        fn = "rate"
                        # The window's rate moves with what each scraper's first and last samples hold: each
                        # end is off by about one scrape's increment (its spread: idelta's), over the window.
                        # A host's GPUs are read in one scrape, so their errors add up, not in quadrature.
                        noise_expr = (f"(sum by ({by}) (stddev_over_time(idelta({sel}[{2 * step}s])[{span}:{step}s]))"
                                      f" / {max(1, int(end - start))}) ^ 2")
                    else:
                        fn = "avg_over_time"
                        noise_expr = (f"sum by ({by}) (stddev_over_time({sel}[{span}]) ^ 2 "
                                      f"/ count_over_time({sel}[{span}]))")
                expr = f"sum by ({by}) ({fn}({sel}[{span}]))"
                series = self.ctx.series_of(metric)
                if fn == "sum_over_time":
                    # A sum over the window is the sum of sums over disjoint parts of it, and of shards of hosts.
                    def ask(c: PrometheusClient, log: list[str] | None = None, name: str = name,
                            series: int | None = series) -> list[tuple[dict[str, str], float]]:
                        return sized.window(c, self._sum_over_time(by, name),
                                            end=end, span_s=seconds, op="sum", series=series,
                                            samples_per_series=per_series, partition=partition, queries=log)

                    answers = on_each(lambda a=ask: a(self.source, queries), lambda a=ask: a(self.target))
                elif fn == "avg_over_time" and sized.needs_split(series, per_series, seconds):
                    queries.append(expr)
                    answers = on_both(self.source, self.target,
                                      lambda c, n=name, s=series: self._split_avg(c, sized, n, by, end=end,
                                                                                 seconds=seconds, series=s,
                                                                                 per_series=per_series,
                                                                                 partition=partition))
                else:
                    queries.append(expr)
                    answers = on_both(self.source, self.target, lambda c, e=expr: [
                        (s.labels, s.points[0][1]) for s in sized.whole(c, e, at=end)])
                # A host under an undeclared name is left out: host_coverage names it as renamed.
                sides = [count_hosts(a, hosts)[0] for a in answers]
                rows.append((f"{fn} {metric}", sides[0], sides[1]))
                if noise_expr is not None:
                    queries.append(noise_expr)
                    own = count_hosts(((s.labels, s.points[0][1]) for s in sized.whole(self.source, noise_expr,
                                                                                        at=end)), hosts)[0]
                    model_var[f"{fn} {metric}"] = {h: 2 * v for h, v in own.items() if math.isfinite(v)}
                if independent:
                    count_expr = f"avg by ({by}) (count_over_time({sel}[{span}]))"
                    queries.append(count_expr)
                    counts = count_hosts(((s.labels, s.points[0][1]) for s in sized.whole(self.source, count_expr,
                                                                                           at=end)), hosts)[0]
                    reads[f"{fn} {metric}"] = counts
                    if fn == "rate":
                        edge_share[f"{fn} {metric}"] = {h: 2 / c for h, c in counts.items() if c > 1}
        except RefusedForSize as exc:
            return refused_for_size("aggregates", exc, queries)
        except PrometheusError as exc:
            return Measurement("aggregates", Verdict.ERROR, str(exc), tuple(queries))
        if independent:
            return with_sizing(independent_aggregate_measurement(
                rows, model_var=model_var, edge_share=edge_share, reads=reads, abs_tol=self.policy.abs_tolerance,
                rel_tol=self.policy.rel_tolerance, queries=queries, explained=explained), sized)
        # Sums over thousands of series may add in a different order on each side: allow float noise.
        return with_sizing(aggregate_measurement(rows, abs_tol=self.policy.abs_tolerance,
                                                 rel_tol=max(self.policy.rel_tolerance, 1e-9), queries=queries,
                                                 explained=explained), sized)

    @staticmethod
    def _sum_over_time(by: str, name: str) -> Callable[[str, str], str]:
        """One part's per-host sum: ``(range, extra matchers) -> PromQL``."""
        return lambda d, x: f"sum by ({by}) (sum_over_time({{__name__={name}{x}}}[{d}]))"

    @staticmethod
    def _split_avg(client: PrometheusClient, sized: SizedQueries, name: str, by: str, *, end: float, seconds: int,
                   series: int | None, per_series: int, partition: Partition | None
                   ) -> list[tuple[dict[str, str], float]]:
        """Each series' average over the window as its sum and count over parts of it (exact), per series."""
        sums, counts = ({_key(labels): v for labels, v in sized.window(
            client, lambda d, x, fn=fn: f"{fn}({{__name__={name}{x}}}[{d}])", end=end, span_s=seconds, op="sum",
            series=series, samples_per_series=per_series, partition=partition)}
            for fn in ("sum_over_time", "count_over_time"))
        return [(dict(k), v) for k, v in combine_avg(sums, counts).items()]
