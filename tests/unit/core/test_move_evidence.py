"""Typed deploy, rules, read path, bake and decommission evidence: one ``to_dict``/``from_dict`` each, round trips,
and the records and reports already stored read as before."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from promshift.core.events import EventKind
from promshift.core.move_evidence import (
    BakeEvidence,
    DecommissionEvidence,
    DeployEvidence,
    MovedEvidence,
    ReadPathEvidence,
    RulesEvidence,
)

# A file path deploy as steps/migration.py records it today (SigV4 block, label drops, a resumed attempt).
FILE_DEPLOY = {"remote_write": "promshift-gpu-memory", "keep_regex": "DCGM_FI_DEV_FB_(USED|FREE)",
               "url": "http://127.0.0.1:9095/workspaces/ws-1/api/v1/remote_write",
               "config_before_sha256": "a" * 64, "config_after_sha256": "b" * 64,
               "live_remote_writes": ["other", "promshift-gpu-memory"], "dual_write_since": 1733450000.5,
               "sigv4": {"region": "us-east-1"}, "drop_labels": ["pod"],
               "resumed": "the config already held this entry from an earlier attempt; verified live"}
# One stored by a run from before SigV4 blocks, label drops and dual_write_since were recorded.
OLD_FILE_DEPLOY = {"remote_write": "promshift-gpu-clocks", "keep_regex": "DCGM_FI_DEV_SM_CLOCK",
                   "url": "http://127.0.0.1:9091/workspaces/ws-local/api/v1/write",
                   "config_before_sha256": "c" * 64, "config_after_sha256": "d" * 64,
                   "live_remote_writes": ["promshift-gpu-clocks"]}
HISTORY = [{"status": "CREATING", "at": "2026-12-06T03:00:00+00:00"},
           {"status": "ACTIVE", "at": "2026-12-06T03:01:00+00:00"}]
QUOTA = {"group_series": 48, "workspace_series": 100, "limit": 1000.0, "share": 0.148}


@pytest.mark.parametrize("record", [FILE_DEPLOY, OLD_FILE_DEPLOY], ids=["today", "old"])
def test_a_file_path_deploy_round_trips_and_reads_typed(record: dict[str, Any]) -> None:
    found = DeployEvidence.from_dict(record)
    assert found.to_dict() == record
    assert DeployEvidence.from_dict(found.to_dict()) == found
    assert found.keep_regex == record["keep_regex"] and found.url == record["url"]
    assert found.live_remote_writes == tuple(record["live_remote_writes"])
    assert found.sigv4 == record.get("sigv4") and found.drop_labels == (("pod",) if "drop_labels" in record else None)
    assert found.kind is None and found.status_history is None  # not a deploy path's record
    assert found.extra == ({"resumed": record["resumed"]} if "resumed" in record else {})


def test_a_deploy_paths_record_is_merged_over_its_event_and_keeps_a_null_reason() -> None:
    data = {"deploy": {"kind": "scraper", "state": "done", "status_history": HISTORY, "reason": None,
                       "quota": QUOTA},
            "dual_write_since": 1733454060.0, "scraper_id": "s-1"}
    found = DeployEvidence.from_event(EventKind.DUAL_WRITE_DEPLOYED, data)
    assert found is not None
    merged = {"dual_write_since": 1733454060.0, "scraper_id": "s-1", **data["deploy"]}
    assert found.to_dict() == merged
    assert "reason" in found.to_dict() and found.reason is None
    assert found.kind == "scraper" and found.state == "done" and found.quota == QUOTA
    assert [c["status"] for c in found.status_history or ()] == ["CREATING", "ACTIVE"]
    assert found.keep_regex is None  # nothing to re-render as a remote_write entry
    assert DeployEvidence.from_dict(found.to_dict()) == found


def test_a_refusal_or_failure_reads_its_reason_and_other_events_hold_no_deploy() -> None:
    refused = DeployEvidence.from_event(EventKind.QUOTA_REFUSED, {
        "reason": "would reach 90.0% of the workspace quota",
        "deploy": {"kind": "scraper", "status_history": [], "quota": QUOTA}})
    assert refused is not None and refused.reason == "would reach 90.0% of the workspace quota"
    assert refused.status_history == () and refused.state is None
    failed = DeployEvidence.from_event(EventKind.DEPLOY_FAILED, {
        "reason": "outer", "deploy": {"kind": "git", "status_history": [], "reason": "inner"}})
    assert failed is not None and failed.reason == "inner"  # the deploy's own reason wins, as before
    # A file path's failure records no deploy block: it is not the deploy's record.
    assert DeployEvidence.from_event(EventKind.DEPLOY_FAILED, {"reason": "x", "remote_write": "r"}) is None
    assert DeployEvidence.from_event(EventKind.BAKED, {"clean_since": 1.0}) is None
    assert DeployEvidence.from_event(EventKind.DUAL_WRITE_DEPLOYED, OLD_FILE_DEPLOY) == DeployEvidence.from_dict(
        OLD_FILE_DEPLOY)


def _events(*pairs: tuple[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return list(pairs)


RUN = _events(
    (EventKind.RULES_SNAPSHOT, {"ref": "r", "sha256": "s", "rules": 2, "records": 1, "alerts": 1}),
    (EventKind.READ_PATH_SNAPSHOT, {"kind": "file", "snapshot": {"files": ["a.json", "b.json"]}}),
    (EventKind.RULES_RECORDS_ADDED, {"rules": 2, "result": None}),
    (EventKind.RULES_MOVED, {"moved": True, "rules": 2, "gap_s": 0.4}),
    (EventKind.READ_PATH_SWITCHED, {"switched": True, "kind": "file", "dashboards": 2, "panels": 7}),
    (EventKind.BAKE_CHECK, {"verdict": "SUCCESSFUL"}),
    (EventKind.BAKE_CHECK, {"verdict": "FAILED"}),
    (EventKind.BAKE_CHECK, {"verdict": "ERROR"}),
    (EventKind.READS_ROLLED_BACK, {"reason": "bake check failed"}),
    (EventKind.READ_PATH_RESTORED, {"changed": True}),
    (EventKind.RULES_RESTORED, {"changed": True, "restored_identical": True}),
    (EventKind.DECOMMISSION_REFUSED, {"reason": ""}),
)


def test_a_run_folds_into_the_reports_blocks_as_they_were() -> None:
    moved = MovedEvidence.from_events(RUN)
    assert moved.to_dict() == {
        "rules": {"configured": True, "moved": 2, "rules": 2, "records": 1, "alerts": 1, "records_added": True,
                  "gap_s": 0.4, "restored": True, "restored_identical": True, "reason": None},
        "read_path": {"configured": True, "switched": True, "dashboards": 2, "panels": 7, "restored": True,
                      "reason": None, "kind": "file"},
        "bake": {"checks": 3, "failed_checks": 2, "baked": False, "clean_since": None, "reads_rolled_back": True,
                 "reason": "bake check failed"},
        "decommission": {"performed": False, "source_series_after": None, "freed_series": 0,
                         "freed_samples_per_s": 0, "reason": "decommission refused"},
    }
    assert MovedEvidence.from_dict(moved.to_dict()) == moved


def test_nothing_happened_reads_as_not_configured_and_zeros() -> None:
    moved = MovedEvidence.from_events([])
    assert moved == MovedEvidence()
    assert moved.to_dict()["rules"]["reason"] == "not configured" and moved.rules.moved == 0
    assert "kind" not in moved.to_dict()["read_path"]  # recorded only once a read path was configured
    assert moved.to_dict()["bake"] == {"checks": 0, "failed_checks": 0, "baked": False, "clean_since": None,
                                       "reads_rolled_back": False, "reason": None}


def test_a_move_not_done_and_a_decommission_count_as_before() -> None:
    moved = MovedEvidence.from_events(_events(
        (EventKind.RULES_SNAPSHOT, {"rules": 3, "records": 3, "alerts": 0}),
        (EventKind.RULES_MOVED, {"moved": False, "rules": 3}),
        (EventKind.RULES_RESTORED, {"changed": False, "detail": "no rules snapshot left to restore"}),
        (EventKind.BAKED, {"checks": 4, "clean_since": 1733450000.0}),
        (EventKind.DECOMMISSIONED, {"freed": {"series": 96, "samples_per_s": None}, "source_series_after": 0}),
    ))
    assert moved.rules.moved == 0 and not moved.rules.restored and moved.rules.gap_s is None
    assert moved.bake.baked and moved.bake.clean_since == 1733450000.0 and moved.bake.checks == 0
    assert moved.decommission == DecommissionEvidence(performed=True, source_series_after=0, freed_series=96,
                                                      freed_samples_per_s=0, reason=None)


@pytest.mark.parametrize("cls,stored", [
    # Reports from before records_added, gap_s and restored_identical were kept.
    (RulesEvidence, {"configured": True, "moved": 1, "rules": 1, "records": 1, "alerts": 0, "restored": False,
                     "reason": None}),
    (ReadPathEvidence, {"configured": False, "switched": False, "dashboards": 0, "panels": 0,
                        "reason": "not configured"}),
    (BakeEvidence, {"checks": 2, "failed_checks": 0, "baked": True, "clean_since": 1.0}),
    (DecommissionEvidence, {"performed": True, "source_series_after": 0}),
])
def test_older_report_blocks_read_with_defaults_and_round_trip(cls: Any, stored: dict[str, Any]) -> None:
    found = cls.from_dict(stored)
    out = found.to_dict()
    assert {k: out[k] for k in stored} == stored  # what was stored reads back unchanged
    assert set(out) >= set(stored) and cls.from_dict(out) == found
    assert found == dataclasses.replace(cls(), **stored)


def test_the_evidence_is_frozen() -> None:
    for value in (DeployEvidence.from_dict(FILE_DEPLOY), RulesEvidence(), ReadPathEvidence(), BakeEvidence(),
                  DecommissionEvidence(), MovedEvidence()):
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.reason = "changed"  # type: ignore[misc]
