"""What the board shows, read from the audit log: one report per run, built by ``core.report.build_report``.

No Airflow and no web framework here: the FastAPI app (``board.app``) adds authorization and
Airflow's own run states; this module only interprets audit events, the same way the report does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

import yaml

from promshift.core.audit import AuditEvent, ChainCheck
from promshift.core.catalog import MetricGroup
from promshift.core.events import APPROVAL_ANSWERS, GATE_DECIDED, EventKind
from promshift.core.gate import GateEvidence
from promshift.core.horizon import waiting_list
from promshift.core.move_evidence import DeployEvidence
from promshift.core.render import RenderError, remote_write_entry
from promshift.core.report import build_report

# The HITL task of every group DAG (dag_factory's ``MigrationApprovalOperator``).
APPROVAL_TASK_ID = "approval"
# A run that reached one of these kinds asked (or was about to ask) a human.
_ASKS_APPROVAL = (EventKind.GATE_PASSED, EventKind.GATE_INCONCLUSIVE)
# ... and one of these answers or ends that request.
_CLOSES_APPROVAL = APPROVAL_ANSWERS | {EventKind.ROLLED_BACK, EventKind.ROLLBACK_NOT_NEEDED, EventKind.RUN_COMPLETE,
                                       EventKind.CUT_OVER}
# Besides a group's latest run, the overview reads the latest run with an event of each of these: where the
# placement, the verdicts and the approval columns come from (``AuditStore.latest_runs``). Nothing else of the
# history is read, so a year of bake checks costs the overview nothing.
OVERVIEW_KINDS = (frozenset({EventKind.VALIDATED}), GATE_DECIDED, APPROVAL_ANSWERS)


@dataclass(frozen=True)
class GroupState:
    """A group's stage replayed from the audit log, or why the replay was refused."""

    stage: str | None
    problem: str | None = None


def runs_of(events: Sequence[AuditEvent]) -> list[tuple[str, list[AuditEvent]]]:
    """The group's events split by DAG run, oldest run first (by its first event)."""
    runs: dict[str, list[AuditEvent]] = {}
    for ev in events:
        runs.setdefault(ev.run_id, []).append(ev)
    return list(runs.items())


def run_reports(group: str, events: Sequence[AuditEvent], state: GroupState,
                chain: ChainCheck) -> list[dict[str, Any]]:
    """``build_report`` for every run of the group, oldest first.

    A run's final stage is the last stage it entered; the latest run ends at the group's current
    stage (what ``make demo``'s report says too).
    """
    out = []
    runs = runs_of(events)
    for index, (run_id, run_events) in enumerate(runs):
        entered = [e.stage_to for e in run_events if e.stage_to]
        final = state.stage if index == len(runs) - 1 and state.stage else (entered[-1] if entered else "planned")
        report = build_report(group=group, run_id=run_id, events=run_events, final_stage=final, chain=chain)
        report["started_at"] = run_events[0].at.isoformat()
        report["ended_at"] = run_events[-1].at.isoformat()
        report["kinds"] = [e.kind for e in run_events]
        report["gate_at"] = next((e.at.isoformat() for e in reversed(run_events) if e.kind in GATE_DECIDED),
                                 None)
        report["approval_at"] = next((e.at.isoformat() for e in reversed(run_events)
                                      if e.kind in APPROVAL_ANSWERS), None)
        # Who the approval asked, as resolved then (a team's members, without the trigger user).
        report["asked"] = next((list(e.evidence_data.get("approvers") or []) for e in reversed(run_events)
                                if e.kind == EventKind.EVIDENCE_SHOWN), None)
        out.append(report)
    return out


# The kinds whose evidence the overview reads (the rest only count as "a kind the run reached").
_OVERVIEW_EVIDENCE = GATE_DECIDED | APPROVAL_ANSWERS | {EventKind.VALIDATED, EventKind.EVIDENCE_SHOWN}


def overview_runs(events: Sequence[AuditEvent]) -> list[dict[str, Any]]:
    """Per run, oldest first, only the pieces of its ``build_report`` (and ``run_reports``) that the overview shows:
    ``run_id``, ``kinds``, ``validation`` (its ``ok``), ``source``, ``target``, ``connections``, ``gate``,
    ``parity`` and ``latency`` (their ``verdict``), ``approval``, ``gate_at``, ``approval_at``, ``asked``; each
    read the way ``build_report`` reads it (tests/board pin them equal). Only the evidence of validations, gates,
    approvals and approval requests is decoded: no latency windows, parity tables or moved rules are built.
    """
    out = []
    for run_id, run_events in runs_of(events):
        validation_ok: bool | None = None
        target: dict[str, Any] = {}
        connections: dict[str, Any] = {"source": None, "target": None}
        source: dict[str, Any] = {}
        gate: dict[str, Any] = {}
        parity: str | None = None
        latency: str | None = None
        approval: dict[str, Any] = {"decision": None, "by": None, "comment": None}
        gate_at = approval_at = None
        asked = None
        for e in run_events:
            if e.kind == EventKind.VALIDATION_FAILED:
                validation_ok = False
            if e.kind not in _OVERVIEW_EVIDENCE:
                continue
            data = e.evidence_data
            if e.kind == EventKind.VALIDATED:
                validation_ok = True
                target = dict(data.get("target_backend") or {})
                connections = {**connections, **dict(data.get("connections") or {})}
                source = {"connection": connections["source"], "url": data.get("source")}
            elif e.kind in GATE_DECIDED:
                found = GateEvidence.from_dict(data)
                gate = found.gate.to_dict()
                parity = found.parity.verdict.value
                latency = found.latency.verdict.value
                gate_at = e.at.isoformat()
            elif e.kind in APPROVAL_ANSWERS:
                approval = {"decision": data["decision"], "by": data["by"], "comment": data.get("comment")}
                if data.get("evidence_sha256"):
                    approval["evidence_sha256"] = data["evidence_sha256"]
                approval_at = e.at.isoformat()
            elif e.kind == EventKind.EVIDENCE_SHOWN:
                asked = list(data.get("approvers") or [])
        out.append({"run_id": run_id, "kinds": [e.kind for e in run_events], "validation": {"ok": validation_ok},
                    "source": source, "target": target, "connections": connections, "gate": gate,
                    "parity": {"verdict": parity}, "latency": {"verdict": latency}, "approval": approval,
                    "gate_at": gate_at, "approval_at": approval_at, "asked": asked})
    return out


def airflow_links(dag_id: str, run_id: str | None = None, *, root: str = "") -> dict[str, str]:
    """Airflow UI paths of a group's DAG, one of its runs, and that run's approval (required action)."""
    dag = f"{root}/dags/{quote(dag_id, safe='')}"
    links = {"dag": dag, "runs": f"{dag}/runs"}
    if run_id:
        run = f"{dag}/runs/{quote(run_id, safe='')}"
        links.update({"run": run, "required_action": f"{run}/tasks/{APPROVAL_TASK_ID}/required_actions"})
    return links


def pending_approval(group: MetricGroup, report: Mapping[str, Any] | None, *, root: str = "") -> dict[str, Any] | None:
    """The latest run's open approval request, if its gate asked a human and nothing answered or ended it."""
    if not report:
        return None
    kinds = report["kinds"]
    asked = [i for i, k in enumerate(kinds) if k in _ASKS_APPROVAL]
    if not asked:
        return None
    after = kinds[asked[-1] + 1:]
    if any(k in _CLOSES_APPROVAL for k in after):
        return None
    return {"run_id": report["run_id"], "since": report["gate_at"], "gate": report["gate"].get("verdict"),
            "reason": report["gate"].get("reason"), "waiting_for": report.get("asked") or list(group.approvers),
            "link": airflow_links(group.dag_id, report["run_id"], root=root)["required_action"]}


def _last(reports: Sequence[Mapping[str, Any]], has: str) -> Mapping[str, Any] | None:
    for report in reversed(reports):
        if has == "gate" and report["gate"]:
            return report
        if has == "approval" and report["approval"]["decision"]:
            return report
        if has == "latency" and report["latency"]["windows"]:
            return report
        if has == "deploy" and report["deploy"]:
            return report
    return None


def placement(group: MetricGroup, reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Which cluster (source connection) and workspace (target connection) the group is on: the catalog's pair,
    with what the last validated run recorded of each (the source URL; the AMP workspace or target URL)."""
    validated = next((r for r in reversed(reports) if r["validation"].get("ok")), None)
    source_url = ((validated or {}).get("source") or {}).get("url")
    target = dict((validated or {}).get("target") or {})
    workspace = (f"{target['workspace_id']} ({target.get('region')})" if target.get("kind") == "amp"
                 else target.get("url"))
    recorded = (validated or {}).get("connections") or {}
    # A run recorded under another pair (the catalog moved the group since): its URLs are not this pair's.
    same = not recorded.get("source") or (recorded.get("source"), recorded.get("target")) == group.pair
    return {"source": {"connection": group.source, "url": source_url if same else None},
            "target": {"connection": group.target, "workspace": workspace if same else None}}


def overview_row(group: MetricGroup, events: Sequence[AuditEvent], state: GroupState, chain: ChainCheck, *,
                 root: str = "", runs: int | None = None, last_event_at: datetime | None = None) -> dict[str, Any]:
    """One line of the overview: stage, where it moves from and to, last verdicts with their time, who approved,
    what waits for whom.

    ``events`` may be the group's whole history, or only its latest run and the runs ``OVERVIEW_KINDS`` pick (then
    ``runs`` and ``last_event_at`` say what the whole history holds)."""
    reports = overview_runs(events)
    if last_event_at is None and events:
        last_event_at = events[-1].at
    gated = _last(reports, "gate")
    approved = _last(reports, "approval")
    return {
        "name": group.name,
        "description": group.description,
        "wave": group.wave,
        "depends_on": list(group.depends_on),
        "owners": list(group.owners),
        "approvers": list(group.approvers),
        "dag_id": group.dag_id,
        **placement(group, reports),
        "stage": state.stage,
        "stage_problem": state.problem,
        "runs": len(reports) if runs is None else runs,
        "last_event_at": last_event_at.isoformat() if last_event_at else None,
        "parity": {"verdict": gated["parity"].get("verdict"), "at": gated["gate_at"],
                   "run_id": gated["run_id"]} if gated else None,
        "latency": {"verdict": gated["latency"].get("verdict"), "at": gated["gate_at"],
                    "run_id": gated["run_id"]} if gated else None,
        "approval": {**approved["approval"], "at": approved["approval_at"],
                     "run_id": approved["run_id"]} if approved else None,
        "pending_approval": pending_approval(group, reports[-1] if reports else None, root=root),
        "links": airflow_links(group.dag_id, root=root),
    }


def config_diff(group: str, deploy: Mapping[str, Any]) -> dict[str, Any] | None:
    """The deployed change to the source config, re-rendered from the ``dual_write_deployed`` evidence.

    The evidence records the entry's inputs (name, keep regex, URL, SigV4 block) and the config's
    hashes before and after; rendering the entry again with ``core.render`` gives the added lines.
    """
    if not deploy:
        return None
    found = DeployEvidence.from_dict(deploy)
    if found.keep_regex is None or found.url is None:  # a deploy path's record: no entry to render
        missing = "keep_regex" if found.keep_regex is None else "url"
        return {"error": f"deploy evidence cannot be rendered: {missing!r}", "lines": []}
    try:
        entry = remote_write_entry(group_name=group, name_regex=found.keep_regex, url=found.url,
                                   sigv4=found.sigv4, drop_labels=found.drop_labels or ())
    except RenderError as exc:
        return {"error": f"deploy evidence cannot be rendered: {exc}", "lines": []}
    problem = None
    if entry["name"] != found.remote_write:
        problem = f"evidence names entry {found.remote_write!r}, rendering gives {entry['name']!r}"
    added = yaml.safe_dump([entry], sort_keys=False, default_flow_style=False).splitlines()
    live = list(found.live_remote_writes or ())
    lines = [f"--- source config sha256:{found.config_before_sha256 or '?'}",
             f"+++ source config sha256:{found.config_after_sha256 or '?'}",
             "@@ remote_write @@", " remote_write:"]
    lines += [" - name: " + name for name in live if name != entry["name"]]
    lines += ["+" + line for line in added]
    return {"lines": lines, "error": problem, "live_remote_writes": live}


def timeline(events: Sequence[AuditEvent], *, problems: Sequence[str]) -> list[dict[str, Any]]:
    """Every event of the group, newest first, each marked if the chain check named it."""
    bad = {int(p.split()[2].rstrip(":")) for p in problems if p.startswith("event seq ")}
    rows = []
    for ev in reversed(events):
        rows.append({"seq": ev.seq, "at": ev.at.isoformat(), "run_id": ev.run_id, "kind": ev.kind,
                     "stage_from": ev.stage_from, "stage_to": ev.stage_to, "actor": ev.actor,
                     "hash": ev.hash, "chain_ok": ev.seq not in bad})
    return rows


def group_detail(group: MetricGroup, events: Sequence[AuditEvent], state: GroupState, chain: ChainCheck, *,
                 root: str = "") -> dict[str, Any]:
    """A group's page: timeline with chain status, the last report's pieces, config diff, run links."""
    reports = run_reports(group.name, events, state, chain)
    gated = _last(reports, "gate")
    timed = _last(reports, "latency")
    deployed = _last(reports, "deploy")
    stored = published_reports(events)
    return {
        **overview_row(group, events, state, chain, root=root),
        "metrics": list(group.metrics),
        "metric_regex": group.metric_regex,
        "chain": {"ok": chain.ok, "events": chain.events, "problems": list(chain.problems)},
        "timeline": timeline(events, problems=chain.problems),
        "report": {
            "run_id": gated["run_id"] if gated else None,
            "summary": reports[-1]["summary"] if reports else None,
            "gate": gated["gate"] if gated else None,
            "parity": gated["parity"] if gated else None,
            "latency": timed["latency"] if timed else None,
            "latency_run_id": timed["run_id"] if timed else None,
            "cost": (timed["latency"].get("cost") if timed else None),
            "approval": reports[-1]["approval"] if reports else None,
            "rollback": reports[-1]["rollback"] if reports else None,
        },
        "horizon_waiting": waiting_list(events),
        "config_diff": config_diff(group.name, deployed["deploy"]) if deployed else None,
        "config_diff_run_id": deployed["run_id"] if deployed else None,
        "dag_runs": [{"run_id": r["run_id"], "started_at": r["started_at"], "ended_at": r["ended_at"],
                      "final_stage": r["final_stage"], "summary": r["summary"],
                      "report_files": sorted((stored.get(r["run_id"]) or {}).get("files") or ()),
                      "links": airflow_links(group.dag_id, r["run_id"], root=root)} for r in reversed(reports)],
    }


def published_reports(events: Sequence[AuditEvent]) -> dict[str, dict[str, Any]]:
    """Each run's last ``report_published`` record (url and per-file sha256), by run id."""
    return {e.run_id: dict(e.evidence_data) for e in events if e.kind == EventKind.REPORT_PUBLISHED}


def latency_windows(group: MetricGroup, events: Sequence[AuditEvent], state: GroupState,
                    chain: ChainCheck) -> tuple[str, list[dict[str, Any]]] | None:
    """(run id, windows) of the last latency evidence, for the chart; None if no run measured latency."""
    timed = _last(run_reports(group.name, events, state, chain), "latency")
    return (timed["run_id"], list(timed["latency"]["windows"])) if timed else None
