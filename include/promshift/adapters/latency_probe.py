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
from dataclasses import dataclass
from typing import Any

from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.catalog import LatencyPolicy
from promshift.core.latency import (
    ProbeRun,
    WindowLatency,
    choose_step,
    judge_window,
    latency_measurement,
    target_span_problem,
)

log = logging.getLogger(__name__)

THROTTLED = (429, 503)


def classify_error(exc: PrometheusError, timeout_s: float) -> str:
    """A short, stable reason for a failed run (the first word groups runs in the verdict)."""
    if exc.error_type == "timeout":
        return f"timeout: no answer within {timeout_s:.0f}s"
    if exc.http_status == 422:
        return f"HTTP 422: query timed out or too many samples: {exc}"
    if exc.http_status in THROTTLED:
        return f"throttled: HTTP {exc.http_status} after retries"
    if exc.error_type == "unreachable":
        return f"unreachable: {exc}"
    return f"error: {exc}"


def samples_processed(stats: dict[str, Any]) -> float | None:
    """Samples the backend says it touched (``stats=all``), or None when it does not say."""
    samples = stats.get("samples") or {}
    value = samples.get("totalQueryableSamples")
    return float(value) if value is not None else None


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

    def timed(self, client: PrometheusClient, backend: str, window: str, query: str, start: float, end: float,
              step: float) -> ProbeRun:
        """One run; throttling is retried with exponential backoff and counted, not hidden."""
        retries = 0
        while True:
            started = time.perf_counter()
            try:
                res = client.query_range(query, start=start, end=end, step=step, stats=True,
                                         timeout_s=self.policy.timeout_s)
            except PrometheusError as exc:
                if exc.http_status in THROTTLED and retries < self.max_retries:
                    retries += 1
                    self.sleep(self.backoff_s * 2 ** (retries - 1))
                    continue
                return ProbeRun(backend=backend, window=window, query=query,
                                wall_s=time.perf_counter() - started, ok=False, http_status=exc.http_status,
                                error=classify_error(exc, self.policy.timeout_s), retries=retries)
            partial = "partial data: " + "; ".join(res.warnings) if res.warnings else None
            return ProbeRun(backend=backend, window=window, query=query, wall_s=res.elapsed_s, ok=not res.warnings,
                            server_s=res.server_time_s, http_status=res.http_status, error=partial,
                            warnings=res.warnings, series=len(res.series), points=res.points, bytes=res.bytes,
                            retries=retries, samples=samples_processed(res.stats))

    def run(self, *, now: float, queries: Sequence[str], dual_write_since: float | None) -> dict[str, Any]:
        """Every window × query × repeat, within the policy's deadline; returns table, runs and verdict."""
        deadline = self.clock() + self.policy.deadline_s
        tables: list[WindowLatency] = []
        all_runs: list[ProbeRun] = []
        sides = (("source", self.source), ("target", self.target))
        for window in self.policy.windows:
            step = choose_step(window.seconds, min_step_s=self.min_step_s)
            end = math.floor(now / step) * step
            start = end - window.seconds
            if window.seconds < step:
                reason = f"window {window.name} is shorter than the step ({step:g}s): nothing to measure"
                tables.append(judge_window(window.name, [], slo_p95_s=window.slo_p95_s,
                                           max_slowdown_ratio=self.policy.max_slowdown_ratio, min_successes=1,
                                           not_comparable=reason))
                continue
            runs: list[ProbeRun] = []
            out_of_time = False
            for query in queries:
                for i in range(self.policy.repeats + 1):
                    if self.clock() > deadline:
                        out_of_time = True
                        break
                    order = sides if i % 2 == 0 else sides[::-1]
                    for backend, client in order:
                        run = self.timed(client, backend, window.name, query, start, end, step)
                        if i > 0:  # round 0 warms caches and is discarded
                            runs.append(run)
            problem = target_span_problem(window_s=window.seconds, start=start, dual_write_since=dual_write_since,
                                          step=step)
            if out_of_time and not problem:
                problem = f"probe deadline of {self.policy.deadline_s:.0f}s reached before this window finished"
            judged = judge_window(window.name, runs, slo_p95_s=window.slo_p95_s,
                                  max_slowdown_ratio=self.policy.max_slowdown_ratio,
                                  slowdown_floor_s=self.policy.slowdown_floor_s,
                                  min_successes=max(1, (self.policy.repeats * len(queries) + 1) // 2),
                                  not_comparable=problem)
            log.info("latency window %s (step %ss): source p50 %s, target p50 %s -> %s (%s)", window.name, step,
                     judged.source_p50_s, judged.target_p50_s, judged.verdict.value, judged.outcome)
            tables.append(judged)
            all_runs.extend(runs)
        m = latency_measurement(tables, queries)
        return {"verdict": m.verdict.value, "measurement": m.to_dict(), "windows": [w.to_dict() for w in tables],
                "runs": [r.to_dict() for r in all_runs],
                "retries": sum(r.retries for r in all_runs)}
