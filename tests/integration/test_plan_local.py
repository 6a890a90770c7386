"""``promshift plan`` against a real local Prometheus that writes a query log, under a replayed read load.

One small stack (3 nodes, 2 s scrapes): dashboards refresh, the source's rules evaluate, a few ad-hoc
queries run; then the plan is written and checked: the draft passes the catalog check, every recommended
label drop keeps the source's series unique (re-checked here from /api/v1/series, independently of the
plan's own check), unused metrics and never-read labels are named. A source without
``/api/v1/status/tsdb`` (the real one behind a proxy that answers 404 there, as some
Prometheus-compatible backends do) and an empty query log each give one line and a partial plan.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from promshift.adapters.settings import check_catalog_file
from promshift.cli import main
from promshift.local.stack.local import LocalStack, StackConfig
from promshift.local.stack.read_load import replay

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "catalog" / "dashboards"


@pytest.fixture(scope="module")
def stack(stack_config_factory: Callable[..., StackConfig]) -> Iterator[LocalStack]:
    s = LocalStack(stack_config_factory(nodes=3))
    try:
        s.up(timeout=90)
        assert replay(s.source_url, [DASHBOARDS], rounds=1, step_s=10) > 0
        time.sleep(3)  # a rule evaluation or two (evaluation_interval = scrape_interval = 2 s)
        yield s
    finally:
        s.down()


class NoTsdb(ThreadingHTTPServer):
    """Forwards to the real source, but answers 404 on /api/v1/status/tsdb."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream

        class Handler(BaseHTTPRequestHandler):
            def _forward(self, method: str) -> None:
                if self.path.startswith("/api/v1/status/tsdb"):
                    self.send_response(404)
                    self.send_header("Content-Type", "text/plain")
                    self.end_headers()
                    self.wfile.write(b"404 page not found\n")
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                r = requests.request(method, upstream + self.path, data=body or None, timeout=30,
                                     headers={"Content-Type": self.headers.get("Content-Type", "")})
                self.send_response(r.status_code)
                self.send_header("Content-Type", r.headers.get("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                self._forward("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._forward("POST")

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


def test_plan_on_the_local_stack(stack: LocalStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan"
    code = main(["plan", "--source", stack.source_url, "--query-log", str(stack.source_query_log_path),
                 "--dashboards", str(DASHBOARDS), "--period", "1h", "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out) == json.loads((out / "plan.json").read_text())  # --json: the plan, only it
    assert "wrote " in captured.err
    assert sorted(p.name for p in out.iterdir()) == ["metric_groups.draft.yaml", "plan-cost.png", "plan.json",
                                                      "plan.md"]
    assert (out / "plan-cost.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    check = check_catalog_file(out / "metric_groups.draft.yaml")
    assert not check.problems, check.problems
    plan = json.loads((out / "plan.json").read_text())
    assert plan["partial"] is False and plan["groups"]
    assert plan["unread_metrics"], "the local fleet has counters nobody reads"
    assert plan["never_read_labels"], "and labels nobody reads"
    kinds = {r["reader"].split(":")[0] for row in plan["metrics"].values() for r in row["readers"]}
    assert kinds == {"dashboard", "rule", "query_log"}
    # Every recommended drop keeps the source's series apart: checked here from the source itself.
    now = time.time()
    dropped_somewhere = False
    for g in plan["groups"]:
        for metric in g["metrics"]:
            r = requests.get(f"{stack.source_url}/api/v1/series", timeout=30,
                             params={"match[]": metric, "start": now - 3600, "end": now})
            series = r.json()["data"]
            kept = {frozenset((k, v) for k, v in s.items() if k not in g["labeldrop"]) for s in series}
            assert len(kept) == len(series), (g["name"], metric)
            dropped_somewhere |= bool(g["labeldrop"])
        for label in g["unsafe_drops"]:
            assert label not in g["labeldrop"]
    assert dropped_somewhere
    assert "read by" in " ".join(v for g in plan["groups"] for v in g["unsafe_drops"].values())
    # The read load's fleet view reads DCGM_FI_DEV_MEM_COPY_UTIL per node only: recorded per node (sum and count),
    # one series of each per node instead of one per GPU; the per-GPU panels block their metrics, named.
    aggs = {a["metric"]: a for a in plan["aggregations"]}
    copy = aggs["DCGM_FI_DEV_MEM_COPY_UTIL"]
    assert copy["recommended"] and copy["level"] == ["Hostname"], copy
    assert [r["record"] for r in copy["rules"]] == ["Hostname:DCGM_FI_DEV_MEM_COPY_UTIL:sum",
                                                   "Hostname:DCGM_FI_DEV_MEM_COPY_UTIL:count"]
    hosts = requests.get(f"{stack.source_url}/api/v1/query", timeout=30,
                         params={"query": "count(count by (Hostname) (DCGM_FI_DEV_MEM_COPY_UTIL))"}).json()
    assert copy["series_after"] == 2 * int(hosts["data"]["result"][0]["value"][1]) < copy["series_before"]
    temp = aggs["DCGM_FI_DEV_GPU_TEMP"]
    assert not temp["recommended"] and temp["blocked_by"][0]["reader"].startswith(("dashboard:", "query_log:"))
    assert plan["bill"]["saved_by_aggregation_usd"] > 0 and plan["prices_date"]
    assert "Hostname:DCGM_FI_DEV_MEM_COPY_UTIL:sum" in (out / "plan.md").read_text()

    # Re-running with the first plan as --previous says what changed (here: at most costs and counts).
    again = main(["plan", "--source", stack.source_url, "--query-log", str(stack.source_query_log_path),
                  "--dashboards", str(DASHBOARDS), "--period", "1h", "--out", str(tmp_path / "again"),
                  "--previous", str(out / "plan.json")])
    assert again == 0
    assert "## Changes since the previous plan" in (tmp_path / "again" / "plan.md").read_text()


def test_a_source_without_tsdb_status_and_an_empty_query_log_give_a_partial_plan(
        stack: LocalStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proxy = NoTsdb(stack.source_url)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    empty = tmp_path / "empty.log"
    empty.write_text("")
    try:
        code = main(["plan", "--source", f"http://127.0.0.1:{proxy.server_address[1]}", "--query-log", str(empty),
                     "--period", "1h", "--out", str(tmp_path / "out")])
    finally:
        proxy.shutdown()
        proxy.server_close()
    err = capsys.readouterr().err.splitlines()
    assert code == 2
    assert [line for line in err if "status/tsdb" in line] == [
        "promshift plan: not read: source /api/v1/status/tsdb: "
        f"http://127.0.0.1:{proxy.server_address[1]}: HTTP 404 for /api/v1/status/tsdb: 404 page not found (head "
        "totals and the top-10 cross-check are missing; series counts come from /api/v1/series)"]
    assert [line for line in err if "empty" in line] == [
        f"promshift plan: not read: query log {empty}: empty (is query_log_file set, and did anyone query?)"]
    md = (tmp_path / "out" / "plan.md").read_text()
    assert "## PARTIAL: what this plan could not read" in md
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["partial"] and len(plan["not_read"]) == 2
    assert not check_catalog_file(tmp_path / "out" / "metric_groups.draft.yaml").problems
