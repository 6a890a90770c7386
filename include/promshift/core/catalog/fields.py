"""Field converters (raw YAML value -> checked model value) and the tables of which key fills which field."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

from promshift.core.approvers import TEAM_PREFIX, team_name_problem
from promshift.core.catalog.model import (
    _CONN_ID_RE,
    _GROUP_NAME_RE,
    _LABEL_NAME_RE,
    _METRIC_NAME_RE,
    AGGREGATION_FAMILY,
    AGGREGATION_OPERATIONS,
    CONN_ID_MAX_LENGTH,
    MAX_QUEUE_CAP,
    NOTIFY_CHANNELS,
    PARITY_ENGINES,
    PARITY_MODES,
    PROBE_ENCODINGS,
    Aggregate,
    BakePolicy,
    LatencyPolicy,
    LatencyWindow,
    NotifyPolicy,
    ParityPolicy,
    ReplicaPolicy,
    TenantPolicy,
    WarmupPolicy,
)
from promshift.core.catalog.regex import _go_regexp_problem, _re2_error
from promshift.core.durations import format_duration, parse_duration
from promshift.core.promql import PromQLError
from promshift.core.promql import parse as parse_promql

# --------------------------------------------------------------------------- field converters


class _Invalid(Exception):
    """A raw value failed validation: (field-path suffix, reason) pairs."""

    def __init__(self, *issues: tuple[str, str]) -> None:
        super().__init__(issues)
        self.issues = issues


def _fail(reason: str) -> NoReturn:
    raise _Invalid(("", reason))


def _clip(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out: no message quotes a huge value."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _show(value: Any) -> str:
    """``repr(value)`` for a message, clipped (an int too long for repr says so)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"an integer of about {int(value.bit_length() * 0.30103):,} digits"
    return _clip(repr(value))


def _type_name(value: Any) -> str:
    return {dict: "a mapping", list: "a list", type(None): "null"}.get(type(value)) or _show(value)


# C0 controls (but tab and newline), DEL and lone surrogates ("\ud800" in a double-quoted YAML
# string): they cannot be encoded as UTF-8 for RE2, the PromQL parser or a config file.
_BAD_CHARACTER_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f\ud800-\udfff]")
# Upper bounds: values past these are typos, and some (timedelta, int -> float) would raise later.
MAX_INTEGER = 1_000_000_000
MAX_DURATION_S = 10 * 365 * 86400.0


Converter = Callable[[Any], Any]


def _string(*, allow_empty: bool = False) -> Converter:
    def convert(value: Any) -> str:
        if not isinstance(value, str):
            _fail(f"must be a string, got {_type_name(value)}")
        if not allow_empty and not value.strip():
            _fail("must be a non-empty string")
        bad = _BAD_CHARACTER_RE.search(value)
        if bad is not None:
            _fail(f"contains the control character or lone surrogate {bad.group(0)!r}")
        return value

    return convert


def _optional_string(value: Any) -> str | None:
    if value is None:
        return None
    return _string()(value)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        _fail(f"must be true or false, got {_type_name(value)}")
    return value


def _pattern_string(regex: re.Pattern[str], what: str, *, max_length: int | None = None) -> Converter:
    def convert(value: Any) -> str:
        if not isinstance(value, str) or regex.fullmatch(value) is None:
            _fail(f"must be a {what} matching {regex.pattern}, got {_type_name(value)}")
        if max_length is not None and len(value) > max_length:
            _fail(f"must be at most {max_length} characters, got {len(value)}: {_show(value)}")
        return value

    return convert


# Airflow's limits on what a group name becomes: the DAG id ``promshift__<name>`` must fit Airflow's
# 250-character key limit (airflow.utils.helpers.validate_key), and the tag ``group:<name>`` the
# 100-character TAG_MAX_LEN (airflow.sdk.definitions.dag); the tag is the tighter one.
GROUP_NAME_MAX_LENGTH = min(250 - len("promshift__"), 100 - len("group:"))


# Far longer than any real user or team id; Airflow keeps each DAG owner in a 500-character column.
MAX_USER_ID_LENGTH = 100


def _user_id(value: Any) -> str:
    """An Airflow user id (owners, approvers): compared exactly, so no stray whitespace."""
    text = _string()(value)
    if text != text.strip():
        _fail(f"has stray whitespace: {_show(text)} (Airflow user ids are compared exactly)")
    if any(char.isspace() for char in text):
        _fail(f"contains whitespace: {_show(text)} (Airflow user ids are compared exactly)")
    if len(text) > MAX_USER_ID_LENGTH:
        _fail(f"must be at most {MAX_USER_ID_LENGTH} characters, got {len(text)}: {_show(text)}")
    return text


def _approver(value: Any) -> str:
    """A user id, or ``team:<name>``: a team resolved to its members when the approval is asked."""
    text = _user_id(value)
    if text[:len(TEAM_PREFIX)].lower() == TEAM_PREFIX and not text.startswith(TEAM_PREFIX):
        _fail(f"{_show(text)}: write the team prefix in lower case ({TEAM_PREFIX!r}); as written it is a user id")
    problem = team_name_problem(text)
    if problem:
        _fail(problem)
    return text


def _integer(*, minimum: int, maximum: int = MAX_INTEGER) -> Converter:
    def convert(value: Any) -> int:
        # bool is an int subclass; YAML turns "yes"/"on" into True.
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(f"must be an integer, got {_type_name(value)}")
        if value < minimum:
            _fail(f"must be >= {minimum}, got {_show(value)}")
        if value > maximum:
            _fail(f"must be <= {maximum:,}, got {_show(value)}")
        return value

    return convert


def _number(*, minimum: float, maximum: float | None = None) -> Converter:
    def convert(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            _fail(f"must be a finite number, got {_type_name(value)}")
        try:
            number = float(value)
        except OverflowError:  # an int beyond float range
            _fail(f"must be a finite number, got {_show(value)}")
        if not math.isfinite(number):
            _fail(f"must be a finite number, got {_type_name(value)}")
        if maximum is not None and not minimum <= number <= maximum:
            _fail(f"must be between {minimum} and {maximum}, got {_show(value)}")
        if number < minimum:
            _fail(f"must be >= {minimum}, got {_show(value)}")
        return number

    return convert


def _duration(*, positive: bool) -> Converter:
    def convert(value: Any) -> float:
        # Numbers are refused on purpose: is "30" seconds or minutes? And YAML
        # 1.1 reads 1:30 as the integer 90.
        if not isinstance(value, str):
            _fail(f"must be a duration string like '10m', got {_type_name(value)}")
        if len(value) > 64:
            _fail(f"invalid duration {_show(value)}: too long")
        try:
            seconds = parse_duration(value)
        except (ValueError, OverflowError) as exc:
            _fail(_clip(str(exc), 200))
        if positive and seconds <= 0:
            _fail(f"must be > 0, got {value!r}")
        if seconds > MAX_DURATION_S:
            _fail(f"must be at most {format_duration(MAX_DURATION_S)} (10 years), got {value!r}")
        return seconds

    return convert


def _choice(choices: tuple[str, ...]) -> Converter:
    def convert(value: Any) -> str:
        if value not in choices:
            _fail(f"must be one of {', '.join(repr(c) for c in choices)}, got {_type_name(value)}")
        return str(value)

    return convert


def _unique_list(item: Converter, *, what: str, non_empty: bool) -> Converter:
    """Convert a list whose items each pass ``item`` and appear once."""

    def convert(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list):
            _fail(f"must be a list, got {_type_name(value)}")
        if non_empty and not value:
            _fail(f"must list at least one {what}")
        issues: list[tuple[str, str]] = []
        result: list[Any] = []
        first_index: dict[Any, int] = {}
        for index, raw in enumerate(value):
            try:
                converted = item(raw)
            except _Invalid as exc:
                issues.extend((f"[{index}]{suffix}", reason) for suffix, reason in exc.issues)
                continue
            if converted in first_index:
                issues.append(
                    (f"[{index}]", f"duplicate {what} {_show(converted)} (also [{first_index[converted]}])")
                )
                continue
            first_index[converted] = index
            result.append(converted)
        if issues:
            raise _Invalid(*issues)
        return tuple(result)

    return convert


def _label_renames(value: Any) -> tuple[tuple[str, str], ...]:
    """Convert ``{from_label: to_label}`` to (from, to) pairs in file order."""
    if not isinstance(value, dict):
        _fail(f"must be a mapping of label -> new label, got {_type_name(value)}")
    label = _pattern_string(_LABEL_NAME_RE, "label name")
    issues: list[tuple[str, str]] = []
    pairs: list[tuple[str, str]] = []
    sources_by_target: dict[str, str] = {}
    for source, target in value.items():
        suffix = f".{source}"
        try:
            pair = (label(source), label(target))
        except _Invalid as exc:
            issues.extend((suffix, reason) for _, reason in exc.issues)
            continue
        if pair[1] in sources_by_target:
            issues.append((suffix, f"renames to {pair[1]!r}, as {sources_by_target[pair[1]]!r} already does"))
            continue
        sources_by_target[pair[1]] = pair[0]
        pairs.append(pair)
    if issues:
        raise _Invalid(*issues)
    return tuple(pairs)


def _template_values(value: Any) -> tuple[tuple[str, str], ...]:
    """Convert ``{variable: value}`` (Grafana template variables) to pairs in file order."""
    if not isinstance(value, dict):
        _fail(f"must be a mapping of template variable -> value, got {_type_name(value)}")
    pairs = []
    issues: list[tuple[str, str]] = []
    for name, text in value.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            issues.append((f".{name}", "must be a template variable name"))
        elif not isinstance(text, str):
            issues.append((f".{name}", f"must be a string, got {_type_name(text)}"))
        else:
            pairs.append((name, text))
    if issues:
        raise _Invalid(*issues)
    return tuple(pairs)


def _pairs(what: str, *, key: Converter, value: Converter) -> Converter:
    """``{key: value}`` (a label set; replica -> connection id) to pairs in file order, each side checked."""
    def convert(raw: Any) -> tuple[tuple[str, str], ...]:
        if not isinstance(raw, dict):
            _fail(f"must be a mapping of {what}, got {_type_name(raw)}")
        pairs = []
        issues: list[tuple[str, str]] = []
        for name, text in raw.items():
            try:
                pairs.append((key(name), value(text)))
            except _Invalid as exc:
                issues.extend((f".{name}", reason) for _, reason in exc.issues)
        if issues:
            raise _Invalid(*issues)
        return tuple(pairs)
    return convert


def _metric_regex(value: Any) -> str:
    text = _string()(value)
    error = _re2_error(text)
    if error is None:
        error = _re2_error(f"^(?:{text})$")
        if error is not None:
            error += " once anchored as Prometheus anchors it, ^(?:...)$"
    if error is not None:
        _fail(f"invalid RE2 regex {_show(text)}: {error} (Prometheus uses RE2: no lookaround or backreferences)")
    go_problem = _go_regexp_problem(text)
    if go_problem is not None:
        _fail(f"regex {_show(text)} would fail in Prometheus: {go_problem}")
    return text


def _dashboard_path(value: Any) -> str:
    """A Grafana dashboard file or folder, relative to the catalog's folder and inside it.

    Only the path's text is checked here (the core reads no files); where it resolves to,
    symlinks included, is checked by whoever reads the catalog from disk (``settings``).
    """
    text = _string()(value)
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", text):
        _fail(f"must be a path relative to the catalog's folder, not a URL: {_show(text)}")
    if text.startswith(("/", "\\", "~")) or re.match(r"[A-Za-z]:", text):
        _fail(f"must be a path relative to the catalog's folder, got the absolute path {_show(text)}")
    if ".." in re.split(r"[/\\]", text):
        _fail(f"must stay inside the catalog's folder: '..' in {_show(text)}")
    return text


def _one_dashboard(value: Any) -> tuple[str, ...]:
    """The old ``golden_dashboard: FILE`` form: a list of one."""
    return () if value is None else (_dashboard_path(value),)


_WINDOW_KEYS = ("name", "range", "slo_p95")


def _windows(value: Any) -> tuple[LatencyWindow, ...]:
    """Convert ``[{range: 1h, slo_p95: 2s, name?: ...}, ...]``; names default to the range."""
    if not isinstance(value, list):
        _fail(f"must be a list, got {_type_name(value)}")
    if not value:
        _fail("must list at least one window")
    issues: list[tuple[str, str]] = []
    windows: list[LatencyWindow] = []
    index_by_name: dict[str, int] = {}
    index_by_range: dict[float, int] = {}
    for index, raw in enumerate(value):
        at = f"[{index}]"
        if not isinstance(raw, dict):
            issues.append((at, f"must be a mapping with 'range' and 'slo_p95', got {_type_name(raw)}"))
            continue
        entry: dict[str, Any] = {}
        for key in raw:
            if key not in _WINDOW_KEYS:
                issues.append((f"{at}.{key}", _unknown_field_reason(key, _WINDOW_KEYS)))
        for key, convert in (("range", _duration(positive=True)), ("slo_p95", _duration(positive=True))):
            if key not in raw:
                issues.append((f"{at}.{key}", "is required"))
                continue
            try:
                entry[key] = convert(raw[key])
            except _Invalid as exc:
                issues.extend((f"{at}.{key}", reason) for _, reason in exc.issues)
        if "range" not in entry or "slo_p95" not in entry:
            continue
        # Default the name to the range as the reviewer wrote it ("24h", not "1d").
        name = raw.get("name", raw["range"])
        try:
            name = _string()(name)
        except _Invalid as exc:
            issues.extend((f"{at}.name", reason) for _, reason in exc.issues)
            continue
        if name in index_by_name:
            issues.append((f"{at}.name", f"duplicate window name {_show(name)} (also [{index_by_name[name]}])"))
            continue
        if entry["range"] in index_by_range:
            issues.append(
                (
                    f"{at}.range",
                    f"duplicate window range {format_duration(entry['range'])} "
                    f"(also [{index_by_range[entry['range']]}])",
                )
            )
            continue
        index_by_name[name] = index
        index_by_range[entry["range"]] = index
        windows.append(LatencyWindow(name=name, seconds=entry["range"], slo_p95_s=entry["slo_p95"]))
    if issues:
        raise _Invalid(*issues)
    return tuple(windows)


# Grafana-style variables: $var, ${var}, [[var]]. Golden queries run verbatim.
_TEMPLATE_VARIABLE_RE = re.compile(r"\$\{?\w+|\[\[\w+\]\]")


def _promql_query(value: Any) -> str:
    """Check a golden query is plain PromQL that parses.

    Catches copy-paste damage from dashboards (template variables, cut-off brackets,
    a range function given an instant vector) before a run wastes a warm-up.
    """
    query = _string()(value)
    variable = _TEMPLATE_VARIABLE_RE.search(query)
    if variable is not None:
        _fail(f"contains template variable {variable.group(0)!r}; golden queries must be plain PromQL")
    try:
        parse_promql(query)
    except PromQLError as exc:
        _fail(f"{_clip(str(exc), 200)} in {_show(query)}")
    return query


# One address as an SMTP envelope takes it: no display name, no comma or angle brackets (one entry
# is one mailbox), a domain of dot-separated labels. Deliberately plain: a reviewer's typo, not RFC 5322.
_EMAIL_RE = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
# RFC 5321's limit on a forward path.
MAX_EMAIL_LENGTH = 254
# arn:<partition>:sns:<region>:<account>:<topic>; a topic name is 1-256 of [A-Za-z0-9_-] (+ ".fifo").
_SNS_TOPIC_ARN_RE = re.compile(r"arn:aws(?:-[a-z]+)*:sns:[a-z]{2}(?:-[a-z]+)+-\d:\d{12}:"
                               r"[A-Za-z0-9_-]{1,256}(?:\.fifo)?")


def _email(value: Any) -> str:
    text = _string()(value)
    if len(text) > MAX_EMAIL_LENGTH:
        _fail(f"must be at most {MAX_EMAIL_LENGTH} characters, got {len(text)}: {_show(text)}")
    if _EMAIL_RE.fullmatch(text) is None:
        _fail(f"must be one email address like team@example.com, got {_show(text)}")
    return text


def _sns_topic_arn(value: Any) -> str:
    text = _string()(value)
    if _SNS_TOPIC_ARN_RE.fullmatch(text) is None:
        _fail(f"must be an SNS topic ARN like arn:aws:sns:us-east-1:123456789012:team-alerts, got {_show(text)}")
    return text


_AGGREGATE_KEYS = ("metric", "by", "operations", "rate")


def _aggregations(value: Any) -> tuple[Aggregate, ...]:
    """``[{metric, by: [labels], operations: [sum, count], rate?: 5m}, ...]``: one entry per aggregated metric."""
    if not isinstance(value, list):
        _fail(f"must be a list, got {_type_name(value)}")
    issues: list[tuple[str, str]] = []
    out: list[Aggregate] = []
    seen: dict[str, int] = {}
    label = _unique_list(_pattern_string(_LABEL_NAME_RE, "label name"), what="label", non_empty=False)
    operations = _unique_list(_choice(AGGREGATION_OPERATIONS), what="operation", non_empty=True)
    for index, raw in enumerate(value):
        at = f"[{index}]"
        if not isinstance(raw, dict):
            issues.append((at, f"must be a mapping with 'metric', 'by' and 'operations', got {_type_name(raw)}"))
            continue
        entry: dict[str, Any] = {}
        for key in raw:
            if key not in _AGGREGATE_KEYS:
                issues.append((f"{at}.{key}", _unknown_field_reason(key, _AGGREGATE_KEYS)))
        for key, attr, convert in (("metric", "metric", _pattern_string(_METRIC_NAME_RE, "metric name")),
                                   ("by", "by", label), ("operations", "operations", operations),
                                   ("rate", "rate_s", _duration(positive=True))):
            if key not in raw:
                if key in ("metric", "operations"):
                    issues.append((f"{at}.{key}", "is required"))
                continue
            try:
                entry[attr] = convert(raw[key])
            except _Invalid as exc:
                issues.extend((f"{at}.{key}{suffix}", reason) for suffix, reason in exc.issues)
        if "metric" not in entry or "operations" not in entry:
            continue
        families = sorted({AGGREGATION_FAMILY[op] for op in entry["operations"]})
        if len(families) > 1:
            issues.append((f"{at}.operations", f"mixes the families {', '.join(families)}: a read re-aggregates "
                                               "one (sum and count, or min, or max)"))
            continue
        if "__name__" in entry.get("by", ()):
            issues.append((f"{at}.by", "must not name __name__"))
            continue
        if entry["metric"] in seen:
            issues.append((f"{at}.metric",
                           f"duplicate aggregation of {entry['metric']!r} (also [{seen[entry['metric']]}])"))
            continue
        seen[entry["metric"]] = index
        out.append(Aggregate(**entry))
    if issues:
        raise _Invalid(*issues)
    return tuple(out)


# --------------------------------------------------------------------------- layout tables


@dataclass(frozen=True)
class _Field:
    """A YAML key: the model attribute it fills and how its raw value is checked."""

    attr: str
    convert: Converter


_GROUP_FIELDS: dict[str, _Field] = {
    "name": _Field("name", _pattern_string(_GROUP_NAME_RE, "group name", max_length=GROUP_NAME_MAX_LENGTH)),
    "description": _Field("description", _string(allow_empty=True)),
    "owners": _Field("owners", _unique_list(_user_id, what="owner", non_empty=True)),
    "approvers": _Field("approvers", _unique_list(_approver, what="approver", non_empty=True)),
    "wave": _Field("wave", _integer(minimum=1)),
    "depends_on": _Field(
        "depends_on",
        _unique_list(_pattern_string(_GROUP_NAME_RE, "group name"), what="dependency", non_empty=False),
    ),
    "metrics": _Field(
        "metrics",
        _unique_list(_pattern_string(_METRIC_NAME_RE, "metric name"), what="metric", non_empty=False),
    ),
    "metric_regex": _Field("metric_regex", _metric_regex),
    # A metric_regex that also matches Prometheus' own series (up, prometheus_*) is refused unless this is true.
    "allow_match_all": _Field("allow_match_all", _boolean),
    # How often the source scrapes: a warm-up shorter than one scrape has nothing to compare.
    "scrape_interval": _Field("scrape_interval_s", _duration(positive=True)),
    "host_label": _Field("host_label", _pattern_string(_LABEL_NAME_RE, "label name")),
    # Labels the remote_write entry drops (labeldrop); checked against host_label and renames in layers.py.
    "drop_labels": _Field(
        "drop_labels",
        _unique_list(_pattern_string(_LABEL_NAME_RE, "label name"), what="label", non_empty=False),
    ),
    "approval_timeout": _Field("approval_timeout_s", _duration(positive=True)),
    # Metrics shipped as recording rules' aggregates (issue 40): checked against metrics/metric_regex in layers.py.
    "aggregations": _Field("aggregations", _aggregations),
    # The Airflow connection ids of the group's source Prometheus and its target (AMP workspace).
    "source": _Field("source", _pattern_string(_CONN_ID_RE, "connection id", max_length=CONN_ID_MAX_LENGTH)),
    "target": _Field("target", _pattern_string(_CONN_ID_RE, "connection id", max_length=CONN_ID_MAX_LENGTH)),
}

_SECTIONS: dict[str, tuple[type, dict[str, _Field]]] = {
    "warmup": (
        WarmupPolicy,
        {
            "duration": _Field("duration_s", _duration(positive=False)),
            "timeout": _Field("timeout_s", _duration(positive=True)),
            "max_lag": _Field("max_lag_s", _duration(positive=True)),
            "poll_interval": _Field("poll_interval_s", _duration(positive=True)),
        },
    ),
    "parity": (
        ParityPolicy,
        {
            "mode": _Field("mode", _choice(PARITY_MODES)),
            "engines": _Field("engines", _choice(PARITY_ENGINES)),
            "sample_hosts": _Field("sample_hosts", _integer(minimum=1)),
            "hosts_per_shard": _Field("hosts_per_shard", _integer(minimum=1)),
            "seed": _Field("seed", _optional_string),
            "skip_recent": _Field("skip_recent_s", _duration(positive=False)),
            "step": _Field("step_s", _duration(positive=True)),
            "abs_tolerance": _Field("abs_tolerance", _number(minimum=0)),
            "rel_tolerance": _Field("rel_tolerance", _number(minimum=0)),
            "ignore_labels": _Field(
                "ignore_labels",
                _unique_list(_pattern_string(_LABEL_NAME_RE, "label name"), what="label", non_empty=False),
            ),
            "rename_labels": _Field("rename_labels", _label_renames),
            "golden_dashboards": _Field(
                "golden_dashboards", _unique_list(_dashboard_path, what="dashboard", non_empty=False)
            ),
            "golden_dashboard": _Field("golden_dashboards", _one_dashboard),
            "golden_variables": _Field("golden_variables", _template_values),
            "golden_required": _Field("golden_required", _boolean),
            "max_missing_series_ratio": _Field("max_missing_series_ratio", _number(minimum=0, maximum=1)),
            "failure_limit": _Field("failure_limit", _integer(minimum=0)),
            "inconclusive_limit": _Field("inconclusive_limit", _integer(minimum=0)),
            "consecutive_error_limit": _Field("consecutive_error_limit", _integer(minimum=0)),
        },
    ),
    "latency": (
        LatencyPolicy,
        {
            "repeats": _Field("repeats", _integer(minimum=1)),
            "confidence": _Field("confidence", _number(minimum=0.5, maximum=0.999)),
            "max_rounds": _Field("max_rounds", _integer(minimum=1)),
            "timeout": _Field("timeout_s", _duration(positive=True)),
            "max_slowdown_ratio": _Field("max_slowdown_ratio", _number(minimum=1)),
            "slowdown_floor": _Field("slowdown_floor_s", _duration(positive=False)),
            "deadline": _Field("deadline_s", _duration(positive=True)),
            "max_concurrency": _Field("max_concurrency", _integer(minimum=1)),
            "accept_encoding": _Field("accept_encoding", _choice(PROBE_ENCODINGS)),
            "dashboard_refresh": _Field("dashboard_refresh_s", _duration(positive=True)),
            "dashboard_viewers": _Field("dashboard_viewers", _integer(minimum=0)),
            "retention": _Field("retention_s", _duration(positive=True)),
            "max_answer_bytes": _Field("max_answer_bytes", _integer(minimum=1)),
            "windows": _Field("windows", _windows),
            "queries": _Field("queries", _unique_list(_promql_query, what="query", non_empty=True)),
        },
    ),
    "bake": (
        BakePolicy,
        {
            "interval": _Field("interval_s", _duration(positive=True)),
            "period": _Field("period_s", _duration(positive=True)),
            "max_staleness": _Field("max_staleness_s", _duration(positive=True)),
            "max_lag": _Field("max_lag_s", _duration(positive=True)),
            "series_tolerance": _Field("series_tolerance", _number(minimum=0, maximum=1)),
            "parity_window": _Field("parity_window_s", _duration(positive=True)),
        },
    ),
    # The source runs as replicas (an HA pair): AMP's dedup labels on every write path (core.ha).
    "replicas": (
        ReplicaPolicy,
        {
            "replica_label": _Field("replica_label", _pattern_string(_LABEL_NAME_RE, "label name")),
            "cluster_label": _Field("cluster_label", _pattern_string(_LABEL_NAME_RE, "label name")),
            "sources": _Field("sources", _pairs(
                "replica -> connection id", key=_string(),
                value=_pattern_string(_CONN_ID_RE, "connection id", max_length=CONN_ID_MAX_LENGTH))),
        },
    ),
    # The group's tenant: limitsPerLabelSet in the workspace configuration (core.quota.tenant_preflight).
    "tenant": (
        TenantPolicy,
        {
            "label_set": _Field("label_set", _pairs(
                "label -> value", key=_pattern_string(_LABEL_NAME_RE, "label name"), value=_string())),
            "max_series": _Field("max_series", _integer(minimum=0)),
        },
    ),
    "notify": (
        NotifyPolicy,
        {
            "channel": _Field("channel", _choice(NOTIFY_CHANNELS)),
            "to": _Field("to", _unique_list(_email, what="address", non_empty=False)),
            "topic_arn": _Field("topic_arn", _sns_topic_arn),
            "slack_conn": _Field("slack_conn",
                                 _pattern_string(_CONN_ID_RE, "connection id", max_length=CONN_ID_MAX_LENGTH)),
        },
    ),
}

# Golden queries name one group's metrics; a shared list in defaults or a
# profile would be wrong for every other group.
_GROUP_ONLY_SECTION_KEYS = frozenset({("latency", "queries")})
_DEFAULTS_TOP_FIELDS = ("host_label", "approval_timeout", "scrape_interval", "source", "target")
# What a ``waves:`` entry may set for every group of its wave (over ``defaults:``, under the group).
_WAVE_FIELDS = ("source", "target")
# Fields only ``defaults:`` may set: they concern the whole rollout, not one group.
_DEFAULTS_ONLY_FIELDS: dict[str, _Field] = {
    # Waves held back: a group in a paused wave does not start (its validate step refuses, audited).
    "paused_waves": _Field("paused_waves", _unique_list(_integer(minimum=1), what="wave", non_empty=False)),
    # The promshift remote_write queues a source carries at most (core.queues; a connection may override it).
    "max_queues": _Field("max_queues", _integer(minimum=1, maximum=MAX_QUEUE_CAP)),
}
_TOP_LEVEL_KEYS = ("version", "defaults", "waves", "profiles", "groups")


def _unknown_field_reason(key: Any, known: Iterable[str]) -> str:
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=1) if isinstance(key, str) and len(key) <= 100 else []
    if close:
        return f"unknown field (did you mean {close[0]!r}?)"
    return f"unknown field (known: {', '.join(known)})"
