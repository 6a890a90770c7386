"""The metric-group catalog: models, layering and every validation rule.

Problem texts are checked exactly: reviewers act on them, so each must name
the group, the field and the reason.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
import re2
import yaml

from promshift.core.catalog import (
    MIGRATION_DAG_PREFIX,
    Catalog,
    CatalogError,
    LatencyPolicy,
    LatencyWindow,
    MetricGroup,
    ParityPolicy,
    WarmupPolicy,
    check_catalog,
    migration_dag_id,
    parse_catalog,
)
from promshift.core.catalog import loader as loader_module
from promshift.local.airflow_lab import DEMO_TEAMS, TRIGGER_USER

REPO = Path(__file__).resolve().parents[3]
SHIPPED_CATALOG = REPO / "catalog" / "metric_groups.yaml"
DCGM_COUNTERS = REPO / "include" / "promshift" / "data" / "dcgm_default_counters.csv"


def dcgm_counter_names() -> tuple[str, ...]:
    """Metric names from dcgm-exporter's counters file (``NAME, type, help``; '#' comments)."""
    names = []
    for line in DCGM_COUNTERS.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            names.append(line.split(",", 1)[0].strip())
    return tuple(names)


KNOWN = dcgm_counter_names()


# --------------------------------------------------------------------------- builders


def base_doc() -> dict[str, Any]:
    """A small valid catalog as data; tests change one thing and dump it."""
    return {
        "version": 1,
        "defaults": {
            "warmup": {"duration": "10m", "timeout": "1h", "max_lag": "1m", "poll_interval": "30s"},
            "latency": {
                "windows": [{"range": "1h", "slo_p95": "2s"}, {"range": "6h", "slo_p95": "5s"}],
            },
        },
        "profiles": {
            "demo": {
                "warmup": {"duration": "45s", "timeout": "5m"},
                "latency": {"timeout": "20s", "windows": [{"range": "1m", "slo_p95": "2s"}]},
            }
        },
        "groups": [
            {
                "name": "gpu-memory",
                "owners": ["gpu-platform"],
                "approvers": ["oncall-alice", "oncall-bob"],
                "metrics": ["DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED"],
                "latency": {"queries": ["sum by (Hostname) (DCGM_FI_DEV_FB_USED)"]},
            },
            {
                "name": "gpu-clocks",
                "owners": ["gpu-platform"],
                "approvers": ["oncall-alice", "oncall-carol"],
                "wave": 2,
                "depends_on": ["gpu-memory"],
                "metric_regex": "DCGM_FI_DEV_(SM|MEM)_CLOCK",
                "latency": {"queries": ["avg(DCGM_FI_DEV_SM_CLOCK)"]},
            },
        ],
    }


def parse(doc: dict[str, Any], **kwargs: Any) -> Catalog:
    return parse_catalog(yaml.safe_dump(doc, sort_keys=False), **kwargs)


def problems_of(doc: dict[str, Any] | str, **kwargs: Any) -> tuple[str, ...]:
    text = doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False)
    with pytest.raises(CatalogError) as excinfo:
        parse_catalog(text, **kwargs)
    return excinfo.value.problems


def group(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(g for g in doc["groups"] if g["name"] == name)


# --------------------------------------------------------------------------- happy path and layering


def test_minimal_catalog_parses_with_builtin_defaults_filled_in() -> None:
    catalog = parse(base_doc())
    assert catalog.names() == ("gpu-memory", "gpu-clocks")
    assert catalog.profile is None
    memory = catalog.get("gpu-memory")
    assert memory.wave == 1 and memory.depends_on == () and memory.description == ""
    assert memory.host_label == "Hostname"
    assert memory.warmup == WarmupPolicy(duration_s=600, timeout_s=3600, max_lag_s=60, poll_interval_s=30)
    # Nothing in the file sets parity: the documented defaults apply.
    assert memory.parity == ParityPolicy()
    assert memory.parity.mode == "dual_write"
    assert memory.parity.sample_hosts == 5
    assert memory.parity.seed is None
    assert memory.parity.skip_recent_s == 120
    assert memory.parity.step_s == 30
    assert memory.parity.abs_tolerance == memory.parity.rel_tolerance == 1e-9
    assert memory.parity.ignore_labels == ("cluster", "__replica__", "prometheus_replica")
    assert memory.parity.max_missing_series_ratio == 0.0
    assert (memory.parity.failure_limit, memory.parity.inconclusive_limit) == (0, 0)
    assert memory.parity.consecutive_error_limit == 3
    assert memory.latency == LatencyPolicy(
        repeats=5,
        timeout_s=60,
        max_slowdown_ratio=1.2,
        windows=(LatencyWindow("1h", 3600, 2), LatencyWindow("6h", 21600, 5)),
        queries=("sum by (Hostname) (DCGM_FI_DEV_FB_USED)",),
    )


def test_group_fields_deep_merge_over_defaults_key_by_key() -> None:
    doc = base_doc()
    doc["defaults"]["parity"] = {"sample_hosts": 7, "step": "1m", "ignore_labels": ["cluster"]}
    group(doc, "gpu-memory")["parity"] = {"step": "15s", "rename_labels": {"instance": "node"}}
    group(doc, "gpu-memory")["warmup"] = {"duration": "20m"}
    memory = parse(doc).get("gpu-memory")
    assert memory.parity.sample_hosts == 7  # from defaults
    assert memory.parity.step_s == 15  # group wins
    assert memory.parity.ignore_labels == ("cluster",)
    assert memory.parity.rename_labels == (("instance", "node"),)
    assert memory.warmup.duration_s == 1200 and memory.warmup.timeout_s == 3600


def test_group_window_list_replaces_default_windows_whole() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["latency"]["windows"] = [{"range": "30m", "slo_p95": "1s", "name": "half-hour"}]
    catalog = parse(doc)
    assert catalog.get("gpu-memory").latency.windows == (LatencyWindow("half-hour", 1800, 1),)
    assert len(catalog.get("gpu-clocks").latency.windows) == 2


def test_profile_overrides_every_group_and_keeps_the_rest() -> None:
    catalog = parse(base_doc(), profile="demo")
    assert catalog.profile == "demo"
    for metric_group in catalog.groups:
        assert metric_group.warmup == WarmupPolicy(
            duration_s=45, timeout_s=300, max_lag_s=60, poll_interval_s=30
        )
        assert metric_group.latency.timeout_s == 20
        assert metric_group.latency.windows == (LatencyWindow("1m", 60, 2),)
        assert metric_group.latency.repeats == 5  # not in the profile: unchanged
    assert catalog.get("gpu-clocks").latency.queries == ("avg(DCGM_FI_DEV_SM_CLOCK)",)


def test_profile_wins_over_group_values() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["warmup"] = {"duration": "20m"}
    assert parse(doc, profile="demo").get("gpu-memory").warmup.duration_s == 45


def test_unknown_profile_is_a_problem_listing_known_profiles() -> None:
    assert problems_of(base_doc(), profile="prod") == (
        "catalog: unknown profile 'prod' (known profiles: demo)",
    )


def test_profile_problems_are_reported_even_when_profile_is_not_selected() -> None:
    doc = base_doc()
    doc["profiles"]["demo"]["parity"] = {"sample_hosts": 0}
    assert problems_of(doc) == ("profile 'demo': field 'parity.sample_hosts': must be >= 1, got 0",)


def test_cross_field_problem_caused_by_a_profile_names_the_profile() -> None:
    doc = base_doc()
    doc["profiles"]["demo"]["latency"]["windows"] = [{"range": "1m", "slo_p95": "30s"}]
    assert problems_of(doc) == (
        "group 'gpu-memory' with profile 'demo': field 'latency.windows[0].slo_p95': "
        "must be <= latency.timeout (20s), got 30s",
        "group 'gpu-clocks' with profile 'demo': field 'latency.windows[0].slo_p95': "
        "must be <= latency.timeout (20s), got 30s",
    )


def test_profile_may_only_override_policy_sections() -> None:
    doc = base_doc()
    doc["profiles"]["demo"]["owners"] = ["someone"]
    assert problems_of(doc) == (
        "profile 'demo': field 'owners': unknown field (known: bake, latency, notify, parity, replicas, tenant, "
        "warmup)",
    )


# --------------------------------------------------------------------------- problem collection


def test_all_problems_are_collected_into_one_error() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["parity"] = {"abs_tolerance": -1, "mode": "mirror"}
    group(doc, "gpu-clocks")["wave"] = 0
    with pytest.raises(CatalogError) as excinfo:
        parse(doc)
    error = excinfo.value
    assert error.problems == (
        "group 'gpu-memory': field 'parity.abs_tolerance': must be >= 0, got -1",
        "group 'gpu-memory': field 'parity.mode': "
        "must be one of 'dual_write', 'independent_scraper', got 'mirror'",
        "group 'gpu-clocks': field 'wave': must be >= 1, got 0",
    )
    assert isinstance(error, ValueError)
    assert str(error).startswith("invalid metric-group catalog (3 problems):\n")
    for problem in error.problems:
        assert f"  - {problem}" in str(error)


def test_catalog_error_survives_pickling_with_its_problems() -> None:
    error = CatalogError(["a: b", "c: d"])
    clone = pickle.loads(pickle.dumps(error))
    assert clone.problems == ("a: b", "c: d")
    assert str(clone) == str(error)


# --------------------------------------------------------------------------- document-level rules


def test_invalid_yaml_is_one_problem() -> None:
    (problem,) = problems_of("version: 1\ngroups: [\n")
    assert problem.startswith("catalog: invalid YAML: ")


def with_lines_after_first_group_name(lines: str) -> str:
    """Dump base_doc() and splice raw YAML lines into the first group."""
    text = yaml.safe_dump(base_doc(), sort_keys=False)
    anchor = "- name: gpu-memory\n"
    assert anchor in text
    return text.replace(anchor, anchor + lines, 1)


def test_duplicate_yaml_keys_are_rejected_not_silently_overwritten() -> None:
    text = with_lines_after_first_group_name("  wave: 1\n  wave: 3\n")
    (problem,) = problems_of(text)
    assert problem.startswith("catalog: invalid YAML: ")
    assert "found duplicate key 'wave'" in problem


def test_exponent_without_dot_reads_as_a_float() -> None:
    # PyYAML's YAML 1.1 rules would make 1e-6 a string and fail the type check.
    text = with_lines_after_first_group_name("  parity:\n    abs_tolerance: 1e-6\n")
    assert parse_catalog(text).get("gpu-memory").parity.abs_tolerance == 1e-6


def test_document_must_be_a_mapping() -> None:
    assert problems_of("- 1\n- 2\n") == (
        "catalog: must be a mapping with 'version' and 'groups', got a list",
    )


def test_version_is_required_and_must_be_1() -> None:
    doc = base_doc()
    del doc["version"]
    assert problems_of(doc) == ("catalog: field 'version': is required (this parser reads version 1)",)
    doc["version"] = 2
    assert problems_of(doc) == ("catalog: field 'version': must be 1, got 2",)


def test_unknown_top_level_field_is_named() -> None:
    doc = base_doc()
    doc["group"] = []
    assert problems_of(doc) == ("catalog: field 'group': unknown field (did you mean 'groups'?)",)


def test_groups_must_be_a_non_empty_list() -> None:
    doc = base_doc()
    doc["groups"] = []
    assert problems_of(doc) == ("catalog: field 'groups': must list at least one group",)
    del doc["groups"]
    assert problems_of(doc) == ("catalog: field 'groups': must be a list of groups, got null",)


def test_group_entry_must_be_a_mapping() -> None:
    doc = base_doc()
    doc["groups"].append("gpu-extra")
    assert problems_of(doc) == ("group #3: must be a mapping of group fields, got 'gpu-extra'",)


# --------------------------------------------------------------------------- unknown fields at every level


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: group(d, "gpu-memory").update(owner=["x"]),
            "group 'gpu-memory': field 'owner': unknown field (did you mean 'owners'?)",
        ),
        (
            lambda d: group(d, "gpu-memory").update(parity={"abs_tol": 0.1}),
            "group 'gpu-memory': field 'parity.abs_tol': unknown field (did you mean 'abs_tolerance'?)",
        ),
        (
            lambda d: group(d, "gpu-memory")["latency"].update(
                windows=[{"range": "1h", "slo_p95": "1s", "p99": 1}]
            ),
            "group 'gpu-memory': field 'latency.windows[0].p99': unknown field (known: name, range, slo_p95)",
        ),
        (
            lambda d: d["defaults"].update(rollout={}),
            "defaults: field 'rollout': unknown field (known: approval_timeout, bake, host_label, latency, "
            "max_queues, notify, parity, paused_waves, replicas, scrape_interval, source, target, tenant, warmup)",
        ),
        (
            lambda d: d["defaults"]["warmup"].update(length="10m"),
            "defaults: field 'warmup.length': unknown field "
            "(known: duration, max_lag, poll_interval, timeout)",
        ),
        (
            lambda d: d["profiles"]["demo"]["latency"].update(repeat=3),
            "profile 'demo': field 'latency.repeat': unknown field (did you mean 'repeats'?)",
        ),
    ],
)
def test_unknown_fields_are_named_at_every_level(mutate: Any, expected: str) -> None:
    doc = base_doc()
    mutate(doc)
    assert problems_of(doc) == (expected,)


# --------------------------------------------------------------------------- required fields


@pytest.mark.parametrize("field", ["name", "owners", "approvers"])
def test_required_group_fields(field: str) -> None:
    doc = base_doc()
    del doc["groups"][0][field]
    where = "group #1" if field == "name" else "group 'gpu-memory'"
    assert problems_of(doc) == (f"{where}: field '{field}': is required",)


@pytest.mark.parametrize(("field", "what"), [("owners", "owner"), ("approvers", "approver")])
def test_owners_and_approvers_must_be_non_empty(field: str, what: str) -> None:
    doc = base_doc()
    group(doc, "gpu-memory")[field] = []
    assert problems_of(doc) == (f"group 'gpu-memory': field '{field}': must list at least one {what}",)


def test_duplicate_approver_is_named_with_its_index() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["approvers"] = ["oncall-alice", "oncall-alice"]
    assert problems_of(doc) == (
        "group 'gpu-memory': field 'approvers[1]': duplicate approver 'oncall-alice' (also [0])",
    )


def test_metrics_or_metric_regex_is_required() -> None:
    doc = base_doc()
    del group(doc, "gpu-memory")["metrics"]
    assert problems_of(doc) == (
        "group 'gpu-memory': field 'metrics': at least one of 'metrics' or 'metric_regex' is required",
    )


def test_empty_metrics_without_regex_claims_nothing() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["metrics"] = []
    (problem, *_) = problems_of(doc)
    assert problem == (
        "group 'gpu-memory': field 'metrics': "
        "is empty and no 'metric_regex' is set: the group would claim nothing"
    )


def test_latency_windows_are_required_somewhere() -> None:
    doc = base_doc()
    del doc["defaults"]["latency"]
    assert problems_of(doc) == (
        "group 'gpu-memory': field 'latency.windows': is required (set it in defaults or in the group)",
        "group 'gpu-clocks': field 'latency.windows': is required (set it in defaults or in the group)",
    )


def test_each_window_needs_an_slo() -> None:
    doc = base_doc()
    doc["defaults"]["latency"]["windows"] = [{"range": "1h"}]
    assert problems_of(doc) == ("defaults: field 'latency.windows[0].slo_p95': is required",)


def test_golden_queries_are_required_per_group() -> None:
    doc = base_doc()
    del group(doc, "gpu-clocks")["latency"]
    assert problems_of(doc) == (
        "group 'gpu-clocks': field 'latency.queries': is required: list the group's golden PromQL queries",
    )


def test_invalid_value_is_not_also_reported_as_missing() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["owners"] = "gpu-platform"
    assert problems_of(doc) == ("group 'gpu-memory': field 'owners': must be a list, got 'gpu-platform'",)


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["GPU-memory", "gpu_memory", "1gpu", "-gpu", ""])
def test_group_name_pattern(name: str) -> None:
    doc = base_doc()
    doc["groups"][0]["name"] = name
    doc["groups"][1]["depends_on"] = []
    where = f"group {name!r}" if name else "group #1"
    shown = repr(name)
    assert problems_of(doc) == (
        f"{where}: field 'name': must be a group name matching [a-z][a-z0-9-]*, got {shown}",
    )


def test_duplicate_group_names() -> None:
    doc = base_doc()
    twin = copy.deepcopy(group(doc, "gpu-memory"))
    twin["metrics"] = ["DCGM_FI_DEV_FB_RESERVED"]
    twin["latency"] = {"queries": ["sum(DCGM_FI_DEV_FB_RESERVED)"]}
    doc["groups"].append(twin)
    assert problems_of(doc) == (
        "group 'gpu-memory': field 'name': duplicate group name; group #1 is also named 'gpu-memory'",
    )


def test_dag_id_is_the_migration_dag_of_the_groups_target() -> None:
    assert MetricGroup(name="gpu-power-thermal").dag_id == "promshift__migrate__promshift_target"
    assert MetricGroup(name="gpu-power-thermal", target="amp-prod.eu").dag_id == "promshift__migrate__amp-prod.eu"
    # Groups of one target share its DAG (chosen in its form); another target is another DAG.
    assert MetricGroup(name="a", target="t1").dag_id == MetricGroup(name="b", target="t1").dag_id
    assert MetricGroup(name="a", target="t1").dag_id != MetricGroup(name="a", target="t2").dag_id
    assert migration_dag_id("t1") == MIGRATION_DAG_PREFIX + "t1" == MetricGroup(name="a", target="t1").dag_id


# --------------------------------------------------------------------------- metrics and regexes


def test_duplicate_metric_within_a_group() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["metrics"].append("DCGM_FI_DEV_FB_FREE")
    assert problems_of(doc) == (
        "group 'gpu-memory': field 'metrics[2]': duplicate metric 'DCGM_FI_DEV_FB_FREE' (also [0])",
    )


def test_metric_names_must_be_valid_prometheus_names() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["metrics"].append("dcgm.fb-total")
    assert problems_of(doc) == (
        "group 'gpu-memory': field 'metrics[2]': must be a metric name matching "
        "[a-zA-Z_:][a-zA-Z0-9_:]*, got 'dcgm.fb-total'",
    )


def test_lookahead_is_valid_python_re_but_rejected_as_re2() -> None:
    pattern = r"DCGM_FI_DEV_(?=SM|MEM)\w+_CLOCK"
    re.compile(pattern)  # Python accepts it, so only an RE2 check catches it
    doc = base_doc()
    group(doc, "gpu-clocks")["metric_regex"] = pattern
    assert problems_of(doc) == (
        f"group 'gpu-clocks': field 'metric_regex': "
        f"invalid RE2 regex {pattern!r}: invalid perl operator: (?= "
        "(Prometheus uses RE2: no lookaround or backreferences)",
    )


def test_backreference_is_rejected_as_re2() -> None:
    doc = base_doc()
    group(doc, "gpu-clocks")["metric_regex"] = r"(DCGM)_\1"
    (problem,) = problems_of(doc)
    assert problem.startswith("group 'gpu-clocks': field 'metric_regex': invalid RE2 regex '(DCGM)_\\\\1': ")


def test_overlap_explicit_vs_explicit_names_both_groups_and_the_metric() -> None:
    doc = base_doc()
    group(doc, "gpu-clocks")["metrics"] = ["DCGM_FI_DEV_FB_USED"]
    assert problems_of(doc) == (
        "group 'gpu-clocks': field 'metrics': claims metric 'DCGM_FI_DEV_FB_USED', "
        "which group 'gpu-memory' also claims",
    )


def test_overlap_regex_vs_another_groups_explicit_metric() -> None:
    doc = base_doc()
    group(doc, "gpu-clocks")["metric_regex"] = "DCGM_FI_DEV_(SM_CLOCK|FB_.*)"
    # No known_metrics needed: the other group's explicit names are always checked.
    assert problems_of(doc) == (
        "group 'gpu-clocks': field 'metric_regex': claims metric 'DCGM_FI_DEV_FB_FREE', "
        "which group 'gpu-memory' also claims",
        "group 'gpu-clocks': field 'metric_regex': claims metric 'DCGM_FI_DEV_FB_USED', "
        "which group 'gpu-memory' also claims",
    )


def test_overlap_between_two_regex_groups_is_found_through_known_metrics() -> None:
    doc = base_doc()
    doc["groups"].append(
        {
            "name": "gpu-sm",
            "owners": ["gpu-platform"],
            "approvers": ["oncall-bob", "oncall-carol"],
            "metric_regex": "DCGM_FI_DEV_SM_.*",
            "latency": {"queries": ["avg(DCGM_FI_DEV_SM_CLOCK)"]},
        }
    )
    expected = ("group 'gpu-sm': field 'metric_regex': claims metric 'DCGM_FI_DEV_SM_CLOCK', "
                "which group 'gpu-clocks' also claims",)
    # Without the fleet's names too: gpu-clocks' regex names DCGM_FI_DEV_SM_CLOCK itself (regex_examples).
    assert problems_of(doc) == expected
    assert problems_of(doc, known_metrics=KNOWN) == (
        "group 'gpu-sm': field 'metric_regex': claims metric 'DCGM_FI_DEV_SM_CLOCK', "
        "which group 'gpu-clocks' also claims",
    )


def test_regex_matching_an_unclaimed_known_metric_is_fine() -> None:
    catalog = parse(base_doc(), known_metrics=KNOWN)
    assert catalog.get("gpu-clocks").claims("DCGM_FI_DEV_MEM_CLOCK")


# --------------------------------------------------------------------------- durations and numbers


@pytest.mark.parametrize(
    ("section", "field", "value", "reason"),
    [
        (
            "warmup",
            "duration",
            "10x",
            "invalid duration '10x': expected integer amounts with units y, w, d, h, m, s, ms in that order, "
            "each at most once (e.g. '1h30m', '500ms')",
        ),
        ("warmup", "max_lag", 60, "must be a duration string like '10m', got 60"),
        ("warmup", "poll_interval", "0s", "must be > 0, got '0s'"),
        ("parity", "step", "0", "must be > 0, got '0'"),
        ("parity", "sample_hosts", 0, "must be >= 1, got 0"),
        ("parity", "sample_hosts", True, "must be an integer, got True"),
        ("parity", "sample_hosts", 2.0, "must be an integer, got 2.0"),
        ("parity", "abs_tolerance", -1, "must be >= 0, got -1"),
        ("parity", "rel_tolerance", "tiny", "must be a finite number, got 'tiny'"),
        ("parity", "max_missing_series_ratio", 1.5, "must be between 0 and 1, got 1.5"),
        ("parity", "failure_limit", -1, "must be >= 0, got -1"),
        ("parity", "consecutive_error_limit", -2, "must be >= 0, got -2"),
        ("parity", "mode", "shadow", "must be one of 'dual_write', 'independent_scraper', got 'shadow'"),
        ("parity", "seed", 42, "must be a string, got 42"),
        (
            "parity",
            "ignore_labels",
            ["cluster", "1bad"],
            None,
        ),
        ("latency", "repeats", 0, "must be >= 1, got 0"),
        ("latency", "max_slowdown_ratio", 0.5, "must be >= 1, got 0.5"),
        ("latency", "timeout", "-5s", None),
        ("latency", "max_concurrency", 0, "must be >= 1, got 0"),
        ("latency", "accept_encoding", "br", "must be one of 'identity', 'gzip', got 'br'"),
    ],
)
def test_value_rules_name_group_field_and_reason(
    section: str, field: str, value: Any, reason: str | None
) -> None:
    doc = base_doc()
    group(doc, "gpu-memory").setdefault(section, {})[field] = value
    (problem,) = problems_of(doc)
    prefix = f"group 'gpu-memory': field '{section}.{field}"
    if reason is None:
        assert problem.startswith(prefix)
    else:
        assert problem == f"{prefix}': {reason}"


def test_warmup_timeout_must_cover_the_duration() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["warmup"] = {"duration": "2h"}
    assert problems_of(doc) == (
        "group 'gpu-memory': field 'warmup.timeout': must be >= warmup.duration (2h), got 1h",
    )


def test_warmup_poll_interval_must_fit_in_the_timeout() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["warmup"] = {"duration": "30s", "timeout": "1m", "poll_interval": "5m"}
    assert problems_of(doc) == (
        "group 'gpu-memory': field 'warmup.poll_interval': must be <= warmup.timeout (1m), got 5m",
    )


def test_label_cannot_be_both_ignored_and_renamed() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["parity"] = {"rename_labels": {"cluster": "site"}}
    assert problems_of(doc) == (
        "group 'gpu-memory': field 'parity.rename_labels': label 'cluster' is both ignored and renamed",
    )


def test_two_labels_cannot_be_renamed_to_the_same_name() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["parity"] = {"rename_labels": {"Hostname": "host", "hostname": "host"}}
    assert problems_of(doc) == (
        "group 'gpu-memory': field 'parity.rename_labels.hostname': "
        "renames to 'host', as 'Hostname' already does",
    )


# --------------------------------------------------------------------------- latency windows and queries


def test_windows_must_be_unique_by_name_and_by_range() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["latency"]["windows"] = [
        {"range": "1h", "slo_p95": "2s"},
        {"range": "60m", "slo_p95": "3s"},
        {"range": "2h", "slo_p95": "3s", "name": "1h"},
    ]
    assert problems_of(doc) == (
        "group 'gpu-memory': field 'latency.windows[1].range': duplicate window range 1h (also [0])",
        "group 'gpu-memory': field 'latency.windows[2].name': duplicate window name '1h' (also [0])",
    )


def test_windows_must_be_positive() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["latency"]["windows"] = [{"range": "0s", "slo_p95": "0s"}]
    assert problems_of(doc) == (
        "group 'gpu-memory': field 'latency.windows[0].range': must be > 0, got '0s'",
        "group 'gpu-memory': field 'latency.windows[0].slo_p95': must be > 0, got '0s'",
    )


def test_windows_must_not_be_empty() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["latency"]["windows"] = []
    assert problems_of(doc) == ("group 'gpu-memory': field 'latency.windows': must list at least one window",)


def test_window_slo_must_fit_in_the_query_timeout() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["latency"]["windows"] = [{"range": "24h", "slo_p95": "90s"}]
    assert problems_of(doc) == (
        "group 'gpu-memory': field 'latency.windows[0].slo_p95': must be <= latency.timeout (1m), got 1m30s",
    )


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("", "must be a non-empty string"),
        ("   ", "must be a non-empty string"),
        (42, "must be a string, got 42"),
        (
            'avg(DCGM_FI_DEV_FB_USED{instance=~"$instance"})',
            "contains template variable '$instance'; golden queries must be plain PromQL",
        ),
        (
            "sum(rate(DCGM_FI_DEV_FB_USED[$__rate_interval]))",
            "contains template variable '$__rate_interval'; golden queries must be plain PromQL",
        ),
        ("sum(DCGM_FI_DEV_FB_USED", "does not parse: unclosed left parenthesis in 'sum(DCGM_FI_DEV_FB_USED'"),
        ("sum(DCGM_FI_DEV_FB_USED))",
         "does not parse: unexpected right parenthesis ')' in 'sum(DCGM_FI_DEV_FB_USED))'"),
        ('DCGM_FI_DEV_FB_USED{Hostname="a}',
         "does not parse: unterminated quoted string \" in 'DCGM_FI_DEV_FB_USED{Hostname=\"a}'"),
        ("rate(DCGM_FI_DEV_FB_USED)",
         "does not parse: expected type matrix in call to function 'rate', got vector in 'rate(DCGM_FI_DEV_FB_USED)'"),
        ("avg(DCGM_FI_DEV_GPU_UTIL)", "references none of this group's metrics: 'avg(DCGM_FI_DEV_GPU_UTIL)'"),
    ],
)
def test_golden_query_rules(query: Any, reason: str) -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["latency"]["queries"] = [query]
    assert problems_of(doc) == (f"group 'gpu-memory': field 'latency.queries[0]': {reason}",)


def test_brackets_inside_strings_do_not_count() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["latency"]["queries"] = ['count(DCGM_FI_DEV_FB_USED{Hostname="node-(1|2"})']
    assert parse(doc).get("gpu-memory").latency.queries[0].startswith("count(")


def test_golden_queries_must_not_be_empty_or_repeat() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["latency"]["queries"] = []
    assert problems_of(doc) == ("group 'gpu-memory': field 'latency.queries': must list at least one query",)
    group(doc, "gpu-memory")["latency"]["queries"] = ["sum(DCGM_FI_DEV_FB_FREE)", "sum(DCGM_FI_DEV_FB_FREE)"]
    assert problems_of(doc) == (
        "group 'gpu-memory': field 'latency.queries[1]': "
        "duplicate query 'sum(DCGM_FI_DEV_FB_FREE)' (also [0])",
    )


def test_golden_queries_belong_to_groups_not_defaults() -> None:
    doc = base_doc()
    doc["defaults"]["latency"]["queries"] = ["up"]
    assert problems_of(doc) == (
        "defaults: field 'latency.queries': "
        "only allowed in a group: golden queries name that group's metrics",
    )


def test_regex_group_query_may_use_any_metric_the_regex_claims() -> None:
    doc = base_doc()
    group(doc, "gpu-clocks")["latency"]["queries"] = ["max by (Hostname) (DCGM_FI_DEV_MEM_CLOCK)"]
    assert parse(doc).get("gpu-clocks").latency.queries == ("max by (Hostname) (DCGM_FI_DEV_MEM_CLOCK)",)


# --------------------------------------------------------------------------- dependencies and waves


def test_depends_on_must_name_an_existing_group() -> None:
    doc = base_doc()
    group(doc, "gpu-clocks")["depends_on"] = ["gpu-memroy"]
    assert problems_of(doc) == (
        "group 'gpu-clocks': field 'depends_on[0]': "
        "unknown group 'gpu-memroy' (known: gpu-clocks, gpu-memory)",
    )


def test_group_cannot_depend_on_itself() -> None:
    doc = base_doc()
    group(doc, "gpu-clocks")["depends_on"] = ["gpu-clocks"]
    assert problems_of(doc) == ("group 'gpu-clocks': field 'depends_on[0]': a group cannot depend on itself",)


def test_dependency_cycle_is_reported_once_with_its_path() -> None:
    doc = base_doc()
    group(doc, "gpu-clocks")["wave"] = 1
    group(doc, "gpu-memory")["depends_on"] = ["gpu-clocks"]
    assert problems_of(doc) == (
        "group 'gpu-memory': field 'depends_on': dependency cycle: gpu-memory -> gpu-clocks -> gpu-memory",
    )


def test_dependency_must_not_be_in_a_later_wave() -> None:
    doc = base_doc()
    group(doc, "gpu-clocks")["depends_on"] = []
    group(doc, "gpu-memory")["depends_on"] = ["gpu-clocks"]
    assert problems_of(doc) == (
        "group 'gpu-memory': field 'depends_on[0]': 'gpu-clocks' is in wave 2, after this group's wave 1",
    )


# --------------------------------------------------------------------------- models


def test_models_are_frozen() -> None:
    catalog = parse(base_doc())
    memory = catalog.get("gpu-memory")
    with pytest.raises(dataclasses.FrozenInstanceError):
        memory.wave = 9  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        memory.parity.abs_tolerance = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        memory.warmup.duration_s = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        memory.latency.windows[0].slo_p95_s = 99.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        catalog.groups = ()  # type: ignore[misc]


def test_models_hold_tuples_not_lists_or_dicts() -> None:
    memory = parse(base_doc()).get("gpu-memory")
    for value in (memory.owners, memory.approvers, memory.depends_on, memory.metrics, memory.latency.windows):
        assert isinstance(value, tuple)
    assert isinstance(memory.parity.ignore_labels, tuple)
    assert isinstance(memory.parity.rename_labels, tuple)
    assert hash(memory)  # all-immutable, so usable as a key or cache entry


def test_catalog_get_raises_key_error_listing_known_names() -> None:
    catalog = parse(base_doc())
    with pytest.raises(
        KeyError, match=r"unknown metric group 'gpu-power'; known groups: gpu-memory, gpu-clocks"
    ):
        catalog.get("gpu-power")


def test_name_regex_joins_escaped_names_and_the_regex_unanchored() -> None:
    mixed = MetricGroup(name="mixed", metrics=("a_total", "ns:rate5m"), metric_regex="b_(x|y)")
    assert mixed.name_regex() == r"a_total|ns\:rate5m|b_(x|y)"
    assert not mixed.name_regex().startswith("^")
    assert mixed.claims("ns:rate5m") and mixed.claims("b_x")
    assert not mixed.claims("a_total_extra")  # full match, as Prometheus anchors relabel regexes
    assert not mixed.claims("nsXrate5m")  # the escape keeps names literal


def test_selector_escapes_the_regex_for_a_promql_string() -> None:
    tricky = MetricGroup(name="tricky", metrics=("a:b",), metric_regex=r'c\.d|"e"')
    selector = tricky.selector()
    assert selector == '{__name__=~"a\\\\:b|c\\\\.d|\\"e\\""}'
    # PromQL double-quoted strings use Go escapes; JSON's are a subset.
    assert json.loads(selector.removeprefix("{__name__=~").removesuffix("}")) == tricky.name_regex()


# --------------------------------------------------------------------------- the shipped catalog


@pytest.fixture(scope="module")
def shipped_text() -> str:
    return SHIPPED_CATALOG.read_text()


def test_dcgm_counter_list_is_read_correctly() -> None:
    assert "DCGM_FI_DEV_GPU_UTIL" in KNOWN and "DCGM_FI_DEV_DEC_UTIL" in KNOWN
    assert "DCGM_FI_PROF_SM_ACTIVE" not in KNOWN  # commented out in the csv
    assert all(re.fullmatch(r"[A-Z_]+", name) for name in KNOWN)


@pytest.mark.parametrize("profile", [None, "demo", "demo-quick", "demo-history"])
def test_shipped_catalog_parses(shipped_text: str, profile: str | None) -> None:
    catalog = parse_catalog(shipped_text, profile=profile, known_metrics=KNOWN)
    assert {"gpu-utilization", "gpu-memory", "gpu-power-thermal"} <= set(catalog.names())
    # One form entry per group, in its target's migration DAG.
    assert len(set(catalog.names())) == len(catalog.groups)
    assert all(g.dag_id == migration_dag_id(g.target) for g in catalog.groups)
    for metric_group in catalog.groups:
        users = [m for a in metric_group.approvers for m in DEMO_TEAMS.get(a.removeprefix("team:"), [a])]
        assert set(users) - {TRIGGER_USER} >= {"oncall-alice", "oncall-bob"}, metric_group.name
        assert metric_group.owners and metric_group.latency.queries


def test_shipped_groups_claim_exactly_their_metrics_and_nothing_twice(shipped_text: str) -> None:
    catalog = parse_catalog(shipped_text, known_metrics=KNOWN)
    expected = {
        "gpu-utilization": {
            "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_DEV_MEM_COPY_UTIL",
            "DCGM_FI_DEV_ENC_UTIL",
            "DCGM_FI_DEV_DEC_UTIL",
        },
        "gpu-memory": {"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED"},
        "gpu-power-thermal": {
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "DCGM_FI_DEV_GPU_TEMP",
            "DCGM_FI_DEV_MEMORY_TEMP",
        },
        "gpu-clocks": {"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK"},
    }
    claimed_by: dict[str, str] = {}
    for metric_group in catalog.groups:
        kept = {name for name in KNOWN if re2.fullmatch(metric_group.name_regex(), name)}
        if metric_group.name in expected:
            assert kept == expected[metric_group.name]
        assert kept == {name for name in KNOWN if metric_group.claims(name)}
        for name in kept:
            assert name not in claimed_by, f"{name} claimed by {claimed_by[name]} and {metric_group.name}"
            claimed_by[name] = metric_group.name


def test_shipped_production_policies(shipped_text: str) -> None:
    utilization = parse_catalog(shipped_text, known_metrics=KNOWN).get("gpu-utilization")
    assert [(w.name, w.seconds, w.slo_p95_s) for w in utilization.latency.windows] == [
        ("1h", 3600, 2),
        ("6h", 21600, 5),
        ("12h", 43200, 8),
        ("24h", 86400, 12),
    ]
    assert utilization.latency.timeout_s == 60
    assert utilization.latency.repeats == 5
    assert utilization.latency.max_slowdown_ratio == 1.2
    assert "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)" in utilization.latency.queries
    # Production samples 40 of ~2,000 hosts (2 %), 10 per mapped task; the rest are the built-in defaults.
    assert utilization.parity == ParityPolicy(
        sample_hosts=40, hosts_per_shard=10, golden_dashboards=("dashboards/dcgm-exporter-dashboard.json",),
        golden_variables=(("instance", "gpu-node-000[0-3]"), ("gpu", ".+")))


def test_shipped_demo_profile_is_fast(shipped_text: str) -> None:
    for metric_group in parse_catalog(shipped_text, profile="demo", known_metrics=KNOWN).groups:
        assert metric_group.warmup == WarmupPolicy(
            duration_s=120, timeout_s=300, max_lag_s=30, poll_interval_s=5
        )
        assert (metric_group.parity.skip_recent_s, metric_group.parity.step_s) == (20, 5)
        assert metric_group.parity.sample_hosts == 4
        assert [(w.name, w.seconds, w.slo_p95_s) for w in metric_group.latency.windows] == [
            ("30s", 30, 2),
            ("1m", 60, 2),
            ("2m", 120, 2),
        ]
        # Every demo window fits inside the dual-write time warm-up guarantees.
        assert max(w.seconds for w in metric_group.latency.windows) <= metric_group.warmup.duration_s
        assert (metric_group.latency.repeats, metric_group.latency.timeout_s) == (5, 20)
        assert metric_group.latency.deadline_s == 180


def test_shipped_demo_quick_profile_is_demo_with_half_the_warm_up(shipped_text: str) -> None:
    demo = parse_catalog(shipped_text, profile="demo", known_metrics=KNOWN)
    for metric_group in parse_catalog(shipped_text, profile="demo-quick", known_metrics=KNOWN).groups:
        same = demo.get(metric_group.name)
        assert metric_group.warmup == dataclasses.replace(same.warmup, duration_s=60)
        assert (metric_group.parity, metric_group.bake) == (same.parity, same.bake)
        assert [(w.name, w.seconds, w.slo_p95_s) for w in metric_group.latency.windows] == [("30s", 30, 2),
                                                                                           ("1m", 60, 2)]
        # Every window fits inside the dual-write time warm-up guarantees; warm-up lasts several scrapes.
        assert max(w.seconds for w in metric_group.latency.windows) <= metric_group.warmup.duration_s
        assert metric_group.warmup.duration_s >= metric_group.scrape_interval_s
        assert dataclasses.replace(metric_group.latency, windows=same.latency.windows) == same.latency


def test_shipped_demo_history_profile_times_the_production_windows(shipped_text: str) -> None:
    demo = parse_catalog(shipped_text, profile="demo", known_metrics=KNOWN)
    quick = parse_catalog(shipped_text, profile="demo-quick", known_metrics=KNOWN)
    production = parse_catalog(shipped_text, known_metrics=KNOWN)
    for metric_group in parse_catalog(shipped_text, profile="demo-history", known_metrics=KNOWN).groups:
        # Warm-up as in `demo-quick` (the windows read the backfilled history, not the dual-write time), parity as
        # in `demo`; latency over the production windows and SLOs.
        assert metric_group.warmup == quick.get(metric_group.name).warmup
        assert metric_group.parity == demo.get(metric_group.name).parity
        assert metric_group.latency.windows == production.get(metric_group.name).latency.windows
        assert [w.name for w in metric_group.latency.windows] == ["1h", "6h", "12h", "24h"]
        assert (metric_group.latency.repeats, metric_group.latency.timeout_s) == (4, 20)  # 8 pairs a round
        assert metric_group.latency.deadline_s == 300


def test_host_label_defaults_and_group_override() -> None:
    doc = base_doc()
    doc["defaults"]["host_label"] = "node"
    group(doc, "gpu-clocks")["host_label"] = "hostname"
    catalog = parse(doc)
    assert catalog.get("gpu-memory").host_label == "node"
    assert catalog.get("gpu-clocks").host_label == "hostname"
    group(doc, "gpu-clocks")["host_label"] = "host-name"
    assert problems_of(doc) == (
        "group 'gpu-clocks': field 'host_label': "
        "must be a label name matching [a-zA-Z_][a-zA-Z0-9_]*, got 'host-name'",
    )


def test_profile_names_follow_the_group_name_pattern() -> None:
    doc = base_doc()
    doc["profiles"]["Demo_2"] = {}
    assert problems_of(doc) == (
        "catalog: field 'profiles.Demo_2': profile names must match [a-z][a-z0-9-]*, at most 94 characters",)


def test_golden_dashboards_take_a_list_and_the_old_single_file_form() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["parity"] = {"golden_dashboards": ["dashboards/", "more/a.json"], "golden_required": True}
    parity = parse(doc).get("gpu-memory").parity
    assert (parity.golden_dashboards, parity.golden_required) == (("dashboards/", "more/a.json"), True)
    group(doc, "gpu-memory")["parity"] = {"golden_dashboard": "dashboards/a.json"}
    parity = parse(doc).get("gpu-memory").parity
    assert (parity.golden_dashboards, parity.golden_required) == (("dashboards/a.json",), False)
    group(doc, "gpu-memory")["parity"] = {"golden_required": "yes"}
    assert problems_of(doc) == ("group 'gpu-memory': field 'parity.golden_required': must be true or false, "
                                "got 'yes'",)


def test_latency_max_answer_bytes_defaults_to_64_mib_and_must_be_positive() -> None:
    assert parse(base_doc()).get("gpu-memory").latency.max_answer_bytes == 64 * 2**20
    doc = base_doc()
    doc["profiles"]["demo"]["latency"]["max_answer_bytes"] = 1_000_000
    assert parse(doc, profile="demo").get("gpu-clocks").latency.max_answer_bytes == 1_000_000
    group(doc, "gpu-memory")["latency"]["max_answer_bytes"] = 0
    problems = problems_of(doc)
    assert len(problems) == 1 and "group 'gpu-memory': field 'latency.max_answer_bytes'" in problems[0]


# --------------------------------------------------------------------------- hardening (issue 11)

BOMB = ('version: 1\na: &a ["x","x","x","x","x","x","x","x","x"]\n'
        + "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
        + "groups: []\n")


@pytest.mark.parametrize("loader_class", loader_module._LOADERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(("text", "expected"), [
    (BOMB, "aliases expand to more than 10,000 values"),
    ("version: 1\ngroups: &g [*g]\n", "alias *g refers to a value that contains it"),
    ("version: 1\ngroups: " + "{a: " * 40 + "1" + "}" * 40 + "\n", "nesting deeper than 32 levels"),
    ("version: 1\ngroups:\n" + "- " * 5000 + "x\n", "nesting deeper than 32 levels"),
    ("version: 1\ngroups: [" + "a" * 70_000 + "]\n", "a value of 70,000 characters (the limit is 65,536)"),
    ("version: 1\nwave: " + "9" * 5000 + "\n", "cannot read the integer"),
])
def test_both_yaml_loaders_enforce_the_budgets_while_composing(
        loader_class: type, text: str, expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The LibYAML-backed loader is used when PyYAML has LibYAML; the pure-Python one otherwise."""
    monkeypatch.setattr(loader_module, "_LOADERS", [loader_class])
    with pytest.raises(ValueError, match="invalid YAML") as excinfo:
        loader_module.load_yaml(text)
    message = str(excinfo.value)
    assert expected in message and "\n" not in message and len(message) < 300


@pytest.mark.parametrize("loader_class", loader_module._LOADERS, ids=lambda c: c.__name__)
def test_both_yaml_loaders_read_the_shipped_catalog_like_safe_load(
        loader_class: type, monkeypatch: pytest.MonkeyPatch) -> None:
    text = SHIPPED_CATALOG.read_text()
    monkeypatch.setattr(loader_module, "_LOADERS", [loader_class])
    expected = yaml.safe_load(text)
    for key in ("abs_tolerance", "rel_tolerance"):  # safe_load reads 1e-9 (no dot) as a string
        expected["defaults"]["parity"][key] = float(expected["defaults"]["parity"][key])
    assert loader_module.load_yaml(text) == expected
    shared = "version: 1\nx: &o [alice, bob]\ny: *o\nz: {<<: {a: 1}, b: 2}\nt: 1e-9\n"
    assert loader_module.load_yaml(shared) == {"version": 1, "x": ["alice", "bob"], "y": ["alice", "bob"],
                                               "z": {"a": 1, "b": 2}, "t": 1e-9}


def test_check_catalog_keeps_good_groups_and_files_problems_under_the_bad_ones() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["approvers"] = ["oncall-alice"]
    doc["groups"].append(copy.deepcopy(group(doc, "gpu-clocks")))  # a duplicate name: the second is bad
    doc["groups"][2]["wave"] = 3
    result = check_catalog(yaml.safe_dump(doc, sort_keys=False), known_metrics=KNOWN)
    assert result.readable and not result.ok
    assert result.catalog.names() == ("gpu-clocks",)
    assert result.catalog_problems == ()
    assert result.group_problems == (
        ("group 'gpu-memory'", ("group 'gpu-memory': field 'approvers': lists one approver ('oncall-alice'); "
                                "list at least two: the user who triggers a run cannot approve it",)),
        ("group 'gpu-clocks'", ("group 'gpu-clocks': field 'name': duplicate group name; group #2 is also named "
                                "'gpu-clocks'",
                                "group 'gpu-clocks': field 'metric_regex': claims metric 'DCGM_FI_DEV_MEM_CLOCK', "
                                "which group 'gpu-clocks' also claims",
                                "group 'gpu-clocks': field 'metric_regex': claims metric 'DCGM_FI_DEV_SM_CLOCK', "
                                "which group 'gpu-clocks' also claims")),
    )
    assert result.catalog.groups[0] is not None
    with pytest.raises(CatalogError) as excinfo:
        parse_catalog(yaml.safe_dump(doc, sort_keys=False), known_metrics=KNOWN)
    assert excinfo.value.problems == result.problems


def test_a_problem_in_defaults_or_a_profile_leaves_no_group() -> None:
    doc = base_doc()
    doc["defaults"]["parity"] = {"sample_hosts": 0}
    result = check_catalog(yaml.safe_dump(doc, sort_keys=False))
    assert result.catalog.groups == () and result.group_problems == ()
    assert result.catalog_problems == ("defaults: field 'parity.sample_hosts': must be >= 1, got 0",)


def test_an_unreadable_catalog_is_one_problem_and_not_readable() -> None:
    result = check_catalog("version: 1\ngroups: [\n")
    assert not result.readable and len(result.problems) == 1 and result.catalog.groups == ()
    assert result.problems[0].startswith("catalog: invalid YAML: ")


def test_overlap_tree_finds_every_regex_that_claims_a_name() -> None:
    from promshift.core.catalog.rules import _RegexTree

    regexes = [f"M{i}_.*" for i in range(50)] + ["M1_X|M7_X", "(?i)m3_x", "[A-Z0-9_]+"]
    tree = _RegexTree(regexes)
    for name in ("M1_X", "M3_X", "M7_X", "nothing", "M49_Y"):
        expected = [i for i, r in enumerate(regexes) if re2.fullmatch(r, name)]
        assert tree.matching(name) == expected, name
    assert tree.matching("M1_X") == [1, 50, 52]
    assert _RegexTree([]).matching("x") == []


def test_golden_dashboards_must_resolve_inside_the_catalog_folder(tmp_path: Path) -> None:
    from promshift.adapters.settings import catalog_dashboard_problem

    (tmp_path / "dashboards").mkdir()
    (tmp_path / "dashboards" / "ok.json").write_text("{}")
    (tmp_path / "dashboards" / "out.json").symlink_to("/etc/hostname")
    (tmp_path / "linked").symlink_to(tmp_path / "dashboards")
    problem = catalog_dashboard_problem(tmp_path)
    assert problem("dashboards/ok.json") is None
    assert problem("linked/ok.json") is None  # a link that stays inside is fine
    assert problem("dashboards") is None
    assert problem("dashboards/out.json") == (f"'dashboards/out.json' resolves to /etc/hostname, outside the "
                                              f"catalog's folder {tmp_path.resolve()} (a symlink?)")


def test_the_shipped_catalog_documents_scrape_interval() -> None:
    text = SHIPPED_CATALOG.read_text()
    assert "scrape_interval: 30s" in text and "allow_match_all: true" in text
    assert all(g.scrape_interval_s == 30 and not g.allow_match_all for g in parse(yaml.safe_load(text)).groups)


# --------------------------------------------------------------------------- notify (issue 14: who is told)


def test_notify_is_off_by_default() -> None:
    policy = parse(base_doc()).get("gpu-memory").notify
    assert (policy.channel, policy.to, policy.topic_arn, policy.enabled, policy.recipients) == (
        "none", (), None, False, ())


def test_notify_smtp_and_sns_per_group_over_defaults() -> None:
    doc = base_doc()
    doc["defaults"]["notify"] = {"channel": "smtp", "to": ["gpu-platform@example.com"]}
    group(doc, "gpu-clocks")["notify"] = {"channel": "sns",
                                          "topic_arn": "arn:aws:sns:eu-west-1:123456789012:gpu-clocks"}
    catalog = parse(doc)
    memory, clocks = catalog.get("gpu-memory").notify, catalog.get("gpu-clocks").notify
    assert (memory.channel, memory.recipients, memory.enabled) == ("smtp", ("gpu-platform@example.com",), True)
    # The defaults' `to` is merged in but ignored on channel sns: switching needs no unsetting.
    assert (clocks.channel, clocks.recipients) == ("sns", ("arn:aws:sns:eu-west-1:123456789012:gpu-clocks",))


def test_notify_slack_and_ses_per_group() -> None:
    doc = base_doc()
    doc["defaults"]["notify"] = {"channel": "ses", "to": ["gpu-platform@example.com"]}
    group(doc, "gpu-clocks")["notify"] = {"channel": "slack", "slack_conn": "gpu_oncall_slack"}
    catalog = parse(doc)
    memory, clocks = catalog.get("gpu-memory").notify, catalog.get("gpu-clocks").notify
    assert (memory.channel, memory.recipients, memory.slack_conn) == ("ses", ("gpu-platform@example.com",), None)
    # Slack posts to one webhook (one Slack channel): it counts as one recipient; `to` from the defaults is ignored.
    assert (clocks.channel, clocks.recipients, clocks.enabled) == ("slack", ("slack:gpu_oncall_slack",), True)
    doc["defaults"]["notify"] = {"channel": "slack"}
    assert parse(doc).get("gpu-memory").notify.recipients == ("slack:default",)


def test_a_profile_can_turn_notifications_off() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["notify"] = {"channel": "smtp", "to": ["a@example.com"]}
    doc["profiles"]["quiet"] = {"notify": {"channel": "none"}}
    assert parse(doc, profile="quiet").get("gpu-memory").notify.enabled is False
    assert parse(doc).get("gpu-memory").notify.enabled is True


@pytest.mark.parametrize(
    ("notify", "expected"),
    [
        ({"channel": "teams"},
         "field 'notify.channel': must be one of 'none', 'smtp', 'sns', 'slack', 'ses', got 'teams'"),
        ({"channel": "ses"}, "field 'notify.to': is required with channel 'ses': list the owners' email addresses"),
        ({"channel": "ses", "to": []},
         "field 'notify.to': is empty: channel 'ses' would mail nobody (use channel 'none' for off)"),
        ({"channel": "slack", "slack_conn": "slack webhook"},
         "field 'notify.slack_conn': must be a connection id matching [A-Za-z0-9_][A-Za-z0-9_.-]*, got "
         "'slack webhook'"),
        ({"slack_conn": "gpu_oncall_slack"}, "field 'notify.channel': is required when 'to', 'topic_arn' or "
                                             "'slack_conn' is set: choose 'smtp', 'ses', 'sns' or 'slack' ('none' "
                                             "keeps notifications off)"),
        ({"channel": "smtp"}, "field 'notify.to': is required with channel 'smtp': list the owners' email addresses"),
        ({"channel": "smtp", "to": []},
         "field 'notify.to': is empty: channel 'smtp' would mail nobody (use channel 'none' for off)"),
        ({"channel": "smtp", "to": "gpu-platform@example.com"}, "field 'notify.to': must be a list, got "
                                                                "'gpu-platform@example.com'"),
        ({"channel": "smtp", "to": ["gpu-platform"]},
         "field 'notify.to[0]': must be one email address like team@example.com, got 'gpu-platform'"),
        ({"channel": "smtp", "to": ["GPU Team <gpu@example.com>"]},
         "field 'notify.to[0]': must be one email address like team@example.com, got 'GPU Team <gpu@example.com>'"),
        ({"channel": "smtp", "to": ["a@example.com,b@example.com"]},
         "field 'notify.to[0]': must be one email address like team@example.com, got 'a@example.com,b@example.com'"),
        ({"channel": "smtp", "to": ["a@example.com", "a@example.com"]},
         "field 'notify.to[1]': duplicate address 'a@example.com' (also [0])"),
        ({"channel": "sns"}, "field 'notify.topic_arn': is required with channel 'sns'"),
        ({"channel": "sns", "topic_arn": "gpu-alerts"},
         "field 'notify.topic_arn': must be an SNS topic ARN like arn:aws:sns:us-east-1:123456789012:team-alerts, "
         "got 'gpu-alerts'"),
        ({"channel": "sns", "topic_arn": "arn:aws:sqs:us-east-1:123456789012:q"},
         "field 'notify.topic_arn': must be an SNS topic ARN like arn:aws:sns:us-east-1:123456789012:team-alerts, "
         "got 'arn:aws:sqs:us-east-1:123456789012:q'"),
        ({"to": ["a@example.com"]}, "field 'notify.channel': is required when 'to', 'topic_arn' or 'slack_conn' is "
                                    "set: choose 'smtp', 'ses', 'sns' or 'slack' ('none' keeps notifications off)"),
        ({"channel": "smtp", "to": ["a@example.com"], "cc": ["b@example.com"]},
         "field 'notify.cc': unknown field (known: channel, slack_conn, to, topic_arn)"),
        ("smtp", "field 'notify': must be a mapping, got 'smtp'"),
    ],
)
def test_notify_rules_are_one_line_each(notify: Any, expected: str) -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["notify"] = notify
    assert problems_of(doc) == (f"group 'gpu-memory': {expected}",)


def test_notify_accepts_plain_addresses_and_arns_of_other_partitions() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["notify"] = {"channel": "smtp", "to": ["gpu-platform+promshift@mail.example.co.uk",
                                                                     "oncall@localhost"]}
    group(doc, "gpu-clocks")["notify"] = {"channel": "sns",
                                          "topic_arn": "arn:aws-us-gov:sns:us-gov-west-1:123456789012:alerts.fifo"}
    catalog = parse(doc)
    assert catalog.get("gpu-memory").notify.to == ("gpu-platform+promshift@mail.example.co.uk", "oncall@localhost")
    assert catalog.get("gpu-clocks").notify.topic_arn.endswith(":alerts.fifo")  # type: ignore[union-attr]


def test_shipped_catalog_notifies_every_groups_owners_by_mail() -> None:
    catalog = parse_catalog(SHIPPED_CATALOG.read_text())
    for metric_group in catalog.groups:
        assert metric_group.notify.channel == "smtp", metric_group.name
        assert metric_group.notify.to, metric_group.name


@pytest.mark.parametrize("second_target", ["promshift_target", "promshift_target_b"])
def test_two_regexes_over_names_no_list_knows_overlap(second_target: str) -> None:
    doc = base_doc()
    for name, regex, target in (("node-all", "node_.*", "promshift_target"),
                                ("node-cpu", "node_cpu_.*", second_target)):
        doc["groups"].append({"name": name, "owners": ["gpu-platform"], "approvers": ["oncall-bob", "oncall-carol"],
                              "metric_regex": regex, "target": target,
                              "latency": {"queries": [f"avg({regex.replace('.*', 'seconds_total')})"]}})
    found = [p for p in problems_of(doc) if "node_cpu_" in p]
    assert len(found) == 1 and found[0].startswith(
        "group 'node-cpu': field 'metric_regex': claims metric 'node_cpu_', which group 'node-all' also claims")


def test_regex_examples_are_names_the_regex_matches() -> None:
    from promshift.core.catalog.rules import regex_examples

    assert regex_examples("node_cpu_.*") == ["node_cpu_"]
    assert regex_examples("DCGM_FI_DEV_(SM|MEM)_CLOCK") == ["DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK"]
    assert regex_examples("a[0-9]+b") == ["a0b"]
    assert regex_examples("(?<") == []  # unreadable here: no example, and the regex check reports it


# --------------------------------------------------------------------------- the source's queue cap


def test_max_queues_is_a_defaults_setting_checked_at_catalog_check() -> None:
    from promshift.core.queues import DEFAULT_QUEUE_CAP

    doc = base_doc()
    assert all(g.max_queues == DEFAULT_QUEUE_CAP == 4 for g in parse(doc).groups)
    doc["defaults"]["max_queues"] = 6
    assert {g.max_queues for g in parse(doc).groups} == {6}
    for bad, why in ((0, "must be >= 1, got 0"), (65, "must be <= 64, got 65"), ("4", "must be an integer, got '4'")):
        doc["defaults"]["max_queues"] = bad
        assert problems_of(doc) == (f"defaults: field 'max_queues': {why}",)
    doc = base_doc()
    group(doc, "gpu-memory")["max_queues"] = 2  # one source's cap: not a group's to set
    assert any("field 'max_queues': unknown field" in line for line in problems_of(doc))
