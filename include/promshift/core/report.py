"""Readable reports built from a run's audit events: the audit log is the single source of truth."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from promshift.core.audit import AuditEvent, ChainCheck
from promshift.core.cost import CostEvidence
from promshift.core.durations import format_duration
from promshift.core.events import APPROVAL_ANSWERS, GATE_DECIDED, WARMUP_ENDED, EventKind
from promshift.core.evidence import json_safe
from promshift.core.gate import GateEvidence, GateVerdict
from promshift.core.latency import LatencyResult, WindowLatency
from promshift.core.move_evidence import (
    BakeEvidence,
    DecommissionEvidence,
    DeployEvidence,
    MovedEvidence,
    ReadPathEvidence,
    RulesEvidence,
)
from promshift.core.parity import GoldenInventory, ParityResult
from promshift.core.verdicts import Verdict


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def source_failed_label(row: Mapping[str, Any]) -> str | None:
    """The chart's reading of a report row (``WindowLatency.source_failed_label``)."""
    return WindowLatency.from_dict(row).source_failed_label


def _speedup(w: WindowLatency) -> str:
    if w.speedup is not None:
        return f"{w.speedup:.2f}x"
    return w.source_failed_label or "-"


def _paired(w: WindowLatency) -> str:
    """The pairs' target/source ratio and its interval: "1.02 [0.91-1.18]"."""
    iv = w.interval
    if iv is None:
        return "-"
    bounds = "?" if iv.low is None or iv.high is None else f"{iv.low:.2f}-{iv.high:.2f}"
    return f"{iv.ratio:.2f} [{bounds}]"


def latency_table(windows: Sequence[WindowLatency]) -> str:
    """The seed-style table: window, source p50/p95, target p50/p95, speedup, the pairs' target/source
    ratio with its interval and the rounds probed, outcome."""
    head = (f"{'window':<8} {'src p50':>9} {'src p95':>9} {'tgt p50':>9} {'tgt p95':>9} {'speedup':>16} "
            f"{'tgt/src [interval]':>18} {'rounds':>6}  outcome")
    lines = [head, "-" * len(head)]
    for w in windows:
        lines.append(f"{w.window:<8} {_fmt_s(w.source_p50_s):>9} {_fmt_s(w.source_p95_s):>9} "
                     f"{_fmt_s(w.target_p50_s):>9} {_fmt_s(w.target_p95_s):>9} "
                     f"{_speedup(w):>16} {_paired(w):>18} {w.rounds if w.interval else '-':>6}  "
                     f"{w.verdict.value}: {w.outcome}")
    return "\n".join(lines)


def latency_noise_lines(windows: Sequence[WindowLatency]) -> str:
    """Per window, the evidence behind the verdict: interval and its level, pairs, rounds, the noise."""
    lines = []
    for w in windows:
        iv = w.interval
        if iv is None:
            continue
        bounds = ("unbounded (too few pairs)" if iv.low is None or iv.high is None
                  else f"{iv.low:.2f}-{iv.high:.2f} (±{iv.spread_pct:.0f} %)")
        diff = ("" if iv.diff_low_s is None or iv.diff_high_s is None
                else f"; target - source {iv.diff_low_s:+.3f}..{iv.diff_high_s:+.3f}s")
        noise = "-" if iv.noise_pct is None else f"{iv.noise_pct:.0f} %"
        lines.append(f"{w.window}: target/source {iv.ratio:.2f}, {100 * iv.level:.4g} % interval {bounds}{diff}; "
                     f"{iv.pairs} pairs in {w.rounds} round{'s' if w.rounds != 1 else ''}; "
                     f"source-vs-source noise (A/A') {noise}")
    return "\n".join(lines)


def cost_table(cost: CostEvidence) -> str:
    """Monthly AMP cost projection: ingestion, storage, queries (samples measured or estimated)."""
    p = cost.projection
    if p is None:
        return f"cost projection unavailable: {cost.error}"
    lines = [
        f"active series {cost.active_series:,} at {cost.scrape_interval_s:g}s scrape; dashboards refresh every "
        f"{cost.dashboard_refresh_s:g}s on {cost.dashboard_viewers} screens ({cost.window} window)",
        f"{'ingestion':<10} {p.ingestion_samples_per_month:>16,.0f} samples  ${p.ingestion_usd:>10,.2f}",
        f"{'storage':<10} {p.storage_gb:>16,.2f} GB       ${p.storage_usd:>10,.2f}",
        f"{'queries':<10} {p.query_samples_per_month:>16,.0f} samples  ${p.query_usd:>10,.2f}",
        f"{'total':<10} {'':>24} ${p.total_usd:>10,.2f} / month",
    ]
    for q in p.queries:
        how = "measured" if q.measured else "estimated"
        lines.append(f"  {q.samples_per_execution:>14,.0f} samples/run ({how})  ${q.usd:>9,.2f}  {q.query}")
    return "\n".join(lines)


def parity_log_table(parity: ParityResult) -> str:
    """Per measurement: verdict and reason, then the worst offending series."""
    width = max([14] + [len(m.name) + 1 for m in parity.measurements])
    lines = [f"{'measurement':<{width}} {'verdict':<13} reason"]
    for m in parity.measurements:
        lines.append(f"{m.name:<{width}} {m.verdict.value:<13} {m.reason}")
    lines.append(f"series compared {parity.series_compared}, points compared {parity.points_compared}, "
                 f"mismatches {parity.mismatches}, missing series {parity.missing_series}, "
                 f"hosts {list(parity.hosts_sampled)}")
    if parity.golden:
        lines.append(f"golden queries: {parity.golden.summary}")
    for m in parity.measurements:
        for off in m.numbers.get("worst", [])[:5]:
            lines.append(f"  worst: {off['series']}: {off['problem']}")
    return "\n".join(lines)


def golden_inventory_markdown(golden: GoldenInventory | None) -> list[str]:
    """Every dashboard expression and its disposition: compared, not this group's, needs variable X, unsupported."""
    if not golden:
        return []
    dashboards = ", ".join(f"`{d}`" for d in golden.dashboards) or "none configured"
    lines = ["", f"### Golden queries: {golden.summary}", "",
             f"Dashboards: {dashboards}" + ("; a golden query is required" if golden.required else "")]
    if golden.queries:
        lines += ["", "| dashboard | panel | expression | disposition | detail |", "|---|---|---|---|---|"]
        for row in golden.queries:
            expr = row.expr.replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {row.dashboard} | {row.panel} | `{expr}` | {row.disposition} | "
                         f"{str(row.detail or '').replace('|', '/')} |")
    return lines


def approval_body(group: str, gate: GateVerdict, parity: ParityResult, latency: LatencyResult, *,
                  evidence_sha256: str | None = None, board_url: str | None = None) -> str:
    """Markdown shown to the on-call approver in the Airflow UI.

    The gate's verdict and reasons, the parity layers, the latency table per window, the cost
    projection, a link to the board's group page, and the hash of that evidence: the approval is
    bound to it (an answer given after the evidence changed is refused).
    """
    warn = ""
    if gate.verdict == Verdict.INCONCLUSIVE:
        warn = ("\n**The evidence is INCONCLUSIVE.** Nothing failed, but something could not be proven. "
                "Approve only if you understand why.\n")
    cost = f"### Cost\n```\n{cost_table(latency.cost)}\n```\n" if latency.cost is not None else ""
    board = f"[The group on the migration board]({board_url})\n\n" if board_url else ""
    bound = (f"Evidence sha256 `{evidence_sha256}`: an approval is bound to this evidence and is refused "
             "if it changed before the answer or is not the gate's evidence in the audit log.\n\n"
             ) if evidence_sha256 else ""
    return (
        f"## Cut over `{group}` to AMP?\n\nGate: **{gate.verdict.value}** — {gate.reason}\n{warn}\n"
        f"### Parity\n```\n{parity_log_table(parity)}\n```\n"
        f"### Latency\n```\n{latency_table(latency.windows)}\n```\n"
        f"{cost}{board}{bound}"
        "Approve routes this group's reads to AMP. Reject rolls the dual-write back. "
        "The person who triggered this run cannot approve it."
    )


def target_line(target: Mapping[str, Any]) -> str:
    """The target in one line: an AMP workspace with its SigV4 counters, or a Prometheus URL."""
    if target.get("kind") == "amp":
        line = (f"AMP workspace {target.get('workspace_id')} in {target.get('region')}: front door verified "
                f"{target.get('sigv4_verified', '-')} signed requests, rejected {target.get('sigv4_rejected', '-')}")
        by_reason = target.get("sigv4_rejected_by_reason") or {}
        if by_reason:
            line += " (" + ", ".join(f"{k} {v}" for k, v in sorted(by_reason.items())) + ")"
        cp = target.get("control_plane") or {}
        if cp:
            line += f"; control plane verified {cp.get('verified', '-')}, rejected {cp.get('rejected', '-')}"
            if cp.get("rejected_by_reason"):
                line += " (" + ", ".join(f"{k} {v}" for k, v in sorted(cp["rejected_by_reason"].items())) + ")"
        return line
    return f"{target.get('kind', 'unknown')} at {target.get('url', '-')}"


def source_config_line(source_config: Mapping[str, Any]) -> str:
    """The source config's sha256 before and after the run, and whether they are identical."""
    before, after = source_config.get("sha256_before"), source_config.get("sha256_after")
    same = "identical" if before == after else "changed"
    return f"sha256 before {before}, after {after} ({same})"


def moved_markdown(report: Mapping[str, Any]) -> list[str]:
    """The report's rules, dashboards, bake and decommission lines (older reports without them: none)."""
    lines: list[str] = []
    if report.get("rules"):
        rules = RulesEvidence.from_dict(report["rules"])
        lines += ["", "## Rules", "", (f"{rules.rules} rule(s) ({rules.records} recording, {rules.alerts} "
                                       f"alerting): {rules.moved} moved, restored {rules.restored}"
                                       if rules.configured else f"{rules.reason or 'not moved'}")]
    if report.get("read_path"):
        reads = ReadPathEvidence.from_dict(report["read_path"])
        lines += ["", "## Read path (dashboards)", "", (f"switched {reads.switched}: {reads.dashboards} "
                                                         f"dashboard(s), {reads.panels} panel(s); restored "
                                                         f"{reads.restored}" if reads.configured
                                                         else f"{reads.reason or 'not switched'}")]
    bake = BakeEvidence.from_dict(report.get("bake") or {})
    if bake.checks:
        lines += ["", "## Bake", "", f"{bake.checks} check(s), {bake.failed_checks} failed; baked "
                  f"{bake.baked}; reads rolled back {bake.reads_rolled_back}"
                  + (f" ({bake.reason})" if bake.reason else "")]
    dec = DecommissionEvidence.from_dict(report.get("decommission") or {})
    if dec.performed or dec.reason:
        lines += ["", "## Decommission", "", f"performed {dec.performed}: freed {dec.freed_series} series, "
                  f"{dec.freed_samples_per_s} samples/s; source series after: {dec.source_series_after}"
                  + (f"; {dec.reason}" if dec.reason else "")]
    return lines


def build_report(*, group: str, run_id: str, events: Sequence[AuditEvent], final_stage: str,
                 chain: ChainCheck, target: Mapping[str, Any] | None = None,
                 source_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run's report (``report.json``) from its audit events.

    ``target``: what the caller knows of the target beyond the audit (an AMP front door's SigV4
    counters); it is merged over the ``target_backend`` the run's ``validated`` event recorded.
    ``source_config``: the source config's sha256 before and after the run, when the caller took them.
    """
    stages = [{"stage": e.stage_to, "at": e.at.isoformat()} for e in events if e.stage_to]
    parity: dict[str, Any] = {"verdict": None, "series_compared": 0, "points_compared": 0, "mismatches": 0}
    latency: dict[str, Any] = {"verdict": None, "windows": []}
    approval: dict[str, Any] = {"decision": None, "by": None, "comment": None}
    rollback: dict[str, Any] = {"performed": False, "restored_identical": None, "reason": None}
    gate: dict[str, Any] = {}
    deploy: DeployEvidence | None = None
    warmup: dict[str, Any] = {}
    validation: dict[str, Any] = {"ok": None, "reason": None}
    recorded_target: dict[str, Any] = {}
    connections: dict[str, Any] = {"source": None, "target": None}
    source: dict[str, Any] = {}
    moved = MovedEvidence.from_events((e.kind, e.evidence_data) for e in events)
    for e in events:
        data = e.evidence_data
        if e.kind == EventKind.VALIDATED:
            validation = {"ok": True, "reason": None}
            recorded_target = dict(data.get("target_backend") or {})
            # The group's (source, target) connections; runs from before per-group connections have none.
            connections = {**connections, **dict(data.get("connections") or {})}
            source = {"connection": connections["source"], "url": data.get("source")}
        elif e.kind == EventKind.VALIDATION_FAILED:
            validation = {"ok": False, "reason": data.get("reason")}
        if e.kind in GATE_DECIDED:
            evidence = GateEvidence.from_dict(data)
            gate = evidence.gate.to_dict()
            parity = evidence.parity.to_dict()
            lat = evidence.latency
            latency = {"verdict": lat.verdict.value, "windows": [w.to_dict() for w in lat.windows],
                       "reason": lat.measurement.reason, "retries": lat.retries,
                       "cost": lat.cost.to_dict() if lat.cost else None,
                       "probe": {"max_concurrency": lat.max_concurrency, "accept_encoding": lat.accept_encoding,
                                 "retention_s": json_safe(dict(lat.retention_s))}}
        elif e.kind in APPROVAL_ANSWERS:
            approval = {"decision": data["decision"], "by": data["by"], "comment": data.get("comment")}
            if data.get("evidence_sha256"):
                approval["evidence_sha256"] = data["evidence_sha256"]
        elif e.kind in (EventKind.ROLLED_BACK, EventKind.ROLLBACK_NOT_NEEDED):
            rollback = {"performed": data["performed"], "restored_identical": data["restored_identical"],
                        "reason": data["reason"]}
            change = DeployEvidence.from_dict(data.get("deploy") or {}).change
            if change:  # a git deploy's revert: its commits, change request
                rollback["change"] = dict(change)
        deployed = DeployEvidence.from_event(e.kind, data)
        if deployed is not None:
            deploy = deployed
        if e.kind in WARMUP_ENDED.values():
            warmup = data
    if rollback["performed"]:
        summary = f"Rolled back: {rollback['reason']}."
    elif validation["ok"] is False:
        summary = f"Stopped at validate, nothing deployed: {validation['reason']}."
    elif final_stage == "cut_over":
        summary = f"Cut over: reads of {group} now go to the target, approved by {approval['by']}."
    else:
        summary = f"Run ended at stage {final_stage}."
    return {
        "group": group,
        "run_id": run_id,
        "final_stage": final_stage,
        "summary": summary,
        "stages": stages,
        "deploy": deploy.to_dict() if deploy is not None else {},
        "warmup": warmup,
        "gate": gate,
        "parity": parity,
        "latency": latency,
        "approval": approval,
        "rollback": rollback,
        "validation": validation,
        **moved.to_dict(),
        "target": {**recorded_target, **dict(target or {})},
        # Which cluster (source connection, its URL) and which workspace (target connection) the run moved.
        "source": source,
        "connections": connections,
        "source_config": dict(source_config or {}),
        "audit": {"events": len(events), "chain_events": chain.events, "chain_ok": chain.ok,
                  "problems": list(chain.problems)},
    }


def render_markdown(report: Mapping[str, Any], *, chart_file: str | None = None) -> str:
    """``report.md``: what happened, the evidence, and the audit check, for people."""
    lines = [f"# promshift run: {report['group']}", "", f"**{report['summary']}**", "",
             f"- run: `{report['run_id']}`", f"- final stage: **{report['final_stage']}**", "",
             "## Stages", "", "| stage | at (UTC) |", "|---|---|"]
    lines += [f"| {s['stage']} | {s['at']} |" for s in report["stages"]]
    connections = report.get("connections") or {}
    if connections.get("source") or connections.get("target"):
        source_url = (report.get("source") or {}).get("url")
        lines += ["", "## Connections", "",
                  f"source `{connections.get('source')}`" + (f" ({source_url})" if source_url else "")
                  + f" → target `{connections.get('target')}`"]
    if report.get("target"):
        lines += ["", "## Target", "", target_line(report["target"])]
    validation = report.get("validation") or {}
    if validation.get("ok") is False:
        lines += ["", "## Validation: FAILED", "", f"{validation.get('reason')}"]
    if report.get("source_config"):
        lines += ["", "## Source config", "", source_config_line(report["source_config"])]
    # No gate yet: the report's parity/latency blocks hold a null verdict.
    p = ParityResult.from_dict(report["parity"])
    lines += ["", f"## Parity: {report['parity'].get('verdict')}", "",
              f"series compared {p.series_compared}, points compared {p.points_compared}, "
              f"mismatches {p.mismatches}, missing series {p.missing_series}, "
              f"hosts sampled {', '.join(p.hosts_sampled) or '-'}", "",
              "| measurement | verdict | reason |", "|---|---|---|"]
    for m in p.measurements:
        lines.append(f"| {m.name} | {m.verdict.value} | {m.reason} |")
    lines += golden_inventory_markdown(p.golden)
    worst = [o for m in p.measurements for o in m.numbers.get("worst", [])]
    if worst:
        lines += ["", "Worst offending series:", ""]
        lines += [f"- `{o['series']}`: {o['problem']}" for o in worst[:10]]
    lat = report["latency"]
    windows = [WindowLatency.from_dict(w) for w in lat.get("windows", [])]
    lines += ["", f"## Latency: {lat.get('verdict')}", "", "```", latency_table(windows), "```"]
    probe = lat.get("probe") or {}
    if probe.get("max_concurrency"):
        kept = ", ".join(f"{side} {format_duration(v) if v is not None else 'unknown'}"
                         for side, v in (probe.get("retention_s") or {}).items())
        lines += ["", f"Probe: at most {probe['max_concurrency']} in flight per backend, "
                      f"Accept-Encoding {probe.get('accept_encoding')}, {lat.get('retries', 0)} throttled retries; "
                      f"retention {kept or 'unknown'}."]
    if chart_file:
        lines += ["", f"![latency per window]({chart_file})"]
    if lat.get("cost"):
        lines += ["", "### Projected monthly AMP cost", "", "```", cost_table(CostEvidence.from_dict(lat["cost"])),
                  "```"]
    a = report["approval"]
    lines += ["", "## Approval", "", f"decision: **{a.get('decision') or 'none'}** by {a.get('by') or '-'}"
              + (f" — {a['comment']}" if a.get("comment") else "")]
    lines += moved_markdown(report)
    r = report["rollback"]
    lines += ["", "## Rollback", "", f"performed: {r['performed']}, source config restored byte for byte: "
              f"{r['restored_identical']}" + (f"; reason: {r['reason']}" if r.get("reason") else "")]
    au = report["audit"]
    lines += ["", "## Audit", "", f"{au['events']} events in this run; whole chain of {au['chain_events']} "
              f"events {'verified OK' if au['chain_ok'] else 'BROKEN: ' + '; '.join(au['problems'])}", ""]
    return "\n".join(lines)
