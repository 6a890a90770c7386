"""A plan's outputs as text: ``plan.md`` with tables and a catalog draft (``promshift catalog check`` passes it).

Pure: both take ``Plan.to_dict()`` (so a stored ``plan.json`` renders the same).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from promshift.core.durations import format_duration


def _usd(x: float) -> str:
    return f"${x:,.2f}"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def plan_markdown(plan: Mapping[str, Any], *, notes: Sequence[str] = (), diff: Sequence[str] | None = None,
                  source: str = "") -> str:
    """The plan as Markdown: what could not be read first, then groups, drops, left-behind metrics, labels."""
    when = datetime.fromtimestamp(plan["generated_at"], UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"# Migration plan{' for ' + source if source else ''}", "",
           f"Generated {when} from usage over {format_duration(plan['period_s'])}."
           f" Totals per month on AMP: {_usd(plan['totals']['before_usd'])} moving every metric of the families, "
           f"{_usd(plan['totals']['after_usd'])} moving only what was read.", ""]
    if plan["not_read"]:
        out += ["## PARTIAL: what this plan could not read", ""]
        out += [f"- {_cell(line)}" for line in plan["not_read"]] + [""]
    if notes:
        out += ["## Read with caveats", ""] + [f"- {_cell(line)}" for line in notes] + [""]
    if diff is not None:
        out += ["## Changes since the previous plan", ""]
        out += ([f"- {_cell(line)}" for line in diff] or ["- nothing changed"]) + [""]
    out += ["## Groups (wave order: small, read-heavy first)", "",
            "| wave | group | metrics moved | left behind | series | samples/s | reads | labeldrop | "
            "cost before | cost after |", "|---|---|---|---|---|---|---|---|---|---|"]
    for g in plan["groups"]:
        out.append(f"| {g['wave']} | {g['name']} | {len(g['metrics'])} | {len(g['left_behind'])} | {g['series']:,} | "
                   f"{g['samples_per_s']:,.1f} | {g['reads']:,} | {', '.join(g['labeldrop']) or '-'} | "
                   f"{_usd(g['cost_before']['total_usd'])} | {_usd(g['cost_after']['total_usd'])} |")
    out.append("")
    for g in plan["groups"]:
        out += [f"### {g['name']}", "", f"Keep filter (`__name__`, RE2): `{g['keep_regex']}`", ""]
        c = g["cost_after"]
        out.append(f"Cost after trimming: ingest {_usd(c['ingest_usd'])}, storage {_usd(c['storage_usd'])}, "
                   f"queries {_usd(c['query_usd'])} per month. Label drops do not change AMP's bill (it counts "
                   "samples, not labels); they shrink each series and its index.")
        out.append("")
        if g["labeldrop"]:
            out.append(f"Safe to drop (never read; checked on all {g['series']:,} series of the group's metrics in the "
                       f"source: each stays unique without them): {', '.join(g['labeldrop'])}")
            out.append("")
        if g["unsafe_drops"]:
            out += ["| label | why it stays |", "|---|---|"]
            out += [f"| {_cell(k)} | {_cell(v)} |" for k, v in g["unsafe_drops"].items()]
            out.append("")
        if g["left_behind"]:
            out.append(f"Left behind (nobody read them): {', '.join(g['left_behind'])}")
            out.append("")
    metrics = plan["metrics"]
    unread = plan["unread_metrics"]
    out += ["## Metrics nobody read in the period (left behind)", ""]
    if unread:
        out += ["| metric | series | cost per month if moved |", "|---|---|---|"]
        out += [f"| {m} | {metrics[m]['series']:,} | {_usd(metrics[m]['cost_usd'])} |" for m in unread]
    else:
        out.append("Every metric was read.")
    out += ["", "## Labels never read", "", "| metric | labels no read names |", "|---|---|"]
    out += [f"| {m} | {', '.join(labels)} |" for m, labels in plan["never_read_labels"].items()]
    out += ["", "## Who reads what", "", "| metric | type | series | readers (top 3) |", "|---|---|---|---|"]
    for name, row in metrics.items():
        if row["readers"]:
            top = "; ".join(f"{r['reader']} ×{r['count']:,}" for r in row["readers"][:3])
            out.append(f"| {name} | {row['type']} | {row['series']:,} | {_cell(top)} |")
    return "\n".join(out) + "\n"


def catalog_draft(plan: Mapping[str, Any], *, host_label: str, scrape_interval_s: float) -> str:
    """A catalog with one group per recommended group, in wave order, for a human to finish.

    Owners and approvers are placeholders a reviewer must replace. The recommended label drops
    are declared (``drop_labels``), except the host label, which parity needs.
    """
    q = json.dumps
    lines = ["# Draft written by `promshift plan`: review it like code before use.",
             "# Replace the owner/approver placeholders; waves follow the plan (small, read-heavy first).",
             "version: 1", "", "defaults:", f"  scrape_interval: {format_duration(scrape_interval_s)}",
             f"  host_label: {q(host_label)}",
             "  latency:",
             "    windows:                  # query range -> p95 the target must meet (tune to your SLOs)",
             "      - {range: 1h, slo_p95: 2s}",
             "      - {range: 24h, slo_p95: 12s}", "", "groups:"]
    previous: str | None = None
    for g in plan["groups"]:
        description = (f"{len(g['metrics'])} read metrics of job {g['job'] or '?'}, family {g['prefix']}; "
                       f"{g['series']:,} series")
        lines += [f"  - name: {g['name']}", f"    description: {q(description)}",
                  "    owners: [owner-to-fill-in]", "    approvers: [approver-to-fill-in-1, approver-to-fill-in-2]",
                  f"    wave: {g['wave']}"]
        if previous is not None:
            lines.append(f"    depends_on: [{previous}]")
        # Declared drops: never the host label (parity samples hosts by it) nor a reserved name.
        drops = [d for d in g["labeldrop"] if d != host_label and not d.startswith("__")]
        kept = [d for d in g["labeldrop"] if d not in drops]
        if drops:
            lines.append("    # never read, and every series stays unique without them (checked on the source)")
            lines.append(f"    drop_labels: [{', '.join(q(d) for d in drops)}]")
        if kept:
            lines.append(f"    # also never read, kept (host label or reserved): {', '.join(kept)}")
        if g["left_behind"]:
            lines.append(f"    # left behind, nobody read them: {', '.join(g['left_behind'][:20])}"
                         + (" ..." if len(g["left_behind"]) > 20 else ""))
        lines.append("    metrics:")
        lines += [f"      - {q(m)}" for m in g["metrics"]]
        lines += ["    latency:", "      queries:"]
        lines += [f"        - {q(e)}" for e in g["golden_queries"]]
        lines.append("")
        previous = g["name"]
    if not plan["groups"]:
        lines.append("  []")
    return "\n".join(lines) + "\n"
