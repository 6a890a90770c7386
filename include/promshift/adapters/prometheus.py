"""A small Prometheus HTTP API client (requests) for the source and the AMP-like target."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from promshift.core.redact import redact_text

log = logging.getLogger(__name__)


class PrometheusError(RuntimeError):
    """A query or admin call failed: unreachable, HTTP error, or an API error body.

    Its text and ``base_url`` have URL credentials redacted: errors end up in logs and records.
    """

    def __init__(self, base_url: str, message: str, *, http_status: int | None = None,
                 error_type: str | None = None) -> None:
        super().__init__(redact_text(f"{base_url}: {message}"))
        self.base_url = redact_text(base_url)
        self.http_status = http_status
        self.error_type = error_type


@dataclass(frozen=True)
class Series:
    """One series: its labels (``__name__`` included) and its (timestamp, value) points."""

    labels: dict[str, str]
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class QueryResult:
    """A parsed query answer with what a latency probe and an audit need to keep."""

    query: str
    result_type: str
    series: tuple[Series, ...]
    warnings: tuple[str, ...]
    elapsed_s: float
    http_status: int
    bytes: int
    stats: dict[str, Any] = field(default_factory=dict)
    scalar: float | None = None

    @property
    def points(self) -> int:
        return sum(len(s.points) for s in self.series)

    @property
    def server_time_s(self) -> float | None:
        """The server's own time when asked with ``stats=all``: queue wait plus evaluation.

        ``execTotalTime`` (= ``execQueueTime`` + ``evalTotalTime``) where given, else
        ``evalTotalTime``. Neither counts JSON encoding and gzip of the answer, which the
        client's wall time does (bench/latency measures that gap).
        """
        timings = self.stats.get("timings") or {}
        value = timings.get("execTotalTime", timings.get("evalTotalTime"))
        return float(value) if value is not None else None


def _float(text: str) -> float:
    # Prometheus encodes NaN and infinities as strings; float() understands all of them.
    return float(text)


def parse_query_response(query: str, body: dict[str, Any], *, elapsed_s: float, http_status: int,
                         size: int) -> QueryResult:
    """Turn a ``/api/v1/query`` or ``/query_range`` JSON body into a QueryResult."""
    data = body.get("data") or {}
    rtype = data.get("resultType", "")
    raw = data.get("result")
    series: list[Series] = []
    scalar: float | None = None
    if rtype == "matrix":
        for item in raw or []:
            pts = tuple((float(t), _float(v)) for t, v in item.get("values", []))
            series.append(Series(labels=dict(item.get("metric", {})), points=pts))
    elif rtype == "vector":
        for item in raw or []:
            t, v = item["value"]
            series.append(Series(labels=dict(item.get("metric", {})), points=((float(t), _float(v)),)))
    elif rtype in ("scalar", "string") and raw:
        scalar = _float(raw[1]) if rtype == "scalar" else None
    return QueryResult(
        query=query,
        result_type=rtype,
        series=tuple(series),
        warnings=tuple(body.get("warnings") or ()),
        elapsed_s=elapsed_s,
        http_status=http_status,
        bytes=size,
        stats=data.get("stats") or {},
        scalar=scalar,
    )


@dataclass
class QueryLedger:
    """Running totals of what a client asked: queries, wall time, the server's own time, bytes."""

    queries: int = 0
    wall_s: float = 0.0
    server_s: float = 0.0
    bytes: int = 0

    def add(self, res: QueryResult) -> None:
        self.queries += 1
        self.wall_s += res.elapsed_s
        self.server_s += res.server_time_s or 0.0
        self.bytes += res.bytes

    def snapshot(self) -> dict[str, float]:
        return {"queries": self.queries, "wall_s": self.wall_s, "server_s": self.server_s, "bytes": self.bytes}


class PrometheusClient:
    """Queries and admin calls against one Prometheus-compatible base URL.

    ``base_url`` may carry a path (an AMP workspace URL, or a Prometheus started with
    ``--web.route-prefix``); API paths are appended to it. ``auth`` is any requests auth
    object (SigV4 for AMP); it is never logged.
    """

    def __init__(self, base_url: str, *, timeout_s: float = 60.0, auth: Any = None,
                 session: requests.Session | None = None, always_stats: bool = False) -> None:
        self.base_url = base_url.rstrip("/")
        # With always_stats every query asks for stats=all, so the ledger holds the server's time.
        self.always_stats = always_stats
        self.ledger = QueryLedger()
        self.timeout_s = timeout_s
        self.auth = auth
        self.session = session or requests.Session()

    def _request(self, method: str, path: str, *, params: Any = None, data: Any = None,
                 timeout_s: float | None = None, accept_encoding: str | None = None) -> requests.Response:
        url = f"{self.base_url}{path}"
        # None keeps requests' default (gzip, deflate), as Grafana asks; "identity" asks for no compression.
        headers = {"Accept-Encoding": accept_encoding} if accept_encoding else None
        try:
            return self.session.request(method, url, params=params, data=data, auth=self.auth, headers=headers,
                                        timeout=timeout_s or self.timeout_s)
        except requests.Timeout as exc:
            raise PrometheusError(self.base_url, f"{method} {path} timed out after "
                                  f"{timeout_s or self.timeout_s:.0f}s", error_type="timeout") from exc
        except requests.ConnectionError as exc:
            raise PrometheusError(self.base_url, f"unreachable ({method} {path}): {exc.__class__.__name__}",
                                  error_type="unreachable") from exc

    def _api(self, path: str, params: dict[str, Any], query: str, timeout_s: float | None,
             accept_encoding: str | None = None) -> QueryResult:
        started = time.perf_counter()
        # POST with a form body keeps long selectors out of the URL, as Grafana does.
        resp = self._request("POST", path, data=params, timeout_s=timeout_s, accept_encoding=accept_encoding)
        elapsed = time.perf_counter() - started
        body = self._success_body(resp, repr(query))
        res = parse_query_response(query, body, elapsed_s=elapsed, http_status=resp.status_code,
                                   size=len(resp.content))
        self.ledger.add(res)
        return res

    def query(self, expr: str, *, at: float | None = None, stats: bool = False,
              timeout_s: float | None = None) -> QueryResult:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        if stats or self.always_stats:
            params["stats"] = "all"
        return self._api("/api/v1/query", params, expr, timeout_s)

    def query_range(self, expr: str, *, start: float, end: float, step: float, stats: bool = False,
                    timeout_s: float | None = None, accept_encoding: str | None = None) -> QueryResult:
        params: dict[str, Any] = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                  "step": f"{step:g}"}
        if stats or self.always_stats:
            params["stats"] = "all"
        return self._api("/api/v1/query_range", params, expr, timeout_s, accept_encoding)

    def _success_body(self, resp: requests.Response, what: str) -> dict[str, Any]:
        """The JSON body of a successful API answer; anything else raises with the server's reason."""
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
            # Prometheus says "error"; AMP says "message" (403s). Only the first line: AWS's signature
            # mismatch message goes on to print the canonical request, session token included.
            detail = (body.get("error") or body.get("message")) if isinstance(body, dict) else resp.text
            detail = str(detail).strip().splitlines()[0][:200] if detail else detail
            etype = body.get("errorType") if isinstance(body, dict) else None
            raise PrometheusError(self.base_url, f"HTTP {resp.status_code} for {what}: {detail}",
                                  http_status=resp.status_code, error_type=etype)
        return body

    def _get_list(self, path: str, params: dict[str, Any]) -> list[str]:
        body = self._success_body(self._request("GET", path, params=params), path)
        return [str(v) for v in body.get("data") or []]

    def label_names(self, match: str, *, start: float, end: float) -> list[str]:
        """Label names of the series matching ``match`` in [start, end] (``/api/v1/labels``)."""
        return self._get_list("/api/v1/labels", {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"})

    def label_values(self, label: str, match: str, *, start: float, end: float) -> list[str]:
        """Values of ``label`` among the series matching ``match`` in [start, end]."""
        return self._get_list(f"/api/v1/label/{label}/values",
                              {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"})

    def scalar(self, expr: str, *, at: float | None = None) -> float | None:
        """The single value of an instant query, or None when it returns nothing."""
        res = self.query(expr, at=at)
        if res.scalar is not None:
            return res.scalar
        if not res.series:
            return None
        value = res.series[0].points[0][1]
        return None if math.isnan(value) else value

    def config_text(self) -> str:
        """The config the server has loaded, from ``/api/v1/status/config``."""
        resp = self._request("GET", "/api/v1/status/config")
        if resp.status_code != 200:
            raise PrometheusError(self.base_url, f"status/config: HTTP {resp.status_code}",
                                  http_status=resp.status_code)
        return resp.json()["data"]["yaml"]

    def runtime_info(self) -> dict[str, Any]:
        """``/api/v1/status/runtimeinfo`` (``storageRetention`` among others); AMP does not serve it."""
        data = self._success_body(self._request("GET", "/api/v1/status/runtimeinfo"), "status/runtimeinfo")
        return data.get("data") or {}

    def reload(self, *, timeout_s: float = 120.0) -> None:
        """``POST /-/reload``; a rejected config comes back as HTTP 500 with the reason."""
        # A reload can block ~60 s while another remote endpoint is down (flush deadline).
        resp = self._request("POST", "/-/reload", timeout_s=timeout_s)
        if resp.status_code != 200:
            raise PrometheusError(self.base_url, f"reload rejected (HTTP {resp.status_code}): "
                                  f"{resp.text.strip()[:500]}", http_status=resp.status_code)

    def ready(self) -> bool:
        try:
            return self._request("GET", "/-/ready", timeout_s=5).status_code == 200
        except PrometheusError:
            return False

    def metrics_text(self) -> str:
        """The server's own ``/metrics`` page (remote-write queue health lives there)."""
        resp = self._request("GET", "/metrics", timeout_s=15)
        if resp.status_code != 200:
            raise PrometheusError(self.base_url, f"/metrics: HTTP {resp.status_code}", http_status=resp.status_code)
        return resp.text

    def delete_series(self, match: str, *, start: float | None = None, end: float | None = None) -> None:
        """Admin API: delete series data, optionally only in [start, end] (plants faults on the local target)."""
        params: dict[str, Any] = {"match[]": match}
        if start is not None:
            params["start"] = f"{start:.3f}"
        if end is not None:
            params["end"] = f"{end:.3f}"
        resp = self._request("POST", "/api/v1/admin/tsdb/delete_series", params=params)
        if resp.status_code not in (200, 204):
            raise PrometheusError(self.base_url, f"delete_series: HTTP {resp.status_code} {resp.text[:200]}",
                                  http_status=resp.status_code)
