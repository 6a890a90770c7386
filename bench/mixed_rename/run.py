"""A fleet caught mid-rename: 0, 1, 50 and 100 of 100 hosts send ``hostname`` instead of ``Hostname``.

Issue 24, item 1. dcgm-exporter renamed ``Hostname`` to ``hostname``; a fleet upgrades its exporters over
days, so during a migration some hosts send one name and some the other. This bench starts the local stack
(100 nodes, real Debian Prometheus source and target, real remote write) and plants each rename with
``python -m promshift.local stack drift GROUP --rename-label Hostname=hostname --hosts REGEX`` (the group's
own remote_write entry relabels the chosen hosts, so the target holds them under ``hostname``), one group
per case: ``gpu-utilization`` 0 hosts (plain dual-write), ``gpu-memory`` 1, ``gpu-power-thermal`` 50,
``gpu-clocks`` 100. Then it runs every parity layer (``ParityCheck``: plan, shards, reduce) for each group,
with ``parity.rename_labels: {hostname: Hostname}`` declared and without, with golden queries that
aggregate ``by (Hostname)`` (the shape that failed) besides the catalog's dashboard.

Goals: declared -> SUCCESSFUL in all four; undeclared -> FAILED naming the label and the hosts in the
three non-zero cases. Baseline, in the same run: the golden layer as it was (the target's whole query
rewritten to ``hostname``), on the declared cases.

Run: ``.venv/bin/python bench/mixed_rename/run.py`` (about 3 minutes on 2 cores); writes
``bench/results/mixed-rename.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from promshift.adapters.parity_check import ParityCheck
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.settings import load_catalog
from promshift.core.golden import fit_window
from promshift.core.parity import golden_comparison, normalize_labels
from promshift.core.promql import rename_labels_in
from promshift.local.cli import main as local_main
from promshift.local.stack.local import LocalStack, StackConfig, find_free_ports

REPO = Path(__file__).resolve().parents[2]
CASES = {0: ("gpu-utilization", ""), 1: ("gpu-memory", "gpu-node-0000"),
         50: ("gpu-power-thermal", "gpu-node-00[0-4][0-9]"), 100: ("gpu-clocks", ".*")}
DECLARED = (("hostname", "Hostname"),)


def dashboard(tmp: Path, group: str, metrics: list[str]) -> str:
    first, second = metrics[0], metrics[-1]
    exprs = [f"avg by (Hostname) ({first})", f"max by (Hostname) (max_over_time({second}[20s]))",
             f"count({first})", f'sum({first}{{Hostname=~"gpu-node-00[0-2].*"}})']
    panels = [{"title": f"{group} p{i}", "targets": [{"refId": "A", "expr": e}]} for i, e in enumerate(exprs)]
    path = tmp / f"{group}.json"
    path.write_text(json.dumps({"panels": panels}))
    return str(path)


def old_golden(check: ParityCheck, start: float, end: float, dashboard_path: str) -> list[str]:
    """The golden layer as it was: the target asked with the whole query renamed to the new label name."""
    policy = check.group.parity
    out = []
    for panel in json.loads(Path(dashboard_path).read_text())["panels"]:
        raw = panel["targets"][0]["expr"]
        fit = fit_window(raw, {}, earliest=start, latest=end, step=policy.step_s)
        target_expr = rename_labels_in(fit.expr, {old: new for new, old in DECLARED})
        sides = []
        for client, expr in ((check.source, fit.expr), (check.target, target_expr)):
            res = client.query_range(expr, start=fit.start, end=fit.end, step=policy.step_s)
            sides.append({normalize_labels(s.labels, ignore=policy.ignore_labels, rename=dict(DECLARED)): s.points
                          for s in res.series})
        m = golden_comparison("golden[old]", fit.expr, sides[0], sides[1], behind=(1.0, 1.0),
                              abs_tol=policy.abs_tolerance, rel_tol=max(policy.rel_tolerance, 1e-9))
        out.append(f"{m.verdict.value}: {m.reason}"[:200])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--out", default=str(REPO / "bench/results/mixed-rename.json"))
    args = parser.parse_args()
    started = time.time()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="promshift-rename-") as tmp_name:
        tmp = Path(tmp_name)
        fleet_port, source_port, target_port = find_free_ports(3)
        config = StackConfig(home=tmp / "stack", nodes=args.nodes, fleet_port=fleet_port, source_port=source_port,
                             target_port=target_port, scrape_interval="2s")
        os.environ.update({"PROMSHIFT_HOME": str(config.home), "PROMSHIFT_NODES": str(args.nodes),
                           "PROMSHIFT_FLEET_PORT": str(fleet_port), "PROMSHIFT_SOURCE_PORT": str(source_port),
                           "PROMSHIFT_TARGET_PORT": str(target_port), "PROMSHIFT_PROFILE": "demo"})
        stack = LocalStack(config)
        try:
            stack.up(timeout=180)
            source = PrometheusClient(stack.source_url, timeout_s=30)
            target = PrometheusClient(stack.target_url, timeout_s=30)
            for renamed, (group_name, hosts) in CASES.items():
                argv = (["stack", "dual-write", group_name] if not renamed else
                        ["stack", "drift", group_name, "--rename-label", "Hostname=hostname", "--hosts", hosts])
                assert local_main(argv) == 0, argv
            planted = time.time()
            # Planting restarts a queue (DESIGN.md); compare from 10 s after, once ~60 s of data is there.
            since = planted + 10
            time.sleep(max(0.0, since + 60 - time.time()))
            catalog = load_catalog(profile="demo")
            for renamed, (group_name, _hosts) in CASES.items():
                base = catalog.get(group_name)
                check0 = ParityCheck(base, source, target)
                metrics = check0._metric_names(since, time.time() - 10)
                board = dashboard(tmp, group_name, sorted(metrics))
                case: dict[str, Any] = {"group": group_name, "hosts_renamed": renamed}
                for label, rename in (("declared", DECLARED), ("undeclared", ())):
                    policy = dataclasses.replace(
                        base.parity, step_s=4.0, skip_recent_s=6.0, rename_labels=rename, sample_hosts=10,
                        hosts_per_shard=5, golden_dashboards=(board, str(REPO / "catalog/dashboards")))
                    group = dataclasses.replace(base, parity=policy)
                    check = ParityCheck(group, source, target)
                    t0 = time.perf_counter()
                    now = time.time()
                    result = check.run(dual_write_since=since, now=now).to_dict()
                    by = {m["name"]: m for m in result["measurements"]}
                    golden = {n: m for n, m in by.items() if n.startswith("golden[")}
                    failed = {n: m["reason"] for n, m in by.items() if m["verdict"] == "FAILED"}
                    text = " | ".join(failed.values())
                    named = ("`hostname`" in text and (f"{renamed} host" in text) and "gpu-node-0000" in text)
                    case[label] = {
                        "verdict": result["verdict"], "wall_s": round(time.perf_counter() - t0, 2),
                        "layers": {n: m["verdict"] for n, m in by.items()},
                        "golden_compared": len(golden),
                        "golden_failed": sum(m["verdict"] == "FAILED" for m in golden.values()),
                        "names_label_and_hosts": named,
                        "hosts_per_label": by.get("host_coverage", {}).get("numbers", {}).get("hosts_per_label"),
                        "failed_reasons": {n: r[:300] for n, r in list(failed.items())[:4]},
                    }
                    if label == "declared":
                        start = since + 2 * policy.step_s
                        case["baseline_old_golden"] = old_golden(check, start, now - policy.skip_recent_s, board)
                results[str(renamed)] = case
                d, u = case["declared"], case["undeclared"]
                print(f"{renamed:>3} of {args.nodes} renamed ({group_name}): declared {d['verdict']} "
                      f"(golden {d['golden_compared'] - d['golden_failed']}/{d['golden_compared']} pass); "
                      f"undeclared {u['verdict']} (names label and hosts: {u['names_label_and_hosts']}); "
                      f"old golden, declared: {sum(v.startswith('FAILED') for v in case['baseline_old_golden'])}"
                      f"/{len(case['baseline_old_golden'])} FAILED", flush=True)
        finally:
            stack.down()
    out = {
        "declared_successful": [int(k) for k, c in results.items() if c["declared"]["verdict"] == "SUCCESSFUL"],
        "undeclared_failed_naming_label_and_hosts": [
            int(k) for k, c in results.items()
            if c["undeclared"]["verdict"] == "FAILED" and c["undeclared"]["names_label_and_hosts"]],
        "goals": {"declared_successful": [0, 1, 50, 100], "undeclared_failed_naming_label_and_hosts": [1, 50, 100]},
        "baseline": "the golden layer as it was (target query rewritten to `hostname`), declared cases: "
                    "per query verdict in cases[n].baseline_old_golden",
        "setup": {"nodes": args.nodes, "scrape_interval": "2s", "step_s": 4.0, "bench_wall_s":
                  round(time.time() - started, 1)},
        "cases": results,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
