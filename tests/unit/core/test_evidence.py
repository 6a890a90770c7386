"""Typed evidence: one to_dict/from_dict per result, NaN and ±Inf kept as text, old records still read."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from promshift.core.cost import AmpPrices, CostEvidence, CostProjection, QueryCost, project_monthly_cost
from promshift.core.errors import ErrorKind
from promshift.core.evidence import json_number, json_safe, number_from_json
from promshift.core.gate import GateAction, GateEvidence, GateVerdict, decide
from promshift.core.latency import LatencyResult, ProbeRun, WindowLatency, latency_measurement
from promshift.core.parity import (
    GoldenInventory,
    GoldenRow,
    ParityPlan,
    ParityResult,
    ParityWindow,
    SampleComparison,
    aggregate_measurement,
)
from promshift.core.verdicts import Layer, Measurement, Verdict
from promshift.orchestration.compose import compose_migration

NAN, INF = float("nan"), float("inf")
A = (("__name__", "m"), ("Hostname", "h1"))
B = (("__name__", "m"), ("Hostname", "h2"))
C = (("__name__", "m"), ("Hostname", "h3"))


def strict(d: Any) -> Any:
    """The JSON the audit store writes (``allow_nan=False``), read back."""
    return json.loads(json.dumps(d, allow_nan=False))


def test_non_finite_numbers_are_written_as_prometheus_writes_them_and_read_back() -> None:
    assert [json_number(v) for v in (NAN, INF, -INF, 1.5)] == ["NaN", "+Inf", "-Inf", 1.5]
    assert math.isnan(number_from_json("NaN")) and number_from_json("+Inf") == INF
    assert number_from_json("-Inf") == -INF and number_from_json(2) == 2.0
    for bad in ("inf", "1.5", None, True):
        with pytest.raises(ValueError, match="not a number in evidence"):
            number_from_json(bad)
    assert json_safe({"a": [NAN, (INF, {"b": -INF})], "c": "x"}) == {"a": ["NaN", ["+Inf", {"b": "-Inf"}]], "c": "x"}


def test_measurement_round_trip_names_its_layer_and_keeps_non_finite_numbers() -> None:
    m = Measurement("golden[GPU util/A]", Verdict.FAILED, "differ", ("q",), {"delta": INF, "rows": [{"v": NAN}]})
    d = m.to_dict()
    assert d["layer"] == "golden" and d["numbers"] == {"delta": "+Inf", "rows": [{"v": "NaN"}]}
    assert strict(d) == d and Measurement.from_dict(d).to_dict() == d
    assert Measurement.from_dict(d).layer == Layer.GOLDEN
    # A record from before the layer was written reads the same.
    old = {k: v for k, v in d.items() if k != "layer"}
    assert Measurement.from_dict(old).to_dict() == d
    with pytest.raises(ValueError, match="belongs to no known layer"):
        Measurement("typo", Verdict.SUCCESSFUL, "")


def nan_and_inf_measurements() -> list[Measurement]:
    """The samples and aggregates layers fed NaN and ±Inf on one side."""
    samples = SampleComparison(abs_tol=0.0, rel_tol=0.0)
    samples.add({A: [(1.0, NAN), (2.0, 1.0)], B: [(1.0, INF)], C: [(1.0, -INF)]},
                {A: [(1.0, 1.0), (2.0, 1.0)], B: [(1.0, 2.0)], C: [(1.0, -INF)]})
    rows = [("sum m", {"h1": INF, "h2": NAN, "h3": 1.0}, {"h1": 5.0, "h2": 3.0, "h3": 1.0})]
    aggregates = aggregate_measurement(rows, abs_tol=0.0, rel_tol=0.0, queries=["sum_over_time"])
    return [samples.measurement(["range"]), aggregates]


def parity_result() -> ParityResult:
    golden = GoldenInventory(("d.json",), True, (GoldenRow("d.json", "p", "sum(m)", "compared", "FAILED", "A",
                                                           "golden[p]"),), "1 compared")
    return ParityResult(Verdict.FAILED, tuple(nan_and_inf_measurements()), ParityWindow(10.0, 70.0, 15.0), ("h1",),
                        series_compared=3, points_compared=4, mismatches=2, shards=1, wall_s=0.5, backend_query_s=0.1,
                        queries_sent=7, golden=golden)


def test_parity_result_round_trip_with_nan_and_inf_in_its_worst_values() -> None:
    result = parity_result()
    d = result.to_dict()
    assert strict(d) == d
    assert ParityResult.from_dict(d).to_dict() == d
    samples, aggregates = d["measurements"]
    assert samples["verdict"] == "FAILED" and {o["max_abs_delta"] for o in samples["numbers"]["worst"]} == {"+Inf", 0.0}
    assert [(w["source"], w["target"]) for w in aggregates["numbers"]["worst"]] == [("+Inf", 5.0), ("NaN", 3.0)]
    assert aggregates["numbers"]["worst"][0]["relative_delta"] == "NaN"  # Inf / Inf
    back = ParityResult.from_dict(d)
    assert back.measurement(Layer.AGGREGATES) is not None and back.golden == result.golden
    assert [m.name for m in back.not_passed()] == ["samples", "aggregates"]
    # An empty record (no parity ran) is INCONCLUSIVE, never a pass.
    assert ParityResult.from_dict({}).verdict == Verdict.INCONCLUSIVE


def test_parity_plan_round_trip() -> None:
    plan = ParityPlan(ParityWindow(0.0, 60.0, 15.0), (Measurement("coverage", Verdict.SUCCESSFUL, "ok"),),
                      ({"hosts": ["h1"], "start": 0.0, "end": 60.0},), 1, {"wall_s": 0.2, "queries": 4.0},
                      GoldenInventory(summary="no golden layer"))
    d = plan.to_dict()
    assert strict(d) == d and ParityPlan.from_dict(d).to_dict() == d and ParityPlan.from_dict(d) == plan


def latency_result(cost: CostEvidence | None = None) -> LatencyResult:
    runs = (ProbeRun("source", "1h", "q", wall_s=INF, ok=False, error="timeout: no whole answer",
                     kind=ErrorKind.TIMEOUT),
            ProbeRun("target", "1h", "q", wall_s=0.2, ok=True, server_s=0.1, series=3, points=9, samples=NAN,
                     warnings=("w",), result_type="matrix"))
    window = WindowLatency("1h", None, None, 0.2, 0.2, 1, 0, 1.0, Verdict.SUCCESSFUL, "within SLO", "timed out",
                           {"q": (16.0, 16.0), "s": (None, 3.0), "r": "counting failed"})
    return LatencyResult(Verdict.SUCCESSFUL, latency_measurement([window], ["q"]), (window,), runs, 2,
                         {"source": 7200.0, "target": None}, 4, "gzip", cost)


def cost_evidence() -> CostEvidence:
    prices = AmpPrices(ingest_per_10m_samples=0.9, storage_per_gb_month=0.03, query_per_billion_samples=0.1,
                       bytes_per_sample=1.5)
    projection = project_monthly_cost(active_series=10, scrape_interval_s=30, retention_days=1,
                                      queries=[QueryCost("q", 3600, 100.0, True)], dashboard_refresh_s=60,
                                      dashboard_viewers=1, prices=prices)
    return CostEvidence(projection, 10, 30.0, "1h", 60.0, 1)


def test_latency_result_round_trip_with_runs_cost_and_non_finite_numbers() -> None:
    result = latency_result(cost_evidence())
    d = result.to_dict()
    assert strict(d) == d
    assert d["runs"][0]["wall_s"] == "+Inf" and d["runs"][1]["samples"] == "NaN" and d["runs"][0]["kind"] == "timeout"
    assert d["windows"][0]["behind"] == [{"query": "q", "source": 16.0, "target": 16.0},
                                         {"query": "s", "source": None, "target": 3.0},
                                         {"query": "r", "error": "counting failed"}]
    back = LatencyResult.from_dict(d)
    assert back.to_dict() == d
    assert back.runs[0].kind == ErrorKind.TIMEOUT and back.runs[0].wall_s == INF and math.isnan(back.runs[1].samples)
    assert back.windows == result.windows and back.cost == result.cost
    assert back.windows[0].source_failed_label == "source timed out"


def test_cost_evidence_round_trip_and_an_unavailable_projection() -> None:
    cost = cost_evidence()
    d = cost.to_dict()
    assert d["total_usd"] == cost.projection.total_usd and d["query"]["estimated_queries"] == 0  # type: ignore[union-attr]
    assert CostEvidence.from_dict(d) == cost and CostEvidence.from_dict(d).to_dict() == d
    assert CostProjection.from_dict(d) == cost.projection
    missing = CostEvidence.unavailable("no prices configured")
    assert missing.to_dict() == {"error": "no prices configured"}
    assert CostEvidence.from_dict(missing.to_dict()) == missing


def test_gate_round_trip_and_the_audit_form_leaves_the_runs_out() -> None:
    verdict = decide({"parity": Verdict.FAILED, "latency": Verdict.SUCCESSFUL})
    assert GateVerdict.from_dict(verdict.to_dict()) == verdict
    # An old record without its action gets the one its verdict implies.
    assert GateVerdict.from_dict({"verdict": "ERROR"}).action == GateAction.ROLL_BACK
    evidence = GateEvidence.decide(parity_result(), latency_result(cost_evidence()))
    assert evidence.gate == verdict
    d = evidence.to_dict()
    assert "runs" not in d["latency"] and strict(d) == d
    back = GateEvidence.from_dict(d)
    assert back.to_dict() == d and back.latency.runs == ()
    assert [(check, m.name) for check, m in back.not_passed()] == [("parity", "samples"), ("parity", "aggregates")]


def test_a_nan_and_inf_parity_result_goes_through_gate_audit_and_report(tmp_path: Path) -> None:
    from promshift.adapters.audit_store import AuditStore
    from promshift.adapters.prometheus import PrometheusClient
    from promshift.adapters.routing import RoutingStore
    from promshift.adapters.settings import load_catalog
    from promshift.core.audit import verify_chain
    from promshift.core.report import build_report, render_markdown
    from promshift.steps.migration import Backends

    audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    unused = PrometheusClient("http://127.0.0.1:9")  # the gate asks no backend
    migration = compose_migration(load_catalog().get("gpu-memory"),
                                  Backends(unused, unused, str(tmp_path / "p.yml"), ""),
                                  audit=audit, routing=RoutingStore(audit.url), snapshots_dir=tmp_path, run_id="r1")
    at = datetime(2026, 12, 3, 8, tzinfo=UTC)
    # As the gate task gets them: the XCom (to_dict) form.
    verdict = migration.gate(parity_result().to_dict(), latency_result(cost_evidence()).to_dict(), at)
    assert verdict.verdict == Verdict.FAILED
    [event] = audit.events(group="gpu-memory", run_id="r1")
    assert event.kind == "gate_failed" and '"+Inf"' in event.evidence and "NaN" in event.evidence
    assert migration.failure_reason().startswith("parity FAILED (samples: ")
    report = build_report(group="gpu-memory", run_id="r1", events=[event], final_stage="planned",
                          chain=verify_chain([event]))
    worst = report["parity"]["measurements"][1]["numbers"]["worst"]
    assert [(w["source"], w["target"]) for w in worst] == [("+Inf", 5.0), ("NaN", 3.0)]
    assert strict(report) == report
    md = render_markdown(report)
    assert "## Parity: FAILED" in md and "aggregate differs" in md and "within SLO" in md


def test_an_audit_record_from_before_typed_evidence_still_reports() -> None:
    from promshift.core.audit import new_event, verify_chain
    from promshift.core.report import build_report, render_markdown

    # What the gate wrote before: measurements without a layer, latency without runs, fewer window fields.
    old = {"gate": {"verdict": "INCONCLUSIVE", "action": "ask_approval", "checks": {"parity": "INCONCLUSIVE"},
                    "reason": "INCONCLUSIVE (parity); a human must decide"},
           "parity": {"verdict": "INCONCLUSIVE", "window": None, "series_compared": 0, "points_compared": 0,
                      "mismatches": 0, "measurements": [{"name": "window", "verdict": "INCONCLUSIVE",
                                                         "reason": "dual-write too short", "queries": [],
                                                         "numbers": {}}]},
           "latency": {"verdict": "SUCCESSFUL", "measurement": {"name": "latency", "verdict": "SUCCESSFUL",
                                                                "reason": "all 1 windows within SLO"},
                       "windows": [{"window": "1h", "source_p50_s": 1.0, "source_p95_s": 1.0, "target_p50_s": 0.5,
                                    "target_p95_s": 0.5, "speedup": 2.0, "verdict": "SUCCESSFUL",
                                    "outcome": "within SLO", "slo_p95_s": 2.0, "source_failures": 0}],
                       "retries": 0, "cost": {"error": "no prices"}}}
    event = new_event(prev=None, group="g", run_id="r", kind="gate_inconclusive", stage_from=None, stage_to=None,
                      actor="promshift", at=datetime(2026, 12, 1, tzinfo=UTC), evidence=old, key=None)
    report = build_report(group="g", run_id="r", events=[event], final_stage="warming", chain=verify_chain([event]))
    assert report["gate"]["verdict"] == "INCONCLUSIVE" and report["latency"]["reason"] == "all 1 windows within SLO"
    assert report["latency"]["windows"][0]["speedup"] == 2.0 and report["latency"]["cost"] == {"error": "no prices"}
    md = render_markdown(report)
    assert "| window | INCONCLUSIVE | dual-write too short |" in md and "cost projection unavailable: no prices" in md
