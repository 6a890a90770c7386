"""Read what a migration plan needs from the source: its series, rules, query log and dashboards.

Everything has a budget: the query log is read up to ``max_bytes`` and ``max_lines``, dashboards
and rule files up to a size each, the inventory until a deadline; what was not read is said in
one line each (``notes``) and the plan that follows is marked partial, never silently complete.

Prometheus' query log (``query_log_file``) is JSON lines, one per query: ``params.query``,
``params.start``/``end``/``step`` (range queries), ``ts``, and ``ruleGroup`` for rule
evaluations or ``httpRequest`` for API calls (checked against Debian's Prometheus 2.42).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from promshift.adapters.files import open_user_file, read_user_file
from promshift.core.inputs import CONFIG, DASHBOARD, RULES, InputRefused, parse_json_bounded, parse_yaml_bounded
from promshift.core.plan import LabelReads, MetricStats, Reader, UsageCollector, metric_stats
from promshift.core.promql import grafana_builtins, is_own_read
from promshift.core.redact import redact, redact_text

log = logging.getLogger(__name__)

MAX_QUERY_LOG_BYTES = 2 * 2**30
MAX_QUERY_LOG_LINES = 20_000_000
MAX_LINE_BYTES = 1 * 2**20
MAX_DASHBOARD_BYTES = 20 * 2**20
MAX_RULE_FILE_BYTES = 20 * 2**20
# The input budgets (core.inputs) at these sizes: regular files only, depth, alias expansion, UTF-8, time.
DASHBOARD_FILE = dataclasses.replace(DASHBOARD, max_bytes=MAX_DASHBOARD_BYTES)
RULE_FILE = dataclasses.replace(RULES, max_bytes=MAX_RULE_FILE_BYTES)


@dataclass
class ReadNotes:
    """What could not be read (the plan is partial when any ``missing``) and what was read with caveats."""

    missing: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)


def _one_more_read(acc: list[Any], points: float, seen: float | None) -> None:
    """Another read of an expression already counted: ``[count, points, last seen, reader, first seen]``."""
    acc[0] += 1
    acc[1] += points
    if seen is not None:
        if acc[2] is None or seen > acc[2]:
            acc[2] = seen
        if acc[4] is None or seen < acc[4]:
            acc[4] = seen


def _ts(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass
class QueryLogSummary:
    path: str
    lines: int = 0
    read: int = 0
    bad: int = 0
    first_bad: str = ""
    outside_period: int = 0
    own_reads: int = 0  # promshift's own queries (core.promql.is_own_read): left out
    truncated: bool = False
    first_ts: float | None = None
    last_ts: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def query_log_paths(patterns: Sequence[str], notes: ReadNotes) -> list[str | Any]:
    """The query-log files: each ``--query-log`` a file, a glob (rotation: ``query.log*``) or an object-store path;
    each file once, in name order within a glob. A glob matching nothing is one note (the plan is partial)."""
    out: list[str | Any] = []
    for pattern in patterns:
        if not isinstance(pattern, str) or not glob.has_magic(pattern):
            out.append(pattern)
            continue
        found = sorted(glob.glob(pattern))
        if not found:
            notes.missing.append(f"query log {pattern}: no file matches")
        out.extend(found)
    seen: set[str] = set()
    return [p for p in out if not (str(p) in seen or seen.add(str(p)))]


def read_query_log(path: str | Path | Any, usage: UsageCollector, notes: ReadNotes, *, since: float | None = None,
                   until: float | None = None, max_bytes: int = MAX_QUERY_LOG_BYTES,
                   max_lines: int = MAX_QUERY_LOG_LINES) -> QueryLogSummary:
    """Attribute every query in a Prometheus query log to its metrics and labels.

    Rule evaluations (``ruleGroup``) count as reads by that rule group; API queries as
    ``query_log`` reads. Lines outside [since, until] are skipped. An empty log, a cut last
    line, lines that are not JSON or not a query log entry, and the byte/line budgets each
    give one note.
    """
    path = Path(path) if isinstance(path, str) else path  # or an ObjectStoragePath (s3://...)
    summary = QueryLogSummary(str(path))
    try:  # a local file must be a regular one (a FIFO would hang the plan, /dev/zero never end)
        handle = open_user_file(path, "query log") if isinstance(path, Path) else path.open("rb")
    except InputRefused as exc:
        notes.missing.append(str(exc))
        return summary
    except OSError as exc:
        notes.missing.append(f"query log {path}: cannot read: {exc.strerror or exc}")
        return summary
    budget = max_bytes
    api = Reader("query_log", "ad-hoc and dashboard API queries")
    rules: dict[bytes, Reader] = {}
    strings: dict[bytes, str] = {}
    minutes: dict[bytes, float | None] = {}
    # Reads summed per (expression, reader) first, then handed over once each: a million lines, a few
    # thousand distinct reads.
    acc: dict[tuple[str, int], list[Any]] = {}
    def one(raw: bytes) -> bool:
        """One line the careful way; False when reading must stop."""
        nonlocal budget
        if summary.lines >= max_lines or budget <= 0:
            notes.missing.append(f"query log {path}: stopped after {summary.lines:,} lines / "
                                 f"{max_bytes - budget:,} bytes (budget); the rest was not read")
            return False
        budget -= len(raw)
        summary.lines += 1
        if len(raw) > MAX_LINE_BYTES:
            size = f"{len(raw):,} bytes" if raw.endswith(b"\n") else f"more than {len(raw):,} bytes"
            _bad(summary, f"line {summary.lines}: {size}, over {MAX_LINE_BYTES:,}; skipped")
            return True
        entry = _fast_entry(raw, strings, minutes, rules) if raw.endswith(b"}\n") else None
        if entry is None:
            entry = _slow_entry(raw)
        if entry is None:
            if not raw.endswith(b"\n"):
                summary.truncated = True
                return False
            _bad(summary, f"line {summary.lines}: not a query log entry: {raw[:60]!r}")
            return True
        count(*entry)
        return True

    def count(expr: str, seen: float | None, points: float, reader: Reader | None) -> None:
        if seen is not None:
            if (since is not None and seen < since) or (until is not None and seen > until):
                summary.outside_period += 1
                return
        if is_own_read(expr):
            summary.own_reads += 1
            return
        if usage.usage_of(expr) is None:
            usage.unparsable_reads += 1
            _bad(summary, f"line {summary.lines}: query does not parse ({usage.unparsable.get(expr, '')[:120]}): "
                          f"{expr[:80]!r}")
            return
        key = (expr, id(reader))  # readers are shared objects: no dataclass hash per line
        a = acc.get(key)
        if a is None:
            acc[key] = [1, points, seen, reader or api, seen]  # count, points, last seen, reader, first seen
        else:
            _one_more_read(a, points, seen)
        summary.read += 1

    def block(part: bytes) -> bool:
        """A run of whole lines: one regex pass when every line has Prometheus' own shape, else line by line."""
        nonlocal budget
        lines = part.count(b"\n")
        if (part.endswith(b"\n") and summary.lines + lines <= max_lines and budget - len(part) >= 0
                and len(part) <= lines * MAX_LINE_BYTES):
            found = _LINE.findall(part)
            if len(found) == lines:
                budget -= len(part)
                mget = minutes.get
                lo = -math.inf if since is None else since
                hi = math.inf if until is None else until
                for end, token, begin, step, rule_file, rule_name, ts in found:
                    summary.lines += 1
                    expr = strings.get(token)
                    if expr is None:
                        expr = strings[token] = json.loads(token)
                    base = mget(ts[:16]) if ts[16:17] == b":" else None
                    seen = base + float(ts[17:-1]) if base is not None else _fast_ts(ts, minutes)
                    if seen is not None and not lo <= seen <= hi:
                        summary.outside_period += 1
                        continue
                    points = 1.0
                    if step != b"0":
                        a, b = _fast_ts(begin, minutes), _fast_ts(end, minutes)
                        width = float(step)
                        if a is not None and b is not None and b >= a and width > 0:
                            points = (b - a) // width + 1
                    reader = None
                    if rule_file:
                        reader = rules.get(rule_file + rule_name)
                        if reader is None:
                            reader = rules[rule_file + rule_name] = Reader(
                                "rule", f"{json.loads(rule_file)} / {json.loads(rule_name)}")
                    key = (expr, id(reader))
                    acc_line = acc.get(key)
                    if acc_line is not None:  # seen before: it parsed
                        _one_more_read(acc_line, points, seen)
                        summary.read += 1
                    else:
                        count(expr, seen, points, reader)
                return True
        return all(one(raw) for raw in part.splitlines(keepends=True))

    with handle:
        pending = b""
        going = True
        skipping = False  # inside a line longer than a line may be: its rest is dropped up to its newline
        while going:
            chunk = handle.read(_CHUNK)
            if not chunk:
                break
            if skipping:
                newline = chunk.find(b"\n")
                budget -= len(chunk) if newline < 0 else newline + 1
                if newline < 0:
                    continue
                chunk, skipping = chunk[newline + 1:], False
            data = pending + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0 and len(data) > MAX_LINE_BYTES:
                going = one(data)  # one line longer than a line may be: noted, skipped; the next lines are read
                pending, skipping = b"", True
                continue
            pending = data[cut:]
            going = block(data[:cut])
        if going and pending:
            one(pending)  # no newline at the end: cut short, unless it is a whole entry
    for (expr, _), (reads, points, seen, reader, first) in acc.items():
        usage.add(expr, reader, count=reads, points=points, seen=seen)
        if seen is not None:
            summary.last_ts = seen if summary.last_ts is None else max(summary.last_ts, seen)
        if first is not None:
            summary.first_ts = first if summary.first_ts is None else min(summary.first_ts, first)
    if summary.lines == 0:
        notes.missing.append(f"query log {path}: empty (is query_log_file set, and did anyone query?)")
    elif summary.truncated:
        notes.caveats.append(f"query log {path}: last line cut short (still being written, or truncated); "
                             "it was skipped")
    if summary.bad:
        notes.caveats.append(f"query log {path}: {summary.bad:,} of {summary.lines:,} lines not used; first: "
                             f"{summary.first_bad}")
    if summary.own_reads:
        notes.caveats.append(f"query log {path}: {summary.own_reads:,} of promshift's own reads (its parity, latency "
                             "and bake queries) left out")
    if summary.lines and not summary.read and not summary.outside_period and not summary.own_reads:
        notes.missing.append(f"query log {path}: no usable line")
    return summary


# Prometheus writes each entry with Go's encoder: keys sorted, no spaces. The fast path reads that shape
# with one regex and decodes only the query string (once per distinct one); anything else is json.loads'd.
_STR = rb'"[^"\\\n]*(?:\\.[^"\\\n]*)*"'  # a JSON string, the unrolled loop (no per-character alternation)
_FAST = re.compile(rb'"params":\{"end":"([^"]*)","query":(' + _STR + rb'),"start":"([^"]*)","step":([0-9.eE+-]+)\}'
                   rb'(?:,"ruleGroup":\{"file":(' + _STR + rb'),"name":(' + _STR + rb')\})?')


# Whole lines in Prometheus' shape, many at a time: (end, query, start, step, rule file, rule name, ts).
_LINE = re.compile(rb'(?m)^\{(?:"httpRequest":\{[^{}\n]*\},)?"params":\{"end":"([^"\n]*)","query":(' + _STR
                   + rb'),"start":"([^"\n]*)","step":([0-9.eE+-]+)\}(?:,"ruleGroup":\{"file":(' + _STR
                   + rb'),"name":(' + _STR + rb')\})?,[^\n]*"ts":"([^"\n]*)"\}\n')
_CHUNK = 8 * 2**20


def _minute(prefix: bytes, minutes: dict[bytes, float | None]) -> float | None:
    if prefix not in minutes:
        minutes[prefix] = _ts(prefix.decode() + "Z")
    return minutes[prefix]


def _fast_ts(text: bytes, minutes: dict[bytes, float | None]) -> float | None:
    if len(text) >= 17 and text[16:17] == b":" and text.endswith(b"Z"):
        base = _minute(text[:16], minutes)
        try:
            return None if base is None else base + float(text[17:-1])
        except ValueError:
            return _ts(text.decode())
    return _ts(text.decode()) if text else None


def _fast_entry(raw: bytes, strings: dict[bytes, str], minutes: dict[bytes, float | None],
                rules: dict[bytes, Reader]) -> tuple[str, float | None, float, Reader | None] | None:
    start = raw.find(b'"params":{')
    m = _FAST.match(raw, start) if start >= 0 else None
    at = raw.rfind(b'"ts":"')
    if m is None or at < 0 or not raw.endswith(b'Z"}\n'):
        return None
    token = m.group(2)
    expr = strings.get(token)
    if expr is None:
        try:
            expr = strings[token] = json.loads(token)
        except ValueError:
            return None
    seen = _fast_ts(raw[at + 6:-3], minutes)
    points = 1.0
    step = float(m.group(4))
    if step > 0:
        a, b = _fast_ts(m.group(3), minutes), _fast_ts(m.group(1), minutes)
        if a is not None and b is not None and b >= a:
            points = (b - a) // step + 1
    reader = None
    if m.group(5) is not None:
        rkey = m.group(5) + m.group(6)
        reader = rules.get(rkey)
        if reader is None:
            reader = rules[rkey] = Reader("rule", f"{json.loads(m.group(5))} / {json.loads(m.group(6))}")
    return expr, seen, points, reader


def _slow_entry(raw: bytes) -> tuple[str, float | None, float, Reader | None] | None:
    try:
        entry = json.loads(raw)
        params = entry["params"]
        expr = params["query"]
        if not isinstance(expr, str):
            raise TypeError
    except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: JSON nested too deeply
        return None
    group = entry.get("ruleGroup")
    reader = Reader("rule", f"{group.get('file', '?')} / {group.get('name', '?')}") if isinstance(group, dict) else None
    points = 1.0
    start, end, step = params.get("start"), params.get("end"), params.get("step")
    if start and end and step and isinstance(step, (int, float)) and step > 0:
        a, b = _ts(start), _ts(end)
        if a is not None and b is not None and b >= a:
            points = (b - a) // step + 1
    return expr, _ts(entry.get("ts")), points, reader


def _bad(summary: QueryLogSummary, why: str) -> None:
    summary.bad += 1
    if not summary.first_bad:
        summary.first_bad = why


def read_dashboard_files(patterns: Sequence[str], usage: UsageCollector, notes: ReadNotes, *,
                         step_s: float = 30.0, range_s: float = 3600.0) -> int:
    """Dashboards from JSON files (globs, or folders of ``*.json``); the number read."""
    paths: list[Path] = []
    for pattern in patterns:
        p = Path(pattern)
        found = sorted(p.glob("*.json")) if p.is_dir() else [Path(x) for x in sorted(glob.glob(pattern))]
        if not found:
            notes.missing.append(f"dashboards {pattern}: no file matches")
        paths.extend(found)
    read = 0
    for path in paths:
        try:
            model = parse_json_bounded(read_user_file(path, DASHBOARD_FILE), DASHBOARD_FILE)
        except InputRefused as exc:
            notes.missing.append(f"dashboard {path}: cannot read: {str(exc).splitlines()[0][:200]}")
            continue
        if isinstance(model, dict) and isinstance(model.get("dashboard"), dict):
            model = model["dashboard"]  # the API's envelope, as exported
        if not isinstance(model, dict):
            notes.missing.append(f"dashboard {path}: not a dashboard (a JSON object)")
            continue
        if not isinstance(model.get("panels", []), list) or not isinstance(model.get("rows", []), list):
            notes.missing.append(f"dashboard {path}: 'panels' and 'rows' must be lists; not read")
            continue
        notes.caveats.extend(usage.add_dashboard(model, path.name, builtins=grafana_builtins(step_s, range_s)))
        read += 1
    return read


def read_grafana(client: Any, usage: UsageCollector, notes: ReadNotes, *, step_s: float = 30.0,
                 range_s: float = 3600.0, limit: int = 1000) -> int:
    """Every dashboard the Grafana API lists (``adapters/grafana.GrafanaClient``); the number read."""
    try:
        hits = client.search("", limit=limit)
    except Exception as exc:  # noqa: BLE001 - any failure of an outside system is one note
        notes.missing.append(f"grafana: cannot list dashboards: {str(exc).splitlines()[0][:160]}")
        return 0
    if not isinstance(hits, list):
        notes.missing.append(f"grafana: the dashboard search answered {type(hits).__name__}, not a list")
        return 0
    read = 0
    for hit in hits:
        uid = hit.get("uid") if isinstance(hit, dict) else None
        if not uid or hit.get("type", "dash-db") != "dash-db":
            continue
        try:
            got = client.get_dashboard(uid)
        except Exception as exc:  # noqa: BLE001
            notes.missing.append(f"grafana dashboard {uid}: {str(exc).splitlines()[0][:160]}")
            continue
        model = got.get("dashboard") if isinstance(got, dict) else None
        if isinstance(model, dict):
            name = str(model.get("title") or uid)
            notes.caveats.extend(usage.add_dashboard(model, name, builtins=grafana_builtins(step_s, range_s)))
            read += 1
    return read


def _add_rule_groups(groups: Any, usage: UsageCollector, notes: ReadNotes, where: str) -> int:
    count = 0
    if not isinstance(groups, list):
        notes.missing.append(f"rules {where}: no list of rule groups ('groups' is {type(groups).__name__}); "
                             "not read")
        return 0
    for group in groups:
        if not isinstance(group, dict):
            continue
        gname = f"{group.get('file', where)} / {group.get('name', '?')}"
        for rule in group.get("rules") or []:
            if not isinstance(rule, dict):
                continue
            expr = rule.get("query", rule.get("expr"))
            if not isinstance(expr, str):
                continue
            name = rule.get("record") or rule.get("alert") or rule.get("name") or "?"
            if not usage.add(expr, Reader("rule", f"{gname} / {name}")):
                notes.caveats.append(f"rule {name} in {gname}: does not parse: {usage.unparsable.get(expr, '')[:100]}")
            count += 1
    return count


def read_rules_api(client: Any, usage: UsageCollector, notes: ReadNotes) -> int:
    """Recording and alerting rules from ``/api/v1/rules``; the number read."""
    try:
        data = client.api_get("/api/v1/rules")
    except Exception as exc:  # noqa: BLE001
        notes.missing.append(f"source /api/v1/rules: {str(exc).splitlines()[0][:160]}")
        return 0
    if not isinstance(data, dict):
        notes.missing.append(f"source /api/v1/rules: 'data' is {type(data).__name__}, not an object; not read")
        return 0
    return _add_rule_groups(data.get("groups"), usage, notes, "api")


def read_rule_files(paths: Sequence[str], usage: UsageCollector, notes: ReadNotes) -> int:
    """Rules from Prometheus rule files (YAML ``groups:``); the number read."""
    count = 0
    for pattern in paths:
        found = sorted(glob.glob(pattern)) or [pattern]
        for name in found:
            path = Path(name)
            try:
                doc = parse_yaml_bounded(read_user_file(path, RULE_FILE), RULE_FILE)
            except InputRefused as exc:
                notes.missing.append(f"rule file {path}: cannot read: {str(exc).splitlines()[0][:200]}")
                continue
            groups = doc.get("groups") if isinstance(doc, dict) else None
            for g in groups if isinstance(groups, list) else []:
                if isinstance(g, dict):
                    g.setdefault("file", path.name)
            count += _add_rule_groups(groups, usage, notes, f"file {path}")
    return count


def scrape_intervals(config_text: str) -> tuple[dict[str, float], float]:
    """Per job its scrape interval in seconds, and the global one, from a Prometheus config."""
    from promshift.core.durations import parse_duration

    doc = parse_yaml_bounded(config_text, CONFIG) or {}
    if not isinstance(doc, dict):
        raise InputRefused(f"the config is a {type(doc).__name__}, not a mapping")
    glob_ = doc.get("global") or {}
    if not isinstance(glob_, dict):
        raise InputRefused(f"'global' is a {type(glob_).__name__}, not a mapping")
    default = parse_duration(str(glob_.get("scrape_interval", "1m")))
    jobs = doc.get("scrape_configs") or []
    if not isinstance(jobs, list):
        raise InputRefused(f"'scrape_configs' is a {type(jobs).__name__}, not a list")
    out: dict[str, float] = {}
    for job in jobs:
        if isinstance(job, dict) and job.get("job_name"):
            # A job without its own interval scrapes at the global one (as the global value, not re-parsed).
            own = job.get("scrape_interval")
            out[str(job["job_name"])] = parse_duration(str(own)) if own else default
    return out, default


@dataclass
class Inventory:
    metrics: dict[str, MetricStats]
    tsdb: dict[str, Any] | None
    default_interval_s: float


def read_inventory(client: Any, reads: LabelReads, notes: ReadNotes, *, now: float, window_s: float = 3600.0,
                   protected: Iterable[str] = (), deadline_s: float = 600.0,
                   clock: Callable[[], float] = time.monotonic, shapes: Any = None) -> Inventory:
    """Per metric: series, labels, type, samples/s and the drop check, one metric's series at a time.

    ``shapes`` (``core.aggregation.ShapeIndex``): how the reads aggregate each metric; the series of the level
    they allow are counted while the metric's series are at hand."""
    started = clock()
    tsdb: dict[str, Any] | None = None
    try:
        answer = client.api_get("/api/v1/status/tsdb")
        if answer is not None and not isinstance(answer, dict):
            raise ValueError(f"'data' is {type(answer).__name__}, not an object")
        tsdb = answer
    except Exception as exc:  # noqa: BLE001
        notes.missing.append(f"source /api/v1/status/tsdb: {str(exc).splitlines()[0][:160]} (head totals and "
                             "the top-10 cross-check are missing; series counts come from /api/v1/series)")
    metadata: Mapping[str, list[dict[str, str]]] = {}
    try:
        metadata = client.metadata()
    except Exception as exc:  # noqa: BLE001
        notes.missing.append(f"source /api/v1/metadata: {str(exc).splitlines()[0][:160]} (metric types unknown)")
    intervals: dict[str, float] = {}
    default = 30.0
    try:
        intervals, default = scrape_intervals(client.config_text())
    except Exception as exc:  # noqa: BLE001
        # Every job's samples per second, so every cost, rests on the intervals: without them the plan is partial.
        notes.missing.append(f"source config: {str(exc).splitlines()[0][:200]}; scrape interval taken as 30s")
    start, end = now - window_s, now
    names = client.label_values("__name__", '{__name__=~".+"}', start=start, end=end)
    metrics: dict[str, MetricStats] = {}
    for i, name in enumerate(sorted(names)):
        if clock() - started > deadline_s:
            notes.missing.append(f"inventory: deadline of {deadline_s:g}s reached after {i} of {len(names)} metrics; "
                                 f"not read: {', '.join(sorted(names)[i:i + 5])}{' ...' if len(names) - i > 5 else ''}")
            break
        try:
            series = client.api_get("/api/v1/series", {"match[]": f'{{__name__="{name}"}}', "start": f"{start:.3f}",
                                                      "end": f"{end:.3f}"})
        except Exception as exc:  # noqa: BLE001
            notes.missing.append(f"series of {name}: {str(exc).splitlines()[0][:160]}")
            continue
        if series is not None and not isinstance(series, list):
            notes.missing.append(f"series of {name}: 'data' is {type(series).__name__}, not a list")
            continue
        series = [s for s in series or [] if isinstance(s, dict)]
        labels = set().union(*series) if series else set()
        types = {e.get("type", "unknown") for e in metadata.get(name, [])}
        type_ = "/".join(sorted(types)) or "unknown"
        metrics[name] = metric_stats(name, series, candidates=reads.candidates(name, labels, protected),
                                     type_=type_, scrape_interval_s=intervals, default_interval_s=default,
                                     level=shapes.level(name, labels, type_) if shapes is not None else None)
        del series
    if tsdb:
        top = {e.get("name"): e.get("value") for e in tsdb.get("seriesCountByMetricName") or [] if isinstance(e, dict)}
        off = [n for n, v in top.items() if n in metrics and isinstance(v, int) and v and
               abs(metrics[n].series - v) / v > 0.5]
        if off:
            notes.caveats.append(f"series counts of {', '.join(off)} differ from the TSDB head's by over half "
                                 f"(churn in the {window_s:g}s window)")
    return Inventory(metrics, tsdb, default)


@dataclass
class PlanInputs:
    """Where the usage comes from; every path and URL optional but the source."""

    query_logs: Sequence[str] = ()
    dashboards: Sequence[str] = ()
    rule_files: Sequence[str] = ()
    grafana: Any = None  # a GrafanaClient
    rules_api: bool = True
    period_s: float = 30 * 86_400.0  # a month: month-end and weekly reports are reads too
    collectors: int = 0  # managed collectors (AMP scrapers) that would scrape instead of a Prometheus
    series_window_s: float = 3600.0
    protected_labels: Sequence[str] = ()
    max_group_metrics: int = 12
    retention_days: float = 150.0
    deadline_s: float = 600.0


@dataclass
class PlanOutcome:
    plan: Any  # core.plan.Plan
    caveats: list[str]
    query_logs: list[QueryLogSummary]
    default_interval_s: float


def build_plan(client: Any, inputs: PlanInputs, *, prices: Any, now: float) -> PlanOutcome:
    """Read usage first (so each metric's drop candidates are known), then the inventory, then recommend."""
    from promshift.core.plan import label_reads, recommend
    from promshift.core.plan_aggregation import aggregate_plan, shape_index

    usage = UsageCollector()
    notes = ReadNotes()
    logs = [read_query_log(p, usage, notes, since=now - inputs.period_s, until=now)
            for p in query_log_paths(inputs.query_logs, notes)]
    if not inputs.query_logs:
        notes.missing.append("query log: none given (--query-log); ad-hoc reads are not counted")
    if inputs.dashboards:
        read_dashboard_files(inputs.dashboards, usage, notes)
    if inputs.grafana is not None:
        read_grafana(inputs.grafana, usage, notes)
    if inputs.rules_api:
        read_rules_api(client, usage, notes)
    if inputs.rule_files:
        read_rule_files(inputs.rule_files, usage, notes)
    index = shape_index(usage)
    inventory = read_inventory(client, label_reads(usage), notes, now=now, window_s=inputs.series_window_s,
                               protected=inputs.protected_labels, deadline_s=inputs.deadline_s, shapes=index)
    plan = recommend(inventory.metrics, usage, prices=prices, retention_days=inputs.retention_days,
                     period_s=inputs.period_s, now=now, protected_labels=inputs.protected_labels,
                     max_group_metrics=inputs.max_group_metrics, not_read=notes.missing,
                     default_interval_s=inventory.default_interval_s)
    plan = aggregate_plan(plan, inventory.metrics, usage, prices=prices, retention_days=inputs.retention_days,
                          index=index, collectors=inputs.collectors)
    return PlanOutcome(plan, notes.caveats, logs, inventory.default_interval_s)


PLAN_FILES = ("metric_groups.draft.yaml", "plan.md", "plan.json", "plan-cost.png")


def plan_files(plan: Mapping[str, Any], *, caveats: Sequence[str], diff: Sequence[str] | None, source: str,
               host_label: str, scrape_interval_s: float) -> dict[str, bytes]:
    """The plan's four outputs as bytes (``PLAN_FILES``), for a folder or an object store.

    Redacted on entry (``core.redact``): the source URL may carry ``user:password@``, and the plan's notes quote
    servers' error texts; no secret reaches a file that is uploaded as a report."""
    from promshift.adapters.charts import plan_cost_chart_png
    from promshift.core.plan_render import catalog_draft, plan_markdown

    plan, caveats, source = redact(dict(plan)), redact(list(caveats)), redact_text(source)
    diff = None if diff is None else redact(list(diff))
    body = {**plan, "caveats": list(caveats), "diff": None if diff is None else list(diff)}
    return {
        "metric_groups.draft.yaml": catalog_draft(plan, host_label=host_label,
                                                  scrape_interval_s=scrape_interval_s).encode(),
        "plan.md": plan_markdown(plan, notes=caveats, diff=diff, source=source).encode(),
        "plan.json": (json.dumps(body, indent=1, allow_nan=False) + "\n").encode(),
        "plan-cost.png": plan_cost_chart_png(list(plan["groups"]), title="AMP cost per group, per month"),
    }
