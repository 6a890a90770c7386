"""The fault matrix (issue 12 part 4): each fault on the real local stack, each ending in a safe, audited state.

One ``FaultEnv`` holds a running ``LocalStack`` (Debian's Prometheus as source, a remote-write-receiving
Prometheus as target, the simulated DCGM fleet, the SMTP sink) and a work directory; every fault gets its own
audit database and run id, migrates the catalog's ``gpu-memory`` group (``gpu-utilization`` as the second
group of fault 13) and returns a ``FaultResult``:

- ``source_config_identical``: the source's config file holds, byte for byte, what it held before the fault
  (the run's snapshot, or the bytes before the first run of the fault) and its loaded config has no entry of
  ours;
- ``source_samples_lost``: measured, not assumed: over the fault window, each of the group's series and each
  fleet target's ``up`` on the source is counted (``count_over_time``) and compared with the scrape schedule
  (``core.sample_loss``: ``floor(window / interval)`` per series, 1 sample of edge allowance);
- ``safe``: identical (or, where a group stays dual-writing by design, only our verified entry), reads on the
  source, the audit chain verifies and the fault's own events are there.

``bench/faults/run.py`` runs every fault (``FAULTS``) and writes ``bench/results/faults.json``; the integration tests
(``tests/integration/test_faults.py``) call the same functions and assert on the results. Faults 5 and 6 run a
step in a child process (``python -m promshift.local.faults.kills child ...``) and SIGKILL it at its side effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from promshift.adapters.audit_anchor import anchor_for
from promshift.adapters.audit_store import AuditStore
from promshift.adapters.deploy import ConfigSnapshot, FileConfigDeployer
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.routing import RoutingStore
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.core.catalog import MetricGroup
from promshift.core.durations import parse_duration
from promshift.core.render import remote_write_name, remote_write_names, sha256_bytes
from promshift.core.sample_loss import sample_loss
from promshift.local.stack.local import PROMETHEUS_BIN, SCRAPE_JOB, LocalStack
from promshift.orchestration.compose import compose_migration
from promshift.steps.migration import Backends, GroupMigration, observe_warmup

CATALOG = REPO_ROOT / "catalog" / "metric_groups.yaml"
PROFILE = "demo"
GROUP = "gpu-memory"
OTHER_GROUP = "gpu-utilization"
TRIGGERED_BY = "sre-carol"
APPROVER = "oncall-alice"
PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
TARGET_DEADLINE_S = 40.0
MIN_LOSS_WINDOW_S = 10.0


def now() -> datetime:
    return datetime.now(UTC)


@dataclasses.dataclass
class FaultResult:
    fault: str
    stage: str
    outcome: str
    safe: bool
    source_config_identical: bool
    source_samples_lost: int | None
    audit_events: list[str]
    notes: str
    duration_s: float = 0.0
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Prometheus waits up to --storage.remote.flush-deadline (default 1m) for a removed remote_write queue to flush
# when a reload drops it; with the target down that is the whole deadline (measured: a rollback's reload with the
# default outlasted the client's 120 s reload timeout). The fault stack's Prometheus runs with a short one.
FLUSH_DEADLINE = "5s"


def prometheus_wrapper(directory: Path, real: str = PROMETHEUS_BIN) -> str:
    """An executable that runs Debian's Prometheus with ``--storage.remote.flush-deadline`` set (StackConfig's
    ``prometheus_bin``); every other argument is the stack's own."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "prometheus-short-flush"
    path.write_text(f'#!/bin/sh\nexec {real} --storage.remote.flush-deadline={FLUSH_DEADLINE} "$@"\n')
    path.chmod(0o755)
    return str(path)


def small_group(name: str = GROUP) -> MetricGroup:
    """The catalog group (demo profile) with a parity grid for 1 s scrapes and one short latency window."""
    group = load_catalog(CATALOG, profile=PROFILE).get(name)
    latency = dataclasses.replace(group.latency, windows=group.latency.windows[:1], repeats=2)
    return dataclasses.replace(group, parity=dataclasses.replace(group.parity, step_s=2.0, skip_recent_s=4.0),
                               latency=latency)


# -- the environment -----------------------------------------------------------------------------------------


class FaultEnv:
    """A running local stack, a work directory, and the Airflow connections a trigger or operator reads."""

    def __init__(self, stack: LocalStack, work: Path) -> None:
        self.stack = stack
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.interval_s = parse_duration(stack.config.scrape_interval)
        self._saved: dict[str, str | None] = {}
        env = {
            "PROMSHIFT_HOME": str(self.work / "home"),
            "PROMSHIFT_NOTIFY_TIMEOUT": "5",
            "AIRFLOW_CONN_PROMSHIFT_SOURCE": json.dumps({
                "conn_type": "prometheus", "host": stack.source_url,
                "extra": {"config_path": str(stack.source_config_path), "promtool": "promtool"}}),
            "AIRFLOW_CONN_PROMSHIFT_TARGET": json.dumps({
                "conn_type": "prometheus", "host": stack.target_url,
                "extra": {"remote_write_url": stack.target_remote_write_url}}),
        }
        with contextlib.suppress(Exception):  # the sink is part of the stack; without it notices are recorded unsent
            env.update(stack.smtp_connection_env())
        env.setdefault("PROMSHIFT_AUDIT_KEY", os.environ.get("PROMSHIFT_AUDIT_KEY") or uuid.uuid4().hex * 2)
        for key, value in env.items():
            self._saved[key] = os.environ.get(key)
            os.environ[key] = value
        (self.work / "home").mkdir(exist_ok=True)
        self.baseline = self.config_bytes()
        self.wait_history(MIN_LOSS_WINDOW_S + 2)

    def wait_history(self, seconds: float) -> None:
        """Wait until the source holds ``seconds`` of scrapes of every fleet target: a loss window never
        reaches back before the source began scraping (that would read as lost samples)."""
        want = int(seconds / self.interval_s) - 1
        query = f'min(count_over_time(up{{job="{SCRAPE_JOB}"}}[{int(seconds * 1000)}ms]))'
        deadline = time.monotonic() + seconds + 30
        while (self.source().scalar(query) or 0) < want:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the source did not hold {seconds:g}s of scrapes in time")
            time.sleep(0.5)

    def close(self) -> None:
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved.clear()

    # clients and stores
    def source(self) -> PrometheusClient:
        return PrometheusClient(self.stack.source_url, timeout_s=30)

    def target(self) -> PrometheusClient:
        return PrometheusClient(self.stack.target_url, timeout_s=30)

    def backends(self, *, target_url: str | None = None, promtool: str = "promtool") -> Backends:
        return Backends(source=self.source(), target=PrometheusClient(target_url or self.stack.target_url,
                                                                      timeout_s=30),
                        source_config_path=str(self.stack.source_config_path),
                        target_remote_write_url=self.stack.target_remote_write_url, promtool=promtool)

    def sqlite_url(self, name: str) -> str:
        """One directory per fault: a SQLite audit database's default anchor store sits next to it."""
        (self.work / name).mkdir(exist_ok=True)
        return f"sqlite:///{self.work / name / 'audit.db'}"

    def audit(self, url: str, name: str) -> AuditStore:
        anchor = anchor_for(f"sqlite:///{self.work / f'anchor-{name}.db'}") if url.startswith("postgresql") else None
        return AuditStore(url, anchor=anchor) if anchor is not None else AuditStore(url)

    def migration(self, audit: AuditStore, run_id: str, *, group: MetricGroup | None = None,
                  backends: Backends | None = None, cls: type[GroupMigration] = GroupMigration,
                  **ports: Any) -> GroupMigration:
        return compose_migration(group or small_group(), backends or self.backends(), audit=audit,
                                 routing=RoutingStore(audit.url, engine=audit.engine),
                                 snapshots_dir=self.work / "snapshots", run_id=run_id, catalog_dir=CATALOG.parent,
                                 cls=cls, **ports)

    # the stack's processes
    def stop(self, name: str) -> None:
        pid = self.stack._read_pid(name)
        if pid is None:
            raise RuntimeError(f"the stack's {name} is not running")
        self.stack._stop({name: pid}, 20.0)
        self.stack.pid_path(name).unlink(missing_ok=True)

    def restart_missing(self) -> None:
        self.stack.up(timeout=90)

    # what a run leaves
    def config_bytes(self) -> bytes:
        return self.stack.source_config_path.read_bytes()

    def loaded_entries(self) -> list[str]:
        return remote_write_names(self.source().config_text())

    def guard(self, original: bytes) -> bool:
        """Put ``original`` back if a fault left the file changed (so the next fault starts clean); True if needed."""
        if self.config_bytes() == original:
            return False
        path = self.stack.source_config_path
        FileConfigDeployer(path, self.source()).restore(ConfigSnapshot.of(path, original))
        return True

    # measurements
    @staticmethod
    def newest_after(client: PrometheusClient, query: str, after: float, *, timeout_s: float = 30.0,
                     poll_s: float = 1.0) -> float | None:
        """The first answer of ``query`` (a timestamp) later than ``after``; None if none within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            newest = client.scalar(query)
            if newest is not None and newest > after:
                return newest
            time.sleep(poll_s)
        return None

    def wait_for_target(self, group: MetricGroup, since: float) -> dict[str, Any]:
        deadline = time.monotonic() + TARGET_DEADLINE_S
        while True:
            obs = observe_warmup(group_name=group.name, selector=group.selector(), source=self.source(),
                                 target=self.target(), elapsed_s=time.time() - since)
            if obs.source_series > 0 and obs.target_series >= obs.source_series and obs.lag_s is not None:
                return obs.to_dict()
            if time.monotonic() > deadline:
                raise RuntimeError(f"target never caught up within {TARGET_DEADLINE_S:.0f}s: {obs}")
            time.sleep(0.5)

    def expected_series(self, group: MetricGroup, at: float) -> dict[str, set[str]]:
        """Per metric, the series keys the source holds at ``at`` (the population a window must keep)."""
        client = self.source()
        out = {}
        for metric in group.metrics:
            out[metric] = {series_key(s.labels) for s in client.query(metric, at=at).series}
        out["up"] = {series_key(s.labels) for s in client.query(f'up{{job="{SCRAPE_JOB}"}}', at=at).series}
        return out

    def samples_lost(self, group: MetricGroup, start: float, end: float,
                     expected: Mapping[str, set[str]]) -> dict[str, Any]:
        """The source's stored samples over ``(start, end]`` against its schedule, per metric and for ``up``."""
        settle = end + self.interval_s + 1.0 - time.time()
        if settle > 0:  # the scrape due at ``end`` must be stored before it is counted
            time.sleep(settle)
        window_ms = int((end - start) * 1000)
        window_s = window_ms / 1000
        client = self.source()
        parts = {}
        for metric in [*group.metrics, "up"]:
            selector = f'up{{job="{SCRAPE_JOB}"}}' if metric == "up" else metric
            res = client.query(f"count_over_time({selector}[{window_ms}ms])", at=end)
            stored = {series_key(s.labels): s.points[-1][1] for s in res.series if s.points}
            parts[metric] = sample_loss(stored, window_s=window_s, interval_s=self.interval_s,
                                        expected_series=expected.get(metric, ())).to_dict()
        lost = sum(p["lost_total"] for p in parts.values())
        # Where any loss happened: gaps over 1.5 intervals between a fleet target's stored ``up`` samples.
        raw = client.query(f'up{{job="{SCRAPE_JOB}"}}[{window_ms}ms]', at=end)
        # The window's edges count as samples' neighbours: a gap running into either edge is found too.
        gaps = []
        for series in raw.series:
            stamps = [start, *(t for t, _ in series.points), end]
            gaps += [{"instance": series.labels.get("instance"), "after_s": round(a - start, 1),
                      "gap_s": round(b - a, 1), "missing": round((b - a) / self.interval_s) - 1}
                     for a, b in zip(stamps, stamps[1:], strict=False) if b - a > 1.5 * self.interval_s]
        return {"window_s": window_s, "interval_s": self.interval_s, "lost_total": lost, "up_gaps": gaps,
                "expected_per_series": parts["up"]["expected_per_series"],
                "series": sum(p["series"] for p in parts.values()),
                "shortfall_total": sum(p["shortfall_total"] for p in parts.values()),
                "by_metric": {k: {kk: v[kk] for kk in ("series", "stored_total", "shortfall_total", "lost_total",
                                                        "worst_lost")} for k, v in parts.items()}}


def series_key(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__")


# -- one fault's bookkeeping -----------------------------------------------------------------------------------


class Fault:
    """Times a fault, keeps the source's bytes before it and the population its loss is measured on."""

    def __init__(self, env: FaultEnv, name: str, stage: str, *, groups: tuple[MetricGroup, ...] | None = None):
        self.env, self.name, self.stage = env, name, stage
        self.groups = groups or (small_group(),)
        self.original = env.config_bytes()
        self.started = time.time()
        self.expected = [env.expected_series(g, self.started) for g in self.groups]
        self.audits: list[AuditStore] = []
        self.details: dict[str, Any] = {}

    def finish(self, *, outcome: str, notes: str, audit: AuditStore, must_have: tuple[str, ...] = (),
               dual_writing_by_design: bool = False, loss_window: tuple[float, float] | None = None,
               extra_ok: bool = True) -> FaultResult:
        env = self.env
        ended = time.time()
        current = env.config_bytes()
        loaded = env.loaded_entries()
        ours = {remote_write_name(g.name) for g in self.groups}
        identical = current == self.original and not (ours & set(loaded))
        start, end = loss_window or (self.started, ended)
        start = min(start, end - MIN_LOSS_WINDOW_S)  # a fault over in a second is measured over 10 s around it
        losses = [env.samples_lost(g, start, end, exp) for g, exp in zip(self.groups, self.expected, strict=True)]
        lost = sum(loss["lost_total"] for loss in losses) if len(losses) > 1 else losses[0]["lost_total"]
        if len(losses) > 1:  # ``up`` is counted once per group: count it once
            lost -= sum(loss["by_metric"]["up"]["lost_total"] for loss in losses[1:])
        events = []
        verified = True
        routes = {}
        problems: list[str] = []
        timeline = []
        for store in self.audits or [audit]:
            events += [e.kind for e in store.events()]
            timeline += [(e.kind, round(e.at.timestamp() - start, 1)) for e in store.events()]
            check = store.verify()
            verified = verified and check.ok
            problems += list(check.problems)
        self.details["audit_problems"] = problems
        self.details["event_times_s"] = timeline  # seconds after the loss window's start, to place any gap
        for g in self.groups:
            routes[g.name] = RoutingStore(audit.url, engine=audit.engine).read_from(g.name)
        missing = [k for k in must_have if k not in events]
        on_source = all(r in (None, "source") for r in routes.values())
        safe = bool((identical or dual_writing_by_design) and verified and not missing and on_source and extra_ok)
        guarded = env.guard(self.original)
        self.details.update(audit_chain_verified=verified, reads_from=routes, loaded_remote_writes=loaded,
                            config_sha256_before=sha256_bytes(self.original), config_sha256_after=sha256_bytes(current),
                            missing_events=missing, guard_restored_config=guarded, samples=losses[0]
                            if len(losses) == 1 else losses)
        return FaultResult(fault=self.name, stage=self.stage, outcome=outcome, safe=safe and not guarded,
                           source_config_identical=identical, source_samples_lost=lost, audit_events=events,
                           notes=notes, duration_s=round(ended - self.started, 1), details=self.details)


def deploy(m: GroupMigration) -> tuple[dict[str, Any], dict[str, Any]]:
    m.validate(now())
    snap = m.snapshot(now())
    return snap, m.deploy_dual_write(snap, now())


def warm_up(m: GroupMigration, since: float, *, timeout_s: float = 30.0) -> dict[str, Any]:
    """The real WarmupTrigger (from connection ids, as the triggerer builds it), 1 s polls; records its event."""
    from promshift.orchestration.triggers import WarmupTrigger

    m.start_warmup(now())
    trigger = WarmupTrigger(group_name=m.group.name, selector=m.group.selector(), source_conn_id="promshift_source",
                            target_conn_id="promshift_target", started_at=since, min_duration_s=1.0,
                            timeout_s=timeout_s, max_lag_s=30.0, poll_interval_s=1.0)
    event = asyncio.run(first_event(trigger, timeout_s + 15))
    m.finish_warmup(event, now())
    return event


async def first_event(trigger: Any, timeout_s: float) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise RuntimeError("the trigger ended without an event")

    return await asyncio.wait_for(first(), timeout=timeout_s)


def rollback(m: GroupMigration, snap: Mapping[str, Any] | None) -> dict[str, Any]:
    return m.rollback(snap, reason=m.failure_reason(), now=now())


def wait_parity_window(m: GroupMigration, since: float) -> None:
    p = m.group.parity
    ready_at = since + 2 * p.step_s + p.skip_recent_s + 3 * p.step_s
    time.sleep(max(0.0, ready_at - time.time()))
