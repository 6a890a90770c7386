"""What a source Prometheus still does, for retiring it (``core.ports.SourceObserver``), and the target's
sample times (``core.ports.SampleTimes``), over ``PrometheusClient`` (its size and time budgets).

- rules: ``/api/v1/rules`` (every group/rule it evaluates);
- reads: its query log (``adapters.usage.read_query_log``, with the log's own budgets): the metrics of every
  API query in the window (rule evaluations are the rules above);
- stored metrics: ``/api/v1/label/__name__/values`` over the last hour;
- usage: its own ``process_resident_memory_bytes`` and the rate of ``process_cpu_seconds_total`` over a short
  window, from ``/metrics`` (the same on a server and on an agent);
- the answer to ``up``: 200 on a server, 422 "unavailable with Prometheus Agent" on an agent.
"""

from __future__ import annotations

import re
from pathlib import Path

from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.usage import ReadNotes, read_query_log
from promshift.core.plan import UsageCollector

_METRIC_LINE = re.compile(r"^(process_resident_memory_bytes|process_cpu_seconds_total)\s+([0-9.eE+-]+)\s*$", re.M)


class HttpSourceObserver:
    def __init__(self, client: PrometheusClient, *, query_log: str | Path | None, cpu_window_s: float = 10.0) -> None:
        self.client, self.query_log, self.cpu_window_s = client, query_log, cpu_window_s

    def rules(self) -> list[str]:
        data = self.client.api_get("/api/v1/rules") or {}
        out = []
        for group in (data.get("groups") or [])[:10_000]:
            for rule in (group.get("rules") or [])[:10_000]:
                out.append(f"{group.get('name')}/{rule.get('name')}")
        return out

    def reads(self, since: float, until: float) -> tuple[list[str], list[str]]:
        if not self.query_log:
            return [], ["the source has no query_log_file: its reads could not be read"]
        usage, notes = UsageCollector(), ReadNotes()
        read_query_log(self.query_log, usage, notes, since=since, until=until)
        metrics: set[str] = set()
        for (expr, reader) in usage.reads:
            if reader.kind != "query_log":
                continue
            parsed = usage.exprs.get(expr)
            if parsed is not None:
                metrics.update(parsed.metrics)
        return sorted(metrics), [*notes.missing, *notes.caveats]

    def stored_metrics(self) -> list[str]:
        import time

        now = time.time()
        return self.client.label_values("__name__", '{__name__=~".+"}', start=now - 3600, end=now)

    def usage(self) -> dict[str, float | None]:
        """Resident memory (MB) now and the share of a core it used over ``cpu_window_s`` (two reads of its own
        ``process_cpu_seconds_total``: a restarted process's counter starts again, so only a rate compares)."""
        import time

        first, t0 = self._process_metrics(), time.monotonic()
        time.sleep(self.cpu_window_s)
        second, t1 = self._process_metrics(), time.monotonic()
        rss = second.get("process_resident_memory_bytes")
        a, b = first.get("process_cpu_seconds_total"), second.get("process_cpu_seconds_total")
        share = None if a is None or b is None or b < a else round((b - a) / (t1 - t0), 4)
        return {"rss_mb": None if rss is None else round(rss / 2**20, 1), "cpu_seconds": b, "cpu_share": share,
                "cpu_window_s": self.cpu_window_s}

    def _process_metrics(self) -> dict[str, float]:
        return {name: float(value) for name, value in _METRIC_LINE.findall(self.client.metrics_text())}

    def query_answer(self) -> tuple[int, str]:
        answer = self.client._request("GET", "/api/v1/query", params={"query": "up"}, timeout_s=10,
                                      max_bytes=1 << 20)
        return answer.status_code, answer.text[:200]


class HttpSampleTimes:
    def __init__(self, client: PrometheusClient) -> None:
        self.client = client

    def sample_times(self, expr: str, window_s: float) -> list[float]:
        result = self.client.query(f"{expr}[{max(1, int(window_s))}s]")
        return sorted(t for series in result.series for t, _ in series.points)
