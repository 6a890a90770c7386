"""An audit history the board can show, written the way ``GroupMigration.record`` writes it.

Each step appends through ``AuditStore.append`` with the stage it leaves (replayed from the log)
and the stage it enters, so the stage machine checks every move. Evidence is built by the real
core types (``WindowLatency``, ``Measurement``, ``decide``, ``project_monthly_cost``) with numbers
from a demo run on the local stack (12 nodes), so the board reads the same shapes a run writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.settings import amp_prices
from promshift.core.catalog import Catalog, MetricGroup
from promshift.core.cost import QueryCost, project_monthly_cost
from promshift.core.evidence import evidence_sha256
from promshift.core.gate import decide
from promshift.core.latency import WindowLatency
from promshift.core.render import remote_write_name
from promshift.core.stages import Stage
from promshift.core.verdicts import Measurement, Verdict

SOURCE = "http://127.0.0.1:19090"
TARGET = "http://127.0.0.1:19091"


class Recorder:
    """Append a run's events like ``GroupMigration.record``: the stage move is checked by the store's replay."""

    def __init__(self, audit: AuditStore, group: MetricGroup, run_id: str, start: datetime) -> None:
        self.audit, self.group, self.run_id, self.now = audit, group, run_id, start

    def record(self, kind: str, evidence: Mapping[str, Any], *, to: Stage | None = None, actor: str = "promshift",
               after_s: float = 20.0) -> None:
        self.now += timedelta(seconds=after_s)
        current = self.audit.stage_of(self.group.name) if to else None
        self.audit.append(group=self.group.name, run_id=self.run_id, kind=kind, actor=actor, at=self.now,
                          evidence=evidence, stage_from=current, stage_to=to)


def windows(group: MetricGroup, *, slow_target: bool = False) -> list[dict[str, Any]]:
    out = []
    for i, w in enumerate(group.latency.windows):
        src = 0.012 * (i + 1) ** 1.5
        tgt = (w.slo_p95_s * 1.6) if slow_target and i == len(group.latency.windows) - 1 else 0.004 * (i + 1)
        verdict = Verdict.FAILED if tgt > w.slo_p95_s else Verdict.SUCCESSFUL
        out.append(WindowLatency(window=w.name, source_p50_s=src, source_p95_s=src * 1.3, target_p50_s=tgt,
                                 target_p95_s=tgt * 1.2, source_failures=0, target_failures=0,
                                 slo_p95_s=w.slo_p95_s, verdict=verdict,
                                 outcome="within SLO" if verdict == Verdict.SUCCESSFUL else
                                 f"target p95 {tgt * 1.2:.3f}s over the {w.slo_p95_s:g}s SLO").to_dict())
    return out


def cost(group: MetricGroup, series: int) -> dict[str, Any]:
    policy = group.latency
    longest = max(policy.windows, key=lambda w: w.seconds)
    query = (policy.queries or (f"count({group.selector()})",))[0]
    projection = project_monthly_cost(
        active_series=series, scrape_interval_s=15.0, retention_days=policy.retention_s / 86_400,
        queries=[QueryCost(query=query, window_s=longest.seconds, samples_processed=series * 240, measured=True)],
        dashboard_refresh_s=policy.dashboard_refresh_s, dashboard_viewers=policy.dashboard_viewers,
        prices=amp_prices())
    return {**projection.to_dict(), "active_series": series, "scrape_interval_s": 15.0, "window": longest.name,
            "dashboard_refresh_s": policy.dashboard_refresh_s, "dashboard_viewers": policy.dashboard_viewers}


def parity(*, drift: bool = False) -> dict[str, Any]:
    host_cov = (Measurement("host_coverage", Verdict.FAILED, "2 of 12 hosts missing on the target: gpu-node-0001, "
                            "gpu-node-0002", ("count by (Hostname) (...)",),
                            {"short_keys": ["gpu-node-0001", "gpu-node-0002"]})
                if drift else Measurement("host_coverage", Verdict.SUCCESSFUL, "12/12 hosts on both sides"))
    layers = [Measurement("coverage", Verdict.SUCCESSFUL, "every metric of the group on both sides"), host_cov,
              Measurement("aggregates", Verdict.SUCCESSFUL, "sum/count per metric equal within 1e-09"),
              Measurement("labels", Verdict.SUCCESSFUL, "label sets equal after normalization"),
              Measurement("samples", Verdict.SUCCESSFUL, "3840 points on 4 sampled hosts equal within 1e-09")]
    verdict = Verdict.FAILED if drift else Verdict.SUCCESSFUL
    return {"verdict": verdict.value, "series_compared": 96, "points_compared": 3840, "mismatches": 0,
            "missing_series": 16 if drift else 0, "hosts_sampled": ["gpu-node-0003", "gpu-node-0007",
                                                                     "gpu-node-0009", "gpu-node-0011"],
            "shards": 2, "measurements": [m.to_dict() for m in layers]}


def migrate(audit: AuditStore, group: MetricGroup, run_id: str, start: datetime, *, until: str) -> None:
    """One run: ``until`` is ``approval`` (gate passed, waiting), ``cut_over`` or ``rolled_back`` (parity drift)."""
    rec = Recorder(audit, group, run_id, start)
    series = 96
    rec.record("validated", {"stage": audit.stage_of(group.name).value, "selector": group.selector(),
                             "source_series": series, "source": SOURCE, "target": TARGET})
    snap = {"snapshot_path": f"/var/lib/promshift/snapshots/{group.name}/{run_id}.yml",
            "config_path": "/etc/prometheus/prometheus.yml", "sha256": "a1" * 32, "bytes": 1834}
    rec.record("snapshot_taken", snap)
    rec.record("dual_write_deployed", {
        "remote_write": remote_write_name(group.name), "keep_regex": group.name_regex(),
        "url": f"{TARGET}/api/v1/write", "config_before_sha256": "a1" * 32, "config_after_sha256": "b2" * 32,
        "live_remote_writes": [remote_write_name(group.name)], "dual_write_since": rec.now.timestamp()},
        to=Stage.DUAL_WRITING)
    rec.record("warmup_started", {"policy": {"duration_s": group.warmup.duration_s}}, to=Stage.WARMING)
    rec.record("warmup_ready", {"status": "ready", "reason": f"target holds {series}/{series} series, lag 1.0s",
                                "observation": {"source_series": series, "target_series": series, "lag_s": 1.0}},
               after_s=group.warmup.duration_s)
    drift = until == "rolled_back"
    par = parity(drift=drift)
    wins = windows(group)
    lat = {"verdict": "SUCCESSFUL", "windows": wins, "retries": 0, "max_concurrency": 1,
           "accept_encoding": "identity", "retention_s": {"source": 2 * 86400.0, "target": 15 * 86400.0},
           "measurement": Measurement("latency", Verdict.SUCCESSFUL,
                                      f"all {len(wins)} windows within SLO").to_dict(),
           "cost": cost(group, series)}
    gate = decide({"parity": Verdict(par["verdict"]), "latency": Verdict(lat["verdict"])})
    evidence = {"gate": gate.to_dict(), "parity": par, "latency": lat}
    if drift:
        rec.record("gate_failed", evidence, after_s=40)
        rec.record("rolled_back", {"performed": True, "restored_identical": True, "config_sha256": "a1" * 32,
                                   "reason": "parity FAILED (host_coverage: 2 of 12 hosts missing on the target)",
                                   "remote_write_still_live": False}, to=Stage.ROLLED_BACK)
        return
    rec.record("gate_passed", evidence, to=Stage.VERIFIED, after_s=40)
    # As MigrationApprovalOperator records it: who was asked (the group's users, or its team as resolved then,
    # without the run's trigger user) and the hash of what they were shown.
    rec.record("evidence_shown", {"evidence_sha256": evidence_sha256(evidence),
                                  "approvers": ["oncall-alice", "oncall-bob"]})
    if until == "approval":
        return
    rec.record("approved", {"decision": "Approve", "by": "oncall-alice",
                            "comment": "parity and latency evidence reviewed"}, to=Stage.APPROVED,
               actor="oncall-alice", after_s=300)
    rec.record("cut_over", {"routing": {"read_from": "target", "url": TARGET}, "manifest": "routing.json"},
               to=Stage.CUT_OVER)
    rec.record("run_complete", {"routing": {"read_from": "target", "url": TARGET},
                                "next": "bake, then decommission the group on the source (a later run)"})


def write_history(audit: AuditStore, catalog: Catalog, start: datetime, run_ids: Mapping[str, str]) -> None:
    """gpu-utilization cut over; gpu-power-thermal rolled back (drift); gpu-memory waiting for approval.

    ``run_ids`` maps those group names to DAG run ids (so a test can create the same runs in Airflow).
    """
    migrate(audit, catalog.get("gpu-utilization"), run_ids["gpu-utilization"], start, until="cut_over")
    migrate(audit, catalog.get("gpu-power-thermal"), run_ids["gpu-power-thermal"], start + timedelta(hours=1),
            until="rolled_back")
    migrate(audit, catalog.get("gpu-memory"), run_ids["gpu-memory"], start + timedelta(hours=2), until="approval")
