"""``make demo SCENARIO=retire``: every group of the local source migrated and baked, then the source retired.

The strangler's end on the ``remote_write`` path (issue 36, docs/lifecycle.md "Retire the source"): once every
group the source carries has baked, the source becomes a Prometheus agent that only forwards.

1. Every group of ``promshift_source`` in the session's catalog that has not cut over yet is migrated by the
   same path as ``make demo`` (its target's migration DAG, approved over the REST API), on ``remote_write``:
   the groups without a dependency started by hand at once, the others by ``promshift__waves`` as their
   dependencies cut over (their ``depends_on`` kept, as ``SCENARIO=fleet`` does). ``promshift__bake_watch`` is
   unpaused and bakes each one (the ``demo`` profile: three clean checks a minute apart), as in
   ``SCENARIO=lifecycle``. Nothing is written to the audit log by the demo: every stage is the DAGs'.
2. ``promshift__retire`` (the source chosen in its form). Its ``consolidate`` task first merges every baked group's
   ``remote_write`` entry into one by the lossless queue swap (the agent then forwards through one queue); the
   demo counts, itself, every merged group's samples on the target across the swap against the source's (0 lost)
   before it answers. A plain Prometheus target is given an out-of-order window first
   (``storage.tsdb.out_of_order_time_window``, as a self-hosted target needs for any swap; AMP has 60 s by
   default). The approval shows what retiring ends and the merge. The demo's
   approver (not the trigger user) accepts exactly the names the prepare task recorded (``source_retire_prepared``
   in the audit log), as an approver who read them would; the report lists them.
3. The demo measures, itself, on the running processes: the source's ``/-/ready`` ("Prometheus Agent"), its
   answer to a query (422 on an agent: nothing stored), and every group's newest samples on the target after
   the switch (a query of the target's own Prometheus).
4. ``promshift__unretire``; the demo compares the source's config bytes and command line (``/proc/<pid>/cmdline``)
   with those it read before the retire.

``report.json``'s ``retire`` block holds ``mode``, ``target_receiving``, ``source_storing`` and
``undo_byte_identical``, each from those measurements, and ``consolidated`` (``entries_before``, ``entries_after``
from the source's loaded config, ``members`` and the swap's ``state`` from the audit, ``samples_lost`` counted). The
undo is compared with the server as it was right before the switch (the merged entry in it: the swap is not the
retire's to undo).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
import yaml

from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.source_mode import probe_mode
from promshift.core.catalog import MetricGroup
from promshift.core.deploy_kinds import K8S_CR, REMOTE_WRITE
from promshift.core.events import EventKind
from promshift.core.promql import mark_own_read, promql_string
from promshift.core.render import is_promshift_name, remote_write_names
from promshift.core.stages import CUT_OVER_OR_LATER, Stage
from promshift.local.airflow_lab import APPROVER_USERS
from promshift.local.demo import (
    APPROVAL_AFTER_POLLS,
    DEFAULT_TIMEOUT_S,
    DemoSession,
    print_logins,
    source_connection,
    target_connection,
)
from promshift.local.demo_fleet import follow_runs
from promshift.local.demo_lifecycle import BAKE_WATCH_DAG_ID
from promshift.local.stack.local import LocalStack
from promshift.local.stack.spec import K8S_NAME, K8S_NAMESPACE
from promshift.orchestration.dag_factory import RETIRE_DAG_ID, UNRETIRE_DAG_ID, WAVES_DAG_ID
from promshift.orchestration.wiring import SOURCE_PARAM
from promshift.steps.retire import BAKED_STAGES, source_group

log = logging.getLogger("promshift.local.demo_retire")

RETIRE_SCENARIO = "retire"
SOURCE_CONN = "promshift_source"
# Migrations: the first wave's budget counts from the session's start (Airflow's start-up included), as fleet's.
MIGRATE_TIMEOUT_S = 2 * DEFAULT_TIMEOUT_S
# After the last cut-over: the bake period plus a few watch intervals and a loaded scheduler's slack.
BAKE_SLACK_S = 300.0
RETIRE_TIMEOUT_S = 600.0
DEPLOY_WAIT_S = 600.0
# After the switch, the target must hold this many of a group's scrapes newer than it (the demo's own check).
SCRAPES_AFTER = 2
# The swap's window counted on both sides: from this long before its add to this long after its removal, read once
# the target has every sample of it (a partial batch waits batch_send_deadline, 5 s by default, then a scrape).
SWAP_MARGIN_S = 10.0
DELIVERY_S = 12.0
# A plain Prometheus target's out-of-order window for the swap's overlap (what ``core.queues.overlap_refusal`` asks).
TARGET_OUT_OF_ORDER_WINDOW = "10m"


def retire_connections(stack: LocalStack, deploy: str = REMOTE_WRITE) -> dict[str, dict[str, Any] | None]:
    """The scenario's connections: the source on the file path with the lab's process control (``mode_switch``,
    LAB ONLY), or for ``k8s-cr`` its ``Prometheus`` resource (the operator stand-in switches the process); its
    query log (what retiring ends reads it); the target's ``remote_write`` connection; no ``grafana_default``
    (the scenario switches no dashboard)."""
    source = source_connection(stack, deploy)
    if deploy == REMOTE_WRITE:
        source["extra"]["mode_switch"] = stack.source_mode_extra()
    source["extra"]["query_log"] = str(stack.source_query_log_path)
    source["extra"]["scrape_interval"] = stack.config.scrape_interval
    return {SOURCE_CONN: source, "promshift_target": target_connection(stack, REMOTE_WRITE), "grafana_default": None}


def start_order(groups: Sequence[MetricGroup], stages: Mapping[str, Stage]) -> tuple[list[str], list[str]]:
    """The groups still to migrate: (started by hand now, started by the waves DAG later). A group is started by
    hand when every group it depends on has cut over already, else by ``promshift__waves`` once they have;
    groups cut over (or later) are not migrated again."""
    todo = [g for g in groups if stages.get(g.name, Stage.PLANNED) not in CUT_OVER_OR_LATER]
    by_hand = [g.name for g in todo
               if all(stages.get(d, Stage.PLANNED) in CUT_OVER_OR_LATER for d in g.depends_on)]
    return by_hand, [g.name for g in todo if g.name not in by_hand]


def wait_deployed(airflow: Any, dag_id: str, run_id: str, *, timeout_s: float, poll_s: float = 3.0) -> str:
    """Wait until the run's ``deploy_dual_write`` has ended (or the run has): a run snapshots the source config
    when it validates and refuses to deploy over a config changed since, so two runs on one source start one
    after the other's deploy (measured: two triggered at once, the second refused "changed since the snapshot
    was taken"). Their warm-ups, gates and approvals still overlap."""
    deadline = time.time() + timeout_s
    while True:
        state = airflow.task_states(dag_id, run_id).get("deploy_dual_write")
        if state in ("success", "failed", "upstream_failed", "skipped") \
                or airflow.run_state(dag_id, run_id) in ("success", "failed"):
            return str(state)
        if time.time() > deadline:
            raise TimeoutError(f"{run_id}: deploy_dual_write not done after {timeout_s:.0f}s ({state})")
        time.sleep(poll_s)


def target_samples_after(client: PrometheusClient, selector: str, after: float, *, window_s: int = 120
                         ) -> list[int]:
    """For each series of ``selector`` on the target, how many of its samples are newer than ``after``."""
    result = client.query(f"{selector}[{window_s}s]")
    return [sum(1 for t, _ in series.points if t > after) for series in result.series]


def receiving_summary(counts: Sequence[int]) -> dict[str, int]:
    """A group's series on the target: how many, how many have ``SCRAPES_AFTER`` samples newer than the switch,
    and the most any one has."""
    return {"series": len(counts), "series_with_scrapes_after": sum(1 for n in counts if n >= SCRAPES_AFTER),
            "most_after": max(counts, default=0)}


def source_query_status(url: str) -> tuple[int, str]:
    """The source's answer to an instant query: 200 on a server (it stores), 422 on an agent."""
    session = requests.Session()
    session.trust_env = False
    try:
        # promshift's own read (marked): the retire's re-check of the query log must not count the demo's probe
        answer = session.get(f"{url}/api/v1/query", params={"query": mark_own_read("up")}, timeout=10)
    except requests.RequestException as exc:
        return 0, f"{type(exc).__name__}: {exc}"[:200]
    return answer.status_code, answer.text[:200]


def wait_baked(audit: Any, names: Sequence[str], *, timeout_s: float, poll_s: float = 5.0) -> dict[str, str]:
    """Poll the audit log until every group is baked (or later); the stages. Raises on a rolled-back group or
    when the time is up."""
    deadline, last = time.time() + timeout_s, None
    while True:
        stages = {n: audit.stage_of(n) for n in names}
        shown = {n: s.value for n, s in stages.items()}
        if shown != last:
            log.info("bake watch: %s", ", ".join(f"{n} {s}" for n, s in shown.items()))
            last = shown
        if all(s in BAKED_STAGES for s in stages.values()):
            return shown
        failed = [n for n, s in stages.items() if s in (Stage.ROLLED_BACK_READS, Stage.ROLLED_BACK, Stage.FAILED)]
        if failed:
            raise RuntimeError(f"not every group baked: {', '.join(f'{n} {shown[n]}' for n in failed)}")
        if time.time() > deadline:
            raise TimeoutError(f"not every group baked in {timeout_s:.0f}s: {shown}")
        time.sleep(poll_s)


def prepared_names(audit: Any, conn_id: str) -> list[str]:
    """What retiring ends, by name, as the prepare task recorded it (the newest ``source_retire_prepared``)."""
    prepared = [e for e in audit.events(group=source_group(conn_id)) if e.kind == EventKind.SOURCE_RETIRE_PREPARED]
    return list(prepared[-1].evidence_data.get("names") or []) if prepared else []


def follow_approval(airflow: Any, dag_id: str, run_id: str, *, timeout_s: float,
                    answer: Callable[[], dict[str, Any]]) -> str:
    """Follow a run, answering its ``approval`` once it has waited a few polls (again after a retry)."""
    polls = 0

    def on_state(states: dict[str, str]) -> None:
        nonlocal polls
        polls = polls + 1 if states.get("approval") == "awaiting_input" else 0
        if polls == APPROVAL_AFTER_POLLS:
            airflow.answer_approval(dag_id, run_id, "approval", **answer())

    return str(airflow.follow(dag_id, run_id, timeout_s=timeout_s, on_state=on_state))


def measure_receiving(client: PrometheusClient, groups: Sequence[MetricGroup], after: float, *, scrape_s: float,
                      timeout_s: float = 120.0) -> dict[str, dict[str, int]]:
    """Each group's series on the target and their samples newer than ``after`` (``receiving_summary``), polled
    until every series of every group has ``SCRAPES_AFTER`` of them (two scrapes of the same series after the
    switch: the agent forwards it) or the time is up."""
    deadline = time.time() + max(timeout_s, 6 * scrape_s)
    while True:
        seen = {g.name: receiving_summary(target_samples_after(client, g.selector(), after)) for g in groups}
        if all(is_receiving(v) for v in seen.values()) or time.time() > deadline:
            return seen
        time.sleep(max(1.0, scrape_s / 2))


def is_receiving(summary: Mapping[str, int]) -> bool:
    """A group is received when it has series on the target and every one has two samples after the switch."""
    return summary["series"] > 0 and summary["series_with_scrapes_after"] == summary["series"]


def give_target_out_of_order_window(stack: LocalStack) -> bool:
    """A plain Prometheus target (not the local AMP, whose workspace has AMP's default 60 s window) gets
    ``storage.tsdb.out_of_order_time_window`` appended to its config and is reloaded: a merge swap's overlap sends
    each sample twice, and without the window the swap is refused (nothing edited). True when the config changed."""
    if stack.config.target_kind == "amp":
        return False
    text = stack.target_config_path.read_text(encoding="utf-8")
    document = yaml.safe_load(text) or {}
    if "storage" in document:
        return False
    stack.target_config_path.write_text(text + ("" if text.endswith("\n") else "\n")
                                        + f"storage:\n  tsdb:\n    out_of_order_time_window: "
                                          f"{TARGET_OUT_OF_ORDER_WINDOW}\n", encoding="utf-8")
    session = requests.Session()
    session.trust_env = False
    session.post(f"{stack.target_url}/-/reload", timeout=30).raise_for_status()
    log.info("the lab's target Prometheus now ingests out of order within %s (a merge swap's overlap needs it)",
             TARGET_OUT_OF_ORDER_WINDOW)
    return True


def promshift_entries(config_text: str) -> list[str]:
    """The promshift ``remote_write`` names of a loaded source config."""
    return [n for n in remote_write_names(config_text) if is_promshift_name(n)]


def samples_in(client: PrometheusClient, group: MetricGroup, start: float, end: float) -> int:
    """How many samples ``client`` holds of ``group``'s series in ``(start, end]``, counted per metric name (the
    names it holds in that window): ``count_over_time`` drops ``__name__`` and a group's metrics share their label
    sets, so one query over several names is refused ("vector cannot contain metrics with the same labelset", seen
    in make e2e for a list of names and for a regex alike)."""
    names = client.label_values("__name__", group.selector(), start=start, end=end)
    return sum(int(client.scalar(f"sum(count_over_time({{__name__={promql_string(name)}}}[{int(end - start)}s]))",
                                 at=end) or 0) for name in sorted(set(names)))


def count_swap(source: PrometheusClient, target: PrometheusClient, groups: Sequence[MetricGroup], *, added_at: float,
               done_at: float) -> dict[str, Any]:
    """Each group's samples on the target across a swap (``SWAP_MARGIN_S`` before its add, which began at
    ``added_at``, to as long after ``done_at``, a moment its old entries were gone) against the source's own count,
    once the target holds them all; ``lost`` sums the shortfalls."""
    start, end = added_at - SWAP_MARGIN_S, done_at + SWAP_MARGIN_S
    wait = end + DELIVERY_S - time.time()
    if wait > 0:
        time.sleep(wait)
    counted = {g.name: {"source": samples_in(source, g, start, end),
                        "target": samples_in(target, g, start, end)} for g in groups}
    lost = sum(max(0, c["source"] - c["target"]) for c in counted.values())
    return {"window": [round(start, 3), round(end, 3)], "per_group": counted, "lost": lost}


def swap_added_at(audit: Any, group: str, run_id: str) -> float | None:
    """When the newest swap recorded under ``group`` in ``run_id`` began (its ``queue_swap_added``: the clock read
    before the add was written), None when the run added none."""
    added = [e for e in audit.events(group=group) if e.run_id == run_id and e.kind == EventKind.QUEUE_SWAP_ADDED]
    return added[-1].at.timestamp() if added else None


def measure_consolidation(audit: Any, run_id: str, groups: Sequence[MetricGroup], source: PrometheusClient,
                          target: PrometheusClient, *, entries_before: Sequence[str]) -> dict[str, Any]:
    """What the retire's ``consolidate`` task did to the source's write queues, measured before the switch: the
    promshift entries the source has loaded before the run and now, the members and state of the consolidation (its
    ``source_queues_consolidated`` record) and, for a swap, every member's samples counted on both sides across it
    (``count_swap``). ``summary`` goes in the report's ``retire`` block, ``detail`` beside it."""
    found = [e for e in audit.events(group=source_group(SOURCE_CONN))
             if e.run_id == run_id and e.kind == EventKind.SOURCE_QUEUES_CONSOLIDATED]
    entries_after = promshift_entries(source.config_text())
    if not found:
        return {"summary": {"state": "not run", "entries_before": len(entries_before),
                            "entries_after": len(entries_after), "members": [], "samples_lost": None},
                "detail": None}
    record = found[-1].evidence_data
    results = list((record.get("targets") or {}).values())
    members = sorted(m for r in results for m in r.get("members") or [])
    states = sorted({str(r.get("state")) for r in results})
    counted = None
    added_at = swap_added_at(audit, source_group(SOURCE_CONN), run_id)
    if "merged" in states and added_at is not None:
        counted = count_swap(source, target, [g for g in groups if g.name in members], added_at=added_at,
                             done_at=found[-1].at.timestamp())
    summary = {"state": ",".join(states) or "no target", "entries_before": len(entries_before),
               "entries_after": len(entries_after), "members": members,
               "samples_lost": None if counted is None else counted["lost"]}
    log.info("write queues before the switch: %d promshift entries -> %d (%s); samples lost across the swap: %s",
             len(entries_before), len(entries_after), "; ".join(record.get("lines") or []), summary["samples_lost"])
    return {"summary": summary, "detail": {"lines": record.get("lines"), "entries_before": list(entries_before),
                                           "entries_after": entries_after, "targets": record.get("targets"),
                                           "counted": counted}}


def resource_state(stack: LocalStack) -> dict[str, Any]:
    """k8s-cr: which of the two resources the contract server holds now, and the ``Prometheus`` one as its owner
    wrote it (None when it is gone)."""
    from kubernetes.client import ApiClient, Configuration, CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    from promshift.core.retire import user_content

    custom = CustomObjectsApi(ApiClient(Configuration(host=stack.kubernetes_url)))
    found: dict[str, Any] = {}
    for kind, version in (("prometheuses", "v1"), ("prometheusagents", "v1alpha1")):
        try:
            found[kind] = user_content(custom.get_namespaced_custom_object(
                "monitoring.coreos.com", version, K8S_NAMESPACE, kind, K8S_NAME))
        except ApiException as exc:
            if exc.status != 404:
                raise
            found[kind] = None
    return found


def run_retire(session: DemoSession, *, report_root: Path, migrate_timeout_s: float = MIGRATE_TIMEOUT_S,
               deploy: str = REMOTE_WRITE) -> Path:
    """The scenario in a running session (alone, or after others: groups already cut over are not migrated
    again); returns the report directory. ``deploy="k8s-cr"`` (a session with the k8s component): the groups'
    entries go into the ``Prometheus`` resource and the retire turns it into a ``PrometheusAgent``."""
    if deploy not in (REMOTE_WRITE, K8S_CR):
        raise ValueError(f"the retire scenario runs on {REMOTE_WRITE} or {K8S_CR}, not {deploy!r}")
    if deploy == K8S_CR and not session.config.kubernetes:
        raise ValueError(f"deploy {K8S_CR!r} needs a session started with kubernetes=True")
    started = time.time()
    first = session.scenarios_run == 0
    session.scenarios_run += 1
    stack, airflow, audit = session.stack, session.airflow, session.audit()
    catalog = [session.group(g.name) for g in _catalog_groups(session)]
    groups = [g for g in catalog if g.source == SOURCE_CONN]
    if not groups:
        raise ValueError(f"no group of the session's catalog reads from {SOURCE_CONN}")
    session.set_connections(retire_connections(stack, deploy))
    stages = {g.name: audit.stage_of(g.name) for g in groups}
    by_hand, by_waves = start_order(groups, stages)
    log.info("retire: %d group(s) on %s; migrating %s by hand%s", len(groups), SOURCE_CONN,
             ", ".join(by_hand) or "none", f", then {', '.join(by_waves)} by {WAVES_DAG_ID}" if by_waves else "")
    airflow.wait_for_dag(BAKE_WATCH_DAG_ID)
    airflow.unpause(BAKE_WATCH_DAG_ID)  # bakes each group as it cuts over
    finals: dict[str, str] = {}
    runs: dict[str, tuple[str, str]] = {}
    if by_waves:
        airflow.wait_for_dag(WAVES_DAG_ID)
        airflow.unpause(WAVES_DAG_ID)
    for name in by_hand:
        if runs:  # one source config: the next run starts once the one before has written its entry
            wait_deployed(airflow, *runs[list(runs)[-1]], timeout_s=DEPLOY_WAIT_S)
        group = next(g for g in groups if g.name == name)
        airflow.wait_for_dag(group.dag_id)
        runs[name] = (group.dag_id, airflow.trigger_group(group))
    if runs or by_waves:
        finals = follow_runs(session, runs, deadline=(session.budget_from if first else started) + migrate_timeout_s,
                             started_by_waves={n: next(g for g in groups if g.name == n).dag_id for n in by_waves},
                             wave_timeout_s=migrate_timeout_s)
    not_cut = [n for n in stages if audit.stage_of(n) not in CUT_OVER_OR_LATER]
    if not_cut:
        raise RuntimeError(f"retire: {', '.join(not_cut)} did not cut over ({finals})")
    longest_bake = max(g.bake.period_s + 3 * g.bake.interval_s for g in groups)
    baked = wait_baked(audit, [g.name for g in groups], timeout_s=longest_bake + BAKE_SLACK_S)
    log.info("every group of %s baked: %s", SOURCE_CONN, baked)

    switch = stack.source_mode_switch()  # read only here: the demo's own view of the process (pid file)
    source_client, target_client = PrometheusClient(stack.source_url), PrometheusClient(stack.target_url)
    give_target_out_of_order_window(stack)
    entries_before = promshift_entries(source_client.config_text())
    before: dict[str, Any] = {}
    consolidated: dict[str, Any] = {}

    def read_before() -> None:
        """The server right before the switch (after the consolidation): what the undo must give back."""
        before.update(config=stack.source_config_path.read_bytes(), argv=tuple(switch.control.argv()),
                      resources=resource_state(stack) if deploy == K8S_CR else None,
                      mode=probe_mode(stack.source_url), status=source_query_status(stack.source_url)[0])
        log.info("source before the switch: %s, answers a query with %s, config sha256 %s", before["mode"],
                 before["status"], _sha(before["config"]))

    approver = APPROVER_USERS[0]
    accepted: list[str] = []

    def answer() -> dict[str, Any]:
        if not consolidated:
            consolidated.update(measure_consolidation(audit, retire_run, groups, source_client, target_client,
                                                      entries_before=entries_before))
        read_before()
        accepted[:] = prepared_names(audit, SOURCE_CONN)
        log.info("retire approval: %s accepts, by name, the %d thing(s) retiring ends: %s", approver, len(accepted),
                 ", ".join(accepted[:12]) + (" …" if len(accepted) > 12 else ""))
        return {"user": approver, "choice": "Approve", "params": {"accept": ",".join(accepted)},
                "comment": "every group baked; what retiring ends read and accepted by name in the demo"}

    airflow.wait_for_dag(RETIRE_DAG_ID)
    retire_run = airflow.trigger(RETIRE_DAG_ID, conf={SOURCE_PARAM: SOURCE_CONN})
    retire_state = follow_approval(airflow, RETIRE_DAG_ID, retire_run, timeout_s=RETIRE_TIMEOUT_S, answer=answer)
    if not before:  # never asked (a task before the approval failed): the server as it is now
        read_before()
    config_before, argv_before, resources_before = before["config"], before["argv"], before["resources"]
    mode_before, status_before = before["mode"], before["status"]
    retired = _last(audit, EventKind.SOURCE_RETIRED)

    # The demo's own measurements, on the running processes. Samples are counted from a moment the source was
    # already an agent (its /-/ready said so before it), so none of them was written by the server.
    mode_after = probe_mode(stack.source_url)
    agent_since = time.time()
    status_after, answer_after = source_query_status(stack.source_url)
    scrape_s = max(g.scrape_interval_s for g in groups)
    received = measure_receiving(PrometheusClient(stack.target_url), groups, agent_since, scrape_s=scrape_s)
    still_agent = probe_mode(stack.source_url) == "agent"
    resources_retired = resource_state(stack) if deploy == K8S_CR else None
    receiving = mode_after == "agent" and still_agent and all(is_receiving(v) for v in received.values())
    log.info("after the retire: source %s, answers a query with %s; each group's series on the target with two "
             "samples newer than a moment it was an agent: %s",
             mode_after, status_after, received)

    unretire_run = airflow.trigger(UNRETIRE_DAG_ID, conf={SOURCE_PARAM: SOURCE_CONN, "reason": "demo: undo"})
    unretire_state = airflow.follow(UNRETIRE_DAG_ID, unretire_run, timeout_s=RETIRE_TIMEOUT_S)
    config_undone, argv_undone = stack.source_config_path.read_bytes(), tuple(switch.control.argv())
    mode_undone, (status_undone, _) = probe_mode(stack.source_url), source_query_status(stack.source_url)
    identical = config_undone == config_before and argv_undone == argv_before
    resources_undone = resource_state(stack) if deploy == K8S_CR else None
    if resources_before is not None:  # and the Prometheus resource as its owner wrote it, the agent gone
        from promshift.core.retire import canonical

        before_cr, after_cr = resources_before["prometheuses"], (resources_undone or {}).get("prometheuses")
        identical = identical and after_cr is not None and canonical(after_cr) == canonical(before_cr) \
            and (resources_undone or {}).get("prometheusagents") is None
    log.info("after the undo: source %s, answers a query with %s; config and command line identical: %s",
             mode_undone, status_undone, identical)

    unretired = _last(audit, EventKind.SOURCE_UNRETIRED)
    report = {
        "scenario": RETIRE_SCENARIO, "source": {"connection": SOURCE_CONN, "url": stack.source_url},
        "target": {"kind": session.target_kind, "url": stack.target_url},
        "groups": {n: audit.stage_of(n).value for n in stages},
        "migrated": {n: {"dag_id": d, "run_id": r, "state": finals.get(n)} for n, (d, r) in runs.items()},
        "retire": {
            "mode": mode_after,
            "target_receiving": receiving,
            "source_storing": status_after == 200,
            "undo_byte_identical": identical,
            "consolidated": consolidated.get("summary"),
        },
        "consolidation": consolidated.get("detail"),
        "measured": {
            "before": {"mode": mode_before, "query_status": status_before, "config_sha256": _sha(config_before),
                       "argv": list(argv_before)},
            "retired": {"mode": mode_after, "query_status": status_after, "query_answer": answer_after,
                        "target_since_agent": received, "agent_since": agent_since,
                        "agent_throughout": still_agent},
            "undone": {"mode": mode_undone, "query_status": status_undone, "config_sha256": _sha(config_undone),
                       "argv_identical": argv_undone == argv_before,
                       "config_identical": config_undone == config_before},
        },
        "deploy": deploy,
        "resources": None if resources_before is None else {
            "before": _kinds(resources_before), "retired": _kinds(resources_retired),
            "undone": _kinds(resources_undone),
            "agent_spec_fields": sorted(((resources_retired or {}).get("prometheusagents") or {}).get("spec") or {}),
            "prometheus_identical": bool(resources_undone and resources_undone["prometheuses"] is not None
                                         and canonical_equal(resources_before["prometheuses"],
                                                             resources_undone["prometheuses"]))},
        "accepted": accepted,
        "proof": _proof(retired), "undo_proof": _proof(unretired),
        "runs": {"retire": {"dag_id": RETIRE_DAG_ID, "run_id": retire_run, "state": retire_state},
                 "unretire": {"dag_id": UNRETIRE_DAG_ID, "run_id": unretire_run, "state": unretire_state}},
        "audit": {"chain_ok": bool(audit.verify().ok),
                  "source_events": [e.kind for e in audit.events(group=source_group(SOURCE_CONN))]},
        "wall_time_s": round(time.time() - (session.started if first else started), 1),
    }
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    kind = "" if deploy == REMOTE_WRITE else f"-{deploy}"
    out_dir = (report_root / f"{stamp}-{SOURCE_CONN}{kind}-{RETIRE_SCENARIO}").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    (out_dir / "report.md").write_text(report_markdown(report))
    print(report_markdown(report))
    print_logins(airflow, RETIRE_DAG_ID, retire_run)
    return out_dir


def report_markdown(report: Mapping[str, Any]) -> str:
    r, m = report["retire"], report["measured"]
    proof = report.get("proof") or {}
    usage_b, usage_a = proof.get("usage_before") or {}, proof.get("usage_after") or {}
    lines = [f"# promshift: retire {report['source']['connection']} ({report['source']['url']})", "",
             "Groups: " + ", ".join(f"{n} {s}" for n, s in report["groups"].items()), "",
             f"- mode after the retire: **{r['mode']}** (its /-/ready)",
             f"- source storing: **{r['source_storing']}** (a query answered {m['retired']['query_status']})",
             f"- target receiving every group: **{r['target_receiving']}** (per group, its series and "
             f"those with two samples newer than a moment it was an agent: {m['retired']['target_since_agent']})",
             f"- undo byte-identical: **{r['undo_byte_identical']}** (config sha256 {m['before']['config_sha256']} "
             f"-> {m['undone']['config_sha256']}, command line identical {m['undone']['argv_identical']})",
             f"- source usage before/after: {usage_b.get('rss_mb')} MB / {usage_a.get('rss_mb')} MB resident, "
             f"{usage_b.get('cpu_share')} / {usage_a.get('cpu_share')} of a core",
             f"- write queues before the switch: {_queues_line(r.get('consolidated'))}",
             f"- longest gap per group on the target across the switch (DAG's proof): {proof.get('gaps_s')}",
             f"- accepted by name ({len(report['accepted'])}): {', '.join(report['accepted']) or 'nothing'}",
             f"- DAG runs: {RETIRE_DAG_ID} {report['runs']['retire']['state']}, {UNRETIRE_DAG_ID} "
             f"{report['runs']['unretire']['state']}",
             f"- audit chain OK: {report['audit']['chain_ok']}", ""]
    return "\n".join(lines)


def _queues_line(summary: Mapping[str, Any] | None) -> str:
    if not summary:
        return "not measured"
    return (f"{summary['entries_before']} promshift entries -> {summary['entries_after']} ({summary['state']}; "
            f"{len(summary['members'])} groups merged; samples lost across the swap: {summary['samples_lost']})")


def _kinds(found: Mapping[str, Any] | None) -> list[str]:
    """Which of the two resources exist."""
    return sorted(kind for kind, obj in (found or {}).items() if obj is not None)


def canonical_equal(a: Any, b: Any) -> bool:
    from promshift.core.retire import canonical

    return canonical(a) == canonical(b)


def _catalog_groups(session: DemoSession) -> list[MetricGroup]:
    from promshift.adapters.settings import load_catalog

    return list(load_catalog(session.catalog_path, profile=session.profile).groups)


def _last(audit: Any, kind: str) -> Any:
    found = [e for e in audit.events(group=source_group(SOURCE_CONN)) if e.kind == kind]
    return found[-1] if found else None


def _proof(event: Any) -> dict[str, Any]:
    if event is None:
        return {}
    data = dict(event.evidence_data)
    return {k: data.get(k) for k in ("mode", "target_receiving", "source_storing", "gaps_s", "allowed_gap_s",
                                     "query_status", "usage_before", "usage_after", "byte_identical")}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
