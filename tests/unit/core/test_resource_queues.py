"""A queue swap on the ``Prometheus`` resource's ``spec.remoteWrite``: the view the swap reads, and its edits mapped
back onto the list (promshift's entries only; every other item kept as the value it was)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from promshift.core.git_render import operator_entry
from promshift.core.queues import (
    plan_leave,
    plan_merge,
    promshift_queues,
    swap_phase,
    undo_added,
    with_added,
    with_removed,
)
from promshift.core.render import RenderError, add_remote_write, remote_write_entry, remote_write_names
from promshift.core.resource_queues import remote_write_view, resource_edit

URL = "http://127.0.0.1:9091/api/v1/write"
THEIRS = {"name": "team-thanos", "url": "http://thanos.invalid/api/v1/receive", "remoteTimeout": "30s",
          "basicAuth": {"username": {"name": "thanos", "key": "user"}, "password": {"name": "thanos", "key": "pw"}}}
UNNAMED = {"url": "http://vm.invalid/api/v1/write"}


def group(name: str, **kw: Any) -> dict[str, Any]:
    return operator_entry(remote_write_entry(group_name=name, name_regex=f"M_{name.upper()}_.*", url=URL, **kw))


def spec() -> list[Any]:
    return [copy.deepcopy(THEIRS), group("a"), copy.deepcopy(UNNAMED), group("b", drop_labels=("uuid",)),
            group("c", sigv4={"region": "us-east-1"})]


def edit(entries: list[Any] | None, change: Any) -> list[Any]:
    view = remote_write_view(entries)
    return resource_edit(entries, view, change(view))


def test_the_view_holds_promshift_entries_as_the_operator_renders_them_and_others_by_name_only() -> None:
    entries = spec()
    view = remote_write_view(entries)
    assert remote_write_names(view) == ["team-thanos", "promshift-a", "promshift-b", "promshift-c"]
    assert [q.groups() for q in promshift_queues(view)] == [("a",), ("b",), ("c",)]
    assert promshift_queues(view)[1].members[0].drop_labels == ("uuid",)
    assert b"basicAuth" not in view and b"password" not in view and b"vm.invalid" not in view
    assert remote_write_view(None) == remote_write_view([]) == b""
    assert remote_write_view(entries) == view  # the same list, the same bytes (what an undo compares)


def test_a_merge_edits_only_promshift_entries_and_its_undo_gives_the_list_back_exactly() -> None:
    entries = spec()
    view = remote_write_view(entries)
    swap = plan_merge(view, url=URL, cut_over=["a", "b"])
    assert swap is not None and swap.remove == ("promshift-a", "promshift-b")
    added = edit(entries, lambda v: with_added(v, swap))
    assert added[:5] == entries and added[5]["name"] == swap.added_name
    assert added[5]["writeRelabelConfigs"][0] == {"sourceLabels": ["__name__"], "regex": "M_A_.*",
                                                  "targetLabel": "__tmp_promshift_group", "replacement": "a",
                                                  "action": "replace"}
    # The resource read again reads as the add made it: the swap's phase, its undo and its removal follow.
    assert remote_write_view(added) == with_added(view, swap)
    assert swap_phase(remote_write_view(added), swap) == "added"
    assert edit(added, lambda v: undo_added(v, swap)) == entries
    removed = edit(added, lambda v: with_removed(v, swap))
    assert removed == [THEIRS, UNNAMED, group("c", sigv4={"region": "us-east-1"}), added[5]]
    assert swap_phase(remote_write_view(removed), swap) == "done"
    assert edit(removed, lambda v: with_removed(v, swap)) == removed  # a retried removal: nothing changes


def test_a_group_leaving_the_merged_entry_and_the_last_leaving_leave_the_others_as_they_were() -> None:
    entries = [copy.deepcopy(THEIRS), group("a"), group("b")]
    swap = plan_merge(remote_write_view(entries), url=URL, cut_over=["a", "b"])
    assert swap is not None
    merged = edit(edit(entries, lambda v: with_added(v, swap)), lambda v: with_removed(v, swap))
    for name, rest in (("a", [("b",)]), ("b", [])):
        leave = plan_leave(remote_write_view(merged), group=name)
        assert leave is not None and leave.leaving == name
        merged = edit(edit(merged, lambda v, s=leave: with_added(v, s)), lambda v, s=leave: with_removed(v, s))
        assert [q.groups() for q in promshift_queues(remote_write_view(merged))] == rest
    assert merged == [THEIRS]
    alone = [group("a"), group("b")]  # no one else's entry: the list is empty once the last one left
    swap = plan_merge(remote_write_view(alone), url=URL, cut_over=["a", "b"])
    assert swap is not None
    merged = edit(edit(alone, lambda v: with_added(v, swap)), lambda v: with_removed(v, swap))
    for name in ("a", "b"):
        leave = plan_leave(remote_write_view(merged), group=name)
        assert leave is not None
        merged = edit(edit(merged, lambda v, s=leave: with_added(v, s)), lambda v, s=leave: with_removed(v, s))
    assert merged == []


def test_an_edit_is_refused_when_the_list_changed_or_it_would_touch_another_entry() -> None:
    entries = spec()
    view = remote_write_view(entries)
    swap = plan_merge(view, url=URL, cut_over=["a"])
    assert swap is not None
    moved = [*entries, {"name": "team-vm", "url": "http://vm.invalid/w"}]
    with pytest.raises(RenderError, match="changed since the swap read it"):
        resource_edit(moved, view, with_added(view, swap))
    with pytest.raises(RenderError, match="promshift's remoteWrite entries only"):
        resource_edit(entries, view, add_remote_write(view, {"name": "team-vm", "url": "http://vm.invalid/w"}))
    changed = view.replace(b'"M_A_.*"', b'"M_A_.+"')
    assert changed != view
    with pytest.raises(RenderError, match="would change in place"):
        resource_edit(entries, view, changed)
    with pytest.raises(RenderError, match="must be a mapping"):
        remote_write_view(["not-an-entry"])
