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


# What the fakes' target answers for its out-of-order window (a Prometheus with storage.tsdb.out_of_order_time_window).
WINDOW = (3600.0, "storage.tsdb.out_of_order_time_window of the fake target")


def step(source: FakeSource, probe: FakeProbe, events: list[tuple[EventKind, dict[str, Any]]],
         deadline_s: float = 60.0, window: tuple[float | None, str] = WINDOW, scrape_s: float = 15.0) -> QueueSwap:
    return QueueSwap(deployer_for=source.deployer_for, probe=probe,
                     record=lambda kind, now, evidence: events.append((kind, dict(evidence))),
                     out_of_order_window=lambda: window, scrape_interval_s=scrape_s,
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


class ReloadingSource(FakeSource):
    """A deployer that waits for a reload, as the Kubernetes resource's does: deploy and restore are WAITING until
    ``verify`` has been called ``polls`` times; the restore says whether the snapshot came back as it was."""

    def __init__(self, data: bytes, polls: int = 2) -> None:
        super().__init__(data)
        self.polls = polls
        self.verified = 0

    def deployer_for(self, change: ConfigChange) -> Any:
        inner, source = super().deployer_for(change), self

        class Deployer:
            kind = "k8s-cr"

            def snapshot(self) -> DeploySnapshot:
                return inner.snapshot()

            def deploy(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
                return inner.deploy(snapshot, now).observed("CR_UPDATED", now, state=DeployState.WAITING)

            def verify(self, result: DeployResult, now: datetime) -> DeployResult:
                source.verified += 1
                done = source.verified % source.polls == 0
                return result.observed("LIVE" if done else "WAITING_FOR_RELOAD", now,
                                       state=DeployState.DONE if done else DeployState.WAITING)

            def restore(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
                inner.restore(snapshot, now)
                return DeployResult("k8s-cr", "restore", DeployState.WAITING).observed(
                    "CR_RESTORED", now, state=DeployState.WAITING, restored_identical=True)

        return Deployer()


def test_a_swap_on_a_deployer_that_waits_for_its_reload_follows_each_edit_and_its_undo() -> None:
    """Each edit and the undo are followed until the reload shows them (the k8s-cr path): a WAITING restore is not
    reported as restored until it is DONE."""
    before = config_with("a", "b")
    source, events, clock = ReloadingSource(before), [], Clock()
    swaps = step(source, FakeProbe({"a": 10, "b": 3}, sending=False), events, deadline_s=30)
    swap = swaps.plan_merge(url=URL, cut_over=["a", "b"])
    assert swap is not None
    with pytest.raises(SwapFailed, match="not proven in 30s"):
        swaps.run(swap, clock=clock, wait=clock.wait)
    assert source.data == before and source.verified == 4  # the add's reload, then the undo's
    assert events[-1][0] is EventKind.QUEUE_SWAP_UNDONE and events[-1][1]["restored_identical"] is True

    source, events = ReloadingSource(before), []
    swaps = step(source, FakeProbe({"a": 10, "b": 3}), events)
    outcome = swaps.run(swaps.plan_merge(url=URL, cut_over=["a", "b"]), clock=clock, wait=clock.wait)  # type: ignore[arg-type]
    assert outcome.state == "done" and [q.groups() for q in promshift_queues(source.data)] == [("a", "b")]
    assert source.verified == 4  # add and removal, each followed to its reload


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


# -- the deploy step: the cap's pre-flight on every path, and a merged group's rollback ---------------------------


class GroupDeployer:
    """A group's own entry in ``FakeSource``'s config, as the file path's deployer adds it and takes it back (its
    restore keeps what others changed since the snapshot and removes only its entry, as ``keep_others`` does)."""

    kind = "file"

    def __init__(self, source: FakeSource, group: str) -> None:
        self.source = source
        self.entry = remote_write_entry(group_name=group, name_regex=f"M_{group}", url=URL)
        self.calls: list[str] = []

    def snapshot(self) -> DeploySnapshot:
        self.calls.append("snapshot")
        return DeploySnapshot("file", "cfg", self.source.data.decode(), {"existed": True})

    def deploy(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        self.calls.append("deploy")
        if self.source.data.decode() != snapshot.content:
            raise DeployError("changed since the snapshot was taken; refusing to deploy")
        self.source.data = add_remote_write(self.source.data, self.entry)
        return DeployResult("file", "deploy", DeployState.WAITING).observed("LIVE", now, state=DeployState.DONE,
                                                                            remote_write=self.entry["name"])

    def verify(self, result: DeployResult, now: datetime) -> DeployResult:
        return result

    def restore(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        from promshift.core.render import remove_remote_write

        self.calls.append("restore")
        self.source.data = remove_remote_write(self.source.data, str(self.entry["name"]))
        identical = self.source.data.decode() == snapshot.content
        return DeployResult("file", "restore", DeployState.WAITING).observed(
            "RESTORED", now, state=DeployState.DONE, record={"restored_identical": identical})


def group_run(tmp_path: Any, audit: Any, name: str, deployer: Any, queues: Any, store: Any = None) -> Any:
    from promshift.adapters.prometheus import PrometheusClient
    from promshift.adapters.routing import RoutingStore
    from promshift.core.catalog import MetricGroup
    from promshift.core.deploy import InMemorySnapshotStore
    from promshift.orchestration.compose import compose_migration
    from promshift.steps.migration import Backends

    # Nothing listens here: these steps read the source only through the fakes.
    backends = Backends(source=PrometheusClient("http://127.0.0.1:9"), target=PrometheusClient("http://127.0.0.1:9"),
                        source_config_path=str(tmp_path / "prometheus.yml"), target_remote_write_url=URL)
    return compose_migration(MetricGroup(name=name, metrics=(f"M_{name}",), owners=("o",), approvers=("p",)),
                             backends, audit=audit, routing=RoutingStore(audit.url), run_id=f"manual__{name}",
                             snapshot_blobs=object(), deployer=deployer, snapshots=store or InMemorySnapshotStore(),
                             queues=queues)


@pytest.fixture
def audit(tmp_path: Any) -> Any:
    from promshift.adapters.audit_store import AuditStore

    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    yield store
    store.engine.dispose()


def cap_of(*, cap: Any = lambda: 4, names: Any = lambda: [], cut_over: Any = lambda g: False,
           source: FakeSource | None = None, probe: FakeProbe | None = None, clock: Clock | None = None,
           window: tuple[float | None, str] = WINDOW) -> Any:
    from promshift.steps.queues import QueueCap

    clock = clock or Clock()
    ports = None if source is None else (lambda: (source.deployer_for, probe))
    return QueueCap(cap=cap, url=URL, loaded_names=names, has_cut_over=cut_over, swap_ports=ports, clock=clock,
                    wait=clock.wait, out_of_order_window=lambda: window, scrape_interval_s=30.0,
                    proof_deadline_s=60.0, poll_s=5.0)


def kinds(audit: Any, group: str) -> list[str]:
    return [e.kind for e in audit.events(group=group)]


@pytest.mark.parametrize("kind", ["k8s-cr", "k8s-configmap", "git"])
def test_past_the_cap_a_dual_write_is_refused_in_one_line_before_anything_is_deployed(
        tmp_path: Any, audit: Any, kind: str) -> None:
    from promshift.core.deploy import InMemoryConfigDeployer
    from promshift.steps.deploy import DeployStepFailed

    loaded = ["other", "promshift-a", "promshift-b", "promshift-c", "promshift--merged-0123456789ab"]
    deployer = InMemoryConfigDeployer("cfg", "cfg+e", kind=kind)
    m = group_run(tmp_path, audit, "e", deployer, cap_of(names=lambda: loaded))
    with pytest.raises(DeployStepFailed) as refused:
        m.snapshot(T0)
    line = str(refused.value)
    assert "\n" not in line and "carries 4 promshift remote_write queues (cap 4)" in line and "'e'" in line
    assert "no group among them has cut over" in line
    assert deployer.calls == [] and deployer.live == "cfg"  # no snapshot, nothing deployed
    assert kinds(audit, "e") == ["queue_cap_refused"]
    assert audit.events(group="e")[0].evidence_data["count"] == 4

    # Cut-over groups on a path without a swap: still refused, saying why nothing is merged.
    m = group_run(tmp_path, audit, "e", deployer, cap_of(names=lambda: loaded, cut_over=lambda g: g in "ab"))
    with pytest.raises(DeployStepFailed,
                       match="2 of them cut over, but a merge swap is built on the file path and the Prometheus"):
        m.snapshot(T0)
    # A cap of 5 (the connection's extra.max_queues) makes room: snapshot, then deploy.
    m = group_run(tmp_path, audit, "e", deployer, cap_of(cap=lambda: 5, names=lambda: loaded))
    info = m.snapshot(T0)
    assert info["queues"]["count"] == 4 and info["queues"]["cap"] == 5
    m.deploy_step.start(info, T0)
    assert deployer.calls == ["snapshot", "deploy"] and deployer.live == "cfg+e"


def test_room_taken_between_snapshot_and_deploy_is_refused_before_the_deploy(tmp_path: Any, audit: Any) -> None:
    from promshift.core.deploy import InMemoryConfigDeployer
    from promshift.steps.deploy import DeployStepFailed

    loaded = ["promshift-a", "promshift-b", "promshift-c"]
    deployer = InMemoryConfigDeployer("cfg", "cfg+e", kind="k8s-cr")
    m = group_run(tmp_path, audit, "e", deployer, cap_of(names=lambda: list(loaded)))
    info = m.snapshot(T0)
    loaded.append("promshift-d")  # another group's deploy took the last slot meanwhile
    with pytest.raises(DeployStepFailed, match=r"carries 4 promshift remote_write queues \(cap 4\)"):
        m.deploy_step.start(info, T0)
    assert deployer.calls == ["snapshot"] and deployer.live == "cfg"
    assert kinds(audit, "e")[-1] == "queue_cap_refused"


def test_a_bad_cap_fails_closed_and_never_blocks_a_rollback(tmp_path: Any, audit: Any) -> None:
    from promshift.core.deploy import InMemoryConfigDeployer
    from promshift.core.queues import queue_cap_of
    from promshift.steps.deploy import DeployStepFailed

    deployer = InMemoryConfigDeployer("cfg", "cfg+e", kind="k8s-cr")
    bad = cap_of(cap=lambda: queue_cap_of("8", 4, conn_id="promshift_source"))
    m = group_run(tmp_path, audit, "e", deployer, bad)
    with pytest.raises(DeployStepFailed, match=r"connection 'promshift_source' extra.max_queues must be an integer"):
        m.snapshot(T0)
    assert deployer.calls == [] and kinds(audit, "e") == ["queue_cap_refused"]
    # The rollback reads no cap: a group deployed before the setting went bad still rolls back.
    good = group_run(tmp_path, audit, "f", InMemoryConfigDeployer("cfg", "cfg+f", kind="k8s-cr"), cap_of())
    info = good.snapshot(T0)
    good.deploy_dual_write(info, T0)
    rolled = group_run(tmp_path, audit, "f", good.deploy_step.deployer, bad,
                       store=good.deploy_step.store).rollback(info, reason="test", now=T0)
    assert rolled["performed"] is True and kinds(audit, "f")[-1] == "rolled_back"


def test_the_managed_collector_adds_no_source_queue_so_no_cap_applies(tmp_path: Any, audit: Any) -> None:
    from promshift.core.deploy import InMemoryConfigDeployer

    full = ["promshift-a", "promshift-b", "promshift-c", "promshift-d"]
    deployer = InMemoryConfigDeployer(None, "scraper", kind="scraper")
    m = group_run(tmp_path, audit, "e", deployer, cap_of(names=lambda: full))
    assert "queues" not in m.snapshot(T0)


def test_the_file_path_merges_first_then_a_merged_group_rolls_back_out_of_the_merged_entry(
        tmp_path: Any, audit: Any) -> None:
    from promshift.core.stages import CUT_OVER_OR_LATER

    source, clock = FakeSource(BASE), Clock()
    probe = FakeProbe({g: 3 for g in "abcde"})
    cut_over = {"a", "b", "c"}

    def run(group: str) -> tuple[Any, dict[str, Any]]:
        queues = cap_of(names=lambda: remote_write_names(source.data), cut_over=lambda g: g in cut_over,
                        source=source, probe=probe, clock=clock)
        m = group_run(tmp_path, audit, group, GroupDeployer(source, group), queues)
        info = m.snapshot(clock())
        m.deploy_dual_write(info, clock())
        return m, info

    runs = {g: run(g) for g in "abcd"}  # four queues: the cap
    assert [q.name for q in promshift_queues(source.data)] == [f"promshift-{g}" for g in "abcd"]
    _, info_e = run("e")  # a, b and c have cut over: merged first, then e's snapshot and deploy
    assert [q.groups() for q in promshift_queues(source.data)] == [("d",), ("a", "b", "c"), ("e",)]
    assert info_e["queues"]["merged_first"]["remove"] == ["promshift-a", "promshift-b", "promshift-c"]
    assert kinds(audit, "e") == ["queue_swap_added", "queue_swap_done", "snapshot_taken", "dual_write_deployed"]
    assert all(audit.stage_of(g).value not in CUT_OVER_OR_LATER for g in "e")

    # b rolls back: out of the merged entry by one more swap first, then its own restore.
    m_b, info_b = runs["b"]
    before = source.data
    rolled = m_b.rollback(info_b, reason="bake failed", now=clock())
    assert [q.groups() for q in promshift_queues(source.data)] == [("d",), ("e",), ("a", "c")]
    assert rolled["left_merged_entry"]["leaving"] == "b" and rolled["performed"] is True
    assert kinds(audit, "b")[-3:] == ["queue_swap_added", "queue_swap_done", "rolled_back"]
    # Byte for byte on the rest: only the merged entry's lines changed.
    from promshift.core.render import remove_remote_write

    def rest(data: bytes) -> bytes:
        for name in remote_write_names(data):
            if name.startswith("promshift-"):
                data = remove_remote_write(data, name)
        return data

    assert rest(source.data) == rest(before) == BASE
    # Retried (the task ran again): nothing more to leave, no second swap; the first rollback's record comes back.
    again = m_b.rollback(info_b, reason="bake failed", now=clock())
    assert again["already_rolled_back"] is True and again["left_merged_entry"]["leaving"] == "b"
    assert kinds(audit, "b").count("queue_swap_done") == 1


def test_a_merge_that_cannot_be_proven_refuses_the_deploy_and_leaves_the_config_as_it_was(
        tmp_path: Any, audit: Any) -> None:
    from promshift.core.queues import MERGEABLE_STAGES
    from promshift.core.stages import Stage
    from promshift.steps.deploy import DeployStepFailed

    assert Stage.DECOMMISSIONED not in MERGEABLE_STAGES and Stage.BAKED in MERGEABLE_STAGES
    source, clock = FakeSource(config_with("a", "b", "c", "d")), Clock()
    before = source.data
    queues = cap_of(names=lambda: remote_write_names(source.data), cut_over=lambda g: g in "abc", source=source,
                    probe=FakeProbe({g: 3 for g in "abcde"}, fresh_after=10**6), clock=clock)
    deployer = GroupDeployer(source, "e")
    m = group_run(tmp_path, audit, "e", deployer, queues)
    with pytest.raises(DeployStepFailed, match=r"^no room under the source's queue cap: merged entry .* not proven"):
        m.snapshot(clock())
    assert source.data == before and deployer.calls == []
    assert kinds(audit, "e") == ["queue_swap_added", "queue_swap_undone"]


# -- the overlap's guard: a swap starts only on a target that takes its older duplicates ------------------------


@pytest.mark.parametrize("window", [(None, "unavailable: connection refused"), (0.0, "absent: 0"),
                                    (20.0, "configured"), (float("nan"), "odd")])
def test_a_swap_is_not_started_on_a_target_without_a_wide_enough_out_of_order_window(
        window: tuple[float | None, str]) -> None:
    from promshift.core.queues import OverlapRefused

    before = config_with("a", "b")
    source, events, clock = FakeSource(before), [], Clock()
    swaps = step(source, FakeProbe({"a": 1, "b": 1}), events, window=window, scrape_s=15.0)
    swap = swaps.plan_merge(url=URL, cut_over=["a", "b"])
    assert swap is not None
    with pytest.raises(OverlapRefused) as refused:
        swaps.run(swap, clock=clock, wait=clock.wait)
    line = str(refused.value)
    assert "\n" not in line and "out-of-order" in line and window[1] in line and "at least 30s" in line
    assert source.data == before and source.writes == 0 and events == [] and clock.now == T0


def test_the_swap_records_the_window_it_relied_on_and_a_last_leave_needs_none() -> None:
    source, events, clock = FakeSource(config_with("a", "b")), [], Clock()
    swaps = step(source, FakeProbe({"a": 1, "b": 1}), events, window=(60.0, "workspace ws-1"), scrape_s=30.0)
    swap = swaps.plan_merge(url=URL, cut_over=["a", "b"])
    assert swap is not None
    swaps.run(swap, clock=clock, wait=clock.wait)
    assert events[0][0] is EventKind.QUEUE_SWAP_ADDED
    assert events[0][1]["target_out_of_order"] == {"window_s": 60.0, "origin": "workspace ws-1", "needed_s": 60.0,
                                                   "scrape_interval_s": 30.0, "covered": True}
    # A leave that adds an entry (the others' merged entry) overlaps, but it is a rollback's first move and nothing
    # may block a rollback: it goes ahead and its add records the shortfall as the risk it took.
    swaps.out_of_order_window = lambda: (0.0, "window set to 0 since")
    outcome = swaps.leave(group="a", clock=clock, wait=clock.wait)
    assert outcome is not None and outcome.state == "done"
    added = [e for k, e in events if k is EventKind.QUEUE_SWAP_ADDED][-1]["target_out_of_order"]
    assert added["covered"] is False and added["window_s"] == 0.0
    assert "accepts no out-of-order samples (window set to 0 since)" in added["risk"] and "\n" not in added["risk"]
    assert [k.value for k, _ in events[-2:]] == ["queue_swap_added", "queue_swap_done"]
    # The last member's leave adds nothing, so nothing is sent twice: no window read, nothing recorded of it.
    swaps.out_of_order_window = lambda: (None, "unavailable")
    outcome = swaps.leave(group="b", clock=clock, wait=clock.wait)
    assert outcome is not None and outcome.state == "done" and promshift_queues(source.data) == ()
    assert [k.value for k, _ in events[-1:]] == ["queue_swap_done"] and "target_out_of_order" not in events[-1][1]


def test_the_slowest_member_sets_the_window_the_overlap_needs() -> None:
    """A member scraped every minute has its samples sent twice too: the window must cover 2 of its scrapes, not 2 of
    the deploying group's (15 s), and a member the catalog does not know keeps the deploying group's."""
    from promshift.core.queues import OverlapRefused

    before = config_with("a", "b", "c")
    intervals = {"a": 15.0, "b": 60.0, "c": None}
    source, events, clock = FakeSource(before), [], Clock()
    swaps = QueueSwap(deployer_for=source.deployer_for, probe=FakeProbe({"a": 1, "b": 1, "c": 1}),
                      record=lambda kind, now, evidence: events.append((kind, dict(evidence))),
                      out_of_order_window=lambda: (60.0, "workspace ws-1"), scrape_interval_s=15.0,
                      proof_deadline_s=60.0, poll_s=5.0, member_interval_s=intervals.get)
    swap = swaps.plan_merge(url=URL, cut_over=["a", "b", "c"])
    assert swap is not None and swaps.slowest_interval_s(swap) == 60.0
    with pytest.raises(OverlapRefused) as refused:
        swaps.run(swap, clock=clock, wait=clock.wait)
    assert "shorter than the 120s" in str(refused.value) and "60s" in str(refused.value)
    assert source.data == before and source.writes == 0 and events == []
    # without the slow member the deploying group's 15 s sets it (30 s): the swap runs and records both
    swap = swaps.plan_merge(url=URL, cut_over=["a", "c"])
    assert swap is not None
    assert swaps.run(swap, clock=clock, wait=clock.wait).state == "done"
    assert events[0][1]["target_out_of_order"] == {"window_s": 60.0, "origin": "workspace ws-1", "needed_s": 30.0,
                                                   "scrape_interval_s": 15.0, "covered": True}


def test_a_swap_found_mid_overlap_is_finished_whatever_the_window() -> None:
    """A crash after the add: the overlap is on already; finishing the swap ends it soonest (no guard, no add)."""
    from promshift.core.queues import with_added

    source, events, clock = FakeSource(config_with("a", "b")), [], Clock()
    swaps = step(source, FakeProbe({"a": 1, "b": 1}), events, window=(0.0, "absent: 0"))
    swap = swaps.plan_merge(url=URL, cut_over=["a", "b"])
    assert swap is not None
    source.data = with_added(source.data, swap)
    assert swaps.run(swap, clock=clock, wait=clock.wait).state == "done"
    assert [k for k, _ in events] == [EventKind.QUEUE_SWAP_DONE]


def test_past_the_cap_a_merge_onto_a_target_without_the_window_refuses_the_deploy_in_one_line(
        tmp_path: Any, audit: Any) -> None:
    from promshift.steps.deploy import DeployStepFailed

    source, clock = FakeSource(config_with("a", "b", "c", "d")), Clock()
    before = source.data
    probe = FakeProbe({g: 3 for g in "abcde"})
    queues = cap_of(names=lambda: remote_write_names(source.data), cut_over=lambda g: g in "abc", source=source,
                    probe=probe, clock=clock, window=(0.0, "storage.tsdb.out_of_order_time_window absent"))
    deployer = GroupDeployer(source, "e")
    m = group_run(tmp_path, audit, "e", deployer, queues)
    with pytest.raises(DeployStepFailed) as refused:
        m.snapshot(clock())
    line = str(refused.value)
    assert "\n" not in line and "carries 4 promshift remote_write queues (cap 4)" in line
    assert "the target accepts no out-of-order samples (storage.tsdb.out_of_order_time_window absent)" in line
    assert "at least 60s" in line and "'e'" in line  # the group's scrape interval is 30 s
    assert source.data == before and deployer.calls == [] and probe.calls == 0
    assert kinds(audit, "e") == ["queue_cap_refused"]
    assert audit.events(group="e")[0].evidence_data["reason"] == line
