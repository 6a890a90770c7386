"""The run report is built from audit events alone; markdown and tables show what happened."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from promshift.core.audit import new_event, verify_chain
from promshift.core.cost import AmpPrices, CostEvidence, QueryCost, project_monthly_cost
from promshift.core.gate import GateVerdict
from promshift.core.latency import LatencyResult, WindowLatency
from promshift.core.parity import GoldenInventory, ParityResult
from promshift.core.report import approval_body, build_report, cost_table, latency_table, render_markdown

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)
WINDOWS = [{"window": "1h", "source_p50_s": 2.0, "source_p95_s": 3.0, "target_p50_s": 0.5, "target_p95_s": 0.8,
            "speedup": 4.0, "verdict": "SUCCESSFUL", "outcome": "within SLO", "slo_p95_s": 2.0,
            "source_failures": 0},
           {"window": "24h", "source_p50_s": None, "source_p95_s": None, "target_p50_s": 9.5, "target_p95_s": 10.2,
            "speedup": None, "verdict": "SUCCESSFUL",
            "outcome": "source timed out in 5 of 5 runs; target answered within SLO",
            "slo_p95_s": 12.0, "source_failures": 5, "source_failure": "timed out"}]


def cost() -> dict:
    prices = AmpPrices(ingest_per_10m_samples=0.9, storage_per_gb_month=0.03, query_per_billion_samples=0.1,
                       bytes_per_sample=1.5)
    p = project_monthly_cost(active_series=1000, scrape_interval_s=30, retention_days=150,
                             queries=[QueryCost("avg(m)", 86400, 2.88e6, False)], dashboard_refresh_s=60,
                             dashboard_viewers=2, prices=prices)
    return {**p.to_dict(), "active_series": 1000, "scrape_interval_s": 30.0, "window": "24h",
            "dashboard_refresh_s": 60.0, "dashboard_viewers": 2}


def events(rejected: bool = False) -> list:
    parity = {"verdict": "SUCCESSFUL", "series_compared": 32, "points_compared": 3840, "mismatches": 0,
              "measurements": [{"name": "coverage", "verdict": "SUCCESSFUL", "reason": "ok", "numbers": {}}]}
    latency = {"verdict": "SUCCESSFUL", "windows": WINDOWS, "cost": cost(),
               "measurement": {"reason": "all 2 windows within SLO"}, "retries": 2, "max_concurrency": 1,
               "accept_encoding": "identity", "retention_s": {"source": 2 * 86400.0, "target": None}}
    steps = [("dual_write_deployed", "planned", "dual_writing", {"dual_write_since": 1.0}),
             ("warmup_started", "dual_writing", "warming", {}),
             ("gate_passed", "warming", "verified", {"gate": {"verdict": "SUCCESSFUL"}, "parity": parity,
                                                    "latency": latency})]
    if rejected:
        steps.append(("approval_reject", None, None, {"decision": "Reject", "by": "oncall-bob", "comment": "no"}))
        steps.append(("rolled_back", "verified", "rolled_back",
                      {"performed": True, "restored_identical": True, "reason": "approval Reject by oncall-bob"}))
    else:
        steps.append(("approved", "verified", "approved", {"decision": "Approve", "by": "oncall-alice"}))
        steps.append(("cut_over", "approved", "cut_over", {"routing": {}}))
    out = []
    for i, (kind, frm, to, ev) in enumerate(steps):
        out.append(new_event(prev=out[-1] if out else None, group="g", run_id="r", kind=kind, stage_from=frm,
                             stage_to=to, actor="promshift", at=T0 + timedelta(minutes=i), evidence=ev,
                             key=None))
    return out


def test_cut_over_report_has_every_required_field() -> None:
    evs = events()
    report = build_report(group="g", run_id="r", events=evs, final_stage="cut_over", chain=verify_chain(evs))
    assert report["final_stage"] == "cut_over"
    assert [s["stage"] for s in report["stages"]] == ["dual_writing", "warming", "verified", "approved", "cut_over"]
    assert report["parity"]["points_compared"] == 3840
    assert report["latency"]["windows"][0]["speedup"] == 4.0
    assert report["approval"] == {"decision": "Approve", "by": "oncall-alice", "comment": None}
    assert report["rollback"]["performed"] is False
    assert report["audit"] == {"events": 5, "chain_events": 5, "chain_ok": True, "problems": []}
    md = render_markdown(report, chart_file="latency.png")
    assert "![latency per window](latency.png)" in md and "Projected monthly AMP cost" in md
    assert ("Probe: at most 1 in flight per backend, Accept-Encoding identity, 2 throttled retries; "
            "retention source 2d, target unknown.") in md


def test_rejected_run_says_why_in_plain_words() -> None:
    evs = events(rejected=True)
    report = build_report(group="g", run_id="r", events=evs, final_stage="rolled_back", chain=verify_chain(evs))
    assert report["summary"] == "Rolled back: approval Reject by oncall-bob."
    assert report["approval"]["decision"] == "Reject"
    assert report["rollback"]["restored_identical"] is True


def test_tables_show_source_timeouts_as_a_win_and_cost_lines() -> None:
    table = latency_table([WindowLatency.from_dict(w) for w in WINDOWS])
    assert "4.00x" in table and "source timed out" in table
    # A row from before source_failure existed still reads sensibly.
    assert "source failed" in latency_table([WindowLatency.from_dict({**WINDOWS[1], "source_failure": None})])
    c = cost()
    from promshift.core.cost import MONTH_S

    samples = 1000 * MONTH_S / 30
    assert c["ingestion"]["samples_per_month"] == samples
    assert abs(c["ingestion"]["usd"] - samples / 1e7 * 0.9) < 1e-9
    text = cost_table(CostEvidence.from_dict(c))
    assert f"{samples:,.0f} samples" in text and "total" in text and "(estimated)" in text
    assert "avg(m)" in text


def test_inconclusive_evidence_is_called_out_for_the_approver() -> None:
    body = approval_body("g", GateVerdict.from_dict({"verdict": "INCONCLUSIVE", "reason": "parity inconclusive"}),
                         ParityResult.from_dict({}), LatencyResult.from_dict({"windows": []}))
    assert "INCONCLUSIVE" in body and "Approve only if you understand why" in body


def test_the_approval_body_carries_the_evidence_the_approver_decides_on() -> None:
    """Gate verdict and reason, parity layers, latency per window, cost, the board link and the evidence hash."""
    latency = LatencyResult.from_dict({"verdict": "SUCCESSFUL", "windows": WINDOWS, "cost": cost()})
    digest = "ab" * 32
    body = approval_body("gpu-memory", GateVerdict.from_dict({"verdict": "SUCCESSFUL", "reason": "all checks passed"}),
                         ParityResult.from_dict({}), latency, evidence_sha256=digest,
                         board_url="http://127.0.0.1:8080/promshift/groups/gpu-memory")
    assert "Gate: **SUCCESSFUL** — all checks passed" in body
    assert latency_table(latency.windows) in body
    assert cost_table(latency.cost) in body and "### Cost" in body
    assert "(http://127.0.0.1:8080/promshift/groups/gpu-memory)" in body
    assert f"Evidence sha256 `{digest}`" in body
    bare = approval_body("g", GateVerdict.from_dict({"verdict": "SUCCESSFUL", "reason": "ok"}),
                         ParityResult.from_dict({}), LatencyResult.from_dict({"windows": []}))
    assert "sha256" not in bare and "### Cost" not in bare and "migration board" not in bare


def test_golden_inventory_lists_every_expression_with_its_disposition() -> None:
    from promshift.core.report import golden_inventory_markdown

    golden = {"dashboards": ["dashboards/a.json"], "required": False,
              "summary": "1 compared, 1 not this group's metrics",
              "queries": [{"dashboard": "a.json", "panel": "Power", "ref_id": "A", "expr": "sum(m{a=~\"x|y\"})",
                           "disposition": "compared", "detail": "SUCCESSFUL", "measurement": "golden[Power]"},
                          {"dashboard": "a.json", "panel": "Temp", "ref_id": "A", "expr": "t",
                           "disposition": "not this group's metrics", "detail": "reads t", "measurement": None}]}
    text = "\n".join(golden_inventory_markdown(GoldenInventory.from_dict(golden)))
    assert "### Golden queries: 1 compared, 1 not this group's metrics" in text
    assert '| a.json | Power | `sum(m{a=~"x\\|y"})` | compared | SUCCESSFUL |' in text
    assert "| a.json | Temp | `t` | not this group's metrics | reads t |" in text
    assert golden_inventory_markdown(None) == []


def test_amp_target_block_merges_the_recorded_target_with_the_front_doors_counts() -> None:
    validated = new_event(prev=None, group="g", run_id="r", kind="validated", stage_from=None, stage_to=None,
                          actor="promshift", at=T0, key=None, evidence={"target_backend": {
                              "kind": "amp", "workspace_id": "ws-1", "region": "us-east-1"}})
    evs = [validated]
    for ev in events():
        evs.append(new_event(prev=evs[-1], group="g", run_id="r", kind=ev.kind, stage_from=ev.stage_from,
                             stage_to=ev.stage_to, actor=ev.actor, at=ev.at, evidence=ev.evidence_data, key=None))
    counts = {"sigv4_verified": 166, "sigv4_rejected": 0, "sigv4_rejected_by_reason": {},
              "control_plane": {"verified": 21, "rejected": 0, "rejected_by_reason": {}}}
    source_config = {"sha256_before": "a" * 64, "sha256_after": "b" * 64, "identical": False}
    report = build_report(group="g", run_id="r", events=evs, final_stage="cut_over", chain=verify_chain(evs),
                          target=counts, source_config=source_config)
    assert report["target"] == {"kind": "amp", "workspace_id": "ws-1", "region": "us-east-1", **counts}
    assert report["validation"] == {"ok": True, "reason": None}
    md = render_markdown(report)
    assert ("AMP workspace ws-1 in us-east-1: front door verified 166 signed requests, rejected 0; "
            "control plane verified 21, rejected 0") in md
    assert f"sha256 before {'a' * 64}, after {'b' * 64} (changed)" in md


def test_a_failed_validation_is_the_summary_and_the_target_is_what_the_caller_knows() -> None:
    reason = "DescribeWorkspace on AMP workspace ws-1 in us-east-1: AWS refused the credentials' signature (X)"
    failed = new_event(prev=None, group="g", run_id="r", kind="validation_failed", stage_from=None, stage_to=None,
                       actor="promshift", at=T0, evidence={"reason": reason, "retryable": False}, key=None)
    done = new_event(prev=failed, group="g", run_id="r", kind="rollback_not_needed", stage_from=None, stage_to=None,
                     actor="promshift", at=T0, evidence={"performed": False, "restored_identical": None,
                                                          "reason": f"validation failed: {reason}"}, key=None)
    evs = [failed, done]
    target = {"kind": "amp", "workspace_id": "ws-1", "region": "us-east-1", "sigv4_verified": 0,
              "sigv4_rejected": 0, "control_plane": {"verified": 3, "rejected": 1,
                                                     "rejected_by_reason": {"signature_mismatch": 1}}}
    report = build_report(group="g", run_id="r", events=evs, final_stage="planned", chain=verify_chain(evs),
                          target=target, source_config={"sha256_before": "c" * 64, "sha256_after": "c" * 64})
    assert report["summary"] == f"Stopped at validate, nothing deployed: {reason}."
    assert report["validation"] == {"ok": False, "reason": reason}
    assert report["target"] == target and report["stages"] == []
    md = render_markdown(report)
    assert "## Validation: FAILED" in md and reason in md
    assert "control plane verified 3, rejected 1 (signature_mismatch 1)" in md
    assert "(identical)" in md


def _chain(steps: list) -> list:
    out = []
    for i, (kind, frm, to, ev) in enumerate(steps):
        out.append(new_event(prev=out[-1] if out else None, group="g", run_id="r", kind=kind, stage_from=frm,
                             stage_to=to, actor="promshift", at=T0 + timedelta(minutes=i), evidence=ev, key=None))
    return out


def test_rules_read_path_bake_and_decommission_are_reported_even_when_nothing_was_configured() -> None:
    evs = events()
    report = build_report(group="g", run_id="r", events=evs, final_stage="cut_over", chain=verify_chain(evs))
    assert report["rules"]["configured"] is False and report["rules"]["moved"] == 0
    assert report["rules"]["reason"] == "not configured" and report["rules"]["rules"] == 0
    assert report["read_path"] == {"configured": False, "switched": False, "dashboards": 0, "panels": 0,
                                   "restored": False, "reason": "not configured"}
    assert report["bake"]["checks"] == 0 and report["bake"]["baked"] is False
    assert report["decommission"] == {"performed": False, "source_series_after": None, "freed_series": 0,
                                      "freed_samples_per_s": 0, "reason": None}


def test_moved_rules_switched_dashboards_bake_checks_and_the_decommission_are_counted() -> None:
    evs = _chain([
        ("rules_snapshot", None, None, {"ref": "x", "rules": 3, "records": 1, "alerts": 2}),
        ("read_path_snapshot", None, None, {"kind": "grafana-files", "snapshot": {"files": [{"path": "a"}]}}),
        ("rules_records_added", None, None, {"records": 1}),
        ("rules_moved", None, None, {"moved": True, "rules": 3, "gap_s": 0.2}),
        ("read_path_switched", None, None, {"switched": True, "dashboards": 1, "panels": 4}),
        ("bake_check", None, None, {"verdict": "SUCCESSFUL"}),
        ("bake_check", None, None, {"verdict": "SUCCESSFUL"}),
        ("baked", None, None, {"clean_since": 5.0}),
        ("decommissioned", None, None, {"freed": {"series": 16, "samples_per_s": 8.0}, "source_series_after": 0}),
    ])
    report = build_report(group="g", run_id="r", events=evs, final_stage="decommissioned", chain=verify_chain(evs))
    assert report["rules"]["configured"] and report["rules"]["moved"] == 3 and report["rules"]["records_added"]
    assert (report["rules"]["rules"], report["rules"]["records"], report["rules"]["alerts"]) == (3, 1, 2)
    assert report["rules"]["reason"] is None and report["rules"]["restored"] is False
    assert report["read_path"]["switched"] and (report["read_path"]["dashboards"], report["read_path"]["panels"]) \
        == (1, 4)
    assert report["bake"] == {"checks": 2, "failed_checks": 0, "baked": True, "clean_since": 5.0,
                              "reads_rolled_back": False, "reason": None}
    assert report["decommission"] == {"performed": True, "source_series_after": 0, "freed_series": 16,
                                      "freed_samples_per_s": 8.0, "reason": None}


def test_a_failed_bake_reports_the_restored_rules_and_dashboards() -> None:
    evs = _chain([
        ("rules_snapshot", None, None, {"ref": "x", "rules": 1, "records": 0, "alerts": 1}),
        ("rules_moved", None, None, {"moved": True}),
        ("bake_check", None, None, {"verdict": "FAILED"}),
        ("read_path_restored", None, None, {"changed": True}),
        ("rules_restored", None, None, {"changed": True, "restored_identical": True}),
        ("reads_rolled_back", None, None, {"reason": "bake check FAILED: stale"}),
    ])
    report = build_report(group="g", run_id="r", events=evs, final_stage="rolled_back_reads", chain=verify_chain(evs))
    assert report["bake"]["failed_checks"] == 1 and report["bake"]["reads_rolled_back"]
    assert report["bake"]["reason"] == "bake check FAILED: stale"
    assert report["rules"]["restored"] and report["rules"]["restored_identical"] is True
    assert report["read_path"]["restored"] is True and report["read_path"]["configured"] is False


def test_the_markdown_says_what_moved_and_what_was_not_configured() -> None:
    evs = _chain([("rules_snapshot", None, None, {"ref": "x", "rules": 2, "records": 1, "alerts": 1}),
                  ("rules_moved", None, None, {"moved": True}),
                  ("bake_check", None, None, {"verdict": "FAILED"}),
                  ("reads_rolled_back", None, None, {"reason": "stale target"})])
    md = render_markdown(build_report(group="g", run_id="r", events=evs, final_stage="rolled_back_reads",
                                      chain=verify_chain(evs)))
    assert "## Rules\n\n2 rule(s) (1 recording, 1 alerting): 2 moved, restored False" in md
    assert "## Read path (dashboards)\n\nnot configured" in md
    assert "## Bake\n\n1 check(s), 1 failed; baked False; reads rolled back True (stale target)" in md
    assert "## Decommission" not in md
