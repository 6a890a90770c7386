"""``make demo SCENARIO=lifecycle|bake-fail``: a group's life after its cut-over, through Airflow.

Both scenarios migrate ``gpu-memory`` (it has a recording rule and an alert on the local source) onto the
local AMP workspace written by its managed collector (``TARGET=amp DEPLOY=scraper``): a decommission drops
the group at the source's scrape, which is safe only when the target has a writer of its own (on the
remote_write path the source is AMP's only writer, and the decommission is refused there).

The demo's connections turn both moves on: the source connection says ``extra.rules: true`` (its rule file
is the config's ``rule_files``), and ``grafana_default`` names the stack's provisioned dashboard folder
(file mode; no Grafana runs here). The migration run moves the rules (recording rules after the warm-up, the
alert handed off at cut-over) and re-points the dashboard. Then the scheduled ``promshift__bake_watch`` is
unpaused and runs every ``bake.interval`` (1 min in the demo profile):

- ``lifecycle``: once the group is ``baked`` (a clean ``bake.period``, 2 min), the decommission DAG is
  triggered; its second approval is answered by the other on-call engineer through the REST API, and the
  group is dropped at the source's scrape, verified (the source returns none of its series; the target
  still receives them).
  Before the migration run starts, a fleet fault fills the framebuffer of ``ALERT_FAULT_GPUS`` GPUs
  (``LocalStack.set_fleet_faults``), so the moved alert ``GpuMemoryNearlyFull`` fires: on the source during the
  run (its rules-parity line compares a firing alert, not a quiet one), on the workspace after the handoff,
  and the bake watch's ``delivery`` measurement checks the workspace's Alertmanager holds it. After
  ``baked`` the demo records where it was seen delivered (``alerts`` in the report): by a bake check, or,
  when the alert fired after the last one, by the demo reading the workspace's Alertmanager itself.
  The history horizon (issue 36): the lab gives the group a dashboard that opens on the last 24 hours
  (``HORIZON_DASHBOARD``: two panels on their own last minute, one on the dashboard's day) and an alert reading
  ``[2h]`` (``HORIZON_RULE``, appended to the source's rules as written), and the run accepts no short history.
  At the cut-over, counted by the wall clock, the short panels switch; the day panel, the DCGM dashboard's panel
  (15 min) and the rules (they move together) wait, each named with its ready time on the board, which the demo
  reads before it unpauses the bake watch (``horizon_at_cut_over``). The session's Airflow runs with
  ``PROMSHIFT_LAB_BAKE_WATCH_CLOCK_AHEAD=24h`` (``LAB_CLOCK_AHEAD``; lab only, refused under production): the bake
  watch counts the target's history a day ahead of the wall clock, so its first clean check switches the day
  panel and hands the rules off, and every record it writes says so (``lab_clock_ahead_s``). The clock is
  shortened, never a panel or a rule. The decommission then finds nothing waiting.
- ``bake-fail``: right after the cut-over the target stops receiving the group (the collector's process is
  stopped with SIGSTOP, as a hung collector would be); a bake check fails on freshness and the watch returns
  the reads (routing, dashboard, rules) to the source by itself. The collector is resumed at the end.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from promshift.adapters.audit_store import AuditStore
from promshift.core.catalog import MetricGroup
from promshift.core.deploy_kinds import SCRAPER
from promshift.core.events import EventKind
from promshift.core.stages import Stage
from promshift.local.stack.scrapers import collector_processes

log = logging.getLogger("promshift.local.demo")

LIFECYCLE_SCENARIOS = ("lifecycle", "bake-fail")
LIFECYCLE_GROUP = "gpu-memory"
LIFECYCLE_TARGET = "amp"
LIFECYCLE_DEPLOY = SCRAPER
BAKE_WATCH_DAG_ID = "promshift__bake_watch"
# Datasources of the demo's dashboard switch: what the panels read now, and the AMP workspace's datasource.
SOURCE_DATASOURCE = {"uid": "prometheus", "name": "Prometheus"}
TARGET_DATASOURCE = {"uid": "amp-local", "name": "AMP (local workspace)"}
POLL_S = 5.0
# The lifecycle scenario's fleet fault: this many GPUs report a full framebuffer (gpu-memory's alert fires).
ALERT_FAULT_GPUS = 3
MOVED_ALERT = "GpuMemoryNearlyFull"
# How long the demo waits, after baked, for the moved alert to be held by the workspace's Alertmanager.
DELIVERY_WAIT_S = 240.0


# The history horizon's lab (see the module's docstring): how far ahead the bake watch counts the target's history.
LAB_CLOCK_AHEAD = "24h"
HORIZON_DASHBOARD_FILE = "gpu-memory-day.json"
DAY_PANEL = "FB used per node, last day"
SHORT_PANELS = ("FB used now", "FB free, worst GPU now")
HORIZON_ALERT = "GpuMemoryLeaking"
# Appended to the source's gpu-memory rule group as written: it reads two hours (plus its for:), so it moves only
# once the target holds that much of the group. It does not fire in the demo (its for: outlasts the demo).
HORIZON_RULE = """\
      # reads the last 2 hours: moves to the target only once the target holds them (the history horizon)
      - alert: GpuMemoryLeaking
        expr: delta(DCGM_FI_DEV_FB_USED[2h]) > 8192
        for: 15m
        labels:
          severity: ticket
        annotations:
          summary: "GPU {{ $labels.gpu }} on {{ $labels.instance }}: framebuffer grew by 8 GiB in 2 hours"
"""


def _panel(pid: int, title: str, expr: str, **extra: Any) -> dict[str, Any]:
    ds = {"type": "prometheus", "uid": SOURCE_DATASOURCE["uid"]}
    return {"id": pid, "title": title, "type": "timeseries", "datasource": ds,
            "gridPos": {"h": 8, "w": 8, "x": 8 * (pid - 1), "y": 0},
            "targets": [{"refId": "A", "datasource": ds, "expr": expr}], **extra}


# A provisioned dashboard of the group that opens on the last 24 hours; two panels on their own last minute (the
# cut-over comes about 150 s into dual-write at the earliest: measured 153 s, the warm-up being 2 min).
HORIZON_DASHBOARD = {
    "uid": "gpu-memory-day", "title": "GPU memory, last day", "schemaVersion": 39,
    "time": {"from": "now-24h", "to": "now"},
    "panels": [
        _panel(1, SHORT_PANELS[0], "sum(DCGM_FI_DEV_FB_USED)", timeFrom="1m"),
        _panel(2, SHORT_PANELS[1], "min(min_over_time(DCGM_FI_DEV_FB_FREE[30s]))", timeFrom="1m"),
        _panel(3, DAY_PANEL, "max by (Hostname) (DCGM_FI_DEV_FB_USED)"),
    ],
}


def plant_horizon_reads(dashboards_dir: Path, rules_path: Path, reload_source: Callable[[], None]) -> None:
    """The lab's long reads of the group: its day dashboard in the provisioned folder, and ``HORIZON_RULE``
    appended to the source's gpu-memory rule group (then the source reloads). Done once: a second call finds
    both and changes nothing."""
    import json

    import yaml

    board = dashboards_dir / HORIZON_DASHBOARD_FILE
    if not board.exists():
        dashboards_dir.mkdir(parents=True, exist_ok=True)
        board.write_text(json.dumps(HORIZON_DASHBOARD, indent=2) + "\n")
    text = rules_path.read_text()
    if f"alert: {HORIZON_ALERT}" in text:
        return
    groups = (yaml.safe_load(text) or {}).get("groups") or []
    if not groups or groups[-1].get("name") != LIFECYCLE_GROUP:
        raise RuntimeError(f"{rules_path}: the last rule group is not {LIFECYCLE_GROUP!r}; cannot append "
                           f"{HORIZON_ALERT} to it")
    new = text + ("" if text.endswith("\n") else "\n") + HORIZON_RULE
    names = [r.get("alert") for r in yaml.safe_load(new)["groups"][-1]["rules"]]
    if HORIZON_ALERT not in names:
        raise RuntimeError(f"{rules_path}: {HORIZON_ALERT} did not land in the {LIFECYCLE_GROUP!r} group")
    rules_path.write_text(new)
    reload_source()
    log.info("the group's long reads: %s (opens on the last 24h) and alert %s (reads [2h], for: 15m)",
             dashboards_dir / HORIZON_DASHBOARD_FILE, HORIZON_ALERT)


class _WaitingRows(HTMLParser):
    """The rows of the board's ``horizon-waiting`` table: each cell's text, and the ``<time datetime>`` in it."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._in_table = False
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table" and dict(attrs).get("id") == "horizon-waiting":
            self._in_table = True
        elif self._in_table and tag == "tr":
            self.rows.append([])
        elif self._in_table and tag == "td":
            self._cell = []
        elif self._cell is not None and tag == "time":
            self._cell.append(str(dict(attrs).get("datetime") or ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._in_table = False
        elif tag == "td" and self._cell is not None and self.rows:
            self.rows[-1].append(" ".join(" ".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def board_waiting_rows(html: str) -> list[dict[str, str]]:
    """The board page's "Waiting for the target's history" rows: what, name, reads back, ready at (its
    ``<time datetime>`` first, then the shown text); empty when the page has no such table."""
    parser = _WaitingRows()
    parser.feed(html)
    keys = ("kind", "name", "reads_back", "ready_at")
    return [dict(zip(keys, row, strict=False)) for row in parser.rows if row]


def panel_datasources(dashboards_dir: Path) -> dict[str, str]:
    """``<file> / <panel title>`` -> the datasource uid each panel reads now (its own, else its first target's)."""
    import json

    out: dict[str, str] = {}
    for path in sorted(dashboards_dir.glob("*.json")):
        for panel in json.loads(path.read_text()).get("panels") or []:
            ds = panel.get("datasource")  # an object, or a variable's name ("$datasource") as written
            if not isinstance(ds, dict):
                targets = [t.get("datasource") for t in panel.get("targets") or [] if isinstance(t, dict)]
                ds = next((t for t in targets if isinstance(t, dict)), ds)
            uid = ds.get("uid") if isinstance(ds, dict) else ds
            out[f"{path.name} / {panel.get('title')}"] = str(uid)
    return out


def horizon_at_cut_over(audit: AuditStore, group: str, *, board_page: Callable[[], str], dashboards_dir: Path,
                        target_rules: Callable[[], list[str]]) -> dict[str, Any]:
    """What the horizon held back at the cut-over, read before the bake watch runs: the audit's waiting list, the
    board page's rows, each panel's datasource and the rules the target evaluates."""
    from promshift.core.horizon import dual_write_since, waiting_list

    events = audit.events(group=group)
    since = dual_write_since(events)
    cut = [e.at for e in events if e.kind == EventKind.CUT_OVER]
    try:
        rows: list[dict[str, str]] | str = board_waiting_rows(board_page())
    except Exception as exc:  # noqa: BLE001 - the demo reports what it saw
        rows = f"the board could not be read: {type(exc).__name__}: {exc}"
    out = {"dual_write_since": since.isoformat() if since else None,
           "dual_write_age_at_cut_over_s": round((cut[-1] - since).total_seconds(), 1) if since and cut else None,
           "waiting": waiting_list(events), "board_waiting": rows,
           "panels": panel_datasources(dashboards_dir), "target_rules": target_rules()}
    for w in out["waiting"]:
        log.info("waiting for the target's history: %s %s, ready at %s", w["kind"], w["name"], w["ready_at"])
    return out


def horizon_after(audit: AuditStore, group: str) -> dict[str, Any]:
    """What the bake watch moved when the horizon passed (its ``horizon_switched`` records) and what still waits."""
    from promshift.core.horizon import waiting_list

    events = audit.events(group=group)
    switched = [{"what": e.evidence_data.get("what"), "at": e.at.isoformat(), "run_id": e.run_id,
                 "switched": e.evidence_data.get("switched") or e.evidence_data.get("moved"),
                 "horizon": e.evidence_data.get("horizon")}
                for e in events if e.kind == EventKind.HORIZON_SWITCHED]
    return {"switched": switched, "still_waiting": waiting_list(events)}


def alert_delivery(audit: AuditStore, group: str, alerts: Callable[[str], list[Any]] | None, *,
                   timeout_s: float = DELIVERY_WAIT_S) -> dict[str, Any]:
    """Where the moved alert was seen delivered: a bake check's SUCCESSFUL ``delivery``, else the workspace's
    Alertmanager read by the demo (polled up to ``timeout_s``); ``delivered: False`` with why otherwise."""
    for event in audit.events(group=group):
        if event.kind != EventKind.BAKE_CHECK:
            continue
        found = [m for m in event.evidence_data.get("measurements") or [] if m.get("name") == "delivery"]
        if found and found[0].get("verdict") == "SUCCESSFUL":
            return {"alert": MOVED_ALERT, "delivered": True, "seen_by": "bake check", "at": event.at.isoformat(),
                    "reason": found[0].get("reason")}
    if alerts is None:
        return {"alert": MOVED_ALERT, "delivered": False, "reason": "no bake check saw it delivered, and the "
                "workspace's Alertmanager cannot be read here"}
    deadline, last = time.time() + timeout_s, "not asked"
    while True:
        try:
            held = [a for a in alerts(MOVED_ALERT) if a.receivers]
        except Exception as exc:  # noqa: BLE001 - the demo reports what it saw
            held, last = [], f"{type(exc).__name__}: {exc}"
        if held:
            receivers = sorted({r for a in held for r in a.receivers})
            gpus = sorted(f"{a.labels.get('Hostname') or a.labels.get('hostname')}/{a.labels.get('gpu')}"
                          for a in held)
            return {"alert": MOVED_ALERT, "delivered": True, "seen_by": "the demo, reading the workspace's "
                    "Alertmanager after baked", "instances": len(held), "receivers": receivers, "gpus": gpus}
        if time.time() > deadline:
            return {"alert": MOVED_ALERT, "delivered": False, "reason": f"not held by the workspace's Alertmanager "
                    f"{timeout_s:.0f}s after baked ({last})"}
        last = "no active alert"
        time.sleep(POLL_S)


def lifecycle_choices(scenario: str, group: str | None, target: str | None, deploy: str | None
                      ) -> tuple[str, str, str]:
    """(group, target, deploy) for a lifecycle scenario: unset ones take the scenario's; others are refused."""
    target, deploy = target or LIFECYCLE_TARGET, deploy or LIFECYCLE_DEPLOY
    if (target, deploy) != (LIFECYCLE_TARGET, LIFECYCLE_DEPLOY):
        raise ValueError(f"--scenario {scenario} needs --target {LIFECYCLE_TARGET} --deploy {LIFECYCLE_DEPLOY} (the "
                         f"defaults for it): a decommission drops the group at the source's scrape, safe only when "
                         f"AMP's managed collector writes it (got --target {target} --deploy {deploy})")
    return group or LIFECYCLE_GROUP, target, deploy


def grafana_connection(dashboards_dir: Path) -> dict[str, Any]:
    """``grafana_default`` in file mode over the stack's provisioned dashboards (no Grafana runs here; the
    host is never called in file mode)."""
    return {"conn_type": "http", "host": "http://127.0.0.1:1",
            "extra": {"read_path": {"source_datasource": SOURCE_DATASOURCE, "target_datasource": TARGET_DATASOURCE,
                                    "files": [str(dashboards_dir / "*.json")]}}}


class CollectorPause:
    """The fault of ``bake-fail``: the target stops receiving the group (its collector is stopped, SIGSTOP)."""

    def __init__(self, amp_dir: Path) -> None:
        self.amp_dir = amp_dir
        self.pids: list[int] = []

    def start(self) -> None:
        self.pids = collector_processes(self.amp_dir / "scrapers")
        if not self.pids:
            raise RuntimeError(f"bake-fail: no collector process found under {self.amp_dir}/scrapers")
        for pid in self.pids:
            os.kill(pid, signal.SIGSTOP)
        log.warning("bake-fail: the target stops receiving the group: collector pid(s) %s stopped (SIGSTOP)",
                    ", ".join(map(str, self.pids)))

    def stop(self) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                continue
        if self.pids:
            log.info("bake-fail: collector pid(s) %s resumed (SIGCONT)", ", ".join(map(str, self.pids)))
        self.pids = []


def wait_for_stage(audit: AuditStore, group: str, wanted: AbstractSet[Stage], *, timeout_s: float, what: str,
                   stop_at: AbstractSet[Stage] = frozenset()) -> Stage:
    """Poll the audit log until the group reaches one of ``wanted`` (or ``stop_at``); log each change."""
    deadline, last = time.time() + timeout_s, None
    while True:
        stage = audit.stage_of(group)
        checks = sum(1 for e in audit.events(group=group) if e.kind == EventKind.BAKE_CHECK)
        if (stage, checks) != last:
            log.info("%s: stage %s, %d bake check(s) so far", what, stage.value, checks)
            last = (stage, checks)
        if stage in wanted or stage in stop_at:
            return stage
        if time.time() > deadline:
            raise TimeoutError(f"{what}: group {group!r} still {stage.value} after {timeout_s:.0f}s "
                               f"(waiting for {', '.join(sorted(s.value for s in wanted))})")
        time.sleep(POLL_S)


def follow_lifecycle(*, airflow: Any, audit: AuditStore, group: MetricGroup, scenario: str, amp_dir: Path,
                     approver: str, answer_after_polls: int,
                     on_decommission_state: Callable[[dict[str, str]], None] | None = None,
                     alerts: Callable[[str], list[Any]] | None = None,
                     at_cut_over: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """After the migration run cut the group over: bake watch (and the fault), then the decommission.
    ``at_cut_over``: read before the bake watch is unpaused (the horizon's waiting panels and rules, in the
    report's ``horizon.at_cut_over``). Returns what the demo did: the runs it followed and the stage each ended in."""
    bake, out = group.bake, {"scenario": scenario, "runs": {}}
    if at_cut_over is not None:
        out["horizon"] = {"at_cut_over": at_cut_over()}
    fault = CollectorPause(amp_dir) if scenario == "bake-fail" else None
    try:
        if fault is not None:
            fault.start()
        # The watch is scheduled (every bake.interval); Airflow starts it as soon as it is unpaused.
        airflow.unpause(BAKE_WATCH_DAG_ID)
        log.info("%s unpaused: it checks %s every %.0fs; baked after %.0fs clean", BAKE_WATCH_DAG_ID, group.name,
                 bake.interval_s, bake.period_s)
        if fault is not None:
            budget = bake.max_staleness_s + 4 * bake.interval_s + 180
            out["bake_stage"] = wait_for_stage(audit, group.name, {Stage.ROLLED_BACK_READS}, timeout_s=budget,
                                               what="bake watch", stop_at={Stage.BAKED}).value
            return out
        budget = bake.period_s + 5 * bake.interval_s + 180
        out["bake_stage"] = wait_for_stage(audit, group.name, {Stage.BAKED}, timeout_s=budget, what="bake watch",
                                           stop_at={Stage.ROLLED_BACK_READS}).value
        if out["bake_stage"] != Stage.BAKED.value:
            log.error("the bake failed: no decommission")
            return out
        if at_cut_over is not None:
            out["horizon"].update(horizon_after(audit, group.name))
        if scenario == "lifecycle":
            out["alerts"] = alert_delivery(audit, group.name, alerts)
            log.info("moved alert %s delivered: %s (%s)", MOVED_ALERT, out["alerts"]["delivered"],
                     out["alerts"].get("seen_by") or out["alerts"].get("reason"))
    finally:
        if fault is not None:
            fault.stop()
    from promshift.orchestration.dag_factory import DECOMMISSION_DAG_ID

    dag_id = DECOMMISSION_DAG_ID  # one DAG for every group: the group is chosen in the trigger form
    run_id = airflow.trigger(dag_id, conf={"group": group.name})
    polls = 0

    def on_state(states: dict[str, str]) -> None:
        nonlocal polls
        polls = polls + 1 if states.get("approval") == "awaiting_input" else 0
        if polls == answer_after_polls:
            log.info("second approval requested; %s answers through the REST API", approver)
            airflow.answer_approval(dag_id, run_id, "approval", user=approver, choice="Approve",
                                    comment="bake evidence reviewed in the demo: decommission on the source")
        if on_decommission_state is not None:
            on_decommission_state(states)

    out["runs"]["decommission"] = {"dag_id": dag_id, "run_id": run_id,
                                   "state": airflow.follow(dag_id, run_id, timeout_s=600, on_state=on_state)}
    out["final_stage"] = audit.stage_of(group.name).value
    return out
