"""The latency probe: time a group's golden queries on both backends, per window.

Runs go in source/target pairs at the same instants, A/B then B/A so drift and caching order
cancel, one warm-up pair per query is discarded, start/end are aligned to the step (AMP aligns
for caching), and every failure mode AMP has — client timeout, HTTP 422, throttling (429/503,
retried with backoff and counted), partial data (warnings) — is a failed run, never a slow
success. A window is probed in rounds of ``repeats`` pairs per query; after each round it is
judged on its interval (``core.latency.judge_window``), and a window whose interval straddles
the limit gets another round, up to ``max_rounds`` and the deadline.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
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
from promshift.core.query_budget import QueryBudgetExhausted
from promshift.core.query_limits import QueryLimits, size_refusal

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
    refusal = size_refusal(exc.http_status, str(exc)) if exc.kind == ErrorKind.HTTP else None
    if refusal is not None and refusal != "timeout":
        # The workspace refused the query for its size (samples, series, chunks, time range): a refusal, not a
        # slow answer, and named as one.
        return (ErrorKind.QUERY_TOO_EXPENSIVE,
                f"refused by the workspace ({refusal} limit): HTTP {exc.http_status}: {exc}")
    if exc.kind == ErrorKind.HTTP and exc.http_status == 422:
        return ErrorKind.QUERY_TOO_EXPENSIVE, f"HTTP 422: query timed out or too many samples: {exc}"
    if exc.kind == ErrorKind.HTTP and exc.http_status in THROTTLED:
        return ErrorKind.THROTTLED, f"throttled: HTTP {exc.http_status} after retries"
    return exc.kind, f"{exc.kind.value}: {exc}"


def range_refusal(window_s: float, limits: QueryLimits | None) -> str | None:
    """Why the workspace would refuse every query over the window (its query time range), or None."""
    if limits is None or limits.max_range_s is None or window_s <= limits.max_range_s:
        return None
    origin = (limits.source or {}).get("max_range_s", "limits")
    return (f"refused by the workspace's limits: a {format_duration(window_s)} window is past its query time range "
            f"of {format_duration(limits.max_range_s)} ({origin}); not probed")


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
    # The target's per-query limits (``core.query_limits``; AMP: Service Quotas / configuration), asked once per
    # run: a window past the workspace's query time range is not probed (the workspace would refuse every run).
    target_limits: Callable[[], QueryLimits] | None = None

    def timed(self, client: PrometheusClient, backend: str, window: str, query: str, start: float, end: float,
              step: float, *, round_: int = 0, pair: int | None = None) -> ProbeRun:
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
                                error=reason, retries=retries, kind=kind, round=round_, pair=pair)
            partial = "partial data: " + "; ".join(res.warnings) if res.warnings else None
            return ProbeRun(backend=backend, window=window, query=query, wall_s=res.elapsed_s, ok=not res.warnings,
                            server_s=res.server_time_s, http_status=res.http_status, error=partial,
                            warnings=res.warnings, series=len(res.series), points=res.points, bytes=res.bytes,
                            retries=retries, samples=samples_processed(res.stats),
                            kind=ErrorKind.PARTIAL if res.warnings else None, result_type=res.result_type,
                            round=round_, pair=pair)

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
        """``measure``; a workspace query budget spent on the way (``QueryBudgetExhausted``) ends the probe with
        every window INCONCLUSIVE and the budget named: nothing measured counts as a pass or a failure."""
        try:
            return self.measure(now=now, queries=queries, dual_write_since=dual_write_since,
                                history_selector=history_selector, group=group)
        except QueryBudgetExhausted as exc:
            log.warning("latency: %s", exc)
            tables = tuple(judge_window(w.name, [], slo_p95_s=w.slo_p95_s,
                                        max_slowdown_ratio=self.policy.max_slowdown_ratio,
                                        slowdown_floor_s=self.policy.slowdown_floor_s, min_successes=1,
                                        not_comparable=str(exc), behind={}, confidence=self.policy.confidence,
                                        looks=self.policy.max_rounds, rounds=0) for w in self.policy.windows)
            m = latency_measurement(list(tables), queries)
            return LatencyResult(m.verdict, m, tables, (), 0, {}, self.policy.max_concurrency,
                                 self.policy.accept_encoding)

    def measure(self, *, now: float, queries: Sequence[str], dual_write_since: float | None,
                history_selector: str | None = None, group: MetricGroup | None = None) -> LatencyResult:
        """Every window x query in rounds of ``repeats`` pairs, within the policy's deadline; returns
        table, runs and verdict.

        (window, query) units run on a pool of ``max_concurrency`` threads, each unit doing its
        pairs one request at a time, so no backend ever has more than that many probe queries
        in flight. A window the step or a backend's retention rules out is judged without querying.
        A window reaching back before dual-write began is comparable only if the target holds the
        group's history there too (``history_selector`` counts series on both sides). Each query's
        timings count only with the group's series behind it on both sides (``group``: its own
        selectors are counted over the window after the first round, so counting costs no timing).
        After each round every window still measured is judged; one whose interval straddles the
        limit (``undecided``) gets another round until ``max_rounds`` or the deadline.
        """
        policy = self.policy
        deadline = self.clock() + policy.deadline_s
        retention = self.retentions()
        limits = self.target_limits() if self.target_limits is not None else None
        sides = (("source", self.source), ("target", self.target))
        plans: list[_WindowPlan] = []
        for window in policy.windows:
            step = choose_step(window.seconds, min_step_s=self.min_step_s)
            end = math.floor(now / step) * step
            if window.seconds < step:
                skip = f"window {window.name} is shorter than the step ({step:g}s): nothing to measure"
            else:
                skip = retention_problem(window.seconds, retention) or range_refusal(window.seconds, limits)
            plans.append(_WindowPlan(window, step, end - window.seconds, end, skip))

        def measure(unit: tuple[int, str, int]) -> tuple[list[ProbeRun], bool]:
            index, query, round_ = unit
            plan = plans[index]
            runs: list[ProbeRun] = []
            first = 0 if round_ == 1 else 1  # round 1 starts with a warm-up pair, discarded
            for i in range(first, policy.repeats + 1):
                if self.clock() > deadline:
                    return runs, True
                pair = (round_ - 1) * policy.repeats + i
                for backend, client in (sides if pair % 2 == 0 else sides[::-1]):
                    run = self.timed(client, backend, plan.window.name, query, plan.start, plan.end, plan.step,
                                     round_=round_, pair=pair)
                    if i > 0:
                        runs.append(run)
            return runs, False

        log.info("latency: %d windows x %d queries, rounds of %d pairs (+1 warm-up) up to %d rounds, %d in flight "
                 "at most, Accept-Encoding %s, confidence %g, deadline %s", len(plans), len(queries), policy.repeats,
                 policy.max_rounds, policy.max_concurrency, policy.accept_encoding, policy.confidence,
                 format_duration(policy.deadline_s))
        measured: dict[int, list[ProbeRun]] = {i: [] for i, plan in enumerate(plans) if plan.skip is None}
        out_of_time: set[int] = set()
        problems: dict[int, str | None] = {}
        behind: dict[int, dict[str, tuple[float | None, float] | str]] = {}
        judged: dict[int, WindowLatency] = {}
        active = sorted(measured)
        round_ = 0
        with ThreadPoolExecutor(max_workers=policy.max_concurrency, thread_name_prefix="latency-probe") as pool:
            while active:
                round_ += 1
                units = [(index, query, round_) for index in active for query in queries]
                for (index, _, _), (runs, late) in zip(units, pool.map(measure, units), strict=True):
                    measured[index].extend(runs)
                    if late:
                        out_of_time.add(index)
                for index in active:
                    judged[index] = self._judge(index, plans[index], measured[index], queries, round_, dual_write_since,
                                                history_selector, group, out_of_time, problems, behind, deadline)
                    log.info("latency window %s round %d: %s (%s)", plans[index].window.name, round_,
                             judged[index].verdict.value, judged[index].outcome)
                active = [i for i in active if judged[i].undecided and i not in out_of_time
                          and round_ < policy.max_rounds and self.clock() < deadline]
        tables: list[WindowLatency] = []
        all_runs: list[ProbeRun] = []
        for index, plan in enumerate(plans):
            if index not in judged:
                judged[index] = self._judge(index, plan, [], queries, 0, dual_write_since, history_selector, group,
                                            out_of_time, problems, behind, deadline)
            w = judged[index]
            log.info("latency window %s (step %ss): source p50 %s, target p50 %s -> %s (%s)", plan.window.name,
                     plan.step, w.source_p50_s, w.target_p50_s, w.verdict.value, w.outcome)
            tables.append(w)
            all_runs.extend(measured.get(index, ()))
        m = latency_measurement(tables, queries)
        return LatencyResult(m.verdict, m, tuple(tables), tuple(all_runs), sum(r.retries for r in all_runs),
                             retention, policy.max_concurrency, policy.accept_encoding)

    def _judge(self, index: int, plan: _WindowPlan, runs: list[ProbeRun], queries: Sequence[str], round_: int,
               dual_write_since: float | None, history_selector: str | None, group: MetricGroup | None,
               out_of_time: set[int], problems: dict[int, str | None],
               behind: dict[int, dict[str, tuple[float | None, float] | str]], deadline: float) -> WindowLatency:
        """One window's verdict on the runs so far; its comparability and the series behind each query
        are found once (the first round) and kept in ``problems`` / ``behind``."""
        policy = self.policy
        window, step, start, end, skip = plan
        if index not in problems:
            history = []
            if not skip and history_selector and dual_write_since is not None and start + step < dual_write_since:
                history = self.history(history_selector,
                                       history_instants(start=start, dual_write_since=dual_write_since, step=step))
                log.info("latency window %s starts before dual-write; group series (at, source, target): %s",
                         window.name, history)
            problems[index] = skip or target_span_problem(window_s=window.seconds, start=start,
                                                          dual_write_since=dual_write_since, step=step,
                                                          history=history)
        problem = problems[index]
        late = f"probe deadline of {policy.deadline_s:.0f}s reached before this window finished"
        if not problem and index in out_of_time and round_ <= 1:
            problem = late  # not even one round: nothing to judge
        # Counted only where it decides something: a window already failed or inconclusive needs no count.
        if index not in behind and not problem and all(r.ok for r in runs if r.backend == "target"):
            answered = {r.query for r in runs if r.backend == "source" and r.ok}
            behind[index] = {query: self.behind(query, start, end, group, source_answered=query in answered)
                             for query in queries}
        judged = judge_window(window.name, runs, slo_p95_s=window.slo_p95_s,
                              max_slowdown_ratio=policy.max_slowdown_ratio,
                              slowdown_floor_s=policy.slowdown_floor_s,
                              min_successes=max(1, (policy.repeats * len(queries) + 1) // 2),
                              not_comparable=problem, behind=behind.get(index, {}),
                              confidence=policy.confidence, looks=policy.max_rounds, rounds=round_)
        if judged.undecided and (index in out_of_time or self.clock() >= deadline):
            # Later rounds' whole pairs are judged; what stops the probe is said.
            judged = replace(judged, outcome=f"{judged.outcome}; {late}")
        return judged
