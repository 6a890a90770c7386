"""What the local front door and the local control plane share: SigV4 checks, counters, AWS-style answers.

Both are small ``ThreadingHTTPServer`` s on 127.0.0.1 that check every request's SigV4
signature with :func:`promshift.local.stack.sigv4.verify_request` against the one credential pair
they were started with (from the standard ``AWS_*`` environment variables of their process),
count what they verified and refused, and serve two unsigned local-only paths:
``GET /-/healthy`` and ``GET /-/sigv4-stats``.

They never log a header, a secret, a session token or a signature: a refusal is logged as
its reason, method and path (without the query).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import urllib3

from promshift.local.stack.sigv4 import SERVICE, AwsCredentials, Verdict, verify_request

logger = logging.getLogger(__name__)

HEALTH_PATH = "/-/healthy"
STATS_PATH = "/-/sigv4-stats"
# Hop-by-hop and signing headers are never passed on to the server behind.
_NOT_FORWARDED = frozenset(
    {"host", "connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization",
     "proxy-connection", "content-length", "authorization", "x-amz-date", "x-amz-security-token",
     "x-amz-content-sha256"}
)


def credentials_from_env(environ: Mapping[str, str] | None = None) -> AwsCredentials:
    """The pair in ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (+ ``AWS_SESSION_TOKEN``); exits if unset."""
    env = os.environ if environ is None else environ
    access_key, secret_key = env.get("AWS_ACCESS_KEY_ID", ""), env.get("AWS_SECRET_ACCESS_KEY", "")
    if not access_key or not secret_key:
        raise SystemExit("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set for a local AWS endpoint")
    return AwsCredentials(access_key, secret_key, env.get("AWS_SESSION_TOKEN") or None)


@dataclass(frozen=True)
class Forwarded:
    """What the server behind answered: status, headers and the body as sent (still encoded)."""

    status: int
    headers: dict[str, str]
    data: bytes


class SigV4Stats:
    """Thread-safe counters of verified and refused requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._verified: Counter[str] = Counter()
        self._rejected: Counter[str] = Counter()

    def record(self, verdict: Verdict, kind: str) -> None:
        """Count one checked request; ``kind`` names what it asked for (``query``, ``remote_write``, an operation)."""
        with self._lock:
            if verdict.ok:
                self._verified[kind] += 1
            else:
                self._rejected[verdict.reason or "unknown"] += 1

    def snapshot(self) -> dict[str, Any]:
        """``{"verified": N, "rejected": N, "rejected_by_reason": {...}, "verified_by_kind": {...}}``."""
        with self._lock:
            return {
                "verified": sum(self._verified.values()),
                "rejected": sum(self._rejected.values()),
                "rejected_by_reason": dict(sorted(self._rejected.items())),
                "verified_by_kind": dict(sorted(self._verified.items())),
            }


class SigV4Server(ThreadingHTTPServer):
    """A threaded server that carries the pair, region and counters its handlers check against."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, handler: type[BaseHTTPRequestHandler], *, credentials: AwsCredentials,
                 region: str, service: str = SERVICE, state_dir: Path | None = None) -> None:
        super().__init__(("127.0.0.1", port), handler)
        self.credentials = credentials
        self.region = region
        self.service = service
        self.state_dir = state_dir
        self.stats = SigV4Stats()
        self.http = urllib3.PoolManager(maxsize=16, retries=False, timeout=urllib3.Timeout(connect=5, read=120))

    def faults(self) -> dict[str, Any]:
        """Injected faults from ``<state-dir>/faults.json`` (re-read per request); empty when there is none.

        ``{"errors": {"<Operation>": "<ErrorCode>"}, "workspace_status": {"<ws-id>": "<status>"},
        "clock_skew_s": <seconds added to this server's clock>}``.
        """
        if self.state_dir is None:
            return {}
        try:
            document = json.loads((self.state_dir / "faults.json").read_text())
        except (OSError, ValueError):
            return {}
        return document if isinstance(document, dict) else {}

    def now(self) -> datetime:
        """This server's clock, shifted by an injected ``clock_skew_s``."""
        skew = self.faults().get("clock_skew_s") or 0
        return datetime.now(UTC) + timedelta(seconds=float(skew))


class SigV4Handler(BaseHTTPRequestHandler):
    """Reads a request whole, answers the unsigned local paths, checks the signature of everything else."""

    server: SigV4Server
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without TCP_NODELAY, Nagle + delayed ACK add ~40 ms per answer.
    disable_nagle_algorithm = True
    server_version = "promshift-local-aws"
    component: ClassVar[str] = "local-aws"

    # -- plumbing ------------------------------------------------------------------------

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        """Silence the per-request access log: it would print full URLs for every write."""

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def send_body(self, status: int, body: bytes, headers: Mapping[str, str] | None = None,
                  content_type: str = "application/json") -> None:
        """Answer with ``body`` and a Content-Length (the connection may be kept alive)."""
        self.send_response(status)
        sent = {key.lower() for key in (headers or {})}
        if "content-type" not in sent:
            self.send_header("Content-Type", content_type)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status: int, document: Any, headers: Mapping[str, str] | None = None) -> None:
        """Answer with a JSON document."""
        self.send_body(status, json.dumps(document).encode(), headers)

    def send_aws_error(self, status: int, error_type: str, message: str, **fields: Any) -> None:
        """An AWS-style JSON error: ``x-amzn-ErrorType`` header and ``{"message": ...}`` body."""
        self.send_json(status, {"message": message, **fields}, {"x-amzn-ErrorType": error_type})

    def forward(self, url: str, method: str, body: bytes, extra_headers: Mapping[str, str] | None = None,
                keep_signing_headers: bool = False) -> Forwarded:
        """Send the request on to ``url`` (without hop-by-hop headers, and without signing headers unless asked)."""
        headers = {
            key: value
            for key, value in self.headers.items()
            if key.lower() not in _NOT_FORWARDED
            or (keep_signing_headers and key.lower() in {"authorization", "x-amz-date", "x-amz-security-token",
                                                         "x-amz-content-sha256"})
        }
        headers.update(extra_headers or {})
        response = self.server.http.request(method, url, body=body or None, headers=headers, preload_content=False,
                                            redirect=False)
        try:
            # Raw bytes: a gzip-encoded answer is passed on as it came, with its Content-Encoding.
            raw = response.read(decode_content=False)
        finally:
            response.release_conn()
        return Forwarded(response.status, dict(response.headers.items()), raw)

    # -- dispatch ------------------------------------------------------------------------

    def _handle(self) -> None:
        path, _, query = self.path.partition("?")
        body = self._read_body()
        if self.command == "GET" and path == HEALTH_PATH:
            self.send_body(200, b"OK\n", content_type="text/plain")
            return
        if self.command == "GET" and path == STATS_PATH:
            self.send_json(200, self.server.stats.snapshot())
            return
        verdict = verify_request(
            self.command, path, query, dict(self.headers.items()), body,
            expected=self.server.credentials, region=self.server.region, service=self.expected_service(),
            now=self.server.now(),
        )
        kind = self.kind(path)
        self.server.stats.record(verdict, kind)
        if not verdict.ok:
            logger.warning("%s refused %s %s: %s", self.component, self.command, path, verdict.reason)
            self.refuse(verdict)
            return
        try:
            self.serve_verified(path, query, body)
        except urllib3.exceptions.HTTPError as exc:
            logger.error("%s: the server behind failed for %s %s: %s", self.component, self.command, path,
                         type(exc).__name__)
            self.send_aws_error(502, "InternalServerException", f"upstream unavailable ({type(exc).__name__})")
        except Exception as exc:  # an answer, not a dropped connection; the log names the type only
            logger.error("%s failed on %s %s: %s", self.component, self.command, path, type(exc).__name__)
            self.send_aws_error(500, "InternalServerException", f"internal error ({type(exc).__name__})")

    def refuse(self, verdict: Verdict) -> None:
        """Answer a refused signature (403, AWS-style)."""
        self.send_aws_error(403, verdict.error_type, verdict.message)

    def kind(self, path: str) -> str:
        """What a request asks for, as a counter key."""
        return "request"

    def expected_service(self) -> str:
        """The service the request's signature must be scoped to (the server's, unless a handler serves more)."""
        return self.server.service

    def serve_verified(self, path: str, query: str, body: bytes) -> None:
        """Answer a request whose signature passed."""
        raise NotImplementedError

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle
