"""``promshift plan``: which metrics move, which labels they keep, what each group costs on AMP.

Reads the source (series, metadata, TSDB status, rules), its query log and dashboards, and writes
four files to ``--out``: ``metric_groups.draft.yaml`` (passes ``promshift catalog check``),
``plan.md``, ``plan.json`` and ``plan-cost.png``. It changes nothing on the source.

With ``--json`` the machine-readable plan (``plan.json``'s body) is printed on stdout and the summary goes
to stderr; the files are written all the same.

Exit codes: 0 a complete plan, 2 a partial plan (each thing it could not read is one line on
stderr and in plan.md), 64 bad input, 69 the source is unreachable.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

from promshift.cli.checks import EX_UNAVAILABLE, BackendUnavailable, InputError, _guarded
from promshift.core.durations import parse_duration
from promshift.core.inputs import InputBudget, InputRefused, MiB, parse_json_bounded
from promshift.core.redact import redact

EX_PARTIAL = 2
# No period, window or retention a plan reads is longer (Prometheus keeps weeks; AMP at most 1,095 days).
MAX_DURATION_S = 10 * 365 * 86_400.0
# An earlier plan.json: a large fleet's plan is a few MB.
PREVIOUS_PLAN = InputBudget("--previous", max_bytes=64 * MiB, max_depth=32)
# Where a plan is never written: the kernel's and devices' pseudo file systems.
_PSEUDO_FS = ("/proc", "/sys", "/dev")


def _duration(text: str, what: str) -> float:
    try:
        value = parse_duration(text)
    except (ValueError, OverflowError):
        raise InputError(f"{what} {text!r}: not a duration such as 7d or 1h") from None
    if value <= 0:
        raise InputError(f"{what} {text!r}: must be more than 0")
    if value > MAX_DURATION_S:
        raise InputError(f"{what} {text!r}: longer than 10y")
    return value


def _prices(path: str | None) -> Any:
    from promshift.adapters.files import read_user_file
    from promshift.adapters.settings import amp_prices_path
    from promshift.core.cost import AmpPrices, CostConfigError
    from promshift.core.inputs import SETTINGS, parse_yaml_bounded

    p = Path(path) if path else amp_prices_path()
    budget = dataclasses.replace(SETTINGS, what="AMP prices")
    try:
        doc = parse_yaml_bounded(read_user_file(p, budget), budget) or {}
        if not isinstance(doc, dict):
            raise CostConfigError(f"a {type(doc).__name__}, not a mapping")
        return AmpPrices.from_mapping(doc)
    except InputRefused as exc:
        raise InputError(" ".join(str(exc).split())[:300]) from None
    except CostConfigError as exc:
        raise InputError(f"AMP prices {p}: {' '.join(str(exc).split())[:200]}") from None


def _previous(path: str) -> dict[str, Any]:
    from promshift.adapters.files import read_user_file

    try:
        previous = parse_json_bounded(read_user_file(path, PREVIOUS_PLAN), PREVIOUS_PLAN)
    except InputRefused as exc:
        raise InputError(f"--previous {path}: cannot read a plan from it: {' '.join(str(exc).split())[:300]}") from None
    if not isinstance(previous, dict) or not isinstance(previous.get("groups"), list):
        raise InputError(f"--previous {path}: cannot read a plan from it: not a plan.json")
    return previous


def _out_folder(text: str) -> Path:
    """``--out`` as a folder the plan may be written to: refused (one line) before anything is read."""
    out = Path(text)
    resolved = out.resolve()
    pseudo = next((p for p in _PSEUDO_FS if resolved == Path(p) or Path(p) in resolved.parents), None)
    if pseudo is not None:
        raise InputError(f"--out {text}: {resolved} is under {pseudo}, not a folder for files")
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {text}: exists and is not a folder")
    parent = next((p for p in (resolved, *resolved.parents) if p.exists()), Path("/"))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"--out {text}: {parent} is not writable")
    return out


def write_outputs(out: Path, plan: dict[str, Any], *, caveats: list[str], diff: list[str] | None, source: str,
                  host_label: str, scrape_interval_s: float) -> dict[str, Path]:
    """Write the four files (each whole, through a temporary name); the draft gets ``catalog check``'s check."""
    from promshift.adapters.settings import check_catalog_file
    from promshift.adapters.usage import plan_files

    files = plan_files(plan, caveats=caveats, diff=diff, source=source, host_label=host_label,
                       scrape_interval_s=scrape_interval_s)
    written = {}
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            path = out / name
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            written[name] = path
    except OSError as exc:
        raise InputError(f"--out {out}: cannot write the plan: {exc.strerror or exc}") from None
    # The same check as `promshift catalog check`: a draft it refuses is a bug here, said, not hidden.
    # A plan without groups (nothing could be read) has an empty draft, which the check refuses: the plan's own
    # lines already say why, so that refusal is not repeated.
    check = check_catalog_file(written["metric_groups.draft.yaml"]) if plan.get("groups") else None
    if check is not None and check.problems:
        print(f"promshift plan: the catalog draft has {len(check.problems)} problem(s); first: {check.problems[0]}",
              file=sys.stderr)
    return written


def _plan(args: argparse.Namespace) -> int:
    from promshift.adapters.prometheus import PrometheusClient, PrometheusError
    from promshift.adapters.usage import PlanInputs, build_plan
    from promshift.core.plan import diff_plans

    period = _duration(args.period, "--period")
    window = _duration(args.series_window, "--series-window")
    retention = _duration(args.retention, "--retention") / 86_400.0
    deadline = _duration(args.deadline, "--deadline")
    if args.max_group_metrics < 1:
        raise InputError(f"--max-group-metrics {args.max_group_metrics}: must be at least 1")
    if not 0 <= args.collectors <= 10_000:
        raise InputError(f"--collectors {args.collectors}: must be 0 to 10000")
    out = _out_folder(args.out)
    prices = _prices(args.prices)
    previous = _previous(args.previous) if args.previous else None
    grafana = None
    if args.grafana_url:
        from promshift.adapters.grafana import GrafanaClient

        token = os.environ.get(args.grafana_token_env, "")
        if not token:
            raise InputError(f"--grafana-url given but ${args.grafana_token_env} is empty (the API token)")
        grafana = GrafanaClient(args.grafana_url, token)
    client = PrometheusClient(args.source, timeout_s=60.0)
    try:
        client.runtime_info()
    except PrometheusError as exc:
        if exc.http_status is None:
            raise BackendUnavailable(f"source {args.source}: {exc}") from None
    inputs = PlanInputs(query_logs=args.query_log, dashboards=args.dashboards, rule_files=args.rule_file,
                        grafana=grafana, rules_api=not args.no_rules_api, period_s=period, series_window_s=window,
                        protected_labels=[*(args.keep_label or ["job"]), args.host_label],
                        max_group_metrics=args.max_group_metrics, retention_days=retention, deadline_s=deadline,
                        collectors=args.collectors)
    try:
        outcome = build_plan(client, inputs, prices=prices, now=time.time())
    except PrometheusError as exc:
        raise BackendUnavailable(f"source {args.source}: {exc}") from None
    plan = redact(outcome.plan.to_dict())  # its notes quote servers' errors: redacted before anything shows them
    outcome.caveats[:] = redact(outcome.caveats)
    diff = diff_plans(previous, plan) if previous is not None else None
    written = write_outputs(out, plan, caveats=outcome.caveats, diff=diff, source=args.source,
                            host_label=args.host_label, scrape_interval_s=outcome.default_interval_s)
    for line in plan["not_read"]:
        print(f"promshift plan: not read: {line}", file=sys.stderr)
    for line in outcome.caveats:
        print(f"promshift plan: {line}", file=sys.stderr)
    # With --json, stdout carries the plan only (plan.json's body); the words go to stderr.
    words = sys.stderr if args.json else sys.stdout
    print(summary_text(plan, diff), file=words)
    for path in written.values():
        print(f"wrote {path}", file=words)
    if args.json:
        sys.stdout.write(written["plan.json"].read_text())
    return EX_PARTIAL if plan["partial"] else 0


def summary_text(plan: dict[str, Any], diff: list[str] | None = None) -> str:
    """A few lines for the terminal: groups in wave order, drops, what is left behind."""
    lines = [f"plan{' (PARTIAL)' if plan['partial'] else ''}: {len(plan['groups'])} groups, "
             f"${plan['totals']['before_usd']:,.2f}/month moving everything, ${plan['totals']['after_usd']:,.2f} "
             "moving what was read"]
    for g in plan["groups"]:
        lines.append(f"  wave {g['wave']}: {g['name']}: {len(g['metrics'])} metrics, {g['series']:,} series, "
                     f"{g['reads']:,} reads, labeldrop [{', '.join(g['labeldrop'])}], "
                     f"${g['cost_before']['total_usd']:,.2f} -> ${g['cost_after']['total_usd']:,.2f}/month")
    recorded = [a for a in plan.get("aggregations", ()) if a["recommended"]]
    if recorded:
        saved = plan.get("bill", {}).get("saved_by_aggregation_usd", 0.0)
        names = ", ".join(a["metric"] for a in recorded[:5]) + (" ..." if len(recorded) > 5 else "")
        lines.append(f"  aggregate before shipping: {len(recorded)} metrics ({names}), ${saved:,.2f}/month saved")
    if plan["unread_metrics"]:
        shown = plan["unread_metrics"][:8]
        lines.append(f"  left behind (nobody read them): {', '.join(shown)}"
                     + (f" and {len(plan['unread_metrics']) - 8} more" if len(plan["unread_metrics"]) > 8 else ""))
    if diff is not None:
        lines.append("  changes since the previous plan: " + ("; ".join(diff) if diff else "none"))
    return "\n".join(lines)


def add_plan_command(subparsers: Any) -> None:
    p = subparsers.add_parser("plan", help="plan the migration from real usage: groups, label drops, AMP cost",
                              description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("--source", required=True, help="the self-hosted Prometheus base URL")
    p.add_argument("--query-log", action="append", default=[], metavar="FILE",
                   help="Prometheus query log (query_log_file, JSON lines), or a glob of rotated ones "
                        "('query.log*'); repeatable")
    p.add_argument("--dashboards", action="append", default=[], metavar="GLOB",
                   help="Grafana dashboard JSON files or folders; repeatable")
    p.add_argument("--grafana-url", help="read every dashboard from this Grafana's API")
    p.add_argument("--grafana-token-env", default="GRAFANA_TOKEN", help="env var holding its API token")
    p.add_argument("--rule-file", action="append", default=[], metavar="GLOB", help="rule files; repeatable")
    p.add_argument("--no-rules-api", action="store_true", help="do not read the source's /api/v1/rules")
    p.add_argument("--period", default="30d", help="usage period: query-log lines this recent count (default 30d)")
    p.add_argument("--collectors", type=int, default=0,
                   help="managed collectors (AMP scrapers) that would scrape instead of a Prometheus: their fee is "
                        "in the bill (default 0: the source remote-writes)")
    p.add_argument("--json", action="store_true", help="print the machine-readable plan on stdout")
    p.add_argument("--series-window", default="1h", help="series seen this recently make the inventory")
    p.add_argument("--retention", default="150d", help="AMP retention for the storage cost (default 150d)")
    p.add_argument("--host-label", default="Hostname", help="never dropped: parity samples hosts by it")
    p.add_argument("--keep-label", action="append", default=None,
                   help="never recommend dropping this label; repeatable (default: job)")
    p.add_argument("--max-group-metrics", type=int, default=12, help="split families larger than this")
    p.add_argument("--prices", help="AMP prices YAML (default: $PROMSHIFT_AMP_PRICES or catalog/amp_prices.yaml)")
    p.add_argument("--previous", help="an earlier plan.json: the plan says what changed")
    p.add_argument("--deadline", default="10m", help="stop reading the inventory after this long")
    p.add_argument("--out", default="plan", help="output folder (default ./plan)")
    p.set_defaults(handler=_guarded(_plan))


__all__ = ["EX_PARTIAL", "EX_UNAVAILABLE", "add_plan_command", "summary_text", "write_outputs"]
