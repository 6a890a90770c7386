"""``make demo SCENARIO=fleet``: three groups from two clusters onto two workspaces, in two waves, one Airflow.

The stack runs a second cluster (its own fleet and source Prometheus) and a second target. By default
(``TARGET=amp``) the two targets back two AMP workspaces of the local AWS (``stack up --target amp --clusters 2``):
one control plane, one SigV4-checking front door routing ``/workspaces/<id>/...`` to each workspace's own
Prometheus, and a signing relay per workspace; ``promshift_target`` and ``promshift_target_b`` are two ``amp``
connections, one per workspace. With ``TARGET=prometheus`` the two targets are two plain Prometheus servers
standing in for the workspaces. The session's catalog is the repository's with per-group connections:

======================  ====  =====================================  =====================================
group                   wave  source (cluster)                       target (workspace)
======================  ====  =====================================  =====================================
gpu-utilization         1     ``promshift_source`` (cluster a)       ``promshift_target`` (workspace a)
gpu-memory              1     ``promshift_source_b`` (cluster b)     ``promshift_target_b`` (workspace b)
gpu-power-thermal       2     ``promshift_source_b`` (its wave's)    ``promshift_target`` (workspace a)
======================  ====  =====================================  =====================================

(gpu-clocks is left out, and gpu-power-thermal's ``depends_on`` too: wave 2 starts when wave 1 has
ended, by the demo's hand, not by the dependency's asset.) Wave 1's two groups run at once; each run
is approved through the REST API by an on-call engineer, as in ``make demo``. Each group's report
names its source and target connections and URLs.
"""

from __future__ import annotations

import logging
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from promshift.adapters.settings import REPO_ROOT
from promshift.local.airflow_lab import APPROVER_USERS
from promshift.local.demo import (
    APPROVAL_AFTER_POLLS,
    DEFAULT_TIMEOUT_S,
    DemoSession,
    config_sha256,
    print_logins,
    print_report,
    start_session,
    write_report,
)
from promshift.local.stack.local import LocalStack

log = logging.getLogger("promshift.local.demo_fleet")

FLEET_SCENARIO = "fleet"
SOURCE_A, SOURCE_B = "promshift_source", "promshift_source_b"
TARGET_A, TARGET_B = "promshift_target", "promshift_target_b"
# group -> (wave, source, target), in the order the waves start them.
FLEET_PLAN: dict[str, tuple[int, str, str]] = {
    "gpu-utilization": (1, SOURCE_A, TARGET_A),
    "gpu-memory": (1, SOURCE_B, TARGET_B),
    "gpu-power-thermal": (2, SOURCE_B, TARGET_A),
}
# Each wave (its groups at once) gets this long, the first counted from the session's start (Airflow's start-up
# included): measured on 2 loaded cores, a wave of two groups took about 10 minutes.
WAVE_TIMEOUT_S = 2 * DEFAULT_TIMEOUT_S


def write_fleet_catalog(home: Path) -> Path:
    """The fleet scenario's catalog under ``home``: the repository's, with each group's connections (gpu-memory's
    in the group, gpu-power-thermal's source from its wave), its golden dashboards and AMP prices beside it."""
    doc = yaml.safe_load((REPO_ROOT / "catalog" / "metric_groups.yaml").read_text(encoding="utf-8"))
    doc["waves"] = {2: {"source": SOURCE_B}}
    groups = {g["name"]: g for g in doc["groups"]}
    memory = groups["gpu-memory"]
    memory["source"], memory["target"] = SOURCE_B, TARGET_B
    groups["gpu-power-thermal"].pop("depends_on", None)
    doc["groups"] = [groups[name] for name in FLEET_PLAN]
    folder = home / "fleet-catalog"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    shutil.copytree(REPO_ROOT / "catalog" / "dashboards", folder / "dashboards")
    shutil.copyfile(REPO_ROOT / "catalog" / "amp_prices.yaml", folder / "amp_prices.yaml")
    path = folder / "metric_groups.yaml"
    path.write_text("# SCENARIO=fleet: the repository's catalog with per-group connections "
                    "(promshift.local.demo_fleet).\n" + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def fleet_connections(stack: LocalStack) -> dict[str, dict[str, Any]]:
    """The four connections: two clusters' source Prometheus, two workspaces (``amp`` connections, no
    credential: Airflow signs with the ``AWS_*`` pair of its environment) or their Prometheus stand-ins."""
    def source(url: str, config: Path) -> dict[str, Any]:
        return {"conn_type": "prometheus", "host": url, "extra": {"config_path": str(config)}}

    def target(url: str, remote_write_url: str) -> dict[str, Any]:
        return {"conn_type": "prometheus", "host": url,
                "extra": {"base_url": url, "remote_write_url": remote_write_url}}

    sources = {SOURCE_A: source(stack.source_url, stack.source_config_path),
               SOURCE_B: source(stack.source_b_url, stack.source_b_config_path)}
    if stack.config.target_kind == "amp":
        return {**sources, TARGET_A: {"conn_type": "amp", "extra": stack.amp_connection_extra()},
                TARGET_B: {"conn_type": "amp", "extra": stack.amp_connection_extra(second=True)}}
    return {**sources, TARGET_A: target(stack.target_url, stack.target_remote_write_url),
            TARGET_B: target(stack.target_b_url, stack.target_b_remote_write_url)}


def target_name(report: dict[str, Any]) -> str:
    """Where a group's report says it went: the AMP workspace (id, region) or the target's URL."""
    target = report.get("target") or {}
    if target.get("kind") == "amp":
        return f"AMP workspace {target.get('workspace_id')} ({target.get('region')})"
    return str(target.get("url"))


def start_fleet_session(*, nodes: int, airflow_port: int, target_kind: str = "amp") -> DemoSession:
    """A fresh stack with its second cluster and target (``amp``: two workspaces of the local AWS), and one
    Airflow reading the fleet catalog."""
    return start_session(nodes=nodes, airflow_port=airflow_port, clusters=2, catalog=write_fleet_catalog,
                         target_kind=target_kind)


def run_waves(session: DemoSession, *, report_root: Path, timeout_s: float = WAVE_TIMEOUT_S) -> dict[str, Path]:
    """Wave 1's groups at once, then wave 2's; each approved through the REST API; a report per group."""
    stack, airflow = session.stack, session.airflow
    session.set_connections(fleet_connections(stack))
    airflow.ensure_latency_pool(target_conn_ids=[TARGET_B])  # the second workspace's probes have their own pool
    config_of = {SOURCE_A: stack.source_config_path, SOURCE_B: stack.source_b_config_path}
    wave_starts = session.budget_from
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out: dict[str, Path] = {}
    for wave in sorted({wave for wave, _, _ in FLEET_PLAN.values()}):
        names = [name for name, (w, _, _) in FLEET_PLAN.items() if w == wave]
        groups = {name: session.group(name) for name in names}
        for name, group in groups.items():  # the session's catalog says what the plan says
            assert group.pair == FLEET_PLAN[name][1:], (name, group.pair)
        before = {name: config_sha256(config_of[groups[name].source]) for name in names}
        runs = {}
        for name in names:
            airflow.wait_for_dag(groups[name].dag_id)
            runs[name] = airflow.trigger(groups[name].dag_id)
        log.info("wave %s: %s", wave, ", ".join(f"{n} ({groups[n].source} -> {groups[n].target})" for n in names))
        finals = follow_runs(session, {name: (groups[name].dag_id, run_id) for name, run_id in runs.items()},
                             deadline=wave_starts + timeout_s)
        wave_starts = time.time()
        audit = session.audit()
        for name in names:
            path = config_of[groups[name].source]
            after = config_sha256(path)
            out_dir = (report_root / f"{stamp}-{name}-{FLEET_SCENARIO}").resolve()
            report = write_report(audit=audit, group=name, run_id=runs[name], out_dir=out_dir,
                                  source_config={"path": str(path), "sha256_before": before[name],
                                                 "sha256_after": after, "identical": before[name] == after},
                                  extra={"wave": wave, "dag_run_state": finals[name]})
            print_report(report)
            print(f"Connections: {report['connections']['source']} ({report['source'].get('url')}) -> "
                  f"{report['connections']['target']} ({target_name(report)})")
            out[name] = out_dir
    print(f"\nwall time {time.time() - session.started:.0f}s")
    print("\n".join(f"  wave {FLEET_PLAN[name][0]}  {name:<18} {FLEET_PLAN[name][1]} -> {FLEET_PLAN[name][2]}:  "
                    f"{path}" for name, path in out.items()))
    last = list(FLEET_PLAN)[-1]
    print_logins(airflow, session.group(last).dag_id, runs[last], mail=f"{len(stack.mail())} message(s)")
    return out


def follow_runs(session: DemoSession, runs: dict[str, tuple[str, str]], *, deadline: float) -> dict[str, str]:
    """Poll every run until it ends, answering each approval once it has waited a few polls; the final states."""
    airflow = session.airflow
    approver = APPROVER_USERS[0]
    waiting = dict.fromkeys(runs, 0)
    seen: dict[str, dict[str, str]] = {name: {} for name in runs}
    finals: dict[str, str] = {}
    while len(finals) < len(runs):
        if time.time() > deadline:
            raise RuntimeError(f"the fleet's runs did not finish in time: {sorted(set(runs) - set(finals))} still "
                               f"running; states {seen}")
        for name, (dag_id, run_id) in runs.items():
            if name in finals:
                continue
            states = airflow.task_states(dag_id, run_id)
            for task, state in states.items():
                if seen[name].get(task) != state:
                    log.info("  %-18s %-18s %s", name, task, state)
            seen[name] = states
            waiting[name] = waiting[name] + 1 if states.get("approval") == "awaiting_input" else 0
            if waiting[name] == APPROVAL_AFTER_POLLS:
                log.info("%s: approval requested; %s answers through the REST API", name, approver)
                airflow.answer_approval(dag_id, run_id, "approval", user=approver, choice="Approve",
                                        comment=f"{name}: evidence reviewed in the fleet demo")
            state = airflow.run_state(dag_id, run_id)
            if state in ("success", "failed"):
                finals[name] = state
        time.sleep(3)
    return finals


def run_fleet_demo(*, nodes: int, airflow_port: int, report_root: Path, target_kind: str = "amp") -> dict[str, Path]:
    """``make demo SCENARIO=fleet``: the session and both waves; Airflow is left running with the stack."""
    session = start_fleet_session(nodes=nodes, airflow_port=airflow_port, target_kind=target_kind)
    return run_waves(session, report_root=report_root)
