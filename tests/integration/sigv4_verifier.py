"""A SigV4-checking HTTP server on 127.0.0.1 for tests, on the local stack's own verifier.

It knows a set of credential pairs (access key -> secret, session token) and checks each request
with ``promshift.local.stack.sigv4.verify_request`` (the front door's check: botocore recomputes the
signature from what arrived) against the pair its access key names; it refuses a mismatch, an
unknown key, a wrong region or service with HTTP 403 and an AMP-style ``{"message": ...}`` body.
Verified requests under ``/workspaces/<id>`` are forwarded to a real upstream Prometheus, so
answers are real. Unlike the stack's front door it can hold several pairs and rotate them, which
the credential-refresh tests need.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests

from promshift.local.stack.sigv4 import AwsCredentials, parse_authorization, verify_request

# A pair no request can name (its key id is not a valid one): an unknown key is refused as AWS refuses it.
_NOBODY = AwsCredentials("(no such access key)", "(none)")


@dataclass
class SigV4Verifier:
    """Counts and keeps what it verified (access keys used) and why it refused the rest (stack reasons)."""

    upstream: str
    region: str = "us-east-1"
    service: str = "aps"
    keys: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    verified_keys: list[str] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)
    bodies: list[bytes] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    def check(self, method: str, path: str, headers: Any, body: bytes) -> str | None:
        """Why the request is refused (a ``local.stack.sigv4`` reason; its message in ``messages``), or None."""
        auth = parse_authorization(headers.get("Authorization") or "")
        pair = self.keys.get(auth.access_key) if auth else None
        expected = AwsCredentials(auth.access_key, pair[0], pair[1]) if auth and pair else _NOBODY
        raw_path, _, query = path.partition("?")
        verdict = verify_request(method, raw_path, query, dict(headers.items()), body, expected=expected,
                                 region=self.region, now=datetime.now(UTC), service=self.service)
        if not verdict.ok:
            self.messages.append(verdict.message)
            return verdict.reason
        self.verified_keys.append(str(verdict.access_key))
        return None


def _handler(verifier: SigV4Verifier) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet, and never headers
            pass

        def _answer(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _handle(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            problem = verifier.check(self.command, self.path, self.headers, body)
            if problem:
                verifier.rejected[problem] += 1
                self._answer(403, json.dumps({"message": verifier.messages[-1]}).encode())
                return
            verifier.bodies.append(body)
            rest = re.sub(r"^/workspaces/[^/]+", "", self.path)
            resp = requests.request(self.command, verifier.upstream + rest, data=body or None, timeout=30,
                                    headers={"Content-Type": self.headers.get("Content-Type") or ""})
            self._answer(resp.status_code, resp.content, resp.headers.get("Content-Type", "application/json"))

        do_GET = _handle
        do_POST = _handle

    return Handler


class VerifyingServer:
    """Runs a SigV4Verifier on a free 127.0.0.1 port in a thread; ``url`` is a workspace-style base."""

    def __init__(self, verifier: SigV4Verifier, workspace_id: str = "ws-test") -> None:
        self.verifier = verifier
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(verifier))
        self.port = int(self.httpd.server_address[1])
        self.workspace_id = workspace_id
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        """As DescribeWorkspace gives it: ``.../workspaces/<id>/``."""
        return f"http://127.0.0.1:{self.port}/workspaces/{self.workspace_id}/"

    def __enter__(self) -> VerifyingServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
