"""The retire scenario's own logic (no processes): which groups it migrates and how, what it accepts, its
connections, and its report's four measured values (the running scenario: tests/e2e/test_lifecycle_demo_e2e.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from promshift.core.catalog import MetricGroup
from promshift.core.events import EventKind
from promshift.core.stages import Stage
from promshift.local.demo_retire import (
    prepared_names,
    report_markdown,
    retire_connections,
    start_order,
    wait_baked,
)
from promshift.local.stack.local import LocalStack, StackConfig


def _group(name: str, *depends_on: str) -> MetricGroup:
    return MetricGroup(name=name, metrics=(f"m_{name.replace('-', '_')}",), depends_on=depends_on)


GROUPS = [_group("util"), _group("memory"), _group("power", "util"), _group("clocks", "power")]


def test_groups_without_a_dependency_still_to_cut_over_go_by_hand_the_rest_by_the_waves() -> None:
    assert start_order(GROUPS, {}) == (["util", "memory"], ["power", "clocks"])
    # a session where memory was decommissioned and util cut over already: power may start by hand now
    stages = {"memory": Stage.DECOMMISSIONED, "util": Stage.CUT_OVER}
    assert start_order(GROUPS, stages) == (["power"], ["clocks"])
    assert start_order(GROUPS, dict.fromkeys(("util", "memory", "power", "clocks"), Stage.BAKED)) == ([], [])
    # a rolled-back group is migrated again; its dependents wait for it
    assert start_order(GROUPS, {"util": Stage.ROLLED_BACK, "memory": Stage.BAKED}) == (["util"], ["power", "clocks"])


class _Audit:
    def __init__(self, stages: list[dict[str, Stage]], events: list | None = None) -> None:
        self.stages, self.polls, self._events = stages, 0, events or []

    def stage_of(self, group: str) -> Stage:
        return self.stages[min(self.polls, len(self.stages) - 1)].get(group, Stage.PLANNED)

    def events(self, *, group: str | None = None) -> list:
        self.polls += 1
        return [e for e in self._events if group is None or e.group == group]


def test_waiting_for_the_bake_returns_once_every_group_is_baked_and_fails_on_a_rollback() -> None:
    audit = _Audit([{"util": Stage.BAKING, "memory": Stage.BAKED}, {"util": Stage.BAKED, "memory": Stage.BAKED}])
    sleeps: list[float] = []

    def sleep_and_tick(s: float) -> None:
        sleeps.append(s)
        audit.polls += 1

    import promshift.local.demo_retire as demo_retire

    real_sleep = demo_retire.time.sleep
    demo_retire.time.sleep = sleep_and_tick  # type: ignore[assignment]
    try:
        assert wait_baked(audit, ["util", "memory"], timeout_s=60) == {"util": "baked", "memory": "baked"}
        assert len(sleeps) == 1
        rolled = _Audit([{"util": Stage.ROLLED_BACK_READS, "memory": Stage.BAKED}])
        with pytest.raises(RuntimeError, match="not every group baked: util rolled_back_reads"):
            wait_baked(rolled, ["util", "memory"], timeout_s=60)
        with pytest.raises(TimeoutError, match="not every group baked in 0s"):
            wait_baked(_Audit([{"util": Stage.BAKING}]), ["util"], timeout_s=0)
    finally:
        demo_retire.time.sleep = real_sleep  # type: ignore[assignment]


def test_the_approver_accepts_exactly_what_the_newest_prepare_recorded() -> None:
    def event(names: list[str]) -> SimpleNamespace:
        return SimpleNamespace(group="source:promshift_source", kind=EventKind.SOURCE_RETIRE_PREPARED,
                               evidence_data={"names": names}, at=datetime.now(UTC))

    audit = _Audit([{}], [event(["rule:a/b"]), event(["rule:a/b", "metric:x"]),
                          SimpleNamespace(group="other", kind=EventKind.SOURCE_RETIRE_PREPARED,
                                          evidence_data={"names": ["read:y"]})])
    assert prepared_names(audit, "promshift_source") == ["rule:a/b", "metric:x"]
    assert prepared_names(_Audit([{}]), "promshift_source") == []


def test_the_source_connection_carries_the_labs_process_control_and_query_log() -> None:
    stack = LocalStack(StackConfig(home=Path("/nonexistent-promshift-home")))
    conns = retire_connections(stack)
    extra = conns["promshift_source"]["extra"]
    assert extra["config_path"] == str(stack.source_config_path)
    assert extra["mode_switch"]["config_path"] == str(stack.source_config_path)
    assert extra["query_log"] == str(stack.source_query_log_path) and extra["scrape_interval"] == "5s"
    assert conns["grafana_default"] is None and "deploy" not in conns["promshift_target"]["extra"]


def test_on_k8s_cr_the_source_connection_names_the_resource_and_no_process_control() -> None:
    stack = LocalStack(StackConfig(home=Path("/nonexistent-promshift-home"), kubernetes=True))
    stack.kubernetes_address = lambda: {"url": "http://127.0.0.1:1"}  # type: ignore[method-assign]
    extra = retire_connections(stack, "k8s-cr")["promshift_source"]["extra"]
    assert extra["deploy"] == "k8s-cr" and extra["kubernetes"]["name"] == "k8s" and "mode_switch" not in extra
    assert extra["query_log"] == str(stack.source_query_log_path)


_REPORT_FOR_MARKDOWN: dict = {"source": {"connection": "promshift_source", "url": "http://127.0.0.1:9"},
    "groups": {"util": "baked"}, "accepted": ["rule:a/b"], "audit": {"chain_ok": True},
    "retire": {"mode": "agent", "target_receiving": True, "source_storing": False,
               "undo_byte_identical": True},
    "measured": {"before": {"config_sha256": "aa"},
                 "retired": {"query_status": 422, "target_since_agent": {"util": {"series": 2}}},
                 "undone": {"config_sha256": "aa", "argv_identical": True}},
    "proof": {"usage_before": {"rss_mb": 200.0}, "usage_after": {"rss_mb": 90.0}, "gaps_s": {"util": 5.0}},
    "runs": {"retire": {"state": "success"}, "unretire": {"state": "failed"}}}


def test_the_report_says_what_was_measured() -> None:
    report = _REPORT_FOR_MARKDOWN
    text = report_markdown(report)
    assert "mode after the retire: **agent**" in text and "a query answered 422" in text
    assert "200.0 MB / 90.0 MB" in text and "rule:a/b" in text
    assert "promshift__retire success, promshift__unretire failed" in text
    assert "write queues before the switch: not measured" in text


def test_a_group_is_received_only_when_every_series_has_two_samples_after_the_switch() -> None:
    from promshift.local.demo_retire import is_receiving, receiving_summary

    assert receiving_summary([3, 2, 5]) == {"series": 3, "series_with_scrapes_after": 3, "most_after": 5}
    assert is_receiving(receiving_summary([3, 2, 5]))
    assert not is_receiving(receiving_summary([3, 1, 5]))  # one series stopped at the switch
    assert not is_receiving(receiving_summary([]))  # no data never passes


class _Counts:
    """A Prometheus answering ``sum(count_over_time(...))`` from a table by selector, and its loaded config."""

    def __init__(self, counts: dict[str, int], config: str = "") -> None:
        self.counts, self.config, self.asked = counts, config, []

    def scalar(self, expr: str, *, at: float | None = None) -> float | None:
        self.asked.append((expr, at))
        return next((float(n) for sel, n in self.counts.items() if sel in expr), None)

    def label_values(self, label: str, match: str, *, start: float, end: float) -> list[str]:
        """The metric names it holds that ``match`` selects (the demo counts per name)."""
        assert label == "__name__" and start < end
        return [name for name in self.counts if name in match]

    def config_text(self) -> str:
        return self.config


def test_the_consolidation_is_measured_from_its_record_and_counted_on_both_sides(monkeypatch) -> None:  # noqa: ANN001
    """The report's ``retire.consolidated``: entries from the source's loaded config before and now, members and state
    from ``source_queues_consolidated``, and a group short of samples on the target counts as lost."""
    from promshift.local import demo_retire

    monkeypatch.setattr(demo_retire.time, "sleep", lambda s: None)
    added = datetime(2026, 12, 6, 14, 0, tzinfo=UTC)
    done = datetime(2026, 12, 6, 14, 0, 30, tzinfo=UTC)
    events = [SimpleNamespace(kind=EventKind.QUEUE_SWAP_ADDED, at=added, run_id="r", evidence_data={}),
              SimpleNamespace(kind=EventKind.QUEUE_SWAP_DONE, at=done, run_id="r", evidence_data={}),
              SimpleNamespace(kind=EventKind.SOURCE_QUEUES_CONSOLIDATED, at=done, run_id="r", evidence_data={
                  "targets": {"promshift_target": {"state": "merged", "members": ["memory", "util"]}},
                  "lines": ["promshift_target: 2 promshift queues -> 1"]})]
    audit = SimpleNamespace(events=lambda group=None: events if group == "source:promshift_source" else [])
    merged = "remote_write:\n- name: promshift--merged-abc\n  url: http://t/w\n"
    source = _Counts({"m_util": 120, "m_memory": 60}, merged)
    target = _Counts({"m_util": 120, "m_memory": 57})
    measured = demo_retire.measure_consolidation(audit, "r", GROUPS, source, target,  # type: ignore[arg-type]
                                                 entries_before=["promshift-util", "promshift-memory"])
    assert measured["summary"] == {"state": "merged", "entries_before": 2, "entries_after": 1,
                                   "members": ["memory", "util"], "samples_lost": 3}
    counted = measured["detail"]["counted"]
    assert counted["per_group"] == {"util": {"source": 120, "target": 120}, "memory": {"source": 60, "target": 57}}
    # the window: 10 s before the add began to 10 s after the consolidation's record, asked at its end on both sides
    assert counted["window"] == [added.timestamp() - 10, done.timestamp() + 10]
    assert {at for _, at in source.asked + target.asked} == {done.timestamp() + 10}
    assert all("[50s]" in expr for expr, _ in source.asked)
    # no consolidation recorded (a task before it failed): nothing counted, never a pass
    none = demo_retire.measure_consolidation(SimpleNamespace(events=lambda group=None: []), "r", GROUPS, source,
                                             target, entries_before=[])  # type: ignore[arg-type]
    assert none["summary"]["state"] == "not run" and none["summary"]["samples_lost"] is None
    text = report_markdown({**_REPORT_FOR_MARKDOWN, "retire": {**_REPORT_FOR_MARKDOWN["retire"],
                                                               "consolidated": measured["summary"]}})
    assert "write queues before the switch: 2 promshift entries -> 1 (merged; 2 groups merged; samples lost " \
           "across the swap: 3)" in text


def test_the_demos_probe_of_the_source_is_promshifts_own_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo asks the source ``up`` right before the switch (after the retire's prepare): unmarked, the retire's
    re-check of the query log counted it as a fleet read (``read:up``) nobody had accepted and refused (seen in
    make e2e's k8s-cr session). Marked, the query log reader leaves it out."""
    import requests

    from promshift.core.promql import is_own_read
    from promshift.local.demo_retire import source_query_status

    asked: list[str] = []

    def get(self: requests.Session, url: str, *, params: dict[str, str], timeout: float) -> SimpleNamespace:
        asked.append(params["query"])
        return SimpleNamespace(status_code=422, text="agent")

    monkeypatch.setattr(requests.Session, "get", get)
    assert source_query_status("http://127.0.0.1:1") == (422, "agent")
    assert len(asked) == 1 and is_own_read(asked[0]) and asked[0].startswith("up")
