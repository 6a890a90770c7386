"""Layers (defaults, a group, a profile): converted one by one, then merged into a MetricGroup."""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from promshift.core.catalog.fields import (
    _GROUP_ONLY_SECTION_KEYS,
    _SECTIONS,
    GROUP_NAME_MAX_LENGTH,
    _clip,
    _Field,
    _Invalid,
    _show,
    _type_name,
    _unknown_field_reason,
)
from promshift.core.catalog.model import _GROUP_NAME_RE, GROUP_NAME_PATTERN, MetricGroup
from promshift.core.catalog.regex import _compile_re2
from promshift.core.catalog.rules import _group_rules
from promshift.core.durations import format_duration
from promshift.core.promql import metric_names

# --------------------------------------------------------------------------- layer parsing


@functools.lru_cache(maxsize=65_536)
def _query_metric_names(query: str) -> tuple[str, ...]:
    """metric_names, parsed once per query: each group is assembled once per profile too."""
    return tuple(metric_names(query))


class _Problems:
    """Collects ``<where>: field '<path>': <reason>`` lines in discovery order.

    Each line belongs to one group (its index in the file) or to the whole catalog (None), so a
    caller can keep the good groups and show the bad ones. ``for_group`` returns a view that
    files what it is given under one group, sharing the same store.
    """

    def __init__(self) -> None:
        self.entries: list[tuple[int | None, str]] = []
        self._seen: set[tuple[int | None, str]] = set()
        self._group: int | None = None

    def for_group(self, group: int) -> _Problems:
        view = copy.copy(self)  # shares entries and _seen
        view._group = group
        return view

    def add(self, where: str, path: str | None, reason: str, *, group: int | None = None) -> None:
        line = f"{where}: {reason}" if path is None else f"{where}: field {_clip(repr(path))}: {reason}"
        key = (self._group if group is None else group, line)
        if key not in self._seen:
            self._seen.add(key)
            self.entries.append(key)

    @property
    def lines(self) -> list[str]:
        """Every problem once, in discovery order."""
        return list(dict.fromkeys(line for _, line in self.entries))


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

    bake = group.bake
    if bake.interval_s > bake.period_s:
        issues.append(("bake.interval", f"must be <= bake.period ({format_duration(bake.period_s)}), "
                                        f"got {format_duration(bake.interval_s)}: the bake would never be checked"))

    # HA pairs and tenants: half a declaration would be silently off.
    if group.replicas.sources and not group.replicas.replica_label:
        issues.append(("replicas.sources", "needs replicas.replica_label (the external label naming each replica)"))
    if group.replicas.replica_label and group.replicas.replica_label == group.replicas.cluster_label:
        issues.append(("replicas.cluster_label", "must differ from replicas.replica_label"))
    if group.tenant.max_series and not group.tenant.label_set:
        issues.append(("tenant.max_series", "needs tenant.label_set (the labels the limit counts)"))

    renamed = {source for source, _ in group.parity.rename_labels}
    for label in group.parity.ignore_labels:
        if label in renamed:
            issues.append(("parity.rename_labels", f"label {label!r} is both ignored and renamed"))

    # A dropped label must not be one parity keys hosts or renames on, nor one the sample needs.
    renamed_any = renamed | {target for _, target in group.parity.rename_labels}
    for label in group.drop_labels:
        if label == group.host_label:
            issues.append(("drop_labels", f"label {label!r} is the group's host_label: parity needs it"))
        elif label.startswith("__"):
            issues.append(("drop_labels", f"label {label!r} is reserved (names starting with '__')"))
        elif label in renamed_any:
            issues.append(("drop_labels", f"label {label!r} is both dropped and renamed (parity.rename_labels)"))

    issues.extend(_aggregation_issues(group))

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
        # group.claims(name), without building and compiling the group's keep regex each time.
        aggregated = {a.metric for a in group.aggregations}
        explicit = frozenset(group.metrics) - aggregated | {r for a in group.aggregations for r in a.recorded}
        regex = None if group.metric_regex is None else _compile_re2(group.metric_regex)

        def claims(name: str) -> bool:
            return name in explicit or (regex is not None and regex.fullmatch(name) is not None)

        for index, query in enumerate(latency.queries):
            raw = [name for name in _query_metric_names(query) if name in aggregated]
            if raw:
                recorded = ", ".join(a.recorded[0] if len(a.recorded) == 1 else ", ".join(a.recorded)
                                     for a in group.aggregations if a.metric == raw[0])
                issues.append((f"latency.queries[{index}]", f"reads {raw[0]}, which the group ships aggregated "
                               f"(aggregations): query its recorded series ({recorded})"))
            elif not any(claims(name) for name in _query_metric_names(query)):
                issues.append(
                    (
                        f"latency.queries[{index}]",
                        f"references none of this group's metrics: {_show(query)}",
                    )
                )
    notify = group.notify
    mails = notify.channel in ("smtp", "ses")
    if mails and not notify.to and not given("notify.to"):
        issues.append(("notify.to", f"is required with channel {notify.channel!r}: list the owners' email addresses"))
    elif mails and not notify.to and "notify.to" not in invalid:
        issues.append(("notify.to", f"is empty: channel {notify.channel!r} would mail nobody "
                                    "(use channel 'none' for off)"))
    if notify.channel == "sns" and notify.topic_arn is None and not given("notify.topic_arn"):
        issues.append(("notify.topic_arn", "is required with channel 'sns'"))
    if not given("notify.channel") and (notify.to or notify.topic_arn is not None or notify.slack_conn is not None):
        issues.append(("notify.channel", "is required when 'to', 'topic_arn' or 'slack_conn' is set: choose "
                                         "'smtp', 'ses', 'sns' or 'slack' ('none' keeps notifications off)"))
    issues.extend(_group_rules(group))
    return group, issues


def _aggregation_issues(group: MetricGroup) -> list[tuple[str, str]]:
    """Each aggregated metric is one of the group's listed metrics, no ``metric_regex`` ships it raw, and its
    recorded names are metric names of their own."""
    issues: list[tuple[str, str]] = []
    regex = None if group.metric_regex is None else _compile_re2(group.metric_regex)
    listed = frozenset(group.metrics)
    if group.aggregations and group.parity.mode != "dual_write":
        issues.append(("aggregations", f"need parity.mode 'dual_write' (the source records the aggregate and writes "
                                       f"it), got {group.parity.mode!r}"))
    for index, a in enumerate(group.aggregations):
        at = f"aggregations[{index}].metric"
        if a.metric not in listed:
            issues.append((at, f"{a.metric!r} is not in the group's metrics: list it there"))
        elif regex is not None and regex.fullmatch(a.metric) is not None:
            issues.append((at, f"{a.metric!r} is also matched by metric_regex, which would ship its raw series: "
                               "list the group's metrics explicitly"))
        for record in a.recorded:
            if record in listed or (regex is not None and regex.fullmatch(record) is not None):
                issues.append((at, f"its recorded series {record!r} is already one of the group's metrics"))
    return issues


def _group_label(raw: Any, index: int) -> str:
    name = raw.get("name") if isinstance(raw, dict) else None
    if isinstance(name, str) and name and len(name) <= 100:  # a longer one is reported clipped, under its number
        return f"group {name!r}"
    return f"group #{index + 1}"


def _iter_profiles(raw: Any, problems: _Problems) -> Iterator[tuple[str, Any]]:
    if raw is None:
        return
    if not isinstance(raw, dict):
        problems.add(
            "catalog", "profiles", f"must be a mapping of profile name -> overrides, got {_type_name(raw)}"
        )
        return
    for name, overrides in raw.items():
        if not isinstance(name, str) or _GROUP_NAME_RE.fullmatch(name) is None or len(name) > GROUP_NAME_MAX_LENGTH:
            problems.add("catalog", f"profiles.{_clip(str(name))}",
                         f"profile names must match {GROUP_NAME_PATTERN}, at most {GROUP_NAME_MAX_LENGTH} characters")
            continue
        yield name, overrides
