"""A SigV4-checking HTTP server on 127.0.0.1 for tests: recomputes each signature with botocore.

It knows a set of credential pairs (access key -> secret, session token), recomputes every
request's signature from what arrived (method, Host, path, query, signed headers, body) and
refuses a mismatch, an unknown key, a wrong region or service with HTTP 403 and an AMP-style
``{"message": ...}`` body. Verified requests under ``/workspaces/<id>`` are forwarded to a real
upstream Prometheus, so answers are real. The full local front door is the stack's (amp-local);
this is the test-side check of what the client sends.
"""

from __future__ import annotations

import hmac
import json
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

AUTH_RE = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
                     r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})")


@dataclass
class SigV4Verifier:
    """Counts and keeps what it verified (access keys used) and why it refused the rest."""

    upstream: str
    region: str = "us-east-1"
    service: str = "aps"
    keys: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    verified_keys: list[str] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)
    bodies: list[bytes] = field(default_factory=list)

    def check(self, method: str, path: str, headers: Any, body: bytes) -> str | None:
        """Why the request's signature is refused, or None when it verifies."""
        match = AUTH_RE.fullmatch(headers.get("Authorization") or "")
        if not match:
            return "missing or malformed Authorization"
        key, date, region, service, signed, signature = match.groups()
        if (region, service) != (self.region, self.service):
            return f"wrong scope {region}/{service}"
        if key not in self.keys:
            return "unknown access key"
        secret, token = self.keys[key]
        if (headers.get("X-Amz-Security-Token") or None) != token:
            return "wrong session token"
        amz_date = headers.get("X-Amz-Date") or ""
        if amz_date[:8] != date:
            return "date does not match the credential scope"
        names = signed.split(";")
        if "host" not in names or "x-amz-date" not in names:
            return "host and x-amz-date must be signed"
        request = AWSRequest(method=method, url=f"http://{headers['Host']}{path}", data=body,
                             headers={n: headers[n] for n in names if n != "host" and headers.get(n) is not None})
        request.context["timestamp"] = amz_date
        signer = SigV4Auth(Credentials(key, secret, token), service, region)
        if signer.signed_headers(signer.headers_to_sign(request)) != signed:
            return "signed headers missing from the request"
        expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
        if not hmac.compare_digest(expected, signature):
            return "signature mismatch"
        self.verified_keys.append(key)
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
                self._answer(403, json.dumps({"message": problem}).encode())
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
