"""The steps of one metric group's migration, as plain Python around the pure core.

Airflow operators call these; tests can too, without Airflow. Every step that changes
something records an audit event with its evidence.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.deploy import ConfigSnapshot, FileConfigDeployer
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.adapters.routing import RoutingManifest
from promshift.core.catalog import MetricGroup
from promshift.core.gate import GateAction, GateVerdict, decide
from promshift.core.parity import (
    SampleComparison,
    comparison_window,
    coverage_measurement,
    normalize_labels,
    sample_hosts,
)
from promshift.core.render import add_remote_write, remote_write_entry, remote_write_name, sha256_text
from promshift.core.stages import STARTABLE, TRANSITIONS, Stage, transition
from promshift.core.verdicts import Measurement, Verdict, worst
from promshift.core.warmup import WarmupObservation, parse_remote_write_lag

log = logging.getLogger(__name__)


class GroupNotStartable(RuntimeError):
    """The group is already past the point where a new run can start (cut over, say)."""


@dataclass(frozen=True)
class Backends:
    """Where the group's data lives: the self-hosted source and the AMP(-like) target."""

    source: PrometheusClient
    target: PrometheusClient
    source_config_path: str
    target_remote_write_url: str
    promtool: str = "promtool"


def _promql_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def observe_warmup(*, group_name: str, selector: str, source: PrometheusClient, target: PrometheusClient,
                   elapsed_s: float) -> WarmupObservation:
    """Poll both sides once: series counts of the group and the group's remote-write queue lag."""
    count = f"count({selector})"
    src = source.scalar(count) or 0.0
    tgt = target.scalar(count) or 0.0
    lag, failed = parse_remote_write_lag(source.metrics_text(), remote_write_name(group_name))
    return WarmupObservation(elapsed_s=elapsed_s, source_series=int(src), target_series=int(tgt),
                             lag_s=lag, failed_samples=failed)


class GroupMigration:
    """One DAG run's work on one metric group."""

    def __init__(self, group: MetricGroup, backends: Backends, *, audit: AuditStore, routing: RoutingManifest,
                 snapshots_dir: str | Path, run_id: str, actor: str = "promshift") -> None:
        self.group = group
        self.backends = backends
        self.audit = audit
        self.routing = routing
        self.snapshots_dir = Path(snapshots_dir)
        self.run_id = run_id
        self.actor = actor

    # -- helpers -------------------------------------------------------------------------
    @property
    def deployer(self) -> FileConfigDeployer:
        return FileConfigDeployer(self.backends.source_config_path, self.backends.source,
                                  promtool=self.backends.promtool)

    def stage(self) -> Stage:
        return self.audit.stage_of(self.group.name)

    def record(self, kind: str, now: datetime, evidence: Mapping[str, Any], *, to: Stage | None = None,
               actor: str | None = None) -> None:
        """Append an audit event; with ``to``, also move the stage (checked by the table)."""
        current = self.stage() if to else None
        if to is not None and current is not None:
            transition(self.group.name, current, to)
        self.audit.append(group=self.group.name, run_id=self.run_id, kind=kind, actor=actor or self.actor,
                          at=now, evidence=evidence, stage_from=current, stage_to=to)

    # -- steps ---------------------------------------------------------------------------
    def validate(self, now: datetime) -> dict[str, Any]:
        """Check the group may start and both backends answer; nothing is changed yet."""
        stage = self.stage()
        if stage not in STARTABLE:
            raise GroupNotStartable(f"group {self.group.name!r} is {stage.value}; a new migration run "
                                    f"starts only from {sorted(s.value for s in STARTABLE)}")
        problems = []
        for role, client in (("source", self.backends.source), ("target", self.backends.target)):
            if not client.ready():
                problems.append(f"{role} {client.base_url} is unreachable or not ready")
        if not Path(self.backends.source_config_path).is_file():
            problems.append(f"source config {self.backends.source_config_path} does not exist")
        if problems:
            raise RuntimeError("; ".join(problems))
        series = self.backends.source.scalar(f"count({self.group.selector()})") or 0
        evidence = {"stage": stage.value, "selector": self.group.selector(), "source_series": int(series),
                    "source": self.backends.source.base_url, "target": self.backends.target.base_url}
        if series == 0:
            raise RuntimeError(f"the source has no series for {self.group.selector()}; nothing to migrate")
        self.record("validated", now, evidence)
        return evidence

    def snapshot(self, now: datetime) -> dict[str, Any]:
        """Keep the source config's exact bytes so any later failure can restore them."""
        snap = self.deployer.snapshot()
        safe_run = re.sub(r"[^A-Za-z0-9_.-]", "_", self.run_id)
        path = self.snapshots_dir / self.group.name / f"{safe_run}.yml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(snap.text)
        info = {"snapshot_path": str(path), "config_path": snap.path, "sha256": snap.sha256,
                "bytes": len(snap.text.encode())}
        self.record("snapshot_taken", now, info)
        return info

    def _load_snapshot(self, info: Mapping[str, Any]) -> ConfigSnapshot:
        text = Path(info["snapshot_path"]).read_text()
        if sha256_text(text) != info["sha256"]:
            raise RuntimeError(f"snapshot {info['snapshot_path']} does not match its recorded hash")
        return ConfigSnapshot(path=info["config_path"], text=text, sha256=info["sha256"])

    def deploy_dual_write(self, snapshot_info: Mapping[str, Any], now: datetime) -> dict[str, Any]:
        """Add the group's own remote_write entry with a keep-filter; verify it is live."""
        snap = self._load_snapshot(snapshot_info)
        entry = remote_write_entry(group_name=self.group.name, name_regex=self.group.name_regex(),
                                   url=self.backends.target_remote_write_url)
        new_text = add_remote_write(snap.text, entry)
        result = self.deployer.deploy(new_text, snapshot=snap, expect_remote_writes={entry["name"]})
        evidence = {"remote_write": entry["name"], "keep_regex": self.group.name_regex(),
                    "url": self.backends.target_remote_write_url, "config_before_sha256": result.before_sha256,
                    "config_after_sha256": result.after_sha256,
                    "live_remote_writes": list(result.live_remote_writes),
                    "dual_write_since": now.timestamp()}
        self.record("dual_write_deployed", now, evidence, to=Stage.DUAL_WRITING)
        return evidence

    def start_warmup(self, now: datetime) -> None:
        self.record("warmup_started", now, {"policy": _policy_dict(self.group.warmup)}, to=Stage.WARMING)

    def finish_warmup(self, event: Mapping[str, Any], now: datetime) -> None:
        self.record("warmup_" + str(event.get("status")), now, dict(event))

    def parity(self, *, dual_write_since: float, now: datetime) -> dict[str, Any]:
        """Coverage counts at several instants plus raw samples of a deterministic host sample."""
        policy = self.group.parity
        step = policy.step_s
        # The step is at least the scrape interval, so two steps cover the first full scrape.
        window = comparison_window(dual_write_since=dual_write_since, now=now.timestamp(),
                                   skip_recent_s=policy.skip_recent_s, step=step, settle_s=2 * step)
        if window is None:
            m = Measurement("window", Verdict.INCONCLUSIVE,
                            f"dual-write too short: nothing older than {policy.skip_recent_s:.0f}s since "
                            f"{datetime.fromtimestamp(dual_write_since).isoformat()}")
            return _parity_result([m], None, [])
        start, end = window
        measurements: list[Measurement] = []
        try:
            measurements.extend(self._coverage(start, end))
        except PrometheusError as exc:
            measurements.append(Measurement("coverage", Verdict.ERROR, str(exc)))
        hosts: list[str] = []
        try:
            sample, hosts = self._samples(start, end, step)
            measurements.append(sample)
        except PrometheusError as exc:
            measurements.append(Measurement("samples", Verdict.ERROR, str(exc)))
        return _parity_result(measurements, (start, end, step), hosts)

    def _coverage(self, start: float, end: float) -> list[Measurement]:
        """Series counts per metric and per host at the window's start, middle and end (PromQL counts)."""
        instants = sorted({start, (start + end) / 2, end})
        out = []
        for by, key, name in (("__name__", "metric", "coverage"),
                              (self.group.host_label, "host", "host_coverage")):
            expr = f"count by ({by}) ({self.group.selector()})"
            counts = []
            for t in instants:
                sides = [{s.labels.get(by, ""): s.points[0][1] for s in client.query(expr, at=t).series}
                         for client in (self.backends.source, self.backends.target)]
                counts.append((t, sides[0], sides[1]))
            out.append(coverage_measurement(counts, max_missing_ratio=self.group.parity.max_missing_series_ratio,
                                            queries=[expr], name=name, key=key))
        return out

    def _samples(self, start: float, end: float, step: float) -> tuple[Measurement, list[str]]:
        policy = self.group.parity
        host_label = self.group.host_label
        hosts_expr = f"count by ({host_label}) ({self.group.selector()})"
        all_hosts = [s.labels.get(host_label, "") for s in self.backends.source.query(hosts_expr, at=end).series]
        seed = policy.seed or f"{self.group.name}:{start:.0f}:{end:.0f}"
        chosen = sample_hosts((h for h in all_hosts if h), policy.sample_hosts, seed)
        rename = dict(policy.rename_labels)
        comparison = SampleComparison(abs_tol=policy.abs_tolerance, rel_tol=policy.rel_tolerance)
        queries = [hosts_expr]
        regex = self.group.name_regex()
        for host in chosen:
            expr = f"{{__name__=~{_promql_string(regex)}, {host_label}={_promql_string(host)}}}"
            queries.append(expr)
            sides = []
            for client in (self.backends.source, self.backends.target):
                res = client.query_range(expr, start=start, end=end, step=step)
                sides.append({normalize_labels(s.labels, ignore=policy.ignore_labels, rename=rename): s.points
                              for s in res.series})
            comparison.add(sides[0], sides[1])
            log.info("parity %s: host %s compared (%s series, %s points so far)", self.group.name, host,
                     comparison.series_compared, comparison.points_compared)
        m = comparison.measurement(queries)
        m.numbers["hosts_sampled"] = chosen
        m.numbers["hosts_total"] = len(all_hosts)
        return m, chosen

    def latency(self, now: datetime, *, dual_write_since: float | None = None) -> dict[str, Any]:
        """Each window's golden queries on both backends (see LatencyProbe)."""
        from promshift.adapters.latency_probe import LatencyProbe

        probe = LatencyProbe(self.backends.source, self.backends.target, self.group.latency,
                             min_step_s=self.group.parity.step_s)
        queries = list(self.group.latency.queries) or [f"count({self.group.selector()})"]
        return probe.run(now=now.timestamp(), queries=queries, dual_write_since=dual_write_since)

    def gate(self, parity: Mapping[str, Any], latency: Mapping[str, Any], now: datetime) -> GateVerdict:
        verdict = decide({"parity": Verdict(parity["verdict"]), "latency": Verdict(latency["verdict"])})
        evidence = {"gate": verdict.to_dict(), "parity": parity, "latency": {
            k: v for k, v in latency.items() if k != "runs"}}
        if verdict.verdict == Verdict.SUCCESSFUL:
            self.record("gate_passed", now, evidence, to=Stage.VERIFIED)
        elif verdict.action == GateAction.ASK_APPROVAL:
            self.record("gate_inconclusive", now, evidence)
        else:
            self.record("gate_failed", now, evidence)
        return verdict

    def record_approval(self, *, decision: str, by: str, comment: str, now: datetime) -> None:
        evidence = {"decision": decision, "by": by, "comment": comment}
        if decision == "Approve":
            self.record("approved", now, evidence, to=Stage.APPROVED, actor=by)
        else:
            self.record("approval_" + decision.lower(), now, evidence, actor=by)

    def cutover(self, now: datetime) -> dict[str, Any]:
        """Route the group's reads to the target in the routing manifest."""
        route = self.routing.route(self.group.name, read_from="target", url=self.backends.target.base_url,
                                   at=now, run_id=self.run_id)
        evidence = {"routing": route, "manifest": str(self.routing.path)}
        self.record("cut_over", now, evidence, to=Stage.CUT_OVER)
        return evidence

    def complete(self, now: datetime) -> dict[str, Any]:
        """Close a successful run: the group reads from the target and keeps dual-writing."""
        evidence = {"routing": self.routing.load()["groups"].get(self.group.name),
                    "next": "bake, then decommission the group on the source (a later run)"}
        self.record("run_complete", now, evidence)
        return evidence

    def failure_reason(self) -> str:
        """Why this run is rolling back, in plain words, from the run's own audit events."""
        for ev in reversed(self.audit.events(group=self.group.name, run_id=self.run_id)):
            data = ev.evidence_data
            if ev.kind == "gate_failed":
                parts = [f"{check} {m['verdict']} ({m['name']}: {m['reason']})"
                         for check in ("parity", "latency") for m in _measurements(data.get(check))
                         if m["verdict"] != Verdict.SUCCESSFUL.value]
                return "; ".join(parts) or data["gate"]["reason"]
            if ev.kind.startswith("approval_"):
                return (f"approval {data['decision']} by {data['by']}"
                        + (f": {data['comment']}" if data.get("comment") else ""))
            if ev.kind in ("warmup_timeout", "warmup_error"):
                return f"warm-up {data.get('status')}: {data.get('reason')}"
        return "a step failed before the gate; see that task's log"

    def rollback(self, snapshot_info: Mapping[str, Any] | None, *, reason: str, now: datetime) -> dict[str, Any]:
        """Restore the snapshot byte for byte, reload, route reads back to the source."""
        if not snapshot_info:
            evidence = {"performed": False, "restored_identical": None, "reason": reason,
                        "detail": "no snapshot was taken, so nothing was deployed"}
            self.record("rollback_not_needed", now, evidence)
            return evidence
        snap = self._load_snapshot(snapshot_info)
        identical = self.deployer.restore(snap)
        live = self.backends.source.config_text()
        still_live = remote_write_name(self.group.name) in live
        if self.routing.read_from(self.group.name) != "source":
            self.routing.route(self.group.name, read_from="source", url=self.backends.source.base_url,
                               at=now, run_id=self.run_id)
        evidence = {"performed": True, "restored_identical": identical and not still_live,
                    "config_sha256": snap.sha256, "reason": reason,
                    "remote_write_still_live": still_live}
        stage = self.stage()
        to = Stage.ROLLED_BACK if Stage.ROLLED_BACK in TRANSITIONS[stage] else None
        self.record("rolled_back", now, evidence, to=to)
        return evidence


def _measurements(check: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    if not check:
        return []
    if "measurements" in check:
        return list(check["measurements"])
    return [check["measurement"]] if "measurement" in check else []


def _policy_dict(policy: Any) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in policy.__dict__.items()}


def _parity_result(measurements: list[Measurement], window: tuple[float, float, float] | None,
                   hosts: list[str]) -> dict[str, Any]:
    samples = next((m for m in measurements if m.name == "samples"), None)
    nums = samples.numbers if samples else {}
    return {
        "verdict": worst(m.verdict for m in measurements).value,
        "window": {"start": window[0], "end": window[1], "step": window[2]} if window else None,
        "hosts_sampled": hosts,
        "series_compared": nums.get("series_compared", 0),
        "points_compared": nums.get("points_compared", 0),
        "mismatches": nums.get("mismatches", 0),
        "missing_series": nums.get("missing_series", 0),
        "missing_points": nums.get("missing_points", 0),
        "extra_series": nums.get("extra_series", 0),
        "measurements": [m.to_dict() for m in measurements],
    }
