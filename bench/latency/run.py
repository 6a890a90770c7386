"""Probe fidelity: does the latency probe's client-side wall time match the server's own query time?

The latency check (``promshift.steps.migration``) times golden queries with
``PrometheusClient.query_range`` and keeps ``QueryResult.elapsed_s``. This benchmark
compares that number with what Prometheus itself reports under ``stats=all``
(``data.stats.timings.execTotalTime`` = queue wait + ``evalTotalTime``; see README.md)
for queries whose server time is at least 100 ms, on the source and on the AMP
stand-in. ``client`` is the probe as the catalog configures it by default
(``latency.accept_encoding: identity``). Two more modes are timed side by side:

- ``gzip``: the same client asking for ``Accept-Encoding: gzip`` (``latency.accept_encoding:
  gzip``, what Grafana asks for) — shows what the server's gzip of the response costs;
- ``curl``: a bare ``requests.post`` (new connection, no promshift code) with
  ``Accept-Encoding: identity``, which is what ``curl`` sends without ``--compressed`` —
  the baseline that shows what the client itself adds.

What it does, on 127.0.0.1 only, in a throwaway state directory:

1. backfills a little history (two DCGM metrics, every node and GPU, the exact label
   sets the live scrape produces) into the source's and the target's TSDB with
   ``promtool tsdb create-blocks-from openmetrics``;
2. starts the local stack (fleet simulator, source, target; 5 s scrapes), adds one
   ``remote_write`` entry that dual-writes those two metrics to the target, and lets
   live data accumulate;
3. per window (query range ending now), runs each query ``--repeats`` + 1 rounds; a
   round runs source/target x client/gzip plus curl on the source, in an order rotated
   by one each round;
   the first round of each query is a warm-up and is discarded;
4. prints tables and writes ``bench/results/latency.json``.

Run: ``.venv/bin/python bench/latency/run.py [--nodes N]`` (about 6 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from promshift.adapters.prometheus import PrometheusClient
from promshift.core.cost import samples_from_stats
from promshift.core.durations import format_duration, parse_duration
from promshift.core.latency import choose_step, percentile
from promshift.core.render import add_remote_write, remote_write_entry
from promshift.local.stack import backfill as backfill_module
from promshift.local.stack.backfill import create_blocks, write_backfill
from promshift.local.stack.local import LocalStack, StackConfig, find_free_ports
from promshift.local.stack.prometheus import PROMETHEUS_BIN

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "bench" / "results" / "latency.json"
GAUGE = "DCGM_FI_DEV_GPU_UTIL"
COUNTER = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
METRICS = (GAUGE, COUNTER)
# Golden-query shapes: two from the catalog (one output series per host, so the answer
# grows with the fleet and the window) and one heavy aggregate with a one-series answer,
# so the cost of encoding the response can be told apart from evaluation.
QUERIES = (
    f"sum by (Hostname) (rate({COUNTER}[5m]))",
    f"avg by (Hostname) ({GAUGE})",
    f"avg(quantile_over_time(0.9, {GAUGE}[1m]))",
)
MAX_LOOKBACK_S = 300.0  # the longest range selector above
BACKENDS = ("source", "target")
MODES = ("client", "gzip", "curl")
# The server's HTTP handler histogram: its _sum grows by exactly one request's handler time
# (engine + JSON encoding + gzip + writing the body) when requests are sent one at a time.
HANDLER_METRIC = "prometheus_http_request_duration_seconds"
HANDLER_LABEL = 'handler="/api/v1/query_range"'
THRESHOLD_S = 0.100  # runs are kept for the overhead figures when the *server* took this long
FIDELITY_PCT = 5.0

_T0 = time.monotonic()


def log(msg: str) -> None:
    """A progress line on stdout, flushed, with the time since start."""
    print(f"[{time.monotonic() - _T0:6.1f}s] {msg}", flush=True)


# ----------------------------------------------------------------------------- machine


def machine_info() -> dict[str, Any]:
    """Cores, RAM, CPU model and the Prometheus version this run used."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    try:
        version = subprocess.run([PROMETHEUS_BIN, "--version"], capture_output=True, text=True,
                                 check=False).stdout.splitlines()[0]
    except (OSError, IndexError):
        version = "unknown"
    return {"cores": os.cpu_count(), "ram_gib": ram_gib, "cpu_model": model, "prometheus": version,
            "python": sys.version.split()[0], "requests": requests.__version__}


# ---------------------------------------------------------------------------- backfill


class _ProgressHandler(logging.Handler):
    """The backfill module's progress lines (``logging``), as this script's own ``log()`` lines."""

    def emit(self, record: logging.LogRecord) -> None:
        log(f"  {record.getMessage()}")


def _show_backfill_progress() -> None:
    logger = logging.getLogger(backfill_module.__name__)
    logger.setLevel(logging.INFO)
    if not any(isinstance(h, _ProgressHandler) for h in logger.handlers):
        logger.addHandler(_ProgressHandler())
    logger.propagate = False


# ------------------------------------------------------------------------------ timing


@dataclass(frozen=True)
class Run:
    """One timed query execution."""

    window: str
    query: int  # index into QUERIES
    rep: int  # 0 = warm-up (discarded)
    backend: str  # source | target
    mode: str  # client | gzip | curl
    wall_s: float
    exec_s: float  # execTotalTime: queue + eval
    eval_s: float  # evalTotalTime (includes queryPreparationTime)
    queue_s: float
    prepare_s: float
    bytes: int  # decoded response body
    samples: float | None  # totalQueryableSamples
    handler_s: float | None  # the server's whole query_range handler time for this request

    @property
    def encode_pct(self) -> float | None:
        """Handler time beyond the engine's (encoding, compression, writing), in % of the engine's."""
        return None if self.handler_s is None else (self.handler_s - self.exec_s) / self.exec_s * 100.0

    @property
    def overhead_vs_handler_pct(self) -> float | None:
        return None if self.handler_s is None else (self.wall_s - self.handler_s) / self.handler_s * 100.0

    @property
    def overhead_s(self) -> float:
        return self.wall_s - self.exec_s

    @property
    def overhead_pct(self) -> float:
        return self.overhead_s / self.exec_s * 100.0

    @property
    def overhead_vs_eval_pct(self) -> float:
        return (self.wall_s - self.eval_s) / self.eval_s * 100.0


def _timings(stats: dict[str, Any]) -> tuple[float, float, float, float]:
    t = stats.get("timings") or {}
    return (float(t["execTotalTime"]), float(t["evalTotalTime"]), float(t.get("execQueueTime", 0.0)),
            float(t.get("queryPreparationTime", 0.0)))


def time_client(client: PrometheusClient, query: str, start: float, end: float, step: float,
                timeout_s: float, accept_encoding: str) -> tuple[float, dict[str, Any], int]:
    """Exactly what the latency probe does: ``query_range(..., stats=True)``, keeping ``elapsed_s``."""
    res = client.query_range(query, start=start, end=end, step=step, stats=True, timeout_s=timeout_s,
                             accept_encoding=accept_encoding)
    return res.elapsed_s, res.stats, res.bytes


def time_curl(base_url: str, query: str, start: float, end: float, step: float,
              timeout_s: float) -> tuple[float, dict[str, Any], int]:
    """A bare ``requests.post`` (a new connection each time, like curl), timed around the call only.

    It asks for an uncompressed answer, as curl does without ``--compressed``.
    """
    data = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}", "stats": "all"}
    headers = {"Accept-Encoding": "identity"}
    t0 = time.perf_counter()
    resp = requests.post(f"{base_url}/api/v1/query_range", data=data, headers=headers, timeout=timeout_s)
    wall = time.perf_counter() - t0
    resp.raise_for_status()
    body = resp.json()
    if body.get("status") != "success":
        raise RuntimeError(f"curl-like query failed: {str(body)[:300]}")
    return wall, body["data"].get("stats") or {}, len(resp.content)


def handler_totals(client: PrometheusClient) -> tuple[float, float]:
    """(sum, count) of the server's ``/api/v1/query_range`` request-duration histogram, from its /metrics."""
    total = count = 0.0
    for line in client.metrics_text().splitlines():
        if line.startswith(HANDLER_METRIC) and HANDLER_LABEL in line:
            name, value = line.split("{", 1)[0], float(line.rsplit(" ", 1)[1])
            if name.endswith("_sum"):
                total = value
            elif name.endswith("_count"):
                count = value
    return total, count


def rotations(items: Sequence[tuple[str, str]], rep: int) -> list[tuple[str, str]]:
    """The (backend, mode) combinations rotated by ``rep``, so no combination always runs first."""
    k = rep % len(items)
    return list(items[k:]) + list(items[:k])


def measure(stack: LocalStack, windows: Sequence[str], repeats: int, timeout_s: float) -> Iterator[Run]:
    """All runs: per window, per query, ``repeats + 1`` rounds of the rotated combinations."""
    clients = {"source": PrometheusClient(stack.source_url, timeout_s=timeout_s),
               "target": PrometheusClient(stack.target_url, timeout_s=timeout_s)}
    bases = {"source": stack.source_url, "target": stack.target_url}
    # Source and target alternate within a round. The curl-like baseline runs on the source only:
    # both sides are the same Prometheus binary, and one side shows what gzip costs.
    combos = [(b, m) for m in MODES[:2] for b in BACKENDS] + [(BACKENDS[0], MODES[2])]
    last = {b: handler_totals(clients[b]) for b in BACKENDS}
    for window in windows:
        window_s = parse_duration(window)
        step = choose_step(window_s)  # the step the latency probe would use
        # One fixed range per window, aligned to the step (as AMP aligns it): every round does the same work.
        end = math.floor(time.time() / step) * step
        start = end - window_s
        for qi, query in enumerate(QUERIES):
            kept: list[Run] = []
            for rep in range(repeats + 1):
                for backend, mode in rotations(combos, rep):
                    if mode == "curl":
                        wall, stats, size = time_curl(bases[backend], query, start, end, step, timeout_s)
                    else:
                        wall, stats, size = time_client(clients[backend], query, start, end, step, timeout_s,
                                                        "identity" if mode == "client" else "gzip")
                    exec_s, eval_s, queue_s, prep_s = _timings(stats)
                    # Read after the timed call, outside it; only this request can have moved the counters.
                    now = handler_totals(clients[backend])
                    handler = now[0] - last[backend][0] if now[1] - last[backend][1] == 1 else None
                    last[backend] = now
                    run = Run(window, qi, rep, backend, mode, wall, exec_s, eval_s, queue_s, prep_s, size,
                              samples_from_stats(stats), handler)
                    if rep:
                        kept.append(run)
                    yield run
            c = [r for r in kept if r.mode == "client"]
            log(f"  {window:>4} q{qi} step {step:g}s: client p50 {statistics.median(r.wall_s for r in c):.3f}s, "
                f"server p50 {statistics.median(r.exec_s for r in c):.3f}s, "
                f"overhead p50 {statistics.median(r.overhead_pct for r in c):.1f} %")


# ------------------------------------------------------------------------------ report


def _med(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _paired_client_minus_curl(runs: Sequence[Run]) -> list[float]:
    """Client overhead minus curl-like overhead (wall - server) of the same query and round (source), in ms.

    Overheads, not walls: the server's own time varies from run to run by more than the
    client could ever add, and subtracting it leaves what happens outside the engine.
    """
    bare = {(r.window, r.query, r.rep, r.backend): r.overhead_s for r in runs if r.mode == "curl"}
    return [(r.overhead_s - bare[key]) * 1000 for r in runs if r.mode == "client"
            and (key := (r.window, r.query, r.rep, r.backend)) in bare]


def summarize(runs: Sequence[Run]) -> dict[str, Any]:
    """Figures for a group of kept (non-warm-up) runs; overheads only over runs with server time >= 100 ms."""
    out: dict[str, Any] = {}
    client = [r for r in runs if r.mode == "client"]
    out["runs"] = len(client)
    out["runs_ge_100ms"] = sum(r.exec_s >= THRESHOLD_S for r in client)
    out["server_p50_s"] = _r(_med([r.exec_s for r in client]))
    for mode in MODES:
        these = [r for r in runs if r.mode == mode]
        heavy = [r for r in these if r.exec_s >= THRESHOLD_S]
        out[f"{mode}_p50_s"] = _r(_med([r.wall_s for r in these]))
        out[f"{mode}_median_overhead_pct"] = _r(_med([r.overhead_pct for r in heavy]), 2)
        out[f"{mode}_median_overhead_ms"] = _r(_med([r.overhead_s * 1000 for r in heavy]), 2)
    heavy_client = [r for r in client if r.exec_s >= THRESHOLD_S]
    out["client_median_overhead_vs_eval_pct"] = _r(_med([r.overhead_vs_eval_pct for r in heavy_client]), 2)
    with_handler = [r for r in heavy_client if r.handler_s is not None]
    out["handler_p50_s"] = _r(_med([r.handler_s for r in client if r.handler_s is not None]))
    out["encode_median_pct"] = _r(_med([r.encode_pct for r in with_handler if r.encode_pct is not None]), 2)
    out["client_median_overhead_vs_handler_pct"] = _r(_med([r.overhead_vs_handler_pct for r in with_handler
                                                            if r.overhead_vs_handler_pct is not None]), 2)
    out["client_median_overhead_vs_handler_ms"] = _r(_med([(r.wall_s - r.handler_s) * 1000 for r in with_handler
                                                           if r.handler_s is not None]), 2)
    heavy_runs = [r for r in runs if r.exec_s >= THRESHOLD_S]
    out["client_minus_curl_overhead_median_ms"] = _r(_med(_paired_client_minus_curl(heavy_runs)), 2)
    return out


def report(runs: Sequence[Run], windows: Sequence[str]) -> dict[str, Any]:
    """Aggregate the kept runs: overall, per window (all, and per backend), per window x query, per query."""
    kept = [r for r in runs if r.rep > 0]
    per_window = []
    for window in windows:
        wk = [r for r in kept if r.window == window]
        entry: dict[str, Any] = {"window": window, **summarize(wk)}
        for backend in BACKENDS:
            entry[backend] = summarize([r for r in wk if r.backend == backend])
        entry["queries"] = [{"query": qi, **summarize([r for r in wk if r.query == qi]),
                             "response_bytes_p50": _med([r.bytes for r in wk if r.query == qi and r.mode == "client"])}
                            for qi in range(len(QUERIES))]
        per_window.append(entry)
    per_query = []
    for qi, query in enumerate(QUERIES):
        qk = [r for r in kept if r.query == qi]
        per_query.append({"query": query, **summarize(qk),
                          "response_bytes_p50": _med([r.bytes for r in qk if r.mode == "client"]),
                          "samples_processed_p50": _med([r.samples for r in qk
                                                         if r.mode == "client" and r.samples is not None])})
    overall = summarize(kept)
    pcts = sorted(r.overhead_pct for r in kept if r.mode == "client" and r.exec_s >= THRESHOLD_S)
    median = overall["client_median_overhead_pct"]
    return {
        "median_overhead_pct": median,
        "median_overhead_ms": overall["client_median_overhead_ms"],
        "median_overhead_vs_eval_pct": overall["client_median_overhead_vs_eval_pct"],
        "median_overhead_vs_handler_pct": overall["client_median_overhead_vs_handler_pct"],
        "median_overhead_vs_handler_ms": overall["client_median_overhead_vs_handler_ms"],
        "median_encode_pct": overall["encode_median_pct"],
        "p95_overhead_pct": _r(percentile(pcts, 95), 2) if pcts else None,
        "share_within_5pct": _r(sum(p <= FIDELITY_PCT for p in pcts) / len(pcts), 3) if pcts else None,
        "within_5pct": None if median is None else median <= FIDELITY_PCT,
        "gzip_median_overhead_pct": overall["gzip_median_overhead_pct"],
        "baseline_curl_median_overhead_pct": overall["curl_median_overhead_pct"],
        "client_minus_curl_overhead_median_ms": overall["client_minus_curl_overhead_median_ms"],
        "runs_ge_100ms": overall["runs_ge_100ms"],
        "runs_total": overall["runs"],
        "overall": overall,
        "windows": per_window,
        "queries": per_query,
    }


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_tables(result: dict[str, Any]) -> None:
    """Per window and backend, then per window and query; overheads in % of the server's time."""
    print("\nper window: p50 seconds; median overhead % = (wall - server) / server over runs with server >= 100 ms;"
          "\nserver = stats execTotalTime (engine), handler = the server's whole query_range handler (engine + JSON"
          "\n+ compression if asked + write); client = the probe (identity), gzip = the probe asking for gzip;"
          "\nclient-curl = paired difference of overheads against a bare identity request (source), ms")
    head = (f"{'window':>6} {'backend':>7} {'client':>7} {'server':>7} {'handler':>7} {'gzip':>7} {'curl':>7} "
            f"{'>=100ms':>7} | {'ovh % client':>12} {'gzip':>6} {'curl':>6} | {'client vs handler %':>19} | "
            f"{'client-curl':>11}")
    print(head + "\n" + "-" * len(head))
    for w in result["windows"]:
        for label in (*BACKENDS, "both"):
            s = w if label == "both" else w[label]
            print(f"{w['window'] if label == BACKENDS[0] else '':>6} {label:>7} {_f(s['client_p50_s'], '.3f'):>7} "
                  f"{_f(s['server_p50_s'], '.3f'):>7} {_f(s['handler_p50_s'], '.3f'):>7} "
                  f"{_f(s['gzip_p50_s'], '.3f'):>7} {_f(s['curl_p50_s'], '.3f'):>7} "
                  f"{s['runs_ge_100ms']:>3}/{s['runs']:<3} | {_f(s['client_median_overhead_pct'], '.2f'):>12} "
                  f"{_f(s['gzip_median_overhead_pct'], '.2f'):>6} {_f(s['curl_median_overhead_pct'], '.2f'):>6} | "
                  f"{_f(s['client_median_overhead_vs_handler_pct'], '.2f'):>19} | "
                  f"{_f(s['client_minus_curl_overhead_median_ms'], '+.2f'):>11}")
    print("\nper window and query (both backends); response = decoded JSON bytes")
    head2 = (f"{'window':>6} {'q':>2} {'response':>10} {'client':>7} {'server':>7} {'>=100ms':>7} | "
             f"{'ovh % client':>12} {'gzip':>6} {'curl':>6} | {'encode %':>8} {'client vs handler %':>19} | "
             f"{'client ms':>9} {'curl ms':>8}")
    print(head2 + "\n" + "-" * len(head2))
    for w in result["windows"]:
        for q in w["queries"]:
            print(f"{w['window']:>6} {q['query']:>2} {_f(q['response_bytes_p50'], ',.0f'):>10} "
                  f"{_f(q['client_p50_s'], '.3f'):>7} {_f(q['server_p50_s'], '.3f'):>7} "
                  f"{q['runs_ge_100ms']:>3}/{q['runs']:<3} | {_f(q['client_median_overhead_pct'], '.2f'):>12} "
                  f"{_f(q['gzip_median_overhead_pct'], '.2f'):>6} {_f(q['curl_median_overhead_pct'], '.2f'):>6} | "
                  f"{_f(q['encode_median_pct'], '.2f'):>8} "
                  f"{_f(q['client_median_overhead_vs_handler_pct'], '.2f'):>19} | "
                  f"{_f(q['client_median_overhead_ms'], '.1f'):>9} {_f(q['curl_median_overhead_ms'], '.1f'):>8}")
    for qi, q in enumerate(result["queries"]):
        print(f"  q{qi}: {q['query']}")
    print(f"\n{result['runs_ge_100ms']}/{result['runs_total']} client runs with server >= 100 ms. Median overhead "
          f"vs stats=all execTotalTime: client {result['median_overhead_pct']} % ({result['median_overhead_ms']} ms), "
          f"probe asking for gzip {result['gzip_median_overhead_pct']} %, "
          f"curl-like identity {result['baseline_curl_median_overhead_pct']} %; p95 {result['p95_overhead_pct']} %; "
          f"share within {FIDELITY_PCT:g} %: {result['share_within_5pct']}; median within {FIDELITY_PCT:g} %: "
          f"{result['within_5pct']}.\nClient vs the server's whole handler: {result['median_overhead_vs_handler_pct']} "
          f"% ({result['median_overhead_vs_handler_ms']} ms). Client minus bare curl-like overhead (paired, source): "
          f"{result['client_minus_curl_overhead_median_ms']} ms.")


def dump(document: dict[str, Any], runs: Sequence[Run]) -> str:
    """The result JSON, indented, with every run on one line of its own so the file stays reviewable."""
    rows = [[round(v, 6) if isinstance(v, float) else v for v in asdict(r).values()] for r in runs]
    head = json.dumps(document, indent=1)
    assert head.endswith("\n}")
    return (head[:-2] + ',\n "runs": {\n  "columns": ' + json.dumps(list(Run.__dataclass_fields__)) +
            ',\n  "rows": [\n   ' + ",\n   ".join(json.dumps(row) for row in rows) + "\n  ]\n }\n}\n")


# -------------------------------------------------------------------------------- main


def wait_for_target(stack: LocalStack, expected: int, deadline_s: float) -> None:
    """Until the target holds live (remote-written) series for every GPU."""
    client = PrometheusClient(stack.target_url, timeout_s=10)
    query = f"count(timestamp({GAUGE}) > time() - 30)"
    deadline = time.monotonic() + deadline_s
    while True:
        got = client.scalar(query) or 0
        if got >= expected:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the target holds {got:.0f}/{expected} live {GAUGE} series; "
                               "remote write is not flowing")
        time.sleep(2)


def _loadavg() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=1000, help="fleet size, 8 GPUs each (default 1000)")
    parser.add_argument("--windows", default="1m,5m,15m,1h", help="query ranges, comma-separated")
    parser.add_argument("--repeats", type=int, default=5, help="kept rounds per query and window (+1 warm-up)")
    parser.add_argument("--history-interval", default="30s", help="sample interval of the backfilled history")
    parser.add_argument("--accumulate", default="20s", help="live data to let in before measuring")
    parser.add_argument("--timeout", default="60s", help="per-query timeout (AMP's is about a minute)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="result JSON (default bench/results/latency.json)")
    parser.add_argument("--keep", action="store_true", help="leave the stack's state directory behind")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.nodes < 1:
        parser.error("--repeats and --nodes must be at least 1")

    # Everything is on 127.0.0.1: a proxy from the environment must not sit in the timed path.
    os.environ["NO_PROXY"] = ",".join(p for p in ("127.0.0.1", "localhost", os.environ.get("NO_PROXY")) if p)
    windows = [w.strip() for w in args.windows.split(",") if w.strip()]
    history_interval = parse_duration(args.history_interval)
    accumulate = parse_duration(args.accumulate)
    timeout = parse_duration(args.timeout)
    # History reaches back over the longest window plus the longest lookback, with slack for
    # the minutes the stack start and the measurements themselves take.
    history_s = max(parse_duration(w) for w in windows) + MAX_LOOKBACK_S + 600.0
    started_at = datetime.now(UTC)
    machine = machine_info()
    machine["loadavg_start"] = _loadavg()
    log(f"machine: {machine['cores']} cores, {machine['ram_gib']} GiB, {machine['cpu_model']}; "
        f"{machine['prometheus']}; load {machine['loadavg_start']}")

    home = Path(tempfile.mkdtemp(prefix="promshift-bench-latency-"))
    fleet_port, source_port, target_port = find_free_ports(3)
    config = StackConfig(home=home, nodes=args.nodes, fleet_port=fleet_port, source_port=source_port,
                         target_port=target_port, scrape_interval="5s")
    stack = LocalStack(config)
    fleet = stack.fleet
    try:
        end = math.floor(time.time() / history_interval) * history_interval
        start = end - history_s
        log(f"backfill: {len(METRICS)} metrics x {fleet.nodes * fleet.gpus_per_node} GPUs, "
            f"{format_duration(history_s)} at {args.history_interval} -> {home}")
        _show_backfill_progress()
        backfill = write_backfill(fleet, home / "backfill", start, end, history_interval, METRICS)
        log(f"backfill: {backfill.samples_per_side:,} samples per side "
            f"({backfill.bytes_per_side / 1e6:.0f} MB of OpenMetrics); running promtool")
        create_blocks(backfill.files, {side: stack.data_dir(side) for side in backfill.files})
        shutil.rmtree(home / "backfill", ignore_errors=True)
        log("backfill: blocks written; starting the stack")

        stack.up(timeout=300)
        log(f"stack up: source {stack.source_url}, target {stack.target_url}")
        entry = remote_write_entry(group_name="bench-latency", name_regex="|".join(METRICS),
                                   url=stack.target_remote_write_url)
        stack.source_config_path.write_text(add_remote_write(stack.source_config_path.read_text(), entry))
        PrometheusClient(stack.source_url).reload()
        t_acc = time.monotonic()
        log(f"dual-writing {', '.join(METRICS)} to the target; letting {args.accumulate} of live data in")
        wait_for_target(stack, fleet.nodes * fleet.gpus_per_node, 120)
        while (left := accumulate - (time.monotonic() - t_acc)) > 0:
            log(f"  accumulating, {left:.0f}s left")
            time.sleep(min(15.0, left))

        log(f"measuring: windows {', '.join(windows)}; {len(QUERIES)} queries; {args.repeats} kept rounds + 1 warm-up; "
            "a round = source/target x client/gzip + source curl")
        runs = list(measure(stack, windows, args.repeats, timeout))
    finally:
        log("stopping the stack")
        stack.down()
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)

    machine["loadavg_end"] = _loadavg()
    result = report(runs, windows)
    print_tables(result)
    document = {
        "benchmark": "probe fidelity: PrometheusClient.query_range elapsed_s vs Prometheus stats=all server time",
        "date": started_at.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - _T0, 1),
        "command": " ".join([".venv/bin/python bench/latency/run.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine,
        "server_time": "data.stats.timings.execTotalTime (execQueueTime + evalTotalTime; evalTotalTime "
                       "already includes queryPreparationTime)",
        "overhead": "(wall - server) / server, median over runs whose server time >= threshold_s",
        "threshold_s": THRESHOLD_S,
        **{k: v for k, v in result.items() if k not in ("windows", "queries")},
        "by_query": [{"query": q["query"], "response_bytes_p50": q["response_bytes_p50"],
                      "median_overhead_pct": q["client_median_overhead_pct"],
                      "median_overhead_vs_handler_pct": q["client_median_overhead_vs_handler_pct"],
                      "gzip_median_overhead_pct": q["gzip_median_overhead_pct"],
                      "curl_median_overhead_pct": q["curl_median_overhead_pct"]} for q in result["queries"]],
        "parameters": {
            "nodes": args.nodes, "gpus": fleet.nodes * fleet.gpus_per_node, "scrape_interval": config.scrape_interval,
            "windows": windows, "step_s": {w: choose_step(parse_duration(w)) for w in windows},
            "repeats": args.repeats, "warmup_rounds_discarded": 1, "queries": list(QUERIES),
            "modes": {"client": "PrometheusClient.query_range(stats=True, accept_encoding='identity').elapsed_s "
                                "(keep-alive session): the latency probe with the catalog default",
                      "gzip": "the same with Accept-Encoding: gzip (latency.accept_encoding: gzip, as Grafana)",
                      "curl": "requests.post, new connection, Accept-Encoding: identity (curl without --compressed); "
                              "source only"},
            "order": "per round: source/target x client/gzip, then source curl; rotated by one each round",
            "history": format_duration(history_s), "history_interval": args.history_interval,
            "backfilled_metrics": list(METRICS), "backfilled_series_per_side": backfill.series_per_side,
            "backfilled_samples_per_side": backfill.samples_per_side, "accumulate": args.accumulate,
            "timeout": args.timeout,
        },
        "windows": result["windows"],
        "queries": result["queries"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dump(document, runs))
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
