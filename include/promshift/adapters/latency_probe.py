"""The latency probe: time a group's golden queries on both backends, per window.

Runs are interleaved A/B then B/A so drift and caching order cancel, one warm-up round
per query is discarded, start/end are aligned to the step (AMP aligns for caching), and
every failure mode AMP has — client timeout, HTTP 422, throttling (429/503, retried with
backoff and counted), partial data (warnings) — is a failed run, never a slow success.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple

from promshift.adapters.parity_check import count_behind, group_selectors_of, lookback_span, series_behind
from promshift.adapters.prometheus import PrometheusClient, PrometheusError, stat_number
from promshift.core.catalog import LatencyPolicy, LatencyWindow, MetricGroup
from promshift.core.durations import format_duration
from promshift.core.errors import ErrorKind
from promshift.core.latency import (
    LatencyResult,
    ProbeRun,
    WindowLatency,
    choose_step,
    history_instants,
    judge_window,
    latency_measurement,
    parse_retention,
    retention_problem,
    target_span_problem,
)
from promshift.core.promql import PromQLError, analyse

log = logging.getLogger(__name__)


class _WindowPlan(NamedTuple):
    """One window's step-aligned range, and why it is not queried at all (None: it is)."""

    window: LatencyWindow
    step: float
    start: float
    end: float
    skip: str | None

THROTTLED = (429, 503)


def classify_error(exc: PrometheusError, timeout_s: float) -> tuple[ErrorKind, str]:
    """How a run failed, and a short reason that starts with the kind's name."""
    if exc.kind == ErrorKind.TIMEOUT:
        return ErrorKind.TIMEOUT, f"timeout: no whole answer within {timeout_s:g}s"
    if exc.kind == ErrorKind.HTTP and exc.http_status == 422:
        return ErrorKind.QUERY_TOO_EXPENSIVE, f"HTTP 422: query timed out or too many samples: {exc}"
    if exc.kind == ErrorKind.HTTP and exc.http_status in THROTTLED:
        return ErrorKind.THROTTLED, f"throttled: HTTP {exc.http_status} after retries"
    return exc.kind, f"{exc.kind.value}: {exc}"


def samples_processed(stats: dict[str, Any]) -> float | None:
    """Samples the backend says it touched (``stats=all``), or None when it does not say."""
    samples = stats.get("samples") or {}
    value = samples.get("totalQueryableSamples")
    return stat_number(value)


@dataclass
class LatencyProbe:
    """Measure every window of a group's latency policy on source and target."""

    source: PrometheusClient
    target: PrometheusClient
    policy: LatencyPolicy
    min_step_s: float
    max_retries: int = 3
    backoff_s: float = 0.5
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    # The target's control plane, when it has one (AMP: DescribeWorkspaceConfiguration): (seconds, origin).
    target_retention: Callable[[], tuple[float | None, str]] | None = None

    def timed(self, client: PrometheusClient, backend: str, window: str, query: str, start: float, end: float,
              step: float) -> ProbeRun:
        """One run; throttling is retried with exponential backoff and counted, not hidden."""
        retries = 0
        while True:
            started = time.perf_counter()
            try:
                res = client.query_range(query, start=start, end=end, step=step, stats=True,
                                         timeout_s=self.policy.timeout_s,
                                         accept_encoding=self.policy.accept_encoding,
                                         max_bytes=self.policy.max_answer_bytes)
            except PrometheusError as exc:
                if exc.kind == ErrorKind.HTTP and exc.http_status in THROTTLED and retries < self.max_retries:
                    retries += 1
                    self.sleep(self.backoff_s * 2 ** (retries - 1))
                    continue
                # A malformed or oversized answer is one failed run like a timeout; the probe goes on.
                kind, reason = classify_error(exc, self.policy.timeout_s)
                return ProbeRun(backend=backend, window=window, query=query,
                                wall_s=time.perf_counter() - started, ok=False, http_status=exc.http_status,
                                error=reason, retries=retries, kind=kind)
            partial = "partial data: " + "; ".join(res.warnings) if res.warnings else None
            return ProbeRun(backend=backend, window=window, query=query, wall_s=res.elapsed_s, ok=not res.warnings,
                            server_s=res.server_time_s, http_status=res.http_status, error=partial,
                            warnings=res.warnings, series=len(res.series), points=res.points, bytes=res.bytes,
                            retries=retries, samples=samples_processed(res.stats),
                            kind=ErrorKind.PARTIAL if res.warnings else None, result_type=res.result_type)

    def retentions(self) -> dict[str, float | None]:
        """Each backend's time retention: what it reports (``status/runtimeinfo``; for an AMP target
        its workspace configuration), else for the target the catalog's ``retention`` (AMP serves no
        runtimeinfo, and a control plane may not answer), else unknown (None)."""
        kept: dict[str, float | None] = {}
        for backend, client in (("source", self.source), ("target", self.target)):
            if backend == "target" and self.target_retention is not None:
                value, origin = self.target_retention()
            else:
                try:
                    value = parse_retention(str(client.runtime_info().get("storageRetention") or ""))
                    origin = "reported by the backend"
                except PrometheusError as exc:
                    value, origin = None, f"not reported ({exc})"
            if value is None and backend == "target":
                value = self.policy.retention_s
                origin = f"from the catalog (latency.retention); the backend's: {origin}"
            kept[backend] = value
            log.info("latency: %s retention %s, %s", backend,
                     format_duration(value) if value is not None else "unknown", origin)
        return kept

    def history(self, selector: str, instants: Sequence[float]) -> list[tuple[float, float | None, float | None]]:
        """``(at, source series, target series)`` of the group at each instant; None where a side failed."""
        out = []
        for at in instants:
            counts: list[float | None] = []
            for client in (self.source, self.target):
                try:
                    counts.append(client.scalar(f"count({selector})", at=at) or 0.0)  # empty: no series
                except PrometheusError as exc:
                    log.warning("latency: history check at %.0f failed: %s", at, exc)
                    counts.append(None)
            out.append((at, counts[0], counts[1]))
        return out

    def behind(self, query: str, start: float, end: float, group: MetricGroup | None, *,
               source_answered: bool = True) -> tuple[float | None, float] | str:
        """``(source, target)``: the series of ``group`` the query's selectors read over ``start..end``
        (with its look-back), counted as the golden layer counts them; or why that is unknown.

        Without a group every selector of the query counts. A query that reads none of the group's
        metrics has nothing behind it: ``(0, 0)``. When the source answered none of the query's runs
        (it timed out: the target's win), only the target's series are counted (source None): no
        source timing is judged, and a source too slow for the query may be too slow to count.
        """
        try:
            analysis = analyse(query)
        except PromQLError as exc:
            return f"cannot count the series behind it: {exc}"
        try:
            if group is None:
                selectors = list(analysis.selectors)
            else:
                selectors = group_selectors_of(group, self.source, analysis, start, end)[0]
            if not selectors:
                return 0.0, 0.0
            span = lookback_span(analysis, start, end)
            if not source_answered:
                return None, sum(count_behind(self.target, sel, span) for sel in selectors)
            counts = series_behind(self.source, self.target, selectors, span)
        except PrometheusError as exc:
            return f"counting the series behind it failed: {exc}"
        return sum(c[0] for c in counts), sum(c[1] for c in counts)

    def run(self, *, now: float, queries: Sequence[str], dual_write_since: float | None,
            history_selector: str | None = None, group: MetricGroup | None = None) -> LatencyResult:
        """Every window x query x repeat, within the policy's deadline; returns table, runs and verdict.

        (window, query) units run on a pool of ``max_concurrency`` threads, each unit doing its
        rounds one request at a time, so no backend ever has more than that many probe queries
        in flight. A window the step or a backend's retention rules out is judged without querying.
        A window reaching back before dual-write began is comparable only if the target holds the
        group's history there too (``history_selector`` counts series on both sides). Each query's
        timings count only with the group's series behind it on both sides (``group``: its own
        selectors are counted over the window after the timed rounds, so counting costs no timing).
        """
        policy = self.policy
        deadline = self.clock() + policy.deadline_s
        retention = self.retentions()
        sides = (("source", self.source), ("target", self.target))
        plans: list[_WindowPlan] = []
        for window in policy.windows:
            step = choose_step(window.seconds, min_step_s=self.min_step_s)
            end = math.floor(now / step) * step
            if window.seconds < step:
                skip = f"window {window.name} is shorter than the step ({step:g}s): nothing to measure"
            else:
                skip = retention_problem(window.seconds, retention)
            plans.append(_WindowPlan(window, step, end - window.seconds, end, skip))
        units = [(index, query) for index, plan in enumerate(plans) if plan.skip is None for query in queries]

        def measure(unit: tuple[int, str]) -> tuple[list[ProbeRun], bool]:
            plan, query = plans[unit[0]], unit[1]
            runs: list[ProbeRun] = []
            for i in range(policy.repeats + 1):
                if self.clock() > deadline:
                    return runs, True
                for backend, client in (sides if i % 2 == 0 else sides[::-1]):
                    run = self.timed(client, backend, plan.window.name, query, plan.start, plan.end, plan.step)
                    if i > 0:  # round 0 warms caches and is discarded
                        runs.append(run)
            return runs, False

        log.info("latency: %d windows x %d queries x %d repeats (+1 warm-up) per backend, %d in flight at most, "
                 "Accept-Encoding %s, deadline %s", len(plans), len(queries), policy.repeats, policy.max_concurrency,
                 policy.accept_encoding, format_duration(policy.deadline_s))
        with ThreadPoolExecutor(max_workers=policy.max_concurrency, thread_name_prefix="latency-probe") as pool:
            done = dict(zip(units, pool.map(measure, units), strict=True))
        tables: list[WindowLatency] = []
        all_runs: list[ProbeRun] = []
        for index, (window, step, start, end, skip) in enumerate(plans):
            results = [done[(index, query)] for query in queries] if skip is None else []
            runs = [run for unit_runs, _ in results for run in unit_runs]
            history = []
            if not skip and history_selector and dual_write_since is not None and start + step < dual_write_since:
                history = self.history(history_selector,
                                       history_instants(start=start, dual_write_since=dual_write_since, step=step))
                log.info("latency window %s starts before dual-write; group series (at, source, target): %s",
                         window.name, history)
            problem = skip or target_span_problem(window_s=window.seconds, start=start,
                                                  dual_write_since=dual_write_since, step=step, history=history)
            if not problem and any(out_of_time for _, out_of_time in results):
                problem = f"probe deadline of {policy.deadline_s:.0f}s reached before this window finished"
            # Counted only where it decides something: a window already failed or inconclusive needs no count.
            behind: dict[str, tuple[float | None, float] | str] = {}
            if not problem and all(r.ok for r in runs if r.backend == "target"):
                answered = {r.query for r in runs if r.backend == "source" and r.ok}
                behind = {query: self.behind(query, start, end, group, source_answered=query in answered)
                          for query in queries}
            judged = judge_window(window.name, runs, slo_p95_s=window.slo_p95_s,
                                  max_slowdown_ratio=policy.max_slowdown_ratio,
                                  slowdown_floor_s=policy.slowdown_floor_s,
                                  min_successes=max(1, (policy.repeats * len(queries) + 1) // 2),
                                  not_comparable=problem, behind=behind)
            log.info("latency window %s (step %ss): source p50 %s, target p50 %s -> %s (%s)", window.name, step,
                     judged.source_p50_s, judged.target_p50_s, judged.verdict.value, judged.outcome)
            tables.append(judged)
            all_runs.extend(runs)
        m = latency_measurement(tables, queries)
        return LatencyResult(m.verdict, m, tuple(tables), tuple(all_runs), sum(r.retries for r in all_runs),
                             retention, policy.max_concurrency, policy.accept_encoding)
