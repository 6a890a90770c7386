"""Source queues: a source's RSS and CPU with 1, 8, 32, 128 dual-writing groups, one entry each vs bounded queues.

Issue 36, item 1. Every ``remote_write`` entry keeps its own queue tailing the WAL
(prometheus/prometheus#13174), so one entry per group costs the source memory and CPU per group. promshift
bounds that: at most ``--cap`` promshift queues per source, cut-over groups merged into one entry
(``core.render.merged_remote_write_entry``) by swaps that add the merged entry, prove it, then remove
the entries it replaces (``core.queues``).

Everything is real, on 127.0.0.1: the DCGM fleet simulator (``--nodes`` × 8 GPUs × 25 per-GPU metrics =
40,000 series at 200 nodes), Debian's Prometheus 2.42 as the source, and a second 2.42 with
``--web.enable-remote-write-receiver`` as the receiver (every run to one receiver, told apart by the external
label ``bench_run``). To have 128 groups keyed on ``__name__`` as promshift's are, the source's scrape
renames each metric by the tens digit of its node (``DCGM_FI_DEV_GPU_UTIL_b3``): 250 names, 160 series each;
group *i* of *N* keeps names *j* with *j* mod *N* = *i*. Every run sends the same 40,000 series.

Runs, each a fresh source (same settle and measure windows):

- ``single_entry``: one entry keeping every series (the baseline);
- ``per_group`` × N: N entries, one per group, all loaded at start (what promshift did before);
- ``bounded`` × N: the groups arrive ``--cap`` - 1 at a time as their own entries (dual-writing), and each
  time the cap is reached the entries present (taken as cut over) are merged into a new merged entry by a
  swap (add, prove with ``core.queues.swap_proof`` on real answers, remove); at rest the source carries the
  merged entry and at most ``cap`` - 1 group entries. RSS and CPU are measured ``--settle`` seconds after
  the last swap (a fresh run: after its start), so both have had the same time to return freed memory;
- ``single_entry_same_uptime`` (beside each bounded run): a twin source with the one entry keeping
  everything, started with the bounded source and sampled in the same window, so the pair has the same
  uptime (a source's RSS still grows minutes after its start, and 42 swaps take about 20 minutes).

Every sample also reads the server's Go heap (``go_memstats_heap_inuse_bytes``, ``heap_alloc``, ``heap_idle``,
``heap_released``, ``next_gc``) and the RSS split (``RssAnon``, ``RssFile``), the same way for every run.

``samples_lost`` is counted on the target: for every group of every bounded run, the samples the source
holds between the group's first full scrape after its entry was loaded and the end of the run, minus
the samples the receiver holds for it over the same window (0 means nothing was lost across any swap).

Run: ``nice -n 10 .venv/bin/python bench/source_queues/run.py`` (about 40 minutes on 2 cores); writes
``bench/results/source-queues.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.queue_probe import PrometheusQueueProbe
from promshift.core.queues import (
    plan_merge,
    promshift_queues,
    swap_proof,
    with_added,
    with_removed,
)
from promshift.core.render import QueueMember, add_remote_write, remote_write_entry
from promshift.core.verdicts import Verdict
from promshift.local.stack.fleet import FleetServer, FleetSpec, render_node, write_file_sd
from promshift.local.stack.local import find_free_ports
from promshift.local.stack.prometheus import PrometheusProcess

REPO = Path(__file__).resolve().parents[2]
BANDS = 10
CLK_TCK = os.sysconf("SC_CLK_TCK")


def metric_names(fleet_metrics: Sequence[str]) -> list[str]:
    return [f"{m}_b{b}" for b in range(BANDS) for m in fleet_metrics]


def groups_of(names: Sequence[str], n: int) -> list[QueueMember]:
    return [QueueMember(f"g{i:03d}", "|".join(names[j] for j in range(i, len(names), n))) for i in range(n)]


def base_config(run: str, scrape_s: float, sd_path: Path) -> str:
    return (f"global:\n  scrape_interval: {scrape_s:g}s\n  external_labels:\n    bench_run: {run}\n"
            "scrape_configs:\n- job_name: dcgm\n  file_sd_configs:\n"
            f"  - files: ['{sd_path}']\n  metric_relabel_configs:\n"
            "  - source_labels: [__name__, instance]\n"
            "    regex: '(DCGM_.+);gpu-node-\\d\\d(\\d)\\d'\n"
            "    target_label: __name__\n    replacement: '${1}_b${2}'\n")


def group_entry(member: QueueMember, url: str) -> dict[str, Any]:
    return remote_write_entry(group_name=member.group, name_regex=member.name_regex, url=url)


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


# The Go runtime's own account of the heap, read from the server's /metrics beside its RSS (every run alike):
# in use (live objects and their spans) against what the runtime holds and has not returned to the OS.
GO_MEMSTATS = ("go_memstats_heap_inuse_bytes", "go_memstats_heap_alloc_bytes", "go_memstats_heap_idle_bytes",
               "go_memstats_heap_released_bytes", "go_memstats_next_gc_bytes", "go_memstats_sys_bytes")


def go_memstats(client: PrometheusClient) -> dict[str, float]:
    """The server's ``go_memstats_*`` gauges in MB (one read of its ``/metrics``)."""
    found: dict[str, float] = {}
    for line in client.metrics_text().splitlines():
        name, _, value = line.partition(" ")
        if name in GO_MEMSTATS:
            found[name.removeprefix("go_memstats_").removesuffix("_bytes") + "_mb"] = float(value) / 2**20
    return found


def rss_split_mb(pid: int) -> dict[str, float]:
    """RssAnon (the heap, stacks) and RssFile (the binary, mmapped TSDB chunks) from ``/proc/<pid>/status``, MB."""
    found: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                found[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return found


def measure(sources: Sequence[Source], seconds: float) -> list[dict[str, Any]]:
    """For each source, sampled together every 2 s over the same ``seconds``: RSS (median and peak), its anon/file
    split and the Go heap's memstats (medians), CPU (share of one core)."""
    pids = [s.proc.pid for s in sources]
    assert all(pid is not None for pid in pids)
    rss: list[list[float]] = [[] for _ in sources]
    stats: list[dict[str, list[float]]] = [{} for _ in sources]
    t0, c0 = time.monotonic(), [cpu_ticks(pid) for pid in pids]  # type: ignore[arg-type]
    while time.monotonic() - t0 < seconds:
        for i, source in enumerate(sources):
            value = source.proc.rss_mb()
            if value is not None:
                rss[i].append(value)
            for key, mb in {**go_memstats(source.client), **rss_split_mb(pids[i])}.items():  # type: ignore[arg-type]
                stats[i].setdefault(key, []).append(mb)
        time.sleep(2.0)
    elapsed = time.monotonic() - t0
    out = []
    for i, source in enumerate(sources):
        cpu = (cpu_ticks(pids[i]) - c0[i]) / CLK_TCK / elapsed  # type: ignore[arg-type]
        out.append({"rss_mb": round(statistics.median(rss[i]), 1), "rss_peak_mb": round(max(rss[i]), 1),
                    "cpu": round(cpu, 4), "uptime_s": round(time.monotonic() - source.started_at),
                    "rss_every_10s_mb": rss[i][::5],
                    "memory_mb": {key: round(statistics.median(v), 1) for key, v in stats[i].items()}})
    return out


class Source:
    """One source Prometheus for one run, its config edited with promshift's render and reloaded."""

    def __init__(self, tmp: Path, run: str, scrape_s: float, sd_path: Path) -> None:
        (port,) = find_free_ports(1)
        self.run = run
        self.config = base_config(run, scrape_s, sd_path).encode()
        self.proc = PrometheusProcess(run, tmp, port=port, config=self.config.decode(),
                                      flags=("--web.enable-lifecycle",), start=False)
        self.client = PrometheusClient(self.proc.url, timeout_s=60)

    def start(self) -> Source:
        self.proc.config_path.write_bytes(self.config)
        self.started_at = time.monotonic()
        self.proc.start().wait_ready()
        return self

    def write(self, config: bytes) -> float:
        """Write and reload; the reload's time (a new entry's queue starts there, at the WAL's head)."""
        self.config = config
        self.proc.config_path.write_bytes(config)
        at = time.time()
        self.client.reload()
        return at


def count(client: PrometheusClient, expr: str, at: float) -> float:
    result = client.query(expr, at=at)
    return sum(s.points[-1][1] for s in result.series) if result.series else 0.0


def prove(source: Source, receiver: PrometheusClient, swap: Any, since: float, scrape_s: float,
          deadline_s: float) -> dict[str, Any]:
    """Measure the swap's overlap (``QueueSwap.prove``'s probe) until it passes; past the deadline the bench stops."""
    probe = PrometheusQueueProbe(source.client, receiver, target_matchers=f',bench_run="{source.run}"')
    started = time.monotonic()
    while True:
        src = {m.group: probe.source_series(m) for m in swap.prove}
        tgt = {m.group: probe.target_fresh(m, since) for m in swap.prove}
        proof = swap_proof([m.group for m in swap.prove], source_series=src, target_fresh=tgt,
                           merged_sent=probe.queue_sent(swap.added_name), expected_sent=sum(src.values()))
        if proof.verdict is Verdict.SUCCESSFUL:
            return {"verdict": proof.verdict.value, "wait_s": round(time.monotonic() - started, 1)}
        if time.monotonic() - started > deadline_s:
            raise SystemExit(f"swap {swap.added_name} not proven after {deadline_s:.0f}s: {proof.reason}")
        time.sleep(min(2.0, scrape_s / 4))


def bounded_run(source: Source, members: list[QueueMember], url: str, cap: int, receiver: PrometheusClient,
                scrape_s: float) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Grow the source to every group under ``cap``: add group entries, merge them when the cap is reached."""
    joined: dict[str, float] = {}
    swaps: list[dict[str, Any]] = []
    pending = list(members)
    config = source.config
    while pending:
        room = cap - len(promshift_queues(config))
        if room <= 0:
            cut_over = [q.groups()[0] for q in promshift_queues(config) if not q.merged]
            swap = plan_merge(config, url=url, cut_over=cut_over)
            assert swap is not None
            t_add = source.write(with_added(config, swap))
            proof = prove(source, receiver, swap, t_add, scrape_s, deadline_s=max(120.0, 8 * scrape_s))
            config = with_removed(source.config, swap)
            source.write(config)
            swaps.append({"added": swap.added_name, "members": len(swap.prove), "removed": len(swap.remove), **proof})
            continue
        batch, pending = pending[:room], pending[room:]
        for member in batch:
            config = add_remote_write(config, group_entry(member, url))
        at = source.write(config)
        for member in batch:
            joined[member.group] = at
    return swaps, joined


def lost_samples(source: Source, receiver: PrometheusClient, members: list[QueueMember],
                 joined: dict[str, float], end: float, scrape_s: float) -> dict[str, int]:
    """Samples on the source minus samples on the receiver, per group, from its first full scrape to ``end``."""
    lost: dict[str, int] = {}
    extra = f',bench_run="{source.run}"'
    for m in members:
        start = joined[m.group] + 2 * scrape_s  # the entry starts at the reload: count from a scrape wholly after it
        window = f"[{max(1, int(end - start))}s]"
        lost[m.group] = 0
        for name in m.name_regex.split("|"):  # one name per query: count_over_time drops __name__
            src = count(source.client, f"sum(count_over_time({name}{window}))", at=end)
            tgt = count(receiver, f'sum(count_over_time({name}{{{extra[1:]}}}{window}))', at=end)
            lost[m.group] += int(src - tgt)
    return lost


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--groups", default="1,8,32,128")
    parser.add_argument("--cap", type=int, default=4)
    parser.add_argument("--scrape", type=float, default=15.0, help="scrape interval (s)")
    parser.add_argument("--settle", type=float, default=90.0, help="seconds before measuring")
    parser.add_argument("--measure", type=float, default=60.0, help="seconds measured")
    parser.add_argument("--modes", default="per_group,bounded",
                        help="which runs besides the baselines (comma-separated: per_group, bounded)")
    parser.add_argument("--out", default=str(REPO / "bench/results/source-queues.json"))
    args = parser.parse_args()
    ns = [int(n) for n in args.groups.split(",")]
    fleet = FleetSpec(nodes=args.nodes)
    per_gpu = sorted({line.split("{", 1)[0] for line in render_node(fleet, 0, time.time()).splitlines()
                      if line and not line.startswith("#")})
    names = metric_names(per_gpu)
    server = FleetServer(fleet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    started = time.time()
    results: dict[str, Any] = {"runs": {}}
    with tempfile.TemporaryDirectory(prefix="promshift-queues-") as tmp_name:
        tmp = Path(tmp_name)
        sd = write_file_sd(fleet, server.port, tmp / "fleet.json")
        (rport,) = find_free_ports(1)
        receiver_proc = PrometheusProcess("receiver", tmp, port=rport, config="global: {}\n",
                                          flags=("--web.enable-remote-write-receiver",)).__enter__()
        receiver = PrometheusClient(receiver_proc.url, timeout_s=120)
        url = f"{receiver_proc.url}/api/v1/write"
        bounded_sources: list[tuple[Source, list[QueueMember], dict[str, float]]] = []
        try:
            def with_entries(source: Source, members: list[QueueMember]) -> Source:
                config = source.config
                for m in members:
                    config = add_remote_write(config, group_entry(m, url))
                source.config = config
                return source

            def run(name: str, members: list[QueueMember], bounded: bool) -> dict[str, Any]:
                source = Source(tmp, name, args.scrape, sd)
                swaps: list[dict[str, Any]] = []
                if not bounded:
                    with_entries(source, members).start()
                    time.sleep(args.settle)
                    numbers = measure([source], args.measure)[0]
                else:
                    # Its twin: one entry keeping everything, started with it and measured in the same window (the
                    # same uptime: a source's RSS still grows minutes after its start, and the swaps take minutes).
                    twin = with_entries(Source(tmp, f"{name}_single", args.scrape, sd), groups_of(names, 1)).start()
                    source.start()
                    swaps, joined = bounded_run(source, members, url, args.cap, receiver, args.scrape)
                    bounded_sources.append((source, members, joined))
                    time.sleep(args.settle)  # measured as long after its last change as a fresh run after its start
                    numbers, twin_numbers = measure([source, twin], args.measure)
                    twin.proc.stop()
                    numbers["single_entry_same_uptime"] = twin_numbers
                entries = len(promshift_queues(source.config))
                if not bounded:
                    source.proc.stop()
                print(f"{name}: {entries} entries, {len(swaps)} swaps, {numbers}", flush=True)
                return {**numbers, "entries": entries, "swaps": len(swaps), "swap_log": swaps}

            results["runs"]["no_entry"] = run("no_entry", [], bounded=False)
            results["runs"]["single_entry"] = run("single_entry", groups_of(names, 1), bounded=False)
            modes = set(args.modes.split(","))
            for n in ns:
                if "per_group" in modes:
                    results["runs"][f"per_group_{n}"] = run(f"per_group_{n}", groups_of(names, n), bounded=False)
                if "bounded" not in modes:
                    continue
                results["runs"][f"bounded_{n}"] = run(f"bounded_{n}", groups_of(names, n), bounded=True)
                bounded_source = bounded_sources[-1][0]
                # Count losses now (the source is still up), then free it before the next run.
                time.sleep(3 * args.scrape)
                end = time.time() - 2 * args.scrape
                src, members, joined = bounded_sources[-1]
                lost = lost_samples(src, receiver, members, joined, end, args.scrape)
                results["runs"][f"bounded_{n}"]["samples_lost"] = sum(lost.values())
                results["runs"][f"bounded_{n}"]["lost_by_group"] = {g: v for g, v in lost.items() if v}
                bounded_source.proc.stop()
        finally:
            for source, _, _ in bounded_sources:
                source.proc.stop()
            receiver_proc.stop()
            server.shutdown()
    runs = results["runs"]
    single = runs["single_entry"]["rss_mb"]
    out = {
        "bench": "source-queues",
        "series": args.nodes * fleet.gpus_per_node * len(per_gpu),
        "metric_names": len(names),
        "groups": ns,
        "cap": args.cap,
        "scrape_interval_s": args.scrape,
        "settle_s": args.settle,
        "measure_s": args.measure,
        "no_entry_rss_mb": runs["no_entry"]["rss_mb"],
        "no_entry_cpu": runs["no_entry"]["cpu"],
        "single_entry_rss_mb": single,
        "single_entry_cpu": runs["single_entry"]["cpu"],
        **{f"{mode}_{key}": [runs[f"{mode}_{n}"][field] for n in ns]
           for mode in ("per_group", "bounded") if f"{mode}_{ns[-1]}" in runs
           for key, field in (("rss_mb", "rss_mb"), ("rss_peak_mb", "rss_peak_mb"), ("cpu", "cpu"),
                              ("entries", "entries"))},
        **({"swaps": [runs[f"bounded_{n}"]["swaps"] for n in ns],
            "samples_lost": sum(runs[f"bounded_{n}"]["samples_lost"] for n in ns),
            "bounded_over_single_rss_at_max": round(runs[f"bounded_{ns[-1]}"]["rss_mb"] / single, 3),
            "bounded_uptime_s": [runs[f"bounded_{n}"]["uptime_s"] for n in ns],
            "single_entry_same_uptime_rss_mb": [runs[f"bounded_{n}"]["single_entry_same_uptime"]["rss_mb"]
                                                for n in ns],
            "single_entry_same_uptime_cpu": [runs[f"bounded_{n}"]["single_entry_same_uptime"]["cpu"] for n in ns],
            "bounded_over_same_uptime_single_rss_at_max": round(
                runs[f"bounded_{ns[-1]}"]["rss_mb"] / runs[f"bounded_{ns[-1]}"]["single_entry_same_uptime"]["rss_mb"],
                3),
            **{f"{key}_at_max_mb": {
                "bounded": runs[f"bounded_{ns[-1]}"]["memory_mb"].get(key),
                "single_entry": runs["single_entry"]["memory_mb"].get(key),
                "single_entry_same_uptime": runs[f"bounded_{ns[-1]}"]["single_entry_same_uptime"]["memory_mb"].get(key)}
               for key in ("heap_inuse_mb", "heap_alloc_mb", "RssAnon", "RssFile")}}
           if f"bounded_{ns[-1]}" in runs else {}),
        **({"per_group_over_single_rss_at_max": round(runs[f"per_group_{ns[-1]}"]["rss_mb"] / single, 3)}
           if f"per_group_{ns[-1]}" in runs else {}),
        "prometheus": subprocess.run(["prometheus", "--version"], capture_output=True, text=True,
                                     check=False).stdout.splitlines()[0],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), nice {os.nice(0)}",
        "wall_s": round(time.time() - started),
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
