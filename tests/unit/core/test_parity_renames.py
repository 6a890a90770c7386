"""Declared and undeclared renames of the host label, in the pure parity maths (issue 8, item 3)."""

from __future__ import annotations

from promshift.core.parity import (
    HostLabels,
    count_hosts,
    coverage_measurement,
    describe_label_drift,
    label_drift,
    label_renames,
)
from promshift.core.verdicts import Measurement, Verdict


def test_host_labels_take_declared_aliases_and_case_variants() -> None:
    none = HostLabels.for_group("Hostname", {})
    assert none.declared == ("Hostname",) and none.variants == ("hostname",)
    declared = HostLabels.for_group("Hostname", {"hostname": "Hostname"})
    assert declared.declared == ("Hostname", "hostname") and declared.variants == ()
    # Both names mapped to a third: each is the host, whichever a side carries.
    both = HostLabels.for_group("Hostname", {"Hostname": "host", "hostname": "host"})
    assert both.declared == ("Hostname", "host", "hostname") and both.names == both.declared
    # A rename of some other label does not touch the host label.
    other = HostLabels.for_group("Hostname", {"uuid": "UUID"})
    assert other.declared == ("Hostname",) and other.variants == ("hostname",)


def test_locate_prefers_declared_names_and_flags_undeclared_ones() -> None:
    undeclared = HostLabels.for_group("Hostname", {})
    assert undeclared.locate({"Hostname": "a"}) == ("a", None)
    assert undeclared.locate({"hostname": "a"}) == ("a", "hostname")
    assert undeclared.locate({"gpu": "0"}) == ("", None)
    declared = HostLabels.for_group("Hostname", {"hostname": "Hostname"})
    assert declared.locate({"hostname": "a"}) == ("a", None)
    assert declared.locate({"Hostname": "a", "hostname": "b"}) == ("a", None)


def test_count_hosts_splits_declared_from_undeclared_rows() -> None:
    rows = [({"Hostname": "a"}, 8.0), ({"hostname": "b"}, 8.0), ({"hostname": "a"}, 2.0), ({}, 1.0)]
    by_host, by_variant = count_hosts(rows, HostLabels.for_group("Hostname", {}))
    assert by_host == {"a": 8.0, "": 1.0} and by_variant == {"hostname": {"b": 8.0, "a": 2.0}}
    by_host, by_variant = count_hosts(rows, HostLabels.for_group("Hostname", {"hostname": "Hostname"}))
    assert by_host == {"a": 10.0, "b": 8.0, "": 1.0} and by_variant == {}


def host_coverage(src: dict[str, float], tgt: dict[str, float], under_target: dict[str, set[str]]) -> Measurement:
    return coverage_measurement([(1.0, src, tgt)], max_missing_ratio=0.0, queries=["q"], name="host_coverage",
                                key="host", key_label="Hostname", under_variants=({}, under_target))


def test_host_coverage_names_an_undeclared_rename_not_missing_data() -> None:
    src = {f"gpu-node-{i}": 8.0 for i in range(100)}
    m = host_coverage(src, {}, {"hostname": set(src)})
    assert m.verdict == Verdict.FAILED
    assert m.reason.startswith("100 hosts (gpu-node-0, gpu-node-1, gpu-node-10, gpu-node-11, gpu-node-12 and 95 more) "
                               "present under `hostname` on the target, not `Hostname`")
    assert "`parity.rename_labels: {hostname: Hostname}`" in m.reason
    assert "misses" not in m.reason and "missing" not in m.reason
    assert m.numbers["renamed_keys"] == {"hostname@target": sorted(src)}


def test_host_coverage_keeps_real_loss_apart_from_a_partial_rename() -> None:
    src = {"a": 8.0, "b": 8.0, "c": 8.0, "d": 8.0}
    m = host_coverage(src, {"a": 8.0, "b": 8.0}, {"hostname": {"c"}})
    assert m.verdict == Verdict.FAILED
    assert "1 host (c) present under `hostname` on the target, not `Hostname`" in m.reason
    assert "target misses series of 1 host (d); worst 100.00% missing" in m.reason
    assert m.numbers["short_keys"] == ["c", "d"]  # both short under Hostname: the aggregates layer's excuse


def test_host_coverage_names_a_rename_on_the_source_side() -> None:
    m = coverage_measurement([(1.0, {"a": 8.0}, {"a": 8.0, "b": 8.0})], max_missing_ratio=0.0, queries=[],
                             name="host_coverage", key="host", key_label="Hostname",
                             under_variants=({"hostname": {"b"}}, {}))
    assert m.verdict == Verdict.FAILED
    assert m.reason.startswith("1 host (b) present under `hostname` on the source, `Hostname` on the target")
    assert "that the source does not" not in m.reason


def test_host_coverage_without_a_host_label_still_says_so() -> None:
    m = host_coverage({"a": 8.0}, {"a": 8.0, "": 8.0}, {})
    assert m.verdict == Verdict.FAILED and "no Hostname label" in m.reason


def test_label_drift_of_half_the_fleet_suggests_the_rename_and_names_the_hosts() -> None:
    src = {m: ["Hostname", "gpu", "UUID"] for m in ("A", "B", "C")}
    tgt = {m: ["Hostname", "hostname", "gpu", "UUID"] for m in ("A", "B", "C")}
    drift = label_drift(src, tgt)
    assert drift["A"] == {"only_source": [], "only_target": ["hostname"], "renamed": {"hostname": "Hostname"}}
    assert label_renames(drift) == {("hostname", "Hostname"): "target"}
    hosts = [f"gpu-node-{i:04d}" for i in range(7)]
    text = describe_label_drift(drift, {"hostname": hosts})
    assert text == ("A, B, C: `hostname` only on target; `hostname` on 7 hosts (gpu-node-0000, gpu-node-0001, "
                    "gpu-node-0002, gpu-node-0003, gpu-node-0004 and 2 more) of the target: "
                    "renamed? add `parity.rename_labels: {hostname: Hostname}` if intended")
    assert label_drift(src, tgt, rename={"hostname": "Hostname"}) == {}


def test_label_drift_of_the_whole_fleet_hints_one_direction_only() -> None:
    drift = label_drift({"A": ["Hostname", "gpu"]}, {"A": ["hostname", "gpu"]})
    assert drift["A"]["renamed"] == {"hostname": "Hostname"}
    text = describe_label_drift(drift)
    assert text.startswith("A: `Hostname` only on source and `hostname` only on target; `hostname` on the target")
    assert text.count("renamed?") == 1
    # A source-only variant reads as the source's rename; unrelated names get no hint.
    assert label_drift({"A": ["Hostname", "hostname"]}, {"A": ["Hostname"]})["A"]["renamed"] == {
        "hostname": "Hostname"}
    assert "renamed" not in label_drift({"A": ["node"]}, {"A": ["host"]})["A"]
