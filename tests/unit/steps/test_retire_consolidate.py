"""The retire's consolidation over the swap's fakes: every baked group's entry merged into one before the switch, or
the per-group entries kept with one line saying why; never blocking, never leaving a swap half-done."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from promshift.core.catalog.model import ReplicaPolicy
from promshift.core.events import EventKind
from promshift.core.queues import promshift_queues
from promshift.core.render import add_remote_write, remote_write_entry, remote_write_names
from promshift.core.stages import Stage
from promshift.steps.retire import RetireSource, SourceQueues, consolidation_line
from tests.unit.steps.test_queue_swap import T0, URL, Clock, FakeProbe, FakeSource, cap_of, config_with


@dataclass
class FakeAudit:
    stages: dict[str, Stage]
    appended: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def stage_of(self, group: str) -> Stage:
        return self.stages.get(group, Stage.PLANNED)

    def append(self, *, group: str, kind: EventKind, evidence: dict[str, Any], **_: Any) -> None:
        self.appended.append((f"{group} {kind.value}", evidence))

    def kinds(self) -> list[str]:
        return [k for k, _ in self.appended]


class Switch:
    def __init__(self, mode: str = "server") -> None:
        self.current = mode

    def mode(self) -> str:
        return self.current


def retire(audit: FakeAudit, build: Callable[[], tuple[Any, str]], *, mode: str = "server",
           groups: str = "abcd") -> RetireSource:
    return RetireSource(conn_id="src", groups=[SimpleNamespace(name=g, target="tgt") for g in groups], audit=audit,
                        switch=Switch(mode), source=None, target={}, run_id="retire-1",  # type: ignore[arg-type]
                        scrape_interval_s=30.0, clock=lambda: T0.timestamp() + 42,
                        queues=[SourceQueues(target="tgt", build=build)])


BAKED = {g: Stage.BAKED for g in "abcd"}


def test_every_baked_groups_entry_is_merged_into_one_by_the_lossless_swap_before_the_switch() -> None:
    """Four baked groups, one decommissioned (its series are dropped at scrape: no swap could prove them, so its
    entry stays), another team's entry untouched: 4 of the 5 promshift entries become one, audited under the source."""
    source, clock = FakeSource(config_with("a", "b", "c", "d", "e")), Clock()
    probe = FakeProbe({g: 4 for g in "abcde"}, fresh_after=4)
    audit = FakeAudit({**BAKED, "e": Stage.DECOMMISSIONED})
    step = retire(audit, lambda: (cap_of(source=source, probe=probe, clock=clock), "remote_write"), groups="abcde")
    result = step.consolidate(T0)
    [(target, r)] = result["targets"].items()
    assert target == "tgt" and r["state"] == "merged"
    assert (r["entries_before"], r["entries_after"]) == (5, 2) and r["members"] == ["a", "b", "c", "d"]
    assert [q.groups() for q in promshift_queues(source.data)] == [("e",), ("a", "b", "c", "d")]
    assert remote_write_names(source.data)[0] == "other"  # another team's entry, in its place
    assert r["removed"] == [f"promshift-{g}" for g in "abcd"] and r["merged_entry"].startswith("promshift--merged-")
    assert set(r["proof"]["per_group"]) == set("abcd") and r["proof"]["verdict"] == "SUCCESSFUL"
    assert clock.now > T0  # it waited until the target showed every member fresh
    assert audit.kinds() == ["source:src queue_swap_added", "source:src queue_swap_done",
                             "source:src source_queues_consolidated"]
    recorded = audit.appended[-1][1]
    assert recorded["lines"] == [consolidation_line("tgt", r)] and "5 promshift queues -> 2" in recorded["lines"][0]
    assert recorded["ended_at"] == datetime.fromtimestamp(T0.timestamp() + 42, tz=T0.tzinfo).isoformat()
    # Run again (a retried task): nothing left to merge, nothing written.
    writes = source.writes
    again = step.consolidate(T0)["targets"]["tgt"]
    assert again["state"] == "already" and again["members"] == ["a", "b", "c", "d"] and source.writes == writes


def test_a_target_whose_out_of_order_window_is_too_short_keeps_the_per_group_entries_and_says_why() -> None:
    before = config_with("a", "b", "c", "d")
    source, clock = FakeSource(before), Clock()
    audit = FakeAudit(BAKED)
    window = (20.0, "outOfOrderTimeWindowInSeconds of AMP workspace ws-1")
    step = retire(audit, lambda: (cap_of(source=source, probe=FakeProbe({g: 1 for g in "abcd"}), clock=clock,
                                         window=window), "k8s-cr"))
    r = step.consolidate(T0)["targets"]["tgt"]
    assert r["state"] == "kept" and (r["entries_before"], r["entries_after"]) == (4, 4)
    assert "window of 20s (outOfOrderTimeWindowInSeconds of AMP workspace ws-1) is shorter than the 60s" in r["reason"]
    assert "\n" not in r["reason"] and source.data == before and source.writes == 0
    assert audit.kinds() == ["source:src source_queues_consolidated"]
    assert audit.appended[0][1]["lines"] == [f"tgt: 4 per-group entries kept: {r['reason']}"]


def test_a_path_without_a_swap_or_an_entry_the_merge_cannot_read_keeps_the_entries() -> None:
    names = [f"promshift-{g}" for g in "abcd"]
    step = retire(FakeAudit(BAKED), lambda: (cap_of(names=lambda: names), "k8s-configmap"))
    r = step.consolidate(T0)["targets"]["tgt"]
    assert r["state"] == "kept" and r["entries_before"] == 4
    assert r["reason"] == ("the k8s-configmap path has no merge swap (the source config file and the Prometheus "
                           "resource have one): the agent forwards through 4 per-group entries")
    # an HA pair's entry (AMP's dedup labels after the keep-filter): the merge never guesses what a filter meant
    ha = add_remote_write(config_with("a"), remote_write_entry(group_name="b", name_regex="M_b", url=URL,
                                                               replicas=ReplicaPolicy(replica_label="replica")))
    source = FakeSource(ha)
    step = retire(FakeAudit(BAKED), lambda: (cap_of(source=source, probe=FakeProbe({}), names=lambda:
                                                    remote_write_names(source.data)), "remote_write"), groups="ab")
    r = step.consolidate(T0)["targets"]["tgt"]
    assert r["state"] == "kept" and r["reason"].startswith("the merge cannot read the entries back: ")
    assert "merge it by hand" in r["reason"] and source.data == ha and source.writes == 0
    # a swap that cannot be built (the target's connection refused): kept, the retire goes on
    def broken() -> tuple[Any, str]:
        raise RuntimeError("workspace ws-1 not found\ntraceback...")
    r = retire(FakeAudit(BAKED), broken).consolidate(T0)["targets"]["tgt"]
    assert r["state"] == "kept" and r["reason"] == "the queue swap cannot be built: workspace ws-1 not found"
    # its text is redacted on entry: a credential in the error never reaches the record
    def leaky() -> tuple[Any, str]:
        raise RuntimeError("GET https://svc:hunter2@prom.internal/api/v1/status/config?token=abc123 refused")
    r = retire(FakeAudit(BAKED), leaky).consolidate(T0)["targets"]["tgt"]
    assert "hunter2" not in r["reason"] and "abc123" not in r["reason"] and r["reason"].endswith(" refused")
    # the managed collector adds no source queue: nothing to merge
    r = retire(FakeAudit(BAKED), lambda: (None, "scraper")).consolidate(T0)["targets"]["tgt"]
    assert r["state"] == "kept" and r["reason"] == "the scraper path adds no source queue"


def test_a_swap_never_proven_or_failing_mid_way_is_undone_byte_for_byte_and_the_retire_goes_on() -> None:
    before = config_with("a", "b", "c")
    source, clock = FakeSource(before), Clock()
    audit = FakeAudit(BAKED)
    never = FakeProbe({g: 1 for g in "abc"}, sending=False)  # the merged queue never sends
    r = retire(audit, lambda: (cap_of(source=source, probe=never, clock=clock), "remote_write"),
               groups="abc").consolidate(T0)["targets"]["tgt"]
    assert r["state"] == "undone" and "not proven in 60s" in r["reason"] and source.data == before
    assert audit.kinds() == ["source:src queue_swap_added", "source:src queue_swap_undone",
                             "source:src source_queues_consolidated"]
    assert audit.appended[1][1]["restored_identical"] is True

    # The removal's reload fails after a good proof: the add is taken back, never into the switch half-swapped.
    class FailingRemoval(FakeSource):
        def deployer_for(self, change: Any) -> Any:
            if change.describe.startswith("remove"):
                self.fail_next = True
            return super().deployer_for(change)

    source, audit = FailingRemoval(before), FakeAudit(BAKED)
    r = retire(audit, lambda: (cap_of(source=source, probe=FakeProbe({g: 1 for g in "abc"}), clock=Clock()),
                               "remote_write"), groups="abc").consolidate(T0)["targets"]["tgt"]
    assert r["state"] == "undone" and r["reason"] == "the swap failed and was undone: reload refused"
    assert source.data == before and [q.groups() for q in promshift_queues(source.data)] == [("a",), ("b",), ("c",)]
    assert audit.kinds()[-2:] == ["source:src queue_swap_undone", "source:src source_queues_consolidated"]


def test_an_agent_already_is_left_as_it_is() -> None:
    built: list[int] = []
    step = retire(FakeAudit(BAKED), lambda: built.append(1) or (None, "remote_write"), mode="agent")
    assert step.consolidate(T0) == {"already_agent": True, "targets": {}, "lines": []}
    assert built == []

