"""Per-group connections in the catalog: ``source``/``target`` layered defaults < wave < group, and the refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from promshift.core.catalog import DEFAULT_SOURCE_CONN, DEFAULT_TARGET_CONN, check_catalog

SHIPPED = Path(__file__).resolve().parents[3] / "catalog" / "metric_groups.yaml"


def doc() -> dict:
    return yaml.safe_load(SHIPPED.read_text())


def text(document: dict) -> str:
    return yaml.safe_dump(document, sort_keys=False)


def group(document: dict, name: str) -> dict:
    return next(g for g in document["groups"] if g["name"] == name)


def test_without_connections_every_group_keeps_the_global_pair() -> None:
    result = check_catalog(SHIPPED.read_text())
    assert result.ok
    assert {g.pair for g in result.catalog.groups} == {(DEFAULT_SOURCE_CONN, DEFAULT_TARGET_CONN)}
    assert (DEFAULT_SOURCE_CONN, DEFAULT_TARGET_CONN) == ("promshift_source", "promshift_target")


def test_layers_defaults_then_wave_then_group() -> None:
    d = doc()
    d["defaults"]["target"] = "amp_default"
    d["waves"] = {2: {"source": "cluster_b", "target": "amp_b"}}
    group(d, "gpu-clocks")["target"] = "amp_c"
    group(d, "gpu-memory")["source"] = "cluster_a"
    result = check_catalog(text(d))
    assert result.ok, result.problems
    pairs = {g.name: g.pair for g in result.catalog.groups}
    assert pairs == {
        "gpu-utilization": ("promshift_source", "amp_default"),
        "gpu-memory": ("cluster_a", "amp_default"),
        "gpu-power-thermal": ("cluster_b", "amp_b"),
        "gpu-clocks": ("cluster_b", "amp_c"),
    }


def test_unknown_connections_are_refused_once_where_they_are_set() -> None:
    d = doc()
    d["waves"] = {2: {"target": "amp_b"}}
    group(d, "gpu-memory")["source"] = "cluster_x"
    known = ["promshift_source", "promshift_target", "amp_c"]
    result = check_catalog(text(d), known_connections=known)
    assert result.problems == (
        "group 'gpu-memory': field 'source': unknown connection 'cluster_x'; known connections: "
        "amp_c, promshift_source, promshift_target",
        "wave 2: field 'target': unknown connection 'amp_b'; known connections: amp_c, promshift_source, "
        "promshift_target",
    )
    # Only the groups that use a bad connection lose their DAG.
    assert result.catalog.names() == ("gpu-utilization",)
    # Without a list of connections nothing is checked.
    assert check_catalog(text(d)).ok


def test_the_default_pair_is_checked_too_in_one_line() -> None:
    result = check_catalog(SHIPPED.read_text(), known_connections=["promshift_source"])
    assert len(result.problems) == 1
    assert "unknown connection 'promshift_target'" in result.problems[0]
    assert result.catalog.groups == ()


def test_same_metrics_on_another_cluster_and_workspace_are_fine() -> None:
    d = doc()
    copy = dict(group(d, "gpu-utilization"), name="gpu-utilization-b", source="cluster_b", target="amp_b")
    d["groups"].append(copy)
    result = check_catalog(text(d))
    assert result.ok, result.problems


@pytest.mark.parametrize(
    ("source", "target", "expected"),
    [
        ("promshift_source", "promshift_target",
         "group 'gpu-utilization-b': field 'metrics': duplicate pairing: group 'gpu-utilization' already moves the "
         "same metrics from 'promshift_source' to 'promshift_target'"),
        ("cluster_b", "promshift_target",
         "group 'gpu-utilization-b': field 'metrics': claims metrics 'DCGM_FI_DEV_DEC_UTIL', 'DCGM_FI_DEV_ENC_UTIL', "
         "'DCGM_FI_DEV_GPU_UTIL' (+1 more), which group 'gpu-utilization' also moves to 'promshift_target' (from "
         "'promshift_source'): a metric moved twice to one target"),
        ("promshift_source", "amp_b",
         "group 'gpu-utilization-b': field 'metrics': claims metrics 'DCGM_FI_DEV_DEC_UTIL', 'DCGM_FI_DEV_ENC_UTIL', "
         "'DCGM_FI_DEV_GPU_UTIL' (+1 more), which group 'gpu-utilization' also claims on source 'promshift_source' "
         "(to 'promshift_target'): its series would be dual-written to two targets"),
    ],
)
def test_a_pairing_twice_is_one_clear_line(source: str, target: str, expected: str) -> None:
    d = doc()
    original = group(d, "gpu-utilization")
    # The same metrics in another order: still the same keep-filter.
    d["groups"].append(dict(original, name="gpu-utilization-b", source=source, target=target,
                            metrics=list(reversed(original["metrics"]))))
    result = check_catalog(text(d))
    assert result.problems == (expected,)
    assert "gpu-utilization" in result.catalog.names()
    assert "gpu-utilization-b" not in result.catalog.names()


def test_a_regex_group_overlapping_on_one_target_is_refused() -> None:
    d = doc()
    d["groups"].append({"name": "clocks-b", "owners": ["t"], "approvers": ["oncall-alice", "oncall-bob"],
                        "source": "cluster_b", "metric_regex": "DCGM_FI_DEV_SM_CLOCK",
                        "latency": {"queries": ["avg(DCGM_FI_DEV_SM_CLOCK)"]}})
    # Regexes are compared on the metric names known (dcgm-exporter's counters, as settings passes them).
    result = check_catalog(text(d), known_metrics=["DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK"])
    assert result.problems == (
        "group 'clocks-b': field 'metric_regex': claims metric 'DCGM_FI_DEV_SM_CLOCK', which group 'gpu-clocks' also "
        "moves to 'promshift_target' (from 'promshift_source'): a metric moved twice to one target",)


def test_a_bad_wave_entry_holds_back_only_its_groups() -> None:
    d = doc()
    d["waves"] = {2: {"target": "amp b", "warmup": {"duration": "1m"}}}
    result = check_catalog(text(d))
    assert set(result.problems) == {
        "wave 2: field 'target': must be a connection id matching [A-Za-z0-9_][A-Za-z0-9_.-]*, got 'amp b'",
        "wave 2: field 'warmup': unknown field (known: source, target)",
    }
    assert result.catalog.names() == ("gpu-utilization", "gpu-memory")
