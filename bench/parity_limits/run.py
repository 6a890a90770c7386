"""Parity sized to the workspace at the seed's scale: the parity bench's hour against a target that refuses queries
over 500,000 samples, beside the same check on an unlimited target, in the same run.

2,000 nodes x 8 GPUs x 4 metrics (``gpu-power-thermal``), one 30 s-sample hour backfilled into a source and a
faulty target (bench/parity's planted faults: 0.1 % of series missing, one host's ``Hostname`` renamed, one
host's values x1.01). The target's TSDB (~40 MB) is copied to a second Prometheus started with
``--query.max-samples=500000`` (samples held at once) behind ``local.stack.samples_limit`` (samples read in all,
as AMP counts them): a query over the limit is refused with HTTP 422, as AMP does. One metric's whole-window
aggregate reads ~1.9M samples per side: refused there. (``--query.max-samples`` alone does not refuse it: the
engine holds one series' samples at a time.)

In the same run, each in a child process (``bench/parity/run.py --child promshift``): parity on the unlimited
pair (the unsplit queries, as before), parity told the limit (``QueryLimits(max_samples=500000)``: every
query planned in parts), and parity not told it (refusals split and asked again). Reported: the planted faults
found by each, the queries refused, wall time and the backends' own query time (``evalTotalTime`` over every
query, both servers) for each. Writes ``bench/results/parity-limits.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "include"))
_spec = importlib.util.spec_from_file_location("parity_bench", REPO / "bench" / "parity" / "run.py")
assert _spec is not None and _spec.loader is not None
pb = importlib.util.module_from_spec(_spec)
sys.modules["parity_bench"] = pb
_spec.loader.exec_module(pb)

RESULT_PATH = REPO / "bench" / "results" / "parity-limits.json"
MAX_SAMPLES = 500_000


def start(name: str, data_dir: Path, port: int, max_samples: int) -> Any:
    return pb.PrometheusProcess(name, data_dir.parent, port=port, config="global:\n  scrape_interval: 30s\n",
                                data_dir=data_dir, binary=pb.PROMETHEUS,
                                flags=("--storage.tsdb.retention.time=3650d", f"--query.max-samples={max_samples}"))


def sizing(result: dict[str, Any], key: str) -> int:
    return sum(int((m.get("numbers") or {}).get("query_sizing", {}).get(key, 0)) for m in result["measurements"])


def runs_of(label: str, spec: dict[str, Any], workdir: Path, repeats: int, plan: Any) -> dict[str, Any]:
    runs = []
    for i in range(repeats):
        run = pb.run_child("promshift", spec, workdir)
        s = pb.summarize_promshift(run)
        runs.append((run, s))
        pb.log(f"{label} run {i + 1}/{repeats}: {s['verdict']} wall {s['wall_s']:.2f}s backend "
               f"{s['backend_query_s']:.2f}s, {s['queries_sent']} queries, refused for size "
               f"{sizing(run['result'], 'refused_for_size')}, layers {s['layers']}")
    runs.sort(key=lambda r: r[1]["wall_s"])
    run, median = runs[len(runs) // 2]
    judged = [pb.judge_promshift(r["result"], plan) for r, _ in runs]
    return {
        "verdict": median["verdict"], "wall_s": median["wall_s"], "backend_query_s": median["backend_query_s"],
        "wall_over_backend": round(median["wall_s"] / median["backend_query_s"], 3)
        if median["backend_query_s"] else None,
        "queries_sent": median["queries_sent"], "peak_rss_mb": max(s["peak_rss_mb"] for _, s in runs),
        "refused_queries": max(sizing(r["result"], "refused_for_size") for r, _ in runs),
        "split_queries": sizing(run["result"], "split_queries"), "parts_asked": sizing(run["result"], "parts"),
        "faults_found": sum(judged[0][f]["found"] for f in pb.FAULTS),
        "all_runs_all_found": all(j["all_found"] for j in judged),
        "layers": median["layers"], "by_kind": median["by_kind"],
        "runs_wall_s": [s["wall_s"] for _, s in runs],
        "sizing": {m["name"]: m["numbers"]["query_sizing"] for m in run["result"]["measurements"]
                   if (m.get("numbers") or {}).get("query_sizing")},
        "judged": judged[0],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-samples", type=int, default=MAX_SAMPLES)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out_path = args.out or (RESULT_PATH if args.nodes == 2000 else None)
    date = datetime.now(UTC)
    group = pb.bench_group("gpu-power-thermal")
    metrics = list(group.metrics)
    from promshift.local.stack.fleet import FleetSpec
    from promshift.local.stack.local import EXTERNAL_LABELS, SCRAPE_JOB

    fleet = FleetSpec(nodes=args.nodes)
    series = fleet.nodes * fleet.gpus_per_node * len(metrics)
    start_t, end_t = pb.choose_window(time.time(), pb.WINDOW_S)
    steps = list(range(start_t, end_t + 1, int(pb.STEP_S)))
    plan = pb.plan_faults(fleet, metrics, seed=f"promshift-parity-bench:{fleet.nodes}")
    sides = ("source", "target")
    pb.show_backfill_progress()
    pb.log(f"{series} series x {len(steps)} samples per side; target limited to {args.max_samples:,} samples/query")
    workdir = Path(tempfile.mkdtemp(prefix="promshift-parity-limits-"))
    servers: dict[str, Any] = {}
    try:
        t = time.perf_counter()
        written = pb.write_openmetrics(fleet, metrics, steps, plan, EXTERNAL_LABELS, SCRAPE_JOB, workdir, sides)
        gen_s = time.perf_counter() - t
        backfills = {}
        for side, path in written["files"].items():
            backfills[side] = pb.backfill(path, workdir / f"{side}-data")
            path.unlink()
            pb.log(f"backfilled {side} in {backfills[side]['wall_s']}s")
        shutil.copytree(workdir / "target-data", workdir / "limited-data")
        ports = pb.find_free_ports(3)
        servers = {"source": start("source", workdir / "source-data", ports[0], 100_000_000),
                   "target": start("target", workdir / "target-data", ports[1], 100_000_000),
                   "limited": start("limited", workdir / "limited-data", ports[2], args.max_samples)}
        for s in servers.values():
            s.wait_ready()
        from promshift.adapters.prometheus import PrometheusClient, PrometheusError
        from promshift.local.stack.samples_limit import SamplesLimitProxy

        proxy = SamplesLimitProxy(servers["limited"].url, args.max_samples)
        limited_url = proxy.url

        span = f"{end_t - start_t}s"
        for s in servers.values():  # warm each page cache (as the parity bench does)
            c = PrometheusClient(s.url, timeout_s=300)
            for m in metrics:
                for lo in range(start_t, end_t, 600):
                    c.query(f'count(count_over_time({{__name__="{m}"}}[600s]))', at=lo + 600)
        whole = f'sum by (Hostname) (sum_over_time({{__name__="{metrics[0]}"}}[{span}]))'
        unsplit: dict[str, Any] = {"query": whole}
        try:
            PrometheusClient(limited_url, timeout_s=120).query(whole, at=end_t)
            unsplit["refused"] = False
        except PrometheusError as exc:
            unsplit.update(refused=True, http_status=exc.http_status, error=str(exc).split(": ", 1)[-1][:200])
        samples = PrometheusClient(servers["target"].url, timeout_s=120, always_stats=True).query(whole, at=end_t)
        unsplit["samples"] = int((samples.stats.get("samples") or {}).get("totalQueryableSamples") or 0)
        pb.log(f"unsplit aggregate on the limited target: {unsplit}")

        base = {"group": "gpu-power-thermal", "dual_write_since": start_t - 2 * pb.STEP_S,
                "now": end_t + group.parity.skip_recent_s, "source": servers["source"].url}
        limits = {"max_samples": args.max_samples,
                  "source": {"max_samples": "bench: the limited target's samples_limit"}}
        unlimited = runs_of("unlimited (unsplit)", {**base, "target": servers["target"].url}, workdir,
                            args.repeats, plan)
        limited = runs_of("limited, limit known (planned)", {**base, "target": limited_url,
                                                            "limits": limits}, workdir, args.repeats, plan)
        proxy_refused = proxy.refused
        discovered = runs_of("limited, limit unknown (refusals split)", {**base, "target": limited_url},
                             workdir, 1, plan)
        proxy_refused_all = proxy.refused
        proxy.stop()
    finally:
        for s in servers.values():
            s.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    wall, backend = limited["wall_s"], limited["backend_query_s"]
    targets = {
        "same planted faults found as unlimited": {"value": f"{limited['faults_found']}/{unlimited['faults_found']}",
                                                   "met": limited["judged"] == unlimited["judged"]
                                                   or limited["faults_found"] == unlimited["faults_found"]
                                                   == len(pb.FAULTS)},
        "no query refused (limit known)": {"value": limited["refused_queries"], "met": limited["refused_queries"] == 0},
        "unsplit query refused by the limited target": {"value": unsplit.get("refused"),
                                                        "met": bool(unsplit.get("refused"))},
        "wall_s <= 1.25 x backend_query_s (limited)": {"value": round(wall / backend, 3) if backend else None,
                                                       "met": bool(backend) and wall <= 1.25 * backend},
    }
    report = {
        "issue": "35 item 2: parity sized to the workspace's per-query limits, 2,000 nodes x 8 GPUs, 1 h window",
        "date": date.isoformat(timespec="seconds"),
        "machine": {**pb.machine_info(), "loadavg_at_end": pb.loadavg(),
                    "note": "shared machine: other sessions' tests and benchmarks were running"},
        "code": pb.code_state(),
        "nodes": fleet.nodes, "gpus_per_node": fleet.gpus_per_node, "metrics": metrics, "series_per_side": series,
        "window_s": end_t - start_t, "samples_per_series": len(steps),
        "max_samples_per_query": args.max_samples,
        "refused_queries": limited["refused_queries"],
        "faults_found_limited": limited["faults_found"],
        "faults_found_unlimited": unlimited["faults_found"],
        "wall_s": wall, "backend_query_s": backend,
        "unlimited_wall_s": unlimited["wall_s"], "unlimited_backend_query_s": unlimited["backend_query_s"],
        "targets": targets,
        "unsplit_query_on_limited_target": unsplit,
        "refusals_counted_by_the_limited_target": {
            "before the refusals-split run (the unsplit probe, then unlimited and planned runs)": proxy_refused,
            "in all": proxy_refused_all},
        "runs": {"unlimited": unlimited, "limited_planned": limited, "limited_refusals_split": discovered},
        "measured_how": {
            "wall_s": f"median of {args.repeats} runs: perf_counter around ParityCheck.run() in a child process",
            "backend_query_s": "sum of evalTotalTime (stats=all) over every query parity sent, both servers, "
                               "for the same run (the same split)",
            "refused_queries": "refusals for size parity met (its query_sizing evidence), max over the runs",
            "faults_found": "bench/parity's judge: missing series, label rename, value drift (of 3)",
        },
        "setup": {"openmetrics_s": round(gen_s, 1), "backfill": backfills, "openmetrics_bytes": written["bytes"]},
        "total_runtime_s": round(time.monotonic() - pb._T0, 1),
    }
    text = json.dumps(report, indent=2)
    print(text)
    print(f"\n{'':4}  {'unlimited (unsplit)':>22} {'limited (planned)':>20} {'limited (refusals split)':>26}")
    for key in ("verdict", "wall_s", "backend_query_s", "queries_sent", "refused_queries", "faults_found"):
        print(f"{key:>16}: {unlimited[key]!s:>16} {limited[key]!s:>20} {discovered[key]!s:>26}")
    for name, t in targets.items():
        print(f"{'MET ' if t['met'] else 'MISS'}  {name}: {t['value']}")
    if out_path:
        out_path.write_text(text + "\n")
        pb.log(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
