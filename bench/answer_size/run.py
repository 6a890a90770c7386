"""Peak RSS of one query whose answer is large: PrometheusClient.query_range against a scripted server.

    .venv/bin/python bench/answer_size/run.py --mb 64 [--max-answer-mib 64]

The server runs in a child process (its memory is not counted); the client process reports
its peak RSS (ru_maxrss) and the RSS it had before the query, so the difference is what the
answer cost. The answer is a Prometheus matrix of ~``--mb`` MB (decimal), sent with a
Content-Length, the way a Prometheus answers an uncompressed query_range.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def matrix_body(target_bytes: int) -> bytes:
    points = [[1_700_000_000 + 15 * i, f"{i % 997}.125"] for i in range(1000)]
    one = {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "gpu-node-0000", "gpu": "0"}, "values": points}
    per_series = len(json.dumps(one)) + 1
    series = [dict(one, metric=dict(one["metric"], Hostname=f"gpu-node-{i:04d}")) for i in
              range(max(1, target_bytes // per_series))]
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": series}}).encode()


def serve(target_bytes: int, port_out: Any) -> None:
    body = matrix_body(target_bytes)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server API)
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for i in range(0, len(body), 1 << 20):
                self.wfile.write(body[i:i + (1 << 20)])

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port_out.put((server.server_address[1], len(body)))
    server.serve_forever()


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=float, default=64.0, help="answer size in MB (10^6 bytes)")
    parser.add_argument("--max-answer-mib", type=float, default=None, help="client cap (default: the client's)")
    args = parser.parse_args()
    ports: Any = multiprocessing.Queue()
    # The server builds the answer in its own process: the client's peak RSS is the query's alone.
    server = multiprocessing.Process(target=serve, args=(int(args.mb * 1e6), ports), daemon=True)
    server.start()
    port, size = ports.get(timeout=60)
    from promshift.adapters.prometheus import PrometheusClient, PrometheusError

    kwargs: dict[str, Any] = {}
    if args.max_answer_mib is not None:
        kwargs["max_answer_bytes"] = int(args.max_answer_mib * 2**20)
    client = PrometheusClient(f"http://127.0.0.1:{port}", timeout_s=120, **kwargs)
    before = rss_kib()
    started = time.perf_counter()
    try:
        res = client.query_range("q", start=0, end=1, step=1)
        outcome = f"parsed {len(res.series)} series, {res.points} points"
    except PrometheusError as exc:
        outcome = f"refused: {exc}"
    wall = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"answer_bytes": size, "outcome": outcome, "wall_s": round(wall, 2),
                      "rss_before_mib": round(before / 1024, 1), "peak_rss_mib": round(peak / 1024, 1),
                      "peak_minus_before_mib": round((peak - before) / 1024, 1)}))
    server.terminate()


if __name__ == "__main__":
    main()
