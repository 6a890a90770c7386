"""Source queues: a source's RSS and CPU with 1, 8, 32, 128 dual-writing groups, one entry each vs bounded queues.

Issue 36, item 1. Every ``remote_write`` entry keeps its own queue tailing the WAL
(prometheus/prometheus#13174), so one entry per group costs the source memory and CPU per group. promshift
bounds that: at most ``--cap`` promshift queues per source, cut-over groups merged into one entry
(``core.render.merged_remote_write_entry``) by swaps that add the merged entry, prove it, then remove
the entries it replaces (``core.queues``).

Everything is real, on 127.0.0.1: the DCGM fleet simulator (``--nodes`` × 8 GPUs × 25 per-GPU metrics = 40,000
series at 200 nodes), Debian's Prometheus 2.42 as the source, and a second 2.42 with
``--web.enable-remote-write-receiver`` as the receiver (one per phase; its sources told apart by the external
label ``bench_run``; an out-of-order window of ``RECEIVER_OOO_WINDOW_S``, as promshift requires of a target before
a swap's overlap, checked with ``core.queues.overlap_refusal``). To have 128 groups keyed on ``__name__`` as
promshift's are, the source's scrape renames each metric by the tens digit of its node
(``DCGM_FI_DEV_GPU_UTIL_b3``): 250 names, 160 series each; group *i* of *N* keeps names *j* with *j* mod *N* =
*i*. Every run sends the same 40,000 series.

One phase per group count N, every row of it a fresh source started at the same moment, beside a fresh
receiver of its own, and measured together in the same window (``--measure`` s, ``--settle`` s after the
bounded source's last swap), so every row has the same uptime and the same neighbours on the shared machine:

- ``bounded``: starts with no entry; the groups arrive ``--cap`` - 1 at a time as their own entries
  (dual-writing), and each time the cap is reached the entries present (taken as cut over) are merged into a new
  merged entry by a swap (add, prove with ``core.queues.swap_proof`` on real answers, remove); at rest the source
  carries the merged entry and at most ``cap`` - 1 group entries;
- ``per_group``: N entries, one per group, loaded at start (what promshift did before);
- ``single_entry_0`` .. ``single_entry_{--twins - 1}``: one entry keeping every series (the baseline), started
  with the bounded source: ``single_entry_rss_mb`` is their mean at the largest N, the same uptime as the bounded
  source it is compared with. Two identical sources measured together differ (up to 10% in the run before this
  one), so there are two of them in every phase and their spread is reported (``identical_one_entry_spread``;
  at 1 group one entry each is the same entry again and counts as a third);
- ``no_entry``: no ``remote_write`` at all.

Why twins instead of fresh runs: a source's RSS still grows minutes after its start, and 42 swaps take about
15 minutes, so a fresh single entry measured 150 s after its start (the previous baseline, 273 MB) is not the
bounded source's equal (1.34x against it, 1.14x against a twin of the same uptime). The fresh number is kept:
the phase without swaps (1 group) is measured 150 s after its start, and its twins' mean is
``single_entry_fresh_rss_mb`` (``bounded_over_fresh_single_rss_at_max`` beside ``bounded_over_single_rss_at_max``).

What is left over a twin, and why it stays: each swap's add starts a new queue for the merged entry, which
re-reads the WAL and builds its series cache while the old merged queue still holds its own (the proof needs
that overlap: the old entries go only once the new one is shown to carry every series), so the heap peaks at
about two merged queues and the Go runtime keeps part of that peak (its metadata, and freed pages up to about
the next GC goal). Nothing promshift can change shortens it without giving up the lossless swap: removing
before adding loses samples; the number of swaps is set by the cap and how groups arrive (N / (cap - 1)); a
merge tree of several merged entries would still overlap two full-size ones at least once, and that peak is what
stays. The source itself is never tuned (no GOGC or GODEBUG on any row). At rest the bounded source also carries
the group entries that arrived after the last merge (one at 128 groups), which is the design, not a transient.

Every sample also reads the server's Go heap (``go_memstats_heap_inuse_bytes``, ``heap_alloc``, ``heap_idle``,
``heap_released``, ``next_gc``) and the RSS split (``RssAnon``, ``RssFile``), the same way for every row.

``samples_lost`` is counted on the target: for every group of every bounded run, the samples the source
holds between the group's first full scrape after its entry was loaded and the end of the run, minus
the samples the receiver holds for it over the same window (0 means nothing was lost across any swap).

Run: ``nice -n 10 .venv/bin/python bench/source_queues/run.py`` (about 30 minutes on 2 quiet
cores, longer under load); writes
``bench/results/source-queues.json``. ``machine`` records the 1-minute load at each phase's start, after its
swaps and after its measure (the machine is shared).
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
    out_of_order_window_of,
    overlap_refusal,
    plan_merge,
    promshift_queues,
    swap_proof,
    undo_added,
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
RECEIVER_OOO_WINDOW_S = 600.0


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
        # Stopping the replaced queues flushes each (up to its 1 min flush deadline, one after another): on a loaded
        # machine a removal's reload took over 120 s.
        self.client.reload(timeout_s=600.0)
        return at


def count(client: PrometheusClient, expr: str, at: float) -> float:
    result = client.query(expr, at=at)
    return sum(s.points[-1][1] for s in result.series) if result.series else 0.0


def prove(source: Source, receiver: PrometheusClient, swap: Any, since: float, scrape_s: float,
          deadline_s: float) -> dict[str, Any]:
    """Measure the swap's overlap (``QueueSwap.prove``'s probe) until it passes; past the deadline the verdict is
    FAILED (the caller undoes the add, as ``steps.queues`` does)."""
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
            print(f"swap {swap.added_name} not proven after {deadline_s:.0f}s: {proof.reason}", flush=True)
            return {"verdict": Verdict.FAILED.value, "wait_s": round(time.monotonic() - started, 1),
                    "reason": proof.reason}
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
            # promshift's own proof deadline (steps.queues.QueueSwap's proof_deadline_s): a loaded machine slows a new
            # queue's first sends, and an unproven swap is INCONCLUSIVE (wait), not a loss.
            proof = prove(source, receiver, swap, t_add, scrape_s, deadline_s=max(300.0, 8 * scrape_s))
            swaps.append({"added": swap.added_name, "members": len(swap.prove), "removed": len(swap.remove), **proof})
            if proof["verdict"] != Verdict.SUCCESSFUL.value:
                # promshift undoes the add (the group entries stay, nothing is lost) and merges at the next admission.
                if sum(s["verdict"] != Verdict.SUCCESSFUL.value for s in swaps) > 3:
                    raise SystemExit("more than 3 swaps failed their proof: the machine is too loaded to measure")
                source.write(undo_added(source.config, swap))
                config = source.config
                continue
            config = with_removed(source.config, swap)
            source.write(config)
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


def phase(n: int, members: list[QueueMember], names: list[str], args: argparse.Namespace, tmp: Path,
          sd: Path) -> dict[str, Any]:
    """One group count: every row of it started together on its own fresh receiver, measured in the same window.

    The bounded source grows through its swaps while the others (one entry each, the single-entry twins, no
    entry) run unchanged beside it; all are measured ``--settle`` s after the last swap, so every row has the
    same uptime and the same neighbours on the machine."""
    (rport,) = find_free_ports(1)
    # promshift starts a swap only on a target whose out-of-order window covers the overlap (``overlap_refusal``): a
    # duplicate older than its series' newest sample otherwise gets the whole batch refused. The receiver meets that
    # rule with room for a lagging new queue (a receiver without a window refused batches in a loaded run).
    receiver_config = f"storage:\n  tsdb:\n    out_of_order_time_window: {RECEIVER_OOO_WINDOW_S:g}s\n"
    refusal = overlap_refusal(out_of_order_window_of(receiver_config), scrape_interval_s=args.scrape)
    if refusal:
        raise SystemExit(refusal)
    receiver_proc = PrometheusProcess(f"receiver_{n}", tmp, port=rport, config=receiver_config,
                                      flags=("--web.enable-remote-write-receiver",)).__enter__()
    receiver = PrometheusClient(receiver_proc.url, timeout_s=120)
    url = f"{receiver_proc.url}/api/v1/write"

    def source(name: str, entries: list[QueueMember]) -> Source:
        s = Source(tmp, f"{name}_{n}", args.scrape, sd)
        config = s.config
        for m in entries:
            config = add_remote_write(config, group_entry(m, url))
        s.config = config
        return s

    rows: dict[str, Source] = {"no_entry": source("no_entry", [])}
    if "per_group" in args.modes.split(","):
        rows["per_group"] = source("per_group", members)
    for k in range(args.twins):
        rows[f"single_entry_{k}"] = source(f"single_entry_{k}", groups_of(names, 1))
    rows["bounded"] = bounded = source("bounded", [])
    try:
        for s in rows.values():
            s.start()
        load = {"at_start": os.getloadavg()[0]}
        swaps, joined = bounded_run(bounded, members, url, args.cap, receiver, args.scrape)
        load["after_swaps"] = os.getloadavg()[0]
        time.sleep(args.settle)  # as long after the last swap as after the start of a run without swaps
        numbers = dict(zip(rows, measure(list(rows.values()), args.measure), strict=True))
        load["after_measure"] = os.getloadavg()[0]
        # Count losses now (the source is still up) over a window that ends two scrapes ago (both sides complete).
        time.sleep(3 * args.scrape)
        lost = lost_samples(bounded, receiver, members, joined, time.time() - 2 * args.scrape, args.scrape)
    finally:
        for s in rows.values():
            s.proc.stop()
        receiver_proc.stop()
    entries = {key: len(promshift_queues(s.config)) for key, s in rows.items()}
    out = {key: {**numbers[key], "entries": entries[key]} for key in rows}
    out["bounded"].update(swaps=len(swaps), swap_log=swaps, samples_lost=sum(lost.values()),
                          lost_by_group={g: v for g, v in lost.items() if v})
    out["load_1min"] = {k: round(v, 2) for k, v in load.items()}
    print(f"groups {n}: " + json.dumps({k: (v.get("rss_mb"), v.get("uptime_s")) if "rss_mb" in v else v
                                        for k, v in out.items()}), flush=True)
    return out


def spread(values: Sequence[float]) -> float:
    """(max - min) / mean: how far identical sources measured together differ."""
    return round((max(values) - min(values)) / statistics.mean(values), 3) if len(values) > 1 else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--groups", default="1,8,32,128")
    parser.add_argument("--cap", type=int, default=4)
    parser.add_argument("--scrape", type=float, default=15.0, help="scrape interval (s)")
    parser.add_argument("--settle", type=float, default=90.0, help="seconds between the last swap and the measure")
    parser.add_argument("--measure", type=float, default=60.0, help="seconds measured")
    parser.add_argument("--twins", type=int, default=2, help="single-entry sources in every phase (the noise)")
    parser.add_argument("--modes", default="per_group",
                        help="rows besides bounded, no entry and the single-entry twins ('per_group' or '')")
    parser.add_argument("--out", default=str(REPO / "bench/results/source-queues.json"))
    args = parser.parse_args()
    if args.twins < 1:
        parser.error("--twins must be at least 1 (the baseline is a single-entry source of the same uptime)")
    ns = [int(n) for n in args.groups.split(",")]
    fleet = FleetSpec(nodes=args.nodes)
    per_gpu = sorted({line.split("{", 1)[0] for line in render_node(fleet, 0, time.time()).splitlines()
                      if line and not line.startswith("#")})
    names = metric_names(per_gpu)
    server = FleetServer(fleet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    started = time.time()
    phases: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="promshift-queues-") as tmp_name:
            tmp = Path(tmp_name)
            sd = write_file_sd(fleet, server.port, tmp / "fleet.json")
            for i, n in enumerate(ns):
                phases[f"groups_{n}"] = phase(n, groups_of(names, n), names, args, tmp, sd)
                if i + 1 < len(ns):  # what is measured survives a later phase's failure (marked partial)
                    write(summary(ns[:i + 1], phases, args, len(per_gpu), names, fleet, started), args.out,
                          partial=True)
    finally:
        server.shutdown()
    write(summary(ns, phases, args, len(per_gpu), names, fleet, started), args.out, partial=False)
    return 0


def write(out: dict[str, Any], path: str, *, partial: bool) -> None:
    out = {**out, "partial": partial}
    Path(path).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "phases"}, indent=1), flush=True)


def summary(ns: list[int], phases: dict[str, Any], args: argparse.Namespace, per_gpu: int, names: list[str],
            fleet: FleetSpec, started: float) -> dict[str, Any]:
    """The result's keys from the phases measured so far."""
    p = [phases[f"groups_{n}"] for n in ns]
    twins = [[ph[f"single_entry_{k}"]["rss_mb"] for k in range(args.twins)] for ph in p]
    single = [round(statistics.mean(t), 1) for t in twins]
    fresh = min(range(len(ns)), key=lambda i: p[i]["bounded"]["uptime_s"])  # the phase without swaps (1 group)
    bounded = [ph["bounded"]["rss_mb"] for ph in p]
    has_per_group = "per_group" in p[-1]
    # Identical one-entry configurations measured together: the twins, and one entry each at 1 group (the same entry).
    identical = [t + ([ph["per_group"]["rss_mb"]] if has_per_group and n == 1 else []) for n, ph, t in
                 zip(ns, p, twins, strict=True)]
    return {
        "bench": "source-queues",
        "series": args.nodes * fleet.gpus_per_node * per_gpu,
        "metric_names": len(names),
        "groups": ns,
        "cap": args.cap,
        "scrape_interval_s": args.scrape,
        "settle_s": args.settle,
        "measure_s": args.measure,
        "method": ("every row of a group count started together and measured in the same window, "
                   f"{args.settle:g} s after the bounded source's last swap (same uptime, same neighbours); "
                   f"{args.twins} single-entry twins per group count estimate the noise"),
        "uptime_s": [ph["bounded"]["uptime_s"] for ph in p],
        "uptime_spread_s": [max(v["uptime_s"] for v in ph.values() if "uptime_s" in v)
                            - min(v["uptime_s"] for v in ph.values() if "uptime_s" in v) for ph in p],
        **({"per_group_rss_mb": [ph["per_group"]["rss_mb"] for ph in p],
            "per_group_rss_peak_mb": [ph["per_group"]["rss_peak_mb"] for ph in p],
            "per_group_cpu": [ph["per_group"]["cpu"] for ph in p],
            "per_group_entries": [ph["per_group"]["entries"] for ph in p]} if has_per_group else {}),
        "bounded_rss_mb": bounded,
        "bounded_rss_peak_mb": [ph["bounded"]["rss_peak_mb"] for ph in p],
        "bounded_cpu": [ph["bounded"]["cpu"] for ph in p],
        "bounded_entries": [ph["bounded"]["entries"] for ph in p],
        "swaps": [ph["bounded"]["swaps"] for ph in p],
        "single_entry_rss_mb": single[-1],
        "single_entry_cpu": round(statistics.mean(p[-1][f"single_entry_{k}"]["cpu"] for k in range(args.twins)), 4),
        "single_entry_same_uptime_rss_mb": single,
        "single_entry_same_uptime_cpu": [round(statistics.mean(ph[f"single_entry_{k}"]["cpu"]
                                                               for k in range(args.twins)), 4) for ph in p],
        "single_entry_twins_rss_mb": twins,
        "single_entry_fresh_rss_mb": single[fresh],
        "single_entry_fresh_uptime_s": p[fresh]["bounded"]["uptime_s"],
        "no_entry_rss_mb": [ph["no_entry"]["rss_mb"] for ph in p],
        "no_entry_cpu": [ph["no_entry"]["cpu"] for ph in p],
        "identical_one_entry_rss_mb": identical,
        "identical_one_entry_spread": [spread(v) for v in identical],
        "bounded_over_single_rss": [round(b / s, 3) for b, s in zip(bounded, single, strict=True)],
        "bounded_over_single_rss_at_max": round(bounded[-1] / single[-1], 3),
        "bounded_over_single_rss_at_max_range": [round(bounded[-1] / max(twins[-1]), 3),
                                                 round(bounded[-1] / min(twins[-1]), 3)],
        "bounded_over_fresh_single_rss_at_max": round(bounded[-1] / single[fresh], 3),
        "bounded_within_1_25x_single_at_max": bounded[-1] <= 1.25 * single[-1],
        **({"per_group_over_single_rss_at_max": round(p[-1]["per_group"]["rss_mb"] / single[-1], 3)}
           if has_per_group else {}),
        "samples_lost": sum(ph["bounded"]["samples_lost"] for ph in p),
        "samples_lost_by_groups": [ph["bounded"]["samples_lost"] for ph in p],
        **{f"{key}_at_max_mb": {row: p[-1][row]["memory_mb"].get(key) for row in p[-1] if "memory_mb" in p[-1][row]}
           for key in ("heap_inuse_mb", "heap_alloc_mb", "heap_idle_mb", "heap_released_mb", "sys_mb",
                       "RssAnon", "RssFile")},
        "prometheus": subprocess.run(["prometheus", "--version"], capture_output=True, text=True,
                                     check=False).stdout.splitlines()[0],
        "machine": (f"{platform.machine()}, {os.cpu_count()} cores shared with other sessions' work, "
                    f"nice {os.nice(0)}; 1-min load at each group count's start / after its swaps / after its "
                    "measure: " + "; ".join(f"{n}: {ph['load_1min']['at_start']}/{ph['load_1min']['after_swaps']}/"
                                           f"{ph['load_1min']['after_measure']}" for n, ph in zip(ns, p, strict=True))),
        "wall_s": round(time.time() - started),
        "phases": {f"groups_{n}": phases[f"groups_{n}"] for n in ns},
    }


if __name__ == "__main__":
    raise SystemExit(main())
