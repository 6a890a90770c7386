"""Parity at fleet scale: promshift's layered parity vs a naive fetch-everything baseline.

Issue: at 2,000 nodes x 8 GPUs, one catalog group of 4 DCGM metrics, a 1 h dual-written
window (backfilled) with faults planted on the target -- 0.1 % of series missing, one
host's ``Hostname`` label renamed to ``hostname``, one host's values off by 1 % -- run
promshift's parity (``ParityCheck.run``) and, in the same run, a naive baseline that pulls
every series' full raw range from both sides and compares every sample (what Mimir's
query-tee would do), then print and write ``bench/results/parity.json``.

``--group whole-fleet``: the same run with one group claiming every metric the fleet simulator
renders -- all 25 of dcgm-exporter's default counters (``include/promshift/data/
dcgm_default_counters.csv``; the 26th line, ``DCGM_FI_DRIVER_VERSION``, is a label) -- 400,000
series per side at 2,000 nodes; writes ``bench/results/parity-whole-fleet.json``.

What it does, on 127.0.0.1 only, in a throwaway directory under $TMPDIR (never the repo):

1. picks a 1 h window (121 samples at 30 s) ending >= 30 min ago and inside one 2 h-aligned
   TSDB block (promtool aligns blocks to multiples of --max-block-duration; one block means
   one parsing pass);
2. writes three OpenMetrics files with ``promshift.local.stack.backfill.write_openmetrics`` (the fleet's
   values; the labels the live scrape stores: dcgm-exporter's + ``instance``/``job``): ``source``; ``target``
   (the source's external labels added, as remote-written series carry them, and the
   faults applied); ``clean`` (external labels, no faults: the false-positive check).
   The text of all three is estimated first; if it exceeds half the free disk, the sides
   are written in passes (as many per pass as fit, each pass renders the fleet again),
   each pass backfilled and deleted before the next;
3. backfills each with ``promtool tsdb create-blocks-from openmetrics --max-block-duration=2h``
   (``promshift.local.stack.backfill.create_blocks``: wall time; promtool's peak RSS from VmHWM polled
   every 0.1 s, the machine's lowest MemAvailable meanwhile), deletes the text, starts three plain
   Prometheus servers on free ports (``promshift.local.stack.prometheus.PrometheusProcess``, as the tests
   do), warms their page cache;
4. runs promshift's parity (source vs faulty target) ``--repeats`` times, the naive
   baseline once, promshift on the clean pair ``--clean-runs`` times with different
   seeds, and the naive baseline on the clean pair once. Every run is a child process
   (``python run.py --child ...``) that reports its own peak RSS (``VmHWM`` from
   /proc/self/status: that process alone, interpreter + imports + the check; ``ru_maxrss``
   would start from the forking parent's RSS), its wall time around the check, and the
   servers' own ``evalTotalTime`` summed by the client ledger, split by kind of query;
5. judges which planted faults each side found from its evidence, prints a summary and
   writes ``bench/results/parity.json``; stops the servers and removes the directory.
   If a step fails (disk, memory, promtool), ``<out>.failed.json`` records where, the error,
   and the free disk and MemAvailable at the start and at the failure.

Run: ``.venv/bin/python bench/parity/run.py`` (about 8 minutes on 2 cores, ~9 GB of temporary
OpenMetrics text at the peak;
``--nodes 100`` for a quick smoke run that does not write the result file unless
``--out`` is given).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from promshift.local.stack.backfill import (
    SeriesChange,
    SeriesChanges,
    Side,
    create_blocks,
    estimate_openmetrics_bytes,
    mem_available_mb,
)
from promshift.local.stack.backfill import write_openmetrics as write_sides
from promshift.local.stack.local import find_free_ports
from promshift.local.stack.prometheus import PROMETHEUS_BIN, PROMTOOL_BIN, PrometheusProcess

REPO = Path(__file__).resolve().parents[2]
RESULT_PATH = REPO / "bench" / "results" / "parity.json"
WHOLE_FLEET = "whole-fleet"
WHOLE_FLEET_RESULT_PATH = REPO / "bench" / "results" / "parity-whole-fleet.json"
GROUPS = ("gpu-power-thermal", "gpu-utilization", WHOLE_FLEET)
PROMETHEUS = PROMETHEUS_BIN
PROMTOOL = PROMTOOL_BIN
BLOCK_S = 7200  # promtool --max-block-duration=2h: blocks aligned to multiples of 2 h
STEP_S = 30.0
WINDOW_S = 3600
MISSING_RATIO = 0.001
DRIFT_FACTOR = 1.01
# At most this share of the free disk is filled with OpenMetrics text at once (other work shares the disk):
# if the three sides' text does not fit, each side is written, backfilled and deleted in its own pass.
DISK_SHARE = 0.5

_T0 = time.monotonic()


def log(msg: str) -> None:
    """A progress line: wall clock, seconds since start, message."""
    print(f"{datetime.now().strftime('%H:%M:%S')} [{time.monotonic() - _T0:7.1f}s] {msg}", flush=True)


class _ProgressHandler(logging.Handler):
    """``stack.backfill``'s progress lines (``logging``), as this script's own ``log()`` lines."""

    def emit(self, record: logging.LogRecord) -> None:
        log(f"  {record.getMessage()}")


def show_backfill_progress() -> None:
    logger = logging.getLogger("promshift.local.stack.backfill")
    logger.setLevel(logging.INFO)
    if not any(isinstance(h, _ProgressHandler) for h in logger.handlers):
        logger.addHandler(_ProgressHandler())
    logger.propagate = False


def vm_hwm_mb(pid: int | str = "self", field: str = "VmHWM:") -> float | None:
    """Peak RSS (VmHWM) of one process's address space. Unlike ``ru_maxrss`` it starts afresh at
    exec: on Linux ``ru_maxrss`` of an exec'd child starts from the forking parent's RSS."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


# ----------------------------------------------------------------------------- the group under test


def bench_group(name: str) -> Any:
    """The catalog group ``name``; ``whole-fleet`` is one group claiming every metric the fleet
    simulator renders (all of dcgm-exporter's default counters but the label-only
    ``DCGM_FI_DRIVER_VERSION``), with gpu-power-thermal's policies (the catalog defaults)."""
    from promshift.adapters.settings import load_catalog
    from promshift.local.stack.backfill import fleet_metrics

    catalog = load_catalog()
    if name != WHOLE_FLEET:
        return catalog.get(name)
    return dataclasses.replace(catalog.get("gpu-power-thermal"), name=WHOLE_FLEET, depends_on=(),
                               description="every dcgm-exporter default counter the fleet renders, one group",
                               metrics=tuple(fleet_metrics()), metric_regex=None)


# ----------------------------------------------------------------------------- child processes
# Imported lazily so the child's peak RSS is what a parity task would hold, nothing more.


def _child_clients(spec: dict[str, Any]) -> tuple[Any, Any, dict[str, float]]:
    import threading

    from promshift.adapters.prometheus import DEFAULT_MAX_ANSWER_BYTES, PrometheusClient

    untimed: dict[str, Any] = {"calls": 0, "wall_s": 0.0, "by_kind": {}}
    lock = threading.Lock()  # parity may ask source and target from two threads

    def kind_of(path: str, query: str) -> str:
        if "instance=~" in query:
            return "golden (dashboard queries)"
        if "_over_time(" in query:
            return "aggregates (sum/count_over_time by host)"
        if query.startswith("count by (__name__, "):
            return "coverage + host_coverage + sample plan (count by metric, host)"
        if query.startswith("count by (__name__)"):
            return "coverage (count by metric)"
        if query.startswith("count by ("):
            return "host_coverage + sample plan (count by host)"
        if path.endswith("query_range"):
            return "samples (range query per host)"
        if "}[" in query:
            return "naive raw range (m[1h])"
        return "other"

    class TimedClient(PrometheusClient):
        """Per kind of query: count, client wall, server evalTotalTime and its parts. The label APIs
        have no ``stats``, so the ledger misses them: their wall time is counted here."""

        def _api(self, path: str, params: dict[str, Any], query: str, timeout_s: float | None,
                 accept_encoding: str | None = None, max_bytes: int | None = None) -> Any:
            res = super()._api(path, params, query, timeout_s, accept_encoding, max_bytes)
            timings = res.stats.get("timings") or {}
            with lock:
                self._count(path, query, res, timings)
            return res

        def _count(self, path: str, query: str, res: Any, timings: dict[str, Any]) -> None:
            row = untimed["by_kind"].setdefault(kind_of(path, query), {
                "queries": 0, "wall_s": 0.0, "eval_s": 0.0, "prep_s": 0.0, "inner_eval_s": 0.0, "bytes": 0,
                "samples_total": 0})
            row["queries"] += 1
            row["wall_s"] += res.elapsed_s
            row["eval_s"] += res.server_time_s or 0.0
            row["prep_s"] += float(timings.get("queryPreparationTime") or 0.0)
            row["inner_eval_s"] += float(timings.get("innerEvalTime") or 0.0)
            row["bytes"] += res.bytes
            row["samples_total"] += int((res.stats.get("samples") or {}).get("totalQueryableSamples") or 0)

        def _get_list(self, path: str, params: dict[str, Any]) -> list[str]:
            started = time.perf_counter()
            try:
                return super()._get_list(path, params)
            finally:
                with lock:
                    untimed["calls"] += 1
                    untimed["wall_s"] += time.perf_counter() - started

    timeout = float(spec.get("timeout_s", 120))
    # The naive baseline fetches whole metrics at once (~100 MB answers at 2,000 nodes): no cap for it.
    limit = int(spec.get("max_answer_bytes") or DEFAULT_MAX_ANSWER_BYTES)
    return (TimedClient(spec["source"], always_stats=True, timeout_s=timeout, max_answer_bytes=limit),
            TimedClient(spec["target"], always_stats=True, timeout_s=timeout, max_answer_bytes=limit), untimed)


def child_promshift(spec: dict[str, Any]) -> dict[str, Any]:
    from promshift.adapters.parity_check import ParityCheck
    from promshift.adapters.settings import default_catalog_path

    group = bench_group(spec["group"])
    policy = dataclasses.replace(group.parity, step_s=STEP_S, seed=spec.get("seed"))
    if spec.get("no_golden") and getattr(policy, "golden_dashboards", None):
        policy = dataclasses.replace(policy, golden_dashboards=())
    extra: dict[str, Any] = {}
    if "catalog_dir" in {f.name for f in dataclasses.fields(ParityCheck)}:
        # The catalog's relative dashboard path resolves against the catalog's folder (as the operators do).
        extra["catalog_dir"] = default_catalog_path().parent
    if spec.get("limits"):
        # The target's per-query limits, as parity reads them from the workspace (bench/parity_limits).
        from promshift.core.query_limits import QueryLimits

        extra["limits"] = QueryLimits.from_dict(spec["limits"])
    group = dataclasses.replace(group, parity=policy)
    src, tgt, untimed = _child_clients(spec)
    rss_before_mb = vm_hwm_mb()
    cpu0 = time.process_time()
    started = time.perf_counter()
    result = ParityCheck(group, src, tgt, **extra).run(dual_write_since=spec["dual_write_since"], now=spec["now"])
    wall = time.perf_counter() - started
    result = result.to_dict() if hasattr(result, "to_dict") else result  # the JSON the child hands back
    ledgers = [c.ledger.snapshot() for c in (src, tgt)]
    return {"result": result, "wall_s": wall, "cpu_s": time.process_time() - cpu0,
            "peak_rss_mb": vm_hwm_mb(), "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rss_after_imports_mb": rss_before_mb,
            "policy": {k: v for k, v in dataclasses.asdict(policy).items()},
            "ledger": {"source": ledgers[0], "target": ledgers[1]},
            "label_api": untimed}


def child_naive(spec: dict[str, Any]) -> dict[str, Any]:
    """Every series' full raw range from both sides (one ``m[1h]`` query per metric per
    side: the cheapest way to fetch everything), every sample compared after dropping
    the ignored external labels. Keeps the full lists of what differs."""
    from promshift.core.parity import normalize_labels, values_equal

    src, tgt, timed = _child_clients({**spec, "timeout_s": 900, "max_answer_bytes": 2**40})
    ignore = tuple(spec["ignore_labels"])
    host_label = spec["host_label"]
    start, end = spec["start"], spec["end"]
    span = f"{int(end - start)}s"
    missing: list[dict[str, str]] = []
    extra: list[dict[str, str]] = []
    mismatched: dict[str, dict[str, int]] = {}
    series_compared = points_compared = points_mismatched = points_missing = 0
    response_bytes = 0
    per_metric = []
    cpu0 = time.process_time()
    started = time.perf_counter()
    for metric in spec["metrics"]:
        t_metric = time.perf_counter()
        expr = f'{{__name__="{metric}"}}[{span}]'
        sides = []
        for client in (src, tgt):
            res = client.query(expr, at=end)
            response_bytes += res.bytes
            sides.append({normalize_labels(s.labels, ignore=ignore): s.points for s in res.series})
            del res
        source, target = sides
        for labels, points in source.items():
            other = target.get(labels)
            if other is None:
                missing.append(dict(labels))
                points_missing += len(points)
                continue
            series_compared += 1
            by_t = dict(other)
            bad = 0
            for t, v in points:
                w = by_t.get(t)
                if w is None:
                    points_missing += 1
                    continue
                points_compared += 1
                if not values_equal(v, w, abs_tol=1e-9, rel_tol=1e-9):
                    bad += 1
            if bad:
                points_mismatched += bad
                host = dict(labels).get(host_label, "")
                entry = mismatched.setdefault(host, {"series": 0, "points": 0})
                entry["series"] += 1
                entry["points"] += bad
        for labels in target.keys() - source.keys():
            extra.append(dict(labels))
        per_metric.append({"metric": metric, "series_source": len(source), "series_target": len(target),
                           "s": round(time.perf_counter() - t_metric, 3)})
        del sides, source, target
    wall = time.perf_counter() - started
    ledgers = [c.ledger.snapshot() for c in (src, tgt)]
    return {"wall_s": wall, "cpu_s": time.process_time() - cpu0, "peak_rss_mb": vm_hwm_mb(),
            "backend_query_s": sum(x["server_s"] for x in ledgers), "queries_sent": sum(x["queries"] for x in ledgers),
            "response_bytes": response_bytes, "per_metric": per_metric,
            "series_compared": series_compared, "points_compared": points_compared,
            "points_mismatched": points_mismatched, "points_missing": points_missing,
            "missing": missing, "extra": extra, "mismatched_by_host": mismatched,
            "by_kind": _rounded(timed["by_kind"])}


def _rounded(by_kind: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {k: {n: round(v, 3) if isinstance(v, float) else v for n, v in row.items()} for k, row in by_kind.items()}


def run_child(kind: str, spec: dict[str, Any], workdir: Path) -> dict[str, Any]:
    spec_path = workdir / f"child-{kind}-{time.monotonic_ns()}.json"
    out_path = spec_path.with_suffix(".out.json")
    spec_path.write_text(json.dumps(spec))
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", kind, "--spec", str(spec_path),
                           "--child-out", str(out_path)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} child failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    out = json.loads(out_path.read_text())
    out["process_wall_s"] = time.perf_counter() - started
    spec_path.unlink()
    out_path.unlink()
    return out


# ----------------------------------------------------------------------------- machine, ports


def machine_info() -> dict[str, Any]:
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    ram_gib = None
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            ram_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    version = subprocess.run([PROMETHEUS, "--version"], capture_output=True, text=True,
                             check=False).stdout.splitlines()[0]
    return {"cores": os.cpu_count(), "ram_gib": ram_gib, "cpu_model": model, "prometheus": version,
            "python": sys.version.split()[0], "kernel": os.uname().release}


def code_state() -> dict[str, Any]:
    """Which parity code ran: HEAD, and whether parity files had uncommitted edits (shared checkout)."""
    import hashlib

    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True, check=False).stdout.strip()

    files = ["include/promshift/adapters/parity_check.py", "include/promshift/core/parity.py",
             *(f"include/promshift/core/parity_{m}.py" for m in ("labels", "window", "noise", "samples", "golden")),
             "include/promshift/adapters/prometheus.py", "catalog/metric_groups.yaml"]
    dirty = git("status", "--porcelain", "--", *files).splitlines()
    return {"head": git("rev-parse", "--short", "HEAD"), "uncommitted": [d.split(None, 1)[-1] for d in dirty],
            "sha256": {f: hashlib.sha256((REPO / f).read_bytes()).hexdigest()[:12] for f in files}}




def other_load() -> list[str]:
    """Other busy processes right now (this machine is shared): a one-line summary each."""
    out = subprocess.run(["ps", "-eo", "pid,pcpu,rss,args", "--sort=-pcpu"], capture_output=True, text=True,
                         check=False).stdout.splitlines()[1:8]
    me = {os.getpid()}
    rows = []
    for line in out:
        parts = line.split(None, 3)
        if len(parts) == 4 and int(parts[0]) not in me and float(parts[1]) >= 5.0:
            rows.append(f"pid {parts[0]} {parts[1]}% cpu: {parts[3][:90]}")
    return rows


# ----------------------------------------------------------------------------- window and faults


def choose_window(now: float, window_s: int = WINDOW_S) -> tuple[int, int]:
    """A window (start, end) of ``window_s`` (1 h) on the 30 s grid, ending >= 30 min ago, inside one 2 h block."""
    latest_end = int(now) - 1800
    latest_end -= latest_end % int(STEP_S)
    block = latest_end - latest_end % BLOCK_S
    if latest_end - window_s >= block:
        end = latest_end
    else:
        # Too close to the block's start: end the window inside the previous block, 30 s before its end.
        end = block - int(STEP_S)
    start = end - window_s
    assert start // BLOCK_S == end // BLOCK_S, (start, end)
    return start, end


@dataclasses.dataclass(frozen=True)
class FaultPlan:
    drift_host: str
    rename_host: str
    missing: frozenset[tuple[str, str, int]]  # (metric, host, gpu)

    def to_dict(self, series: int, metrics: int, gpus: int) -> dict[str, Any]:
        hosts = sorted({h for _, h, _ in self.missing})
        return {
            "missing_series": {"count": len(self.missing), "ratio": len(self.missing) / series,
                               "hosts": len(hosts),
                               "series": sorted(f'{m}{{Hostname="{h}",gpu="{g}"}}' for m, h, g in self.missing)},
            "label_rename": {"host": self.rename_host, "from": "Hostname", "to": "hostname",
                             "series": f"every series of the host ({metrics} metrics x {gpus} GPUs)"},
            "value_drift": {"host": self.drift_host, "factor": DRIFT_FACTOR,
                            "series": "every series of the host, every sample x 1.01"},
        }


def plan_faults(fleet: Any, metrics: Sequence[str], seed: str) -> FaultPlan:
    rng = random.Random(seed)
    drift_i, rename_i = rng.sample(range(fleet.nodes), 2)
    others = [i for i in range(fleet.nodes) if i not in (drift_i, rename_i)]
    per_host = len(metrics) * fleet.gpus_per_node
    total = fleet.nodes * per_host
    k = max(1, round(MISSING_RATIO * total))
    picks = rng.sample(range(len(others) * per_host), k)
    missing = frozenset((metrics[(p % per_host) // fleet.gpus_per_node], fleet.hostname(others[p // per_host]),
                         p % fleet.gpus_per_node) for p in picks)
    return FaultPlan(fleet.hostname(drift_i), fleet.hostname(rename_i), missing)


# ----------------------------------------------------------------------------- OpenMetrics + backfill


SIDES = ("source", "target", "clean")


def sides_of(plan: FaultPlan, external: dict[str, str], sides: Sequence[str] = SIDES) -> list[Side]:
    """The OpenMetrics sides: ``source`` (the scrape's labels), ``target`` (the source's external labels, as
    remote-written series carry them, and the planted faults) and ``clean`` (external labels, no faults)."""
    every = {"source": Side("source"), "target": Side("target", external, target_changes(plan)),
             "clean": Side("clean", external)}
    return [every[name] for name in SIDES if name in sides]


def target_changes(plan: FaultPlan) -> SeriesChanges:
    """The faulty target's series: the planted missing ones left out, the rename host's ``Hostname`` written as
    ``hostname``, the drift host's values x ``DRIFT_FACTOR``; every other series as the source's."""
    missing, rename = SeriesChange(missing=True), SeriesChange(rename=("Hostname", "hostname"))
    drift = SeriesChange(factor=DRIFT_FACTOR)

    def changes(metric: str, host: str, gpu: int) -> SeriesChange | None:
        if (metric, host, gpu) in plan.missing:
            return missing
        if host == plan.rename_host:
            return rename
        if host == plan.drift_host:
            return drift
        return None

    return changes


def estimate_text_bytes(fleet: Any, metrics: Sequence[str], steps: Sequence[int], external: dict[str, str],
                        job: str) -> dict[str, int]:
    """Bytes of OpenMetrics text per side, from node 0's lines at the first step (within a few %)."""
    plan = FaultPlan("", "", frozenset())  # the faults are not counted: the target is estimated as the clean side
    return estimate_openmetrics_bytes(fleet, metrics, steps, sides_of(plan, external), job=job)


def plan_passes(estimate: dict[str, int], free_bytes: int) -> list[tuple[str, ...]]:
    """Which sides' text is written together: as many sides per pass as fit in ``DISK_SHARE`` of the free
    disk (all three: one rendering of the fleet; each pass renders it again), in SIDES order."""
    budget = free_bytes * DISK_SHARE
    biggest = max(estimate.values())
    if biggest > budget:
        raise RuntimeError(f"disk: one side's OpenMetrics text needs ~{biggest / 1e9:.1f} GB, "
                           f"{DISK_SHARE:.0%} of the free {free_bytes / 1e9:.1f} GB is {budget / 1e9:.1f} GB")
    passes: list[list[str]] = [[]]
    for side in SIDES:
        if sum(estimate[s] for s in passes[-1]) + estimate[side] > budget:
            passes.append([])
        passes[-1].append(side)
    return [tuple(p) for p in passes]


def write_openmetrics(fleet: Any, metrics: Sequence[str], steps: Sequence[int], plan: FaultPlan,
                      external: dict[str, str], job: str, directory: Path,
                      sides: Sequence[str] = SIDES) -> dict[str, Any]:
    """OpenMetrics files of ``sides`` (source, faulty target, clean target) with ``stack.backfill``'s writer,
    streamed; each metric family contiguous, each series time-ordered, ``# EOF`` last."""
    text = write_sides(fleet, directory, steps, metrics, sides_of(plan, external, sides), job=job)
    return {"files": text.files, "samples": text.samples, "bytes": text.bytes}


def backfill(om: Path, data_dir: Path) -> dict[str, Any]:
    """promtool create-blocks-from openmetrics (``stack.backfill.create_blocks``, 2 h blocks), measured: wall
    and CPU time, promtool's peak RSS (and without the mmapped input), the lowest MemAvailable, the blocks.
    The text is left for the caller to delete."""
    run = create_blocks({"side": om}, {"side": data_dir}, promtool=PROMTOOL, delete=False, max_block_duration="2h")
    return run["side"].to_dict()


def start_server(name: str, data_dir: Path, port: int) -> PrometheusProcess:
    """A plain Prometheus on an existing TSDB (no scrape configs), bound to 127.0.0.1."""
    return PrometheusProcess(name, data_dir.parent, port=port, config="global:\n  scrape_interval: 1m\n",
                             data_dir=data_dir, binary=PROMETHEUS,
                             flags=("--storage.tsdb.retention.time=3650d", "--query.max-samples=100000000"))


# ----------------------------------------------------------------------------- judging


def _measurement(result: dict[str, Any], name: str) -> dict[str, Any]:
    return next((m for m in result["measurements"] if m["name"] == name), {"verdict": "absent", "numbers": {}})


def judge_promshift(result: dict[str, Any], plan: FaultPlan) -> dict[str, Any]:
    """Which planted faults the layers' evidence names."""
    cov = _measurement(result, "coverage")
    hcov = _measurement(result, "host_coverage")
    labels = _measurement(result, "labels")
    agg = _measurement(result, "aggregates")
    samples = _measurement(result, "samples")
    short_hosts = set(hcov["numbers"].get("short_keys", []))
    missing_hosts = {h for _, h, _ in plan.missing}
    missing_metrics = {m for m, _, _ in plan.missing}
    short_metrics = set(cov["numbers"].get("short_keys", []))
    named = missing_hosts & short_hosts
    missing_found = cov["verdict"] == "FAILED" and missing_metrics <= short_metrics and named == missing_hosts
    drift = labels["numbers"].get("drift", {})
    renamed_in = sorted(m for m, d in drift.items() if "hostname" in d.get("only_target", []))
    rename_found = labels["verdict"] == "FAILED" and bool(renamed_in)
    differing = set(agg["numbers"].get("differing_keys", []))
    drift_found = agg["verdict"] == "FAILED" and plan.drift_host in differing
    sampled = set(samples["numbers"].get("hosts_sampled", []))
    return {
        "verdict": result["verdict"],
        "missing_series": {
            "found": missing_found,
            "evidence": f"coverage {cov['verdict']} (short metrics {sorted(short_metrics)}, worst "
                        f"{cov['numbers'].get('worst_missing_ratio', 0):.4%}); host_coverage {hcov['verdict']} names "
                        f"{len(named)}/{len(missing_hosts)} hosts holding the missing series",
            "hosts_named": len(named), "hosts_planted": len(missing_hosts),
            "individual_series_named": "only for sampled hosts (samples layer)",
        },
        "label_rename": {
            "found": rename_found,
            "host_identified": plan.rename_host in short_hosts,
            "evidence": f"labels {labels['verdict']}: `hostname` only on target in {len(renamed_in)} metrics; "
                        f"host_coverage names {plan.rename_host}: {plan.rename_host in short_hosts}, "
                        f"as present under `hostname` (not missing): "
                        f"{plan.rename_host in hcov['numbers'].get('renamed_keys', {}).get('hostname@target', [])}",
        },
        "value_drift": {
            "found": drift_found,
            "evidence": f"aggregates {agg['verdict']}: differing_keys has {plan.drift_host}: "
                        f"{plan.drift_host in differing}; {len(differing)} hosts differ in all "
                        f"({len(differing & missing_hosts)} of them hold missing series, so their sums differ too; "
                        f"drift host also short in host_coverage: {plan.drift_host in short_hosts})",
            "hosts_differing": len(differing),
            "other_hosts_differing": sorted(differing - missing_hosts - {plan.drift_host})[:20],
        },
        "samples_layer": {"verdict": samples["verdict"], "hosts_sampled": len(sampled),
                          "faulty_hosts_sampled": sorted(sampled & (missing_hosts | {plan.drift_host,
                                                                                      plan.rename_host}))},
        "all_found": missing_found and rename_found and drift_found,
    }


def judge_naive(out: dict[str, Any], plan: FaultPlan, host_label: str) -> dict[str, Any]:
    missing = {(s.get("__name__"), s.get(host_label), int(s.get("gpu", -1))) for s in out["missing"]}
    planted_found = plan.missing & missing
    rename_src_side = {k for k in missing if k[1] == plan.rename_host}
    unexplained_missing = missing - plan.missing - rename_src_side
    renamed = [s for s in out["extra"] if "hostname" in s and host_label not in s]
    rename_hosts = sorted({s["hostname"] for s in renamed})
    mism = out["mismatched_by_host"]
    return {
        "missing_series": {"found": planted_found == plan.missing,
                           "evidence": f"{len(planted_found)}/{len(plan.missing)} planted missing series named "
                                       f"(plus {len(rename_src_side)} of the renamed host, "
                                       f"{len(unexplained_missing)} unexplained)"},
        "label_rename": {"found": rename_hosts == [plan.rename_host],
                         "evidence": f"{len(renamed)} target-only series carry `hostname` instead of "
                                     f"`{host_label}`, hosts {rename_hosts}"},
        "value_drift": {"found": plan.drift_host in mism,
                        "evidence": f"values differ on hosts {sorted(mism)[:5]} "
                                    f"({sum(v['points'] for v in mism.values())} points in "
                                    f"{sum(v['series'] for v in mism.values())} series)"},
        "all_found": planted_found == plan.missing and rename_hosts == [plan.rename_host] and plan.drift_host in mism,
    }


FAULTS = ("missing_series", "label_rename", "value_drift")


def faults_found_counts(promshift: dict[str, Any], naive: dict[str, Any]) -> dict[str, int]:
    """How many of the planted faults (``FAULTS``) each side found: the README's "3/3 faults found"."""
    return {"promshift": sum(bool(promshift[k]["found"]) for k in FAULTS),
            "naive": sum(bool(naive[k]["found"]) for k in FAULTS)}


def judge_clean(clean_runs: Sequence[dict[str, Any]], naive_clean: dict[str, Any] | None) -> dict[str, Any]:
    """The clean pair (no faults): every promshift run not SUCCESSFUL is a false positive (the README's
    "0/5 false positives"); the baseline's differences are counted too."""
    failed = [r["result"]["verdict"] for r in clean_runs if r["result"]["verdict"] != "SUCCESSFUL"]
    return {
        "promshift_runs": len(clean_runs), "promshift_failed": len(failed),
        "promshift_false_positive_rate": len(failed) / len(clean_runs) if clean_runs else None,
        "verdicts": [r["result"]["verdict"] for r in clean_runs],
        "wall_s": [round(r["wall_s"], 3) for r in clean_runs],
        "seeds": [f"bench-clean-{i}" for i in range(len(clean_runs))],
        "naive": None if naive_clean is None else {
            "wall_s": round(naive_clean["wall_s"], 3), "missing_series": len(naive_clean["missing"]),
            "extra_series": len(naive_clean["extra"]),
            "mismatched_hosts": len(naive_clean["mismatched_by_host"])},
    }


def summarize_promshift(run: dict[str, Any]) -> dict[str, Any]:
    r = run["result"]
    return {"verdict": r["verdict"], "wall_s": round(run["wall_s"], 3), "parity_wall_s": round(r["wall_s"], 3),
            "backend_query_s": round(r["backend_query_s"], 3), "queries_sent": r["queries_sent"],
            # Per server: if parity asks both at once, the slower side is the critical path, not the sum.
            "backend_query_s_by_side": {side: round(led["server_s"], 3) for side, led in run["ledger"].items()},
            "label_api_calls": run["label_api"]["calls"], "label_api_wall_s": round(run["label_api"]["wall_s"], 3),
            "peak_rss_mb": round(run["peak_rss_mb"], 1), "cpu_s": round(run["cpu_s"], 2),
            "by_kind": _rounded(run["label_api"]["by_kind"]),
            "process_wall_s": round(run["process_wall_s"], 2), "loadavg": run.get("loadavg"),
            "series_compared": r["series_compared"],
            "points_compared": r["points_compared"],
            "layers": {m["name"]: m["verdict"] for m in r["measurements"]}}


def trimmed_measurements(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for m in result["measurements"]:
        nums = dict(m.get("numbers", {}))
        for key in ("short", "worst"):
            if isinstance(nums.get(key), list) and len(nums[key]) > 5:
                nums[key] = nums[key][:5] + [f"... {len(nums[key]) - 5} more"]
        out.append({"name": m["name"], "verdict": m["verdict"], "reason": m["reason"][:600],
                    "queries": len(m.get("queries", [])), "numbers": nums})
    return out


# ----------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--group", default="gpu-power-thermal", choices=GROUPS,
                        help=f"catalog group, or {WHOLE_FLEET}: every default counter the fleet renders in one group")
    parser.add_argument("--window-min", type=int, default=WINDOW_S // 60, choices=range(5, 91, 5), metavar="MIN",
                        help="length of the backfilled window in minutes (default 60; 5..90, a multiple of 5)")
    parser.add_argument("--repeats", type=int, default=3, help="promshift runs on the faulty pair")
    parser.add_argument("--clean-runs", type=int, default=5, help="promshift runs (different seeds) on the clean pair")
    parser.add_argument("--no-naive-clean", action="store_true", help="skip the baseline on the clean pair")
    parser.add_argument("--out", type=Path, help="result file (default at 2,000 nodes: bench/results/parity.json, "
                                                 "parity-whole-fleet.json for --group whole-fleet)")
    parser.add_argument("--keep", action="store_true", help="keep the temp directory and servers' data")
    parser.add_argument("--no-golden", action="store_true",
                        help="drop the golden-dashboard layer (catalog parity.golden_dashboards) from promshift's run")
    parser.add_argument("--child", choices=["promshift", "naive"], help=argparse.SUPPRESS)
    parser.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        spec = json.loads(args.spec.read_text())
        out = child_promshift(spec) if args.child == "promshift" else child_naive(spec)
        args.child_out.write_text(json.dumps(out))
        return 0

    from promshift.local.stack.fleet import FleetSpec
    from promshift.local.stack.local import EXTERNAL_LABELS, SCRAPE_JOB

    default_out = WHOLE_FLEET_RESULT_PATH if args.group == WHOLE_FLEET else RESULT_PATH
    out_path = args.out or (default_out if args.nodes == 2000 else None)
    date = datetime.now(UTC)
    group = bench_group(args.group)
    metrics = list(group.metrics)
    fleet = FleetSpec(nodes=args.nodes)
    series = fleet.nodes * fleet.gpus_per_node * len(metrics)
    start, end = choose_window(time.time(), args.window_min * 60)
    steps = list(range(start, end + 1, int(STEP_S)))
    policy = group.parity
    # The comparison window is [since + 2 steps, now - skip_recent] aligned to the step: make it exactly [start, end].
    dual_write_since = start - 2 * STEP_S
    now_arg = end + policy.skip_recent_s
    plan = plan_faults(fleet, metrics, seed=f"promshift-parity-bench:{fleet.nodes}")
    machine = machine_info()
    code = code_state()
    log(f"{fleet.nodes} nodes x {fleet.gpus_per_node} GPUs x {len(metrics)} metrics ({args.group}) = {series} series "
        f"x {len(steps)} samples; window {datetime.fromtimestamp(start, UTC):%H:%M:%S}-"
        f"{datetime.fromtimestamp(end, UTC):%H:%M:%S} UTC; load {loadavg()}")
    log(f"faults: {len(plan.missing)} series missing, rename on {plan.rename_host}, "
        f"x{DRIFT_FACTOR} on {plan.drift_host}")
    for row in other_load():
        log(f"  busy: {row}")

    show_backfill_progress()
    workdir = Path(tempfile.mkdtemp(prefix="promshift-parity-bench-"))
    servers: dict[str, PrometheusProcess] = {}
    report: dict[str, Any] = {}
    stage = "OpenMetrics"
    resources_seen: dict[str, Any] = {"free_disk_gb_at_start": round(shutil.disk_usage(workdir).free / 1e9, 1),
                                      "mem_available_mb_at_start": mem_available_mb()}
    try:
        estimate = estimate_text_bytes(fleet, metrics, steps, EXTERNAL_LABELS, SCRAPE_JOB)
        passes = plan_passes(estimate, shutil.disk_usage(workdir).free)
        log(f"OpenMetrics text ~{sum(estimate.values()) / 1e9:.1f} GB in all, free disk "
            f"{resources_seen['free_disk_gb_at_start']} GB: passes {passes}")
        om: dict[str, Any] = {"samples": {}, "bytes": {}, "generation_s": [], "passes": [list(p) for p in passes],
                              "estimated_bytes": estimate}
        backfills = {}
        for sides in passes:
            stage = f"OpenMetrics {'+'.join(sides)}"
            t = time.perf_counter()
            written = write_openmetrics(fleet, metrics, steps, plan, EXTERNAL_LABELS, SCRAPE_JOB, workdir, sides)
            om["generation_s"].append(round(time.perf_counter() - t, 1))
            om["samples"].update(written["samples"])
            om["bytes"].update(written["bytes"])
            log(f"OpenMetrics {'+'.join(sides)} written in {om['generation_s'][-1]:.1f}s: "
                + ", ".join(f"{s} {b / 1e9:.2f} GB, {written['samples'][s]} samples"
                            for s, b in written["bytes"].items())
                + f"; free disk {shutil.disk_usage(workdir).free / 1e9:.1f} GB")
            for side, path in written["files"].items():
                stage = f"promtool backfill {side}"
                log(f"promtool backfill {side} (MemAvailable {mem_available_mb():.0f} MB) ...")
                backfills[side] = backfill(path, workdir / f"{side}-data")
                path.unlink()
                b = backfills[side]
                log(f"  {side}: {b['wall_s']}s, promtool peak RSS {b['peak_rss_mb']:.0f} MB (anon "
                    f"{b['peak_rss_anon_mb']:.0f} MB), MemAvailable low {b['mem_available_min_mb']:.0f} MB, blocks "
                    f"{[(blk['min_time'], blk['max_time'], blk['series']) for blk in b['blocks']]}")
        gen_s = sum(om["generation_s"])
        stage = "servers"
        ports = find_free_ports(3)
        for side, port in zip(SIDES, ports, strict=True):
            servers[side] = start_server(side, workdir / f"{side}-data", port)
        for s in servers.values():
            s.wait_ready()
        log("servers ready: " + ", ".join(f"{n} {s.url}" for n, s in servers.items()))

        from promshift.adapters.prometheus import PrometheusClient

        warm = {}
        span = f"{end - start}s"
        for name, s in servers.items():
            c = PrometheusClient(s.url, always_stats=True, timeout_s=300)
            t = time.perf_counter()
            # *_over_time drops __name__, so count per metric (one vector may not repeat a label set).
            n_series = sum(c.scalar(f'count(count_over_time({{__name__="{m}"}}[{span}]))', at=end) or 0
                           for m in metrics)
            n_points = sum(c.scalar(f'sum(count_over_time({{__name__="{m}"}}[{span}]))', at=end) or 0
                           for m in metrics)
            warm[name] = {"series": n_series, "points": n_points, "s": round(time.perf_counter() - t, 2),
                          "rss_mb": s.rss_mb()}
        log(f"warm-up (cold page cache -> warm): {warm}")
        expected = {"source": series, "clean": series, "target": series - len(plan.missing)}
        for name, w in warm.items():
            if w["series"] != expected[name] or w["points"] != expected[name] * len(steps):
                raise RuntimeError(f"{name} holds {w}, expected {expected[name]} series x {len(steps)} samples")

        base_spec = {"group": args.group, "dual_write_since": dual_write_since, "now": now_arg,
                 "no_golden": args.no_golden}
        faulty = {**base_spec, "source": servers["source"].url, "target": servers["target"].url}
        clean = {**base_spec, "source": servers["source"].url, "target": servers["clean"].url}
        runs = []
        for i in range(args.repeats):
            loads = loadavg()
            run = run_child("promshift", faulty, workdir)
            run["loadavg"] = loads
            runs.append(run)
            s = summarize_promshift(run)
            log(f"promshift faulty run {i + 1}/{args.repeats}: {s['verdict']} wall {s['wall_s']:.2f}s, backend "
                f"{s['backend_query_s']:.2f}s, label APIs {s['label_api_wall_s']:.2f}s, {s['queries_sent']} queries, "
                f"peak RSS {s['peak_rss_mb']:.0f} MB, layers {s['layers']}")
        naive_spec = {"source": servers["source"].url, "target": servers["target"].url, "metrics": metrics,
                      "start": start, "end": end, "ignore_labels": list(policy.ignore_labels),
                      "host_label": group.host_label}
        log("naive baseline on the faulty pair ...")
        naive_loads = loadavg()
        naive = run_child("naive", naive_spec, workdir)
        naive["loadavg"] = naive_loads
        log(f"naive: wall {naive['wall_s']:.1f}s, backend {naive['backend_query_s']:.1f}s, "
            f"{naive['response_bytes'] / 1e6:.0f} MB of JSON, peak RSS {naive['peak_rss_mb']:.0f} MB, "
            f"{naive['points_compared']} points compared, {len(naive['missing'])} missing / {len(naive['extra'])} "
            f"extra series, mismatches on {len(naive['mismatched_by_host'])} hosts")

        clean_runs = []
        for i in range(args.clean_runs):
            run = run_child("promshift", {**clean, "seed": f"bench-clean-{i}"}, workdir)
            clean_runs.append(run)
            s = summarize_promshift(run)
            failed = [m["name"] + ": " + m["reason"][:200] for m in run["result"]["measurements"]
                      if m["verdict"] != "SUCCESSFUL"]
            log(f"promshift clean run {i + 1}/{args.clean_runs} (seed bench-clean-{i}): {s['verdict']} wall "
                f"{s['wall_s']:.2f}s {failed or ''}")
        naive_clean = None
        if not args.no_naive_clean:
            log("naive baseline on the clean pair ...")
            naive_clean = run_child("naive", {**naive_spec, "target": servers["clean"].url}, workdir)
            log(f"naive clean: wall {naive_clean['wall_s']:.1f}s, {len(naive_clean['missing'])} missing, "
                f"{len(naive_clean['extra'])} extra, mismatches on {len(naive_clean['mismatched_by_host'])} hosts")
        server_rss = {n: s.rss_mb() for n, s in servers.items()}

        # ------------------------------------------------------------------ report
        summaries = [summarize_promshift(r) for r in runs]
        median = sorted(summaries, key=lambda s: s["wall_s"])[len(summaries) // 2]
        judged = [judge_promshift(r["result"], plan) for r in runs]
        naive_found = judge_naive(naive, plan, group.host_label)
        found_counts = faults_found_counts(judged[0], naive_found)
        wall_s = median["wall_s"]
        backend_s = median["backend_query_s"]
        peak = max(s["peak_rss_mb"] for s in summaries)
        speedup = naive["wall_s"] / wall_s if wall_s else math.inf
        targets = {
            "wall_s <= 60": {"value": wall_s, "met": wall_s <= 60},
            "peak_rss_mb <= 1024": {"value": peak, "met": peak <= 1024},
            "wall_s <= 1.25 x backend_query_s": {"value": round(wall_s / backend_s, 3) if backend_s else None,
                                                 "met": bool(backend_s) and wall_s <= 1.25 * backend_s},
            ">= 10x faster than naive": {"value": round(speedup, 2), "met": speedup >= 10},
            "every planted fault found": {"value": f"{found_counts['promshift']}/{len(FAULTS)}",
                                          "met": all(j["all_found"] for j in judged)},
        }
        report = {
            "issue": f"parity at {fleet.nodes:,} nodes x {fleet.gpus_per_node} GPUs, {len(metrics)} metrics in one "
                     f"group ({args.group}): promshift vs naive fetch-everything baseline",
            "date": date.isoformat(timespec="seconds"),
            "machine": {**machine, "loadavg_at_start": loadavg(),
                        "note": "shared machine: other sessions' benchmarks and tests were running"},
            "code": code,
            "wall_s": wall_s,
            "peak_rss_mb": peak,
            "backend_query_s": backend_s,
            "naive_wall_s": round(naive["wall_s"], 3),
            "speedup_vs_naive": round(speedup, 2),
            "faults_planted": plan.to_dict(series, len(metrics), fleet.gpus_per_node),
            "faults_found": {"promshift": judged[0], "naive": naive_found, "counts": found_counts,
                             "promshift_all_runs_all_found": all(j["all_found"] for j in judged)},
            "targets": targets,
            "measured_how": {
                "wall_s": f"median of {len(runs)} runs: perf_counter around ParityCheck.run() in a child process "
                          "(excludes interpreter start + imports; see process_wall_s)",
                "peak_rss_mb": "max over the runs of the child's VmHWM (/proc/self/status) read after the check: "
                               "the whole process (interpreter, imports, the check); ru_maxrss is not used because "
                               "on Linux it carries the forking parent's RSS over exec",
                "cache": "each server's page cache warmed first (one count_over_time over every series); "
                         "promshift's runs come before the baseline's, all on warm data",
                "backend_query_s": "sum of evalTotalTime (stats=all) over every query promshift sent, both servers; "
                                   "the label-names/-values API calls report no server time and are not in it "
                                   "(their wall time: label_api_wall_s)",
                "naive": f"one `{{__name__=\"m\"}}[{end - start}s]` instant query per metric per side "
                         f"({2 * len(metrics)} requests: the cheapest way to fetch every raw sample), parsed with "
                         "PrometheusClient, every sample compared "
                         "(tolerance 1e-9) after dropping the ignored external labels; child process, same clocks",
            },
            "setup": {
                "nodes": fleet.nodes, "gpus_per_node": fleet.gpus_per_node, "group": args.group, "metrics": metrics,
                "series_per_side": series, "samples_per_series": len(steps),
                "samples_per_side": om["samples"], "step_s": STEP_S,
                "window": {"start": start, "end": end, "start_utc": datetime.fromtimestamp(start, UTC).isoformat(),
                           "end_utc": datetime.fromtimestamp(end, UTC).isoformat(),
                           "ended_s_before_start_of_run": round(date.timestamp() - end)},
                "resources": resources_seen,
                "run_args": {"dual_write_since": dual_write_since, "now": now_arg},
                "policy": runs[0]["policy"],
                "openmetrics": {"generation_s": round(gen_s, 1), "bytes": om["bytes"],
                                "estimated_bytes": om["estimated_bytes"], "passes": om["passes"],
                                "generation_s_per_pass": om["generation_s"]},
                "backfill": backfills,
                "warm_up": warm,
                "server_rss_mb_at_end": server_rss,
            },
            "promshift_runs": summaries,
            "promshift_measurements": trimmed_measurements(runs[0]["result"]),
            "promshift_cost_split": {
                "label_api_wall_s": median["label_api_wall_s"],
                "client_and_other_s": round(wall_s - backend_s - median["label_api_wall_s"], 3),
            },
            "naive": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in naive.items()
                      if k not in ("missing", "extra", "mismatched_by_host")}
            | {"missing_series": len(naive["missing"]), "extra_series": len(naive["extra"]),
               "mismatched_by_host": naive["mismatched_by_host"]},
            "clean": judge_clean(clean_runs, naive_clean),
            "total_runtime_s": round(time.monotonic() - _T0, 1),
        }
    except Exception as exc:
        # What ran out, where: the record of a size this machine could not hold.
        failure = {"issue": f"parity at {fleet.nodes:,} nodes, group {args.group}: did not complete",
                   "date": date.isoformat(timespec="seconds"), "machine": machine, "code": code,
                   "failed_at": stage, "error": str(exc)[:2000], "series_per_side": series,
                   "samples_per_series": len(steps), "resources_at_start": resources_seen,
                   "resources_at_failure": {"free_disk_gb": round(shutil.disk_usage(workdir).free / 1e9, 1),
                                            "mem_available_mb": mem_available_mb(), "loadavg": loadavg()},
                   "elapsed_s": round(time.monotonic() - _T0, 1)}
        log(f"FAILED at {stage}: {json.dumps(failure)}")
        if out_path:
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.with_suffix(".failed.json").write_text(json.dumps(failure, indent=2) + "\n")
        raise
    finally:
        for s in servers.values():
            s.stop()
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    text = json.dumps(report, indent=2)
    print(text)
    print()
    for name, t in report["targets"].items():
        print(f"{'MET ' if t['met'] else 'MISS'}  {name}: {t['value']}")
    if out_path:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(text + "\n")
        log(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
