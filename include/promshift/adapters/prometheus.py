"""A small Prometheus HTTP API client (requests) for the source and the AMP-like target."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import requests
import urllib3.exceptions

from promshift.core.errors import ErrorKind, PrometheusError
from promshift.core.promql import mark_own_read

log = logging.getLogger(__name__)

# Answers above this are refused while they stream in, not parsed: a JSON answer costs ~14x its
# size in Python objects (bench/answer_size: 64 MB took 888 MiB), and an Airflow worker is shared.
DEFAULT_MAX_ANSWER_BYTES = 64 * 2**20
_CHUNK = 256 * 2**10


class MalformedAnswer(ValueError):
    """An HTTP 200 body that is not a Prometheus API answer; the message says what is wrong."""


@dataclass(frozen=True)
class Answer:
    """One HTTP answer, read whole within the client's deadline and size limit."""

    status_code: int
    content: bytes | bytearray

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


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
        return stat_number(timings.get("execTotalTime", timings.get("evalTotalTime")))


def stat_number(value: Any) -> float | None:
    """A number from ``stats=all``, or None when absent or not a number (odd stats lose no answer)."""
    try:
        return float(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def _describe(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _sample(pair: Any, where: str) -> tuple[float, float]:
    """A ``[timestamp, "value"]`` pair; Prometheus sends the value as a string (NaN and Inf too)."""
    if not isinstance(pair, list) or len(pair) != 2:
        raise MalformedAnswer(f"{where}: expected [timestamp, value], got {_describe(pair)}")
    t, v = pair
    if isinstance(t, bool) or not isinstance(t, int | float):
        raise MalformedAnswer(f"{where}: timestamp is not a number: {_describe(t)}")
    if isinstance(v, bool) or not isinstance(v, str | int | float):
        raise MalformedAnswer(f"{where}: value is not a number: {_describe(v)}")
    try:
        return float(t), float(v)
    except (ValueError, OverflowError):
        raise MalformedAnswer(f"{where}: value is not a number: {_describe(v)}") from None


def _labels(item: dict[str, Any], where: str) -> dict[str, str]:
    metric = item.get("metric", {})
    if not isinstance(metric, dict) or not all(isinstance(v, str) for v in metric.values()):
        raise MalformedAnswer(f"{where}: 'metric' is not a label set: {_describe(metric)}")
    return dict(metric)


def _series(rtype: str, raw: Any) -> list[Series]:
    if not isinstance(raw, list):
        raise MalformedAnswer(f"'result' of a {rtype} must be a list, got {_describe(raw)}")
    series: list[Series] = []
    for index, item in enumerate(raw):
        # Each item's JSON is dropped once converted, so a large answer is not held twice.
        raw[index] = None
        where = f"result[{index}]"
        if not isinstance(item, dict):
            raise MalformedAnswer(f"{where}: expected an object, got {_describe(item)}")
        labels = _labels(item, where)
        if rtype == "matrix":
            values = item.get("values")
            if values is None and "histograms" in item:
                values = []  # native histograms carry no float samples to compare or count
            if not isinstance(values, list):
                raise MalformedAnswer(f"{where}: 'values' must be a list, got {_describe(values)}")
            try:
                # The fast path (a third of the time of checking each pair); a failure is then
                # located and named by the slow one.
                pts = tuple([(float(t), float(v)) for t, v in values])
            except (TypeError, ValueError, OverflowError):
                pts = tuple(_sample(pair, f"{where}.values[{i}]") for i, pair in enumerate(values))
        else:
            if "value" not in item and "histogram" in item:
                pts = ()
            elif "value" not in item:
                raise MalformedAnswer(f"{where}: vector sample without a 'value'")
            else:
                pts = (_sample(item["value"], f"{where}.value"),)
        series.append(Series(labels=labels, points=pts))
    return series


def parse_query_response(query: str, body: Any, *, elapsed_s: float, http_status: int,
                         size: int) -> QueryResult:
    """Turn a ``/api/v1/query`` or ``/query_range`` JSON body into a QueryResult.

    Anything that is not the documented shape raises MalformedAnswer naming the first problem:
    a wrong ``resultType``, a ``result`` of the wrong type, a sample without a value, a
    timestamp or value that is not a number. The body's ``result`` list is consumed (its items
    are released as they are converted: a large answer is not held twice).
    """
    if not isinstance(body, dict):
        raise MalformedAnswer(f"body is not a JSON object: {_describe(body)}")
    data = body.get("data")
    if not isinstance(data, dict):
        raise MalformedAnswer(f"'data' must be an object, got {_describe(data)}")
    rtype = data.get("resultType")
    raw = data.get("result")
    series: list[Series] = []
    scalar: float | None = None
    if rtype in ("matrix", "vector"):
        series = _series(rtype, raw)
    elif rtype == "scalar":
        scalar = _sample(raw, "scalar result")[1]
    elif rtype == "string":
        if not isinstance(raw, list) or len(raw) != 2 or not isinstance(raw[1], str):
            raise MalformedAnswer(f"string result must be [timestamp, text], got {_describe(raw)}")
    else:
        raise MalformedAnswer(f"unknown resultType {_describe(rtype)}")
    warnings = body.get("warnings") or []
    if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
        raise MalformedAnswer(f"'warnings' must be a list of strings, got {_describe(warnings)}")
    stats = data.get("stats") or {}
    if not isinstance(stats, dict) or not all(isinstance(stats.get(k, {}), dict) for k in ("timings", "samples")):
        raise MalformedAnswer(f"'stats' must be an object of objects, got {_describe(stats)}")
    return QueryResult(
        query=query,
        result_type=rtype,
        series=tuple(series),
        warnings=tuple(warnings),
        elapsed_s=elapsed_s,
        http_status=http_status,
        bytes=size,
        stats=stats,
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

    ``timeout_s`` bounds each whole call, headers and body: an answer trickled in slower
    than that is a timeout (requests' own timeout is per socket read). Answers above
    ``max_answer_bytes`` (after decompression) are refused while they stream in.
    """

    def __init__(self, base_url: str, *, timeout_s: float = 60.0, auth: Any = None,
                 session: requests.Session | None = None, always_stats: bool = False,
                 max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES) -> None:
        self.base_url = base_url.rstrip("/")
        # With always_stats every query asks for stats=all, so the ledger holds the server's time.
        self.always_stats = always_stats
        self.ledger = QueryLedger()
        self.timeout_s = timeout_s
        self.max_answer_bytes = max_answer_bytes
        self.auth = auth
        self.session = session or requests.Session()
        # Called before each query is sent (``adapters.query_budget.WorkspaceQueryGate``): it may wait, or raise
        # ``QueryBudgetExhausted`` so the query is never sent.
        self.before_query: Callable[[], None] | None = None

    def _error(self, message: str, kind: ErrorKind, *, http_status: int | None = None,
               error_type: str | None = None) -> PrometheusError:
        return PrometheusError(self.base_url, message, http_status=http_status, error_type=error_type, kind=kind)

    def _request(self, method: str, path: str, *, params: Any = None, data: Any = None,
                 timeout_s: float | None = None, accept_encoding: str | None = None,
                 max_bytes: int | None = None) -> Answer:
        """One call, its body read whole before ``timeout_s`` ends and refused above ``max_bytes``."""
        if self.before_query is not None:
            self.before_query()  # the workspace's query budget: may wait, or refuse before anything is sent
        url = f"{self.base_url}{path}"
        budget = timeout_s or self.timeout_s
        limit = max_bytes or self.max_answer_bytes
        deadline = time.monotonic() + budget
        what = f"{method} {path}"
        # None keeps requests' default (gzip, deflate), as Grafana asks; "identity" asks for no compression.
        headers = {"Accept-Encoding": accept_encoding} if accept_encoding else None
        try:
            resp = self.session.request(method, url, params=params, data=data, auth=self.auth, headers=headers,
                                        timeout=budget, stream=True)
        except requests.Timeout as exc:
            raise self._error(f"{what} timed out after {budget:g}s", ErrorKind.TIMEOUT) from exc
        except requests.RequestException as exc:
            # The class name only: requests' own text repeats the URL, which may carry a password.
            raise self._error(f"unreachable ({what}): {exc.__class__.__name__}", ErrorKind.UNREACHABLE) from exc
        with resp:
            declared = resp.headers.get("Content-Length", "")
            if not resp.headers.get("Content-Encoding") and declared.isdigit() and int(declared) > limit:
                raise self._too_large(what, f"{int(declared):,} bytes (Content-Length)", limit, resp.status_code)
            return Answer(resp.status_code, self._read_body(resp, what, deadline, budget, limit))

    def _too_large(self, what: str, size: str, limit: int, status: int) -> PrometheusError:
        return self._error(f"{what}: answer of {size} refused: over the limit of {limit:,} bytes "
                           "(max_answer_bytes); narrow the query or raise the limit", ErrorKind.TOO_LARGE,
                           http_status=status)

    def _read_body(self, resp: requests.Response, what: str, deadline: float, budget: float,
                   limit: int) -> bytearray:
        """The decoded body, chunk by chunk; a stalled or trickled body is cut at the deadline."""
        raw = resp.raw
        # A blocked socket read ends when the watchdog shuts the socket down at the deadline; the read
        # then fails or returns an early end, and ``cut`` tells that apart from a real end.
        cut = threading.Event()
        watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), _cut_off, args=(raw, cut))
        watchdog.daemon = True
        watchdog.start()
        body = bytearray()

        def timed_out() -> PrometheusError:
            return self._error(f"{what} timed out after {budget:g}s ({len(body):,} bytes of the answer read)",
                               ErrorKind.TIMEOUT, http_status=resp.status_code)

        try:
            while True:
                if time.monotonic() > deadline:
                    raise timed_out()
                try:
                    chunk = raw.read1(_CHUNK, decode_content=True)
                except urllib3.exceptions.DecodeError as exc:
                    encoding = resp.headers.get("Content-Encoding", "")
                    raise self._error(f"{what}: body says Content-Encoding {encoding} but does not decode "
                                      f"({exc.__class__.__name__})", ErrorKind.MALFORMED,
                                      http_status=resp.status_code) from exc
                except (urllib3.exceptions.HTTPError, OSError) as exc:
                    if cut.is_set() or isinstance(exc, urllib3.exceptions.TimeoutError | TimeoutError):
                        raise timed_out() from exc
                    raise self._error(f"{what}: answer cut off after {len(body):,} bytes ({exc.__class__.__name__})",
                                      ErrorKind.UNREACHABLE, http_status=resp.status_code) from exc
                if not chunk:
                    if cut.is_set():
                        raise timed_out()
                    return body  # json.loads reads a bytearray as is: no copy of a large answer
                body += chunk
                if len(body) > limit:
                    raise self._too_large(what, f"more than {limit:,} bytes (stopped reading)", limit,
                                          resp.status_code)
        finally:
            watchdog.cancel()

    def _api(self, path: str, params: dict[str, Any], query: str, timeout_s: float | None,
             accept_encoding: str | None = None, max_bytes: int | None = None) -> QueryResult:
        started = time.perf_counter()
        # POST with a form body keeps long selectors out of the URL, as Grafana does.
        answer = self._request("POST", path, data=params, timeout_s=timeout_s, accept_encoding=accept_encoding,
                               max_bytes=max_bytes)
        elapsed = time.perf_counter() - started
        body = self._success_body(answer, repr(query))
        status, size = answer.status_code, len(answer.content)
        del answer  # the raw bytes are not needed once parsed as JSON
        try:
            res = parse_query_response(query, body, elapsed_s=elapsed, http_status=status, size=size)
        except MalformedAnswer as exc:
            raise self._error(f"malformed answer to {query!r}: {exc}", ErrorKind.MALFORMED,
                              http_status=status) from exc
        self.ledger.add(res)
        return res

    def query(self, expr: str, *, at: float | None = None, stats: bool = False,
              timeout_s: float | None = None, max_bytes: int | None = None) -> QueryResult:
        params: dict[str, Any] = {"query": mark_own_read(expr)}
        if at is not None:
            params["time"] = f"{at:.3f}"
        if stats or self.always_stats:
            params["stats"] = "all"
        return self._api("/api/v1/query", params, expr, timeout_s, max_bytes=max_bytes)

    def query_range(self, expr: str, *, start: float, end: float, step: float, stats: bool = False,
                    timeout_s: float | None = None, accept_encoding: str | None = None,
                    max_bytes: int | None = None) -> QueryResult:
        params: dict[str, Any] = {"query": mark_own_read(expr), "start": f"{start:.3f}", "end": f"{end:.3f}",
                                  "step": f"{step:g}"}
        if stats or self.always_stats:
            params["stats"] = "all"
        return self._api("/api/v1/query_range", params, expr, timeout_s, accept_encoding, max_bytes)

    def _success_body(self, resp: Answer, what: str) -> dict[str, Any]:
        """The JSON body of a successful API answer; anything else raises with the server's reason.

        A 200 whose body is not JSON is MALFORMED; an error status or an error body is HTTP.
        """
        try:
            body = resp.json()
        except UnicodeDecodeError as exc:
            if resp.status_code == 200:
                # JSON is UTF-8 (RFC 8259): an object with a stray byte is not an answer to read.
                raise self._error(f"malformed answer for {what}: body is not valid UTF-8 (byte "
                                  f"0x{resp.content[exc.start]:02x} at offset {exc.start})", ErrorKind.MALFORMED,
                                  http_status=200) from exc
            body = None
        except ValueError:
            body = None
        except RecursionError:
            raise self._error(f"malformed answer for {what}: JSON nested too deeply", ErrorKind.MALFORMED,
                              http_status=resp.status_code) from None
        if resp.status_code == 200 and not isinstance(body, dict):
            first = (resp.text.strip().splitlines() or [""])[0][:80]
            raise self._error(f"malformed answer for {what}: body is not a JSON object: {first!r}",
                              ErrorKind.MALFORMED, http_status=200)
        if resp.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
            # Prometheus says "error"; AMP says "message" (403s). Only the first line: AWS's signature
            # mismatch message goes on to print the canonical request, session token included.
            detail = (body.get("error") or body.get("message")) if isinstance(body, dict) else resp.text
            detail = str(detail).strip().splitlines()[0][:200] if detail else detail
            etype = body.get("errorType") if isinstance(body, dict) else None
            raise self._error(f"HTTP {resp.status_code} for {what}: {detail}", ErrorKind.HTTP,
                              http_status=resp.status_code, error_type=etype if isinstance(etype, str) else None)
        return body

    def _get_list(self, path: str, params: dict[str, Any]) -> list[str]:
        body = self._success_body(self._request("GET", path, params=params), path)
        data = body.get("data") or []
        if not isinstance(data, list):
            raise self._error(f"malformed answer for {path}: 'data' must be a list, got {_describe(data)}",
                              ErrorKind.MALFORMED, http_status=200)
        return [str(v) for v in data]

    def api_get(self, path: str, params: Any = None, *, timeout_s: float | None = None,
                max_bytes: int | None = None) -> Any:
        """The ``data`` of a successful GET on an API path (``/api/v1/status/tsdb``, ``/api/v1/rules``...)."""
        answer = self._request("GET", path, params=params, timeout_s=timeout_s, max_bytes=max_bytes)
        return self._success_body(answer, path).get("data")

    def label_names(self, match: str, *, start: float, end: float) -> list[str]:
        """Label names of the series matching ``match`` in [start, end] (``/api/v1/labels``)."""
        return self._get_list("/api/v1/labels", {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"})

    def label_values(self, label: str, match: str, *, start: float, end: float) -> list[str]:
        """Values of ``label`` among the series matching ``match`` in [start, end]."""
        return self._get_list(f"/api/v1/label/{label}/values",
                              {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"})

    def metadata(self, metric: str | None = None) -> dict[str, list[dict[str, str]]]:
        """``/api/v1/metadata``: per metric name, the types, HELP texts and units its targets declared.

        ``metric`` asks for that metric only; the answer may be empty (no target exposes it, or
        the server keeps no metadata). Every entry is checked: a metric maps to a list of objects.
        """
        params = {"metric": metric} if metric else None
        body = self._success_body(self._request("GET", "/api/v1/metadata", params=params), "metadata")
        data = body.get("data") or {}
        if not isinstance(data, dict):
            raise self._error(f"malformed answer for metadata: 'data' must be an object, got {_describe(data)}",
                              ErrorKind.MALFORMED, http_status=200)
        out: dict[str, list[dict[str, str]]] = {}
        for name, entries in data.items():
            if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
                raise self._error(f"malformed answer for metadata: {name!r} must map to a list of objects, "
                                  f"got {_describe(entries)}", ErrorKind.MALFORMED, http_status=200)
            out[str(name)] = [{k: str(v) for k, v in e.items()} for e in entries]
        return out

    def scalar(self, expr: str, *, at: float | None = None) -> float | None:
        """The single value of an instant query, or None when it returns nothing."""
        res = self.query(expr, at=at)
        if res.scalar is not None:
            return res.scalar
        if not res.series or not res.series[0].points:
            return None
        value = res.series[0].points[0][1]
        return None if math.isnan(value) else value

    def config_text(self) -> str:
        """The config the server has loaded, from ``/api/v1/status/config``."""
        body = self._success_body(self._request("GET", "/api/v1/status/config"), "status/config")
        data = body.get("data")
        if not isinstance(data, dict) or not isinstance(data.get("yaml"), str):
            raise self._error("malformed answer for status/config: no data.yaml", ErrorKind.MALFORMED,
                              http_status=200)
        return data["yaml"]

    def build_info(self) -> dict[str, Any]:
        """``/api/v1/status/buildinfo`` (``version`` among others); AMP does not serve it."""
        body = self._success_body(self._request("GET", "/api/v1/status/buildinfo", timeout_s=10),
                                  "status/buildinfo")
        data = body.get("data") or {}
        if not isinstance(data, dict) or not isinstance(data.get("version"), str):
            raise self._error(f"malformed answer for status/buildinfo: {_describe(data)}", ErrorKind.MALFORMED,
                              http_status=200)
        return data

    def runtime_info(self) -> dict[str, Any]:
        """``/api/v1/status/runtimeinfo`` (``storageRetention`` among others); AMP does not serve it."""
        body = self._success_body(self._request("GET", "/api/v1/status/runtimeinfo"), "status/runtimeinfo")
        data = body.get("data") or {}
        if not isinstance(data, dict):
            raise self._error(f"malformed answer for status/runtimeinfo: {_describe(data)}", ErrorKind.MALFORMED,
                              http_status=200)
        return data

    def reload(self, *, timeout_s: float = 120.0) -> None:
        """``POST /-/reload``; a rejected config comes back as HTTP 500 with the reason."""
        # A reload can block ~60 s while another remote endpoint is down (flush deadline).
        resp = self._request("POST", "/-/reload", timeout_s=timeout_s)
        if resp.status_code != 200:
            raise self._error(f"reload rejected (HTTP {resp.status_code}): "
                              f"{resp.text.strip()[:500]}", ErrorKind.HTTP, http_status=resp.status_code)

    def ready(self) -> bool:
        try:
            return self._request("GET", "/-/ready", timeout_s=5).status_code == 200
        except PrometheusError:
            return False

    def metrics_text(self) -> str:
        """The server's own ``/metrics`` page (remote-write queue health lives there)."""
        resp = self._request("GET", "/metrics", timeout_s=15)
        if resp.status_code != 200:
            raise self._error(f"/metrics: HTTP {resp.status_code}", ErrorKind.HTTP, http_status=resp.status_code)
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
            raise self._error(f"delete_series: HTTP {resp.status_code} {resp.text[:200]}", ErrorKind.HTTP,
                              http_status=resp.status_code)


def _cut_off(raw: Any, cut: threading.Event) -> None:
    """Shut a response's socket for reading: a read blocked on it returns at once."""
    cut.set()
    try:
        raw.shutdown()
    except (ValueError, RuntimeError, OSError):
        pass  # already released or closed: nothing is blocked on it
