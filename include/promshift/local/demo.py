"""``make demo``: migrate one metric group on the local stack through Airflow, then report.

Scenario ``happy``: dual-write, warm-up, parity, latency, approval by an on-call engineer
over Airflow's REST API, cutover. Scenario ``drift``: during dual-write the target loses some
hosts' series (deleted on the target server), parity fails and the run rolls back.

``--target amp``: the target is an AMP workspace of the local AWS (moto control plane, SigV4-checking
front door, vmagent signing relay; ``python -m promshift.local stack up --target amp``). Airflow's ``amp``
connection names the workspace and carries no credentials: Airflow gets the pair through
``AWS_*`` environment variables only. Scenario ``bad-credentials`` (AMP only): Airflow signs
with a secret the local AWS does not accept, so the run must stop at ``validate`` with nothing
deployed and the source config byte-identical (its sha256 is printed before and after).

``--history 24h``: before the servers start, source and target are given 24 h of the group's
history (backfilled with promtool, as if dual-write had been running), and the catalog profile
``demo-history`` times the production latency windows (1h/6h/12h/24h) instead of ``demo``'s
seconds-long ones.

``--deploy scraper`` (AMP only): AMP's managed collector writes the group (the local scraper API's
collector) instead of a ``remote_write`` entry in the source's config. ``--deploy k8s-cr`` (AMP only):
the source is run as if by prometheus-operator on Kubernetes: the stack's ``k8s`` component (a
Kubernetes API contract server, not a cluster) holds the ``Prometheus`` resource ``monitoring/k8s`` and
renders its ``spec.remoteWrite`` onto the source; Airflow's source connection says ``extra.deploy:
k8s-cr`` with a kubeconfig, so the group's entry is added to and removed from the resource through
``KubernetesHook``, never by editing the file.

``--executor celery``: Airflow runs as separate processes (api-server, scheduler, dag-processor,
triggerer) with two Celery workers, each with a ``PROMSHIFT_HOME`` of its own, on the machine's Redis
(broker) and PostgreSQL (Airflow's metadata, the audit log, its anchor); snapshots and reports go to
one shared ``file://`` store (``s3://`` in production). ``report.json``'s ``executor`` block says which
worker ran each task; the mapped parity shards must have run on both.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from promshift.adapters.audit_anchor import anchor_for
from promshift.adapters.audit_store import AuditStore
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.settings import (
    LAB_CLOCK_AHEAD_VAR,
    REPO_ROOT,
    audit_key,
    lab_bake_watch_clock_ahead_s,
    load_catalog,
    local_audit_key_env,
)
from promshift.board import URL_PREFIX as BOARD_PREFIX
from promshift.core.catalog import MetricGroup
from promshift.core.cost import CostEvidence
from promshift.core.deploy_kinds import DEPLOY_KINDS, GIT, K8S_CR, REMOTE_WRITE, SCRAPER
from promshift.core.durations import format_duration, parse_duration
from promshift.core.executor_report import EXECUTOR_KINDS, executor_block, executor_line
from promshift.core.latency import WindowLatency
from promshift.core.move_evidence import MovedEvidence
from promshift.core.parity import ParityResult
from promshift.core.render import sha256_bytes
from promshift.core.report import (
    build_report,
    cost_table,
    latency_table,
    parity_log_table,
    source_config_line,
    target_line,
)
from promshift.core.stages import Stage
from promshift.local.airflow_lab import APPROVER_USERS, TRIGGER_USER, LocalAirflow
from promshift.local.celery_lab import DB_ROLES, CeleryServices, ServiceUnavailable, database_name
from promshift.local.demo_lifecycle import (
    ALERT_FAULT_GPUS,
    LAB_CLOCK_AHEAD,
    LIFECYCLE_GROUP,
    LIFECYCLE_SCENARIOS,
    MOVED_ALERT,
    follow_lifecycle,
    grafana_connection,
    horizon_at_cut_over,
    lifecycle_choices,
    plant_horizon_reads,
)
from promshift.local.self_scrape import keep_scraped, self_metrics_line, self_metrics_report
from promshift.local.stack.backfill import backfill_stack, check_history, fleet_metrics
from promshift.local.stack.local import AIRFLOW, AWS, FRONTDOOR, SOURCE_RETENTION, TARGET_KINDS, LocalStack, StackConfig
from promshift.local.stack.sigv4 import make_up_credentials
from promshift.orchestration.report_store import render_report_files

log = logging.getLogger("promshift.local.demo")

DEMO_PROFILE = "demo"
DEFAULT_GROUP = "gpu-utilization"
HISTORY_PROFILE = "demo-history"  # production latency windows, for a stack given hours of history
# `demo` with a one-minute warm-up and shorter latency windows: the end-to-end sessions' runs (--profile).
QUICK_PROFILE = "demo-quick"
SCENARIOS = ("happy", "drift", "bad-credentials", *LIFECYCLE_SCENARIOS)
AMP_ONLY_SCENARIOS = ("bad-credentials",)
DEFAULT_TIMEOUT_S = 540.0
# `airflow standalone` starts in ~1-2 min on 2 free cores; measured over 4 min while other jobs loaded them.
AIRFLOW_START_TIMEOUT_S = 420.0
APPROVAL_AFTER_POLLS = 3  # Airflow is polled every 3 s
# demo-history's latency probe may run 5 minutes instead of 3, and times 4 long windows.
HISTORY_TIMEOUT_S = 720.0
# What --deploy takes: the target's deploys, and the source's prometheus-operator resource (the stack's k8s component).
DEMO_DEPLOY_KINDS = (*DEPLOY_KINDS, K8S_CR, GIT)
# Deploys that work with either target (the others need the AMP target).
ANY_TARGET_DEPLOYS = (REMOTE_WRITE, GIT)
# How long the git deploy waits for the review stand-in, the reconciler and the source's reload.
GIT_TIMEOUT_S = 120.0
# How long the deploy waits for the operator stand-in and the source's reload (LoadedConfigTrigger's deadline).
K8S_TIMEOUT_S = 120.0


class TargetWriteGap:
    """Plant a fault: some hosts' series vanish from the target for the first part of dual-write.

    For ``gap_s`` seconds after dual-write starts, every sample of those hosts is deleted
    from the target once a second; then the hosts come back. Warm-up sees a complete
    target again (as after a real write outage), but the window parity compares has a
    hole. (Deleting only an older time range is not reliable on Prometheus 2.42's head
    block, so the gap is made by deleting everything while it lasts.)
    """

    def __init__(self, target: PrometheusClient, selector: str, host_label: str, hosts: list[str],
                 gap_s: float) -> None:
        self.target = target
        self.matchers = [f'{selector[:-1]}, {host_label}="{h}"}}' for h in hosts]
        self.hosts = hosts
        self.gap_s = gap_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="target-write-gap", daemon=True)

    def start(self) -> None:
        log.warning("drift: the target loses every sample of hosts %s for the next %.0fs", ", ".join(self.hosts),
                    self.gap_s)
        self._thread.start()

    def _run(self) -> None:
        until = time.time() + self.gap_s
        while not self._stop.is_set() and time.time() < until:
            for m in self.matchers:
                try:
                    self.target.delete_series(m)
                except Exception as exc:  # keep planting; the report shows what parity saw
                    log.warning("planting the fault failed: %s", exc)
            self._stop.wait(1.0)
        log.warning("drift: hosts %s are written to the target again", ", ".join(self.hosts))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def write_report(*, audit: AuditStore, group: str, run_id: str, out_dir: Path,
                 target: dict[str, Any] | None = None, source_config: dict[str, Any] | None = None,
                 executor: dict[str, Any] | None = None, whole_life: bool = False,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """report.json, report.md and latency.png from the run's audit events (and the target's counters).

    ``executor``: which worker ran each task (``core.executor_report``, from Airflow's task instances).
    ``whole_life``: every event of the group (the migration run, the bake watch's runs, the decommission
    run), not only the migration run's: the demo's audit log is fresh, so they are this demo's. ``extra``:
    more top-level blocks (``source_rules``, ``lifecycle``)."""
    events = audit.events(group=group) if whole_life else audit.events(group=group, run_id=run_id)
    report = build_report(group=group, run_id=run_id, events=events,
                          final_stage=audit.stage_of(group).value, chain=audit.verify(), target=target,
                          source_config=source_config)
    if executor is not None:
        report["executor"] = executor
    report.update(extra or {})
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, data in render_report_files(report).items():
        (out_dir / name).write_bytes(data)
    return report


def print_report(report: dict[str, Any]) -> None:
    print()
    print(f"=== promshift: {report['group']} — final stage {report['final_stage']} ===")
    print(report["summary"])
    if report.get("target"):
        print(f"Target: {target_line(report['target'])}")
    if report.get("source_config"):
        print(f"Source config: {source_config_line(report['source_config'])}")
    if report.get("executor"):
        print(f"Executor: {executor_line(report['executor'])}")
    if report.get("self_metrics"):
        print(f"promshift's own metrics: {self_metrics_line(report['self_metrics'])}")
    print("\nStages:")
    for s in report["stages"]:
        print(f"  {s['at'][:19]}  {s['stage']}")
    if not report["stages"]:
        print("  (none: the group's stage never changed)")
    p = report["parity"]
    print(f"\nParity: {p.get('verdict') or 'not run'}")
    if p.get("measurements"):
        print("  " + parity_log_table(ParityResult.from_dict(p)).replace("\n", "\n  "))
    lat = report["latency"]
    print(f"\nLatency: {lat.get('verdict') or 'not run'}")
    if lat.get("windows"):
        windows = [WindowLatency.from_dict(w) for w in lat["windows"]]
        print("  " + latency_table(windows).replace("\n", "\n  "))
    if lat.get("cost"):
        print("\nProjected monthly AMP cost:")
        print("  " + cost_table(CostEvidence.from_dict(lat["cost"])).replace("\n", "\n  "))
    a = report["approval"]
    print(f"\nApproval: {a['decision'] or 'not asked'}" + (f" by {a['by']}" if a["by"] else ""))
    r = report["rollback"]
    print(f"Rollback: performed={r['performed']} restored_identical={r['restored_identical']}"
          + (f"\n  why: {r['reason']}" if r["performed"] else ""))
    for line in lifecycle_lines(report):
        print(line)
    au = report["audit"]
    print(f"Audit: {au['events']} events in this run; chain of {au['chain_events']} "
          f"{'OK' if au['chain_ok'] else 'BROKEN'}")


def lifecycle_lines(report: dict[str, Any]) -> list[str]:
    """What moved with the group and what happened after its cut-over (reports of a lifecycle scenario)."""
    if "lifecycle" not in report:
        return []
    moved = MovedEvidence.from_dict(report)
    rules, reads, bake, dec = moved.rules, moved.read_path, moved.bake, moved.decommission
    lines = [f"Rules: {rules.rules} ({rules.records} recording, {rules.alerts} alerting), moved "
             f"{rules.moved}, restored {rules.restored}",
             f"Dashboards: {reads.dashboards} dashboard(s), {reads.panels} panel(s) switched "
             f"{reads.switched}, restored {reads.restored}",
             f"Bake: {bake.checks} check(s), {bake.failed_checks} failed; baked {bake.baked}; reads rolled "
             f"back {bake.reads_rolled_back}" + (f" ({bake.reason})" if bake.reason else ""),
             f"Decommission: performed {dec.performed}, source series after {dec.source_series_after}, freed "
             f"{dec.freed_series} series ({dec.freed_samples_per_s} samples/s)"]
    if report.get("alerts"):
        al = report["alerts"]
        lines.append(f"Alerts: {al['alert']} delivered {al['delivered']}"
                     + (f", seen by {al['seen_by']}" if al.get("seen_by") else "")
                     + (f": {al['reason']}" if al.get("reason") else "")
                     + (f" ({al['instances']} instances to {', '.join(al['receivers'])})" if al.get("receivers")
                        else ""))
    if report.get("horizon"):
        hz = report["horizon"]
        cut = hz.get("at_cut_over") or {}
        waited = [f"{w['kind']} {w['name']} (ready {w['ready_at']})" for w in cut.get("waiting") or []]
        switched = ", ".join(h["what"] for h in hz.get("switched") or []) or "nothing"
        lines.append(f"Horizon: at cut-over ({cut.get('dual_write_age_at_cut_over_s')}s into dual-write) "
                     f"{len(waited)} waited: {'; '.join(waited) or 'none'}; the bake watch (LAB ONLY: clock "
                     f"{hz.get('lab_clock_ahead')} ahead) switched {switched}; still waiting "
                     f"{len(hz.get('still_waiting') or [])}")
    if report.get("source_rules"):
        lines.append(f"Source rules: {source_config_line(report['source_rules'])}")
    return lines


def workspace_alerts(stack: LocalStack) -> Any:
    """The local workspace's Alertmanager (ListAlerts through the front door, signed): alertname -> active alerts."""
    from botocore.credentials import Credentials

    from promshift.adapters.alertmanager import active_alerts
    from promshift.adapters.sigv4 import AwsSigV4Auth

    pair = stack.aws_credentials()
    auth = AwsSigV4Auth(Credentials(pair.access_key, pair.secret_key, pair.session_token), stack.config.region)
    base = stack.prometheus_endpoint() + "alertmanager"
    return lambda name: active_alerts(base, name, auth=auth)


def sigv4_counters(stack: LocalStack) -> dict[str, dict[str, Any]] | None:
    """The front door's and the control plane's SigV4 counters now (None for a self-hosted target)."""
    if stack.config.target_kind != "amp":
        return None
    return {FRONTDOOR: stack.sigv4_stats(FRONTDOOR), AWS: stack.sigv4_stats(AWS)}


def _since(now: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    """Counters ``now`` less those ``before`` (a scenario's share of a session's counters)."""
    if before is None:
        return now
    by_reason = {reason: int(n) - int((before.get("rejected_by_reason") or {}).get(reason, 0))
                 for reason, n in (now.get("rejected_by_reason") or {}).items()}
    return {**now, "verified": int(now["verified"]) - int(before["verified"]),
            "rejected": int(now["rejected"]) - int(before["rejected"]),
            "rejected_by_reason": {reason: n for reason, n in by_reason.items() if n}}


def target_report(stack: LocalStack, baseline: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The report's ``target`` block: the AMP workspace and the front door's SigV4 counters taken now
    (and the control plane's), or the self-hosted target's URL. Never a credential. ``baseline``
    (``sigv4_counters`` taken when a scenario started): the counters since then."""
    if stack.config.target_kind != "amp":
        return {"kind": "prometheus", "url": stack.target_url}
    base = baseline or {}
    front = _since(stack.sigv4_stats(FRONTDOOR), base.get(FRONTDOOR))
    control = _since(stack.sigv4_stats(AWS), base.get(AWS))
    return {"kind": "amp", "workspace_id": stack.workspace_id, "region": stack.config.region,
            "sigv4_verified": int(front["verified"]), "sigv4_rejected": int(front["rejected"]),
            "sigv4_rejected_by_reason": dict(front.get("rejected_by_reason") or {}),
            "control_plane": {"verified": int(control["verified"]), "rejected": int(control["rejected"]),
                              "rejected_by_reason": dict(control.get("rejected_by_reason") or {})}}


def target_connection(stack: LocalStack, deploy: str = REMOTE_WRITE) -> dict[str, Any]:
    """Airflow's target connection: for AMP the ``amp`` connection, never a credential (the ``AWS_*`` pair
    reaches Airflow through its environment: ``aws_environment``).

    ``deploy="scraper"``: the connection asks for AMP's managed collector (``extra.deploy``) and names the
    cluster it would scrape (``extra.scraper``); locally the stack's collector scrapes the fleet. For
    ``deploy="k8s-cr"`` the target connection is the plain one (its deploy stays ``remote_write``): the
    source connection says how its config is changed (``source_connection``)."""
    if stack.config.target_kind != "amp":
        return {"conn_type": "prometheus", "host": stack.target_url,
                "extra": {"base_url": stack.target_url, "remote_write_url": stack.target_remote_write_url}}
    extra: dict[str, Any] = dict(stack.amp_connection_extra())
    if deploy == SCRAPER:
        extra["deploy"] = deploy
        extra["scraper"] = stack.scraper_extra()
    return {"conn_type": "amp", "extra": extra}


def aws_environment(stack: LocalStack, *, bad_credentials: bool = False) -> dict[str, str]:
    """The ``AWS_*`` pair Airflow signs with (AMP only; else nothing): the stack's, or for ``bad_credentials``
    the right access key id with a secret the local AWS refuses."""
    if stack.config.target_kind != "amp":
        return {}
    env = stack.aws_env()
    if bad_credentials:
        env["AWS_SECRET_ACCESS_KEY"] = make_up_credentials().secret_key
        log.warning("bad-credentials: Airflow signs with the right access key id but another secret; the local "
                    "AWS must refuse every signature, and nothing may be deployed")
    return env


def source_connection(stack: LocalStack, deploy: str = REMOTE_WRITE, *, rules: bool = False) -> dict[str, Any]:
    """Airflow's source connection: the config file's path, or for ``k8s-cr`` the ``Prometheus`` resource the
    stack's contract server holds and the kubeconfig reaching it (no file path: a worker pod could not see it).
    ``rules``: the group's rules move with it (``extra.rules``); on ``k8s-cr`` from the ``PrometheusRule`` the
    stack's contract server holds (``extra.kubernetes.prometheus_rules``), else from the config's ``rule_files``."""
    if deploy == K8S_CR:
        return {"conn_type": "prometheus", "host": stack.source_url,
                "extra": {"deploy": K8S_CR, **({"rules": True} if rules else {}),
                          "kubernetes": stack.kubernetes_source_extra(timeout_s=K8S_TIMEOUT_S, rules=rules)}}
    if deploy == GIT:  # the stack's config repository, through a pull request on its GitHub API contract server
        return {"conn_type": "prometheus", "host": stack.source_url,
                "extra": {"deploy": GIT, "git": stack.git_source_extra(timeout_s=GIT_TIMEOUT_S)}}
    return {"conn_type": "prometheus", "host": stack.source_url,
            "extra": {"config_path": str(stack.source_config_path), **({"rules": True} if rules else {})}}


def local_amp_credentials_problem() -> str | None:
    """Why the AWS_* environment cannot drive the local AMP stack, or None.

    Measured: Debian's vmagent (the local signing relay) signs with the key id and secret from its
    environment but never sends a session token, so the front door would refuse every write.
    """
    if os.environ.get("AWS_SESSION_TOKEN"):
        return ("AWS_SESSION_TOKEN is set, but the local signing relay (Debian's vmagent) cannot send a session "
                "token: for the local AMP stack use a long-term pair (any made-up AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY works) or unset AWS_* to let the stack make one up")
    return None


def config_sha256(path: Path) -> str:
    return sha256_bytes(path.read_bytes())


def backfilled_metrics(group: MetricGroup) -> list[str]:
    """The metrics of ``group`` the fleet simulator renders (explicit names and ``metric_regex`` matches)."""
    return [name for name in fleet_metrics() if group.claims(name)]


def run_demo(*, group_name: str, scenario: str, nodes: int, airflow_port: int, report_root: Path,
             timeout_s: float | None = None, history_s: float | None = None,
             history_interval_s: float = 300.0, target_kind: str = "prometheus",
             deploy: str = REMOTE_WRITE, executor: str = "local", profile: str | None = None) -> Path:
    """Run the whole job once on a fresh local stack; return the report directory.

    ``target_kind="amp"``: the target is the local AWS's workspace, reached through its SigV4 front door.
    ``deploy="scraper"`` (AMP only): the group is written by the workspace's managed collector (the local
    scraper API's collector) instead of a ``remote_write`` entry in the source's config.
    ``deploy="k8s-cr"`` (AMP only): the entry goes into the ``Prometheus`` resource of the stack's Kubernetes
    contract server, whose operator stand-in renders it onto the source.

    With ``history_s``, source and target first get that much of the group's history (one
    sample every ``history_interval_s``) and the ``demo-history`` profile is used.

    ``executor="celery"``: Airflow's components and two Celery workers as separate processes on the machine's
    Redis and PostgreSQL (``promshift.local.celery_lab``; refused in one line when either does not answer).
    ``profile``: the catalog profile instead of ``demo``/``demo-history`` (``start_session``).

    One session (``start_session``: the stack and one Airflow) and one scenario in it (``run_scenario``); the
    end-to-end tests run several scenarios in one session. Airflow is left running with the stack.
    """
    check_scenario(scenario, group_name=group_name, target_kind=target_kind, deploy=deploy)
    session = start_session(nodes=nodes, airflow_port=airflow_port, target_kind=target_kind,
                            kubernetes=deploy == K8S_CR, git=deploy == GIT, history_s=history_s,
                            history_groups=(group_name,),
                            history_interval_s=history_interval_s, executor=executor,
                            bad_credentials=scenario == "bad-credentials", profile=profile,
                            # the lifecycle demo's bake watch counts history a day ahead (demo_lifecycle says why)
                            bake_watch_clock_ahead=LAB_CLOCK_AHEAD if scenario == "lifecycle" else None)
    return run_scenario(session, group_name=group_name, scenario=scenario, report_root=report_root,
                        deploy=deploy, timeout_s=timeout_s)


def scenario_trigger_conf(scenario: str, *, read_path: bool = False, rules: bool = False) -> dict[str, Any]:
    """The migration form's fields a scenario sets beyond the group. ``bake-fail`` and a run with the dashboard
    switch on (``read_path``: plan-aggregate's fleet dashboard) switch a dashboard (default ranges of 15 min to an
    hour) and move an alert (``for: 1m``) minutes into dual-write: they accept short history explicitly, as an
    operator would in the form (recorded, shown to the approver). ``lifecycle`` does not: it shows the history
    horizon (what reads further back waits, and the bake watch moves it; ``demo_lifecycle``). Every other scenario
    keeps the form's default (false). ``rules``: a run that moves the group's rules (its alert's ``for: 1m``)
    accepts short history as ``bake-fail`` does."""
    accepts = (scenario in LIFECYCLE_SCENARIOS and scenario != "lifecycle") or read_path or rules
    return {"accept_short_history": True} if accepts else {}


def check_scenario(scenario: str, *, group_name: str, target_kind: str, deploy: str) -> None:
    """Refuse a scenario, target and deploy that do not go together (ValueError), before anything is reset."""
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {', '.join(SCENARIOS)}, got {scenario!r}")
    if scenario in AMP_ONLY_SCENARIOS and target_kind != "amp":
        raise ValueError(f"scenario {scenario!r} needs the AMP target (--target amp / TARGET=amp)")
    if scenario in LIFECYCLE_SCENARIOS:
        lifecycle_choices(scenario, group_name, target_kind, deploy)  # refuses another target or deploy
    if deploy not in DEMO_DEPLOY_KINDS:
        raise ValueError(f"deploy must be one of {', '.join(DEMO_DEPLOY_KINDS)}, got {deploy!r}")
    if deploy not in ANY_TARGET_DEPLOYS and target_kind != "amp":
        raise ValueError(f"deploy {deploy!r} needs the AMP target (--target amp / TARGET=amp)")


@dataclass
class DemoSession:
    """A fresh local stack and one Airflow wired to it, in which scenarios run one after another.

    Airflow's ``promshift_source``/``promshift_target`` (and, for the lifecycle scenarios, ``grafana_default``)
    connections live in Airflow's metadata database, set through its REST API by each scenario
    (``set_connections``), so one Airflow serves scenarios on different deploys. What only a process's
    environment can carry is the session's: the catalog profile, the ``AWS_*`` pair (``bad_credentials``:
    a secret the local AWS refuses), the audit store, the SMTP connection."""

    config: StackConfig
    stack: LocalStack
    airflow: LocalAirflow
    profile: str
    catalog_path: Path
    audit_url: str
    anchor_url: str | None
    key_env: dict[str, str]
    services: CeleryServices | None
    executor: str
    history_s: float | None
    bad_credentials: bool
    started: float
    budget_from: float  # the first scenario's time budget counts from here (after any backfill)
    scenarios_run: int = 0
    # LAB ONLY: Airflow's PROMSHIFT_LAB_BAKE_WATCH_CLOCK_AHEAD (the lifecycle demo's history horizon), None when unset
    bake_watch_clock_ahead: str | None = None

    @property
    def target_kind(self) -> str:
        return self.config.target_kind

    def group(self, name: str) -> MetricGroup:
        return load_catalog(self.catalog_path, profile=self.profile).get(name)

    def audit(self) -> AuditStore:
        key = audit_key(self.key_env)
        if self.anchor_url is None:
            return AuditStore(self.audit_url, key=key)
        return AuditStore(self.audit_url, key=key, anchor=anchor_for(self.anchor_url, create=False))

    def set_connections(self, connections: dict[str, dict[str, Any] | None]) -> None:
        """Create, replace (``dict``) or delete (``None``) Airflow connections through the REST API."""
        for conn_id, conn in connections.items():
            if conn is None:
                self.airflow.delete_connection(conn_id)
            else:
                self.airflow.set_connection(conn_id, conn)

    def down(self) -> None:
        """Stop Airflow and the stack (``make stack-down`` does the same by the pid files)."""
        self.stack.down()


def start_session(*, nodes: int, airflow_port: int, target_kind: str = "prometheus", kubernetes: bool = False,
                  git: bool = False,
                  history_s: float | None = None, history_groups: tuple[str, ...] = (),
                  history_interval_s: float = 300.0, executor: str = "local",
                  bad_credentials: bool = False, clusters: int = 1,
                  catalog: Callable[[Path], Path] | None = None,
                  catalog_path: Path | None = None, profile: str | None = None,
                  bake_watch_clock_ahead: str | None = None) -> DemoSession:
    """Reset the local state, start the stack and one Airflow (left running: ``DemoSession.down`` stops both).

    With ``history_s`` the ``history_groups``' metrics get that much history on both sides first and the
    session's catalog profile is ``demo-history``; else ``demo``. ``kubernetes``: the stack's k8s component
    (``deploy="k8s-cr"`` needs it). ``bad_credentials`` (AMP only): Airflow signs with a secret the local AWS
    does not accept (scenario ``bad-credentials``). ``clusters=2``: the stack's second cluster and target too
    (``SCENARIO=fleet``); ``catalog``: writes the session's catalog under the given PROMSHIFT_HOME (after the
    reset) and returns its path, instead of the repository's. ``profile``: the catalog profile, instead of
    ``demo-history`` with history and ``demo`` without (``demo-quick``: the end-to-end sessions').
    ``bake_watch_clock_ahead`` (LAB ONLY, e.g. ``24h``):
    Airflow's ``PROMSHIFT_LAB_BAKE_WATCH_CLOCK_AHEAD``, the bake watch counting the target's history that far
    ahead of the wall clock (the lifecycle demo's history horizon; refused in one line if it is not a duration)."""
    started = time.time()
    if bake_watch_clock_ahead is not None:  # refused before anything is reset
        lab_bake_watch_clock_ahead_s({LAB_CLOCK_AHEAD_VAR: bake_watch_clock_ahead})
    config = StackConfig.from_env(nodes=nodes, target_kind=target_kind, kubernetes=kubernetes, git=git,
                                  clusters=clusters)
    stack = LocalStack(config)
    write_catalog = catalog
    profile = profile or (HISTORY_PROFILE if history_s else DEMO_PROFILE)
    catalog_path = catalog_path or REPO_ROOT / "catalog" / "metric_groups.yaml"  # the plan demo writes its own
    catalog = load_catalog(catalog_path, profile=profile)
    groups = [catalog.get(name) for name in history_groups]
    metrics: list[str] = []
    if history_s:
        # Refuse before resetting anything.
        check_history(history_s, history_interval_s)
        for g in groups:
            claimed = backfilled_metrics(g)
            if not claimed:
                raise ValueError(f"group {g.name!r} claims none of the metrics the fleet simulator renders")
            metrics += claimed
    if target_kind == "amp" and (problem := local_amp_credentials_problem()):
        raise ValueError(problem)
    if bad_credentials and target_kind != "amp":
        raise ValueError("scenario 'bad-credentials' needs the AMP target (--target amp / TARGET=amp)")
    if kubernetes and target_kind != "amp":
        raise ValueError(f"deploy {K8S_CR!r} needs the AMP target (--target amp / TARGET=amp)")
    if executor not in EXECUTOR_KINDS:
        raise ValueError(f"executor must be one of {', '.join(EXECUTOR_KINDS)}, got {executor!r}")
    services = CeleryServices.from_env(airflow_port) if executor == "celery" else None
    if services is not None:
        services.require()  # before anything is reset: Redis and PostgreSQL answer
    log.info("resetting local state under %s (fresh stack, audit log and Airflow)", config.home)
    stack.reset()
    for leftover in ("audit.db", "audit-anchor.db", "anchors", "routing.json", "snapshots",
                     shared_store(config.home).name):
        path = config.home / leftover
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    if write_catalog is not None:
        catalog_path = write_catalog(config.home)
        load_catalog(catalog_path, profile=profile)  # refused here, in one line, rather than in Airflow
    budget_from = started
    if history_s:
        longest = max((w.seconds for g in groups for w in g.latency.windows), default=0.0)
        if longest > history_s:
            log.warning("history %s is shorter than the longest latency window (%s): windows reaching "
                        "before it have no data on either side", format_duration(history_s),
                        format_duration(longest))
        t0 = time.time()
        log.info("giving source and target %s of %s's history (one sample every %s), as if dual-write "
                 "had been running", format_duration(history_s), ", ".join(history_groups),
                 format_duration(history_interval_s))
        result = backfill_stack(stack, metrics, history_s=history_s, interval_s=history_interval_s)
        log.info("history backfilled in %.0fs: %s samples per side (OpenMetrics: %.0f MB source, %.0f MB target)",
                 time.time() - t0, f"{result.samples_per_side:,}", result.text_bytes["source"] / 1e6,
                 result.text_bytes["target"] / 1e6)
        # The backfill (about a minute at 200 nodes x 24h) does not count against the run's time budget.
        budget_from = time.time()
    stack.up()
    audit_url = f"sqlite:///{config.home / 'audit.db'}"
    anchor_url: str | None = None
    # The audit HMAC key: the environment's, else a 0600 file under PROMSHIFT_HOME (never printed).
    key_env = local_audit_key_env(config.home)
    if services is not None:
        services.recreate_databases()
        services.clear_queue()
        audit_url, anchor_url = services.database_url("audit"), services.database_url("anchor")
    # Credentials reach Airflow only through its environment: never a connection, never printed.
    aws_env = aws_environment(stack, bad_credentials=bad_credentials)
    airflow_home = config.home / "airflow"
    shutil.rmtree(airflow_home, ignore_errors=True)
    # Left running after the demo, with the rest of the stack (``make stack-down`` stops both, by this pid file).
    common_env = {
        "PROMSHIFT_CATALOG": str(catalog_path),
        "PROMSHIFT_PROFILE": profile,
        **aws_env,
        # Notifications (approval needed, rolled back) go to the stack's SMTP sink; `make demo` prints where.
        **stack.smtp_connection_env(),
        **({LAB_CLOCK_AHEAD_VAR: bake_watch_clock_ahead} if bake_watch_clock_ahead else {}),
    }
    if services is None:
        extra_env = {"PROMSHIFT_HOME": str(config.home), "PROMSHIFT_AUDIT_URL": audit_url, **common_env, **key_env}
        component_env: dict[str, dict[str, str]] = {}
    else:
        extra_env, component_env = celery_env(config.home, audit_url=audit_url, anchor_url=str(anchor_url),
                                              key_env=key_env, common=common_env)
    airflow = LocalAirflow(home=airflow_home, port=airflow_port, pid_file=stack.pid_path(AIRFLOW),
                           extra_env=extra_env, executor=executor, celery=services, component_env=component_env)
    airflow.start(timeout_s=AIRFLOW_START_TIMEOUT_S)
    keep_scraped(stack, airflow, now=time.time())  # the source scrapes promshift's own /metrics from now on
    return DemoSession(config=config, stack=stack, airflow=airflow, profile=profile, catalog_path=catalog_path,
                       audit_url=audit_url, anchor_url=anchor_url, key_env=key_env, services=services,
                       executor=executor, history_s=history_s, bad_credentials=bad_credentials, started=started,
                       budget_from=budget_from, bake_watch_clock_ahead=bake_watch_clock_ahead or None)


def scenario_connections(session: DemoSession, scenario: str, deploy: str,
                         read_path: bool = False, rules: bool = False) -> dict[str, dict[str, Any] | None]:
    """The Airflow connections a scenario runs with (``None``: the connection must not exist). ``read_path``: the
    dashboard switch is on (``grafana_default`` over the stack's dashboards) without moving the group's rules;
    ``rules``: the group's rules move with it (on ``k8s-cr`` from the stack's ``PrometheusRule``), no dashboard."""
    stack, lifecycle = session.stack, scenario in LIFECYCLE_SCENARIOS
    # the lifecycle scenarios: the group's rules move with it; its dashboard is re-pointed (file mode)
    source_conn = source_connection(stack, deploy, rules=lifecycle or rules)
    if deploy == GIT:  # the token of the stack's GitHub API contract server, as a connection's password
        return {"promshift_source": source_conn, "promshift_target": target_connection(stack, deploy),
                "promshift_git": {"conn_type": "generic", "password": stack.git_token()},
                "grafana_default": grafana_connection(stack.dashboards_dir) if lifecycle or read_path else None}
    return {"promshift_source": source_conn, "promshift_target": target_connection(stack, deploy),
            # Its existence turns the read-path switch on: the lifecycle scenarios' and the aggregation demo's.
            "grafana_default": grafana_connection(stack.dashboards_dir) if lifecycle or read_path else None}


def run_scenario(session: DemoSession, *, group_name: str, scenario: str, report_root: Path,
                 deploy: str = REMOTE_WRITE, timeout_s: float | None = None, read_path: bool = False,
                 rules: bool = False, report_extra: Callable[[DemoSession], dict[str, Any]] | None = None) -> Path:
    """Run one scenario on ``group_name`` in a running session: point Airflow's connections at the stack (for
    ``deploy``), trigger the group's migration (its target's DAG, the group chosen in the form), plant the
    scenario's fault, answer the approval through the REST API as an on-call engineer, follow the run (and for
    the lifecycle scenarios the bake watch and the decommission), write and print the report; return the report
    directory.

    A group migrates once per session: scenarios of one session take different groups (their audit events,
    config entries and reports are told apart by group). The first scenario's wall time counts from the
    session's start, as ``make demo``'s always did. ``read_path``: the dashboard switch is on for this run
    (``scenario_connections``); ``rules``: the group's rules move with it (``scenario_connections``; the report's
    ``source_rules`` compares the source's rule file before and after); ``report_extra``: more top-level blocks of
    the report, read from the running session right after the run (the aggregation demo's target series counts)."""
    check_scenario(scenario, group_name=group_name, target_kind=session.target_kind, deploy=deploy)
    if (scenario == "bad-credentials") != session.bad_credentials:
        raise ValueError("scenario 'bad-credentials' needs a session of its own started with bad_credentials=True "
                         "(Airflow's AWS secret is its environment's), and such a session runs nothing else")
    if deploy == K8S_CR and not session.config.kubernetes:
        raise ValueError(f"deploy {K8S_CR!r} needs a session started with kubernetes=True")
    if deploy == GIT and not session.config.git:
        raise ValueError(f"deploy {GIT!r} needs a session started with git=True")
    first = session.scenarios_run == 0
    session.scenarios_run += 1
    started = session.started if first else time.time()
    budget_from = session.budget_from if first else started
    if timeout_s is None:
        timeout_s = HISTORY_TIMEOUT_S if session.history_s else DEFAULT_TIMEOUT_S
    stack, airflow, executor = session.stack, session.airflow, session.executor
    lifecycle = scenario in LIFECYCLE_SCENARIOS
    group = session.group(group_name)
    # The SigV4 counters are the stack's since it started: a later scenario reports its own share only.
    baseline = None if first else sigv4_counters(stack)
    session.set_connections(scenario_connections(session, scenario, deploy, read_path=read_path, rules=rules))
    keep_scraped(stack, airflow, now=time.time())  # a new token when the one in use is about to expire
    if deploy == SCRAPER:
        # The demo's short timings, as for its latency windows: the local collector scrapes at the source's
        # interval instead of the blob's 30 s, or the demo's minute-long parity window holds one or two points.
        stack.set_aws_faults(scraper={"collector_scrape_interval_s": parse_duration(session.config.scrape_interval)})
    if deploy != REMOTE_WRITE and session.target_kind == "amp":
        # The quota pre-flight reads the workspace's active series from CloudWatch (AWS vends it; locally seeded).
        log.info("workspace usage seeded for the quota pre-flight: %s", stack.publish_usage())
    repository_before = config_repository(stack) if deploy == GIT else None
    sha_before = config_sha256(stack.source_config_path)
    log.info("source config %s sha256 %s before the run", stack.source_config_path, sha_before)
    if scenario == "lifecycle":  # the group's long reads, before anything is snapshotted or compared
        plant_horizon_reads(stack.dashboards_dir, stack.source_rules_path, lambda: reload_prometheus(stack.source_url))
        if not session.bake_watch_clock_ahead:
            log.warning("this session's bake watch counts history by the wall clock (no bake_watch_clock_ahead): what "
                        "waits at the cut-over waits its real time (a day); the decommission refuses till then")
    rules_before = config_sha256(stack.source_rules_path)
    fault: TargetWriteGap | None = None
    if scenario == "lifecycle":  # the moved alert fires: its delivery is checked after the handoff
        stack.set_fleet_faults(fb_full_gpus=ALERT_FAULT_GPUS)
        log.info("fleet fault: %s GPUs report a full framebuffer (%s fires)", ALERT_FAULT_GPUS, MOVED_ALERT)
    try:
        airflow.wait_for_dag(group.dag_id)
        # its target's migration DAG, the group chosen in the form (and the scenario's other form fields)
        run_id = airflow.trigger_group(group, conf=scenario_trigger_conf(scenario, read_path=read_path, rules=rules))
        approver = APPROVER_USERS[0]
        answers = 0
        awaiting_polls = 0

        def on_state(states: dict[str, str]) -> None:
            nonlocal answers, awaiting_polls, fault
            if scenario == "drift" and fault is None and states.get("deploy_dual_write") == "success":
                # The gap ends 30 s before warm-up may finish, so warm-up still passes.
                fault = TargetWriteGap(PrometheusClient(stack.target_url), group.selector(), group.host_label,
                                       [stack.fleet.hostname(i) for i in (1, 2)],
                                       gap_s=max(10.0, group.warmup.duration_s - 30))
                fault.start()
            # Each time the approval is awaiting input (again, after a retry), answer once, a few polls
            # (~9 s) after first seeing it, as a person would: an answer that arrives before the
            # scheduler has processed the pausing worker's exit can make Airflow 3.3.2 fail the
            # resumed task ("changed externally"); the approval task then retries and asks again.
            awaiting_polls = awaiting_polls + 1 if states.get("approval") == "awaiting_input" else 0
            if awaiting_polls == APPROVAL_AFTER_POLLS:
                answers += 1
                if answers > 1:
                    log.warning("the approval is asked again (Airflow failed the resumed task); answering again")
                log.info("approval requested; %s answers through the REST API", approver)
                airflow.answer_approval(group.dag_id, run_id, "approval", user=approver, choice="Approve",
                                        comment="parity and latency evidence reviewed in the demo")

        final = airflow.follow(group.dag_id, run_id, timeout_s=max(60.0, timeout_s - (time.time() - budget_from)),
                               on_state=on_state)
        log.info("DAG run %s finished: %s", run_id, final)
        # Airflow's own record of where each task ran (TaskInstance.hostname and pid).
        ran_on = executor_block(executor, airflow.task_instances(group.dag_id, run_id), airflow.worker_processes())
    finally:
        if fault:
            fault.stop()
    services = session.services
    if services is not None and len(ran_on["parity_samples_workers"]) < 2:
        log.warning("the mapped parity shards ran on %s worker(s) only: %s", len(ran_on["parity_samples_workers"]),
                    ", ".join(ran_on["parity_samples_workers"]) or "none")
    audit = session.audit()
    extra: dict[str, Any] = {}
    if lifecycle:
        if audit.stage_of(group_name) == Stage.CUT_OVER:
            # lifecycle: what the horizon held back, read (board page included) before the bake watch runs
            at_cut_over = (lambda: horizon_at_cut_over(
                audit, group_name, board_page=lambda: board_page(airflow, group_name),
                dashboards_dir=stack.dashboards_dir, target_rules=lambda: target_rule_names(stack))
            ) if scenario == "lifecycle" else None
            extra["lifecycle"] = follow_lifecycle(
                airflow=airflow, audit=audit, group=group, scenario=scenario, amp_dir=stack.amp_dir,
                approver=APPROVER_USERS[1], answer_after_polls=APPROVAL_AFTER_POLLS,
                alerts=workspace_alerts(stack), at_cut_over=at_cut_over)
            if "alerts" in extra["lifecycle"]:
                extra["alerts"] = extra["lifecycle"]["alerts"]
            if "horizon" in extra["lifecycle"]:
                extra["horizon"] = {"lab_clock_ahead": session.bake_watch_clock_ahead,
                                    **extra["lifecycle"].pop("horizon")}
        else:
            log.error("%s: the migration run ended %s, not cut_over: no bake watch or decommission", scenario,
                      audit.stage_of(group_name).value)
            extra["lifecycle"] = {"scenario": scenario, "runs": {}, "bake_stage": None}
        if scenario == "lifecycle":
            stack.set_fleet_faults(fb_full_gpus=0)
    if lifecycle or rules:
        rules_after = config_sha256(stack.source_rules_path)
        extra["source_rules"] = {"path": str(stack.source_rules_path), "sha256_before": rules_before,
                                 "sha256_after": rules_after, "identical": rules_before == rules_after}
    if repository_before is not None:
        extra["config_repository"] = config_repository_report(stack, repository_before)
    extra["self_metrics"] = self_metrics_report(stack)
    if report_extra is not None:
        extra.update(report_extra(session))
    sha_after = config_sha256(stack.source_config_path)
    source_config = {"path": str(stack.source_config_path), "sha256_before": sha_before, "sha256_after": sha_after,
                     "identical": sha_before == sha_after}
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    kind = "" if session.target_kind == "prometheus" else f"-{session.target_kind}"
    kind += "" if deploy == REMOTE_WRITE else f"-{deploy}"
    out_dir = (report_root / f"{stamp}-{group_name}{kind}-{scenario}").resolve()
    report = write_report(audit=audit, group=group_name, run_id=run_id, out_dir=out_dir,
                          target=target_report(stack, baseline=baseline), source_config=source_config,
                          executor=ran_on, whole_life=lifecycle, extra=extra)
    print_report(report)
    print(f"\nwall time {time.time() - started:.0f}s")
    print_logins(airflow, group.dag_id, run_id, mail=f"{len(stack.mail())} message(s) in {stack.mail_dir}")
    if services is not None:
        print(f"celery: broker {services.redis_url} (queue {services.queue}); PostgreSQL databases "
              f"{', '.join(database_name(role, airflow.port) for role in DB_ROLES)}; logs {airflow.home}/*.log")
    return out_dir


def reload_prometheus(url: str) -> None:
    """``POST <url>/-/reload`` (the stack's Prometheus runs with ``--web.enable-lifecycle``)."""
    response = requests.post(f"{url}/-/reload", timeout=30)
    response.raise_for_status()


def board_page(airflow: LocalAirflow, group: str) -> str:
    """The group's page on the board (the Airflow plugin), as the demo's trigger user sees it."""
    response = requests.get(f"{airflow.base_url}{BOARD_PREFIX}/groups/{group}", timeout=60,
                            headers={"Authorization": f"Bearer {airflow.token(TRIGGER_USER)}"})
    response.raise_for_status()
    return response.text


def target_rule_names(stack: LocalStack) -> list[str]:
    """The names of the rules the target evaluates now (its ``/api/v1/rules``)."""
    from promshift.adapters.rules_deploy import loaded_rules

    return sorted({rule.name for rule in loaded_rules(PrometheusClient(stack.target_url))})


def config_repository(stack: LocalStack) -> dict[str, Any]:
    """The stack's config repository now: its branch's tip, the file's sha256, and how many syncs ran."""
    address = stack.git_address() or {}
    repo, branch, path = str(address["repo"]), str(address["branch"]), str(address["path"])

    def git(*args: str) -> bytes:
        return subprocess.run(["git", "--git-dir", repo, *args], capture_output=True, check=True, timeout=60).stdout

    syncs = json.loads((stack.git_dir / "sync.json").read_text()) if (stack.git_dir / "sync.json").exists() else []
    return {"repository": repo, "branch": branch, "path": path, "tip": git("rev-parse", branch).decode().strip(),
            "file_sha256": sha256_bytes(git("show", f"{branch}:{path}")), "syncs": syncs}


def config_repository_report(stack: LocalStack, before: dict[str, Any]) -> dict[str, Any]:
    """The config repository's block of the report: the file before and after, our commits, the syncs between.

    Every change to the source's config in the run was the reconciler's (a sync of a commit), none ours."""
    after = config_repository(stack)
    log_lines = subprocess.run(["git", "--git-dir", after["repository"], "log", "--format=%H %an %s",
                                f"{before['tip']}..{after['tip']}"], capture_output=True, text=True, check=True,
                               timeout=60).stdout.splitlines()
    syncs = [s for s in after["syncs"] if s not in before["syncs"]]
    return {"repository": after["repository"], "branch": after["branch"], "path": after["path"],
            "file_sha256_before": before["file_sha256"], "file_sha256_after": after["file_sha256"],
            "identical": before["file_sha256"] == after["file_sha256"], "commits": log_lines,
            "syncs": [{"commit": s["commit"], "changed": s["changed"]} for s in syncs],
            "sync_wait_s": [round(s["reloaded_at"] - s["seen_at"], 3) for s in syncs]}


def shared_store(home: Path) -> Path:
    """The celery demo's one object store for snapshots and reports (``file://``; ``s3://`` in production)."""
    return home / "objects"


def celery_env(home: Path, *, audit_url: str, anchor_url: str, key_env: dict[str, str],
               common: dict[str, str]) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """The environment of every process of the celery Airflow, and what only the API server gets.

    As in production: the audit database's URL and the HMAC key come in connection ``promshift_audit``
    (``extra.url``; the key as its password), the anchor store is another database, snapshots and reports
    go to one object store every worker reaches. Nothing names a file under the demo's ``PROMSHIFT_HOME``:
    each process has a ``PROMSHIFT_HOME`` of its own (``LocalAirflow.component_home``). The API server's
    board reads ``PROMSHIFT_AUDIT_URL`` (and the key, to check the chain), as the CLI does.
    """
    key = audit_key(key_env)
    if key is None:
        raise ValueError("no audit key: set PROMSHIFT_AUDIT_KEY or PROMSHIFT_AUDIT_KEY_FILE")
    store = shared_store(home)
    env = {
        **common,
        "AIRFLOW_CONN_PROMSHIFT_AUDIT": json.dumps({"conn_type": "generic", "password": key.decode(),
                                                    "extra": {"url": audit_url}}),
        "PROMSHIFT_AUDIT_ANCHOR_URL": anchor_url,
        "PROMSHIFT_SNAPSHOTS_URL": f"file://{store / 'snapshots'}",
        "PROMSHIFT_REPORTS_URL": f"file://{store / 'reports'}",
    }
    return env, {"api-server": {"PROMSHIFT_AUDIT_URL": audit_url, **key_env}}


def print_logins(airflow: LocalAirflow, dag_id: str, run_id: str, *, mail: str = "") -> None:
    """Where to look now: the Airflow UI, the board, this run, the notifications sent, the demo users' logins."""
    base = airflow.base_url
    print(f"\nAirflow is still running, with the rest of the stack (make stack-down stops them all):\n"
          f"  UI     {base}/\n"
          f"  board  {base}{BOARD_PREFIX}/\n"
          f"  run    {base}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}\n"
          + (f"  mail   {mail} (the stack's SMTP sink: notifications to the group's owners)\n" if mail else "") +
          f"logins (local demo users, passwords generated for this demo in {airflow.home / 'passwords.json'}):")
    roles = {TRIGGER_USER: "op: triggers runs", **dict.fromkeys(APPROVER_USERS, "user: approves")}
    for user, password in airflow.passwords.items():
        print(f"  {user:<14} {password:<18} ({roles.get(user, 'user')})")


def _duration(text: str) -> float:
    """argparse type: a positive Prometheus duration (``24h``, ``90m``) in seconds."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="promshift-demo", description=__doc__)
    parser.add_argument("--group", default=None,
                        help=f"default {DEFAULT_GROUP} ({LIFECYCLE_GROUP} for {', '.join(LIFECYCLE_SCENARIOS)})")
    parser.add_argument("--scenario", choices=(*SCENARIOS, "plan", "plan-aggregate", "fleet", "retire"),
                        default="happy",
                        help=f"{', '.join(AMP_ONLY_SCENARIOS)}: --target amp only; {', '.join(LIFECYCLE_SCENARIOS)}: "
                             "--target amp --deploy scraper (their defaults)")
    parser.add_argument("--target", choices=TARGET_KINDS, default=None,
                        help="amp: migrate onto the local AWS's AMP workspace through its SigV4 front door "
                             "(default prometheus; amp for the lifecycle scenarios)")
    parser.add_argument("--nodes", type=int, default=int(os.environ.get("PROMSHIFT_NODES", "200")))
    parser.add_argument("--airflow-port", type=int, default=int(os.environ.get("PROMSHIFT_AIRFLOW_PORT", "28080")))
    parser.add_argument("--report-root", type=Path, default=REPO_ROOT / "reports")
    parser.add_argument("--history", type=_duration, default=None, metavar="DURATION",
                        help="give source and target this much of the group's history before starting (e.g. 24h; "
                             f"under the source's {SOURCE_RETENTION} retention) and use the catalog profile "
                             f"{HISTORY_PROFILE!r}")
    parser.add_argument("--history-interval", type=_duration, default=300.0, metavar="DURATION",
                        help="sample interval of the backfilled history (default 5m, at most 5m)")
    parser.add_argument("--executor", choices=EXECUTOR_KINDS, default="local",
                        help="celery: Airflow's components and two Celery workers (each with its own PROMSHIFT_HOME) "
                             "as separate processes, on the machine's Redis (broker) and PostgreSQL (metadata, audit)")
    parser.add_argument("--deploy", choices=DEMO_DEPLOY_KINDS, default=None,
                        help="scraper (--target amp only): AMP's managed collector writes the group instead of a "
                             "remote_write entry in the source's config; k8s-cr (--target amp only): the entry goes "
                             "into prometheus-operator's Prometheus resource on the stack's Kubernetes API contract "
                             "server (not a cluster), whose operator stand-in renders it onto the source; git: the "
                             "entry is a commit in the stack's config repository (a pull request on its GitHub API "
                             "contract server), synced onto the source by its reconciler stand-in")
    parser.add_argument("--profile", default=None,
                        help=f"the catalog profile (default {DEMO_PROFILE}, {HISTORY_PROFILE} with --history; "
                             f"{QUICK_PROFILE}: a one-minute warm-up)")
    args = parser.parse_args(argv)
    if args.profile is not None:
        try:
            load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile=args.profile)
        except ValueError as exc:
            parser.error(f"--profile: {exc}")
    if args.scenario == "plan":  # no Airflow: the stack, a read load, and `promshift plan` (docs/plan.md)
        from promshift.local.demo_plan import run_plan_demo

        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        print(run_plan_demo(nodes=args.nodes, report_root=args.report_root, airflow_port=args.airflow_port))
        return 0
    if args.scenario == "plan-aggregate":  # the plan's aggregation migrated through Airflow (demo_plan_aggregate)
        if args.group or args.target not in (None, "prometheus") or args.deploy not in (None, REMOTE_WRITE) \
                or args.history is not None or args.executor != "local":
            parser.error("--scenario plan-aggregate migrates the plan's own group onto the local Prometheus target "
                         "with remote_write and the local executor, without history")
        from promshift.local.demo_plan_aggregate import run_aggregate_demo

        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        print(run_aggregate_demo(nodes=args.nodes, report_root=args.report_root, airflow_port=args.airflow_port,
                                 profile=args.profile))
        return 0
    if args.scenario == "fleet":  # two clusters onto two workspaces, three groups in two waves (demo_fleet)
        if args.group or args.deploy not in (None, REMOTE_WRITE) or args.history is not None \
                or args.executor != "local":
            parser.error("--scenario fleet runs its own three groups with remote_write, the local executor, "
                         "without history")
        fleet_target = args.target or "amp"  # two AMP workspaces of the local AWS; prometheus: two stand-ins
        if fleet_target == "amp" and (problem := local_amp_credentials_problem()):
            parser.error(problem)
        from promshift.local.demo_fleet import run_fleet_demo

        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        run_fleet_demo(nodes=args.nodes, airflow_port=args.airflow_port, report_root=args.report_root,
                       target_kind=fleet_target, profile=args.profile)
        return 0
    if args.scenario == "retire":  # every group of the local source baked, the source an agent, and back
        if args.group or args.deploy not in (None, REMOTE_WRITE, K8S_CR) or args.history is not None \
                or args.executor != "local":
            parser.error("--scenario retire migrates every group of the local source itself, with remote_write "
                         "(or k8s-cr with --target amp), the local executor, without history")
        retire_target = args.target or ("amp" if args.deploy == K8S_CR else "prometheus")
        if args.deploy == K8S_CR and retire_target != "amp":
            parser.error(f"--deploy {K8S_CR} needs --target amp")
        if retire_target == "amp" and (problem := local_amp_credentials_problem()):
            parser.error(problem)
        from promshift.local.demo_retire import run_retire

        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        session = start_session(nodes=args.nodes, airflow_port=args.airflow_port, target_kind=retire_target,
                                kubernetes=args.deploy == K8S_CR, profile=args.profile)
        print(run_retire(session, report_root=args.report_root, deploy=args.deploy or REMOTE_WRITE))
        return 0
    if args.scenario in LIFECYCLE_SCENARIOS:
        try:
            args.group, args.target, args.deploy = lifecycle_choices(args.scenario, args.group, args.target,
                                                                     args.deploy)
        except ValueError as exc:
            parser.error(str(exc))
    args.group, args.target = args.group or DEFAULT_GROUP, args.target or "prometheus"
    args.deploy = args.deploy or REMOTE_WRITE
    if args.deploy not in ANY_TARGET_DEPLOYS and args.target != "amp":
        parser.error(f"--deploy {args.deploy} needs --target amp")
    if args.scenario in AMP_ONLY_SCENARIOS and args.target != "amp":
        parser.error(f"--scenario {args.scenario} needs --target amp")
    if args.target == "amp" and (problem := local_amp_credentials_problem()):
        parser.error(problem)
    if args.history is not None:
        try:
            check_history(args.history, args.history_interval)
        except ValueError as exc:
            parser.error(str(exc))
    if args.executor == "celery" and (problem := CeleryServices.from_env(args.airflow_port).problem()):
        print(f"promshift-demo: {problem}", file=sys.stderr)
        return 2
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # keep prints ordered with logs
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        out = run_demo(group_name=args.group, scenario=args.scenario, nodes=args.nodes,
                       airflow_port=args.airflow_port, report_root=args.report_root, history_s=args.history,
                       history_interval_s=args.history_interval, target_kind=args.target,
                       deploy=args.deploy, executor=args.executor, profile=args.profile)
    except ServiceUnavailable as exc:  # a database of that name is not ours, or a service went away
        print(f"promshift-demo: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
