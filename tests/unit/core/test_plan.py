"""``promshift plan``'s core: attribution, the uniqueness check, recommendations, cost, outputs, bad input."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from promshift.adapters.usage import ReadNotes, read_dashboard_files, read_query_log, scrape_intervals
from promshift.cli import main
from promshift.core.catalog import check_catalog
from promshift.core.cost import MONTH_S, AmpPrices
from promshift.core.plan import (
    DropBasis,
    Reader,
    UsageCollector,
    check_drops,
    diff_plans,
    expression_usage,
    label_reads,
    metric_stats,
    recommend,
)
from promshift.core.plan_render import catalog_draft, plan_markdown
from promshift.core.promql import is_own_read, mark_own_read

PRICES = AmpPrices(ingest_per_10m_samples=0.90, storage_per_gb_month=0.03, query_per_billion_samples=0.10,
                   bytes_per_sample=1.0)
LOG = Reader("query_log", "api")


# --------------------------------------------------------------------------- attribution


@pytest.mark.parametrize(("expr", "metric", "labels", "everywhere"), [
    ('up{job="x"}', "up", {"job"}, set()),
    ("sum by (Hostname, gpu) (rate(DCGM_FI_DEV_X[5m]))", "DCGM_FI_DEV_X", set(), {"Hostname", "gpu"}),
    ("count without (UUID) (a)", "a", set(), {"UUID"}),
    ("a / on (Hostname) group_left (modelName) b", "a", set(), {"Hostname", "modelName"}),
    ("a * ignoring (pod) b", "b", set(), {"pod"}),
    ('label_replace(a, "host", "$1", "instance", "(.*):.*")', "a", set(), {"instance"}),
    ('label_join(a, "dst", ",", "x", "y")', "a", set(), {"x", "y"}),
    ('max_over_time(a{gpu!="3"}[1h:1m])', "a", {"gpu"}, set()),
    ('topk(3, a{b=~"c.*"} @ end())', "a", {"b"}, set()),
])
def test_expression_usage_names_every_label_a_read_uses(expr: str, metric: str, labels: set[str],
                                                        everywhere: set[str]) -> None:
    u = expression_usage(expr)
    assert u.metrics[metric] == labels
    assert u.labels == everywhere


def test_label_replace_target_is_not_a_read_label() -> None:
    assert "host" not in expression_usage('label_replace(a, "host", "$1", "instance", "(.*)")').labels


def test_vector_matching_without_on_is_a_join_and_scalars_are_not() -> None:
    assert expression_usage("a / b").joins == (frozenset({"a", "b"}),)
    assert expression_usage("a and b").joins == (frozenset({"a", "b"}),)
    assert expression_usage("a * 2").joins == ()
    assert expression_usage("a / on (x) b").joins == ()
    assert expression_usage("a / ignoring (x) b").joins == (frozenset({"a", "b"}),)
    assert expression_usage("sum(a) / count(a)").joins == ()  # one metric joined with itself


def test_each_distinct_expression_is_parsed_once_and_reads_counted() -> None:
    u = UsageCollector()
    for i in range(5):
        u.add("rate(a[5m])", LOG, seen=100.0 + i)
    u.add("rate(a[5m])", Reader("rule", "r"))
    assert list(u.exprs) == ["rate(a[5m])"]
    assert u.reads[("rate(a[5m])", LOG)].count == 5
    assert u.reads[("rate(a[5m])", LOG)].last_seen == 104.0
    assert not u.add("rate(a[5m]", LOG)
    assert u.unparsable_reads == 1 and "does not parse" in u.unparsable["rate(a[5m]"]


def test_legend_and_dashboard_variables_count_as_reads() -> None:
    u = UsageCollector()
    model = {"templating": {"list": [{"name": "gpu", "current": {"value": "0"}}]},
             "panels": [{"title": "T", "targets": [{"expr": 'a{gpu="$gpu", Hostname=~"$node"}[$__rate_interval]',
                                                    "legendFormat": "{{ pod }}"}]},
                        {"type": "row", "panels": [{"title": "inner", "targets": [{"expr": "b"}]}]}]}
    notes = u.add_dashboard(model, "d.json", builtins={"__rate_interval": "1m"})
    assert notes == ["dashboard d.json: variables $node have no value here; they stood for any value "
                     "(their labels count as read)"]
    reads = label_reads(u)
    assert reads.by_metric["a"] == {"gpu", "Hostname", "pod"}
    assert "b" in reads.by_metric


def test_nameless_selectors_resolve_against_the_inventory() -> None:
    u = UsageCollector()
    u.add('count({__name__=~"DCGM_.*", job="dcgm"})', LOG)
    metrics = {n: metric_stats(n, [{"__name__": n, "job": j, "x": "1"}]) for n, j in
               (("DCGM_A", "dcgm"), ("DCGM_B", "other"), ("node_x", "dcgm"))}
    plan = recommend(metrics, u, prices=PRICES, retention_days=1, period_s=3600, now=0)
    assert set(plan.unread_metrics) == {"DCGM_B", "node_x"}


# --------------------------------------------------------------------------- uniqueness


def _gpus(nodes: int, gpus: int, name: str = "m") -> list[dict[str, str]]:
    return [{"__name__": name, "Hostname": f"n{n}", "gpu": str(g), "UUID": f"GPU-{n}-{g}", "device": f"nvidia{g}",
             "modelName": "H100", "pod": f"p{n}"} for n in range(nodes) for g in range(gpus)]


def test_a_drop_that_keeps_series_apart_is_safe() -> None:
    basis = DropBasis("m", _gpus(3, 4), ["UUID", "device", "modelName", "pod"])
    check = check_drops(basis)
    # gpu still tells the GPUs of a node apart: every candidate can go together.
    assert check.safe == {"UUID", "device", "modelName", "pod"} and not check.unsafe


def test_a_drop_that_merges_series_is_unsafe_and_says_which() -> None:
    basis = DropBasis("m", _gpus(2, 3), ["gpu", "UUID", "device"])
    check = check_drops(basis, ["UUID", "device", "gpu"])
    assert check.safe == {"UUID", "device"}
    why = check.unsafe["gpu"]
    assert "two series of m would merge" in why and 'gpu="0" vs gpu="1"' in why
    assert "with UUID, device dropped too" in why


def test_uniqueness_is_checked_on_the_real_series_not_the_label_counts() -> None:
    # 'slot' has as many values as series, yet series already differ only by it and 'gpu' together.
    series = [{"__name__": "m", "gpu": "0", "slot": "a"}, {"__name__": "m", "gpu": "0", "slot": "b"},
              {"__name__": "m", "gpu": "1", "slot": "a"}]
    assert check_drops(DropBasis("m", series, ["slot"])).unsafe
    assert check_drops(DropBasis("m", series[:1] + series[2:], ["slot"])).safe == {"slot"}


def test_a_series_without_the_label_is_a_value_of_its_own() -> None:
    series = [{"__name__": "m", "x": "1"}, {"__name__": "m"}]
    assert check_drops(DropBasis("m", series, ["x"])).unsafe


# --------------------------------------------------------------------------- recommendations


def _fleet() -> dict[str, object]:
    names = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_ENC_UTIL",
             "node_load1", "up"]
    u = UsageCollector()
    u.add("avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", LOG, count=100)
    u.add('DCGM_FI_DEV_FB_USED{gpu="0"} / DCGM_FI_DEV_FB_FREE', Reader("rule", "mem"), count=10)
    u.add("node_load1 / on (Hostname) DCGM_FI_DEV_GPU_UTIL", LOG, count=1)
    reads = label_reads(u)
    metrics = {}
    for n in names:
        job = "node" if n.startswith("node") else "dcgm"
        series = [{**s, "job": job} for s in _gpus(4, 8 if job == "dcgm" else 1, n)]
        metrics[n] = metric_stats(n, series, candidates=reads.candidates(n, {k for s in series for k in s}, ["job"]),
                                  default_interval_s=30.0)
    return {"usage": u, "metrics": metrics}


def test_recommend_groups_waves_drops_and_left_behind() -> None:
    f = _fleet()
    plan = recommend(f["metrics"], f["usage"], prices=PRICES, retention_days=150, period_s=86_400, now=1e9,
                     protected_labels=["job", "Hostname"])
    assert plan.metrics["up"]["group"] is None  # Prometheus' own series never form a group
    assert plan.unread_metrics == ("DCGM_FI_DEV_ENC_UTIL",)
    dcgm, node = plan.groups
    assert (dcgm.job, node.job) == ("dcgm", "node")
    assert dcgm.metrics == ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL")
    assert dcgm.left_behind == ("DCGM_FI_DEV_ENC_UTIL",)
    assert dcgm.keep_regex == "DCGM_FI_DEV_FB_FREE|DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_GPU_UTIL"
    # gpu is read (a matcher) on FB_USED: the whole group keeps it; UUID, device, modelName, pod go.
    assert "gpu" not in dcgm.drops and dcgm.unsafe_drops["gpu"].startswith("read by rule: mem")
    assert dcgm.drops == ("UUID", "device", "modelName", "pod")
    assert dcgm.unsafe_drops["Hostname"].startswith("kept on purpose")
    # Read-heavy first: dcgm (111 reads over 96 series) before node (1 read over 4 series).
    assert (dcgm.wave, node.wave) == (1, 2)
    assert plan.never_read_labels["DCGM_FI_DEV_GPU_UTIL"] == ("UUID", "device", "gpu", "job", "modelName", "pod")


def test_families_split_by_prefix_when_large() -> None:
    u = UsageCollector()
    names = [f"DCGM_FI_DEV_{k}_{i}" for k in ("FB", "CLOCK") for i in range(4)] + ["DCGM_FI_DEV_ODD_X"]
    for n in names:
        u.add(n, LOG)
    metrics = {n: metric_stats(n, [{"__name__": n, "job": "dcgm"}]) for n in names}
    plan = recommend(metrics, u, prices=PRICES, retention_days=1, period_s=3600, now=0, max_group_metrics=5)
    assert sorted((g.prefix, len(g.metrics)) for g in plan.groups) == [
        ("DCGM_FI_DEV_CLOCK", 4), ("DCGM_FI_DEV_FB", 4), ("DCGM_FI_DEV_other", 1)]


def test_a_label_matched_on_all_labels_across_groups_is_not_dropped() -> None:
    u = UsageCollector()
    u.add("a_x / b_y", LOG)
    metrics = {n: metric_stats(n, [{"__name__": n, "job": n[0], "k": str(i), "extra": "e"} for i in range(3)],
                               candidates=["extra"]) for n in ("a_x", "b_y")}
    plan = recommend(metrics, u, prices=PRICES, retention_days=1, period_s=3600, now=0)
    for g in plan.groups:
        assert "extra" not in g.drops
        assert "matched on all labels with another group's metric" in g.unsafe_drops["extra"]


def test_cost_before_and_after_use_the_price_table() -> None:
    f = _fleet()
    plan = recommend(f["metrics"], f["usage"], prices=PRICES, retention_days=150, period_s=86_400, now=1e9,
                     max_group_metrics=10)
    g = next(g for g in plan.groups if "DCGM_FI_DEV_GPU_UTIL" in g.metrics)
    kept = len(g.metrics) * 32
    assert g.series == kept and g.series_all == kept + 32 * len(g.left_behind)
    ingest = kept * MONTH_S / 30.0 / 1e7 * 0.90
    assert g.cost_after["ingest_usd"] == pytest.approx(ingest, abs=0.01)
    assert g.cost_before["ingest_usd"] > g.cost_after["ingest_usd"]
    # A day's query log: 100 reads of avg(GPU_UTIL) over its 32 series, and one join with node_load1 whose
    # samples are shared by series (32 of 36 are GPU_UTIL's); the rule's evaluations are not in this log.
    assert g.cost_after["query_samples_per_month"] == round((100 * 32 + 32) * MONTH_S / 86_400)
    assert g.cost_after["query_usd"] == round(g.cost_after["query_samples_per_month"] / 1e9 * 0.10, 4)


def test_outputs_draft_passes_the_catalog_check_and_plan_md_says_partial() -> None:
    f = _fleet()
    plan = recommend(f["metrics"], f["usage"], prices=PRICES, retention_days=150, period_s=86_400, now=1e9,
                     not_read=["source /api/v1/status/tsdb: HTTP 404"]).to_dict()
    draft = catalog_draft(plan, host_label="Hostname", scrape_interval_s=30)
    result = check_catalog(draft)
    assert not result.problems, result.problems
    assert list(result.catalog.names()) == [g["name"] for g in plan["groups"]]
    md = plan_markdown(plan)
    assert "## PARTIAL: what this plan could not read" in md and "status/tsdb: HTTP 404" in md
    assert plan["partial"] is True
    json.dumps(plan, allow_nan=False)


def test_diff_against_a_previous_plan() -> None:
    f = _fleet()
    old = recommend(f["metrics"], f["usage"], prices=PRICES, retention_days=150, period_s=86_400, now=1e9).to_dict()
    f["usage"].add("DCGM_FI_DEV_ENC_UTIL", LOG)
    new = recommend(f["metrics"], f["usage"], prices=PRICES, retention_days=150, period_s=86_400, now=2e9).to_dict()
    lines = diff_plans(old, new)
    assert "now read: DCGM_FI_DEV_ENC_UTIL" in lines
    assert any("+DCGM_FI_DEV_ENC_UTIL" in line for line in lines)
    assert diff_plans(new, new) == []


# --------------------------------------------------------------------------- query log and bad input


def _line(query: str, ts: str = "2026-12-05T01:00:00.000Z", **extra: object) -> str:
    return json.dumps({"params": {"query": query, "start": ts, "end": ts, "step": 0}, "ts": ts, **extra}) + "\n"


def test_query_log_attributes_rules_and_api_queries(tmp_path: Path) -> None:
    log = tmp_path / "q.log"
    log.write_text(_line("up") * 3 + _line("rate(a[5m])", ruleGroup={"file": "r.yml", "name": "g"})
                   + json.dumps({"params": {"query": "b", "start": "2026-12-05T00:00:00Z",
                                            "end": "2026-12-05T01:00:00Z", "step": 60},
                                 "ts": "2026-12-05T01:00:00Z"}) + "\n")
    u, notes = UsageCollector(), ReadNotes()
    s = read_query_log(log, u, notes)
    assert (s.lines, s.read, s.bad) == (5, 5, 0) and not notes.missing and not notes.caveats
    assert u.reads[("up", Reader("query_log", "ad-hoc and dashboard API queries"))].count == 3
    assert ("rate(a[5m])", Reader("rule", "r.yml / g")) in u.reads
    assert u.reads[("b", Reader("query_log", "ad-hoc and dashboard API queries"))].points == 61


@pytest.mark.parametrize("prometheus_shape", [True, False], ids=["fast-path", "line-by-line"])
def test_promshifts_own_reads_are_left_out_of_a_query_log_and_counted(tmp_path: Path, prometheus_shape: bool) -> None:
    """promshift's parity, latency and bake queries (``mark_own_read``) are not the fleet's reads: neither the plan
    nor what retiring a source ends counts them; the note says how many were left out."""
    def line(query: str) -> str:
        ts = "2026-12-05T01:00:00.000Z"
        entry = {"httpRequest": {"clientIP": "127.0.0.1", "method": "POST", "path": "/api/v1/query"},
                 "params": {"end": ts, "query": query, "start": ts, "step": 0}, "ts": ts}
        return (json.dumps(entry, sort_keys=True, separators=(",", ":")) if prometheus_shape
                else json.dumps(entry)) + "\n"

    own = mark_own_read("sum(rate(DCGM_FI_DEV_GPU_UTIL[5m]))")
    log = tmp_path / "q.log"
    log.write_text(line(own) * 4 + line("DCGM_FI_DEV_FB_USED") + line(own))
    u, notes = UsageCollector(), ReadNotes()
    s = read_query_log(log, u, notes)
    assert (s.lines, s.read, s.own_reads, s.bad) == (6, 1, 5, 0)
    assert [expr for expr, _ in u.reads] == ["DCGM_FI_DEV_FB_USED"]
    assert notes.caveats == [f"query log {log}: 5 of promshift's own reads (its parity, latency and bake queries) "
                             "left out"] and not notes.missing
    # only promshift's own: nothing read, but the log was usable (no "no usable line")
    only = tmp_path / "own.log"
    only.write_text(line(own))
    notes = ReadNotes()
    assert read_query_log(only, UsageCollector(), notes).own_reads == 1 and not notes.missing
    # the mark is a trailing comment line: the same query without it, or with it mid-query, is the fleet's
    assert is_own_read(own) and not is_own_read("sum(x)") and not is_own_read(f"{own}\n+ 1")


def test_empty_truncated_and_unparsable_query_logs_each_say_so(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_text("")
    notes = ReadNotes()
    read_query_log(empty, UsageCollector(), notes)
    assert notes.missing == [f"query log {empty}: empty (is query_log_file set, and did anyone query?)"]

    cut = tmp_path / "cut.log"
    cut.write_text(_line("up") + _line("up")[:30])
    notes = ReadNotes()
    s = read_query_log(cut, UsageCollector(), notes)
    assert s.truncated and s.read == 1 and notes.caveats == [
        f"query log {cut}: last line cut short (still being written, or truncated); it was skipped"]

    bad = tmp_path / "bad.log"
    bad.write_text(_line("up") + "not json\n" + _line("sum(") + _line("up", ts="2020-01-01T00:00:00Z"))
    notes = ReadNotes()
    s = read_query_log(bad, UsageCollector(), notes, since=1.7e9)
    assert (s.read, s.bad, s.outside_period) == (1, 2, 1)
    assert notes.caveats == [f"query log {bad}: 2 of 4 lines not used; first: line 2: not a query log entry: "
                             "b'not json\\n'"]


def test_query_log_budget_stops_and_says_so(tmp_path: Path) -> None:
    log = tmp_path / "q.log"
    log.write_text(_line("up") * 10)
    notes = ReadNotes()
    s = read_query_log(log, UsageCollector(), notes, max_lines=4)
    assert s.lines == 4 and "stopped after 4 lines" in notes.missing[0]


def test_unreadable_dashboard_is_one_note(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    notes = ReadNotes()
    assert read_dashboard_files([str(tmp_path)], UsageCollector(), notes) == 0
    assert len(notes.missing) == 1 and notes.missing[0].startswith(f"dashboard {tmp_path / 'bad.json'}: cannot read")


@pytest.mark.parametrize(("args", "message"), [
    (["--period", "soon"], "promshift: --period 'soon': not a duration such as 7d or 1h"),
    (["--max-group-metrics", "0"], "promshift: --max-group-metrics 0: must be at least 1"),
    (["--previous", "/nonexistent/plan.json"], "promshift: --previous /nonexistent/plan.json: cannot read a plan"),
])
def test_cli_bad_input_is_one_line_and_exit_64(args: list[str], message: str, capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    code = main(["plan", "--source", "http://127.0.0.1:9", "--out", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert code == 64 and err.startswith(message) and err.count("\n") == 1
    assert not any(tmp_path.iterdir())


def test_cli_unreachable_source_is_exit_69(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["plan", "--source", "http://127.0.0.1:9", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 69 and err.startswith("promshift: source http://127.0.0.1:9:") and err.count("\n") == 1
    assert "Traceback" not in err and not (tmp_path / "out").exists()


# Lines as Debian's Prometheus 2.42 wrote them (the local stack's query log), byte for byte.
REAL_LINES = [
    '{"httpRequest":{"clientIP":"127.0.0.1","method":"POST","path":"/api/v1/query_range"},"params":{"end":'
    '"2026-12-05T02:57:28.978Z","query":"DCGM_FI_DEV_GPU_TEMP{instance=~\\".*\\", gpu=~\\".*\\"}","start":'
    '"2026-12-05T01:57:28.978Z","step":30},"spanID":"0000000000000000","stats":{"timings":{"evalTotalTime":'
    '0.00079171,"resultSortTime":0.000013424,"queryPreparationTime":0.000193549,"innerEvalTime":0.000571813,'
    '"execQueueTime":0.000012672,"execTotalTime":0.000812461},"samples":{"totalQueryableSamples":160,'
    '"peakSamples":160}},"ts":"2026-12-05T02:57:28.985Z"}\n',
    '{"params":{"end":"2026-12-05T02:57:22.773Z","query":"DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + '
    'DCGM_FI_DEV_FB_FREE)","start":"2026-12-05T02:57:22.773Z","step":0},"ruleGroup":{"file":'
    '"/srv/rules/gpu-memory.yml","name":"gpu-memory"},"spanID":"0000000000000000","stats":{"timings":'
    '{"evalTotalTime":0.000221416,"resultSortTime":0,"queryPreparationTime":0.000067459,"innerEvalTime":'
    '0.000147655,"execQueueTime":0.000015771,"execTotalTime":0.000259856},"samples":{"totalQueryableSamples":0,'
    '"peakSamples":0}},"ts":"2026-12-05T02:57:22.774Z"}\n',
]


def test_real_query_log_lines_read_the_same_on_the_fast_and_the_slow_path(tmp_path: Path) -> None:
    fast, slow = tmp_path / "fast.log", tmp_path / "slow.log"
    fast.write_text("".join(REAL_LINES))
    # The same entries re-encoded with spaces and another key order: only json.loads reads them.
    slow.write_text("".join(json.dumps(dict(reversed(list(json.loads(line).items())))) + "\n" for line in REAL_LINES))
    got = []
    for path in (fast, slow):
        u = UsageCollector()
        s = read_query_log(path, u, ReadNotes())
        assert (s.read, s.bad) == (2, 0)
        got.append({(e, r): (x.count, x.points, x.last_seen) for (e, r), x in u.reads.items()})
    assert got[0] == got[1]
    rule = Reader("rule", "/srv/rules/gpu-memory.yml / gpu-memory")
    key = ("DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)", rule)
    assert got[0][key][:2] == (1, 1.0)
    assert got[0][key][2] == pytest.approx(datetime(2026, 12, 5, 2, 57, 22, 774000, tzinfo=UTC).timestamp())
    (expr, _), (count, points, _) = next((k, v) for k, v in got[0].items() if k[1].kind == "query_log")
    assert expr == 'DCGM_FI_DEV_GPU_TEMP{instance=~".*", gpu=~".*"}' and (count, points) == (1, 121.0)


def test_query_log_first_and_last_seen(tmp_path: Path) -> None:
    log = tmp_path / "q.log"
    log.write_text(REAL_LINES[0] + REAL_LINES[1] + REAL_LINES[0])
    s = read_query_log(log, UsageCollector(), ReadNotes())
    assert s.first_ts == pytest.approx(datetime(2026, 12, 5, 2, 57, 22, 774000, tzinfo=UTC).timestamp())
    assert s.last_ts == pytest.approx(datetime(2026, 12, 5, 2, 57, 28, 985000, tzinfo=UTC).timestamp())
    assert (s.lines, s.read) == (3, 3)


def test_a_job_without_its_own_interval_scrapes_at_the_global_one() -> None:
    config = ("global: {scrape_interval: 15s}\nscrape_configs:\n  - job_name: a\n"
              "  - job_name: b\n    scrape_interval: 1m\n")
    assert scrape_intervals(config) == ({"a": 15.0, "b": 60.0}, 15.0)
