"""LatencyProbe against a scripted local HTTP server that checks what it receives."""

from __future__ import annotations

import gzip
import json
import math
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from promshift.adapters.latency_probe import LatencyProbe
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.catalog import LatencyPolicy, LatencyWindow
from promshift.core.errors import ErrorKind
from promshift.core.verdicts import Verdict
from tests.fakes import as_promshift_sent


@dataclass(frozen=True)
class Raw:
    """A reply sent byte for byte: ``body`` in ``pieces`` writes, ``pause_s`` apart (a trickle)."""

    body: bytes
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)
    pieces: int = 1
    pause_s: float = 0.0
    content_length: bool = True


Reply = tuple[int, dict[str, Any]] | Raw


def ok_matrix(warnings: list[str] | None = None) -> Reply:
    body: dict[str, Any] = {"status": "success", "data": {
        "resultType": "matrix",
        "result": [{"metric": {"Hostname": "h1"}, "values": [[60, "1"], [75, "2"]]}],
        "stats": {"timings": {"evalTotalTime": 0.001}, "samples": {"totalQueryableSamples": 1234}}}}
    if warnings:
        body["warnings"] = warnings
    return 200, body


class ScriptedPrometheus:
    """Answers /api/v1/query_range from a script and records every request's form."""

    def __init__(self, script: Callable[[int], Reply], delay_s: float = 0.0, retention: str | None = None,
                 series_at: Callable[[float], int | None] | None = None,
                 behind: Callable[[str], int | None] = lambda query: 16) -> None:
        self.script = script
        self.instant: list[dict[str, str]] = []
        self.behind: list[dict[str, str]] = []
        self.delay_s = delay_s
        self.requests: list[dict[str, str]] = []
        self.encodings: list[str | None] = []
        self.in_flight = self.max_in_flight = 0
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def reply(self, status: int | Raw, body: dict[str, Any] | None = None) -> None:
                if isinstance(status, Raw):
                    self.raw_reply(status)
                    return
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def raw_reply(self, raw: Raw) -> None:
                self.send_response(200)
                for name, value in raw.headers:
                    self.send_header(name, value)
                if raw.content_length:
                    self.send_header("Content-Length", str(len(raw.body)))
                else:
                    self.send_header("Connection", "close")
                self.end_headers()
                size = -(-len(raw.body) // raw.pieces)
                try:
                    for i in range(0, len(raw.body), size):
                        self.wfile.write(raw.body[i:i + size])
                        self.wfile.flush()
                        time.sleep(raw.pause_s)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up: that is what a trickle test expects
                self.close_connection = True

            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                # Like Prometheus when a retention is given; like AMP (no such endpoint) otherwise.
                if self.path == "/ws/api/v1/status/runtimeinfo" and retention is not None:
                    self.reply(200, {"status": "success", "data": {"storageRetention": retention}})
                else:
                    self.reply(404, {"status": "error", "errorType": "not_found", "error": self.path})

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                form = as_promshift_sent(dict(urllib.parse.parse_qsl(
                    self.rfile.read(int(self.headers["Content-Length"])).decode())))
                if self.path == "/ws/api/v1/query" and form["query"].startswith("count(last_over_time("):
                    # How many series a query's selector reads over its window (the evidence behind it).
                    outer.behind.append(form)
                    n = behind(form["query"])
                    result = [] if n is None else [{"metric": {}, "value": [float(form["time"]), str(n)]}]
                    self.reply(200, {"status": "success", "data": {"resultType": "vector", "result": result}})
                    return
                if self.path == "/ws/api/v1/query" and series_at is not None:
                    # The group's series count at an instant: a vector with one sample, or empty.
                    outer.instant.append(form)
                    n = series_at(float(form["time"]))
                    result = [] if n is None else [{"metric": {}, "value": [float(form["time"]), str(n)]}]
                    self.reply(200, {"status": "success", "data": {"resultType": "vector", "result": result}})
                    return
                assert self.path == "/ws/api/v1/query_range", self.path
                with lock:
                    outer.requests.append(form)
                    outer.encodings.append(self.headers.get("Accept-Encoding"))
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                    n = len(outer.requests)
                time.sleep(outer.delay_s)
                with lock:
                    outer.in_flight -= 1
                answer = outer.script(n)
                if isinstance(answer, Raw):
                    self.reply(answer)
                else:
                    self.reply(*answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # A short poll: shutdown() waits for the loop to notice (0.5 s by default, twice per test).
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/ws"

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def servers() -> Iterator[Callable[..., ScriptedPrometheus]]:
    made: list[ScriptedPrometheus] = []

    def make(script: Callable[[int], Reply], delay_s: float = 0.0, retention: str | None = None,
             series_at: Callable[[float], int | None] | None = None,
             behind: Callable[[str], int | None] = lambda query: 16) -> ScriptedPrometheus:
        made.append(ScriptedPrometheus(script, delay_s, retention, series_at, behind))
        return made[-1]

    yield make
    for s in made:
        s.close()


def policy(**kw: Any) -> LatencyPolicy:
    # One round of three pairs, judged at 70 % (three pairs allow at most 75 %): these tests are about
    # what the probe sends and how each run counts; the rounds have tests of their own.
    base = dict(repeats=3, max_rounds=1, confidence=0.7, timeout_s=2.0, max_slowdown_ratio=1.2,
                slowdown_floor_s=0.25, deadline_s=60.0,
                windows=(LatencyWindow("1h", 3600.0, 1.0),), queries=("avg(DCGM_FI_DEV_GPU_UTIL)",))
    base.update(kw)
    return LatencyPolicy(**base)


def probe(src: ScriptedPrometheus, tgt: ScriptedPrometheus, **kw: Any) -> LatencyProbe:
    return LatencyProbe(PrometheusClient(src.url), PrometheusClient(tgt.url), policy(**kw), min_step_s=15,
                        backoff_s=0.01)


def test_requests_are_step_aligned_with_stats_and_warmup_is_discarded(servers: Any) -> None:
    src, tgt = servers(lambda n: ok_matrix()), servers(lambda n: ok_matrix())
    result = probe(src, tgt).run(now=1_000_007.0, queries=["avg(DCGM_FI_DEV_GPU_UTIL)"],
                                 dual_write_since=None).to_dict()
    assert len(src.requests) == len(tgt.requests) == 4  # 1 warm-up + 3 repeats each
    for form in src.requests + tgt.requests:
        step = float(form["step"])
        assert form["stats"] == "all"
        assert float(form["start"]) % step == 0 and float(form["end"]) % step == 0
        assert float(form["end"]) - float(form["start"]) == 3600
        assert 3600 / step < 11_000
    assert len(result["runs"]) == 6
    assert all(r["samples"] == 1234 for r in result["runs"])
    assert result["windows"][0]["verdict"] == "SUCCESSFUL"


def test_throttling_is_retried_with_backoff_and_counted(servers: Any) -> None:
    src = servers(lambda n: ok_matrix())
    tgt = servers(lambda n: (429, {"status": "error", "errorType": "throttled", "error": "slow down"})
                  if n in (2, 3) else ok_matrix())
    result = probe(src, tgt).run(now=1e6, queries=["q"], dual_write_since=None).to_dict()
    assert result["retries"] == 2
    assert result["windows"][0]["verdict"] == "SUCCESSFUL"
    assert len(tgt.requests) == 6


@pytest.mark.parametrize("reply,needle", [
    (lambda n: (422, {"status": "error", "errorType": "execution", "error": "query timed out"}), "HTTP 422"),
    (lambda n: (503, {"status": "error", "errorType": "unavailable", "error": "busy"}), "throttled"),
    (lambda n: ok_matrix(warnings=["partial response: store unavailable"]), "partial data"),
])
def test_422_persistent_throttling_and_partial_data_fail_the_window(servers: Any, reply: Any, needle: str) -> None:
    src, tgt = servers(lambda n: ok_matrix()), servers(reply)
    result = probe(src, tgt).run(now=1e6, queries=["q"], dual_write_since=None).to_dict()
    window = result["windows"][0]
    assert window["verdict"] == "FAILED" and needle in window["outcome"]
    assert result["verdict"] == "FAILED"


def test_client_timeout_is_a_failure_not_a_slow_success(servers: Any) -> None:
    src, tgt = servers(lambda n: ok_matrix()), servers(lambda n: ok_matrix(), delay_s=0.6)
    result = probe(src, tgt, timeout_s=0.3, repeats=1).run(now=1e6, queries=["q"], dual_write_since=None).to_dict()
    assert result["windows"][0]["verdict"] == "FAILED" and "timeout" in result["windows"][0]["outcome"]


def test_source_timeouts_with_target_answering_is_a_win(servers: Any) -> None:
    src, tgt = servers(lambda n: ok_matrix(), delay_s=0.6), servers(lambda n: ok_matrix())
    result = probe(src, tgt, timeout_s=0.3, repeats=2).run(now=1e6, queries=["q"], dual_write_since=None).to_dict()
    w = result["windows"][0]
    assert w["verdict"] == "SUCCESSFUL" and w["source_p50_s"] is None
    assert w["source_failure"] == "timed out" and w["outcome"].startswith("source timed out in 2 of 2 runs")
    # The win stands on the target's series; the source (too slow to answer) is not asked to count.
    assert w["behind"] == [{"query": "q", "source": None, "target": 16.0}] and src.behind == []
    empty_target = servers(lambda n: ok_matrix(), behind=lambda q: None)
    result = probe(src, empty_target, timeout_s=0.3, repeats=2).run(now=1e6, queries=["q"], dual_write_since=None)
    assert result.verdict == Verdict.INCONCLUSIVE
    assert result.windows[0].outcome == ("no data behind this query: 'q' (this group's series behind it: "
                                         "source not counted, target 0)")


def test_window_longer_than_the_dual_write_is_inconclusive(servers: Any) -> None:
    src, tgt = servers(lambda n: ok_matrix()), servers(lambda n: ok_matrix())
    now = 1_000_000.0
    result = probe(src, tgt).run(now=now, queries=["q"], dual_write_since=now - 600).to_dict()
    w = result["windows"][0]
    assert w["verdict"] == "INCONCLUSIVE" and "not comparable" in w["outcome"]


def test_deadline_stops_the_probe_and_leaves_it_inconclusive(servers: Any) -> None:
    src, tgt = servers(lambda n: ok_matrix(), delay_s=0.2), servers(lambda n: ok_matrix(), delay_s=0.2)
    started = time.monotonic()
    result = probe(src, tgt, repeats=50, deadline_s=1.0).run(now=1e6, queries=["q"], dual_write_since=None).to_dict()
    assert time.monotonic() - started < 3
    assert result["windows"][0]["verdict"] == "INCONCLUSIVE"
    assert "deadline" in result["windows"][0]["outcome"]


def test_down_backend_is_an_error_not_a_slow_target() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = PrometheusClient(f"http://127.0.0.1:{port}")
    result = LatencyProbe(client, client, policy(repeats=1), min_step_s=15).run(now=1e6, queries=["q"],
                                                                                  dual_write_since=None).to_dict()
    assert result["verdict"] == "ERROR" and "unreachable" in result["windows"][0]["outcome"]


def test_window_shorter_than_the_step_is_inconclusive_without_querying(servers: Any) -> None:
    src, tgt = servers(lambda n: ok_matrix()), servers(lambda n: ok_matrix())
    result = probe(src, tgt, windows=(LatencyWindow("10s", 10.0, 1.0),)).run(now=1e6, queries=["q"],
                                                                             dual_write_since=None).to_dict()
    assert result["windows"][0]["verdict"] == "INCONCLUSIVE"
    assert "shorter than the step (15s)" in result["windows"][0]["outcome"]
    assert src.requests == [] and tgt.requests == []


def test_probe_asks_for_the_configured_encoding(servers: Any) -> None:
    src, tgt = servers(lambda n: ok_matrix()), servers(lambda n: ok_matrix())
    probe(src, tgt, repeats=1).run(now=1e6, queries=["q"], dual_write_since=None)
    assert src.encodings == tgt.encodings == ["identity", "identity"]
    src2, tgt2 = servers(lambda n: ok_matrix()), servers(lambda n: ok_matrix())
    probe(src2, tgt2, repeats=1, accept_encoding="gzip").run(now=1e6, queries=["q"], dual_write_since=None)
    assert src2.encodings == tgt2.encodings == ["gzip", "gzip"]


@pytest.mark.parametrize("limit", [1, 3])
def test_no_backend_ever_has_more_probe_queries_in_flight_than_the_limit(servers: Any, limit: int) -> None:
    src = servers(lambda n: ok_matrix(), delay_s=0.05)
    tgt = servers(lambda n: ok_matrix(), delay_s=0.05)
    windows = tuple(LatencyWindow(f"{h}h", h * 3600.0, 1.0) for h in (1, 2, 3))
    result = probe(src, tgt, repeats=2, max_concurrency=limit, windows=windows).run(
        now=1e6, queries=["q1", "q2"], dual_write_since=None).to_dict()
    # 3 windows x 2 queries x (2 + 1 warm-up) rounds on each side, all judged.
    assert len(src.requests) == len(tgt.requests) == 18
    assert [w["verdict"] for w in result["windows"]] == ["SUCCESSFUL"] * 3
    assert src.max_in_flight <= limit and tgt.max_in_flight <= limit
    # The limit is used, not just respected: with 6 units of work, 3 workers overlap.
    assert max(src.max_in_flight, tgt.max_in_flight) == limit
    assert result["max_concurrency"] == limit


def test_window_longer_than_a_backends_retention_is_inconclusive_without_querying(servers: Any) -> None:
    # The source reports 2h (Prometheus' runtimeinfo); the target, like AMP, reports nothing,
    # so the catalog's retention (here 5h) stands for it.
    src = servers(lambda n: ok_matrix(), retention="2h or 512MiB")
    tgt = servers(lambda n: ok_matrix())
    windows = (LatencyWindow("1h", 3600.0, 1.0), LatencyWindow("3h", 3 * 3600.0, 1.0),
               LatencyWindow("6h", 6 * 3600.0, 1.0))
    result = probe(src, tgt, repeats=2, confidence=0.5, windows=windows, retention_s=5 * 3600.0).run(
        now=1e6, queries=["q"], dual_write_since=None).to_dict()
    assert result["retention_s"] == {"source": 7200.0, "target": 18000.0}
    by_window = {w["window"]: w for w in result["windows"]}
    assert by_window["1h"]["verdict"] == "SUCCESSFUL"
    assert by_window["3h"]["verdict"] == "INCONCLUSIVE"
    assert by_window["3h"]["outcome"] == ("window of 3h is longer than the retention (source keeps 2h): "
                                          "not measured")
    assert "source keeps 2h; target keeps 5h" in by_window["6h"]["outcome"]
    # Only the 1h window was queried: 1 warm-up + 2 pairs per side.
    assert {float(f["end"]) - float(f["start"]) for f in src.requests + tgt.requests} == {3600.0}
    assert len(src.requests) == len(tgt.requests) == 3
    assert result["verdict"] == "INCONCLUSIVE"


@pytest.mark.parametrize(("lookup", "target_s"), [
    pytest.param((4 * 3600.0, "from the workspace configuration"), 4 * 3600.0, id="workspace-configuration"),
    pytest.param((None, "unavailable (DescribeWorkspaceConfiguration: 404)"), 5 * 3600.0, id="catalog-fallback"),
])
def test_an_amp_targets_retention_comes_from_its_workspace_else_the_catalog(
        servers: Any, caplog: pytest.LogCaptureFixture, lookup: tuple[float | None, str], target_s: float) -> None:
    src = servers(lambda n: ok_matrix(), retention="10h")
    tgt = servers(lambda n: ok_matrix(), retention="1h")  # never asked: the control plane speaks for an AMP target
    calls: list[int] = []

    def workspace_retention() -> tuple[float | None, str]:
        calls.append(1)
        return lookup

    windows = (LatencyWindow("1h", 3600.0, 1.0), LatencyWindow("4h30m", 4.5 * 3600.0, 1.0))
    p = LatencyProbe(PrometheusClient(src.url), PrometheusClient(tgt.url),
                     policy(repeats=2, confidence=0.5, windows=windows, retention_s=5 * 3600.0), min_step_s=15,
                     backoff_s=0.01, target_retention=workspace_retention)
    with caplog.at_level("INFO", logger="promshift.adapters.latency_probe"):
        result = p.run(now=1e6, queries=["q"], dual_write_since=None).to_dict()
    assert calls == [1]
    assert result["retention_s"] == {"source": 36000.0, "target": target_s}
    by_window = {w["window"]: w["verdict"] for w in result["windows"]}
    assert by_window == {"1h": "SUCCESSFUL", "4h30m": "INCONCLUSIVE" if target_s < 4.5 * 3600 else "SUCCESSFUL"}
    if lookup[0] is None:
        assert ("target retention 5h, from the catalog (latency.retention); the backend's: unavailable "
                "(DescribeWorkspaceConfiguration: 404)") in caplog.text


def test_window_before_dual_write_is_comparable_only_where_the_target_holds_the_history(servers: Any) -> None:
    now, since = 1_000_000.0, 1_000_000.0 - 600
    src = servers(lambda n: ok_matrix(), series_at=lambda t: 64)
    backfilled = servers(lambda n: ok_matrix(), series_at=lambda t: 64)
    # An earlier attempt left data an hour back, then nothing until this dual-write: the midpoint shows the gap.
    gap = servers(lambda n: ok_matrix(), series_at=lambda t: 64 if t < now - 3000 or t >= since else None)
    ok = probe(src, backfilled).run(now=now, queries=["q"], dual_write_since=since,
                                    history_selector='{__name__=~"DCGM_FI_DEV_GPU_UTIL"}').to_dict()
    assert ok["windows"][0]["verdict"] == "SUCCESSFUL"
    (at_start, half_way) = (float(f["time"]) for f in backfilled.instant)
    assert backfilled.instant[0]["query"] == 'count({__name__=~"DCGM_FI_DEV_GPU_UTIL"})'
    assert at_start < now - 3600 + 60 and now - 3600 < half_way < since
    holed = probe(src, gap).run(now=now, queries=["q"], dual_write_since=since,
                                history_selector='{__name__=~"DCGM_FI_DEV_GPU_UTIL"}').to_dict()
    w = holed["windows"][0]
    assert w["verdict"] == "INCONCLUSIVE" and "not comparable" in w["outcome"]
    assert "target has 64 of 64 series" in w["outcome"] and "0 of 64 series" in w["outcome"]


# -- the probe's own robustness: malformed answers, trickles, oversized answers ---------------------

def matrix_bytes(result: Any = None, result_type: str = "matrix") -> bytes:
    if result is None:
        result = [{"metric": {"Hostname": "h1"}, "values": [[60, "1"], [75, "2"]]}]
    return json.dumps({"status": "success", "data": {"resultType": result_type, "result": result}}).encode()


MALFORMED = [
    pytest.param(Raw(matrix_bytes([{"metric": {}, "values": [["noon", "1"]]}])),
                 "timestamp is not a number", id="non-numeric-timestamp"),
    pytest.param(Raw(matrix_bytes([{"metric": {}, "values": [[60, "one"]]}])),
                 "value is not a number", id="non-numeric-value"),
    pytest.param(Raw(matrix_bytes([{"metric": {"Hostname": "h1"}}], "vector")),
                 "vector sample without a 'value'", id="vector-without-value"),
    pytest.param(Raw(matrix_bytes({"metric": {}, "values": []})),
                 "'result' of a matrix must be a list", id="result-of-the-wrong-type"),
    pytest.param(Raw(json.dumps({"status": "success", "data": []}).encode()),
                 "'data' must be an object", id="list-where-an-object-belongs"),
    pytest.param(Raw(matrix_bytes([[60, "1"]])), "result[0]: expected an object", id="list-as-a-series"),
    pytest.param(Raw(matrix_bytes([], "histogram")), "unknown resultType", id="unknown-result-type"),
    pytest.param(Raw(b"<html>gateway says hi</html>"), "not a JSON object", id="not-json"),
    pytest.param(Raw(matrix_bytes(), headers=(("Content-Type", "application/json"), ("Content-Encoding", "gzip"))),
                 "body says Content-Encoding gzip but does not decode", id="says-gzip-but-is-not"),
]


@pytest.mark.parametrize("raw,reason", MALFORMED)
def test_a_malformed_answer_is_one_failed_run_with_its_reason_and_the_probe_goes_on(
        servers: Any, raw: Raw, reason: str) -> None:
    src = servers(lambda n: ok_matrix())
    tgt = servers(lambda n: raw if n == 3 else ok_matrix())  # n=1 is the warm-up round
    result = probe(src, tgt).run(now=1e6, queries=["q"], dual_write_since=None).to_dict()
    assert len(tgt.requests) == len(src.requests) == 4  # every round still ran
    failed = [r for r in result["runs"] if not r["ok"]]
    assert len(failed) == 1 and failed[0]["backend"] == "target" and failed[0]["kind"] == "malformed"
    assert reason in failed[0]["error"]
    window = result["windows"][0]
    assert window["verdict"] == "FAILED" and window["outcome"] == "target failed 1 of 3 runs (malformed)"
    assert sum(r["ok"] for r in result["runs"]) == 5


@pytest.mark.parametrize("raw,reason", MALFORMED)
def test_the_client_raises_a_malformed_error_kind(servers: Any, raw: Raw, reason: str) -> None:
    server = servers(lambda n: raw)
    with pytest.raises(PrometheusError) as excinfo:
        PrometheusClient(server.url).query_range("q", start=0, end=60, step=15)
    assert excinfo.value.kind == ErrorKind.MALFORMED and excinfo.value.http_status == 200
    assert reason in str(excinfo.value)


def test_a_real_gzip_answer_is_decoded(servers: Any) -> None:
    body = gzip.compress(matrix_bytes())
    server = servers(lambda n: Raw(body, headers=(("Content-Encoding", "gzip"),)))
    res = PrometheusClient(server.url).query_range("q", start=0, end=60, step=15, accept_encoding="gzip")
    assert res.points == 2 and res.bytes == len(matrix_bytes())


@pytest.mark.parametrize("content_length", [True, False], ids=["content-length", "until-close"])
def test_a_trickled_answer_is_a_timeout_of_the_whole_request(servers: Any, content_length: bool) -> None:
    # A valid answer sent in 18 pieces 0.5 s apart takes 9 s; every socket read returns within
    # requests' per-read timeout, so only a deadline on the whole request catches it.
    server = servers(lambda n: Raw(matrix_bytes(), pieces=18, pause_s=0.5, content_length=content_length))
    started = time.monotonic()
    with pytest.raises(PrometheusError) as excinfo:
        PrometheusClient(server.url, timeout_s=2.0).query_range("q", start=0, end=60, step=15)
    took = time.monotonic() - started
    assert excinfo.value.kind == ErrorKind.TIMEOUT and "timed out after 2s" in str(excinfo.value)
    assert 1.9 < took < 2.8


def test_a_stalled_body_is_cut_at_the_deadline_not_after_another_read_timeout(servers: Any) -> None:
    # Headers and half the body 0.6 s in, then 5 s of silence. requests' per-read timeout (1 s)
    # would end the wait at 1.6 s; the deadline on the whole request ends it at 1 s.
    server = servers(lambda n: Raw(matrix_bytes(), pieces=2, pause_s=5.0), delay_s=0.6)
    started = time.monotonic()
    with pytest.raises(PrometheusError) as excinfo:
        PrometheusClient(server.url, timeout_s=1.0).query_range("q", start=0, end=60, step=15)
    assert excinfo.value.kind == ErrorKind.TIMEOUT
    assert 0.95 < time.monotonic() - started < 1.45


def test_a_trickled_target_answer_is_a_timed_out_run_in_the_probe(servers: Any) -> None:
    src = servers(lambda n: ok_matrix())
    tgt = servers(lambda n: Raw(matrix_bytes(), pieces=10, pause_s=0.1) if n == 2 else ok_matrix())
    result = probe(src, tgt, timeout_s=0.5).run(now=1e6, queries=["q"], dual_write_since=None).to_dict()
    [failed] = [r for r in result["runs"] if not r["ok"]]
    assert failed["kind"] == "timeout" and failed["wall_s"] < 0.9
    assert result["windows"][0]["outcome"] == "target failed 1 of 3 runs (timeout)"


@pytest.mark.parametrize("raw", [
    pytest.param(Raw(matrix_bytes([{"metric": {"i": str(i)}, "values": [[60, "1"]]} for i in range(200)])),
                 id="content-length"),
    pytest.param(Raw(matrix_bytes([{"metric": {"i": str(i)}, "values": [[60, "1"]]} for i in range(200)]),
                     content_length=False, pieces=20), id="streamed-until-close"),
    pytest.param(Raw(gzip.compress(matrix_bytes([{"metric": {"i": str(i)}, "values": [[60, "1"]]}
                                                 for i in range(200)])),
                     headers=(("Content-Encoding", "gzip"),)), id="gzip-small-on-the-wire"),
])
def test_an_answer_over_the_size_limit_is_refused_with_a_clear_error(servers: Any, raw: Raw) -> None:
    server = servers(lambda n: raw)
    with pytest.raises(PrometheusError) as excinfo:
        PrometheusClient(server.url, max_answer_bytes=4096).query_range("q", start=0, end=60, step=15)
    assert excinfo.value.kind == ErrorKind.TOO_LARGE
    assert "over the limit of 4,096 bytes (max_answer_bytes)" in str(excinfo.value)
    # The same answer is fine under a larger limit, per call or per client.
    res = PrometheusClient(server.url).query_range("q", start=0, end=60, step=15, max_bytes=1 << 20)
    assert len(res.series) == 200


def test_the_probe_refuses_answers_over_latency_max_answer_bytes(servers: Any) -> None:
    src, tgt = servers(lambda n: ok_matrix()), servers(lambda n: ok_matrix())
    result = probe(src, tgt, max_answer_bytes=64, repeats=1).run(now=1e6, queries=["q"],
                                                                 dual_write_since=None).to_dict()
    assert {r["kind"] for r in result["runs"]} == {"too large"}
    assert result["windows"][0]["verdict"] == "FAILED"
    assert "answered too much data" not in result["windows"][0]["outcome"]  # target failed: named by kind
    assert result["windows"][0]["outcome"] == "target failed 1 of 1 runs (too large)"


def test_error_messages_never_carry_a_password_from_the_url(servers: Any) -> None:
    server = servers(lambda n: Raw(b"not json"))
    url = server.url.replace("http://", "http://alice:s3cret@")
    with pytest.raises(PrometheusError) as excinfo:
        PrometheusClient(url).query_range("q", start=0, end=60, step=15)
    assert "s3cret" not in str(excinfo.value) and "REDACTED@127.0.0.1" in str(excinfo.value)


# -- latency evidence: judged by what a query read (stats=all), not by what it returned ----------------

def empty(result_type: str = "matrix", samples: int | None = None) -> Reply:
    result: Any = [] if result_type == "matrix" else [1e6, "1"]
    data: dict[str, Any] = {"resultType": result_type, "result": result}
    if samples is not None:
        data["stats"] = {"timings": {"evalTotalTime": 0.001}, "samples": {"totalQueryableSamples": samples}}
    return 200, {"status": "success", "data": data}


@pytest.mark.parametrize("src_reply,tgt_reply,said", [
    (lambda: empty(samples=0), lambda: empty(samples=0), "source: read no samples; target: read no samples"),
    (ok_matrix, lambda: empty(samples=0), "target: read no samples"),
    (lambda: empty("scalar", samples=0), ok_matrix, "source: read no samples"),
])
def test_a_latency_query_that_read_no_samples_is_inconclusive_not_timed_as_a_success(
        servers: Any, src_reply: Any, tgt_reply: Any, said: str) -> None:
    src, tgt = servers(lambda n: src_reply()), servers(lambda n: tgt_reply())
    result = probe(src, tgt).run(now=1e6, queries=["sum(nothing)"], dual_write_since=None).to_dict()
    w = result["windows"][0]
    assert w["verdict"] == "INCONCLUSIVE" and result["verdict"] == "INCONCLUSIVE"
    assert w["outcome"] == f"no data behind this query: 'sum(nothing)' ({said})"
    # Runs that read nothing are not timed as evidence.
    assert (w["target_p50_s"] is None) == (tgt_reply is not ok_matrix)
    assert (w["source_p50_s"] is None) == (src_reply is not ok_matrix)
    assert w["undecided"] is False and len(src.requests) == 4  # no more rounds: more would read nothing too


def test_an_empty_answer_that_read_samples_is_a_real_timing(servers: Any) -> None:
    # count(x == 0) when nothing is zero: no series, but every x was read (stats=all says how many).
    src, tgt = servers(lambda n: empty(samples=5000)), servers(lambda n: empty(samples=5000))
    result = probe(src, tgt).run(now=1e6, queries=["count(DCGM_FI_DEV_GPU_UTIL == 0)"], dual_write_since=None)
    [w] = result.windows
    assert result.verdict == Verdict.SUCCESSFUL and w.outcome == "within SLO"
    assert w.target_p95_s is not None and w.source_p95_s is not None and w.interval is not None
    assert w.interval.pairs == 3 and w.rounds == 1


@pytest.mark.parametrize(("behind_n", "verdict"), [(16, Verdict.SUCCESSFUL), (None, Verdict.INCONCLUSIVE)])
def test_without_stats_the_companion_count_decides_whether_data_stood_behind(
        servers: Any, behind_n: int | None, verdict: Verdict) -> None:
    # A backend that reports no samples (a proxy that drops stats): the group's series behind the query,
    # counted over the window, decide. Empty answers with 16 series behind them are judged.
    src = servers(lambda n: empty(), behind=lambda q: behind_n)
    tgt = servers(lambda n: empty(), behind=lambda q: behind_n)
    result = probe(src, tgt).run(now=1e6, queries=["count(x == 0)"], dual_write_since=None)
    assert result.verdict == verdict
    if verdict == Verdict.INCONCLUSIVE:
        assert result.windows[0].outcome == ("no data behind this query: 'count(x == 0)' (source: no series; "
                                             "target: no series)")


def test_one_query_without_data_leaves_the_window_inconclusive(servers: Any) -> None:
    def script_for(server: ScriptedPrometheus, n: int) -> Reply:
        return empty(samples=0) if server.requests[n - 1]["query"] == "q2" else ok_matrix()

    # The script reads which query asked; both servers answer q2 having read nothing.
    src, tgt = servers(lambda n: script_for(src, n)), servers(lambda n: script_for(tgt, n))
    result = probe(src, tgt, repeats=1).run(now=1e6, queries=["q1", "q2"], dual_write_since=None).to_dict()
    w = result["windows"][0]
    assert w["verdict"] == "INCONCLUSIVE" and "'q2'" in w["outcome"] and "'q1'" not in w["outcome"]


# -- latency evidence: the group's own series behind every query, counted on both sides ------------

@pytest.mark.parametrize("query,src_n,tgt_n", [
    ("sum(DCGM_FI_DEV_POWER_USAGE) or vector(0)", 16, None),
    ("absent(DCGM_FI_DEV_POWER_USAGE)", None, None),
    ("count(DCGM_FI_DEV_POWER_USAGE) or on() vector(0)", None, 16),
])
def test_an_answer_with_nothing_behind_it_is_inconclusive(servers: Any, query: str, src_n: int | None,
                                                          tgt_n: int | None) -> None:
    # Both sides answer a series (vector(0) / absent() always do); the group's series are missing on a side.
    src = servers(lambda n: ok_matrix(), behind=lambda q: src_n)
    tgt = servers(lambda n: ok_matrix(), behind=lambda q: tgt_n)
    result = probe(src, tgt, repeats=1).run(now=1e6, queries=[query], dual_write_since=None)
    [w] = result.windows
    assert result.verdict == Verdict.INCONCLUSIVE and w.verdict == Verdict.INCONCLUSIVE
    assert w.outcome == (f"no data behind this query: {query!r} (this group's series behind it: "
                         f"source {src_n or 0}, target {tgt_n or 0})")
    assert w.behind == {query: (float(src_n or 0), float(tgt_n or 0))}
    # Each side was asked for the query's own selector over the window it read.
    [asked] = {f["query"] for f in src.behind} | {f["query"] for f in tgt.behind}
    assert asked == "count(last_over_time(DCGM_FI_DEV_POWER_USAGE[3600s]))"


def test_the_group_selectors_of_a_query_and_its_look_back_are_what_is_counted(servers: Any) -> None:
    from promshift.adapters.settings import load_catalog

    group = load_catalog().get("gpu-power-thermal")
    src = servers(lambda n: ok_matrix(), behind=lambda q: 16)
    tgt = servers(lambda n: ok_matrix(), behind=lambda q: 16)
    query = "sum(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m])) / sum(DCGM_FI_DEV_GPU_UTIL)"
    result = probe(src, tgt, repeats=2, confidence=0.5).run(now=1e6, queries=[query], dual_write_since=None,
                                                            group=group)
    [w] = result.windows
    assert w.verdict == Verdict.SUCCESSFUL and w.behind == {query: (16.0, 16.0)}
    # Only this group's metric is counted (GPU_UTIL belongs to another group), over window + 5m look-back.
    asked = [(f["query"], float(f["time"])) for f in src.behind + tgt.behind]
    end = math.floor(1e6 / 15) * 15
    assert asked == [("count(last_over_time(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[3900s]))", end)] * 2
    # A query that reads none of the group's metrics has nothing behind it, without asking.
    other = probe(src, tgt, repeats=1).run(now=1e6, queries=["sum(DCGM_FI_DEV_GPU_UTIL)"],
                                           dual_write_since=None, group=group)
    assert other.verdict == Verdict.INCONCLUSIVE and "source 0, target 0" in other.windows[0].outcome
    assert len(src.behind) == len(tgt.behind) == 1


def test_a_failed_count_leaves_the_window_inconclusive(servers: Any) -> None:
    src = servers(lambda n: ok_matrix())
    tgt = servers(lambda n: ok_matrix(), behind=lambda q: 1 // 0)  # the handler fails: no answer
    result = probe(src, tgt, repeats=1).run(now=1e6, queries=["sum(x)"], dual_write_since=None)
    assert result.verdict == Verdict.INCONCLUSIVE
    assert "'sum(x)' (counting the series behind it failed" in result.windows[0].outcome
