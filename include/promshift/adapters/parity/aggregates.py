"""Layer 1b, aggregates: per-host window aggregates of every host, computed in PromQL (finds a drifted host
the sample missed)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from promshift.adapters.parity.common import ParityLayer, on_both
from promshift.adapters.prometheus import PrometheusError
from promshift.core.parity import aggregate_measurement, count_hosts, independent_aggregate_measurement
from promshift.core.promql import promql_string
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
        try:
            for metric in self.ctx.metric_names(start, end):
                fn = "sum_over_time"
                sel = f"{{__name__={promql_string(metric)}}}"
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
                queries.append(expr)
                answers = on_both(self.source, self.target, lambda c, e=expr: c.query(e, at=end))
                # A host under an undeclared name is left out: host_coverage names it as renamed.
                sides = [count_hosts(((s.labels, s.points[0][1]) for s in a.series), hosts)[0] for a in answers]
                rows.append((f"{fn} {metric}", sides[0], sides[1]))
                if noise_expr is not None:
                    queries.append(noise_expr)
                    own = count_hosts(((s.labels, s.points[0][1]) for s in self.source.query(noise_expr, at=end)
                                       .series), hosts)[0]
                    model_var[f"{fn} {metric}"] = {h: 2 * v for h, v in own.items() if math.isfinite(v)}
                if fn == "rate":
                    count_expr = f"avg by ({by}) (count_over_time({sel}[{span}]))"
                    queries.append(count_expr)
                    counts = count_hosts(((s.labels, s.points[0][1]) for s in self.source.query(count_expr, at=end)
                                          .series), hosts)[0]
                    edge_share[f"{fn} {metric}"] = {h: 2 / c for h, c in counts.items() if c > 1}
        except PrometheusError as exc:
            return Measurement("aggregates", Verdict.ERROR, str(exc), tuple(queries))
        if independent:
            return independent_aggregate_measurement(rows, model_var=model_var, edge_share=edge_share,
                                                     abs_tol=self.policy.abs_tolerance,
                                                     rel_tol=self.policy.rel_tolerance, queries=queries,
                                                     explained=explained)
        # Sums over thousands of series may add in a different order on each side: allow float noise.
        return aggregate_measurement(rows, abs_tol=self.policy.abs_tolerance,
                                     rel_tol=max(self.policy.rel_tolerance, 1e-9), queries=queries,
                                     explained=explained)
