"""A plan's outputs as text: ``plan.md`` with tables and a catalog draft (``promshift catalog check`` passes it).

Pure: both take ``Plan.to_dict()`` (so a stored ``plan.json`` renders the same).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from promshift.core.aggregation import rewrite_group_read
from promshift.core.catalog import Aggregate
from promshift.core.durations import format_duration
from promshift.core.promql import PromQLError


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
    out += _bill(plan)
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
    out += _aggregations(plan)
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


def _bill(plan: Mapping[str, Any]) -> list[str]:
    """The workspace's month, three ways, with the price table's date."""
    bill = plan.get("bill") or {}
    if not bill:
        return []
    date = plan.get("prices_date") or "not given (add prices_date to the price table)"
    out = ["## The month on AMP (the whole workspace)", "",
           f"Prices: the price table dated {date}; ingestion priced tier by tier, the free tier taken off once.", "",
           "| moving | series | samples/s | ingest | storage | queries | collectors | total |",
           "|---|---|---|---|---|---|---|---|"]
    names = {"all": "every metric of the groups", "read": "what was read", "aggregated": "what was read, aggregated"}
    for key, label in names.items():
        b = bill.get(key)
        if b:
            out.append(f"| {label} | {b['series']:,} | {b['samples_per_s']:,.1f} | {_usd(b['ingest_usd'])} | "
                       f"{_usd(b['storage_usd'])} | {_usd(b['query_usd'])} | {_usd(b['collector_usd'])} | "
                       f"{_usd(b['total_usd'])} |")
    out += ["", f"Aggregating before shipping saves {_usd(bill.get('saved_by_aggregation_usd', 0.0))} a month. "
            f"Scraped by one managed collector instead of a Prometheus, add "
            f"{_usd(bill.get('one_managed_collector_usd', 0.0))} a month.", ""]
    return out


def _aggregations(plan: Mapping[str, Any]) -> list[str]:
    """Recording rules recommended per metric (before/after, saving), then the metrics whose reads block one."""
    aggs = plan.get("aggregations") or []
    if not aggs:
        return []
    done = [a for a in aggs if a["recommended"]]
    out = ["## Aggregate before shipping (recording rules on the source)", "",
           "Every read of these metrics aggregates the same labels away with one family: a recording rule on the "
           "source ships the aggregate instead of every raw series (the raw metric stays on the source).", ""]
    if done:
        out += ["| metric | group | level | rules | series before → after | samples/s before → after | "
                "saved per month |", "|---|---|---|---|---|---|---|"]
        for a in done:
            out.append(f"| {a['metric']} | {a['group']} | {', '.join(a['level']) or '(fleet)'} | "
                       f"{', '.join('`' + r['record'] + '`' for r in a['rules'])} | "
                       f"{a['series_before']:,} → {a['series_after']:,} | "
                       f"{a['samples_per_s_before']:,.1f} → {a['samples_per_s_after']:,.1f} | {_usd(a['saved_usd'])} |")
        out.append("")
        for a in done:
            out += [f"### {a['metric']}", "", "```yaml", f"- name: promshift-aggregate-{a['group']}",
                    f"  interval: {format_duration(a['evaluation_interval_s'])}", "  rules:"]
            for r in a["rules"]:
                out += [f"    - record: {r['record']}", f"      expr: {json.dumps(r['expr'])}"]
            out += ["```", "", "| read | reads today | reads the recorded series |", "|---|---|---|"]
            out += [f"| {_cell(w['reader'])} | `{_cell(w['read'])}` | `{_cell(w['rewritten'])}` |"
                    for w in a["reads"][:20]]
            out.append("")
    else:
        out += ["No metric can be aggregated: each has a read that needs its raw series (below).", ""]
    blocked = [a for a in aggs if not a["recommended"]]
    if blocked:
        out += ["### Not aggregated: the read that needs the raw series", "",
                "| metric | blocked by | why |", "|---|---|---|"]
        for a in blocked:
            b = a["blocked_by"][0] if a["blocked_by"] else {"reader": "-", "why": "-"}
            more = f" (and {len(a['blocked_by']) - 1} more)" if len(a["blocked_by"]) > 1 else ""
            out.append(f"| {a['metric']} | {_cell(b['reader'])}{more} | {_cell(b['why'])} |")
        out.append("")
    return out


def _golden_over(queries: Sequence[str], aggregates: Sequence[Aggregate]) -> list[str]:
    """The golden queries as the target answers them: each read of an aggregated metric over its recorded
    series (a query that cannot be is left out; none left: a count of the first recorded series)."""
    if not aggregates:
        return list(queries)
    out = []
    for expr in queries:
        try:
            out.append(rewrite_group_read(expr, aggregates))
        except PromQLError:
            continue
    return list(dict.fromkeys(out)) or [f"count({aggregates[0].recorded[0]})"]


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
        recorded = [a for a in plan.get("aggregations", ()) if a["recommended"] and a["group"] == g["name"]]
        aggregates = [Aggregate(a["metric"], tuple(a["level"]), tuple(a["operations"]), float(a["window_s"]))
                      for a in recorded]
        if recorded:
            lines.append("    # aggregate before shipping: recording rules on the source, the recorded series shipped "
                         "(plan.md has each read's rewrite):")
            lines.append("    aggregations:")
            for a, agg in zip(recorded, aggregates, strict=True):
                rate = f", rate: {format_duration(agg.rate_s)}" if agg.rate_s else ""
                lines.append(f"      - {{metric: {q(a['metric'])}, by: [{', '.join(q(x) for x in agg.by)}], "
                             f"operations: [{', '.join(agg.operations)}]{rate}}}  # -> {', '.join(agg.recorded)}")
        lines.append("    metrics:")
        lines += [f"      - {q(m)}" for m in g["metrics"]]
        lines += ["    latency:", "      queries:"]
        lines += [f"        - {q(e)}" for e in _golden_over(g["golden_queries"], aggregates)]
        lines.append("")
        previous = g["name"]
    if not plan["groups"]:
        lines.append("  []")
    return "\n".join(lines) + "\n"
