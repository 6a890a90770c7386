"""The swap step over fakes of its ports: add, prove, remove; resumed after a crash; undone byte for byte."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from promshift.core.deploy import DeployError, DeployResult, DeploySnapshot, DeployState
from promshift.core.events import EventKind
from promshift.core.queues import ConfigChange, promshift_queues
from promshift.core.render import QueueMember, add_remote_write, remote_write_entry, remote_write_names
from promshift.steps.queues import QueueSwap, SwapFailed

URL = "http://127.0.0.1:9091/api/v1/write"
BASE = b"global:\n  scrape_interval: 15s  # ours\nremote_write:\n- name: other\n  url: http://x.invalid/w\n"
T0 = datetime(2026, 12, 6, 3, 0, tzinfo=UTC)


class FakeSource:
    """The live config and a ConfigDeployer per change over it, refusing what a real deployer refuses."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.writes = 0
        self.fail_next = False

    def deployer_for(self, change: ConfigChange) -> Any:
        source = self

        class Deployer:
            kind = "memory"

            def snapshot(self) -> DeploySnapshot:
                return DeploySnapshot("memory", "cfg", source.data.decode(), {"existed": True})

            def deploy(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
                if source.data.decode() != snapshot.content:
                    raise DeployError("changed since the snapshot")
                if source.fail_next:
                    source.fail_next = False
                    raise DeployError("reload refused")
                new = change.apply(source.data)
                names = set(remote_write_names(new))
                assert change.live <= names and not (change.gone & names)
                source.data, source.writes = new, source.writes + 1
                return DeployResult("memory", "deploy", DeployState.WAITING).observed("LIVE", now,
                                                                                      state=DeployState.DONE)

            def verify(self, result: DeployResult, now: datetime) -> DeployResult:
                return result

            def restore(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
                source.data = snapshot.content.encode()
                return DeployResult("memory", "restore", DeployState.WAITING).observed("RESTORED", now,
                                                                                       state=DeployState.DONE)

        return Deployer()


class FakeProbe:
    def __init__(self, series: Mapping[str, int], *, fresh_after: int = 0, sending: bool = True) -> None:
        self.series = dict(series)
        self.calls = 0
        self.fresh_after = fresh_after
        self.sending = sending

    def source_series(self, member: QueueMember) -> int:
        self.calls += 1
        return self.series[member.group]

    def target_fresh(self, member: QueueMember, since: float) -> int:
        return self.series[member.group] if self.calls > self.fresh_after else 0

    def queue_sent(self, name: str) -> float | None:
        return 10_000.0 if self.sending else None


def config_with(*groups: str) -> bytes:
    data = BASE
    for g in groups:
        data = add_remote_write(data, remote_write_entry(group_name=g, name_regex=f"M_{g}", url=URL))
    return data


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def wait(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def step(source: FakeSource, probe: FakeProbe, events: list[tuple[EventKind, dict[str, Any]]],
         deadline_s: float = 60.0) -> QueueSwap:
    return QueueSwap(deployer_for=source.deployer_for, probe=probe,
                     record=lambda kind, now, evidence: events.append((kind, dict(evidence))),
                     proof_deadline_s=deadline_s, poll_s=5.0)


def test_three_cut_over_groups_merge_into_one_entry_then_one_leaves() -> None:
    source, events, clock = FakeSource(config_with("a", "b", "c")), [], Clock()
    probe = FakeProbe({"a": 10, "b": 20, "c": 5}, fresh_after=3)
    swaps = step(source, probe, events)
    swap = swaps.plan_merge(url=URL, cut_over=["a", "b", "c"])
    assert swap is not None
    outcome = swaps.run(swap, clock=clock, wait=clock.wait)
    assert outcome.state == "done" and outcome.proof is not None
    assert [q.groups() for q in promshift_queues(source.data)] == [("a", "b", "c")]
    assert [k for k, _ in events] == [EventKind.QUEUE_SWAP_ADDED, EventKind.QUEUE_SWAP_DONE]
    assert events[1][1]["proof"]["per_group"]["b"] == {"source": 20, "target": 20}
    assert clock.now > T0  # it waited for the target to show every series fresh
    leave = swaps.plan_leave(group="b")
    assert leave is not None
    swaps.run(leave, clock=clock, wait=clock.wait)
    assert [q.groups() for q in promshift_queues(source.data)] == [("a", "c")]
    assert events[-1][1]["swap"]["leaving"] == "b"


def test_a_proof_that_never_passes_undoes_the_add_byte_for_byte() -> None:
    before = config_with("a", "b")
    source, events, clock = FakeSource(before), [], Clock()
    swaps = step(source, FakeProbe({"a": 10, "b": 3}, sending=False), events, deadline_s=30)
    swap = swaps.plan_merge(url=URL, cut_over=["a", "b"])
    assert swap is not None
    with pytest.raises(SwapFailed, match="not proven in 30s"):
        swaps.run(swap, clock=clock, wait=clock.wait)
    assert source.data == before
    assert events[-1][0] is EventKind.QUEUE_SWAP_UNDONE and events[-1][1]["restored_identical"] is True


def test_a_swap_retried_after_a_crash_mid_overlap_resumes_without_writing_twice() -> None:
    source, events, clock = FakeSource(config_with("a", "b")), [], Clock()
    swaps = step(source, FakeProbe({"a": 1, "b": 1}), events)
    swap = swaps.plan_merge(url=URL, cut_over=["a", "b"])
    assert swap is not None
    swaps.add(swap, clock())  # ... and the worker died during the proof
    writes = source.writes
    resumed = swaps.plan_merge(url=URL, cut_over=["a", "b"])
    assert resumed is not None and resumed.added_name == swap.added_name
    swaps.run(resumed, clock=clock, wait=clock.wait)
    assert source.writes == writes + 1  # the add was not written again; only the removal
    assert [k for k, _ in events] == [EventKind.QUEUE_SWAP_ADDED, EventKind.QUEUE_SWAP_DONE]
    # Run again once done: nothing to do, nothing recorded.
    assert swaps.plan_merge(url=URL, cut_over=["a", "b"]) is None


def test_a_refused_add_leaves_the_config_untouched_and_records_nothing() -> None:
    before = config_with("a", "b")
    source, events, clock = FakeSource(before), [], Clock()
    source.fail_next = True
    swaps = step(source, FakeProbe({"a": 1, "b": 1}), events)
    swap = swaps.plan_merge(url=URL, cut_over=["a", "b"])
    assert swap is not None
    with pytest.raises(DeployError, match="reload refused"):
        swaps.run(swap, clock=clock, wait=clock.wait)
    assert source.data == before and events == []


def test_nothing_is_removed_on_a_proof_short_of_successful() -> None:
    source, events, clock = FakeSource(config_with("a", "b")), [], Clock()
    swaps = step(source, FakeProbe({"a": 1, "b": 0}), events)
    swap = swaps.plan_merge(url=URL, cut_over=["a", "b"])
    assert swap is not None
    swaps.add(swap, clock())
    proof = swaps.prove(swap, since=T0.timestamp())
    with pytest.raises(ValueError, match="removes nothing on a INCONCLUSIVE proof"):
        swaps.remove(swap, proof, clock())
    assert {q.name for q in promshift_queues(source.data)} >= {"promshift-a", "promshift-b"}


def test_the_pre_flight_merges_first_or_refuses_with_the_count() -> None:
    from promshift.core.queues import QueueCapError

    source, events, clock = FakeSource(config_with("a", "b", "c", "d")), [], Clock()
    swaps = step(source, FakeProbe({g: 2 for g in "abcd"}), events)
    with pytest.raises(QueueCapError, match=r"carries 4 promshift remote_write queues \(cap 4\)"):
        swaps.admit(group="e", url=URL, cap=4, cut_over=["a"], clock=clock, wait=clock.wait)
    assert events[-1][0] is EventKind.QUEUE_CAP_REFUSED and events[-1][1]["count"] == 4
    admission = swaps.admit(group="e", url=URL, cap=4, cut_over=["a", "b", "c"], clock=clock, wait=clock.wait)
    assert admission.allowed and admission.merge_first is not None
    assert [q.groups() for q in promshift_queues(source.data)] == [("d",), ("a", "b", "c")]
    assert swaps.leave(group="d", clock=clock, wait=clock.wait) is None  # not merged: nothing to leave
    assert swaps.leave(group="b", clock=clock, wait=clock.wait) is not None
    assert [q.groups() for q in promshift_queues(source.data)] == [("d",), ("a", "c")]
