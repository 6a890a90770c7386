"""The read path switch: which panels read a group, the byte-preserving datasource edit, file mode."""

from __future__ import annotations

import difflib
import json
import os
import stat
from pathlib import Path

import pytest

from promshift.adapters.blobs import LocalBlobs
from promshift.adapters.dashboard_files import DashboardFilesSwitch, sha256_bytes
from promshift.core.catalog import Aggregate, MetricGroup
from promshift.core.read_path import (
    ALREADY,
    MIXED,
    SWITCH,
    UNPARSED,
    DatasourceRef,
    ReadPathError,
    parse_spans,
    plan_dashboard,
    target_reads,
)

# Byte-identical to /work/shared/reference/dcgm-exporter/dcgm-exporter-dashboard.json (dcgm-exporter's own).
DCGM = Path(__file__).resolve().parents[3] / "catalog/dashboards/dcgm-exporter-dashboard.json"
SOURCE = DatasourceRef("prom-src", name="Prometheus")
AMP = DatasourceRef("amp-ws1", name="AMP gpu-fleet")
AMP_REF = {"type": "prometheus", "uid": "amp-ws1"}
UTIL = MetricGroup(name="gpu-utilization", metrics=("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
                                                      "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL"))
MEMORY = MetricGroup(name="gpu-memory", metrics=("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
                                                  "DCGM_FI_DEV_FB_RESERVED"))
TEMP = MetricGroup(name="gpu-temperature", metrics=("DCGM_FI_DEV_GPU_TEMP",))


def plan(text: str, group: MetricGroup = UTIL, **kw):  # type: ignore[no-untyped-def]
    return plan_dashboard(text, group, source=SOURCE, target=AMP, **kw)


def datasource_spans(text: str) -> list[tuple[int, int]]:
    """Every span of a "datasource" value anywhere in the text."""
    out, stack = [], [parse_spans(text)]
    while stack:
        node = stack.pop()
        for key, _, child in node.items:
            if key == "datasource":
                out.append((child.start, child.end))
            stack.append(child)
    return out


# --------------------------------------------------------------------------- the scanner


def test_spans_parse_the_real_dashboard_exactly() -> None:
    text = DCGM.read_text()
    root = parse_spans(text)
    assert root.py() == json.loads(text)
    seen = 0
    stack = [root]
    while stack:
        node = stack.pop()
        assert json.loads(text[node.start:node.end]) == node.py()  # every span is exactly its value
        for key, key_start, child in node.items:
            if key is not None:
                assert json.loads(text[key_start:text.index(":", key_start + len(json.dumps(key)) - 1)]) == key
            stack.append(child)
        seen += 1
    assert seen > 500


@pytest.mark.parametrize("bad,where", [
    ('{"a": NaN}', "line 1 column 7"), ('{"a": [1, 2,]}', "line 1 column 13"), ('{"a": 1} x', "line 1 column 10"),
    ('{"a": "\x01"}', "line 1 column 7"), ('{\n "a" 1}', "line 2 column 6"), ("[" * 300, "nested deeper"),
])
def test_scanner_refuses_what_is_not_strict_json(bad: str, where: str) -> None:
    with pytest.raises(ReadPathError, match=where):
        parse_spans(bad)


# --------------------------------------------------------------------------- what targets read


@pytest.mark.parametrize("expr,state", [
    ('DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}', "group"),
    ("avg(rate(DCGM_FI_DEV_ENC_UTIL[$__rate_interval])) by (Hostname)", "group"),
    ("max_over_time(DCGM_FI_DEV_GPU_UTIL[$smoothing])", "group"),  # unknown variable in a range
    ("DCGM_FI_DEV_GPU_UTIL / DCGM_FI_DEV_GPU_TEMP", MIXED),
    ('{__name__=~"DCGM_FI_DEV_.*"}', "other"),  # a name pattern: may read anything
    ('{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_MEM_COPY_UTIL|DCGM_FI_DEV_ENC_UTIL|DCGM_FI_DEV_DEC_UTIL"}',
     "group"),  # the group's own selector
    ("DCGM_FI_DEV_GPU_TEMP", "other"), ("vector(1)", "none"),
    ("$metric{gpu=\"0\"} + DCGM_FI_DEV_GPU_UTIL )", UNPARSED),
])
def test_target_reads(expr: str, state: str) -> None:
    assert target_reads(expr, UTIL).state == state


# --------------------------------------------------------------------------- the real dashboard


@pytest.mark.parametrize("group,title", [(UTIL, "GPU Utilization"), (MEMORY, "GPU Framebuffer Mem Used")])
def test_real_dashboard_switches_only_the_groups_panel_datasource(group: MetricGroup, title: str) -> None:
    text = DCGM.read_text()
    p = plan(text, group)
    assert [x.title for x in p.by_state(SWITCH)] == [title]
    assert not p.by_state(MIXED) and not p.by_state(UNPARSED)
    new = p.apply(text)
    # Every byte that differs lies inside that panel's own "datasource" value, which was "$datasource".
    index = [x["title"] for x in json.loads(text)["panels"]].index(title)
    ds = parse_spans(text).get("panels").elements()[index].get("datasource")  # type: ignore[union-attr]
    assert ds is not None and text[ds.start:ds.end] == '"$datasource"'
    prefix = len(os.path.commonprefix([text, new]))
    suffix = len(os.path.commonprefix([text[::-1], new[::-1]]))
    assert ds.start <= prefix and len(text) - suffix <= ds.end  # the one changed region is inside that value
    assert text[:ds.start] + json.dumps(AMP_REF) + text[ds.end:] == new
    assert new.replace(json.dumps(AMP_REF), '"$datasource"', 1) == text
    # The changed line is the panel's own datasource (its title follows within the same object).
    model_old, model_new = json.loads(text), json.loads(new)
    diffs = [i for i, (a, b) in enumerate(zip(model_old["panels"], model_new["panels"], strict=True)) if a != b]
    assert [model_old["panels"][i]["title"] for i in diffs] == [title]
    assert model_new["panels"][diffs[0]]["datasource"] == AMP_REF
    assert {k: v for k, v in model_new["panels"][diffs[0]].items() if k != "datasource"} == \
        {k: v for k, v in model_old["panels"][diffs[0]].items() if k != "datasource"}
    assert model_new["templating"] == model_old["templating"]  # the $datasource variable stays for the others
    # A second plan on the switched text changes nothing: the panel is already switched.
    again = plan(new, group)
    assert not again.changes and [x.title for x in again.by_state(ALREADY)] == [title]


def test_crlf_dashboard_keeps_its_line_ends() -> None:
    text = DCGM.read_text().replace("\n", "\r\n")
    new = plan(text).apply(text)
    assert new.count("\r\n") == text.count("\r\n") and "\n" not in new.replace("\r\n", "")
    assert new.replace(json.dumps(AMP_REF), '"$datasource"', 1) == text


def test_variable_reading_the_group_is_reported() -> None:
    p = plan(DCGM.read_text(), TEMP)
    assert [x.title for x in p.by_state(SWITCH)] == ["GPU Temperature", "GPU Avg. Temp"]
    assert p.variables_reading_group == ("instance", "gpu")


# --------------------------------------------------------------------------- every datasource form

SYNTHETIC = """{
  "uid": "synth",
  "title": "Synthetic",
  "templating": {"list": [
    {"name": "ds", "type": "datasource", "query": "prometheus"},
    {"name": "logs", "type": "datasource", "query": "loki"}
  ]},
  "panels": [
    {"id": 1, "title": "object form",   "datasource": {"type": "prometheus", "uid": "prom-src"},
     "targets": [{"refId": "A", "expr": "DCGM_FI_DEV_GPU_UTIL",
                  "datasource": {"type": "prometheus", "uid": "prom-src"}}]},
    {"id": 2, "type": "row", "title": "a row", "collapsed": true, "panels": [
      {"id": 3, "title": "nested, string name", "datasource": "Prometheus",
       "targets": [{"refId": "A", "expr": "rate(DCGM_FI_DEV_ENC_UTIL[$__rate_interval])"}]},
      {"id": 4, "title": "nested, mixed", "datasource": "${ds}",
       "targets": [{"refId": "A", "expr": "DCGM_FI_DEV_GPU_UTIL"}, {"refId": "B", "expr": "DCGM_FI_DEV_GPU_TEMP"}]}
    ]},
    {"id": 5, "title": "import input", "datasource": {"type": "prometheus", "uid": "${DS_PROMETHEUS}"},
     "targets": [{"refId": "A", "expr": "DCGM_FI_DEV_DEC_UTIL", "datasource": {"uid": "${DS_PROMETHEUS}"}}]},
    {"id": 6, "title": "no datasource",
        "targets": [{"refId": "A", "expr": "avg(DCGM_FI_DEV_GPU_UTIL)"}]},
    {"id": 7, "title": "loki", "datasource": "$logs",
     "targets": [{"refId": "A", "expr": "{app=\\"DCGM_FI_DEV_GPU_UTIL\\"}"}]},
    {"id": 8, "title": "mixed datasources", "datasource": {"type": "datasource", "uid": "-- Mixed --"},
     "targets": [{"refId": "A", "expr": "DCGM_FI_DEV_GPU_UTIL", "datasource": "prom-src"},
                 {"refId": "B", "expr": "anything", "datasource": {"type": "loki", "uid": "loki1"}}]},
    {"id": 9, "title": "other prometheus", "datasource": {"type": "prometheus", "uid": "thanos"},
     "targets": [{"refId": "A", "expr": "DCGM_FI_DEV_GPU_UTIL"}]},
    {"id": 10, "title": "already", "datasource": {"type": "prometheus", "uid": "amp-ws1"},
     "targets": [{"refId": "A", "expr": "DCGM_FI_DEV_GPU_UTIL"}]},
    {"id": 11, "title": "unparsed", "datasource": null,
     "targets": [{"refId": "A", "expr": "DCGM_FI_DEV_GPU_UTIL +"}]},
    {"id": 12, "title": "constant and group", "datasource": "prom-src",
     "targets": [{"refId": "A", "expr": "DCGM_FI_DEV_GPU_UTIL"}, {"refId": "B", "expr": "vector(80)"}]},
    {"id": 13, "title": "old default", "datasource": "default",
     "targets": [{"refId": "A", "expr": "DCGM_FI_DEV_GPU_UTIL"}]}
  ]
}
"""


def test_every_datasource_form_is_decided_and_edited_in_place() -> None:
    p = plan(SYNTHETIC)
    states = {x.id: x.state for x in p.panels}
    assert states == {1: SWITCH, 3: SWITCH, 4: MIXED, 5: SWITCH, 6: SWITCH, 8: SWITCH, 10: ALREADY, 11: UNPARSED,
                      12: SWITCH, 13: SWITCH}  # 7 (loki), 9 (another Prometheus), the row: not through the source
    new = p.apply(SYNTHETIC)
    old_m, new_m = json.loads(SYNTHETIC), json.loads(new)
    panels = {x["id"]: x for x in new_m["panels"]} | {x["id"]: x for x in new_m["panels"][1]["panels"]}
    for pid in (1, 3, 5, 6, 12, 13):
        assert panels[pid]["datasource"] == AMP_REF, pid
    assert panels[1]["targets"][0]["datasource"] == AMP_REF
    assert panels[5]["targets"][0]["datasource"] == AMP_REF
    assert panels[8]["datasource"] == {"type": "datasource", "uid": "-- Mixed --"}
    assert panels[8]["targets"][0]["datasource"] == AMP_REF
    assert panels[8]["targets"][1]["datasource"] == {"type": "loki", "uid": "loki1"}
    for pid in (4, 7, 9, 11):
        orig = {x["id"]: x for x in old_m["panels"]} | {x["id"]: x for x in old_m["panels"][1]["panels"]}
        assert panels[pid] == orig[pid], pid
    # The key inserted into panel 6 takes the first key's place and indentation; nothing else moved.
    assert '{"datasource": {"type": "prometheus", "uid": "amp-ws1"},"id": 6' not in new
    assert '{"datasource": {"type": "prometheus", "uid": "amp-ws1"}, "id": 6, "title": "no datasource",' in new
    # Every byte that changed sits inside a "datasource" value of the original (or is the insertion).
    spans = datasource_spans(SYNTHETIC)
    ops = difflib.SequenceMatcher(None, SYNTHETIC, new, autojunk=False).get_opcodes()
    for tag, i1, i2, _, _ in ops:
        if tag == "insert" and SYNTHETIC[i1:].startswith('"id": 6'):
            continue
        assert tag == "equal" or any(s <= i1 and i2 <= e for s, e in spans), (tag, SYNTHETIC[i1 - 20:i2 + 20])
    mixed = next(x for x in p.panels if x.id == 4)
    assert "B: other" in mixed.reason
    assert not plan(new).changes  # idempotent


def test_no_datasource_is_left_alone_when_the_default_is_not_the_source() -> None:
    p = plan(SYNTHETIC, default_is_source=False)
    assert not {6, 11, 13} & {x.id for x in p.panels}


def test_insertion_copies_a_multi_line_indent() -> None:
    text = ('{\r\n  "panels": [\r\n    {\r\n      "id": 1,\r\n      "targets": [{"expr": "DCGM_FI_DEV_GPU_UTIL"}]\r\n'
            '    }\r\n  ]\r\n}\r\n')
    new = plan(text).apply(text)
    assert new == text.replace('{\r\n      "id": 1', '{\r\n      "datasource": ' + json.dumps(AMP_REF)
                               + ',\r\n      "id": 1')


def test_same_source_and_target_is_refused() -> None:
    with pytest.raises(ReadPathError, match="same"):
        plan_dashboard(SYNTHETIC, UTIL, source=SOURCE, target=DatasourceRef("x", name="Prometheus"))


def test_an_api_envelope_is_refused() -> None:
    with pytest.raises(ReadPathError, match="envelope"):
        plan(json.dumps({"dashboard": {"panels": []}, "meta": {}}))


# --------------------------------------------------------------------------- file mode


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    d = tmp_path / "provisioning"
    d.mkdir()
    (d / "dcgm.json").write_bytes(DCGM.read_bytes())
    (d / "dcgm-crlf.json").write_bytes(DCGM.read_bytes().replace(b"\n", b"\r\n"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "linked.json").write_text(SYNTHETIC)
    (d / "linked.json").symlink_to(elsewhere / "linked.json")
    (d / "unrelated.json").write_text('{"panels": [{"targets": [{"expr": "up"}]}]}')
    os.chmod(d / "dcgm.json", 0o640)
    if os.geteuid() == 0:  # as root, give it another owner to see it kept
        os.chown(d / "dcgm.json", 4242, 4243)
    return d


def files_switch(folder: Path, tmp_path: Path, group: MetricGroup = UTIL) -> DashboardFilesSwitch:
    return DashboardFilesSwitch([str(folder / "*.json")], group, source=SOURCE, target=AMP,
                                blobs=LocalBlobs(tmp_path / "snapshots"))


def test_files_switch_and_restore_exact_bytes(folder: Path, tmp_path: Path) -> None:
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    sw = files_switch(folder, tmp_path)
    dry = sw.plan()
    assert {Path(d["path"]).name: d["edits"] for d in dry["dashboards"]} == \
        {"dcgm.json": 1, "dcgm-crlf.json": 1, "linked.json": 9, "unrelated.json": 0}
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # a plan writes nothing
    snap = sw.snapshot("manual__2026-12-03T18:00:00+00:00")
    assert sorted(Path(f["path"]).name for f in snap["files"]) == ["dcgm-crlf.json", "dcgm.json", "linked.json"]
    assert "content" not in json.dumps(snap)  # the record holds hashes, not dashboards
    ev = sw.switch(snap)
    assert [f["action"] for f in ev["files"]] == ["switched"] * 3
    for f in ev["files"]:
        assert sha256_bytes(Path(f["path"]).read_bytes()) == f["sha256_after"] != f["sha256_before"]
    crlf = (folder / "dcgm-crlf.json").read_bytes()
    assert crlf.count(b"\r\n") == before["dcgm-crlf.json"].count(b"\r\n")
    assert crlf.replace(json.dumps(AMP_REF).encode(), b'"$datasource"', 1) == before["dcgm-crlf.json"]
    assert (folder / "linked.json").is_symlink()  # the link's target was edited, the link kept
    assert json.loads((tmp_path / "elsewhere" / "linked.json").read_text())["panels"][0]["datasource"] == AMP_REF
    assert stat.S_IMODE(os.stat(folder / "dcgm.json").st_mode) == 0o640
    owner = (4242, 4243) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    assert (os.stat(folder / "dcgm.json").st_uid, os.stat(folder / "dcgm.json").st_gid) == owner
    assert (folder / "unrelated.json").read_bytes() == before["unrelated.json"]
    # A retry (the task ran again after a crash) is a no-op.
    assert [f["action"] for f in sw.switch(snap)["files"]] == ["already"] * 3
    back = sw.restore(snap)
    assert [f["action"] for f in back["files"]] == ["restored"] * 3
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert (folder / "linked.json").is_symlink() and stat.S_IMODE(os.stat(folder / "dcgm.json").st_mode) == 0o640
    assert (os.stat(folder / "dcgm.json").st_uid, os.stat(folder / "dcgm.json").st_gid) == owner
    assert [f["action"] for f in sw.restore(snap)["files"]] == ["unchanged"] * 3  # restore is retry-safe too
    assert snap["files"][1]["panels"][0]["edits"] == [{"path": "panels[5].datasource", "from": "$datasource",
                                                       "to": AMP_REF, "inserted": False}]


def test_a_switched_folder_snapshots_nothing_on_the_next_run(folder: Path, tmp_path: Path) -> None:
    sw = files_switch(folder, tmp_path)
    sw.switch(sw.snapshot("run1"))
    again = sw.snapshot("run2")
    assert again["files"] == [] and sw.switch(again)["files"] == []
    with pytest.raises(ReadPathError, match="no dashboard file matches"):
        DashboardFilesSwitch([str(tmp_path / "nowhere/*.json")], UTIL, source=SOURCE, target=AMP,
                             blobs=LocalBlobs(tmp_path / "b")).snapshot("run3")


def test_files_changed_since_the_snapshot_are_not_switched(folder: Path, tmp_path: Path) -> None:
    sw = files_switch(folder, tmp_path)
    snap = sw.snapshot("run1")
    (folder / "dcgm.json").write_text(DCGM.read_text().replace("GPU Utilization", "GPU Busy"))
    other = (folder / "dcgm-crlf.json").read_bytes()
    with pytest.raises(ReadPathError, match=r"changed or vanished since the snapshot .*dcgm.json"):
        sw.switch(snap)
    assert (folder / "dcgm-crlf.json").read_bytes() == other  # nothing written


def test_restore_does_not_overwrite_a_later_edit(folder: Path, tmp_path: Path) -> None:
    sw = files_switch(folder, tmp_path)
    snap = sw.snapshot("run1")
    sw.switch(snap)
    edited = (folder / "dcgm.json").read_text().replace("GPU Utilization", "GPU Busy")
    (folder / "dcgm.json").write_text(edited)
    with pytest.raises(ReadPathError, match="changed after the switch") as exc:
        sw.restore(snap)
    actions = {Path(f["path"]).name: f["action"] for f in exc.value.evidence["files"]}  # type: ignore[attr-defined]
    assert actions == {"dcgm.json": "refused", "dcgm-crlf.json": "restored", "linked.json": "restored"}
    assert (folder / "dcgm.json").read_text() == edited
    assert (folder / "dcgm-crlf.json").read_bytes() == DCGM.read_bytes().replace(b"\n", b"\r\n")


def test_a_file_deleted_after_the_switch_is_not_recreated(folder: Path, tmp_path: Path) -> None:
    sw = files_switch(folder, tmp_path)
    snap = sw.snapshot("run1")
    sw.switch(snap)
    (folder / "dcgm.json").unlink()
    with pytest.raises(ReadPathError, match="1 dashboard file"):
        sw.restore(snap)
    assert not (folder / "dcgm.json").exists()


def test_mixed_and_library_panels_are_recorded_not_switched(tmp_path: Path) -> None:
    d = tmp_path / "dash"
    d.mkdir()
    (d / "s.json").write_text(SYNTHETIC.replace('"panels": [\n    {"id": 1,', '"panels": [\n    {"id": 99, '
                              '"title": "shared", "libraryPanel": {"uid": "lib1", "name": "GPU util (shared)"}},\n'
                              '    {"id": 1,'))
    snap = DashboardFilesSwitch([str(d)], UTIL, source=SOURCE, target=AMP, blobs=LocalBlobs(tmp_path / "b")) \
        .snapshot("run1")
    [entry] = snap["not_switched"]
    assert entry["library_panels"] == ["GPU util (shared)"]
    assert [(p["title"], p["state"]) for p in entry["panels"]] == [("nested, mixed", MIXED), ("unparsed", UNPARSED)]


def test_a_tampered_snapshot_is_refused(folder: Path, tmp_path: Path) -> None:
    sw = files_switch(folder, tmp_path)
    snap = sw.snapshot("run1")
    blob = Path(snap["ref"])
    blob.write_bytes(blob.read_bytes().replace(b"GPU Utilization", b"GPU Busy"))
    with pytest.raises(ReadPathError, match="does not match its recorded sha256"):
        sw.restore(snap)


# --------------------------------------------------------------------------- aggregations (issue 40)

AGG = MetricGroup(name="gpu-power-thermal",
                  metrics=("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
                  aggregations=(Aggregate("DCGM_FI_DEV_GPU_TEMP", ("Hostname",), ("max",)),
                                Aggregate("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", ("Hostname",), ("sum",),
                                          rate_s=300.0)))
AGG_DASHBOARD = (
    '{\r\n  "title": "Fleet",\r\n  "panels": [\r\n'
    '    {"id": 1, "title": "Hottest GPU per node", "datasource": "prom-src",\r\n'
    '     "targets": [{"refId": "A", "expr": "max by (Hostname) (DCGM_FI_DEV_GPU_TEMP{Hostname=~\\"$node\\"})  > 0"}]},'
    '\r\n    {"id": 2, "title": "Energy", "datasource": "prom-src",\r\n'
    '     "targets": [{"refId": "A", "expr": "sum(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m])) * 3600"}]},\r\n'
    '    {"id": 3, "title": "Power", "datasource": "prom-src",\r\n'
    '     "targets": [{"refId": "A", "expr": "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)"}]},\r\n'
    '    {"id": 4, "title": "Per GPU", "datasource": "prom-src",\r\n'
    '     "targets": [{"refId": "A", "expr": "DCGM_FI_DEV_GPU_TEMP{gpu=\\"0\\"}"}]}\r\n  ]\r\n}\r\n')


def test_at_cut_over_each_read_of_an_aggregated_metric_is_rewritten_to_its_recorded_series() -> None:
    p = plan(AGG_DASHBOARD, AGG)
    by = {panel.title: panel for panel in p.panels}
    assert by["Hottest GPU per node"].state == SWITCH and by["Energy"].state == SWITCH
    assert by["Power"].state == SWITCH  # shipped raw: only its datasource changes
    # The per-GPU read needs the raw series, which stay on the source: the panel is left there, and says why.
    assert by["Per GPU"].state == MIXED and "needs the raw series of DCGM_FI_DEV_GPU_TEMP" in by["Per GPU"].reason
    text = p.apply(AGG_DASHBOARD)
    model = json.loads(text)
    exprs = {panel["title"]: panel["targets"][0]["expr"] for panel in model["panels"]}
    assert exprs["Hottest GPU per node"] == (
        'max by (Hostname) (Hostname:DCGM_FI_DEV_GPU_TEMP:max{Hostname=~"$node"})  > 0')
    assert exprs["Energy"] == "sum (Hostname:DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION:rate5m) * 3600"
    assert exprs["Power"] == "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)"
    assert exprs["Per GPU"] == 'DCGM_FI_DEV_GPU_TEMP{gpu="0"}' and model["panels"][3]["datasource"] == "prom-src"
    # Only the edited values changed: CRLF, spacing and every other byte as they were.
    expected = AGG_DASHBOARD
    for panel in (1, 2, 3):
        expected = expected.replace(f'{{"id": {panel}, "title": "{model["panels"][panel - 1]["title"]}", '
                                    '"datasource": "prom-src"', f'{{"id": {panel}, "title": '
                                    f'"{model["panels"][panel - 1]["title"]}", "datasource": {json.dumps(AMP_REF)}')
    for old_panel, new_panel in zip(json.loads(AGG_DASHBOARD)["panels"], model["panels"], strict=True):
        expected = expected.replace(json.dumps(old_panel["targets"][0]["expr"]),
                                    json.dumps(new_panel["targets"][0]["expr"]))
    assert text == expected
    # A second planning of the switched text has nothing left to do (a retry is a no-op).
    again = plan(text, AGG)
    assert not again.changes and {pp.state for pp in again.panels} == {ALREADY, MIXED}


def test_a_rewritten_dashboard_goes_back_byte_for_byte_on_rollback(tmp_path: Path) -> None:
    d = tmp_path / "dash"
    d.mkdir()
    (d / "fleet.json").write_bytes(AGG_DASHBOARD.encode())
    sw = files_switch(d, tmp_path, AGG)
    snap = sw.snapshot("run-1")
    sw.switch(snap)
    assert "Hostname:DCGM_FI_DEV_GPU_TEMP:max" in (d / "fleet.json").read_text()
    sw.restore(snap)
    assert (d / "fleet.json").read_bytes() == AGG_DASHBOARD.encode()
