"""core.rules: which rules move with a metric group, the target's document, the byte-preserving cut."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from promshift.core.parity import normalize_labels
from promshift.core.promql import PromQLError, analyse
from promshift.core.rules import (
    LoadedRule,
    RuleKind,
    RulesError,
    add_rule_file,
    alert_states,
    inline_recording_rules,
    missing_rules,
    parse_rule_file,
    remove_rule_file,
    remove_rules,
    rule_file_patterns,
    rule_measurement,
    rules_document,
    rules_verdict,
    select_rules,
)
from promshift.core.verdicts import Verdict

DATA = Path(__file__).resolve().parents[2] / "data" / "rules"
GPU_MEMORY = {"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED"}


def claims(name: str) -> bool:
    return name in GPU_MEMORY


def selection_of(name: str, data: bytes | None = None):
    raw = data if data is not None else (DATA / name).read_bytes()
    return raw, select_rules([parse_rule_file(name, raw)], claims)


# -- selection --------------------------------------------------------------------------------------


def test_rules_reading_the_group_move_with_the_recording_rules_they_read() -> None:
    _, sel = selection_of("gpu.yml")
    assert [(r.group, r.kind, r.name) for r in sel.rules] == [
        ("gpu-memory", RuleKind.RECORD, "gpu:fb_used:ratio"),
        ("gpu-memory", RuleKind.ALERT, "GpuMemoryHigh"),
        ("mixed", RuleKind.ALERT, "GpuMemoryLeak"),
    ]
    why = {r.name: sel.why[r.key] for r in sel.rules}
    assert why["GpuMemoryHigh"] == "reads recording rule gpu:fb_used:ratio"
    assert why["gpu:fb_used:ratio"] == "reads DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_FB_FREE"
    # GpuMemoryLeak also reads a recording rule of another group's metric: named, for parity to judge.
    assert {sel.rules[2].key: ("gpu:util:avg",)} == dict(sel.foreign)
    assert sel.whole_groups("gpu.yml") == ("gpu-memory",)
    assert [a.name for a in sel.alerts] == ["GpuMemoryHigh", "GpuMemoryLeak"]


def test_chains_across_files_and_out_of_order_are_followed_to_the_end() -> None:
    first = parse_rule_file("a.yml", b"groups:\n- name: a\n  rules:\n  - alert: Top\n    expr: level2:x > 1\n"
                                     b"  - alert: Unrelated\n    expr: up == 0\n")
    second = parse_rule_file("b.yml", b"groups:\n- name: b\n  rules:\n  - record: level2:x\n    expr: sum(level1:x)\n"
                                      b"  - record: level1:x\n    expr: rate(DCGM_FI_DEV_FB_USED[5m])\n")
    sel = select_rules([first, second], claims)
    assert sorted(r.name for r in sel.rules) == ["Top", "level1:x", "level2:x"]
    assert not sel.foreign
    assert select_rules([first], claims).rules == ()


def test_selectors_without_a_metric_name_move_when_they_select_a_group_metric() -> None:
    f = parse_rule_file("n.yml", b"""groups:
- name: n
  rules:
  - record: fb:series
    expr: count({__name__=~"DCGM_FI_DEV_FB_.*"})
  - record: gpu:series
    expr: count({__name__=~"DCGM_FI_DEV_GPU_.*"})
  - record: all:series
    expr: count({job="dcgm"})
  - alert: NotFb
    expr: count({__name__!~"DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_FREE|DCGM_FI_DEV_FB_RESERVED", job="x"}) > 1
""")
    sel = select_rules([f], claims, candidates=sorted(GPU_MEMORY))
    assert [r.name for r in sel.rules] == ["fb:series"]
    assert sel.why[sel.rules[0].key] == 'reads {__name__=~"DCGM_FI_DEV_FB_.*"}'
    assert list(sel.unsure.values()) == [('{job="dcgm"}',)]
    assert sel.to_dict()["unsure"] == [{"rule": "n.yml/n/2", "selectors": ['{job="dcgm"}']}]
    # Without candidates (a metric_regex group) every such rule is named unsure, none moves.
    blind = select_rules([f], claims)
    assert blind.rules == () and len(blind.unsure) == 4


def test_a_bad_rule_file_is_one_line_naming_it() -> None:
    with pytest.raises(RulesError, match=r"^x.yml: group 'g', rule 1: needs exactly one of `record` or `alert`$"):
        parse_rule_file("x.yml", b"groups:\n- name: g\n  rules:\n  - expr: up\n")
    with pytest.raises(RulesError, match="defined twice"):
        parse_rule_file("x.yml", b"groups:\n- name: g\n  rules: []\n- name: g\n  rules: []\n")
    assert parse_rule_file("empty.yml", b"# nothing yet\n").rules == ()


def test_rule_file_patterns_come_from_the_config() -> None:
    assert rule_file_patterns(b"global: {}\nrule_files:\n  - rules/*.yml\n  - /etc/x.yml\n") == ("rules/*.yml",
                                                                                              "/etc/x.yml")
    assert rule_file_patterns(b"global: {}\n") == ()


# -- the target's document ------------------------------------------------------------------------


def test_the_document_holds_the_selected_rules_in_their_groups_with_anchors_resolved() -> None:
    _, sel = selection_of("gpu.yml")
    doc = rules_document(sel, header="moved by promshift")
    assert doc.startswith("# moved by promshift\ngroups:\n")
    loaded = yaml.safe_load(doc)  # YAML 1.1, as the strictest reader
    assert [g["name"] for g in loaded["groups"]] == ["gpu-memory", "mixed"]
    assert loaded["groups"][0]["interval"] == "30s"
    high = loaded["groups"][0]["rules"][1]
    assert high == {"alert": "GpuMemoryHigh", "expr": "gpu:fb_used:ratio > 0.95", "for": "5m",
                    "labels": {"team": "gpu-platform"},
                    "annotations": {"summary": "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} is almost out of "
                                               "memory"}}
    leak = loaded["groups"][1]["rules"][0]
    assert leak["labels"] == {"severity": "on"}  # a string, not YAML 1.1's True
    assert leak["expr"] == "deriv(DCGM_FI_DEV_FB_USED[10m]) > 100\nand on (Hostname) gpu:util:avg < 5\n"
    assert "expr: |\n" in doc  # multi-line expressions stay readable
    assert rules_document(sel.only(RuleKind.RECORD)).count("record:") == 1
    assert "alert:" not in rules_document(sel.only(RuleKind.RECORD))


def test_two_groups_of_one_name_cannot_share_a_document() -> None:
    a = parse_rule_file("a.yml", b"groups:\n- name: g\n  rules:\n  - alert: A\n    expr: DCGM_FI_DEV_FB_USED > 1\n")
    b = parse_rule_file("b.yml", b"groups:\n- name: g\n  rules:\n  - alert: B\n    expr: DCGM_FI_DEV_FB_FREE < 1\n")
    with pytest.raises(RulesError, match="rule group 'g' is in both a.yml and b.yml"):
        rules_document(select_rules([a, b], claims))


# -- cutting the rules out of the source file ----------------------------------------------------

EXPECTED_LF = b"""# GPU rules, owned by gpu-platform
groups:
  - name: mixed
    rules:
      - record: gpu:util:avg
        expr: avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)
      - alert: HostDown
        expr: up{job="dcgm"} == 0
  - name: other
    rules:
      - alert: TooHot
        expr: DCGM_FI_DEV_GPU_TEMP > 90
"""


def test_the_cut_removes_exactly_the_rules_and_keeps_every_other_byte() -> None:
    raw, sel = selection_of("gpu.yml")
    new = remove_rules(raw, "gpu.yml", sel)
    assert new == EXPECTED_LF
    # Nothing but whole lines went: the result is the original with some lines taken out, in order.
    old_lines, new_lines = raw.splitlines(keepends=True), new.splitlines(keepends=True)
    it = iter(old_lines)
    assert all(any(line == candidate for candidate in it) for line in new_lines)


def test_crlf_stays_crlf_and_only_the_rules_go() -> None:
    raw, sel = selection_of("gpu-crlf.yml")
    assert b"\r\n" in raw
    new = remove_rules(raw, "gpu-crlf.yml", sel)
    assert new == EXPECTED_LF.replace(b"\n", b"\r\n")


def test_a_partial_group_keeps_its_comments_and_other_rules() -> None:
    raw = (b"groups:\n  - name: g  # keep me\n    rules:\n      # about A\n      - alert: A\n"
           b"        expr: DCGM_FI_DEV_FB_USED > 1   # moves\n      # about B\n      - alert: B\n"
           b"        expr: up == 0\n")
    _, sel = selection_of("p.yml", raw)
    assert sel.whole_groups("p.yml") == ()
    assert remove_rules(raw, "p.yml", sel) == (b"groups:\n  - name: g  # keep me\n    rules:\n      # about A\n"
                                               b"      # about B\n      - alert: B\n        expr: up == 0\n")


def test_a_last_rule_without_a_final_line_break_takes_the_break_before_it() -> None:
    raw, sel = selection_of("no-final-newline.yml")
    assert not raw.endswith(b"\n")
    assert remove_rules(raw, "no-final-newline.yml", sel) == (b"groups:\n  - name: last\n    rules:\n"
                                                              b"      - alert: Keep\n        expr: up == 0")


def test_removing_every_group_leaves_a_valid_empty_file() -> None:
    raw = b"# header\ngroups:\n  - name: g\n    rules:\n      - alert: A\n        expr: DCGM_FI_DEV_FB_USED > 1\n"
    _, sel = selection_of("all.yml", raw)
    new = remove_rules(raw, "all.yml", sel)
    assert new == b"# header\ngroups:\n"
    assert parse_rule_file("all.yml", new).rules == ()


def test_an_anchor_defined_by_a_moved_rule_and_used_by_a_kept_one_is_refused() -> None:
    raw, sel = selection_of("shared-anchor.yml")
    assert [r.name for r in sel.rules] == ["FbHigh"]
    with pytest.raises(RulesError, match="anchor another rule uses"):
        remove_rules(raw, "shared-anchor.yml", sel)


def test_a_bom_survives_and_a_flow_list_is_refused() -> None:
    raw = "\ufeffgroups:\n- name: g\n  rules:\n  - alert: A\n    expr: DCGM_FI_DEV_FB_FREE < 1\n  - alert: B\n" \
          "    expr: up == 0\n"
    _, sel = selection_of("bom.yml", raw.encode())
    assert remove_rules(raw.encode(), "bom.yml", sel) == "\ufeffgroups:\n- name: g\n  rules:\n  - alert: B\n" \
                                                          "    expr: up == 0\n".encode()
    flow = b"groups:\n- name: g\n  rules: [{alert: A, expr: DCGM_FI_DEV_FB_FREE < 1}, {alert: B, expr: up}]\n"
    _, sel = selection_of("flow.yml", flow)
    with pytest.raises(RulesError, match="flow-style list"):
        remove_rules(flow, "flow.yml", sel)


def test_a_file_changed_since_the_selection_is_refused() -> None:
    raw, sel = selection_of("gpu.yml")
    with pytest.raises(RulesError, match="changed since its rules were selected"):
        remove_rules(raw.replace(b"> 0.95", b"> 0.9"), "gpu.yml", sel)


# -- the target config's rule_files ---------------------------------------------------------------


@pytest.mark.parametrize(("config", "expected"), [
    (b"global:\n  scrape_interval: 15s\n", b"global:\n  scrape_interval: 15s\nrule_files:  # added by promshift\n"
                                           b"  - \"rules/promshift-gpu-memory.yml\"\n"),
    (b"rule_files:\n  - base.yml  # ours\nscrape_configs: []\n",
     b"rule_files:\n  - base.yml  # ours\n  - \"rules/promshift-gpu-memory.yml\"\nscrape_configs: []\n"),
    (b"global: {}\r\nrule_files:\r\n- a.yml\r\n", b"global: {}\r\nrule_files:\r\n- a.yml\r\n"
                                                  b"- \"rules/promshift-gpu-memory.yml\"\r\n"),
    (b"global: {}\nrule_files:\n", b"global: {}\nrule_files:\n  - \"rules/promshift-gpu-memory.yml\"\n"),
])
def test_rule_files_gets_the_group_file_and_loses_it_again_byte_for_byte(config: bytes, expected: bytes) -> None:
    path = "rules/promshift-gpu-memory.yml"
    added = add_rule_file(config, path)
    assert added == expected
    assert add_rule_file(added, path) == added  # a retry changes nothing
    assert rule_file_patterns(added)[-1] == path
    if b"rule_files:\n" in config and config.endswith(b"rule_files:\n"):
        return  # `rule_files:` (null) becomes a list: removing our entry leaves the list's key, not the null
    assert remove_rule_file(added, path) == config


# -- parity ----------------------------------------------------------------------------------------


def test_reads_of_recording_rules_are_inlined_for_the_comparison() -> None:
    _, sel = selection_of("gpu.yml")
    records = {r.name: r for r in sel.records}
    high = inline_recording_rules("gpu:fb_used:ratio > 0.95", records)
    assert high == ('label_replace((DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)), "team", '
                    '"gpu-platform", "", "") > 0.95')
    ranged = inline_recording_rules("max_over_time(gpu:fb_used:ratio[10m])", records)
    assert "[10m:]" in ranged
    assert {s.name for s in analyse(ranged).selectors} == {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"}
    assert inline_recording_rules("sum by (Hostname) (DCGM_FI_DEV_FB_USED)", records) == \
        "sum by (Hostname) (DCGM_FI_DEV_FB_USED)"
    with pytest.raises(PromQLError, match="label matchers"):
        inline_recording_rules('gpu:fb_used:ratio{gpu="0"} > 0.9', records)
    with pytest.raises(PromQLError, match="offset"):
        inline_recording_rules("gpu:fb_used:ratio offset 5m > 0.9", records)
    # A recording rule named like a label (no colon): label lists and matchers keep the label.
    plain = parse_rule_file("p.yml", b"groups:\n- name: p\n  rules:\n  - record: fbused\n"
                                     b"    expr: sum by (gpu) (DCGM_FI_DEV_FB_USED)\n").rules[0]
    assert inline_recording_rules('sum by (fbused) (fbused) / on (fbused) DCGM_FI_DEV_FB_FREE{fbused="1"}',
                                  {"fbused": plain}) == \
        'sum by (fbused) ((sum by (gpu) (DCGM_FI_DEV_FB_USED))) / on (fbused) DCGM_FI_DEV_FB_FREE{fbused="1"}'


def _series(**values: list[tuple[float, float]]):
    return {normalize_labels({"gpu": gpu}): points for gpu, points in values.items()}


def test_rule_parity_never_passes_without_data_and_fails_one_sided_answers() -> None:
    _, sel = selection_of("gpu.yml")
    rec, alert = sel.rules[0], sel.rules[1]
    window = {"start": 0.0, "end": 60.0, "step": 30.0}
    kw = {"abs_tol": 1e-9, "rel_tol": 1e-9, "window": window}
    quiet = rule_measurement(alert, alert.expr, {}, {}, **kw)
    assert (quiet.verdict, quiet.reason) == (Verdict.INCONCLUSIVE, "the alert is quiet on both sides: nothing to "
                                                                   "compare")
    assert quiet.name == "rules[alert GpuMemoryHigh]" and quiet.layer.value == "rules"
    same = _series(g0=[(0, 0.5), (30, 0.6)])
    assert rule_measurement(rec, rec.expr, same, same, **kw).verdict == Verdict.SUCCESSFUL
    one_sided = rule_measurement(alert, alert.expr, same, {}, **kw)
    assert one_sided.verdict == Verdict.FAILED and one_sided.reason.startswith("no answer on the target")
    assert rule_measurement(alert, alert.expr, {}, same, **kw).verdict == Verdict.FAILED
    drifted = rule_measurement(rec, rec.expr, same, _series(g0=[(0, 0.5), (30, 0.7)]), **kw)
    assert drifted.verdict == Verdict.FAILED and "1 of 2 points differ" in drifted.reason
    line = rules_verdict([quiet, drifted])
    assert (line.name, line.verdict) == ("rules", Verdict.FAILED)
    assert rules_verdict([]).verdict == Verdict.INCONCLUSIVE


def test_rule_parity_allows_independent_scrapers_jitter_only_with_noise_k() -> None:
    """Scraper path: the two sides read a noisy gauge at different instants, so a recording rule over it differs
    by the gauge's own jitter; that passes with the samples layer's noise allowance, a change of scale does not."""
    from promshift.core.parity import INDEPENDENT_NOISE_K

    _, sel = selection_of("gpu.yml")
    rec = sel.rules[0]
    window = {"start": 0.0, "end": 600.0, "step": 30.0}
    kw = {"abs_tol": 1e-9, "rel_tol": 1e-6, "window": window}
    src_vals = [0.50, 0.53, 0.49, 0.52, 0.48, 0.51, 0.54, 0.50, 0.47, 0.52, 0.49, 0.51]
    tgt_vals = [v + (0.01 if i % 2 else -0.01) for i, v in enumerate(src_vals)]  # half a step's jitter
    source = _series(g0=[(30.0 * i, v) for i, v in enumerate(src_vals)])
    target = _series(g0=[(30.0 * i, v) for i, v in enumerate(tgt_vals)])
    assert rule_measurement(rec, rec.expr, source, target, **kw).verdict == Verdict.FAILED
    assert rule_measurement(rec, rec.expr, source, target, noise_k=INDEPENDENT_NOISE_K, **kw).verdict \
        == Verdict.SUCCESSFUL
    scaled = _series(g0=[(30.0 * i, v * 100) for i, v in enumerate(src_vals)])
    assert rule_measurement(rec, rec.expr, source, scaled, noise_k=INDEPENDENT_NOISE_K, **kw).verdict \
        == Verdict.FAILED


def test_alert_states_name_both_and_neither() -> None:
    _, sel = selection_of("gpu.yml")
    src = [LoadedRule("f", "gpu-memory", RuleKind.ALERT, "GpuMemoryHigh"),
           LoadedRule("f", "mixed", RuleKind.ALERT, "GpuMemoryLeak")]
    tgt = [LoadedRule("t", "gpu-memory", RuleKind.ALERT, "GpuMemoryHigh")]
    assert alert_states(sel.alerts, src, tgt) == {"gpu-memory/GpuMemoryHigh": "both", "mixed/GpuMemoryLeak": "source"}
    assert alert_states(sel.alerts, [], []) == {"gpu-memory/GpuMemoryHigh": "neither",
                                                "mixed/GpuMemoryLeak": "neither"}
    assert [r.name for r in missing_rules(sel.rules, src)] == ["gpu:fb_used:ratio"]
