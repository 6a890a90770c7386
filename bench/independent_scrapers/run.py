"""Independent scrapers: healthy runs, a planted 5 % bias on one metric, a target missing 3 hosts.

Issue 24, item 3. A managed collector (``DEPLOY=scraper``) scrapes the fleet on its own clock, so parity is
``independent_scraper``: the two sides never hold the same samples. This bench runs that case on 127.0.0.1
with real servers: the fleet simulator (``promshift.local.stack.fleet``) and four Debian Prometheus servers
scraping it on their own schedules -- the source, and three targets: a healthy one, one scraping an endpoint
that reports ``DCGM_FI_DEV_POWER_USAGE`` 5 % high (a collector reading another exporter, or a unit change),
and one whose service discovery lacks 3 hosts. (Locally ``DEPLOY=scraper`` runs vmagent behind the AMP
scraper stand-in, ``local/stack/scrapers.py``; here a second Prometheus is the independent scraper, which
reads the fleet exactly as vmagent does -- its own scrape phase, its own timestamps -- without the moto and
SigV4 set-up the verdicts do not depend on.)

Every run is ``ParityCheck.run`` for the catalog's ``gpu-power-thermal`` group (4 metrics: 3 gauges and an
energy counter) as ``group_for_deploy`` makes it for the scraper deploy (mode ``independent_scraper``, the
catalog's own tolerances as the floor), every host sampled, the group's golden dashboard included. The 20
runs per case use 20 windows of ``--window`` seconds, one every ``--every`` seconds (they overlap; each
sees other scrapes and other noise). Baseline, on the same windows: the blanket tolerance this replaces
(10 % relative / 0.05 absolute as the floor, what ``deploy_kinds.INDEPENDENT_*`` set).

Run: ``.venv/bin/python bench/independent_scrapers/run.py`` (about 6 minutes on 2 cores); writes
``bench/results/independent-scrapers.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from promshift.adapters.parity_check import ParityCheck
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.settings import load_catalog
from promshift.core.deploy_kinds import deploy_of, group_for_deploy
from promshift.local.stack.fleet import FleetServer, FleetSpec, _FleetHandler, file_sd_groups, render_node
from promshift.local.stack.local import find_free_ports
from promshift.local.stack.prometheus import PrometheusProcess

REPO = Path(__file__).resolve().parents[2]
GROUP = "gpu-power-thermal"
BIASED_METRIC = "DCGM_FI_DEV_POWER_USAGE"
BIAS = 1.05
MISSING = 3


class BiasedHandler(_FleetHandler):
    """The fleet's own answer with one metric's values 5 % high."""

    def do_GET(self) -> None:
        parts = self.path.split("?", 1)[0].split("/")
        index = self.server.fleet.node_index(parts[2]) if len(parts) == 4 else None
        if index is None:
            super().do_GET()
            return
        text = render_node(self.server.fleet, index, self.server.clock())
        pattern = re.compile(rf"^({BIASED_METRIC}\{{[^}}]*\}}) (\S+)$", re.M)
        body = pattern.sub(lambda m: f"{m.group(1)} {float(m.group(2)) * BIAS:.3f}", text).encode()
        self._reply(200, body, "text/plain; version=0.0.4; charset=utf-8")


def serve(server: FleetServer) -> FleetServer:
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def scraper(tmp: Path, name: str, targets: list[dict[str, Any]], interval_s: float) -> PrometheusProcess:
    sd = tmp / f"{name}.json"
    sd.write_text(json.dumps(targets))
    config = (f"global: {{scrape_interval: {interval_s:g}s}}\nscrape_configs:\n- job_name: dcgm\n"
              f"  file_sd_configs: [{{files: ['{sd}']}}]\n")
    (port,) = find_free_ports(1)
    return PrometheusProcess(name, tmp, port=port, config=config, data_dir=tmp / name)


def judge(result: dict[str, Any], case: str, missing_hosts: list[str]) -> dict[str, Any]:
    failed = [m for m in result["measurements"] if m["verdict"] == "FAILED"]
    reasons = " | ".join(f"{m['name']}: {m['reason']}" for m in failed)
    named = True
    if case == "bias":
        named = BIASED_METRIC in reasons
    elif case == "missing_hosts":
        named = all(h in reasons for h in missing_hosts)
    return {"verdict": result["verdict"], "failed_layers": [m["name"] for m in failed], "named": named,
            "reason": reasons[:600], "wall_s": round(result.get("wall_s", 0.0), 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=12)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--window", type=float, default=40.0, help="seconds compared per run")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between run windows")
    parser.add_argument("--scrape", type=float, default=2.0, help="scrape interval of every scraper (s)")
    parser.add_argument("--out", default=str(REPO / "bench/results/independent-scrapers.json"))
    args = parser.parse_args()

    fleet = FleetSpec(nodes=args.nodes)
    catalog = load_catalog(profile="demo")
    base = group_for_deploy(catalog.get(GROUP), deploy_of("scraper"))
    policy = dataclasses.replace(base.parity, sample_hosts=args.nodes, hosts_per_shard=max(1, args.nodes // 2))
    group = dataclasses.replace(base, parity=policy)
    blanket = dataclasses.replace(group, parity=dataclasses.replace(
        policy, abs_tolerance=max(policy.abs_tolerance, 0.05), rel_tolerance=max(policy.rel_tolerance, 0.10)))
    step = policy.step_s
    healthy_fleet = serve(FleetServer(fleet))
    biased_fleet = serve(FleetServer(fleet))
    biased_fleet.RequestHandlerClass = BiasedHandler
    all_targets = file_sd_groups(fleet, healthy_fleet.port)
    missing_hosts = [g["labels"]["instance"] for g in all_targets[-MISSING:]]
    with tempfile.TemporaryDirectory(prefix="promshift-indep-") as tmp_name:
        tmp = Path(tmp_name)
        servers = {
            "source": scraper(tmp, "source", all_targets, args.scrape),
            "healthy": scraper(tmp, "healthy", all_targets, args.scrape),
            "bias": scraper(tmp, "bias", file_sd_groups(fleet, biased_fleet.port), args.scrape),
            "missing_hosts": scraper(tmp, "missing", all_targets[:-MISSING], args.scrape),
        }
        try:
            for s in servers.values():
                s.wait_ready(60)
            clients = {k: PrometheusClient(s.url, timeout_s=30) for k, s in servers.items()}
            deadline = time.time() + 60
            for name, client in clients.items():
                want = args.nodes - (MISSING if name == "missing_hosts" else 0)
                while (client.scalar('count(up{job="dcgm"} == 1)') or 0) < want:
                    assert time.time() < deadline, f"{name} did not scrape the fleet"
                    time.sleep(0.5)
            since = time.time()  # "dual-write" (here: both scrapers) starts now
            first_end = since + 2 * step + args.window + step
            cases: dict[str, list[dict[str, Any]]] = {k: [] for k in ("healthy", "bias", "missing_hosts")}
            baseline: dict[str, list[dict[str, Any]]] = {k: [] for k in cases}
            started = time.time()
            for i in range(args.runs):
                end = first_end + i * args.every
                time.sleep(max(0.0, end + 3 - time.time()))  # ingested on every side
                start = end - args.window
                for case in cases:
                    for grp, into in ((group, cases), (blanket, baseline)):
                        check = ParityCheck(grp, clients["source"], clients[case], catalog_dir=REPO / "catalog")
                        result = check.run(dual_write_since=start - 2 * step,
                                           now=end + policy.skip_recent_s).to_dict()
                        into[case].append(judge(result, case, missing_hosts))
                print(f"run {i + 1}/{args.runs}: " + ", ".join(
                    f"{c} {cases[c][-1]['verdict']} (blanket {baseline[c][-1]['verdict']})" for c in cases),
                    flush=True)
        finally:
            for s in servers.values():
                s.stop(20)
            healthy_fleet.shutdown()
            biased_fleet.shutdown()

    def counts(runs: dict[str, list[dict[str, Any]]]) -> dict[str, int]:
        return {
            "healthy_runs": len(runs["healthy"]),
            "healthy_failed": sum(r["verdict"] == "FAILED" for r in runs["healthy"]),
            "healthy_inconclusive": sum(r["verdict"] == "INCONCLUSIVE" for r in runs["healthy"]),
            "bias_runs": len(runs["bias"]),
            "bias_failed": sum(r["verdict"] == "FAILED" and r["named"] for r in runs["bias"]),
            "missing_hosts_runs": len(runs["missing_hosts"]),
            "missing_hosts_failed": sum(r["verdict"] == "FAILED" and r["named"] for r in runs["missing_hosts"]),
        }

    ours, blanket_counts = counts(cases), counts(baseline)
    out = {
        **ours,
        "goals": {"healthy_failed": 0, "bias_failed": ">= 19", "missing_hosts_failed": ">= 19"},
        "baseline_blanket_tolerance": blanket_counts,
        "setup": {"nodes": args.nodes, "group": GROUP, "metrics": list(group.metrics), "scrape_interval_s": args.scrape,
                  "step_s": step, "window_s": args.window, "windows_every_s": args.every,
                  "bias": f"{BIASED_METRIC} x {BIAS}", "missing_hosts": missing_hosts,
                  "catalog_floor": {"abs": policy.abs_tolerance, "rel": policy.rel_tolerance},
                  "counted_as_failed": "verdict FAILED with the biased metric (or every missing host) named",
                  "bench_wall_s": round(time.time() - started, 1)},
        "examples": {c: next((r for r in runs if r["verdict"] == "FAILED"), runs[0]) for c, runs in cases.items()},
        "runs": cases,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"{'':22}{'noise model':>14}{'blanket 10 %':>14}")
    for k in ("healthy_failed", "bias_failed", "missing_hosts_failed"):
        print(f"{k:22}{ours[k]:>11}/{ours[k.replace('failed', 'runs')]:<2}{blanket_counts[k]:>11}/"
              f"{blanket_counts[k.replace('failed', 'runs')]:<2}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
