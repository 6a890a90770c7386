"""Rules on a whole group (approvers, warm-up, match-all regexes) and across groups (dependencies, overlaps)."""

from __future__ import annotations

import functools
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import re2

from promshift.core.approvers import team_of
from promshift.core.catalog.fields import _clip, _show
from promshift.core.catalog.model import MetricGroup
from promshift.core.catalog.regex import _compile_re2, _compile_re2_uncached
from promshift.core.durations import format_duration
from promshift.core.promql import PromQLError, labels_relied_on

if TYPE_CHECKING:
    from promshift.core.catalog.layers import _Draft, _Problems

# Series every Prometheus has about itself and its targets. A group's keep-rule that matches one of
# them would dual-write (and cut over, and later drop from the source) the fleet's own health series.
SELF_MONITORING_NAMES = (
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "prometheus_build_info",
    "prometheus_tsdb_head_series",
    "prometheus_remote_storage_samples_failed_total",
    "go_goroutines",
    "process_cpu_seconds_total",
    "ALERTS",
)


@functools.lru_cache(maxsize=16_384)
def _self_monitoring_matches(regex: str) -> tuple[str, ...]:
    compiled = _compile_re2(regex)
    return tuple(name for name in SELF_MONITORING_NAMES if compiled.fullmatch(name) is not None)


# A warm-up is minutes to a day of dual-write before the first comparison; four weeks is the most that is still a
# warm-up (longer holds a deferred run and the dual-write open for that long: a 1y warm-up is a typo or a stall).
MAX_WARMUP_S = 28 * 86400.0


def _group_rules(group: MetricGroup) -> list[tuple[str, str]]:
    """Rules on one assembled group: (field path, reason) for each problem."""
    issues: list[tuple[str, str]] = []
    # A team is resolved when the approval is asked (core/approvers.py): who is on it, and whether anyone but the
    # trigger user is, is known only then.
    if group.approvers and not any(team_of(a) for a in group.approvers):  # empty: missing or invalid, reported
        if len(group.approvers) < 2:
            issues.append(("approvers", f"lists one approver ({_show(group.approvers[0])}); list at least two: "
                                        "the user who triggers a run cannot approve it"))
        elif not set(group.approvers) - set(group.owners):
            issues.append(("approvers", "lists only owners; add an approver who is not an owner (four eyes)"))
    if group.warmup.duration_s < group.scrape_interval_s:
        issues.append(("warmup.duration", f"must be at least one scrape interval "
                                          f"({format_duration(group.scrape_interval_s)}), got "
                                          f"{format_duration(group.warmup.duration_s)}: parity would have no "
                                          "sample to compare (set scrape_interval if the source scrapes faster)"))
    for field, seconds in (("warmup.duration", group.warmup.duration_s), ("warmup.timeout", group.warmup.timeout_s)):
        if seconds > MAX_WARMUP_S:
            issues.append((field, f"must be at most {format_duration(MAX_WARMUP_S)}, got {format_duration(seconds)}: "
                                  "the run would dual-write and wait that long before any check (a longer "
                                  "comparison belongs in bake)"))
    for index, query in enumerate(group.latency.queries):
        try:
            read = labels_relied_on(query)
        except PromQLError:
            continue  # reported where the query is checked
        dropped = sorted(read & (set(group.drop_labels) - {group.host_label}))  # the host label: refused already
        if dropped:
            issues.append(("drop_labels", f"drops {', '.join(map(repr, dropped))}, which latency.queries[{index}] "
                                          "selects, groups or matches on: on the target it would answer something "
                                          "else (or nothing)"))
    if group.source == group.target:
        issues.append(("target", f"is the group's own source ({group.source!r}): the migration would write the "
                                 "metrics back into where they come from"))
    if group.metric_regex is not None and not group.allow_match_all:
        matched = _self_monitoring_matches(group.metric_regex)
        if matched:
            issues.append(("metric_regex", f"{_show(group.metric_regex)} also matches Prometheus' own series "
                                           f"({', '.join(matched[:3])}{', ...' if len(matched) > 3 else ''}): "
                                           "the group would dual-write and cut over every such series; narrow it, "
                                           "or set allow_match_all: true"))
    return issues


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
                problems.add(draft.where, path, "a group cannot depend on itself", group=draft.index)
            elif dependency not in by_name:
                if all_named:
                    problems.add(draft.where, path, f"unknown group {_show(dependency)} (known: {_clip(known, 200)})",
                                 group=draft.index)
            else:
                dependency_wave = by_name[dependency].layer.top.get("wave", 1)
                if dependency_wave > wave:
                    problems.add(
                        draft.where,
                        path,
                        f"{dependency!r} is in wave {dependency_wave}, after this group's wave {wave}",
                        group=draft.index,
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
                        group=by_name[canonical[0]].index,
                    )
            elif dependency not in state:
                visit(dependency, stack)
        stack.pop()
        state[name] = "done"

    for name in order:
        if name not in state:
            visit(name, [])


class _RegexTree:
    """Which of many RE2 regexes fully match a name, without trying each one on every name.

    A node is the alternation of its regexes: one match tells whether any of them matches, so a
    name no regex claims costs one match at the root, and a name k regexes claim about
    k * log2(n). 10,000 groups against 30,000 metric names took minutes one regex at a time.
    An alternation RE2 will not compile (too large) is skipped: its children are asked instead.
    """

    def __init__(self, regexes: list[str]) -> None:
        self._regexes = regexes
        self._compiled: dict[tuple[int, int], Any] = {}

    def _node(self, lo: int, hi: int) -> Any:
        key = (lo, hi)
        if key not in self._compiled:
            pattern = self._regexes[lo] if hi - lo == 1 else "|".join(f"(?:{r})" for r in self._regexes[lo:hi])
            try:
                self._compiled[key] = _compile_re2(pattern) if hi - lo == 1 else _compile_re2_uncached(pattern)
            except re2.error:  # too large as one alternation
                self._compiled[key] = None
        return self._compiled[key]

    def matching(self, name: str) -> list[int]:
        """Indexes of the regexes that fully match ``name``, in order."""
        found: list[int] = []
        stack = [(0, len(self._regexes))] if self._regexes else []
        while stack:
            lo, hi = stack.pop()
            compiled = self._node(lo, hi)
            if compiled is not None and compiled.fullmatch(name) is None:
                continue
            if hi - lo == 1:
                found.append(lo)
                continue
            middle = (lo + hi) // 2
            stack += [(middle, hi), (lo, middle)]
        return sorted(found)


def _check_pairings(drafts: list[_Draft], groups: dict[int, MetricGroup], problems: _Problems
                    ) -> set[tuple[int, int]]:
    """Two groups with the same keep-filter on the same (source, target) are one pairing named twice.

    Returns the (earlier, later) draft indexes of each duplicate, so the overlap check does not
    list every metric of the pair again: the duplicate is one line.
    """
    first: dict[tuple[str, str, str, str], _Draft] = {}
    duplicates: set[tuple[int, int]] = set()
    for draft in drafts:
        group = groups.get(draft.index)
        if group is None or not (group.metrics or group.metric_regex is not None):
            continue
        key = (group.source, group.target, "|".join(sorted(group.metrics)), group.metric_regex or "")
        if key in first and groups[first[key].index].name != group.name:  # a copied group: its name says so
            earlier = first[key]
            problems.add(draft.where, "metrics" if group.metrics else "metric_regex",
                         f"duplicate pairing: {earlier.where} already moves the same metrics from "
                         f"{group.source!r} to {group.target!r}", group=draft.index)
            duplicates.add((earlier.index, draft.index))
        else:
            first[key] = draft
    return duplicates


_MAX_EXAMPLES = 8


def regex_examples(pattern: str, limit: int = _MAX_EXAMPLES) -> list[str]:
    """A few of the shortest names ``pattern`` matches whole (each alternative's, repeats at their minimum),
    for telling overlapping regexes apart; [] for a pattern this cannot read (it is checked elsewhere)."""
    import re._parser as parser  # the standard library's regex parser: RE2's syntax for names is a subset

    def walk(items: Any) -> list[str]:
        out = [""]
        for op, arg in items:
            name = str(op)
            if name == "LITERAL":
                parts = [chr(arg)]
            elif name == "ANY":
                parts = ["a"]
            elif name == "IN":
                parts = [next((chr(a) if str(o) == "LITERAL" else chr(a[0])) for o, a in arg
                              if str(o) in ("LITERAL", "RANGE"))]
            elif name in ("MAX_REPEAT", "MIN_REPEAT"):
                low, _, sub = arg
                inner = walk(sub)
                parts = ["".join([one] * max(low, 0)) for one in inner]
            elif name == "SUBPATTERN":
                parts = walk(arg[-1])
            elif name == "BRANCH":
                parts = [x for branch in arg[1] for x in walk(branch)]
            elif name == "AT":
                parts = [""]
            else:
                raise ValueError(name)
            out = list(dict.fromkeys(a + b for a in out for b in parts))[:limit]
        return out

    try:
        return [name for name in walk(parser.parse(pattern)) if name][:limit]
    except Exception:  # noqa: BLE001 - a pattern outside the simple subset gives no example
        return []


def _check_overlaps(drafts: list[_Draft], known_metrics: frozenset[str], problems: _Problems, *,
                    pairs: dict[int, tuple[str, str]] | None = None,
                    skip: Collection[tuple[int, int]] = ()) -> None:
    """No metric may be claimed by two groups on one source or one target: it would be cut over twice.

    ``pairs`` (draft index -> (source, target) connection ids): groups on different sources *and*
    different targets may claim the same name (each cluster has its own series of it); on one
    source the keep-filters would dual-write the series twice, and onto one target the metric
    would be moved twice (both clusters' series mixed in the group's counts). ``skip``: pairs of
    drafts already reported as a duplicate pairing. Regexes cannot be intersected in general, so
    they are tested against every metric name we know of: the catalog's explicit names plus
    ``known_metrics``.
    """
    pairs = pairs or {}
    explicit = {metric for draft in drafts for metric in draft.layer.top.get("metrics", ())}
    # And names each regex itself matches (``node_cpu_.*`` gives ``node_cpu_``): two regexes over names no list
    # knows (``node_.*`` and ``node_cpu_.*``) overlap when one's example matches the other.
    examples = {name for draft in drafts if isinstance(draft.layer.top.get("metric_regex"), str)
                for name in regex_examples(draft.layer.top["metric_regex"])}
    universe = sorted(explicit | known_metrics | examples)
    claimants: dict[str, list[tuple[int, str]]] = {}
    regex_positions: list[int] = []
    for position, draft in enumerate(drafts):
        for metric in draft.layer.top.get("metrics", ()):
            claimants.setdefault(metric, []).append((position, "metrics"))
        if draft.layer.top.get("metric_regex") is not None:
            regex_positions.append(position)
    tree = _RegexTree([drafts[position].layer.top["metric_regex"] for position in regex_positions])
    for metric in universe:
        for index in tree.matching(metric):
            position = regex_positions[index]
            if metric not in drafts[position].layer.top.get("metrics", ()):
                claimants.setdefault(metric, []).append((position, "metric_regex"))
    def pair(position: int) -> tuple[str, str]:
        return pairs.get(drafts[position].index, ("", ""))

    overlaps: list[tuple[int, str, str, int]] = []
    for metric, claims in claimants.items():
        claims.sort()
        for at, (position, field_name) in enumerate(claims[1:], start=1):
            # The first earlier claimant on the same source or the same target.
            clash = next((earlier for earlier, _ in claims[:at]
                          if (pair(earlier)[0] == pair(position)[0] or pair(earlier)[1] == pair(position)[1])
                          and earlier != position), None)
            if clash is not None and (drafts[clash].index, drafts[position].index) not in skip:
                overlaps.append((position, metric, field_name, clash))
    across: dict[tuple[int, int, str], list[str]] = {}  # one line per pair of groups on different pairings
    for position, metric, field_name, first_position in sorted(overlaps):
        first = drafts[first_position]
        if pair(position) == pair(first_position):
            problems.add(drafts[position].where, field_name, f"claims metric {metric!r}, which {first.where} also "
                         "claims", group=drafts[position].index)
        else:
            across.setdefault((position, first_position, field_name), []).append(metric)
    for (position, first_position, field_name), metrics in across.items():
        first = drafts[first_position]
        (source, target), (first_source, first_target) = pair(position), pair(first_position)
        shown = ", ".join(repr(m) for m in metrics[:3]) + (f" (+{len(metrics) - 3} more)" if len(metrics) > 3 else "")
        what = f"claims metric{'s' if len(metrics) > 1 else ''} {shown}"
        if target == first_target:
            reason = (f"{what}, which {first.where} also moves to {target!r} (from {first_source!r}): "
                      "a metric moved twice to one target")
        else:
            reason = (f"{what}, which {first.where} also claims on source {source!r} (to {first_target!r}): "
                      "its series would be dual-written to two targets")
        problems.add(drafts[position].where, field_name, reason, group=drafts[position].index)
