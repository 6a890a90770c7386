"""Independent scrapers: healthy runs, a planted 5 % bias on one metric, a target missing 3 hosts, reboots.

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

Reboots (issue 39, item 1): a second fleet of 16 nodes, 5 of which reboot in turn (60 s down answering 503,
then their counters restart from 0), scraped by two more Prometheus servers on their own phases (the source and
the target of that case): each sees an outage begin and end at its own instant, up to one scrape apart. Healthy
pairs must stay SUCCESSFUL; the baseline is the same check without the edge allowance (``edge_s`` 0 and no
coverage credit), the rule this replaces.

Run: ``.venv/bin/python bench/independent_scrapers/run.py`` (about 7 minutes on 2 cores); writes
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
from promshift.local.stack.fleet import (
    FleetServer,
    FleetSpec,
    _FleetHandler,
    file_sd_groups,
    load_counters,
    node_values,
    render_node,
)
from promshift.local.stack.local import find_free_ports
from promshift.local.stack.prometheus import PrometheusProcess

REPO = Path(__file__).resolve().parents[2]
GROUP = "gpu-power-thermal"
BIASED_METRIC = "DCGM_FI_DEV_POWER_USAGE"
BIAS = 1.05
MISSING = 3
REBOOT_NODES = 16
REBOOTING = 5  # of REBOOT_NODES, one after another
DOWN_S = 60.0
REBOOT_PERIOD_S = 120.0  # each rebooting node: down DOWN_S, up the rest, its turn staggered by PERIOD / REBOOTING


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


class RebootHandler(_FleetHandler):
    """The fleet's answer, but the first ``REBOOTING`` nodes reboot in turn: down (HTTP 503) for ``DOWN_S`` once
    every ``REBOOT_PERIOD_S``, and after each reboot their counters restart from 0."""

    def do_GET(self) -> None:
        parts = self.path.split("?", 1)[0].split("/")
        index = self.server.fleet.node_index(parts[2]) if len(parts) == 4 else None
        if index is None or index >= REBOOTING:
            super().do_GET()
            return
        now = self.server.clock()
        phase = (now - index * REBOOT_PERIOD_S / REBOOTING) % REBOOT_PERIOD_S
        if phase < DOWN_S:
            self._reply(503, b"rebooting\n", "text/plain; charset=utf-8")
            return
        booted = now - (phase - DOWN_S)
        counters = {c.name for c in load_counters() if c.kind == "counter"}
        at_boot = node_values(self.server.fleet, index, booted)
        seen: dict[str, int] = {}

        def restart(m: re.Match[str]) -> str:
            name, value = m.group(1), m.group(3)
            if name not in counters:
                return m.group(0)
            i = seen[name] = seen.get(name, -1) + 1
            return f"{name}{m.group(2)} {max(0.0, float(value) - float(at_boot[name][i])):.0f}"

        text = render_node(self.server.fleet, index, now)
        body = re.sub(r"^(\w+)(\{[^}]*\}) (\S+)$", restart, text, flags=re.M).encode()
        self._reply(200, body, "text/plain; version=0.0.4; charset=utf-8")


def serve(server: FleetServer) -> FleetServer:
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def scraper(tmp: Path, name: str, targets: list[dict[str, Any]], interval_s: float,
            own_phase: bool = False) -> PrometheusProcess:
    """A Prometheus scraping ``targets``. Prometheus places each target's scrapes at an offset hashed from the
    target and a seed made of the host name and the server's external labels: two servers on one machine without
    external labels scrape every target at the same instants. ``own_phase`` gives this one an external label of
    its own, so its scrapes fall elsewhere in the interval, as an independent collector's do."""
    sd = tmp / f"{name}.json"
    sd.write_text(json.dumps(targets))
    labels = f", external_labels: {{scraper: {name}}}" if own_phase else ""
    config = (f"global: {{scrape_interval: {interval_s:g}s{labels}}}\nscrape_configs:\n- job_name: dcgm\n"
              f"  file_sd_configs: [{{files: ['{sd}']}}]\n")
    (port,) = find_free_ports(1)
    return PrometheusProcess(name, tmp, port=port, config=config, data_dir=tmp / name)


class WithoutEdges(ParityCheck):
    """The check before issue 39: a point or a host one side lacks next to an outage's edge counts as missing."""

    def _edges(self, start: float, end: float) -> dict[str, Any]:
        return {}


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
    parser.add_argument("--cases", default="healthy,bias,missing_hosts,reboot", help="comma-separated subset")
    args = parser.parse_args()
    wanted = args.cases.split(",")

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
    reboot_spec = FleetSpec(nodes=REBOOT_NODES)
    reboot_fleet = serve(FleetServer(reboot_spec))
    reboot_fleet.RequestHandlerClass = RebootHandler
    rebooting = [reboot_spec.hostname(i) for i in range(REBOOTING)]
    reboot_group = dataclasses.replace(group, parity=dataclasses.replace(
        policy, sample_hosts=REBOOT_NODES, hosts_per_shard=REBOOT_NODES // 2))
    all_targets = file_sd_groups(fleet, healthy_fleet.port)
    missing_hosts = [g["labels"]["instance"] for g in all_targets[-MISSING:]]
    with tempfile.TemporaryDirectory(prefix="promshift-indep-") as tmp_name:
        tmp = Path(tmp_name)
        servers = {
            "source": scraper(tmp, "source", all_targets, args.scrape),
            "healthy": scraper(tmp, "healthy", all_targets, args.scrape),
            "bias": scraper(tmp, "bias", file_sd_groups(fleet, biased_fleet.port), args.scrape),
            "missing_hosts": scraper(tmp, "missing", all_targets[:-MISSING], args.scrape),
            "reboot_source": scraper(tmp, "reboot-source", file_sd_groups(reboot_spec, reboot_fleet.port), args.scrape,
                                     own_phase=True),
            "reboot": scraper(tmp, "reboot-target", file_sd_groups(reboot_spec, reboot_fleet.port), args.scrape,
                              own_phase=True),
        }
        try:
            for s in servers.values():
                s.wait_ready(60)
            clients = {k: PrometheusClient(s.url, timeout_s=30) for k, s in servers.items()}
            deadline = time.time() + 60
            for name, client in clients.items():
                want = args.nodes - (MISSING if name == "missing_hosts" else 0)
                if name.startswith("reboot"):
                    want = 1
                while (client.scalar('count(up{job="dcgm"} == 1)') or 0) < want:
                    assert time.time() < deadline, f"{name} did not scrape the fleet"
                    time.sleep(0.5)
            since = time.time()  # "dual-write" (here: both scrapers) starts now
            first_end = since + 2 * step + args.window + step
            cases: dict[str, list[dict[str, Any]]] = {
                k: [] for k in ("healthy", "bias", "missing_hosts", "reboot") if k in wanted}
            baseline: dict[str, list[dict[str, Any]]] = {k: [] for k in cases}
            started = time.time()
            for i in range(args.runs):
                end = first_end + i * args.every
                time.sleep(max(0.0, end + 3 - time.time()))  # ingested on every side
                start = end - args.window
                for case in cases:
                    pairs = ((ParityCheck, group, cases), (ParityCheck, blanket, baseline))
                    source = clients["source"]
                    if case == "reboot":  # its own pair of scrapers; the baseline: no edge allowance
                        pairs, source = ((ParityCheck, reboot_group, cases), (WithoutEdges, reboot_group, baseline)), \
                            clients["reboot_source"]
                    for kind, grp, into in pairs:
                        check = kind(grp, source, clients[case], catalog_dir=REPO / "catalog")
                        result = check.run(dual_write_since=start - 2 * step,
                                           now=end + policy.skip_recent_s).to_dict()
                        into[case].append(judge(result, case, missing_hosts))
                print(f"run {i + 1}/{args.runs}: " + ", ".join(
                    f"{c} {cases[c][-1]['verdict']} (baseline {baseline[c][-1]['verdict']})" for c in cases),
                    flush=True)
        finally:
            for s in servers.values():
                s.stop(20)
            healthy_fleet.shutdown()
            biased_fleet.shutdown()
            reboot_fleet.shutdown()

    def counts(runs: dict[str, list[dict[str, Any]]], which: tuple[str, ...]) -> dict[str, int]:
        out: dict[str, int] = {}
        for case in (c for c in which if c in runs):
            out[f"{case}_runs"] = len(runs[case])
            if case in ("healthy", "reboot"):
                out[f"{case}_failed"] = sum(r["verdict"] == "FAILED" for r in runs[case])
                out[f"{case}_inconclusive"] = sum(r["verdict"] == "INCONCLUSIVE" for r in runs[case])
            else:
                out[f"{case}_failed"] = sum(r["verdict"] == "FAILED" and r["named"] for r in runs[case])
        return out

    ours = counts(cases, ("healthy", "bias", "missing_hosts", "reboot"))
    blanket_counts = counts(baseline, ("healthy", "bias", "missing_hosts"))
    out = {
        **ours,
        "goals": {"healthy_failed": 0, "bias_failed": ">= 19", "missing_hosts_failed": ">= 19", "reboot_failed": 0},
        "baseline_blanket_tolerance": blanket_counts,
        "baseline_without_edge_allowance": counts(baseline, ("reboot",)),
        "setup": {"nodes": args.nodes, "group": GROUP, "metrics": list(group.metrics), "scrape_interval_s": args.scrape,
                  "step_s": step, "window_s": args.window, "windows_every_s": args.every,
                  "bias": f"{BIASED_METRIC} x {BIAS}", "missing_hosts": missing_hosts,
                  "catalog_floor": {"abs": policy.abs_tolerance, "rel": policy.rel_tolerance},
                  "counted_as_failed": "verdict FAILED with the biased metric (or every missing host) named",
                  "reboot": {"nodes": REBOOT_NODES, "rebooting": rebooting, "down_s": DOWN_S,
                             "period_s": REBOOT_PERIOD_S, "counters": "restart from 0 after each reboot",
                             "down_answer": "HTTP 503"},
                  "bench_wall_s": round(time.time() - started, 1)},
        "examples": {c: next((r for r in runs if r["verdict"] == "FAILED"), runs[0]) for c, runs in cases.items()},
        "runs": cases,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"{'':22}{'noise model':>14}{'baseline':>14}")
    edges = out["baseline_without_edge_allowance"]
    for k in ("healthy_failed", "bias_failed", "missing_hosts_failed", "reboot_failed"):
        if k not in ours:
            continue
        other = blanket_counts if k in blanket_counts else edges
        print(f"{k:22}{ours[k]:>11}/{ours[k.replace('failed', 'runs')]:<2}{other[k]:>11}/"
              f"{other[k.replace('failed', 'runs')]:<2}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
