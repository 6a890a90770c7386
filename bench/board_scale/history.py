"""A year of audit events for a large catalog, written through the audit store's real schema and hash chain.

Every event is built by ``core.audit.new_event`` (HMAC-keyed, linked to the one before it) and inserted into
``promshift_audit_events`` in batches; the last head is anchored once, so ``AuditStore.verify`` checks the whole
chain exactly as it checks one a deployment wrote event by event. Evidence has the shapes a run writes (the same
builders as tests/board/history.py: ``WindowLatency``, ``Measurement``, ``decide``, ``project_monthly_cost``).

What a year holds per group (deterministic per group index, so sizes repeat from run to run):

- 90 % of groups start a migration run some day of the year; 12 % of those fail the gate once (parity drift),
  roll back and run again a week later; 5 % stop at the gate, waiting for approval;
- a cut-over group is baked: ``bake_started``, a ``bake_check`` every ``bake_interval`` for ``bake_period``
  (each from its own ``promshift__bake_watch`` run), ``baked``; 8 % fail one check half-way, their reads go back
  to the source, are cut over again the next day and bake again from the start;
- 70 % of baked groups are decommissioned a fortnight later (second approval, ``decommissioned``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Engine

from promshift.adapters.audit_store import audit_events, event_row
from promshift.core.audit import AnchorPoint, AuditAnchor, AuditEvent, new_event
from promshift.core.catalog import Catalog, MetricGroup
from promshift.core.gate import decide
from promshift.core.render import remote_write_name
from promshift.core.verdicts import Verdict
from tests.board.history import SOURCE, TARGET, cost, parity, windows


@dataclass(frozen=True)
class Shape:
    """How busy the year is."""

    days: int = 365
    bake_interval_s: float = 900.0  # BakePolicy's default
    bake_period_s: float = 86_400.0  # BakePolicy's default


@dataclass(frozen=True)
class Planned:
    at: datetime
    group: str
    run_id: str
    kind: str
    stage_from: str | None
    stage_to: str | None
    actor: str
    evidence: dict[str, Any]


class _Group:
    """Events of one group, with its stage tracked so every move is one the stage machine allows."""

    def __init__(self, group: MetricGroup, out: list[Planned]) -> None:
        self.group, self.out, self.stage = group, out, "planned"

    def add(self, at: datetime, run_id: str, kind: str, evidence: dict[str, Any], *, to: str | None = None,
            actor: str = "promshift") -> None:
        self.out.append(Planned(at, self.group.name, run_id, kind, self.stage if to else None, to, actor, evidence))
        if to:
            self.stage = to


def _bake_check(at: datetime, *, failed: bool) -> dict[str, Any]:
    verdict = "FAILED" if failed else "SUCCESSFUL"
    measurements = [
        {"name": "freshness", "verdict": "SUCCESSFUL", "reason": "newest sample 14s old (limit 300s)", "value": 14.0},
        {"name": "lag", "verdict": "SUCCESSFUL", "reason": "remote-write lag 1.2s (limit 120s)", "value": 1.2},
        {"name": "series", "verdict": verdict, "reason": "target 96/96 series" if not failed else
         "target 80/96 series (tolerance 1%)", "value": 96.0 if not failed else 80.0},
        {"name": "parity", "verdict": "SUCCESSFUL", "reason": "600 points equal within 1e-09", "value": 0.0},
    ]
    return {"verdict": verdict, "reason": "every bake check passed" if not failed else
            "series FAILED: target 80/96 series (tolerance 1%)", "measurements": measurements,
            "observation": {"at": at.timestamp(), "age": 14.0, "lag": 1.2, "source_series": 96,
                            "target_series": 96 if not failed else 80, "parity": "SUCCESSFUL", "errors": {}}}


def _migration_run(g: _Group, run_id: str, at: datetime, *, drift: bool, stop_at_gate: bool,
                   gate_cost: dict[str, Any]) -> datetime:
    group = g.group
    step = timedelta(seconds=20)
    g.add(at, run_id, "validated", {"stage": g.stage, "selector": group.selector(), "source_series": 96,
                                    "source": SOURCE, "target": TARGET})
    at += step
    g.add(at, run_id, "snapshot_taken", {"snapshot_path": f"/var/lib/promshift/snapshots/{group.name}/{run_id}.yml",
                                         "config_path": "/etc/prometheus/prometheus.yml", "sha256": "a1" * 32,
                                         "bytes": 1834})
    at += step
    g.add(at, run_id, "dual_write_deployed", {
        "remote_write": remote_write_name(group.name), "keep_regex": group.name_regex(),
        "url": f"{TARGET}/api/v1/write", "config_before_sha256": "a1" * 32, "config_after_sha256": "b2" * 32,
        "live_remote_writes": [remote_write_name(group.name)], "dual_write_since": at.timestamp()}, to="dual_writing")
    at += step
    g.add(at, run_id, "warmup_started", {"policy": {"duration_s": group.warmup.duration_s}}, to="warming")
    at += timedelta(seconds=group.warmup.duration_s)
    g.add(at, run_id, "warmup_ready", {"status": "ready", "reason": "target holds 96/96 series, lag 1.0s",
                                       "observation": {"source_series": 96, "target_series": 96, "lag_s": 1.0}})
    par = parity(drift=drift)
    wins = windows(group)
    lat = {"verdict": "SUCCESSFUL", "windows": wins, "retries": 0, "max_concurrency": 1,
           "accept_encoding": "identity", "retention_s": {"source": 2 * 86400.0, "target": 15 * 86400.0},
           "measurement": {"name": "latency", "layer": "latency", "verdict": "SUCCESSFUL",
                           "reason": f"all {len(wins)} windows within SLO", "queries": [], "numbers": {}},
           "cost": gate_cost}
    gate = decide({"parity": Verdict(par["verdict"]), "latency": Verdict(lat["verdict"])})
    evidence = {"gate": gate.to_dict(), "parity": par, "latency": lat}
    at += timedelta(seconds=40)
    if drift:
        g.add(at, run_id, "gate_failed", evidence)
        at += step
        g.add(at, run_id, "rolled_back", {"performed": True, "restored_identical": True, "config_sha256": "a1" * 32,
                                          "reason": "parity FAILED (host_coverage: 2 of 12 hosts missing on the "
                                                    "target)", "remote_write_still_live": False}, to="rolled_back")
        at += step
        g.add(at, run_id, "notified", {"notice": "rolled_back", "channel": "smtp", "to": ["gpu-platform@example"]})
        return at
    g.add(at, run_id, "gate_passed", evidence, to="verified")
    at += step
    g.add(at, run_id, "evidence_shown", {"evidence_sha256": "c3" * 32, "task": "approval"})
    at += step
    g.add(at, run_id, "notified", {"notice": "approval_needed", "channel": "smtp", "to": ["gpu-platform@example"]})
    if stop_at_gate:
        return at
    at += timedelta(minutes=25)
    g.add(at, run_id, "approved", {"decision": "Approve", "by": "oncall-alice",
                                   "comment": "parity and latency evidence reviewed"}, to="approved",
          actor="oncall-alice")
    at += step
    g.add(at, run_id, "cut_over", {"routing": {"read_from": "target", "url": TARGET}, "manifest": "routing.json"},
          to="cut_over")
    at += step
    g.add(at, run_id, "run_complete", {"routing": {"read_from": "target", "url": TARGET},
                                       "next": "bake, then decommission the group on the source (a later run)"})
    at += step
    g.add(at, run_id, "report_published", {"url": f"s3://promshift-reports/{group.name}/{run_id}/",
                                           "files": {"report.json": "d4" * 32, "report.md": "e5" * 32}})
    return at


def _bake(g: _Group, at: datetime, shape: Shape, *, fail_after: int | None) -> tuple[datetime, bool]:
    """Checks from the bake watch's runs until baked (True) or a failed check returned the reads (False)."""
    checks = int(shape.bake_period_s // shape.bake_interval_s) + 1
    interval = timedelta(seconds=shape.bake_interval_s)
    # The bake watch's runs start on its schedule: round up to the next interval.
    at = datetime.fromtimestamp((at.timestamp() // shape.bake_interval_s + 1) * shape.bake_interval_s, tz=at.tzinfo)
    for i in range(checks):
        run_id = f"scheduled__{at.strftime('%Y-%m-%dT%H:%M:%S')}+00:00"
        if i == 0:
            g.add(at, run_id, "bake_started", {"policy": {"interval_s": shape.bake_interval_s,
                                                         "period_s": shape.bake_period_s}}, to="baking")
        failed = fail_after is not None and i == fail_after
        g.add(at + timedelta(seconds=2), run_id, "bake_check", _bake_check(at, failed=failed))
        if failed:
            g.add(at + timedelta(seconds=4), run_id, "reads_rolled_back", {
                "reason": "bake check FAILED: series FAILED: target 80/96 series (tolerance 1%)",
                "restored": {"routing": {"read_from": "source", "url": SOURCE}}, "dual_write": "kept on"},
                to="rolled_back_reads")
            return at + timedelta(seconds=4), False
        if i == checks - 1:
            g.add(at + timedelta(seconds=4), run_id, "baked", {"checks": checks, "clean_since": at.timestamp(),
                                                               "period_s": shape.bake_period_s}, to="baked")
        at += interval
    return at, True


def plan_year(catalog: Catalog, start: datetime, shape: Shape, *, seed: int = 27) -> list[Planned]:
    """Every event of the year, oldest first."""
    out: list[Planned] = []
    end = start + timedelta(days=shape.days)
    for index, group in enumerate(catalog.groups):
        rnd = random.Random(seed * 1_000_003 + index)
        if rnd.random() >= 0.9:
            continue  # still planned
        g = _Group(group, out)
        gate_cost = cost(group, 96)
        # Leave room for the bake and decommission inside the year.
        at = start + timedelta(days=rnd.uniform(0, max(1.0, shape.days - 40)), seconds=rnd.randrange(3600))
        run = 1
        if rnd.random() < 0.12:
            at = _migration_run(g, f"manual__{group.name}-{run}", at, drift=True, stop_at_gate=False,
                                gate_cost=gate_cost)
            at += timedelta(days=7)
            run += 1
        waiting = rnd.random() < 0.05
        at = _migration_run(g, f"manual__{group.name}-{run}", at, drift=False, stop_at_gate=waiting,
                            gate_cost=gate_cost)
        if waiting:
            continue
        fails = rnd.random() < 0.08
        at, baked = _bake(g, at, shape, fail_after=int(shape.bake_period_s // shape.bake_interval_s) // 2
                          if fails else None)
        if not baked:
            at += timedelta(days=1)
            g.add(at, f"manual__{group.name}-recut", "cut_over", {"routing": {"read_from": "target", "url": TARGET},
                                                                  "manifest": "routing.json"}, to="cut_over")
            at, baked = _bake(g, at, shape, fail_after=None)
        if rnd.random() < 0.7:
            at += timedelta(days=14)
            dec = f"manual__{group.name}-decommission"
            g.add(at, dec, "decommission_approved", {"decision": "Approve", "by": "oncall-bob",
                                                     "comment": "baked for a fortnight"}, actor="oncall-bob")
            g.add(at + timedelta(seconds=30), dec, "decommissioned", {
                "remote_write": remote_write_name(group.name), "dropped_regex": group.name_regex(),
                "config_before_sha256": "b2" * 32, "config_after_sha256": "f6" * 32}, to="decommissioned")
    out = [p for p in out if p.at < end]
    out.sort(key=lambda p: p.at)  # stable: a group's own events keep their order
    return out


def chained(planned: list[Planned], key: bytes) -> Iterator[AuditEvent]:
    prev: AuditEvent | None = None
    for p in planned:
        prev = new_event(prev=prev, group=p.group, run_id=p.run_id, kind=p.kind, stage_from=p.stage_from,
                         stage_to=p.stage_to, actor=p.actor, at=p.at, evidence=p.evidence, key=key)
        yield prev


def write_year(engine: Engine, anchor: AuditAnchor, planned: list[Planned], key: bytes, *,
               batch: int = 5000) -> AnchorPoint | None:
    """Insert the chain in batches (one transaction each) and anchor its head; the table must be empty."""
    rows: list[dict[str, Any]] = []
    last: AuditEvent | None = None
    with engine.begin() as conn:
        for ev in chained(planned, key):
            rows.append(event_row(ev))
            last = ev
            if len(rows) >= batch:
                conn.execute(audit_events.insert(), rows)
                rows = []
        if rows:
            conn.execute(audit_events.insert(), rows)
    if last is None:
        return None
    anchor.record(last.seq, last.hash)
    return AnchorPoint(last.seq, last.hash)
