"""The metric-group catalog: typed, immutable models and a validating YAML parser.

The catalog (``catalog/metric_groups.yaml``) is reviewed like code, so the
parser is strict: it reports every problem it finds at once, each naming the
group, the field and the reason, e.g.
``group 'gpu-memory': field 'parity.abs_tolerance': must be >= 0, got -1``.

Layering (later wins, mappings merged key by key, lists replaced whole):
built-in model defaults < ``defaults:`` < the group's own fields < the chosen
``profiles:`` entry. Every profile is validated on every parse, so a broken
demo profile fails review even when production parses without it.

Regexes follow RE2 (what Prometheus runs), not Python's ``re``: a pattern
that only Python accepts would pass review here and then fail the Prometheus
reload, so everything that ends up in a relabel rule is compiled with ``re2``.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

import re2
import yaml

from promshift.core.durations import format_duration, parse_duration
from promshift.core.promql import PromQLError, metric_names, promql_string
from promshift.core.promql import parse as parse_promql

__all__ = [
    "PARITY_MODES",
    "Catalog",
    "CatalogError",
    "LatencyPolicy",
    "LatencyWindow",
    "MetricGroup",
    "ParityMode",
    "ParityPolicy",
    "WarmupPolicy",
    "parse_catalog",
]

ParityMode = Literal["dual_write", "independent_scraper"]
PARITY_MODES: tuple[str, ...] = ("dual_write", "independent_scraper")
# What the latency probe asks for in Accept-Encoding: "identity" times the query (engine,
# JSON, transfer) and not the server's gzip; "gzip" times what Grafana sees, compression included.
PROBE_ENCODINGS: tuple[str, ...] = ("identity", "gzip")

CATALOG_VERSION = 1
GROUP_NAME_PATTERN = r"[a-z][a-z0-9-]*"
METRIC_NAME_PATTERN = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL_NAME_PATTERN = r"[a-zA-Z_][a-zA-Z0-9_]*"

_GROUP_NAME_RE = re.compile(GROUP_NAME_PATTERN)
_METRIC_NAME_RE = re.compile(METRIC_NAME_PATTERN)
_LABEL_NAME_RE = re.compile(LABEL_NAME_PATTERN)


# --------------------------------------------------------------------------- models


@dataclass(frozen=True)
class WarmupPolicy:
    """How long a group dual-writes before parity runs, and when to give up.

    The warm-up lasts ``duration_s``; it fails if remote-write lag has not
    stayed under ``max_lag_s`` by ``timeout_s``. Lag is polled every
    ``poll_interval_s`` from a deferred trigger (no worker slot held).
    """

    duration_s: float = 1800.0
    timeout_s: float = 7200.0
    max_lag_s: float = 60.0
    poll_interval_s: float = 30.0


@dataclass(frozen=True)
class ParityPolicy:
    """How the source and target copies of a group are compared.

    ``dual_write`` (same Prometheus writes both sides) must match to ~1e-9;
    ``independent_scraper`` (a managed collector scrapes on its own clock)
    needs step-grid alignment and looser tolerances. Raw samples are compared
    on ``sample_hosts`` hosts picked deterministically from ``seed`` (None
    lets the caller derive one, e.g. from the group and the window). Samples
    newer than ``skip_recent_s`` are skipped for ingestion lag.
    ``ignore_labels``/``rename_labels`` normalise external labels;
    ``rename_labels`` is a tuple of (from, to) pairs. The limits follow Argo
    Rollouts: a check fails once more than ``failure_limit`` measurements
    failed, is inconclusive beyond ``inconclusive_limit``, and errors after
    more than ``consecutive_error_limit`` errors in a row.
    """

    mode: ParityMode = "dual_write"
    sample_hosts: int = 5
    # Hosts compared per mapped task: more workers share a large check.
    hosts_per_shard: int = 8
    seed: str | None = None
    skip_recent_s: float = 120.0
    step_s: float = 30.0
    abs_tolerance: float = 1e-9
    rel_tolerance: float = 1e-9
    ignore_labels: tuple[str, ...] = ("cluster", "__replica__", "prometheus_replica")
    rename_labels: tuple[tuple[str, str], ...] = ()
    # Grafana dashboards (files or folders of *.json, relative to the catalog file) whose queries
    # on this group are compared result by result, with template variables from golden_variables.
    golden_dashboards: tuple[str, ...] = ()
    golden_variables: tuple[tuple[str, str], ...] = ()
    # Without any golden query a group has no golden layer (reported as such); required: INCONCLUSIVE.
    golden_required: bool = False
    max_missing_series_ratio: float = 0.0
    failure_limit: int = 0
    inconclusive_limit: int = 0
    consecutive_error_limit: int = 3


@dataclass(frozen=True)
class LatencyWindow:
    """One query range (``seconds`` long) and the p95 latency it must meet."""

    name: str
    seconds: float
    slo_p95_s: float


@dataclass(frozen=True)
class LatencyPolicy:
    """Golden queries timed on both sides over each window.

    Each query runs ``repeats`` times per window with a ``timeout_s`` budget
    (timeouts, 422/429 and partial results count as failures, not slow
    successes). The target's p95 must meet each window's SLO and be at most
    ``max_slowdown_ratio`` times the source's p95.
    """

    repeats: int = 5
    timeout_s: float = 60.0
    max_slowdown_ratio: float = 1.2
    # Below this absolute difference a slower target is noise, not a regression
    # (millisecond queries jitter by more than 20 %).
    slowdown_floor_s: float = 0.25
    # The whole probe (every window, query and repeat) stops here; what is left is INCONCLUSIVE.
    deadline_s: float = 900.0
    # At most this many probe queries in flight on each backend at once (1 = strictly sequential,
    # the most faithful timing; more finishes sooner but the queries then compete for the backend).
    max_concurrency: int = 1
    accept_encoding: str = "identity"
    # For the query-cost projection: every viewer's dashboard re-runs the golden queries this often.
    dashboard_refresh_s: float = 60.0
    dashboard_viewers: int = 5
    # The target's retention (AMP's default): storage cost, and the longest window the probe asks
    # of a target that does not report its own retention (AMP has no status/runtimeinfo).
    retention_s: float = 150 * 86_400.0
    # A probe answer bigger than this (bytes, decompressed) is a failed run, refused while it streams in.
    max_answer_bytes: int = 64 * 2**20
    windows: tuple[LatencyWindow, ...] = ()
    queries: tuple[str, ...] = ()


@dataclass(frozen=True)
class MetricGroup:
    """A set of metric names that migrates, is verified and is cut over as one unit.

    A group claims the explicit ``metrics`` plus every name ``metric_regex``
    matches (RE2, fully anchored as in Prometheus relabelling). ``host_label``
    is the label that identifies a node, used to sample hosts for parity.
    """

    name: str
    description: str = ""
    owners: tuple[str, ...] = ()
    approvers: tuple[str, ...] = ()
    wave: int = 1
    depends_on: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    metric_regex: str | None = None
    host_label: str = "Hostname"
    # An unanswered approval fails (and so rolls back) after this long.
    approval_timeout_s: float = 86400.0
    warmup: WarmupPolicy = WarmupPolicy()
    parity: ParityPolicy = ParityPolicy()
    latency: LatencyPolicy = LatencyPolicy()

    def name_regex(self) -> str:
        """Return the RE2 regex for ``__name__`` in a ``write_relabel_configs`` keep rule.

        Explicit names (escaped) and ``metric_regex`` form one alternation.
        No ``^...$``: Prometheus anchors relabel regexes itself. The regex
        comes last so an inline flag such as ``(?i)`` in it cannot reach the
        explicit names.
        """
        alternatives = [re2.escape(metric) for metric in self.metrics]
        if self.metric_regex is not None:
            alternatives.append(self.metric_regex)
        return "|".join(alternatives)

    def selector(self) -> str:
        """Return the PromQL selector for every series of this group.

        e.g. ``{__name__=~"DCGM_FI_DEV_FB_FREE|DCGM_FI_DEV_FB_USED"}``.
        """
        return "{__name__=~" + promql_string(self.name_regex()) + "}"

    def claims(self, metric_name: str) -> bool:
        """Tell whether the keep rule for this group would keep ``metric_name``."""
        return _compile_re2(self.name_regex()).fullmatch(metric_name) is not None

    @property
    def dag_id(self) -> str:
        """The Airflow DAG id that migrates this group, e.g. ``promshift__gpu_memory``."""
        return "promshift__" + self.name.replace("-", "_")


@dataclass(frozen=True)
class Catalog:
    """The validated metric groups in file order, with the profile that was applied."""

    groups: tuple[MetricGroup, ...]
    profile: str | None = None

    def get(self, name: str) -> MetricGroup:
        """Return the group called ``name``; KeyError lists the known names."""
        for group in self.groups:
            if group.name == name:
                return group
        raise KeyError(f"unknown metric group {name!r}; known groups: {', '.join(self.names()) or '(none)'}")

    def names(self) -> tuple[str, ...]:
        """Return the group names in file order."""
        return tuple(group.name for group in self.groups)


class CatalogError(ValueError):
    """The catalog is invalid; ``problems`` lists every problem found, one per entry."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        count = len(self.problems)
        lines = "\n".join(f"  - {problem}" for problem in self.problems)
        super().__init__(
            f"invalid metric-group catalog ({count} problem{'s' if count != 1 else ''}):\n{lines}"
        )

    def __reduce__(self) -> tuple[type[CatalogError], tuple[tuple[str, ...]]]:
        # The default would re-create the error from the rendered message.
        return (CatalogError, (self.problems,))


# --------------------------------------------------------------------------- regex helpers


@functools.lru_cache(maxsize=256)
def _compile_re2(pattern: str) -> Any:
    """Compile with RE2 without RE2 logging failures to stderr (we report them)."""
    options = re2.Options()
    options.log_errors = False
    return re2.compile(pattern, options)


def _re2_error(pattern: str) -> str | None:
    """Return RE2's complaint about ``pattern``, or None if it compiles."""
    try:
        _compile_re2(pattern)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        return detail.decode() if isinstance(detail, bytes) else str(detail)
    return None


# --------------------------------------------------------------------------- YAML loading


class _CatalogLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys and reads ``1e-9`` as a float.

    PyYAML silently keeps the last of two equal keys, which would hide a
    reviewer's edit; and its YAML 1.1 resolver reads ``1e-9`` (no dot) as a
    string, the natural way to write a tolerance.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable key; the base constructor reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_CatalogLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


# --------------------------------------------------------------------------- field converters


class _Invalid(Exception):
    """A raw value failed validation: (field-path suffix, reason) pairs."""

    def __init__(self, *issues: tuple[str, str]) -> None:
        super().__init__(issues)
        self.issues = issues


def _fail(reason: str) -> NoReturn:
    raise _Invalid(("", reason))


def _type_name(value: Any) -> str:
    return {dict: "a mapping", list: "a list", type(None): "null"}.get(type(value), repr(value))


Converter = Callable[[Any], Any]


def _string(*, allow_empty: bool = False) -> Converter:
    def convert(value: Any) -> str:
        if not isinstance(value, str):
            _fail(f"must be a string, got {_type_name(value)}")
        if not allow_empty and not value.strip():
            _fail("must be a non-empty string")
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


def _one_dashboard(value: Any) -> tuple[str, ...]:
    """The old ``golden_dashboard: FILE`` form: a list of one."""
    text = _optional_string(value)
    return () if text is None else (text,)


def _pattern_string(regex: re.Pattern[str], what: str) -> Converter:
    def convert(value: Any) -> str:
        if not isinstance(value, str) or regex.fullmatch(value) is None:
            _fail(f"must be a {what} matching {regex.pattern}, got {_type_name(value)}")
        return value

    return convert


def _integer(*, minimum: int) -> Converter:
    def convert(value: Any) -> int:
        # bool is an int subclass; YAML turns "yes"/"on" into True.
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(f"must be an integer, got {_type_name(value)}")
        if value < minimum:
            _fail(f"must be >= {minimum}, got {value!r}")
        return value

    return convert


def _number(*, minimum: float, maximum: float | None = None) -> Converter:
    def convert(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            _fail(f"must be a finite number, got {_type_name(value)}")
        if maximum is not None and not minimum <= value <= maximum:
            _fail(f"must be between {minimum} and {maximum}, got {value!r}")
        if value < minimum:
            _fail(f"must be >= {minimum}, got {value!r}")
        return float(value)

    return convert


def _duration(*, positive: bool) -> Converter:
    def convert(value: Any) -> float:
        # Numbers are refused on purpose: is "30" seconds or minutes? And YAML
        # 1.1 reads 1:30 as the integer 90.
        if not isinstance(value, str):
            _fail(f"must be a duration string like '10m', got {_type_name(value)}")
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            _fail(str(exc))
        if positive and seconds <= 0:
            _fail(f"must be > 0, got {value!r}")
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
                    (f"[{index}]", f"duplicate {what} {converted!r} (also [{first_index[converted]}])")
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


def _metric_regex(value: Any) -> str:
    text = _string()(value)
    error = _re2_error(text)
    if error is not None:
        _fail(f"invalid RE2 regex {text!r}: {error} (Prometheus uses RE2: no lookaround or backreferences)")
    return text


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
            issues.append((f"{at}.name", f"duplicate window name {name!r} (also [{index_by_name[name]}])"))
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
        _fail(f"{exc} in {query!r}")
    return query


# --------------------------------------------------------------------------- layout tables


@dataclass(frozen=True)
class _Field:
    """A YAML key: the model attribute it fills and how its raw value is checked."""

    attr: str
    convert: Converter


_GROUP_FIELDS: dict[str, _Field] = {
    "name": _Field("name", _pattern_string(_GROUP_NAME_RE, "group name")),
    "description": _Field("description", _string(allow_empty=True)),
    "owners": _Field("owners", _unique_list(_string(), what="owner", non_empty=True)),
    "approvers": _Field("approvers", _unique_list(_string(), what="approver", non_empty=True)),
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
    "host_label": _Field("host_label", _pattern_string(_LABEL_NAME_RE, "label name")),
    "approval_timeout": _Field("approval_timeout_s", _duration(positive=True)),
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
                "golden_dashboards", _unique_list(_string(), what="dashboard", non_empty=False)
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
}

# Golden queries name one group's metrics; a shared list in defaults or a
# profile would be wrong for every other group.
_GROUP_ONLY_SECTION_KEYS = frozenset({("latency", "queries")})
_DEFAULTS_TOP_FIELDS = ("host_label", "approval_timeout")
_TOP_LEVEL_KEYS = ("version", "defaults", "profiles", "groups")


def _unknown_field_reason(key: Any, known: Iterable[str]) -> str:
    known = sorted(known)
    close = difflib.get_close_matches(str(key), known, n=1) if isinstance(key, str) else []
    if close:
        return f"unknown field (did you mean {close[0]!r}?)"
    return f"unknown field (known: {', '.join(known)})"


# --------------------------------------------------------------------------- layer parsing


class _Problems:
    """Collects ``<where>: field '<path>': <reason>`` lines in discovery order."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, where: str, path: str | None, reason: str) -> None:
        line = f"{where}: {reason}" if path is None else f"{where}: field {path!r}: {reason}"
        if line not in self.lines:
            self.lines.append(line)


@dataclass
class _Layer:
    """One source of values (defaults, a group or a profile), already converted."""

    top: dict[str, Any]
    sections: dict[str, dict[str, Any]]
    # Paths ("owners", "latency.windows") that were given but invalid, so a
    # later "is required" check does not report them a second time.
    invalid: set[str]


def _parse_layer(
    raw: Any,
    *,
    where: str,
    top_fields: Mapping[str, _Field],
    group_level: bool,
    problems: _Problems,
) -> _Layer:
    """Convert one mapping of top-level fields and sections; report bad keys and values."""
    layer = _Layer(top={}, sections={section: {} for section in _SECTIONS}, invalid=set())
    if raw is None:
        return layer
    if not isinstance(raw, dict):
        problems.add(where, None, f"must be a mapping, got {_type_name(raw)}")
        return layer
    for key, value in raw.items():
        path = str(key)
        if key in top_fields:
            _convert_into(layer, layer.top, top_fields[key], value, where, path, problems)
        elif key in _SECTIONS:
            _parse_section(layer, key, value, where, path, group_level, problems)
        else:
            problems.add(where, path, _unknown_field_reason(key, [*top_fields, *_SECTIONS]))
    return layer


def _parse_section(
    layer: _Layer,
    section: str,
    raw: Any,
    where: str,
    path: str,
    group_level: bool,
    problems: _Problems,
) -> None:
    if not isinstance(raw, dict):
        problems.add(where, path, f"must be a mapping, got {_type_name(raw)}")
        layer.invalid.add(path)
        return
    _, section_fields = _SECTIONS[section]
    for key, value in raw.items():
        key_path = f"{path}.{key}"
        if key not in section_fields:
            problems.add(where, key_path, _unknown_field_reason(key, section_fields))
        elif not group_level and (section, key) in _GROUP_ONLY_SECTION_KEYS:
            problems.add(where, key_path, "only allowed in a group: golden queries name that group's metrics")
        else:
            _convert_into(
                layer, layer.sections[section], section_fields[key], value, where, key_path, problems
            )


def _convert_into(
    layer: _Layer, into: dict[str, Any], spec: _Field, value: Any, where: str, path: str, problems: _Problems
) -> None:
    try:
        into[spec.attr] = spec.convert(value)
    except _Invalid as exc:
        layer.invalid.add(path)
        for suffix, reason in exc.issues:
            problems.add(where, f"{path}{suffix}", reason)


# --------------------------------------------------------------------------- assembly


@dataclass(frozen=True)
class _Draft:
    """A group's own layer plus how to name it in problems."""

    index: int
    where: str
    layer: _Layer


def _assemble(layers: tuple[_Layer, ...]) -> tuple[MetricGroup, list[tuple[str, str]]]:
    """Merge layers into a MetricGroup and check rules that span fields or layers."""
    top: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {section: {} for section in _SECTIONS}
    invalid: set[str] = set()
    for layer in layers:
        top.update(layer.top)
        for section, values in layer.sections.items():
            sections[section].update(values)
        invalid |= layer.invalid
    policies = {section: model(**sections[section]) for section, (model, _) in _SECTIONS.items()}
    group = MetricGroup(**{"name": "", **top}, **policies)

    def given(path: str) -> bool:
        """Whether any layer set ``path`` (valid or not); YAML keys equal attrs here."""
        section, _, key = path.rpartition(".")
        values = sections[section] if section else top
        return key in values or path in invalid or section in invalid

    issues: list[tuple[str, str]] = []
    for required in ("name", "owners", "approvers"):
        if not given(required):
            issues.append((required, "is required"))
    if not given("metrics") and not given("metric_regex"):
        issues.append(("metrics", "at least one of 'metrics' or 'metric_regex' is required"))
    elif (
        "metrics" in top and not group.metrics and "metric_regex" not in top and "metric_regex" not in invalid
    ):
        issues.append(("metrics", "is empty and no 'metric_regex' is set: the group would claim nothing"))

    warmup = group.warmup
    if warmup.timeout_s < warmup.duration_s:
        issues.append(
            (
                "warmup.timeout",
                f"must be >= warmup.duration ({format_duration(warmup.duration_s)}), "
                f"got {format_duration(warmup.timeout_s)}",
            )
        )
    if warmup.poll_interval_s > warmup.timeout_s:
        issues.append(
            (
                "warmup.poll_interval",
                f"must be <= warmup.timeout ({format_duration(warmup.timeout_s)}), "
                f"got {format_duration(warmup.poll_interval_s)}",
            )
        )

    renamed = {source for source, _ in group.parity.rename_labels}
    for label in group.parity.ignore_labels:
        if label in renamed:
            issues.append(("parity.rename_labels", f"label {label!r} is both ignored and renamed"))

    latency = group.latency
    if not latency.windows and not given("latency.windows"):
        issues.append(("latency.windows", "is required (set it in defaults or in the group)"))
    for index, window in enumerate(latency.windows):
        if window.slo_p95_s > latency.timeout_s:
            issues.append(
                (
                    f"latency.windows[{index}].slo_p95",
                    f"must be <= latency.timeout ({format_duration(latency.timeout_s)}), "
                    f"got {format_duration(window.slo_p95_s)}",
                )
            )
    if not latency.queries:
        if not given("latency.queries"):
            issues.append(("latency.queries", "is required: list the group's golden PromQL queries"))
    elif group.metrics or group.metric_regex is not None:
        for index, query in enumerate(latency.queries):
            if not any(group.claims(name) for name in metric_names(query)):
                issues.append(
                    (
                        f"latency.queries[{index}]",
                        f"references none of this group's metrics: {query!r}",
                    )
                )
    return group, issues


def _check_dependencies(drafts: list[_Draft], problems: _Problems) -> None:
    """Dependencies must name other existing groups, no later wave, and no cycles."""
    # A group whose name is missing or invalid (already reported) may be the
    # one depended on: do not add an "unknown group" problem on top.
    all_named = all("name" in draft.layer.top for draft in drafts)
    by_name: dict[str, _Draft] = {}
    for draft in drafts:
        by_name.setdefault(draft.layer.top.get("name", ""), draft)
    known = ", ".join(sorted(name for name in by_name if name)) or "(none)"
    edges: dict[str, list[str]] = {}
    for draft in drafts:
        name = draft.layer.top.get("name")
        wave = draft.layer.top.get("wave", 1)
        for index, dependency in enumerate(draft.layer.top.get("depends_on", ())):
            path = f"depends_on[{index}]"
            if dependency == name:
                problems.add(draft.where, path, "a group cannot depend on itself")
            elif dependency not in by_name:
                if all_named:
                    problems.add(draft.where, path, f"unknown group {dependency!r} (known: {known})")
            else:
                dependency_wave = by_name[dependency].layer.top.get("wave", 1)
                if dependency_wave > wave:
                    problems.add(
                        draft.where,
                        path,
                        f"{dependency!r} is in wave {dependency_wave}, after this group's wave {wave}",
                    )
                if name is not None:
                    edges.setdefault(name, []).append(dependency)

    order = [name for name in by_name if name]
    position = {name: index for index, name in enumerate(order)}
    state: dict[str, str] = {}  # "visiting" | "done"
    reported: set[tuple[str, ...]] = set()

    def visit(name: str, stack: list[str]) -> None:
        state[name] = "visiting"
        stack.append(name)
        for dependency in edges.get(name, ()):
            if state.get(dependency) == "visiting":
                cycle = stack[stack.index(dependency) :]
                # Rotate so the earliest group in the file starts the cycle: report it once.
                start = min(range(len(cycle)), key=lambda i: position[cycle[i]])
                canonical = tuple(cycle[start:] + cycle[:start])
                if canonical not in reported:
                    reported.add(canonical)
                    problems.add(
                        by_name[canonical[0]].where,
                        "depends_on",
                        "dependency cycle: " + " -> ".join([*canonical, canonical[0]]),
                    )
            elif dependency not in state:
                visit(dependency, stack)
        stack.pop()
        state[name] = "done"

    for name in order:
        if name not in state:
            visit(name, [])


def _check_overlaps(drafts: list[_Draft], known_metrics: frozenset[str], problems: _Problems) -> None:
    """No metric may be claimed by two groups: it would be cut over twice.

    Regexes cannot be intersected in general, so they are tested against every
    metric name we know of: the catalog's explicit names plus ``known_metrics``.
    """
    explicit = {metric for draft in drafts for metric in draft.layer.top.get("metrics", ())}
    universe = sorted(explicit | known_metrics)
    claimants: dict[str, list[tuple[int, str]]] = {}
    for position, draft in enumerate(drafts):
        own = draft.layer.top.get("metrics", ())
        for metric in own:
            claimants.setdefault(metric, []).append((position, "metrics"))
        regex = draft.layer.top.get("metric_regex")
        if regex is None:
            continue
        compiled = _compile_re2(regex)
        for metric in universe:
            if metric not in own and compiled.fullmatch(metric) is not None:
                claimants.setdefault(metric, []).append((position, "metric_regex"))
    overlaps: list[tuple[int, str, str, int]] = []
    for metric, claims in claimants.items():
        first_position = claims[0][0]
        for position, field_name in claims[1:]:
            overlaps.append((position, metric, field_name, first_position))
    for position, metric, field_name, first_position in sorted(overlaps):
        first = drafts[first_position]
        problems.add(
            drafts[position].where,
            field_name,
            f"claims metric {metric!r}, which {first.where} also claims",
        )


def _group_label(raw: Any, index: int) -> str:
    name = raw.get("name") if isinstance(raw, dict) else None
    return f"group {name!r}" if isinstance(name, str) and name else f"group #{index + 1}"


def _iter_profiles(raw: Any, problems: _Problems) -> Iterator[tuple[str, Any]]:
    if raw is None:
        return
    if not isinstance(raw, dict):
        problems.add(
            "catalog", "profiles", f"must be a mapping of profile name -> overrides, got {_type_name(raw)}"
        )
        return
    for name, overrides in raw.items():
        if not isinstance(name, str) or _GROUP_NAME_RE.fullmatch(name) is None:
            problems.add("catalog", f"profiles.{name}", f"profile names must match {GROUP_NAME_PATTERN}")
            continue
        yield name, overrides


# --------------------------------------------------------------------------- entry point


def parse_catalog(text: str, *, profile: str | None = None, known_metrics: Iterable[str] = ()) -> Catalog:
    """Parse and validate catalog YAML; raise one CatalogError listing every problem.

    ``profile`` names a ``profiles:`` entry to merge over every group (e.g.
    "demo"); all profiles are validated either way. ``known_metrics`` are
    metric names that exist in the fleet (dcgm-exporter's counters) against
    which ``metric_regex`` overlaps are detected.
    """
    problems = _Problems()
    try:
        document = yaml.load(text, Loader=_CatalogLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        raise CatalogError([f"catalog: invalid YAML: {exc}"]) from None
    if not isinstance(document, dict):
        raise CatalogError(
            [f"catalog: must be a mapping with 'version' and 'groups', got {_type_name(document)}"]
        )

    for key in document:
        if key not in _TOP_LEVEL_KEYS:
            problems.add("catalog", str(key), _unknown_field_reason(key, _TOP_LEVEL_KEYS))
    if "version" not in document:
        problems.add("catalog", "version", f"is required (this parser reads version {CATALOG_VERSION})")
    elif document["version"] != CATALOG_VERSION or isinstance(document["version"], bool):
        problems.add(
            "catalog", "version", f"must be {CATALOG_VERSION}, got {_type_name(document['version'])}"
        )

    defaults = _parse_layer(
        document.get("defaults"),
        where="defaults",
        top_fields={key: _GROUP_FIELDS[key] for key in _DEFAULTS_TOP_FIELDS},
        group_level=False,
        problems=problems,
    )
    profiles = {
        name: _parse_layer(
            overrides, where=f"profile {name!r}", top_fields={}, group_level=False, problems=problems
        )
        for name, overrides in _iter_profiles(document.get("profiles"), problems)
    }
    if profile is not None and profile not in profiles:
        problems.add(
            "catalog", None, f"unknown profile {profile!r} (known profiles: {', '.join(profiles) or 'none'})"
        )

    raw_groups = document.get("groups")
    drafts: list[_Draft] = []
    if not isinstance(raw_groups, list):
        problems.add("catalog", "groups", f"must be a list of groups, got {_type_name(raw_groups)}")
        raw_groups = []
    elif not raw_groups:
        problems.add("catalog", "groups", "must list at least one group")
    for index, raw in enumerate(raw_groups):
        where = _group_label(raw, index)
        if not isinstance(raw, dict):
            problems.add(where, None, f"must be a mapping of group fields, got {_type_name(raw)}")
            continue
        layer = _parse_layer(raw, where=where, top_fields=_GROUP_FIELDS, group_level=True, problems=problems)
        drafts.append(_Draft(index=index, where=where, layer=layer))

    first_by_name: dict[str, _Draft] = {}
    for draft in drafts:
        name = draft.layer.top.get("name")
        if name is None:
            continue
        if name in first_by_name:
            problems.add(
                draft.where,
                "name",
                f"duplicate group name; group #{first_by_name[name].index + 1} is also named {name!r}",
            )
        else:
            first_by_name[name] = draft

    groups: list[MetricGroup] = []
    for draft in drafts:
        group, issues = _assemble((defaults, draft.layer))
        for path, reason in issues:
            problems.add(draft.where, path, reason)
        # A profile can break cross-field rules (a short timeout under a long
        # SLO); report only what the profile adds.
        for profile_name, overrides in profiles.items():
            profiled, profile_issues = _assemble((defaults, draft.layer, overrides))
            for issue in profile_issues:
                if issue not in issues:
                    problems.add(f"{draft.where} with profile {profile_name!r}", *issue)
            if profile_name == profile:
                group = profiled
        groups.append(group)

    _check_dependencies(drafts, problems)
    _check_overlaps(drafts, frozenset(known_metrics), problems)

    if problems.lines:
        raise CatalogError(problems.lines)
    return Catalog(groups=tuple(groups), profile=profile)
