"""Layer 3, samples: every series of a deterministic host sample, point by point (shardable: each shard
compares some hosts and returns totals a reducer merges). Memory stays bounded: one shard's series at a time."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import re2

from promshift.adapters.parity.common import ParityLayer, on_each
from promshift.adapters.parity.sized import RefusedForSize, SizedQueries
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.parity import SampleComparison, count_hosts, normalize_labels, sample_hosts, without_dropped
from promshift.core.promql import promql_string
from promshift.core.verdicts import Measurement, Verdict

log = logging.getLogger(__name__)


class SamplesLayer(ParityLayer):
    """``samples``: the host sample, its comparison per shard, and the merge of the shards."""

    def plan_hosts(self, start: float, end: float) -> list[str]:
        """The deterministic host sample for this group and window (seeded by both)."""
        hosts = self.ctx.hosts_at_end
        if hosts is None:
            names = self.ctx.host_labels
            expr = f"count by ({', '.join(names.declared)}) ({self.group.selector()})"
            rows = ((s.labels, s.points[0][1]) for s in self.source.query(expr, at=end).series)
            hosts = list(count_hosts(rows, names)[0])
        seed = self.policy.seed or f"{self.group.name}:{start:.0f}:{end:.0f}"
        return sample_hosts((h for h in hosts if h), self.policy.sample_hosts, seed)

    def compare_hosts(self, hosts: Sequence[str], start: float, end: float,
                      host_names: Sequence[Sequence[str]] | None = None) -> dict[str, Any]:
        """Compare every series of ``hosts`` point by point; returns mergeable totals.

        ``host_names`` (source, target): the declared names of the host label each side's series
        use (the plan's coverage saw them); default every declared name on both sides.
        Consecutive query errors up to the policy's limit skip a host (named in the result);
        beyond it the shard reports an error.
        """
        step = self.policy.step_s
        if host_names is None:
            host_names = (self.ctx.host_labels.declared, self.ctx.host_labels.declared)
        comparison = SampleComparison(abs_tol=self.policy.abs_tolerance, rel_tol=self.policy.rel_tolerance,
                                      noise_k=self.ctx.noise_k, host_labels=self.ctx.host_labels.declared,
                                      **self.ctx.edges(start, end))
        rename = dict(self.policy.rename_labels)
        errors: list[str] = []
        consecutive = 0
        # One range query per side for the whole shard (memory stays bounded by the shard size);
        # if it fails, each host is tried on its own so one bad host does not sink the shard.
        hosts_left = list(hosts)
        sized = self.ctx.sizer()
        refused: str | None = None
        if len(hosts_left) > 1:
            try:
                self._compare_batch(hosts_left, start, end, step, rename, host_names, comparison, sized)
                hosts_left = []
            except PrometheusError as exc:
                errors.append(f"shard {list(hosts)}: {exc}")
            except RefusedForSize as exc:
                refused, hosts_left = str(exc), []
        for host in hosts_left:
            try:
                self._compare_batch([host], start, end, step, rename, host_names, comparison, sized)
            except RefusedForSize as exc:
                refused = str(exc)
                break
            except PrometheusError as exc:
                consecutive += 1
                errors.append(f"{host}: {exc}")
                if consecutive >= self.policy.consecutive_error_limit:
                    break
                continue
            consecutive = 0
        log.info("parity %s: hosts %s compared (%s series, %s points)", self.group.name, list(hosts),
                 comparison.series_compared, comparison.points_compared)
        out = {**comparison.to_dict(), "hosts": list(hosts), "errors": errors,
               "error_limit_hit": consecutive >= self.policy.consecutive_error_limit > 0}
        if self.policy.mode != "dual_write" and self.ctx.kinds is not None:
            out["metric_kinds"] = dict(self.ctx.kinds)
        if sized.evidence():
            out["query_sizing"] = sized.evidence()
        if refused is not None:
            out["refused_for_size"] = refused
        return out

    def _compare_batch(self, hosts: list[str], start: float, end: float, step: float, rename: dict[str, str],
                       host_names: Sequence[Sequence[str]], comparison: SampleComparison,
                       sized: SizedQueries | None = None) -> None:
        # Each side gets its own queries (its own names of the host label), normalized as they arrive.
        queries = [self.host_queries(hosts, start, end, names) for names in host_names]

        sized = sized or self.ctx.sizer()
        # The shard's share of the group's series (coverage saw both), for sizing the range queries.
        per_host = self.ctx.series_per_host()
        estimate = None if per_host is None else int(per_host * len(hosts)) + 1

        def fetch(client: PrometheusClient, exprs: list[str]) -> dict[Any, Any]:
            side: dict[Any, Any] = {}
            # independent_scraper: read past the window by the edge allowance, so a gap just outside it is seen.
            low, high = comparison.grid[:2] if comparison.grid else (start, end)
            for expr in exprs:
                answer, _warnings = sized.range_query(client, expr, start=low, end=high, step=step,
                                                      series=estimate)
                side.update({normalize_labels(s.labels, ignore=self.policy.ignore_labels, rename=rename): s.points
                             for s in answer})
            return side

        source, target = on_each(lambda: fetch(self.source, queries[0]), lambda: fetch(self.target, queries[1]))
        # Declared drops: the target holds the source's series without those labels (summed where two would merge).
        comparison.add(without_dropped(source, self.group.drop_labels), target)

    def host_queries(self, hosts: str | Sequence[str], start: float, end: float,
                     host_names: Sequence[str] | None = None) -> list[str]:
        """What to compare for one host, by parity mode.

        ``dual_write``: the raw series — the same Prometheus wrote both sides, so every
        sample must match. ``independent_scraper``: a managed collector scraped separately,
        so timestamps differ; compare per step bucket instead — gauges as
        ``avg_over_time`` over the step, counters as ``rate`` over two steps (reset-aware) —
        within the catalog's tolerance.

        One set of queries per name of the host label in ``host_names`` (default: the host label and
        its declared aliases), each a plain selector: a side with part of its fleet under a declared
        ``hostname`` gets a second query, not an ``or`` — binary operators leave Prometheus' raw-range
        fast path and cost ~10x the server time (measured at 200 nodes).
        """
        if isinstance(hosts, str):
            hosts = [hosts]
        if len(hosts) == 1:
            value = f"={promql_string(hosts[0])}"
        else:
            value = f"=~{promql_string('|'.join(re2.escape(h) for h in hosts))}"
        on_host = [f"{label}{value}" for label in (host_names or self.ctx.host_labels.declared)]
        if self.policy.mode == "dual_write":
            name = f"__name__=~{promql_string(self.group.name_regex())}"
            return [f"{{{name}, {h}}}" for h in on_host]
        step = int(self.policy.step_s)
        out = []
        for metric in self.ctx.metric_names(start, end):
            for h in on_host:
                sel = f"{{__name__={promql_string(metric)}, {h}}}"
                if self.ctx.metric_kinds(start, end)[metric]["kind"] == "counter":
                    inner, tag = f"rate({sel}[{2 * step}s])", f"{metric}:rate{2 * step}s"
                else:
                    inner, tag = f"avg_over_time({sel}[{step}s])", f"{metric}:avg{step}s"
                # The functions drop the metric name; put a tagged one back so series stay distinct.
                out.append(f'label_replace({inner}, "__name__", {promql_string(tag)}, "", "")')
        return out

    def measurement(self, shards: Sequence[dict[str, Any]], hosts_total: int) -> Measurement:
        """Merge shard totals into the samples measurement."""
        comparison = SampleComparison(abs_tol=self.policy.abs_tolerance, rel_tol=self.policy.rel_tolerance,
                                      noise_k=self.ctx.noise_k, host_labels=self.ctx.host_labels.declared)
        errors: list[str] = []
        hosts: list[str] = []
        for shard in shards:
            comparison.merge(shard)
            errors.extend(shard.get("errors", []))
            hosts.extend(shard.get("hosts", []))
        refused = [str(s["refused_for_size"]) for s in shards if s.get("refused_for_size")]
        if refused:
            return Measurement("samples", Verdict.INCONCLUSIVE, "samples not compared: the workspace refuses their "
                               f"queries for size and no split fits ({refused[0]})", (), {"refused": refused})
        if any(s.get("error_limit_hit") for s in shards):
            return Measurement("samples", Verdict.ERROR,
                               f"{len(errors)} query errors, {self.policy.consecutive_error_limit} in a row: "
                               + "; ".join(errors[:3]), (), {"errors": errors})
        m = comparison.measurement([f"range query per sampled host ({len(hosts)} hosts)"])
        m.numbers.update({"hosts_sampled": sorted(hosts), "hosts_total": hosts_total, "errors": errors})
        sizing = [s["query_sizing"] for s in shards if s.get("query_sizing")]
        if sizing:
            m.numbers["query_sizing"] = {
                **{k: sum(int(z[k]) for z in sizing) for k in ("split_queries", "parts", "refused_for_size")},
                "limits": sizing[0]["limits"], "why": sorted({w for z in sizing for w in z["why"]})[:5]}
        kinds = next((s["metric_kinds"] for s in shards if s.get("metric_kinds")), None)
        if kinds:
            m.numbers["metric_kinds"] = kinds
        return m
