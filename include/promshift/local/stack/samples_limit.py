"""A per-query samples limit in front of a Prometheus, counted as AMP counts it: samples read in total.

Prometheus' own ``--query.max-samples`` counts the samples one query holds in memory *at once*: a
``sum_over_time(x[1h])`` over 16,000 series reads 1.9M samples but holds one series' at a time, so
Prometheus answers it; AMP limits and bills the samples a query *processes* ("query samples processed",
``max_samples_processed_error_threshold`` in the AMP API reference; per-query samples in ``AMP_quotas``) and
refuses such a query. This proxy makes a local Prometheus refuse the same way: it asks every
``/api/v1/query`` and ``/api/v1/query_range`` with ``stats=all`` and answers HTTP 422 with Prometheus'
refusal text (``query processing would load too many samples into memory in query execution``, which AMP
passes on) when ``totalQueryableSamples`` is over the limit. Every other path is forwarded as is.

Where it still differs from AMP: the query has run on the backend before it is refused (AMP refuses during
evaluation), so a refused query costs the backend its time; the stats are Prometheus' count.
(The strict local AMP's front door enforces AMP's query limits for ``TARGET=amp``; this is the plain-Prometheus
target's stand-in used by the parity tests and ``bench/parity_limits``.)
"""

from __future__ import annotations

import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

REFUSAL = "query processing would load too many samples into memory in query execution"
_TOTAL = re.compile(rb'"totalQueryableSamples"\s*:\s*(\d+)')
_QUERY_PATHS = ("/api/v1/query", "/api/v1/query_range")


class SamplesLimitProxy:
    """``http://127.0.0.1:<port>`` in front of ``upstream``: queries over ``max_samples`` in total answer 422."""

    def __init__(self, upstream: str, max_samples: int, *, port: int = 0) -> None:
        if max_samples <= 0:
            raise ValueError(f"max_samples must be > 0, got {max_samples}")
        self.upstream, self.max_samples = upstream.rstrip("/"), max_samples
        self.refused = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                proxy._forward(self, "GET")

            def do_POST(self) -> None:  # noqa: N802
                proxy._forward(self, "POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._session = requests.Session()
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _forward(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        parsed = urllib.parse.urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        params = urllib.parse.parse_qsl(parsed.query, keep_blank_values=True)
        form = urllib.parse.parse_qsl(body.decode(), keep_blank_values=True) if body else []
        counted = parsed.path in _QUERY_PATHS
        if counted:
            params = [(k, v) for k, v in params if k != "stats"]
            form = [*[(k, v) for k, v in form if k != "stats"], ("stats", "all")]
        headers = {"Content-Type": "application/x-www-form-urlencoded"} if form else {}
        resp = self._session.request(method if not counted else "POST", self.upstream + parsed.path, params=params,
                                     data=urllib.parse.urlencode(form) if form else body or None, headers=headers,
                                     timeout=600)
        content = resp.content
        if counted and resp.status_code == 200:
            found = _TOTAL.search(content)
            if found and int(found.group(1)) > self.max_samples:
                with self._lock:
                    self.refused += 1
                content = (b'{"status":"error","errorType":"execution","error":"' + REFUSAL.encode() + b'"}')
                self._reply(handler, 422, content)
                return
        self._reply(handler, resp.status_code, content, resp.headers.get("Content-Type"))

    @staticmethod
    def _reply(handler: BaseHTTPRequestHandler, status: int, content: bytes,
               content_type: str | None = "application/json") -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type or "application/json")
        handler.send_header("Content-Length", str(len(content)))
        handler.end_headers()
        handler.wfile.write(content)
