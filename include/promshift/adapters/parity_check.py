"""Parity evidence in layers, fetched from both backends; the maths lives in core.parity.

Layers (one class each, in ``adapters/parity/``): coverage (series counts per metric and per host at
several instants, computed in PromQL), per-host window aggregates of every host (sum over the window, in
PromQL: finds a drifted host the sample missed), golden dashboard queries, label parity (label names per
metric after normalization), and raw samples of a deterministic host sample (shardable: each shard compares
some hosts and returns totals a reducer merges). ``ParityCheck`` composes them over one shared context:
plan (window, the count/label/golden layers, the host shards), compare a shard, reduce.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from promshift.adapters.parity.aggregates import AggregatesLayer
from promshift.adapters.parity.common import (
    ParityContext,
    count_behind,
    each_side,
    group_matcher,
    group_selectors_of,
    lookback_span,
    on_both,
    on_each,
    series_behind,
)
from promshift.adapters.parity.coverage import CoverageLayer
from promshift.adapters.parity.golden import GoldenLayer, golden_lookbacks
from promshift.adapters.parity.labels import LabelsLayer
from promshift.adapters.parity.samples import SamplesLayer
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.catalog import MetricGroup
from promshift.core.errors import ErrorKind
from promshift.core.parity import (
    GoldenInventory,
    HostLabels,
    ParityPlan,
    ParityResult,
    ParityWindow,
    assess,
    comparison_step,
    comparison_window,
    scrape_interval_of,
    settle_time,
)
from promshift.core.promql import promql_string
from promshift.core.query_budget import QueryBudgetExhausted
from promshift.core.query_limits import UNLIMITED, QueryLimits
from promshift.core.verdicts import Layer, Measurement, Verdict

log = logging.getLogger(__name__)

# Callers import these from here (the latency probe, the rules layer, the lab).
__all__ = ["ParityCheck", "ParityPlan", "ParityWindow", "count_behind", "each_side", "golden_lookbacks",
           "group_matcher", "group_selectors_of", "lookback_span", "on_both", "on_each", "promql_string",
           "series_behind"]


@dataclass
class ParityCheck:
    """Every parity layer for one group over one window: the layers, composed."""

    group: MetricGroup
    source: PrometheusClient
    target: PrometheusClient
    # Relative dashboard paths in the catalog resolve against the catalog's folder.
    catalog_dir: Path | None = None
    # The target's per-query limits (``core.query_limits``; a callable is asked once, by the plan, which carries
    # them to its shards: read once per run): every layer's queries are planned against them. None: none known
    # (a refusal for size is still split and asked again).
    limits: QueryLimits | Callable[[], QueryLimits] | None = None
    ctx: ParityContext = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.ctx = ParityContext(self.group, self.source, self.target, self.catalog_dir,
                                 limits=self.limits if isinstance(self.limits, QueryLimits) else UNLIMITED)

    # The layers, each over the shared context (what coverage saw, the others use).
    @property
    def coverage_layer(self) -> CoverageLayer:
        return CoverageLayer(self.ctx)

    @property
    def aggregates_layer(self) -> AggregatesLayer:
        return AggregatesLayer(self.ctx)

    @property
    def labels_layer(self) -> LabelsLayer:
        return LabelsLayer(self.ctx)

    @property
    def golden_layer(self) -> GoldenLayer:
        return GoldenLayer(self.ctx)

    @property
    def samples_layer(self) -> SamplesLayer:
        return SamplesLayer(self.ctx)

    @property
    def policy(self) -> Any:
        return self.group.parity

    @property
    def host_labels(self) -> HostLabels:
        return self.ctx.host_labels

    @property
    def noise_k(self) -> float:
        return self.ctx.noise_k

    @property
    def _kinds(self) -> dict[str, dict[str, str]] | None:
        return self.ctx.kinds

    @_kinds.setter
    def _kinds(self, kinds: dict[str, dict[str, str]] | None) -> None:
        self.ctx.kinds = kinds

    def window(self, *, dual_write_since: float, now: float,
               scrape_interval_s: float | None = None) -> tuple[float, float] | None:
        # Two steps, and at least one scrape interval and a step: the first instant reads a sample scraped after
        # dual-write began on both sides (``core.parity.settle_time``).
        return comparison_window(dual_write_since=dual_write_since, now=now, skip_recent_s=self.policy.skip_recent_s,
                                 step=self.policy.step_s, settle_s=settle_time(self.policy.step_s, scrape_interval_s))

    def source_scrape_interval(self, start: float, end: float) -> tuple[float, str]:
        """The source's configured scrape interval for the jobs of the group's series, and where it came from.

        Its loaded config (``/api/v1/status/config``) and the ``job`` values of the group's series; when the
        source answers but not with them (no status API, a config it will not show), the catalog's
        ``scrape_interval`` (said so). A source that does not answer at all raises: parity is an ERROR then."""
        try:
            jobs = self.source.label_values("job", self.group.selector(), start=start, end=end)
            return scrape_interval_of(self.source.config_text(), jobs)
        except PrometheusError as exc:
            if exc.kind in (ErrorKind.UNREACHABLE, ErrorKind.TIMEOUT):
                raise
            return self._catalog_interval(exc)
        except ValueError as exc:
            return self._catalog_interval(exc)

    def _catalog_interval(self, exc: Exception) -> tuple[float, str]:
        log.warning("parity %s: source config not read (%s); the catalog's scrape_interval", self.group.name, exc)
        return self.group.scrape_interval_s, (f"the catalog's scrape_interval {self.group.scrape_interval_s:g}s "
                                              f"(source config not read: {str(exc)[:160]})")

    def _use_step(self, step: float) -> None:
        if step != self.policy.step_s:
            self.group = dataclasses.replace(self.group, parity=dataclasses.replace(self.policy, step_s=step))
            self.ctx.group = self.group  # every layer reads the group (and its step) from the context

    def coverage(self, start: float, end: float) -> list[Measurement]:
        return self.coverage_layer.measure(start, end)

    def aggregates(self, start: float, end: float, *, explained: Sequence[str] = ()) -> Measurement:
        return self.aggregates_layer.measure(start, end, explained=explained)

    def golden(self, start: float, end: float) -> tuple[list[Measurement], GoldenInventory]:
        return self.golden_layer.measure(start, end)

    def labels(self, start: float, end: float) -> Measurement:
        return self.labels_layer.measure(start, end)

    def sample_plan(self, start: float, end: float) -> list[str]:
        return self.samples_layer.plan_hosts(start, end)

    def compare_hosts(self, hosts: Sequence[str], start: float, end: float,
                      host_names: Sequence[Sequence[str]] | None = None) -> dict[str, Any]:
        return self.samples_layer.compare_hosts(hosts, start, end, host_names)

    def host_queries(self, hosts: str | Sequence[str], start: float, end: float,
                     host_names: Sequence[str] | None = None) -> list[str]:
        return self.samples_layer.host_queries(hosts, start, end, host_names)

    def _metric_names(self, start: float, end: float) -> list[str]:
        return self.ctx.metric_names(start, end)

    def metric_kinds(self, start: float, end: float) -> dict[str, dict[str, str]]:
        return self.ctx.metric_kinds(start, end)

    def samples_measurement(self, shards: Sequence[dict[str, Any]], hosts_total: int) -> Measurement:
        return self.samples_layer.measurement(shards, hosts_total)

    # -- all layers ----------------------------------------------------------------------
    def plan(self, *, dual_write_since: float, now: float) -> ParityPlan:
        """Window, the count and label layers, and the host shards for the samples layer.

        A workspace query budget spent on the way (``QueryBudgetExhausted``) ends the plan INCONCLUSIVE with the
        budget named (no window: no layer is judged on half its queries)."""
        started = time.perf_counter()
        before = [c.ledger.snapshot() for c in (self.source, self.target)]
        if callable(self.limits):
            self.ctx.limits = self.limits()
            log.info("parity %s: target query limits %s", self.group.name, self.ctx.limits.to_dict())
        try:
            return self._plan(dual_write_since=dual_write_since, now=now, started=started, before=before)
        except QueryBudgetExhausted as exc:
            log.warning("parity: %s", exc)
            return ParityPlan(None, (Measurement("window", Verdict.INCONCLUSIVE, str(exc)),),
                              cost=self._cost(started, before))

    def _plan(self, *, dual_write_since: float, now: float, started: float, before: list[dict[str, float]]
              ) -> ParityPlan:
        try:
            interval, interval_from = self.source_scrape_interval(dual_write_since, now)
        except PrometheusError as exc:
            return ParityPlan(None, (Measurement("window", Verdict.ERROR, f"the source's scrape interval: {exc}"),),
                              cost=self._cost(started, before))
        self.ctx.scrape_interval = interval
        step, step_note = comparison_step(self.policy.step_s, interval)
        self._use_step(step)
        window = self.window(dual_write_since=dual_write_since, now=now, scrape_interval_s=interval)
        if window is None:
            m = Measurement("window", Verdict.INCONCLUSIVE,
                            f"dual-write too short: nothing older than {self.policy.skip_recent_s:.0f}s to compare")
            return ParityPlan(None, (m,), cost=self._cost(started, before))
        start, end = window
        coverage = self.coverage(start, end)
        short_hosts = next((m.numbers.get("short_keys", []) for m in coverage if m.layer == Layer.HOST_COVERAGE), [])
        measurements = list(coverage)
        measurements.append(self.aggregates(start, end, explained=short_hosts))
        measurements.append(self.labels(start, end))
        golden, golden_inventory = self.golden(start, end)
        measurements.extend(golden)
        shards: list[dict[str, Any]] = []
        hosts: list[str] = []
        try:
            hosts = self.sample_plan(start, end)
        except PrometheusError as exc:
            measurements.append(Measurement("samples", Verdict.ERROR, str(exc)))
        size = self.policy.hosts_per_shard
        names = self.ctx.host_names_in_use
        kinds = None
        if hosts and self.policy.mode != "dual_write":
            try:
                kinds = self.metric_kinds(start, end)
            except PrometheusError as exc:
                measurements.append(Measurement("samples", Verdict.ERROR, str(exc)))
                hosts = []
        for i in range(0, len(hosts), size):
            shard: dict[str, Any] = {"hosts": hosts[i:i + size], "start": start, "end": end, "step": step,
                                     "scrape_interval_s": interval}
            if names is not None:
                shard["host_names"] = [list(names[0]), list(names[1])]
            if kinds is not None:
                shard["metric_kinds"] = kinds
            if self.ctx.limits.limited:
                shard["limits"] = self.ctx.limits.to_dict()
                per_host = self.ctx.series_per_host()
                if per_host is not None:
                    shard["series_per_host"] = per_host
            shards.append(shard)
        return ParityPlan(ParityWindow(start, end, step, interval, interval_from, step_note), tuple(measurements),
                          tuple(shards),
                          len(hosts), self._cost(started, before), golden_inventory)

    def compare_shard(self, shard: dict[str, Any]) -> dict[str, Any]:
        """One mapped task's work: compare the shard's hosts; returns totals and what it cost."""
        started = time.perf_counter()
        before = [c.ledger.snapshot() for c in (self.source, self.target)]
        if shard.get("step"):
            self._use_step(float(shard["step"]))
        if shard.get("scrape_interval_s"):
            self.ctx.scrape_interval = float(shard["scrape_interval_s"])
        if shard.get("metric_kinds"):
            self.ctx.kinds = {name: dict(kind) for name, kind in shard["metric_kinds"].items()}
        if shard.get("limits"):
            self.ctx.limits = QueryLimits.from_dict(shard["limits"])
        if shard.get("series_per_host"):
            self.ctx.per_host = float(shard["series_per_host"])
        try:
            out = self.compare_hosts(shard["hosts"], shard["start"], shard["end"], shard.get("host_names"))
        except QueryBudgetExhausted as exc:
            log.warning("parity shard: %s", exc)
            out = {"budget_spent": str(exc)}  # ``reduce`` makes the samples layer INCONCLUSIVE with it
        out["cost"] = self._cost(started, before)
        return out

    def reduce(self, plan: ParityPlan | Mapping[str, Any], shards: Sequence[dict[str, Any]],
               extra: Sequence[Measurement] = ()) -> ParityResult:
        """Merge the plan's layers and every shard into the parity result (``plan``: typed, or its XCom form);
        ``extra``: layers measured elsewhere (the rules layer, when the group's rules move with it)."""
        if not isinstance(plan, ParityPlan):
            plan = ParityPlan.from_dict(plan)
        measurements = [*plan.measurements, *extra]
        spent = next((str(s["budget_spent"]) for s in shards if s.get("budget_spent")), None)
        if plan.window is not None and spent and not any(m.layer == Layer.SAMPLES for m in measurements):
            measurements.append(Measurement("samples", Verdict.INCONCLUSIVE, f"samples not compared: {spent}"))
        elif plan.window is not None and not any(m.layer == Layer.SAMPLES for m in measurements):
            measurements.append(self.samples_measurement(shards, hosts_total=plan.hosts_total))
        costs = [plan.cost, *(s.get("cost", {}) for s in shards)]
        return self.result(measurements, plan.window, costs, shards=len(shards), golden=plan.golden)

    def run(self, *, dual_write_since: float, now: float) -> ParityResult:
        """Every layer in one process; the DAG runs the same plan / shards / reduce as mapped tasks."""
        plan = self.plan(dual_write_since=dual_write_since, now=now)
        return self.reduce(plan, [self.compare_shard(dict(shard)) for shard in plan.shards])

    def _cost(self, started: float, before: list[dict[str, float]]) -> dict[str, float]:
        after = [c.ledger.snapshot() for c in (self.source, self.target)]
        return {"wall_s": time.perf_counter() - started,
                "backend_query_s": sum(a["server_s"] - b["server_s"] for a, b in zip(after, before, strict=True)),
                "queries": sum(a["queries"] - b["queries"] for a, b in zip(after, before, strict=True))}

    def result(self, measurements: list[Measurement], window: ParityWindow | None,
               costs: Sequence[Mapping[str, float]], *, shards: int,
               golden: GoldenInventory | None = None) -> ParityResult:
        samples = next((m for m in measurements if m.layer == Layer.SAMPLES), None)
        nums = samples.numbers if samples else {}
        verdict = assess(measurements, failure_limit=self.policy.failure_limit,
                         inconclusive_limit=self.policy.inconclusive_limit)
        return ParityResult(
            verdict=verdict, measurements=tuple(measurements), window=window,
            hosts_sampled=tuple(nums.get("hosts_sampled", ())),
            **{k: int(nums.get(k, 0)) for k in ("series_compared", "points_compared", "mismatches", "missing_series",
                                                 "missing_points", "extra_series")},
            shards=shards,
            wall_s=sum(c.get("wall_s", 0.0) for c in costs),
            backend_query_s=sum(c.get("backend_query_s", 0.0) for c in costs),
            queries_sent=int(sum(c.get("queries", 0) for c in costs)),
            golden=golden)
