"""History for the local stack: the fleet's past samples, written into the source's and the target's TSDB.

A freshly started stack holds minutes of data, so long query windows have nothing to
read. This module renders what the simulated fleet *would* have exposed over a past
range (``node_values`` is a pure function of time) and turns it into TSDB blocks with
``promtool tsdb create-blocks-from openmetrics``, before the servers start:

- the source's series carry exactly the labels the live scrape stores (the exporter's
  labels plus ``instance`` and ``job``), so the backfilled and the scraped samples are
  one series, not two;
- the target's series additionally carry the source's external labels, as the
  remote-written ones do, so the target looks as if dual-write had been running for the
  whole range.

``backfill_stack`` does it all for a stopped ``LocalStack``; ``write_backfill`` and
``create_blocks`` are the two steps (the latency benchmark uses them directly).

``write_openmetrics`` is the one OpenMetrics writer under them: any number of sides, each with
its external labels and, per series, a change (left out, a label renamed, values scaled): the
parity benchmark writes its source, its faulty target and its clean target with it.
``create_blocks`` is the one way promtool is run: it also measures each run (wall and CPU time,
promtool's peak RSS, the machine's lowest MemAvailable, the blocks written).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from promshift.core.dcgm import metrics as exported_metrics
from promshift.core.durations import parse_duration
from promshift.local.stack.fleet import FleetSpec, load_counters, node_values, render_node
from promshift.local.stack.local import (
    EXTERNAL_LABELS,
    SCRAPE_JOB,
    SOURCE,
    SOURCE_RETENTION,
    TARGET,
    LocalStack,
    StackError,
)

logger = logging.getLogger(__name__)

SIDES = (SOURCE, TARGET)
# Prometheus' default lookback delta: an instant query sees a series only if it has a sample
# this recent, so history sampled more sparsely would have holes for instant queries.
MAX_INTERVAL_S = 300.0
# The backfill ends this long before "now", so its last block ends before the first live sample
# (a Prometheus head refuses samples older than its newest block).
DEFAULT_MARGIN_S = 30.0
PROGRESS_EVERY_NODES = 250


def fleet_metrics() -> dict[str, str]:
    """Name -> type (``gauge`` | ``counter``) of every metric the fleet simulator renders, in exposition order.

    The types are dcgm-exporter's (its ``default-counters.csv``), which the simulator also
    puts on its ``# TYPE`` lines.
    """
    return {c.name: c.kind for c in exported_metrics(load_counters())}


@dataclass(frozen=True)
class BackfillText:
    """The OpenMetrics files ``write_backfill`` wrote (one per side) and what they hold."""

    files: dict[str, Path]
    metrics: tuple[str, ...]
    series_per_side: int
    samples_per_side: int
    bytes: dict[str, int]  # file size per side
    seconds: float  # time taken to render and write them

    @property
    def bytes_per_side(self) -> int:
        """Size of the source's file (the target's is larger by the external labels)."""
        return self.bytes[SOURCE]


@dataclass(frozen=True)
class BackfillResult:
    """What ``backfill_stack`` put into the stack's TSDBs."""

    metrics: tuple[str, ...]
    start: float
    end: float
    interval_s: float
    series_per_side: int
    samples_per_side: int
    text_bytes: dict[str, int]
    write_s: float
    promtool_s: float


def _check_metrics(names: Iterable[str]) -> tuple[str, ...]:
    known = fleet_metrics()
    chosen = tuple(dict.fromkeys(names))  # de-duplicated, order kept
    if not chosen:
        raise ValueError("no metrics to backfill")
    unknown = [m for m in chosen if m not in known]
    if unknown:
        raise ValueError(f"the fleet simulator does not render {', '.join(unknown)}; "
                         f"it renders {', '.join(known)}")
    return chosen


def _series_labels(fleet: FleetSpec, node: int, metrics: Sequence[str], t: float = 0.0,
                   job: str = SCRAPE_JOB) -> dict[str, list[str]]:
    """Per metric, each GPU's label text exactly as the live scrape stores it (job/instance added).

    Each entry is ``{label="value",...`` without the closing brace, so more labels can follow.
    """
    host = fleet.hostname(node)
    extra = f',instance="{host}",job="{job}"'
    out: dict[str, list[str]] = {m: [] for m in metrics}
    for line in render_node(fleet, node, t).splitlines():
        name, brace, rest = line.partition("{")
        if brace and name in out:
            out[name].append("{" + rest[: rest.rindex("}")] + extra)
    return out


@dataclass(frozen=True)
class SeriesChange:
    """What one side does differently with one series: leave it out, rename a label, scale every value."""

    missing: bool = False
    rename: tuple[str, str] | None = None  # (label, its new name)
    factor: float | None = None


# (metric, host, gpu) -> the side's change to that series, or None to write it as rendered.
SeriesChanges = Callable[[str, str, int], SeriesChange | None]


@dataclass(frozen=True)
class Side:
    """One OpenMetrics file ``write_openmetrics`` writes: its name, the labels every series gets on top of the
    scrape's (a remote-written side carries the source's external labels) and its per-series changes."""

    name: str
    external_labels: Mapping[str, str] = field(default_factory=dict)
    changes: SeriesChanges | None = None


@dataclass(frozen=True)
class OpenMetricsText:
    """What ``write_openmetrics`` wrote, per side."""

    files: dict[str, Path]
    samples: dict[str, int]
    bytes: dict[str, int]
    seconds: float


def _labels_text(labels: Mapping[str, str]) -> str:
    return "".join(f',{k}="{v}"' for k, v in labels.items())


def _renamed(prefix: str, rename: tuple[str, str]) -> str:
    old, new = rename
    renamed = prefix.replace(f'{{{old}="', f'{{{new}="').replace(f',{old}="', f',{new}="')
    if renamed == prefix:
        raise ValueError(f"no label {old!r} to rename in {prefix!r}")
    return renamed


def write_openmetrics(fleet: FleetSpec, directory: Path, steps: Sequence[float], metrics: Sequence[str],
                      sides: Sequence[Side], *, job: str = SCRAPE_JOB) -> OpenMetricsText:
    """One OpenMetrics file per side (``<directory>/<side>.om``) of ``metrics`` for every node and GPU at each of
    ``steps`` (whole seconds, ascending): each metric family contiguous after its ``# TYPE`` line (dcgm-exporter's
    type), each series time-ordered, ``# EOF`` last, as ``promtool`` requires. The labels are the live scrape's
    (``job``/``instance`` added) plus the side's external labels; the values are what the fleet renders at each
    instant, unless the side's ``changes`` leave the series out, rename one of its labels or scale its values.
    """
    chosen = _check_metrics(metrics)
    kinds = fleet_metrics()
    names = [side.name for side in sides]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"sides must be named, each once: {names}")
    t0 = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    stamps = [f" {t:.0f}\n" for t in steps]
    ext = {side.name: _labels_text(side.external_labels) for side in sides}
    parts = {(side, m): (directory / f"{side}-{m}.part").open("w", buffering=1 << 20) for side in names for m in chosen}
    samples = dict.fromkeys(names, 0)
    try:
        for node in range(fleet.nodes):
            host = fleet.hostname(node)
            labels = _series_labels(fleet, node, chosen, steps[0] if steps else 0.0, job)
            values = [node_values(fleet, node, t) for t in steps]
            for metric in chosen:
                # A metric the simulator's model does not know renders as 0 (see render_node).
                zeros = ["0"] * len(labels[metric])
                series = [v.get(metric, zeros) for v in values]
                for gpu, label in enumerate(labels[metric]):
                    column = [s[gpu] for s in series]
                    rendered: dict[str, str] = {}  # unchanged text per external-label set, shared by sides
                    for side in sides:
                        change = side.changes(metric, host, gpu) if side.changes else None
                        if change is not None and change.missing:
                            continue
                        prefix = f"{metric}{label}{ext[side.name]}}} "
                        if change is None or (change.rename is None and change.factor is None):
                            text = rendered.get(prefix)
                            if text is None:
                                text = rendered[prefix] = "".join(
                                    [prefix + v + ts for v, ts in zip(column, stamps, strict=True)])
                        else:
                            if change.rename is not None:
                                prefix = _renamed(prefix, change.rename)
                            col = column if change.factor is None else [repr(float(v) * change.factor)
                                                                       for v in column]
                            text = "".join([prefix + v + ts for v, ts in zip(col, stamps, strict=True)])
                        parts[side.name, metric].write(text)
                        samples[side.name] += len(column)
            if node and node % PROGRESS_EVERY_NODES == 0:
                logger.info("OpenMetrics text (%s): %d/%d nodes", "+".join(names), node, fleet.nodes)
    finally:
        for handle in parts.values():
            handle.close()
    files = join_parts(directory, names, {metric: kinds[metric] for metric in chosen})
    return OpenMetricsText(files=files, samples=samples, bytes={s: p.stat().st_size for s, p in files.items()},
                           seconds=time.monotonic() - t0)


def estimate_openmetrics_bytes(fleet: FleetSpec, metrics: Sequence[str], steps: Sequence[float],
                               sides: Sequence[Side], *, job: str = SCRAPE_JOB) -> dict[str, int]:
    """Bytes of ``write_openmetrics``' text per side, from node 0's lines at the first step, 3 % high
    (within a few % above the real size; the per-series changes are not counted)."""
    chosen = _check_metrics(metrics)
    values = node_values(fleet, 0, steps[0])
    line = len(f" {steps[0]:.0f}\n")
    labels = _series_labels(fleet, 0, chosen, steps[0], job)
    plain = sum(len(f"{m}{label}}} ") + len(values.get(m, ["0"] * len(per_gpu))[g]) + line
                for m, per_gpu in labels.items() for g, label in enumerate(per_gpu))
    per_series_ext = len(chosen) * fleet.gpus_per_node
    return {side.name: int((plain + len(_labels_text(side.external_labels)) * per_series_ext)
                           * fleet.nodes * len(steps) * 1.03) for side in sides}


def write_backfill(fleet: FleetSpec, directory: Path, start: float, end: float, interval: float,
                   metrics: Sequence[str], *, external_labels: Mapping[str, str] = EXTERNAL_LABELS) -> BackfillText:
    """OpenMetrics files of ``metrics`` for every node and GPU, one sample every ``interval`` s from ``start``
    to ``end`` (inclusive when on the grid): one file for the source, one for the target (whose series
    carry ``external_labels``, as remote-written ones do). Each metric family is contiguous and each
    series time-ordered, as ``promtool`` requires. Values are what the fleet renders at each instant.
    """
    chosen = _check_metrics(metrics)
    if interval <= 0 or interval != int(interval) or start != int(start):
        # The fleet's values change per whole second; timestamps are written in whole seconds.
        raise ValueError(f"start and interval must be whole seconds and interval > 0, got {start!r}, {interval!r}")
    if end < start:
        raise ValueError(f"end ({end!r}) is before start ({start!r})")
    steps = [start + i * interval for i in range(int((end - start) // interval) + 1)]
    text = write_openmetrics(fleet, directory, steps, chosen,
                             [Side(SOURCE), Side(TARGET, external_labels=external_labels)])
    return BackfillText(files=text.files, metrics=chosen,
                        series_per_side=fleet.nodes * fleet.gpus_per_node * len(chosen),
                        samples_per_side=text.samples[SOURCE], bytes=text.bytes, seconds=text.seconds)


def join_parts(directory: Path, sides: Sequence[str], kinds: Mapping[str, str]) -> dict[str, Path]:
    """One OpenMetrics file per side from its ``<side>-<metric>.part`` files (deleted as they are copied).

    OpenMetrics wants each metric family in one piece, after its ``# TYPE`` line, and ``# EOF``
    at the end; ``kinds`` maps each metric, in file order, to ``gauge`` or ``counter``.
    """
    files: dict[str, Path] = {}
    for side in sides:
        path = directory / f"{side}.om"
        with path.open("wb") as out:
            for metric, kind in kinds.items():
                out.write(f"# TYPE {metric} {kind}\n".encode())
                part = directory / f"{side}-{metric}.part"
                with part.open("rb") as part_handle:
                    shutil.copyfileobj(part_handle, out, 16 << 20)
                part.unlink()
            out.write(b"# EOF\n")
        files[side] = path
    return files


def _status_mb(pid: int, field_name: str) -> float | None:
    """A memory field of ``/proc/<pid>/status`` (``VmHWM:``, ``RssAnon:``) in MB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def mem_available_mb() -> float:
    """The machine's MemAvailable (free + reclaimable page cache): what a new process could still get."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


@dataclass(frozen=True)
class PromtoolRun:
    """One ``promtool tsdb create-blocks-from openmetrics`` run, measured.

    ``peak_rss_mb``: promtool's VmHWM polled every 0.1 s (``ru_maxrss`` from wait4 would start at this
    parent's RSS); ``peak_rss_anon_mb`` leaves out the input file promtool mmaps (file-backed pages count
    in RSS but are reclaimable); ``mem_available_min_mb``: the machine's lowest MemAvailable meanwhile.
    """

    wall_s: float
    peak_rss_mb: float
    peak_rss_anon_mb: float
    mem_available_min_mb: float
    cpu_s: float
    input_bytes: int
    blocks: list[dict[str, Any]]
    tsdb_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"wall_s": self.wall_s, "peak_rss_mb": self.peak_rss_mb, "peak_rss_anon_mb": self.peak_rss_anon_mb,
                "mem_available_min_mb": self.mem_available_min_mb, "cpu_s": self.cpu_s,
                "input_bytes": self.input_bytes, "blocks": self.blocks, "tsdb_bytes": self.tsdb_bytes}


def _blocks(data_dir: Path) -> list[dict[str, Any]]:
    blocks = []
    for meta in sorted(data_dir.glob("*/meta.json")):
        m = json.loads(meta.read_text())
        blocks.append({"min_time": m["minTime"] / 1000, "max_time": m["maxTime"] / 1000,
                       "samples": m["stats"]["numSamples"], "series": m["stats"]["numSeries"]})
    return blocks


def create_blocks(files: Mapping[str, Path], data_dirs: Mapping[str, Path], *, promtool: str = "promtool",
                  delete: bool = True, max_block_duration: str | None = None) -> dict[str, PromtoolRun]:
    """``promtool tsdb create-blocks-from openmetrics`` for every side, in parallel; the text files are
    deleted afterwards unless ``delete`` is false. The blocks land directly in ``data_dirs[side]``, where
    Prometheus (``--storage.tsdb.path``) loads them when it starts. ``max_block_duration`` (``2h``, say)
    caps the blocks' length (promtool aligns them to multiples of it). Returns each side's run, measured."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    outputs: dict[str, IO[bytes]] = {}
    inputs = {side: path.stat().st_size for side, path in files.items()}
    flags = [f"--max-block-duration={max_block_duration}"] if max_block_duration else []
    started = time.perf_counter()
    try:
        for side, path in files.items():
            data_dirs[side].mkdir(parents=True, exist_ok=True)
            outputs[side] = tempfile.TemporaryFile()
            procs[side] = subprocess.Popen([promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", *flags,
                                            str(path), str(data_dirs[side])],
                                           stdout=outputs[side], stderr=subprocess.STDOUT)
    except FileNotFoundError:
        for proc in procs.values():
            proc.kill()
            proc.wait()
        for handle in outputs.values():
            handle.close()
        raise RuntimeError(f"{promtool} is not installed; install it with `apt-get install -y prometheus`") from None
    peak = dict.fromkeys(procs, 0.0)
    anon = dict.fromkeys(procs, 0.0)
    avail = mem_available_mb()
    done: dict[str, tuple[float, float]] = {}  # side -> (wall_s, cpu_s)
    try:
        while len(done) < len(procs):
            for side, proc in procs.items():
                if side in done:
                    continue
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    done[side] = (time.perf_counter() - started, usage.ru_utime + usage.ru_stime)
                    continue
                peak[side] = max(peak[side], _status_mb(proc.pid, "VmHWM:") or 0.0)
                anon[side] = max(anon[side], _status_mb(proc.pid, "RssAnon:") or 0.0)
            avail = min(avail, mem_available_mb())
            if len(done) < len(procs):
                time.sleep(0.1)
    finally:
        for proc in procs.values():
            if proc.returncode is None:  # interrupted: leave no promtool behind
                proc.kill()
                proc.wait()
    failed = []
    runs: dict[str, PromtoolRun] = {}
    for side, proc in procs.items():
        outputs[side].seek(0)
        out = outputs[side].read().decode(errors="replace")
        outputs[side].close()
        if proc.returncode != 0:
            failed.append(f"promtool backfill for the {side} failed:\n{out[-2000:]}")
            continue
        if delete:
            files[side].unlink()
        data_dir = data_dirs[side]
        runs[side] = PromtoolRun(
            wall_s=round(done[side][0], 2), peak_rss_mb=round(peak[side], 1), peak_rss_anon_mb=round(anon[side], 1),
            mem_available_min_mb=avail, cpu_s=round(done[side][1], 2), input_bytes=inputs[side],
            blocks=_blocks(data_dir), tsdb_bytes=_size(data_dir))
    if failed:
        raise RuntimeError("\n".join(failed))
    return runs


def history_range(now: float, history_s: float, interval_s: float,
                  margin_s: float = DEFAULT_MARGIN_S) -> tuple[float, float]:
    """(start, end) on the ``interval_s`` grid: start at or before ``now - history_s``, end at least
    ``margin_s`` before ``now`` (so the live samples that follow are newer than every backfilled block)."""
    end = math.floor((now - margin_s) / interval_s) * interval_s
    start = math.floor((now - history_s) / interval_s) * interval_s
    if start >= end:
        raise ValueError(f"history of {history_s:g}s leaves nothing to backfill before now - {margin_s:g}s")
    return float(start), float(end)


def check_history(history_s: float, interval_s: float) -> None:
    """ValueError unless ``history_s`` fits the source's retention and ``interval_s`` the lookback delta."""
    if not 0 < interval_s <= MAX_INTERVAL_S or interval_s != int(interval_s):
        raise ValueError(f"the history interval must be whole seconds in (0, {MAX_INTERVAL_S:g}s] (the lookback "
                         f"delta), got {interval_s:g}s")
    retention_s = parse_duration(SOURCE_RETENTION)
    if not 0 < history_s < retention_s:
        # Older blocks would be deleted by the source's retention as soon as it starts.
        raise ValueError(f"the history must be longer than 0s and shorter than the source's retention "
                         f"({SOURCE_RETENTION}), got {history_s:g}s")


def backfill_stack(stack: LocalStack, metrics: Sequence[str], *, history_s: float, interval_s: float = 300.0,
                   now: float | None = None, promtool: str = "promtool") -> BackfillResult:
    """Give a stopped stack's source and target ``history_s`` of the fleet's ``metrics``, sampled every
    ``interval_s``, as if the source had scraped and dual-written them all along.

    Run it on a fresh (reset) stack, before ``stack.up()``: blocks written under a running
    Prometheus, or older than data it already holds, would not be read as intended.
    """
    if any(row["alive"] for row in stack.status().values()):
        raise StackError("backfill the stack before starting it (stop or reset it first)")
    check_history(history_s, interval_s)
    chosen = _check_metrics(metrics)
    start, end = history_range(time.time() if now is None else now, history_s, interval_s)
    fleet = stack.fleet
    gpus = fleet.nodes * fleet.gpus_per_node
    logger.info("backfill: %d metrics (%s) x %d GPUs, %s samples per series every %gs from %s to %s",
                len(chosen), ", ".join(chosen), gpus, f"{int((end - start) // interval_s) + 1:,}", interval_s,
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end)))
    workdir = stack.home / "backfill"
    shutil.rmtree(workdir, ignore_errors=True)
    try:
        text = write_backfill(fleet, workdir, start, end, interval_s, chosen)
        logger.info("backfill: %s samples in %s series per side written in %.1fs "
                    "(OpenMetrics: source %.1f MB, target %.1f MB); running promtool",
                    f"{text.samples_per_side:,}", f"{text.series_per_side:,}", text.seconds,
                    text.bytes[SOURCE] / 1e6, text.bytes[TARGET] / 1e6)
        t0 = time.monotonic()
        create_blocks(text.files, {side: stack.data_dir(side) for side in SIDES}, promtool=promtool)
        promtool_s = time.monotonic() - t0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    logger.info("backfill: blocks written in %.1fs (on disk: source %.1f MB, target %.1f MB)", promtool_s,
                _size(stack.data_dir(SOURCE)) / 1e6, _size(stack.data_dir(TARGET)) / 1e6)
    return BackfillResult(metrics=chosen, start=start, end=end, interval_s=interval_s,
                          series_per_side=text.series_per_side, samples_per_side=text.samples_per_side,
                          text_bytes=dict(text.bytes), write_s=text.seconds, promtool_s=promtool_s)


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
