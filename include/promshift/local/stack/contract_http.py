"""What the local API *contract* servers (``stack.grafana_api``, ``stack.k8s_api``) share.

Each is a small ``ThreadingHTTPServer`` on 127.0.0.1 run in a daemon thread: ``ContractServer`` is
its life cycle (``base_url``, ``start``/``stop``, a context manager) and ``ContractHandler`` the
request boilerplate (the body read whole, a JSON answer recorded in ``requests`` as (method, path,
code), never a header). Each server keeps its own routes, checks and error bodies.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Self


class ContractServer:
    """A contract server's life cycle; a subclass sets ``name`` and ``log`` and builds its handler in ``_handler``."""

    name: ClassVar[str]  # the serving thread's name and the prefix of its request log
    log: ClassVar[logging.Logger]

    def __init__(self, host: str, port: int) -> None:
        self.requests: list[tuple[str, str, int]] = []  # (method, path, code) of every answer
        self._httpd = ThreadingHTTPServer((host, port), self._handler())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ContractHandler(BaseHTTPRequestHandler):
    """A contract server's request handler: a subclass sets ``contract`` and its ``do_*`` methods."""

    protocol_version = "HTTP/1.1"
    contract: ClassVar[ContractServer]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        self.contract.log.debug("%s %s", self.contract.name, format % args)

    def route_path(self) -> str:
        """The request's path without its query: what is routed on and recorded."""
        return self.path.split("?")[0]

    def read_body(self) -> bytes:
        """The request body, read whole (``Content-Length``; empty without one)."""
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def answer(self, code: int, body: Any) -> None:
        """Send ``body`` as JSON with ``code`` and record (method, path, code) in the server's ``requests``."""
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.contract.requests.append((self.command, self.route_path(), code))
