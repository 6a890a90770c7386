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

(gpu-clocks is left out.) Wave 1's two groups are started by hand and run at once, in their two targets'
migration DAGs (``promshift__migrate__<target>``, the group chosen in the form). gpu-power-thermal keeps its
``depends_on: [gpu-utilization]``: when gpu-utilization cuts over, its cutover task emits
``promshift://group/gpu-utilization/cut_over`` through the ``promshift-cut-over`` alias, the ``promshift__waves``
DAG (unpaused by the demo, scheduled on that asset) runs, and its mapped ``start`` triggers gpu-power-thermal in
``promshift__migrate__promshift_target`` as run ``wave__gpu-power-thermal__<digest>``, while gpu-memory may still
be running. Each run is approved through the REST API by an on-call engineer, as in ``make demo``. Each group's
report names its source and target connections and URLs, and how its run was started (``started``).
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
from promshift.core.waves import WAVE_RUN_PREFIX
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
from promshift.orchestration.dag_factory import WAVES_DAG_ID

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
# How long the waves DAG may take to start a dependent group once the runs before it have ended.
WAVES_START_WAIT_S = 300.0


def write_fleet_catalog(home: Path) -> Path:
    """The fleet scenario's catalog under ``home``: the repository's, with each group's connections (gpu-memory's
    in the group, gpu-power-thermal's source from its wave; its ``depends_on`` kept), its golden dashboards and
    AMP prices beside it."""
    doc = yaml.safe_load((REPO_ROOT / "catalog" / "metric_groups.yaml").read_text(encoding="utf-8"))
    doc["waves"] = {2: {"source": SOURCE_B}}
    groups = {g["name"]: g for g in doc["groups"]}
    memory = groups["gpu-memory"]
    memory["source"], memory["target"] = SOURCE_B, TARGET_B
    # Started by the waves DAG when gpu-utilization has cut over (the repository's dependency, kept).
    assert groups["gpu-power-thermal"].get("depends_on") == ["gpu-utilization"], groups["gpu-power-thermal"]
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


def start_fleet_session(*, nodes: int, airflow_port: int, target_kind: str = "amp",
                        profile: str | None = None) -> DemoSession:
    """A fresh stack with its second cluster and target (``amp``: two workspaces of the local AWS), and one
    Airflow reading the fleet catalog (with ``profile``, else ``demo``)."""
    return start_session(nodes=nodes, airflow_port=airflow_port, clusters=2, catalog=write_fleet_catalog,
                         target_kind=target_kind, profile=profile)


def run_waves(session: DemoSession, *, report_root: Path, timeout_s: float = WAVE_TIMEOUT_S) -> dict[str, Path]:
    """Wave 1's groups started by hand, at once; each later group started by ``promshift__waves`` once its
    dependencies have cut over; each approved through the REST API; a report per group."""
    stack, airflow = session.stack, session.airflow
    session.set_connections(fleet_connections(stack))
    config_of = {SOURCE_A: stack.source_config_path, SOURCE_B: stack.source_b_config_path}
    groups = {name: session.group(name) for name in FLEET_PLAN}
    for name, group in groups.items():  # the session's catalog says what the plan says
        assert group.pair == FLEET_PLAN[name][1:], (name, group.pair)
        assert (FLEET_PLAN[name][0] > 1) == bool(group.depends_on), (name, group.depends_on)
    by_hand = [name for name, (wave, _, _) in FLEET_PLAN.items() if wave == 1]
    before = {name: config_sha256(config_of[group.source]) for name, group in groups.items()}
    # Scheduled on the cut_over assets of the groups others depend on: it must run when gpu-utilization cuts over.
    airflow.wait_for_dag(WAVES_DAG_ID)
    airflow.unpause(WAVES_DAG_ID)
    runs: dict[str, tuple[str, str]] = {}
    for name in by_hand:
        airflow.wait_for_dag(groups[name].dag_id)
        runs[name] = (groups[name].dag_id, airflow.trigger_group(groups[name]))
    log.info("wave 1, by hand: %s; then %s: %s", ", ".join(f"{n} ({groups[n].source} -> {groups[n].target})"
                                                           for n in by_hand), WAVES_DAG_ID,
             ", ".join(f"{n} after {', '.join(groups[n].depends_on)}" for n in groups if n not in by_hand))
    finals = follow_runs(session, runs, deadline=session.budget_from + timeout_s,
                         started_by_waves={n: groups[n].dag_id for n in groups if n not in by_hand},
                         wave_timeout_s=timeout_s)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    audit = session.audit()
    out: dict[str, Path] = {}
    for name, group in groups.items():
        path = config_of[group.source]
        after = config_sha256(path)
        dag_id, run_id = runs[name]
        started = {"by": "hand" if name in by_hand else WAVES_DAG_ID, "dag_id": dag_id, "run_id": run_id}
        if name not in by_hand:
            started.update(waves_start(airflow, name))
        out_dir = (report_root / f"{stamp}-{name}-{FLEET_SCENARIO}").resolve()
        report = write_report(audit=audit, group=name, run_id=run_id, out_dir=out_dir,
                              source_config={"path": str(path), "sha256_before": before[name],
                                             "sha256_after": after, "identical": before[name] == after},
                              extra={"wave": FLEET_PLAN[name][0], "dag_run_state": finals[name], "started": started})
        print_report(report)
        print(f"Connections: {report['connections']['source']} ({report['source'].get('url')}) -> "
              f"{report['connections']['target']} ({target_name(report)}); started by {started['by']}")
        out[name] = out_dir
    print(f"\nwall time {time.time() - session.started:.0f}s")
    print("\n".join(f"  wave {FLEET_PLAN[name][0]}  {name:<18} {FLEET_PLAN[name][1]} -> {FLEET_PLAN[name][2]}:  "
                    f"{path}" for name, path in out.items()))
    last = list(FLEET_PLAN)[-1]
    print_logins(airflow, runs[last][0], runs[last][1], mail=f"{len(stack.mail())} message(s)")
    return out


def waves_start(airflow: Any, group: str) -> dict[str, Any]:
    """How ``promshift__waves`` started ``group``: its run (and what started it) whose mapped ``start`` task
    instance is named by the group (``map_index_template``)."""
    for run in reversed(airflow.dag_runs(WAVES_DAG_ID)):
        for ti in airflow.task_instances(WAVES_DAG_ID, run["dag_run_id"]):
            if ti["task_id"] == "start" and ti.get("rendered_map_index") == group:
                return {"waves_run_id": run["dag_run_id"], "waves_run_type": run.get("run_type"),
                        "waves_run_state": run.get("state"), "start_state": ti.get("state"),
                        "start_map_index": ti.get("rendered_map_index")}
    return {"waves_run_id": None}


def wave_run(airflow: Any, dag_id: str, group: str) -> str | None:
    """The run of ``dag_id`` the waves DAG started for ``group`` (run id ``wave__<group>__...``), if any yet."""
    prefix = f"{WAVE_RUN_PREFIX}{group}__"
    found = [r["dag_run_id"] for r in airflow.dag_runs(dag_id) if str(r["dag_run_id"]).startswith(prefix)]
    return found[-1] if found else None


def follow_runs(session: DemoSession, runs: dict[str, tuple[str, str]], *, deadline: float,
                started_by_waves: dict[str, str] | None = None, wave_timeout_s: float = WAVE_TIMEOUT_S
                ) -> dict[str, str]:
    """Poll every run until it ends, answering each approval once it has waited a few polls; the final states.

    ``started_by_waves``: group -> migration DAG of groups the waves DAG starts; each is looked for (and added to
    ``runs``) until found, and gets ``wave_timeout_s`` from then. The first deadline is the by-hand runs'."""
    airflow = session.airflow
    approver = APPROVER_USERS[0]
    pending = dict(started_by_waves or {})
    deadlines = dict.fromkeys(runs, deadline)
    waiting = dict.fromkeys(runs, 0)
    seen: dict[str, dict[str, str]] = {name: {} for name in runs}
    finals: dict[str, str] = {}
    idle_since: float | None = None
    while len(finals) < len(runs) + len(pending):
        for name, dag_id in list(pending.items()):
            run_id = wave_run(airflow, dag_id, name)
            if run_id is not None:
                log.info("%s started %s: %s run %s", WAVES_DAG_ID, name, dag_id, run_id)
                runs[name] = (dag_id, run_id)
                deadlines[name], waiting[name], seen[name] = time.time() + wave_timeout_s, 0, {}
                del pending[name]
        if pending and len(finals) == len(runs):
            # Every run followed has ended: the waves DAG has this long to start the rest (its run follows the
            # cut-over's asset event by a scheduler loop or two), else it never will.
            idle_since = idle_since or time.time()
            if time.time() - idle_since > WAVES_START_WAIT_S:
                raise RuntimeError(f"{WAVES_DAG_ID} started no run for {sorted(pending)} in "
                                   f"{WAVES_START_WAIT_S:.0f}s after the runs before ended ({finals})")
        else:
            idle_since = None
        late = [name for name in runs if name not in finals and time.time() > deadlines[name]]
        if late:
            raise RuntimeError(f"the fleet's runs did not finish in time: {sorted(late)} still running; "
                               f"states {seen}")
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


def run_fleet_demo(*, nodes: int, airflow_port: int, report_root: Path, target_kind: str = "amp",
                   profile: str | None = None) -> dict[str, Path]:
    """``make demo SCENARIO=fleet``: the session and both waves; Airflow is left running with the stack."""
    session = start_fleet_session(nodes=nodes, airflow_port=airflow_port, target_kind=target_kind, profile=profile)
    return run_waves(session, report_root=report_root)
