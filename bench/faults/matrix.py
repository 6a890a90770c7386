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

``bench/faults/run.py`` runs every fault and writes ``bench/results/faults.json``; the integration tests
(``tests/integration/test_faults.py``) call the same functions and assert on the results. Faults 5 and 6 run a
step in a child process (``python matrix.py child ...``) and SIGKILL it at its side effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT / "include") not in sys.path:
    sys.path.insert(0, str(REPO_ROOT / "include"))

from promshift.adapters.audit_anchor import anchor_for  # noqa: E402
from promshift.adapters.audit_store import AuditStore  # noqa: E402
from promshift.adapters.deploy import ConfigSnapshot, FileConfigDeployer  # noqa: E402
from promshift.adapters.prometheus import PrometheusClient  # noqa: E402
from promshift.adapters.routing import RoutingStore  # noqa: E402
from promshift.adapters.settings import load_catalog  # noqa: E402
from promshift.core.catalog import MetricGroup  # noqa: E402
from promshift.core.durations import parse_duration  # noqa: E402
from promshift.core.render import remote_write_name, remote_write_names, sha256_bytes  # noqa: E402
from promshift.core.sample_loss import sample_loss  # noqa: E402
from promshift.local.stack.local import PROMETHEUS_BIN, SCRAPE_JOB, SOURCE, TARGET, LocalStack  # noqa: E402
from promshift.orchestration.compose import compose_migration  # noqa: E402
from promshift.steps.migration import Backends, GroupMigration, observe_warmup  # noqa: E402

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


# -- 1, 2: the target down ---------------------------------------------------------------------------------------


def fault_target_down_warmup(env: FaultEnv) -> FaultResult:
    f = Fault(env, "target down during warm-up", "warming")
    audit = env.audit(env.sqlite_url("f1"), "f1")
    m = env.migration(audit, "manual__fault-1")
    snap, deployed = deploy(m)
    env.stop(TARGET)
    try:
        event = warm_up(m, float(deployed["dual_write_since"]), timeout_s=10.0)
        rolled = rollback(m, snap)
    finally:
        env.restart_missing()
    f.details.update(warmup_event={k: event.get(k) for k in ("status", "reason")}, rollback=rolled)
    return f.finish(outcome=f"warm-up ended {event['status']!r} ({event.get('reason')}); rolled back, "
                            f"restored_identical={rolled['restored_identical']}",
                    notes="target Prometheus stopped (SIGTERM) after the dual-write deploy; the real WarmupTrigger "
                          "polled it; the source kept its entry until the rollback (its queue retried meanwhile); "
                          "target restarted afterwards",
                    audit=audit, must_have=("dual_write_deployed", "warmup_started", f"warmup_{event['status']}",
                                            "rolled_back"),
                    extra_ok=event["status"] in ("error", "timeout") and rolled["restored_identical"] is True)


def fault_target_down_parity(env: FaultEnv) -> FaultResult:
    f = Fault(env, "target down during parity", "parity")
    audit = env.audit(env.sqlite_url("f2"), "f2")
    m = env.migration(audit, "manual__fault-2")
    snap, deployed = deploy(m)
    since = float(deployed["dual_write_since"])
    event = warm_up(m, since)
    wait_parity_window(m, since)
    env.stop(TARGET)
    try:
        try:
            parity = m.parity(dual_write_since=since, now=now())
            latency = m.latency(now(), dual_write_since=since)
            verdict = m.gate(parity, latency, now())
            step = f"parity {parity.verdict.value}, latency {latency.verdict.value}, gate {verdict.verdict.value}"
            passed = parity.verdict.value == "SUCCESSFUL"
        except Exception as exc:  # noqa: BLE001 - a step that raises fails its task, and the rollback runs
            step = f"parity raised {type(exc).__name__}: {str(exc)[:160]}"
            passed = False
        rolled = rollback(m, snap)
    finally:
        env.restart_missing()
    f.details.update(warmup=event["status"], step=step, rollback=rolled)
    return f.finish(outcome=f"{step}; rolled back, restored_identical={rolled['restored_identical']}",
                    notes="target stopped after warm-up was ready and the parity window had filled; parity, "
                          "latency and the gate ran against it; target restarted afterwards",
                    audit=audit, must_have=("warmup_ready", "rolled_back"),
                    extra_ok=rolled["restored_identical"] is True and not passed)


# -- 3: a 429 storm --------------------------------------------------------------------------------------------


class Always429(ThreadingHTTPServer):
    """Answers every request 429 Too Many Requests (AMP's throttling), counting them."""

    daemon_threads = True

    def __init__(self) -> None:
        self.count = 0
        lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                with lock:
                    server.count += 1
                body = b'{"status":"error","errorType":"throttled","error":"ThrottlingException: Rate exceeded"}'
                self.send_response(429)
                self.send_header("Content-Type", "application/json")
                self.send_header("Retry-After", "1")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> Always429:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
        self.server_close()


def fault_429_storm_latency(env: FaultEnv) -> FaultResult:
    f = Fault(env, "429 storm during latency", "latency")
    audit = env.audit(env.sqlite_url("f3"), "f3")
    m = env.migration(audit, "manual__fault-3")
    snap, deployed = deploy(m)
    since = float(deployed["dual_write_since"])
    warm_up(m, since)
    wait_parity_window(m, since)
    parity = m.parity(dual_write_since=since, now=now())
    with Always429() as storm:
        # The same run's latency step, reading the target through a front door that throttles every request.
        throttled = env.migration(audit, m.run_id, backends=env.backends(target_url=storm.url))
        latency = throttled.latency(now(), dual_write_since=since)
    verdict = m.gate(parity, latency, now())
    rolled = rollback(m, snap)
    target_runs = [r for r in latency.runs if r.backend == "target"]
    throttled_runs = [r for r in target_runs if r.error and "throttled" in r.error]
    f.details.update(parity=parity.verdict.value, latency=latency.verdict.value, latency_retries=latency.retries,
                     target_runs=len(target_runs), throttled_runs=len(throttled_runs), http_429_answered=storm.count,
                     gate=verdict.to_dict(), rollback=rolled)
    return f.finish(outcome=f"parity {parity.verdict.value}; latency {latency.verdict.value}: "
                            f"{len(throttled_runs)}/{len(target_runs)} target runs throttled after "
                            f"{latency.retries} retries ({storm.count} answers 429); gate "
                            f"{verdict.verdict.value} -> {verdict.action.value}; rolled back",
                    notes="a local HTTP front door answering every target query 429 (Retry-After: 1) stands in "
                          "for AMP throttling; the local stack has no 429 fault injection; the probe retried "
                          "3 times with backoff and counted each throttled run as failed, never as slow",
                    audit=audit, must_have=("rolled_back",),
                    extra_ok=bool(target_runs) and len(throttled_runs) == len(target_runs)
                    and latency.verdict.value != "SUCCESSFUL" and rolled["restored_identical"] is True)


# -- 4: a reload the source refuses ----------------------------------------------------------------------------


def fault_reload_rejected(env: FaultEnv) -> FaultResult:
    f = Fault(env, "reload rejected by the source", "deploy_dual_write")
    audit = env.audit(env.sqlite_url("f4"), "f4")
    # A keep-regex Go's regexp refuses, and a promtool that accepts anything: the bad config reaches the reload.
    bad = dataclasses.replace(small_group(), metrics=(), metric_regex="DCGM_FI_DEV_FB_(USED")
    m = env.migration(audit, "manual__fault-4")
    m.validate(now())
    snap = m.snapshot(now())
    slipped = env.migration(audit, m.run_id, group=bad, backends=env.backends(promtool="true"))
    try:
        slipped.deploy_dual_write(snap, now())
        error = "none: the deploy went through"
    except Exception as exc:  # noqa: BLE001 - the step fails; its rollback runs next
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
    rolled = rollback(m, snap)
    failed = [e for e in audit.events() if e.kind == "deploy_failed"]
    f.details.update(error=error, deploy_failed=failed[0].evidence_data if failed else None, rollback=rolled)
    return f.finish(outcome=f"deploy refused at reload ({error[:120]}); deployer restored the snapshot; "
                            f"deploy_failed audited; rollback restored_identical={rolled['restored_identical']}",
                    notes="promtool pointed at /usr/bin/true (a permissive checker) so a keep-regex Prometheus "
                          "refuses ('DCGM_FI_DEV_FB_(USED') slipped past the check; the running source refused the "
                          "reload (HTTP 500) and kept its previous config",
                    audit=audit, must_have=("deploy_failed", "rolled_back"),
                    extra_ok=error.startswith("DeployError") and "dual_write_deployed" not in
                    [e.kind for e in audit.events()])


# -- 5, 6: the worker SIGKILLed at a side effect ---------------------------------------------------------------


def child_main(argv: list[str]) -> None:
    """``child deploy|rollback <json>``: run that step; print WRITTEN after the config write, then wait to die."""
    step, spec = argv[0], json.loads(argv[1])
    import promshift.adapters.deploy as deploy_module

    real = deploy_module.write_atomically

    def write_then_hang(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        print("WRITTEN", flush=True)
        time.sleep(120)  # SIGKILLed here: after the write, before the reload and the audit event

    deploy_module.write_atomically = write_then_hang
    stack = SimpleNamespace(source_url=spec["source_url"], target_url=spec["target_url"],
                            source_config_path=Path(spec["config_path"]),
                            target_remote_write_url=spec["remote_write_url"])
    backends = Backends(source=PrometheusClient(stack.source_url, timeout_s=30),
                        target=PrometheusClient(stack.target_url, timeout_s=30),
                        source_config_path=spec["config_path"], target_remote_write_url=spec["remote_write_url"])
    audit = AuditStore(spec["audit_url"])
    m = compose_migration(small_group(), backends, audit=audit, routing=RoutingStore(audit.url, engine=audit.engine),
                       snapshots_dir=spec["snapshots_dir"], run_id=spec["run_id"], catalog_dir=CATALOG.parent)
    if step == "deploy":
        m.deploy_dual_write(spec["snapshot"], now())
    else:
        m.rollback(spec["snapshot"], reason="fault: the worker is killed in the middle", now=now())
    print("FINISHED", flush=True)


def run_and_kill(env: FaultEnv, step: str, audit_url: str, run_id: str, snap: Mapping[str, Any]) -> dict[str, Any]:
    spec = {"source_url": env.stack.source_url, "target_url": env.stack.target_url,
            "config_path": str(env.stack.source_config_path), "remote_write_url": env.stack.target_remote_write_url,
            "audit_url": audit_url, "snapshots_dir": str(env.work / "snapshots"), "run_id": run_id,
            "snapshot": dict(snap)}
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT / "include"), child_env.get("PYTHONPATH"))
                                              if p)
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "child", step, json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env)
    deadline = time.monotonic() + 60
    line = ""
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line or line.strip() in ("WRITTEN", "FINISHED"):
            break
    if line.strip() != "WRITTEN":
        proc.kill()
        raise RuntimeError(f"the child never reached its side effect: {line!r} {proc.stderr.read()[-2000:]}")
    os.kill(proc.pid, signal.SIGKILL)
    code = proc.wait(10)
    return {"child_pid": proc.pid, "exit": code, "killed_by": "SIGKILL" if code == -signal.SIGKILL else str(code)}


def fault_kill_deploy(env: FaultEnv) -> FaultResult:
    f = Fault(env, "worker SIGKILLed in deploy_dual_write, then retried", "deploy_dual_write")
    url = env.sqlite_url("f5")
    audit = env.audit(url, "f5")
    m = env.migration(audit, "manual__fault-5")
    m.validate(now())
    snap = m.snapshot(now())
    killed = run_and_kill(env, "deploy", url, m.run_id, snap)
    entry = remote_write_name(GROUP)
    after_kill = {"file_has_entry": entry in remote_write_names(env.config_bytes()),
                  "loaded": entry in env.loaded_entries(),
                  "events": [e.kind for e in audit.events()]}
    retried = m.deploy_dual_write(snap, now())  # Airflow's retry, in this process
    live_after_retry = entry in env.loaded_entries()
    rolled = rollback(m, snap)
    f.details.update(kill=killed, after_kill=after_kill, retry={"resumed": "resumed" in retried,
                                                               "live": live_after_retry}, rollback=rolled)
    return f.finish(outcome=f"killed after the config write (file has entry: {after_kill['file_has_entry']}, "
                            f"loaded: {after_kill['loaded']}, no event); retry verified, reloaded and recorded it "
                            f"once (resumed); rollback restored_identical={rolled['restored_identical']}",
                    notes="a child process ran deploy_dual_write and was SIGKILLed right after the atomic file "
                          "write, before the reload and the audit event; the retry ran in this process",
                    audit=audit, must_have=("dual_write_deployed", "rolled_back"),
                    extra_ok=killed["killed_by"] == "SIGKILL" and after_kill["file_has_entry"]
                    and "resumed" in retried and live_after_retry
                    and [e.kind for e in audit.events()].count("dual_write_deployed") == 1)


def fault_kill_rollback(env: FaultEnv) -> FaultResult:
    f = Fault(env, "worker SIGKILLed during rollback, then retried", "rollback")
    url = env.sqlite_url("f6")
    audit = env.audit(url, "f6")
    m = env.migration(audit, "manual__fault-6")
    snap, _ = deploy(m)
    killed = run_and_kill(env, "rollback", url, m.run_id, snap)
    entry = remote_write_name(GROUP)
    after_kill = {"file_is_snapshot": env.config_bytes() == f.original, "loaded": entry in env.loaded_entries(),
                  "events": [e.kind for e in audit.events()]}
    rolled = rollback(m, snap)  # the retry
    again = rollback(m, snap)  # and once more: nothing new is recorded
    f.details.update(kill=killed, after_kill=after_kill, rollback=rolled, second_retry=again.get("already_rolled_back"))
    return f.finish(outcome=f"killed after the snapshot bytes were written, before the reload (entry still loaded: "
                            f"{after_kill['loaded']}) and the event; retry reloaded and recorded rolled_back, "
                            f"restored_identical={rolled['restored_identical']}",
                    notes="a child process ran rollback and was SIGKILLed right after the restore's file write; "
                          "the retry (and a second one, which records nothing) ran in this process",
                    audit=audit, must_have=("rolled_back",),
                    extra_ok=killed["killed_by"] == "SIGKILL" and after_kill["loaded"]
                    and rolled["restored_identical"] is True and again.get("already_rolled_back") is True
                    and [e.kind for e in audit.events()].count("rolled_back") == 1)


# -- 7, 8, 10, 11: the Airflow operators (scheduler, triggerer, approval) -------------------------------------------


class FakeTI:
    """Airflow's side of a task instance: the XComs earlier tasks returned, as ``XComArg.resolve`` pulls them when
    Airflow renders a task's inputs (the operators never pull); keeps what a task pushes."""

    def __init__(self, xcoms: dict[str, Any]) -> None:
        self.xcoms, self.pushed, self.map_index = xcoms, {}, -1

    def xcom_pull(self, *, task_ids: str, key: str, default: Any = None, **_: Any) -> Any:
        return self.xcoms.get(task_ids, default) if key == "return_value" else default

    def xcom_push(self, key: str, value: Any) -> None:
        json.dumps(value)
        self.pushed[key] = value


@contextlib.contextmanager
def audit_url_env(url: str) -> Iterator[None]:
    saved = os.environ.get("PROMSHIFT_AUDIT_URL")
    os.environ["PROMSHIFT_AUDIT_URL"] = url
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PROMSHIFT_AUDIT_URL", None)
        else:
            os.environ["PROMSHIFT_AUDIT_URL"] = saved


class OperatorRun:
    """One DAG run driven through the group DAG's own operators (``build_group_dag``), XComs kept in memory.

    ``fresh()`` re-parses the DAG: new operator objects, as a restarted scheduler or another worker has.
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.xcoms: dict[str, Any] = {}
        self.dag = self.fresh()

    @staticmethod
    def fresh() -> Any:
        from promshift.local.group_dag import build_group_dag

        return build_group_dag(load_catalog(CATALOG, profile=PROFILE).get(GROUP), catalog_path=CATALOG,
                               profile=PROFILE)

    def context(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "ti": FakeTI(self.xcoms),
                "dag_run": SimpleNamespace(triggering_user_name=TRIGGERED_BY)}

    def task(self, task_id: str) -> Any:
        """The DAG's task as a worker runs it: its inputs (XComArgs of earlier tasks' outputs) rendered to values."""
        op = self.dag.get_task(task_id)
        op.render_template_fields(self.context())
        return op

    def run(self, task_id: str) -> Any:
        value = self.task(task_id).execute(self.context())
        self.xcoms[task_id] = value
        return value

    def up_to_dual_write(self) -> None:
        for task_id in ("validate", "snapshot", "deploy_dual_write"):
            self.run(task_id)

    def rollback(self) -> dict[str, Any]:
        return self.run("rollback")


def deferred(op: Any, context: dict[str, Any]) -> Any:
    from airflow.sdk.exceptions import TaskDeferred

    try:
        op.execute(context)
    except TaskDeferred as exc:
        return exc
    raise RuntimeError(f"{op.task_id} did not defer")


def rebuild(serialized: tuple[str, dict[str, Any]], **overrides: Any) -> Any:
    """What a triggerer does with a trigger row: import the class path and call it with the stored kwargs."""
    path, kwargs = serialized
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(**{**kwargs, **overrides})


async def run_then_drop(trigger: Any, seconds: float) -> dict[str, Any] | None:
    """Run a trigger for ``seconds`` and drop it (cancelled, as a dying triggerer's loop is); its event if any."""
    agen = trigger.run()
    task = asyncio.ensure_future(agen.__anext__())
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if done:
        return dict(task.result().payload)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
        await task
    with contextlib.suppress(Exception):
        await agen.aclose()
    return None


# The catalog's demo warm-up is 2 minutes; the rebuilt trigger gets 3 s (the only kwargs changed, and said so).
SHORT_WARMUP = {"min_duration_s": 3.0, "timeout_s": 60.0, "poll_interval_s": 1.0}


def fault_restart_during_warmup(env: FaultEnv, *, who: str) -> FaultResult:
    number = 7 if who == "scheduler" else 8
    f = Fault(env, f"{who} restarted while warm-up is deferred", "warm_up (deferred)")
    url = env.sqlite_url(f"f{number}")
    with audit_url_env(url):
        run = OperatorRun(f"manual__fault-{number}")
        run.up_to_dual_write()
        ctx = run.context()
        first = deferred(run.task("warm_up"), ctx)
        serialized = first.trigger.serialize()
        drops = 0
        if who == "scheduler":
            # The scheduler restarts: the DAG is parsed again and the deferred task may be queued to run again.
            run.dag = run.fresh()
            again = deferred(run.task("warm_up"), run.context())
            serialized = again.trigger.serialize()
            event = asyncio.run(first_event(rebuild(serialized, **SHORT_WARMUP), 60))
        else:
            # The triggerer dies mid-poll: its trigger instance is dropped; the new triggerer rebuilds it from
            # the stored kwargs and runs it from the start (started_at is kept, so elapsed time is not reset).
            event = asyncio.run(run_then_drop(rebuild(serialized, **SHORT_WARMUP), 1.5))
            drops = 1 if event is None else 0
            if event is None:
                event = asyncio.run(first_event(rebuild(serialized, **SHORT_WARMUP), 60))
        run.dag = run.fresh()  # execute_complete runs on whichever worker picks it up
        run.task("warm_up").execute_complete(run.context(), event)
        rolled = run.rollback()
        audit = env.audit(url, f"f{number}")
    kinds = [e.kind for e in audit.events()]
    f.details.update(serialized_kwargs=sorted(serialized[1]), event={k: event.get(k) for k in ("status", "reason")},
                     dropped_mid_run=drops, warmup_started_events=kinds.count("warmup_started"), rollback=rolled)
    where = ("the DAG re-parsed (new operator objects), warm_up's execute run a second time (re-queued), the "
             "trigger completed and execute_complete ran on new objects" if who == "scheduler" else
             "the WarmupTrigger was serialized, its instance dropped after 1.5 s of polling (cancelled), rebuilt "
             "from the serialized kwargs and run again to completion")
    return f.finish(outcome=f"warm-up {event['status']} after the restart; warmup_started recorded "
                            f"{kinds.count('warmup_started')}x; rollback restored_identical="
                            f"{rolled['restored_identical']}",
                    notes=f"trigger/operator level, not a real Airflow scheduler or triggerer: {where}; the rebuilt "
                          f"trigger's min_duration/timeout/poll were shortened ({SHORT_WARMUP}); validate, "
                          "snapshot, deploy, warm_up and rollback are the group DAG's own operators",
                    audit=audit, must_have=("warmup_started", "warmup_ready", "rolled_back"),
                    extra_ok=event["status"] == "ready" and kinds.count("warmup_started") == 1
                    and rolled["restored_identical"] is True)


def fault_restart_scheduler(env: FaultEnv) -> FaultResult:
    return fault_restart_during_warmup(env, who="scheduler")


def fault_restart_triggerer(env: FaultEnv) -> FaultResult:
    return fault_restart_during_warmup(env, who="triggerer")


def fault_approval(env: FaultEnv, *, kind: str) -> FaultResult:
    from airflow.sdk.exceptions import AirflowFailException

    number = 10 if kind == "timeout" else 11
    name = "approval timed out" if kind == "timeout" else "approver is the run's trigger (four eyes)"
    f = Fault(env, name, "approval")
    url = env.sqlite_url(f"f{number}")
    with audit_url_env(url):
        run = OperatorRun(f"manual__fault-{number}")
        run.up_to_dual_write()
        if kind == "timeout":
            event = {"error": "The timeout has passed, and no response was received.", "error_type": "timeout"}
        else:
            event = {"chosen_options": ["Approve"], "params_input": {"comment": "mine, lgtm"},
                     "responded_at": now(), "responded_by_user": {"id": TRIGGERED_BY, "name": TRIGGERED_BY}}
        try:
            run.task("approval").execute_complete(run.context(), event)
            failed = "approval passed"
        except AirflowFailException as exc:
            failed = str(exc)
        rolled = run.rollback()
        audit = env.audit(url, f"f{number}")
    expect = "approval_timeout" if kind == "timeout" else "approval_refused_four_eyes"
    f.details.update(task_failed=failed, rollback=rolled)
    return f.finish(outcome=f"approval task failed ({failed}); {expect} audited; rollback "
                            f"restored_identical={rolled['restored_identical']} (reason: {rolled['reason']})",
                    notes="MigrationApprovalOperator.execute_complete given the event Airflow's HITL trigger hands "
                          "it (no HITL request or UI; gate/parity skipped: the group was dual-writing); the "
                          "rollback is the DAG's RollbackOperator",
                    audit=audit, must_have=(expect, "rolled_back"),
                    extra_ok=failed != "approval passed" and rolled["restored_identical"] is True)


def fault_approval_timeout(env: FaultEnv) -> FaultResult:
    return fault_approval(env, kind="timeout")


def fault_self_approval(env: FaultEnv) -> FaultResult:
    return fault_approval(env, kind="four-eyes")


# -- 9: the audit database unreachable at a stage transition ---------------------------------------------------


class TcpProxy:
    """127.0.0.1 proxy to PostgreSQL that can be cut (every connection closed, new ones refused) and resumed."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        with self.lock:
            for s in self.conns:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
            self.conns.clear()


@contextlib.contextmanager
def pg_database(prefix: str) -> Iterator[str]:
    """A throwaway database on the local PostgreSQL (trust auth); its name."""
    from sqlalchemy import create_engine, text

    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def fault_audit_unreachable(env: FaultEnv) -> FaultResult:
    f = Fault(env, "audit database unreachable at a stage transition", "deploy_dual_write -> dual_writing")
    proxy = TcpProxy(("127.0.0.1", 5432))
    proxy.start()
    with pg_database("promshift_fault9") as db:
        url = f"postgresql+psycopg://postgres@127.0.0.1:{proxy.port}/{db}"
        audit = env.audit(url, "f9")

        class CutAfterWrite(FileConfigDeployer):
            def deploy(self, *args: Any, **kwargs: Any) -> Any:
                outcome = super().deploy(*args, **kwargs)
                proxy.cut()  # the file is written, reloaded and verified live; the audit database goes away
                return outcome

        from promshift.adapters.file_deployment import FileDeployment
        from promshift.core.deploy import group_entry, group_entry_record

        b, g = env.backends(), small_group()
        m = env.migration(audit, "manual__fault-9", group=g, backends=b, deployer=FileDeployment(
            CutAfterWrite(b.source_config_path, b.source, promtool=b.promtool),
            group_entry(g, b.target_remote_write_url, b.target_sigv4),
            record=group_entry_record(g, b.target_remote_write_url, b.target_sigv4), keep_others=True))
        m.validate(now())
        snap = m.snapshot(now())
        try:
            m.deploy_dual_write(snap, now())
            error = "none"
        except Exception as exc:  # noqa: BLE001
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        entry = remote_write_name(GROUP)
        while_down = {"file_is_snapshot": env.config_bytes() == f.original, "loaded": entry in env.loaded_entries()}
        proxy.start()  # the database is back; Airflow's rollback task runs
        audit.engine.dispose()
        rolled = rollback(m, snap)
        kinds = [e.kind for e in audit.events()]
        f.details.update(error=error, while_audit_down=while_down, rollback=rolled)
        result = f.finish(outcome=f"dual_write_deployed could not be appended ({error[:100]}); the deploy was undone "
                                  f"before the error rose (file is snapshot: {while_down['file_is_snapshot']}, "
                                  f"loaded: {while_down['loaded']}); rollback recorded once the database was back",
                          notes="PostgreSQL behind a local TCP proxy that was cut right after the deployer wrote, "
                                "reloaded and verified the entry (before the audit append); FIXED in migration.py: "
                                "before, the entry stayed deployed and live with no audit event",
                          audit=audit, must_have=("snapshot_taken", "rolled_back"),
                          extra_ok=while_down["file_is_snapshot"] and not while_down["loaded"]
                          and "dual_write_deployed" not in kinds and error != "none")
        audit.engine.dispose()
        proxy.cut()
    return result


# -- 12: two runs of one group at once ------------------------------------------------------------------------


def fault_two_runs_one_group(env: FaultEnv) -> FaultResult:
    from promshift.steps.migration import GroupNotStartable

    f = Fault(env, "two runs of one group triggered at once", "validate")
    url = env.sqlite_url("f12")
    env.audit(url, "f12")  # create the database once
    runs = {rid: env.migration(env.audit(url, "f12"), rid) for rid in ("manual__fault-12-a", "manual__fault-12-b")}
    barrier = threading.Barrier(len(runs))
    outcome: dict[str, str] = {}

    def validate(rid: str) -> None:
        barrier.wait()
        try:
            runs[rid].validate(now())
            outcome[rid] = "validated"
        except GroupNotStartable as exc:
            outcome[rid] = f"refused: {exc}"
        except Exception as exc:  # noqa: BLE001
            outcome[rid] = f"error: {type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=validate, args=(rid,)) for rid in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    winners = [rid for rid, o in outcome.items() if o == "validated"]
    losers = [rid for rid in runs if rid not in winners]
    results: dict[str, Any] = {}
    for rid in losers:  # the refused run's rollback task: nothing was snapshotted, nothing to do
        results[rid] = rollback(runs[rid], None)
    if winners:
        m = runs[winners[0]]
        # While the winner holds the group, a late third run is refused too.
        late = env.migration(env.audit(url, "f12"), "manual__fault-12-late")
        try:
            late.validate(now())
            results["late"] = "validated (wrong)"
        except GroupNotStartable as exc:
            results["late"] = f"refused: {str(exc)[:100]}"
        rollback(late, None)
        snap = m.snapshot(now())
        m.deploy_dual_write(snap, now())
        results[winners[0]] = rollback(m, snap)
    audit = env.audit(url, "f12")
    from promshift.orchestration.dag_factory import build_migration_dag, migration_targets

    # The group's migration DAG as the DAG file builds it: one per target connection, shared by its groups.
    catalog = load_catalog(CATALOG, profile=PROFILE)
    target = catalog.get(GROUP).target
    members = migration_targets(catalog.groups)[target]
    max_active = build_migration_dag(members, target=target, catalog_path=CATALOG, profile=PROFILE).max_active_runs
    f.details.update(validate=outcome, results=results, dag_max_active_runs=max_active, dag_groups=len(members))
    won = results.get(winners[0], {}) if winners else {}
    return f.finish(outcome=f"{len(winners)} run validated, {len(losers)} refused (GroupNotStartable: the group "
                            f"is held by the first claim in the audit chain); late run {results.get('late', '-')[:8]}; "
                            f"winner rolled back identical={won.get('restored_identical')}",
                    notes="two GroupMigration runs (own audit-store engines, one SQLite file) validated at once from "
                          "two threads behind a barrier; FIXED in migration.py: a run now holds its group from its "
                          "validated event until it completes or rolls back. That claim is the only guard: the "
                          f"group's migration DAG is its target's, shared by {len(members)} group(s), and lets "
                          f"{max_active} runs at once (room for a run of every group)",
                    audit=audit, must_have=("validated", "validation_failed", "rollback_not_needed", "rolled_back"),
                    extra_ok=len(winners) == 1 and max_active >= len(members) and str(
                        results.get("late", "")).startswith("refused") and won.get("restored_identical") is True)


# -- 13: two groups cutting over at once --------------------------------------------------------------------------


ROLLBACK_KEYS = ("method", "restored_identical", "kept_changes_since_snapshot", "own_entry_removed",
                 "remote_write_still_live")


def fault_two_groups_cut_over(env: FaultEnv) -> FaultResult:
    groups = (small_group(GROUP), small_group(OTHER_GROUP))
    f = Fault(env, "two groups cutting over at once", "cutover", groups=groups)
    with pg_database("promshift_fault13") as db:
        url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{db}"
        stores = [env.audit(url, "f13") for _ in groups]
        ms = [env.migration(store, f"manual__fault-13-{g.name}", group=g) for store, g in zip(stores, groups,
                                                                                                 strict=True)]
        snaps = []
        for m in ms:  # each group dual-writes, warms up and is approved (the source file: one deploy at a time)
            snap, _ = deploy(m)
            snaps.append(snap)
            m.start_warmup(now())
            m.record_approval(decision="Approve", by=APPROVER, comment="fault 13", now=now())
        barrier = threading.Barrier(len(ms))
        cut: dict[str, Any] = {}

        def cutover(m: GroupMigration) -> None:
            barrier.wait()
            try:
                cut[m.group.name] = m.cutover(now())["routing"]
            except Exception as exc:  # noqa: BLE001
                cut[m.group.name] = f"error: {type(exc).__name__}: {exc}"

        threads = [threading.Thread(target=cutover, args=(m,)) for m in ms]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        routing = RoutingStore(url, engine=stores[0].engine)
        both = {g.name: routing.read_from(g.name) for g in groups}
        # Both roll back, the first-deployed group first: its snapshot predates the other group's entry.
        rolled = [m.rollback(s, reason="fault 13: end", now=now()) for m, s in zip(ms, snaps, strict=True)]
        audit = env.audit(url, "f13")
        f.details.update(cut_over=cut, read_from_after_cutover=both,
                         rollbacks=[{k: r.get(k) for k in ROLLBACK_KEYS} for r in rolled])
        result = f.finish(outcome=f"both cut over at once: read_from {both}; both rolled back (first group first: "
                                  f"{rolled[0]['method']}, kept {rolled[0].get('kept_changes_since_snapshot')}); "
                                  "source back to the bytes before either",
                          notes="two GroupMigrations on their own engines against one PostgreSQL database "
                                "(127.0.0.1:5432, a throwaway database), cutover() from two threads behind a barrier; "
                                "FIXED in migration.py: a rollback whose snapshot predates another group's entry "
                                "removes only its own entry (before, it wrote its snapshot back and dropped the other "
                                "group's live entry, and the other's later rollback resurrected the first's)",
                          audit=audit, must_have=("cut_over", "rolled_back"),
                          extra_ok=both == {g.name: "target" for g in groups}
                          and [e.kind for e in audit.events()].count("cut_over") == 2)
        for store in [*stores, audit]:
            store.engine.dispose()
    return result


# -- 14: the source restarted mid-dual-write ----------------------------------------------------------------------


def fault_source_restart(env: FaultEnv) -> FaultResult:
    f = Fault(env, "source Prometheus restarted mid-dual-write", "dual_writing")
    audit = env.audit(env.sqlite_url("f14"), "f14")
    m = env.migration(audit, "manual__fault-14")
    snap, deployed = deploy(m)
    since = float(deployed["dual_write_since"])
    env.wait_for_target(m.group, since)
    entry = remote_write_name(GROUP)
    down_at = time.time()
    env.stop(SOURCE)
    time.sleep(6.0)
    env.restart_missing()
    up_at = time.time()
    loaded_after = entry in env.loaded_entries()
    # Dual-write resumes: the target receives samples newer than the restart.
    resumed_at = env.newest_after(env.target(), f"max(timestamp({m.group.metrics[0]}))", up_at)
    # When the restarted source scrapes again: its newest ``up`` sample is later than the restart.
    scraping_at = env.newest_after(env.source(), f'max(timestamp(up{{job="{SCRAPE_JOB}"}}))', up_at, poll_s=0.5)
    # A whole window after scraping resumed, with our entry still live: what the migration could cost the source.
    time.sleep(max(0.0, (scraping_at or time.time()) + MIN_LOSS_WINDOW_S + 0.5 - time.time()))
    after_end = time.time()
    rolled = rollback(m, snap)
    downtime = up_at - down_at
    window = (down_at - 5.0, max(up_at, resumed_at or up_at) + 5.0)
    f.details.update(process_down_s=round(downtime, 1), entry_loaded_after_restart=loaded_after,
                     target_newest_sample_after_restart=resumed_at, rollback=rolled)
    result = f.finish(outcome=f"source process down {downtime:.1f}s (SIGTERM, restarted); entry loaded after "
                              f"restart: {loaded_after}; dual-write resumed: {resumed_at is not None}; rollback "
                              f"restored_identical={rolled['restored_identical']}",
                      notes="the stack's source process stopped and started again between deploy and rollback; "
                            "source_samples_lost is measured outside the restart (10 s before the stop, and 10 s "
                            "after the source scraped again, our entry live throughout); the restart's own gap is "
                            "measured too (details.samples_lost_over_restart, 5 s before the stop to 5 s after the "
                            "target had new samples) and is the restart's, not promshift's: no scrapes while the "
                            "process is down, and Prometheus starts scraping up to ~5 s after it is ready (its scrape "
                            "manager applies targets on a 5 s tick), so the gap in `up` outlasts the process downtime",
                      audit=audit, must_have=("dual_write_deployed", "rolled_back"), loss_window=window,
                      extra_ok=loaded_after and resumed_at is not None and rolled["restored_identical"] is True)
    gaps = result.details["samples"]["up_gaps"]
    # The restart's own gap (no process, no scrapes) is the fault, not promshift's doing: it is kept as measured,
    # and ``source_samples_lost`` is the loss outside it: before the stop and after scraping resumed.
    outside = [env.samples_lost(m.group, down_at - MIN_LOSS_WINDOW_S - 0.5, down_at - 0.5, f.expected[0])]
    if scraping_at is not None:
        outside.append(env.samples_lost(m.group, scraping_at + 0.5, after_end, f.expected[0]))
    result.details["samples_lost_over_restart"] = result.details["samples"]["lost_total"]
    result.details["samples_outside_restart"] = outside
    result.details["scraping_resumed_s_after_restart"] = (round(scraping_at - up_at, 1)
                                                          if scraping_at is not None else None)
    result.source_samples_lost = (sum(o["lost_total"] for o in outside) if scraping_at is not None else None)
    result.details["scrape_gap_s"] = max((g["gap_s"] for g in gaps), default=0.0)
    result.details["missing_per_series_from_gaps"] = max((sum(g["missing"] for g in gaps if g["instance"] == i)
                                                          for i in {g["instance"] for g in gaps}), default=0)
    return result


FAULTS: list[tuple[int, Callable[[FaultEnv], FaultResult]]] = [
    (1, fault_target_down_warmup),
    (2, fault_target_down_parity),
    (3, fault_429_storm_latency),
    (4, fault_reload_rejected),
    (5, fault_kill_deploy),
    (6, fault_kill_rollback),
    (7, fault_restart_scheduler),
    (8, fault_restart_triggerer),
    (9, fault_audit_unreachable),
    (10, fault_approval_timeout),
    (11, fault_self_approval),
    (12, fault_two_runs_one_group),
    (13, fault_two_groups_cut_over),
    (14, fault_source_restart),
]


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "child":
    child_main(sys.argv[2:])
