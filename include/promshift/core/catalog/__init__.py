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

from collections.abc import Iterable

import yaml

from promshift.core.catalog.fields import (
    _DEFAULTS_TOP_FIELDS,
    _GROUP_FIELDS,
    _TOP_LEVEL_KEYS,
    _type_name,
    _unknown_field_reason,
)
from promshift.core.catalog.layers import _assemble, _Draft, _group_label, _iter_profiles, _parse_layer, _Problems
from promshift.core.catalog.loader import _CatalogLoader
from promshift.core.catalog.model import (
    CATALOG_VERSION,
    GROUP_NAME_PATTERN,
    LABEL_NAME_PATTERN,
    METRIC_NAME_PATTERN,
    PARITY_MODES,
    PROBE_ENCODINGS,
    Catalog,
    CatalogError,
    LatencyPolicy,
    LatencyWindow,
    MetricGroup,
    ParityMode,
    ParityPolicy,
    WarmupPolicy,
)
from promshift.core.catalog.regex import _compile_re2, _re2_error
from promshift.core.catalog.rules import _check_dependencies, _check_overlaps

__all__ = [
    "CATALOG_VERSION",
    "GROUP_NAME_PATTERN",
    "LABEL_NAME_PATTERN",
    "METRIC_NAME_PATTERN",
    "PARITY_MODES",
    "PROBE_ENCODINGS",
    "Catalog",
    "CatalogError",
    "LatencyPolicy",
    "LatencyWindow",
    "MetricGroup",
    "ParityMode",
    "ParityPolicy",
    "WarmupPolicy",
    "_compile_re2",
    "_re2_error",
    "parse_catalog",
]


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
