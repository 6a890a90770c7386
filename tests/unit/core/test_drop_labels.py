"""Declared label drops (``drop_labels``): catalog, the rendered labeldrop, and what parity compares.

The group's remote_write entry drops the labels after its keep filter; the target then holds each source
series without them, and parity compares the target with the source stripped of them: equal passes,
any other difference (a value, a label the target kept, two series merged by the drop) fails.
"""

from __future__ import annotations

import yaml

from promshift.core.golden import dropped_labels_read
from promshift.core.parity import SampleComparison, label_drift, normalize_labels, without_dropped
from promshift.core.render import add_remote_write, remote_write_entry, remove_remote_write
from promshift.core.scraper_config import render_scraper_config, validate_scraper_config
from tests.unit.core.test_catalog import base_doc, group, parse, problems_of

BASE = """global:
  scrape_interval: 5s   # a comment the edit keeps
remote_write:
- name: other-team
  url: http://example.invalid/api/v1/write
"""


def _entry(**kw: object) -> dict:
    return remote_write_entry(group_name="gpu-util", name_regex="DCGM_FI_DEV_GPU_UTIL", url="http://127.0.0.1:1/w",
                              **kw)


# -- catalog ------------------------------------------------------------------------------------


def test_catalog_declares_drops_per_group() -> None:
    doc = base_doc()
    group(doc, "gpu-memory")["drop_labels"] = ["pod", "container"]
    memory = parse(doc).get("gpu-memory")
    assert memory.drop_labels == ("pod", "container")
    assert parse(base_doc()).get("gpu-memory").drop_labels == ()


def test_catalog_refuses_host_label_reserved_renamed_and_bad_names() -> None:
    for labels, why in ((["Hostname"], "is the group's host_label"), (["__name__"], "is reserved"),
                        (["pod", "pod"], "duplicate"), (["bad-name"], "label name")):
        doc = base_doc()
        group(doc, "gpu-memory")["drop_labels"] = labels
        problems = problems_of(doc)
        assert len(problems) == 1 and "'drop_labels" in problems[0] and why in problems[0], problems
    doc = base_doc()
    group(doc, "gpu-memory")["drop_labels"] = ["instance"]
    group(doc, "gpu-memory")["parity"] = {"rename_labels": {"instance": "node"}}
    assert problems_of(doc) == ("group 'gpu-memory': field 'drop_labels': label 'instance' is both dropped and "
                                "renamed (parity.rename_labels)",)


# -- rendering ------------------------------------------------------------------------------------


def test_entry_drops_after_the_keep_filter_and_without_drops_is_unchanged() -> None:
    assert _entry()["write_relabel_configs"] == [
        {"source_labels": ["__name__"], "regex": "DCGM_FI_DEV_GPU_UTIL", "action": "keep"}]
    assert _entry(drop_labels=("pod", "container"))["write_relabel_configs"] == [
        {"source_labels": ["__name__"], "regex": "DCGM_FI_DEV_GPU_UTIL", "action": "keep"},
        {"regex": "pod|container", "action": "labeldrop"}]


def test_add_and_remove_with_drops_preserve_the_users_bytes() -> None:
    added = add_remote_write(BASE, _entry(drop_labels=("pod",)))
    assert added.startswith(BASE)  # the user's lines, comment included, stay as they were
    live = yaml.safe_load(added)["remote_write"][1]
    assert live["write_relabel_configs"][1] == {"regex": "pod", "action": "labeldrop"}
    assert add_remote_write(added, _entry(drop_labels=("pod",))) == added  # a retry is a no-op
    assert remove_remote_write(added, "promshift-gpu-util") == BASE
    raw = BASE.encode()
    assert remove_remote_write(add_remote_write(raw, _entry(drop_labels=("pod", "container"))),
                               "promshift-gpu-util") == raw


def test_scraper_blob_drops_after_its_keep_filter_and_passes_the_limits() -> None:
    blob = render_scraper_config(name_regex="DCGM_FI_DEV_GPU_UTIL", scrape_interval_s=30, drop_labels=("pod",))
    doc = validate_scraper_config(blob)
    rules = doc["scrape_configs"][0]["metric_relabel_configs"]
    assert rules[-1] == {"regex": "pod", "action": "labeldrop"} and rules[0]["action"] == "keep"
    plain = yaml.safe_load(render_scraper_config(name_regex="X", scrape_interval_s=30))
    assert len(plain["scrape_configs"][0]["metric_relabel_configs"]) == 1


# -- parity ---------------------------------------------------------------------------------------

def _ls(**labels: str) -> tuple[tuple[str, str], ...]:
    return normalize_labels({"__name__": "DCGM_FI_DEV_GPU_UTIL", **labels})


PTS = [(0.0, 1.0), (30.0, 2.0)]


def test_samples_pass_when_the_target_is_the_source_without_the_dropped_labels() -> None:
    source = {_ls(Hostname="n1", gpu="0", pod="a"): PTS, _ls(Hostname="n1", gpu="1", pod="b"): [(0.0, 5.0)]}
    target = {_ls(Hostname="n1", gpu="0"): PTS, _ls(Hostname="n1", gpu="1"): [(0.0, 5.0)]}
    c = SampleComparison(abs_tol=1e-9, rel_tol=1e-9)
    c.add(without_dropped(source, ["pod"]), target)
    assert (c.series_compared, c.points_compared, c.mismatches, c.missing_series, c.extra_series) == (2, 3, 0, 0, 0)
    # Without declaring the drop, the same target is missing every series.
    plain = SampleComparison(abs_tol=1e-9, rel_tol=1e-9)
    plain.add(without_dropped(source, []), target)
    assert plain.missing_series == 2


def test_samples_fail_on_a_value_difference_or_a_merge_the_drop_caused() -> None:
    source = {_ls(Hostname="n1", gpu="0", pod="a"): PTS}
    c = SampleComparison(abs_tol=1e-9, rel_tol=1e-9)
    c.add(without_dropped(source, ["pod"]), {_ls(Hostname="n1", gpu="0"): [(0.0, 1.0), (30.0, 2.5)]})
    assert c.mismatches == 1
    # Two series that differ only by the dropped label merge: the target held one of them, not their sum.
    merged = {_ls(Hostname="n1", gpu="0", pod="a"): PTS, _ls(Hostname="n1", gpu="0", pod="b"): PTS}
    assert without_dropped(merged, ["pod"]) == {_ls(Hostname="n1", gpu="0"): [(0.0, 2.0), (30.0, 4.0)]}
    c = SampleComparison(abs_tol=1e-9, rel_tol=1e-9)
    c.add(without_dropped(merged, ["pod"]), {_ls(Hostname="n1", gpu="0"): PTS})
    assert c.mismatches == 2


def test_labels_layer_expects_the_drop_and_names_a_target_that_kept_the_label() -> None:
    source = {"M": ["__name__", "Hostname", "gpu", "pod"]}
    assert label_drift(source, {"M": ["__name__", "Hostname", "gpu"]}, dropped=["pod"]) == {}
    assert label_drift(source, {"M": ["__name__", "Hostname", "gpu"]}) == {
        "M": {"only_source": ["pod"], "only_target": []}}
    assert label_drift(source, source, dropped=["pod"]) == {"M": {"only_source": [], "only_target": ["pod"]}}


def test_golden_names_queries_that_read_a_dropped_label() -> None:
    assert dropped_labels_read("sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", ["pod", "container"]) == []
    assert dropped_labels_read('sum by (pod) (DCGM_FI_DEV_GPU_UTIL{container="x"})',
                               ["pod", "container"]) == ["pod", "container"]
    assert dropped_labels_read("DCGM_FI_DEV_GPU_UTIL / ignoring(pod) X", ["pod"]) == ["pod"]


def test_the_plans_catalog_draft_declares_its_safe_drops_and_passes_the_check() -> None:
    from promshift.core.catalog import check_catalog
    from promshift.core.plan import recommend
    from promshift.core.plan_render import catalog_draft
    from tests.unit.core.test_plan import PRICES, _fleet

    f = _fleet()
    plan = recommend(f["metrics"], f["usage"], prices=PRICES, retention_days=150, period_s=86_400, now=1e9).to_dict()
    assert any(g["labeldrop"] for g in plan["groups"])
    result = check_catalog(catalog_draft(plan, host_label="Hostname", scrape_interval_s=30))
    assert not result.problems, result.problems
    for g in plan["groups"]:
        assert result.catalog.get(g["name"]).drop_labels == tuple(d for d in g["labeldrop"] if d != "Hostname")


def test_the_plan_demo_writes_a_catalog_with_the_first_droppable_group(tmp_path) -> None:
    from pathlib import Path

    from promshift.adapters.settings import check_catalog_file
    from promshift.local.demo_plan import demo_catalog

    base = Path(__file__).resolve().parents[3] / "catalog" / "metric_groups.yaml"
    plan = {"groups": [
        {"name": "no-drops", "metrics": ["DCGM_FI_DEV_FB_USED"], "labeldrop": ["Hostname"], "series": 8,
         "golden_queries": []},
        {"name": "with-drops", "metrics": ["DCGM_FI_DEV_GPU_UTIL"], "labeldrop": ["UUID", "Hostname"], "series": 8,
         "golden_queries": ["avg(DCGM_FI_DEV_GPU_UTIL)"]}]}
    path, name = demo_catalog(plan, base=base, out_dir=tmp_path / "cat")
    checked = check_catalog_file(path, profile="demo")
    assert not checked.problems, checked.problems
    assert name == "with-drops" and checked.catalog.names() == ("with-drops",)
    group = checked.catalog.get(name)
    assert group.drop_labels == ("UUID",) and group.latency.queries == ("avg(DCGM_FI_DEV_GPU_UTIL)",)
    assert (tmp_path / "cat" / "dashboards").is_dir()  # the golden dashboards resolve beside the catalog


def test_a_label_only_removed_is_not_read() -> None:
    """Issue 39, item 3: refused only where the answer could depend on the label."""
    drops = ["UUID", "pci_bus_id"]
    assert dropped_labels_read("max without (UUID, pci_bus_id) (DCGM_FI_DEV_GPU_UTIL)", drops) == []
    assert dropped_labels_read("max(DCGM_FI_DEV_GPU_UTIL)", drops) == []
    assert dropped_labels_read("rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m])", drops) == []
    assert dropped_labels_read("sum without (UUID) (rate(x[5m])) / on(Hostname) group_left y", drops) == []
    read = {
        'x{UUID="GPU-1"}': ["UUID"],
        "sum by (pci_bus_id) (x)": ["pci_bus_id"],
        "x * on(UUID) y": ["UUID"],
        "x / ignoring(pci_bus_id) y": ["pci_bus_id"],
        "x * on(Hostname) group_left(UUID) y": ["UUID"],
        'label_replace(x, "bus", "$1", "pci_bus_id", "(.*)")': ["pci_bus_id"],
        'label_join(x, "id", "-", "Hostname", "UUID")': ["UUID"],
        'count_values("UUID", x)': ["UUID"],
        'max_over_time(x{UUID=~".+"}[5m:1m])': ["UUID"],
        "max without (UUID) (x{pci_bus_id!=\"\"})": ["pci_bus_id"],
    }
    for expr, wanted in read.items():
        assert dropped_labels_read(expr, drops) == wanted, expr
