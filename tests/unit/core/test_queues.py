"""Bounded write queues: the merged entry's render, the swaps that merge and leave, the cap's pre-flight."""

from __future__ import annotations

import pytest
import yaml

from promshift.core.queues import (
    DEFAULT_QUEUE_CAP,
    QueueCapError,
    admit_dual_write,
    check_admission,
    check_queue_cap,
    fresh_series_query,
    plan_leave,
    plan_merge,
    promshift_queues,
    queue_sent_samples,
    swap_phase,
    swap_proof,
    undo_added,
    with_added,
    with_removed,
)
from promshift.core.render import (
    MEMBER_LABEL,
    QueueMember,
    RenderError,
    add_remote_write,
    merged_entry_name,
    merged_remote_write_entry,
    queue_members,
    remote_write_entry,
    remote_write_names,
)
from promshift.core.verdicts import Verdict

URL = "http://127.0.0.1:9091/api/v1/write"
OTHER = "http://127.0.0.1:9092/api/v1/write"
BASE = b"""# the team's own comment
global:
  scrape_interval: 15s   # kept
remote_write:
- name: other-team
  url: http://example.invalid/api/v1/write
"""


def with_groups(*groups: str, url: str = URL, drops: dict[str, tuple[str, ...]] | None = None,
                base: bytes = BASE) -> bytes:
    config = base
    for g in groups:
        config = add_remote_write(config, remote_write_entry(group_name=g, name_regex=f"M_{g.upper()}|N_{g.upper()}",
                                                             url=url, drop_labels=(drops or {}).get(g, ())))
    return config


def test_a_merged_entry_names_every_member_and_reads_back_exactly() -> None:
    members = [QueueMember("b", "B1|B2", ("pod",)), QueueMember("a", "A")]
    entry = merged_remote_write_entry(members=members, url=URL)
    assert entry["name"] == merged_entry_name(URL, ["a", "b"]) == merged_entry_name(URL, ["b", "a"])
    assert entry["name"] != merged_entry_name(URL, ["a"]) != merged_entry_name(OTHER, ["a", "b"])
    rules = entry["write_relabel_configs"]
    assert [r["replacement"] for r in rules[:2]] == ["a", "b"]  # name order: one member set, one entry
    assert rules[2] == {"source_labels": [MEMBER_LABEL], "regex": ".+", "action": "keep"}
    assert rules[3] == {"source_labels": [MEMBER_LABEL], "regex": "b", "target_label": "pod", "replacement": "",
                        "action": "replace"}
    assert rules[-1] == {"regex": MEMBER_LABEL, "action": "labeldrop"}
    assert queue_members(entry) == (QueueMember("a", "A"), QueueMember("b", "B1|B2", ("pod",)))


def test_a_merged_entry_edited_by_hand_or_a_strange_group_entry_is_refused() -> None:
    entry = merged_remote_write_entry(members=[QueueMember("a", "A")], url=URL)
    entry["write_relabel_configs"].insert(0, {"regex": "x", "action": "labeldrop"})
    with pytest.raises(RenderError, match="not the shape promshift writes"):
        queue_members(entry)
    hand = remote_write_entry(group_name="a", name_regex="A", url=URL)
    hand["write_relabel_configs"][0]["action"] = "drop"
    with pytest.raises(RenderError, match="not the shape promshift writes"):
        queue_members(hand)
    with pytest.raises(RenderError, match="catalog group names"):
        merged_remote_write_entry(members=[QueueMember("A.*", "A")], url=URL)


def test_merge_takes_only_cut_over_groups_of_that_target_and_keeps_their_filters() -> None:
    config = with_groups("a", "b", "c", drops={"b": ("pod",)})
    config = with_groups("z", url=OTHER, base=config)
    swap = plan_merge(config, url=URL, cut_over=["a", "b", "z"])
    assert swap is not None and swap.kind == "merge"
    assert swap.remove == ("promshift-a", "promshift-b")
    assert [m.group for m in swap.prove] == ["a", "b"]
    assert swap.add is not None
    assert queue_members(swap.add) == (QueueMember("a", "M_A|N_A"), QueueMember("b", "M_B|N_B", ("pod",)))
    assert plan_merge(config, url=URL, cut_over=["c-not-cut"]) is None


def test_the_swap_adds_then_removes_and_every_other_byte_stays() -> None:
    config = with_groups("a", "b", "c")
    swap = plan_merge(config, url=URL, cut_over=["a", "b", "c"])
    assert swap is not None
    assert swap_phase(config, swap) == "start"
    added = with_added(config, swap)
    assert swap_phase(added, swap) == "added"
    assert added.startswith(config)  # the new entry goes after the live ones; nothing before it moves
    assert with_added(added, swap) == added  # a retried add is a no-op
    done = with_removed(added, swap)
    assert swap_phase(done, swap) == "done"
    assert with_removed(done, swap) == done  # a retried removal too
    assert remote_write_names(done) == ["other-team", swap.added_name]
    assert done.startswith(BASE)
    # Before its removal a swap is undone byte for byte; after it, only a leave swap undoes it.
    assert undo_added(added, swap) == config
    with pytest.raises(RenderError, match="leave swap"):
        undo_added(done, swap)


def test_a_second_merge_folds_the_old_merged_entry_into_a_new_one() -> None:
    config = with_groups("a", "b", "c")
    first = plan_merge(config, url=URL, cut_over=["a", "b", "c"])
    assert first is not None
    config = with_removed(with_added(config, first), first)
    config = with_groups("d", "e", base=config)
    second = plan_merge(config, url=URL, cut_over=["a", "b", "c", "d"])
    assert second is not None
    assert second.remove == (first.added_name, "promshift-d")
    assert [m.group for m in second.prove] == ["a", "b", "c", "d"]
    config = with_removed(with_added(config, second), second)
    assert [q.groups() for q in promshift_queues(config)] == [("e",), ("a", "b", "c", "d")]


def test_a_swap_interrupted_after_its_add_resumes_to_the_same_end() -> None:
    config = with_groups("a", "b", "c")
    first = plan_merge(config, url=URL, cut_over=["a", "b", "c"])
    assert first is not None
    config = with_removed(with_added(config, first), first)
    config = with_groups("d", base=config)
    second = plan_merge(config, url=URL, cut_over=["d"])
    assert second is not None
    crashed = with_added(config, second)  # the worker died during the proof
    resumed = plan_merge(crashed, url=URL, cut_over=["d"])
    assert resumed is not None
    assert (resumed.added_name, set(resumed.remove)) == (second.added_name, set(second.remove))
    assert swap_phase(crashed, resumed) == "added"
    assert with_removed(crashed, resumed) == with_removed(with_added(config, second), second)


def test_a_group_leaves_the_merged_entry_by_one_more_swap() -> None:
    config = with_groups("a", "b", "c")
    merge = plan_merge(config, url=URL, cut_over=["a", "b", "c"])
    assert merge is not None
    merged = with_removed(with_added(config, merge), merge)
    leave = plan_leave(merged, group="b")
    assert leave is not None and leave.kind == "leave" and leave.leaving == "b"
    assert [m.group for m in leave.prove] == ["a", "c"]
    assert leave.remove == (merge.added_name,)
    after = with_removed(with_added(merged, leave), leave)
    assert [q.groups() for q in promshift_queues(after)] == [("a", "c")]
    assert plan_leave(after, group="b") is None  # retried: nothing left to do
    # The last member leaving adds nothing: the merged entry just goes, and the source is as it began.
    for group in ("a", "c"):
        swap = plan_leave(after, group=group)
        assert swap is not None
        after = with_removed(with_added(after, swap), swap)
    assert after == BASE


def test_members_that_sign_differently_never_share_a_queue() -> None:
    config = add_remote_write(BASE, remote_write_entry(group_name="a", name_regex="A", url=URL,
                                                       sigv4={"region": "eu-west-1"}))
    config = with_groups("b", base=config)
    with pytest.raises(RenderError, match="sign or queue differently"):
        plan_merge(config, url=URL, cut_over=["a", "b"])


def test_the_same_settings_written_in_another_key_order_share_a_queue() -> None:
    """A ``Prometheus`` resource gives its entries back in the order each was written: the same sigv4 and
    queue_config in another key order are the same settings (measured in the k8s-cr e2e: a group's entry came back
    with ``queue_config``'s keys reordered and the retire's merge was refused for it)."""
    entries = [{"name": f"promshift-{g}", "url": URL, "sigv4": sigv4, "queue_config": queue,
                "write_relabel_configs": [{"source_labels": ["__name__"], "regex": f"M_{g.upper()}",
                                           "action": "keep"}]}
               for g, sigv4, queue in (("a", {"region": "us-east-1", "role_arn": "arn:aws:iam::1:role/w"},
                                        {"capacity": 2500, "max_shards": 200}),
                                       ("b", {"role_arn": "arn:aws:iam::1:role/w", "region": "us-east-1"},
                                        {"max_shards": 200, "capacity": 2500}))]
    config = BASE.replace(b"remote_write:\n- name: other-team\n  url: http://example.invalid/api/v1/write\n",
                          b"remote_write:\n" + yaml.safe_dump(entries, sort_keys=False).encode())
    assert [q.name for q in promshift_queues(config)] == ["promshift-a", "promshift-b"]
    assert plan_merge(config, url=URL, cut_over=["a", "b"]) is not None
    # a real difference still refuses
    entries[1]["queue_config"] = {"max_shards": 50, "capacity": 2500}
    config = BASE.replace(b"remote_write:\n- name: other-team\n  url: http://example.invalid/api/v1/write\n",
                          b"remote_write:\n" + yaml.safe_dump(entries, sort_keys=False).encode())
    with pytest.raises(RenderError, match="sign or queue differently"):
        plan_merge(config, url=URL, cut_over=["a", "b"])


def test_the_cap_admits_merges_first_or_refuses_in_one_line() -> None:
    assert DEFAULT_QUEUE_CAP == 4
    config = with_groups("a", "b", "c", "d")
    fine = admit_dual_write(with_groups("a", "b"), group="e", url=URL, cap=4, cut_over=[])
    assert fine.allowed and fine.merge_first is None
    refused = admit_dual_write(config, group="e", url=URL, cap=4, cut_over=[])
    assert not refused.allowed
    assert "4 promshift remote_write queues (cap 4)" in refused.reason and "\n" not in refused.reason
    with pytest.raises(QueueCapError, match="cap 4"):
        check_admission(refused)
    # One cut-over group alone frees nothing (its entry becomes the merged one): still refused.
    assert not admit_dual_write(config, group="e", url=URL, cap=4, cut_over=["a"]).allowed
    merge_first = admit_dual_write(config, group="e", url=URL, cap=4, cut_over=["a", "b"])
    assert merge_first.allowed and merge_first.merge_first is not None
    assert merge_first.merge_first.remove == ("promshift-a", "promshift-b")
    # A retried deploy of a group already there is never refused.
    assert admit_dual_write(config, group="d", url=URL, cap=4, cut_over=[]).allowed
    # Other teams' entries are theirs: never counted.
    assert admit_dual_write(with_groups("a", "b", "c"), group="e", url=URL, cap=4, cut_over=[]).allowed


@pytest.mark.parametrize("value", [0, -1, 65, "4", 2.0, True, None])
def test_a_bad_cap_is_one_clear_line(value: object) -> None:
    with pytest.raises(ValueError, match="integer from 1 to 64"):
        check_queue_cap(value)


def test_the_proof_passes_only_on_every_series_fresh_and_the_queue_sending() -> None:
    ok = swap_proof(["a", "b"], source_series={"a": 10, "b": 5}, target_fresh={"a": 10, "b": 5},
                    merged_sent=15, expected_sent=15)
    assert ok.verdict is Verdict.SUCCESSFUL
    assert ok.to_dict()["per_group"]["a"] == {"source": 10, "target": 10}
    short = swap_proof(["a", "b"], source_series={"a": 10, "b": 5}, target_fresh={"a": 10, "b": 4},
                       merged_sent=100, expected_sent=15)
    assert short.verdict is Verdict.INCONCLUSIVE and "b 4/5" in short.reason
    idle = swap_proof(["a"], source_series={"a": 10}, target_fresh={"a": 10}, merged_sent=None, expected_sent=10)
    assert idle.verdict is Verdict.INCONCLUSIVE and "not seen" in idle.reason
    slow = swap_proof(["a"], source_series={"a": 10}, target_fresh={"a": 10}, merged_sent=9, expected_sent=10)
    assert slow.verdict is Verdict.INCONCLUSIVE
    empty = swap_proof(["a"], source_series={"a": 0}, target_fresh={"a": 0}, merged_sent=50, expected_sent=0)
    assert empty.verdict is Verdict.INCONCLUSIVE and "no series on the source" in empty.reason


def test_queries_and_counters_of_the_proof() -> None:
    query = fresh_series_query(QueueMember("a", "A|B"), since=100.5, extra_matchers=',run="x"')
    assert query == ('count(timestamp(label_replace({__name__=~"A|B",run="x"}, "promshift_metric_name", "$1", '
                     '"__name__", "(.+)")) > 100.500) or vector(0)')
    text = ('prometheus_remote_storage_samples_total{remote_name="promshift-a",url="u"} 12\n'
            'prometheus_remote_storage_samples_total{remote_name="promshift-ab",url="u"} 99\n')
    assert queue_sent_samples(text, "promshift-a") == 12
    assert queue_sent_samples(text, "promshift-b") is None


def test_an_entry_list_loads_as_yaml_12_and_11_alike() -> None:
    config = with_groups("a", "b")
    swap = plan_merge(config, url=URL, cut_over=["a", "b"])
    assert swap is not None
    text = with_added(config, swap).decode()
    assert yaml.safe_load(text)["remote_write"][-1] == swap.add


def test_the_entry_carrying_a_group_is_its_own_then_the_merged_one() -> None:
    from promshift.core.queues import carrying_entry

    config = with_groups("a", "b")
    assert carrying_entry(config, "a") == "promshift-a" and carrying_entry(config, "z") is None
    swap = plan_merge(config, url=URL, cut_over=["a", "b"])
    assert swap is not None
    assert carrying_entry(with_added(config, swap), "a") == swap.added_name  # mid-swap: the one that stays
    assert carrying_entry(with_removed(with_added(config, swap), swap), "b") == swap.added_name


def test_the_carrying_entry_is_found_in_the_config_a_server_reports_too() -> None:
    from promshift.core.queues import carrying_entry

    config = with_groups("a", "b")
    swap = plan_merge(config, url=URL, cut_over=["a", "b"])
    assert swap is not None
    loaded = yaml.safe_load(with_removed(with_added(config, swap), swap))
    # What /api/v1/status/config shows: defaults filled in, the empty replacement left out.
    for entry in loaded["remote_write"]:
        entry["remote_timeout"] = "30s"
        for rule in entry.get("write_relabel_configs", []):
            rule.setdefault("separator", ";")
            if rule.get("replacement") == "":
                del rule["replacement"]
    text = yaml.safe_dump(loaded)
    assert carrying_entry(text, "b") == swap.added_name
    assert carrying_entry(text, "z") is None


def test_the_cap_on_loaded_names_counts_promshift_entries_only_and_never_merges() -> None:
    from promshift.core.queues import admit_loaded, own_entry_groups

    names = ["other", "promshift-a", "promshift-b", "promshift--merged-0123456789ab", "promshift-c"]
    assert own_entry_groups(names) == ["a", "b", "c"]
    assert admit_loaded(names[:3], group="e", cap=4).allowed
    assert admit_loaded(names, group="c", cap=4).allowed  # a retry: its own entry is there
    refused = admit_loaded(names, group="e", cap=4, cut_over=["a", "zz"])
    assert not refused.allowed and refused.count == 4 and refused.merge_first is None
    assert refused.reason == ("source already carries 4 promshift remote_write queues (cap 4) and none can be merged "
                              "(1 of them cut over, but a merge swap is built on the file path and the Prometheus "
                              "resource only); cut one over or raise the cap before 'e'")
    assert "no group among them has cut over" in admit_loaded(names, group="e", cap=4).reason
    assert "run again to merge them" in admit_loaded(names, group="e", cap=4, cut_over=["a"], can_merge=True).reason


def test_under_the_cap_nothing_is_parsed_so_an_entry_promshift_cannot_merge_blocks_nobody() -> None:
    odd = add_remote_write(BASE, {"name": "promshift-ha", "url": URL, "write_relabel_configs": [
        {"source_labels": ["__name__"], "regex": "X", "action": "keep"},
        {"source_labels": ["prometheus_replica"], "target_label": "__replica__", "action": "replace"}]})
    assert admit_dual_write(odd, group="e", url=URL, cap=4, cut_over=["ha"]).allowed
    with pytest.raises(RenderError, match="not the shape promshift writes"):
        admit_dual_write(with_groups("a", "b", "c", base=odd), group="e", url=URL, cap=4, cut_over=["a", "b"])


def test_the_cap_comes_from_the_connection_else_the_catalog_and_a_bad_one_fails_closed() -> None:
    from promshift.core.queues import queue_cap_of

    assert queue_cap_of(None, 4, conn_id="src") == 4
    assert queue_cap_of(None, 7, conn_id="src") == 7
    assert queue_cap_of(12, 4, conn_id="src") == 12
    for bad in ("12", 0, 65, True, 3.0):
        with pytest.raises(ValueError, match=r"connection 'src' extra.max_queues must be an integer from 1 to 64"):
            queue_cap_of(bad, 4, conn_id="src")


# -- the overlap's guard ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("window", "scrape", "refused"), [
    (None, 15, "is unknown"), (0, 15, "accepts no out-of-order samples"), (-5, 15, "accepts no out-of-order"),
    (float("nan"), 15, "accepts no out-of-order"), (29, 1, "shorter than the 30s"), (30, 1, None),
    (59, 30, "shorter than the 60s"), (60, 30, None), (60, 60, "shorter than the 120s"), (600, 60, None),
    (float("inf"), 300, None)])
def test_an_overlap_needs_an_out_of_order_window_of_two_scrapes_and_at_least_30s(
        window: float | None, scrape: float, refused: str | None) -> None:
    from promshift.core.queues import overlap_refusal, overlap_window_needed

    line = overlap_refusal(window, scrape_interval_s=scrape, origin="from somewhere")
    if refused is None:
        assert line is None
        return
    assert line is not None and refused in line and "\n" not in line and "(from somewhere)" in line
    assert f"at least {overlap_window_needed(scrape):g}s" in line


@pytest.mark.parametrize(("text", "seconds"), [
    ("global:\n  scrape_interval: 15s\n", 0.0), ("", 0.0), ("storage:\n  exemplars:\n    max_exemplars: 5\n", 0.0),
    ("storage:\n  tsdb:\n    out_of_order_time_window: 1h\n", 3600.0),
    ("storage:\n  tsdb:\n    out_of_order_time_window: 0s\n", 0.0),
    ("storage:\n  tsdb:\n    out_of_order_time_window: 1m30s\n", 90.0)])
def test_a_prometheus_configs_out_of_order_window(text: str, seconds: float) -> None:
    from promshift.core.queues import out_of_order_window_of

    assert out_of_order_window_of(text) == seconds


def test_a_malformed_out_of_order_window_is_a_one_line_error() -> None:
    from promshift.core.queues import out_of_order_window_of

    with pytest.raises(ValueError, match="invalid duration"):
        out_of_order_window_of("storage:\n  tsdb:\n    out_of_order_time_window: soon\n")
    with pytest.raises(ValueError, match="not a YAML mapping"):
        out_of_order_window_of("- a\n")
