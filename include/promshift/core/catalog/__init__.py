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

The package: ``model`` (dataclasses, CatalogError), ``regex`` (RE2 helpers),
``loader`` (the YAML loader), ``fields`` (converters and field tables),
``layers`` (per-layer conversion and merging), ``rules`` (cross-group rules);
this module is the entry point and re-exports what importers use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from promshift.core.catalog.fields import (
    _DEFAULTS_ONLY_FIELDS,
    _DEFAULTS_TOP_FIELDS,
    _GROUP_FIELDS,
    _TOP_LEVEL_KEYS,
    _WAVE_FIELDS,
    GROUP_NAME_MAX_LENGTH,
    MAX_DURATION_S,
    _clip,
    _type_name,
    _unknown_field_reason,
)
from promshift.core.catalog.layers import (
    _assemble,
    _Draft,
    _group_label,
    _iter_profiles,
    _Layer,
    _parse_layer,
    _Problems,
)
from promshift.core.catalog.loader import MAX_ALIAS_NODES, MAX_DEPTH, MAX_SCALAR_CHARS, load_yaml
from promshift.core.catalog.model import (
    CATALOG_VERSION,
    DEFAULT_SOURCE_CONN,
    DEFAULT_TARGET_CONN,
    GROUP_NAME_PATTERN,
    LABEL_NAME_PATTERN,
    METRIC_NAME_PATTERN,
    MIGRATION_DAG_PREFIX,
    NOTIFY_CHANNELS,
    PARITY_ENGINES,
    PARITY_MODES,
    PROBE_ENCODINGS,
    Aggregate,
    BakePolicy,
    Catalog,
    CatalogError,
    LatencyPolicy,
    LatencyWindow,
    MetricGroup,
    NotifyPolicy,
    ParityMode,
    ParityPolicy,
    ReplicaPolicy,
    TenantPolicy,
    WarmupPolicy,
    migration_dag_id,
)
from promshift.core.catalog.regex import _compile_re2, _re2_error
from promshift.core.catalog.rules import _check_dependencies, _check_overlaps, _check_pairings
from promshift.core.redact import redact_text

__all__ = [
    "CATALOG_ERRORS_DAG_ID",
    "CATALOG_VERSION",
    "DEFAULT_SOURCE_CONN",
    "DEFAULT_TARGET_CONN",
    "GROUP_NAME_MAX_LENGTH",
    "MAX_ALIAS_NODES",
    "MAX_CATALOG_CHARS",
    "MAX_DEPTH",
    "MAX_DURATION_S",
    "MAX_SCALAR_CHARS",
    "BakePolicy",
    "CatalogCheck",
    "GROUP_NAME_PATTERN",
    "LABEL_NAME_PATTERN",
    "METRIC_NAME_PATTERN",
    "MIGRATION_DAG_PREFIX",
    "NOTIFY_CHANNELS",
    "PARITY_ENGINES",
    "PARITY_MODES",
    "PROBE_ENCODINGS",
    "Aggregate",
    "Catalog",
    "CatalogError",
    "LatencyPolicy",
    "LatencyWindow",
    "MetricGroup",
    "NotifyPolicy",
    "ReplicaPolicy",
    "TenantPolicy",
    "ParityMode",
    "ParityPolicy",
    "WarmupPolicy",
    "_compile_re2",
    "_re2_error",
    "check_catalog",
    "migration_dag_id",
    "unreadable_catalog",
    "parse_catalog",
]


# A catalog bigger than this is refused before YAML parsing: 10,000 groups take about 4 MB, and
# parsing must stay well inside Airflow's 30 s DAG import timeout (bench/catalog/run.py).
MAX_CATALOG_CHARS = 16 * 2**20
# The DAG that shows catalog problems in the Airflow UI (dags/promshift_groups.py).
CATALOG_ERRORS_DAG_ID = "promshift__catalog_errors"


@dataclass(frozen=True)
class CatalogCheck:
    """What a parse found: the groups that are fine, and every problem, grouped by who has it.

    ``catalog`` holds only groups without problems. ``catalog_problems`` concern everything
    (YAML, ``version``, ``defaults``, ``profiles``): then ``catalog`` is empty, as every group
    inherits from them. ``group_problems`` maps a bad group's label to its problems.
    ``problems`` is every problem once, in discovery order (what ``parse_catalog`` raises).
    """

    catalog: Catalog
    problems: tuple[str, ...]
    catalog_problems: tuple[str, ...]
    group_problems: tuple[tuple[str, tuple[str, ...]], ...]
    # False when nothing could be read as a catalog (no file, not UTF-8, not YAML, not a mapping):
    # then ``problems`` is one line saying why.
    readable: bool = True

    def __post_init__(self) -> None:
        # Redacted on entry: a problem quotes the bad value, and a webhook URL typed where a connection id
        # belongs would otherwise reach the catalog_errors DAG's docs, the log and the terminal.
        for name in ("problems", "catalog_problems"):
            object.__setattr__(self, name, tuple(redact_text(p) for p in getattr(self, name)))
        object.__setattr__(self, "group_problems", tuple((redact_text(label), tuple(redact_text(p) for p in ps))
                                                         for label, ps in self.group_problems))

    @property
    def ok(self) -> bool:
        return not self.problems


def unreadable_catalog(problem: str, profile: str | None = None) -> CatalogCheck:
    """The check of a catalog that could not be read at all: one problem, no groups."""
    return CatalogCheck(Catalog(groups=(), profile=profile), (problem,), (problem,), (), readable=False)


def check_catalog(
    text: str,
    *,
    profile: str | None = None,
    known_metrics: Iterable[str] = (),
    dashboard_problem: Callable[[str], str | None] | None = None,
    known_connections: Iterable[str] | None = None,
) -> CatalogCheck:
    """Parse and validate catalog YAML; never raise for bad input: report it.

    ``profile`` names a ``profiles:`` entry to merge over every group (e.g.
    "demo"); all profiles are validated either way. ``known_metrics`` are
    metric names that exist in the fleet (dcgm-exporter's counters) against
    which ``metric_regex`` overlaps are detected. ``dashboard_problem`` (given
    by whoever read the file) says why a golden dashboard path is not
    acceptable where it resolves (outside the catalog's folder), or None.
    ``known_connections``: the Airflow connection ids that exist (when the caller can list them);
    a ``source``/``target`` naming another is refused. None: not checked.
    """
    if len(text) > MAX_CATALOG_CHARS:
        return unreadable_catalog(f"catalog: {len(text):,} characters, more than the {MAX_CATALOG_CHARS:,} allowed "
                           "(the parse must stay well inside Airflow's DAG import timeout)", profile)
    problems = _Problems()
    try:
        document = load_yaml(text)
    except ValueError as exc:
        return unreadable_catalog(f"catalog: {exc}", profile)
    if not isinstance(document, dict):
        return unreadable_catalog(f"catalog: must be a mapping with 'version' and 'groups', got {_type_name(document)}",
                           profile)

    for key in document:
        if key not in _TOP_LEVEL_KEYS:
            problems.add("catalog", str(key), _unknown_field_reason(key, _TOP_LEVEL_KEYS))
    if "version" not in document:
        problems.add("catalog", "version", f"is required (this parser reads version {CATALOG_VERSION})")
    elif document["version"] != CATALOG_VERSION or isinstance(document["version"], bool):
        problems.add("catalog", "version", f"must be {CATALOG_VERSION}, got {_type_name(document['version'])}")

    defaults = _parse_layer(
        document.get("defaults"),
        where="defaults",
        top_fields={**{key: _GROUP_FIELDS[key] for key in _DEFAULTS_TOP_FIELDS}, **_DEFAULTS_ONLY_FIELDS},
        group_level=False,
        problems=problems,
    )
    waves = _parse_waves(document.get("waves"), problems)
    profiles = {
        name: _parse_layer(overrides, where=f"profile {name!r}", top_fields={}, group_level=False, problems=problems)
        for name, overrides in _iter_profiles(document.get("profiles"), problems)
    }
    if profile is not None and profile not in profiles:
        problems.add("catalog", None, f"unknown profile {profile!r} (known profiles: {', '.join(profiles) or 'none'})")
    if dashboard_problem is not None:
        for where, layer in (("defaults", defaults), *((f"profile {name!r}", p) for name, p in profiles.items())):
            _check_dashboards(layer, where, dashboard_problem, problems)

    raw_groups = document.get("groups")
    drafts: list[_Draft] = []
    labels: dict[int, str] = {}
    if not isinstance(raw_groups, list):
        problems.add("catalog", "groups", f"must be a list of groups, got {_type_name(raw_groups)}")
        raw_groups = []
    elif not raw_groups:
        problems.add("catalog", "groups", "must list at least one group")
    for index, raw in enumerate(raw_groups):
        where = labels[index] = _group_label(raw, index)
        group_problems = problems.for_group(index)
        if not isinstance(raw, dict):
            group_problems.add(where, None, f"must be a mapping of group fields, got {_type_name(raw)}")
            continue
        layer = _parse_layer(raw, where=where, top_fields=_GROUP_FIELDS, group_level=True, problems=group_problems)
        if dashboard_problem is not None:
            _check_dashboards(layer, where, dashboard_problem, group_problems)
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
                group=draft.index,
            )
        else:
            first_by_name[name] = draft

    groups: dict[int, MetricGroup] = {}
    for draft in drafts:
        wave = waves.get(draft.layer.top.get("wave", 1))
        base = (defaults, wave.layer) if wave is not None else (defaults,)
        if wave is not None:
            for line in wave.problems:  # the wave's problems keep its groups (only) out
                problems.add(wave.where, None, line, group=draft.index)
        group, issues = _assemble((*base, draft.layer))
        for path, reason in issues:
            problems.add(draft.where, path, reason, group=draft.index)
        # A profile can break cross-field rules (a short timeout under a long
        # SLO); report only what the profile adds.
        for profile_name, overrides in profiles.items():
            profiled, profile_issues = _assemble((*base, draft.layer, overrides))
            for issue in profile_issues:
                if issue not in issues:
                    problems.add(f"{draft.where} with profile {profile_name!r}", *issue, group=draft.index)
            if profile_name == profile:
                group = profiled
        groups[draft.index] = group

    in_use = {draft.layer.top.get("wave", 1) for draft in drafts}
    for number, wave in waves.items():
        if number not in in_use:  # no group to file them under: the catalog's own
            for line in wave.problems:
                problems.add(wave.where, None, line)
            if drafts:  # settings for a wave nobody is in: most likely a typo in a group's wave, which then
                # runs with the defaults instead
                in_use_shown = ", ".join(str(n) for n in sorted(in_use, key=str)[:10])
                problems.add(wave.where, None, f"no group is in wave {number} (groups' waves: {in_use_shown})")
    _check_dependencies(drafts, problems)
    pairs = {draft.index: groups[draft.index].pair for draft in drafts}
    duplicates = _check_pairings(drafts, groups, problems)
    _check_overlaps(drafts, frozenset(known_metrics), problems, pairs=pairs, skip=duplicates)
    if known_connections is not None:
        _check_connections(drafts, groups, frozenset(known_connections), problems, defaults=defaults, waves=waves)
    _check_paused_waves(defaults, drafts, problems)

    catalog_problems = tuple(dict.fromkeys(line for owner, line in problems.entries if owner is None))
    by_group: dict[int, list[str]] = {}
    for owner, line in problems.entries:
        if owner is not None:
            by_group.setdefault(owner, []).append(line)
    good = () if catalog_problems else tuple(group for index, group in groups.items() if index not in by_group)
    return CatalogCheck(
        catalog=Catalog(groups=good, profile=profile),
        problems=tuple(problems.lines),
        catalog_problems=catalog_problems,
        group_problems=tuple((labels[index], tuple(lines)) for index, lines in sorted(by_group.items())),
    )


def _check_paused_waves(defaults: _Layer, drafts: list[_Draft], problems: _Problems) -> None:
    """A paused wave that no group is in holds nothing back: most likely a typo for a wave that then runs."""
    waves = sorted({int(draft.layer.top.get("wave", 1)) for draft in drafts})
    for index, wave in enumerate(defaults.top.get("paused_waves", ())):
        if drafts and wave not in waves:
            problems.add("defaults", f"paused_waves[{index}]", f"wave {wave} has no group (waves in this catalog: "
                         f"{', '.join(map(str, waves))}): a pause that names no wave holds nothing back")


@dataclass(frozen=True)
class _Wave:
    """One ``waves:`` entry: the fields its groups inherit, and its problems (filed under those groups)."""

    where: str
    layer: _Layer
    problems: tuple[str, ...]


def _parse_waves(raw: object, problems: _Problems) -> dict[int, _Wave]:
    """``waves: {<n>: {source: <conn>, target: <conn>}}``: what every group of wave n inherits over ``defaults``."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.add("catalog", "waves",
                     f"must be a mapping of wave number -> {{source, target}}, got {_type_name(raw)}")
        return {}
    waves: dict[int, _Wave] = {}
    fields = {key: _GROUP_FIELDS[key] for key in _WAVE_FIELDS}
    for number, entry in raw.items():
        if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= 1_000_000_000:
            problems.add("catalog", f"waves.{_clip(str(number))}", "wave numbers must be integers >= 1")
            continue
        where = f"wave {number}"
        found = _Problems()
        if isinstance(entry, dict):
            for key in entry:
                if key not in fields:
                    found.add(where, str(key), _unknown_field_reason(key, fields))
            entry = {key: value for key, value in entry.items() if key in fields}
        layer = _parse_layer(entry, where=where, top_fields=fields, group_level=False, problems=found)
        waves[number] = _Wave(where=where, layer=layer,
                              problems=tuple(line.removeprefix(f"{where}: ") for line in found.lines))
    return waves


def _check_connections(drafts: list[_Draft], groups: dict[int, MetricGroup], known: frozenset[str],
                       problems: _Problems, *, defaults: _Layer, waves: dict[int, _Wave]) -> None:
    """Every group's source and target name a connection that exists; each unknown one is one line, where it is
    set (the group, its wave or ``defaults``), filed under every group that inherits it."""
    listing = _clip(", ".join(sorted(known)) or "none", 200)
    for draft in drafts:
        group = groups[draft.index]
        wave = waves.get(draft.layer.top.get("wave", 1))
        for field_name, conn_id in (("source", group.source), ("target", group.target)):
            if conn_id in known:
                continue
            if field_name in draft.layer.top:
                where = draft.where
            elif wave is not None and field_name in wave.layer.top:
                where = wave.where
            elif field_name in defaults.top:
                where = "defaults"
            else:
                where = "catalog (the default of a group, wave and defaults that name none)"
            problems.add(where, field_name, f"unknown connection {conn_id!r}; known connections: {listing}",
                         group=draft.index)


def _check_dashboards(
    layer: _Layer, where: str, dashboard_problem: Callable[[str], str | None], problems: _Problems
) -> None:
    for index, path in enumerate(layer.sections["parity"].get("golden_dashboards", ())):
        reason = dashboard_problem(path)
        if reason is not None:
            problems.add(where, f"parity.golden_dashboards[{index}]", reason)


def parse_catalog(
    text: str,
    *,
    profile: str | None = None,
    known_metrics: Iterable[str] = (),
    dashboard_problem: Callable[[str], str | None] | None = None,
) -> Catalog:
    """Parse and validate catalog YAML; raise one CatalogError listing every problem (see check_catalog)."""
    result = check_catalog(text, profile=profile, known_metrics=known_metrics, dashboard_problem=dashboard_problem)
    if result.problems:
        raise CatalogError(result.problems)
    return result.catalog
