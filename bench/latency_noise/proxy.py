"""A Prometheus HTTP API proxy on 127.0.0.1 that answers ``--slowdown`` times the upstream's time later.

It forwards each request (path, query string, form body, Accept-Encoding) to ``--upstream``, times the
upstream's answer, sleeps ``(slowdown - 1) x`` that time, then sends the answer as received. With
``--slowdown 1`` it is a plain pass-through, so two such proxies in front of one Prometheus are two
identical backends; with ``--slowdown 1.5`` the target is 1.5x slower than its upstream, however
busy the machine is (the delay scales with the upstream's own time).

Run: ``python bench/latency_noise/proxy.py --upstream http://127.0.0.1:9090 --port 31411 [--slowdown 1.5]``
"""

from __future__ import annotations

import argparse
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests


def serve(upstream: str, port: int, slowdown: float) -> None:
    session = requests.Session()
    session.trust_env = False  # 127.0.0.1 only

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def forward(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() in ("content-type", "accept-encoding", "accept")}
            started = time.perf_counter()
            answer = session.request(method, upstream + self.path, data=body, headers=headers, timeout=120,
                                     stream=True)
            content = answer.raw.read(decode_content=False)
            took = time.perf_counter() - started
            if slowdown > 1:
                time.sleep((slowdown - 1) * took)
            self.send_response(answer.status_code)
            for name in ("Content-Type", "Content-Encoding"):
                if name in answer.headers:
                    self.send_header(name, answer.headers[name])
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            self.forward("GET")

        def do_POST(self) -> None:  # noqa: N802 (http.server API)
            self.forward("POST")

        def log_message(self, *args: Any) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--slowdown", type=float, default=1.0)
    args = parser.parse_args()
    serve(args.upstream.rstrip("/"), args.port, args.slowdown)


if __name__ == "__main__":
    main()
