"""Readable reports built from a run's audit events: the audit log is the single source of truth."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from promshift.core.audit import AuditEvent, ChainCheck
from promshift.core.durations import format_duration


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def source_failed_label(row: Mapping[str, Any]) -> str | None:
    """ "source timed out" (throttled, ...) for a window whose source failed while the target
    answered, the seed's "60 s timeout" cell; None otherwise. Used by the table and the chart."""
    if row.get("source_failures") and row.get("target_p50_s") is not None:
        return f"source {row.get('source_failure') or 'failed'}"
    return None


def _speedup(row: Mapping[str, Any]) -> str:
    if row.get("speedup") is not None:
        return f"{row['speedup']:.2f}x"
    return source_failed_label(row) or "-"


def latency_table(windows: Sequence[Mapping[str, Any]]) -> str:
    """The seed-style table: window, source p50/p95, target p50/p95, speedup, outcome."""
    head = f"{'window':<8} {'src p50':>9} {'src p95':>9} {'tgt p50':>9} {'tgt p95':>9} {'speedup':>16}  outcome"
    lines = [head, "-" * len(head)]
    for w in windows:
        lines.append(f"{w['window']:<8} {_fmt_s(w.get('source_p50_s')):>9} {_fmt_s(w.get('source_p95_s')):>9} "
                     f"{_fmt_s(w.get('target_p50_s')):>9} {_fmt_s(w.get('target_p95_s')):>9} "
                     f"{_speedup(w):>16}  {w.get('verdict', '')}: {w.get('outcome', '')}")
    return "\n".join(lines)


def cost_table(cost: Mapping[str, Any]) -> str:
    """Monthly AMP cost projection: ingestion, storage, queries (samples measured or estimated)."""
    if cost.get("error"):
        return f"cost projection unavailable: {cost['error']}"
    lines = [
        f"active series {cost['active_series']:,} at {cost['scrape_interval_s']:g}s scrape; dashboards refresh every "
        f"{cost['dashboard_refresh_s']:g}s on {cost['dashboard_viewers']} screens ({cost['window']} window)",
        f"{'ingestion':<10} {cost['ingestion']['samples_per_month']:>16,.0f} samples  "
        f"${cost['ingestion']['usd']:>10,.2f}",
        f"{'storage':<10} {cost['storage']['gb']:>16,.2f} GB       ${cost['storage']['usd']:>10,.2f}",
        f"{'queries':<10} {cost['query']['samples_per_month']:>16,.0f} samples  ${cost['query']['usd']:>10,.2f}",
        f"{'total':<10} {'':>24} ${cost['total_usd']:>10,.2f} / month",
    ]
    for q in cost["query"].get("queries", []):
        how = "measured" if q["measured"] else "estimated"
        lines.append(f"  {q['samples_per_execution']:>14,.0f} samples/run ({how})  ${q['usd']:>9,.2f}  {q['query']}")
    return "\n".join(lines)


def parity_log_table(parity: Mapping[str, Any]) -> str:
    """Per measurement: verdict and reason, then the worst offending series."""
    width = max([14] + [len(m["name"]) + 1 for m in parity.get("measurements", [])])
    lines = [f"{'measurement':<{width}} {'verdict':<13} reason"]
    for m in parity.get("measurements", []):
        lines.append(f"{m['name']:<{width}} {m['verdict']:<13} {m['reason']}")
    lines.append(f"series compared {parity.get('series_compared', 0)}, points compared "
                 f"{parity.get('points_compared', 0)}, mismatches {parity.get('mismatches', 0)}, "
                 f"missing series {parity.get('missing_series', 0)}, hosts {parity.get('hosts_sampled', [])}")
    if parity.get("golden"):
        lines.append(f"golden queries: {parity['golden'].get('summary', '')}")
    for m in parity.get("measurements", []):
        for off in (m.get("numbers") or {}).get("worst", [])[:5]:
            lines.append(f"  worst: {off['series']}: {off['problem']}")
    return "\n".join(lines)


def golden_inventory_markdown(golden: Mapping[str, Any] | None) -> list[str]:
    """Every dashboard expression and its disposition: compared, not this group's, needs variable X, unsupported."""
    if not golden:
        return []
    dashboards = ", ".join(f"`{d}`" for d in golden.get("dashboards", [])) or "none configured"
    lines = ["", f"### Golden queries: {golden.get('summary', '')}", "",
             f"Dashboards: {dashboards}" + ("; a golden query is required" if golden.get("required") else "")]
    rows = golden.get("queries", [])
    if rows:
        lines += ["", "| dashboard | panel | expression | disposition | detail |", "|---|---|---|---|---|"]
        for row in rows:
            expr = str(row["expr"]).replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {row['dashboard']} | {row['panel']} | `{expr}` | {row['disposition']} | "
                         f"{str(row.get('detail') or '').replace('|', '/')} |")
    return lines


def approval_body(group: str, gate: Mapping[str, Any], parity: Mapping[str, Any],
                  latency: Mapping[str, Any]) -> str:
    """Markdown shown to the on-call approver in the Airflow UI."""
    verdict = gate.get("verdict", "?")
    warn = ""
    if verdict == "INCONCLUSIVE":
        warn = ("\n**The evidence is INCONCLUSIVE.** Nothing failed, but something could not be proven. "
                "Approve only if you understand why.\n")
    return (
        f"## Cut over `{group}` to AMP?\n\nGate: **{verdict}** — {gate.get('reason', '')}\n{warn}\n"
        f"### Parity\n```\n{parity_log_table(parity)}\n```\n"
        f"### Latency\n```\n{latency_table(latency.get('windows', []))}\n```\n"
        "Approve routes this group's reads to AMP. Reject rolls the dual-write back. "
        "The person who triggered this run cannot approve it."
    )


def build_report(*, group: str, run_id: str, events: Sequence[AuditEvent], final_stage: str,
                 chain: ChainCheck) -> dict[str, Any]:
    """The run's report (``report.json``) from its audit events."""
    stages = [{"stage": e.stage_to, "at": e.at.isoformat()} for e in events if e.stage_to]
    parity: dict[str, Any] = {"verdict": None, "series_compared": 0, "points_compared": 0, "mismatches": 0}
    latency: dict[str, Any] = {"verdict": None, "windows": []}
    approval: dict[str, Any] = {"decision": None, "by": None, "comment": None}
    rollback: dict[str, Any] = {"performed": False, "restored_identical": None, "reason": None}
    gate: dict[str, Any] = {}
    deploy: dict[str, Any] = {}
    warmup: dict[str, Any] = {}
    for e in events:
        data = e.evidence_data
        if e.kind.startswith("gate_"):
            gate = data["gate"]
            parity = {k: v for k, v in data["parity"].items()}
            latency = {"verdict": data["latency"]["verdict"], "windows": data["latency"]["windows"],
                       "reason": data["latency"]["measurement"]["reason"], "retries": data["latency"].get("retries", 0),
                       "cost": data["latency"].get("cost"),
                       "probe": {k: data["latency"].get(k) for k in ("max_concurrency", "accept_encoding",
                                                                     "retention_s")}}
        elif e.kind == "approved" or e.kind.startswith("approval_"):
            approval = {"decision": data["decision"], "by": data["by"], "comment": data.get("comment")}
        elif e.kind in ("rolled_back", "rollback_not_needed"):
            rollback = {"performed": data["performed"], "restored_identical": data["restored_identical"],
                        "reason": data["reason"]}
        elif e.kind == "dual_write_deployed":
            deploy = data
        if e.kind in ("dual_write_deployed", "deploy_failed", "quota_refused") and "deploy" in data:
            # A deploy path's evidence (scraper): {kind, state, status_history, reason, quota} at the top.
            deploy = {**{k: v for k, v in data.items() if k != "deploy"}, **data["deploy"]}
        elif e.kind.startswith("warmup_") and e.kind != "warmup_started":
            warmup = data
    if rollback["performed"]:
        summary = f"Rolled back: {rollback['reason']}."
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
        "deploy": deploy,
        "warmup": warmup,
        "gate": gate,
        "parity": parity,
        "latency": latency,
        "approval": approval,
        "rollback": rollback,
        "audit": {"events": len(events), "chain_events": chain.events, "chain_ok": chain.ok,
                  "problems": list(chain.problems)},
    }


def render_markdown(report: Mapping[str, Any], *, chart_file: str | None = None) -> str:
    """``report.md``: what happened, the evidence, and the audit check, for people."""
    lines = [f"# promshift run: {report['group']}", "", f"**{report['summary']}**", "",
             f"- run: `{report['run_id']}`", f"- final stage: **{report['final_stage']}**", "",
             "## Stages", "", "| stage | at (UTC) |", "|---|---|"]
    lines += [f"| {s['stage']} | {s['at']} |" for s in report["stages"]]
    p = report["parity"]
    lines += ["", f"## Parity: {p.get('verdict')}", "",
              f"series compared {p.get('series_compared')}, points compared {p.get('points_compared')}, "
              f"mismatches {p.get('mismatches')}, missing series {p.get('missing_series', 0)}, "
              f"hosts sampled {', '.join(p.get('hosts_sampled') or []) or '-'}", "",
              "| measurement | verdict | reason |", "|---|---|---|"]
    for m in p.get("measurements", []):
        lines.append(f"| {m['name']} | {m['verdict']} | {m['reason']} |")
    lines += golden_inventory_markdown(p.get("golden"))
    worst = [o for m in p.get("measurements", []) for o in (m.get("numbers") or {}).get("worst", [])]
    if worst:
        lines += ["", "Worst offending series:", ""]
        lines += [f"- `{o['series']}`: {o['problem']}" for o in worst[:10]]
    lat = report["latency"]
    lines += ["", f"## Latency: {lat.get('verdict')}", "", "```", latency_table(lat.get("windows", [])), "```"]
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
        lines += ["", "### Projected monthly AMP cost", "", "```", cost_table(lat["cost"]), "```"]
    a = report["approval"]
    lines += ["", "## Approval", "", f"decision: **{a.get('decision') or 'none'}** by {a.get('by') or '-'}"
              + (f" — {a['comment']}" if a.get("comment") else "")]
    r = report["rollback"]
    lines += ["", "## Rollback", "", f"performed: {r['performed']}, source config restored byte for byte: "
              f"{r['restored_identical']}" + (f"; reason: {r['reason']}" if r.get("reason") else "")]
    au = report["audit"]
    lines += ["", "## Audit", "", f"{au['events']} events in this run; whole chain of {au['chain_events']} "
              f"events {'verified OK' if au['chain_ok'] else 'BROKEN: ' + '; '.join(au['problems'])}", ""]
    return "\n".join(lines)
