"""A queue swap on prometheus-operator's ``Prometheus`` resource: its ``spec.remoteWrite`` seen as a config.

The swap's logic (``core.queues``: ``plan_merge``, ``plan_leave``, ``swap_phase``, ``with_added``...) reads and
edits a Prometheus config's ``remote_write`` list. On the Kubernetes path the list is the resource's
``spec.remoteWrite`` (``RemoteWriteSpec`` spelling: ``writeRelabelConfigs``, ``queueConfig``...), which the
operator renders into the server's config. So the same logic runs on a *view*:

- ``remote_write_view(entries)``: the resource's entries as a config holding only ``remote_write`` (promshift's
  entries in Prometheus-config spelling, exactly what the operator renders; another team's entry only by its
  name and URL, which is all a swap reads of it; an unnamed one not at all);
- ``resource_edit(entries, before, after)``: what a swap's edit of the view (``after``, from the view
  ``before``) makes of the resource's list. Only promshift entries move: the names the edit removed go, the
  entries it added are appended in the operator's spelling, and every other item stays the very value it was
  (another team's entries, in their place). An edit that changes an entry in place, or touches another team's,
  is refused: a live queue is never edited.

Pure: the shell's deployer (``adapters.k8s_edits``) reads the resource, writes it under its ``resourceVersion``,
and restores the snapshot's list as it was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from promshift.core.git_render import config_entry, operator_entry
from promshift.core.render import RenderError, add_remote_write, is_promshift_name, remote_write_entries


def _name(entry: Any) -> str:
    return str(entry.get("name") or "") if isinstance(entry, Mapping) else ""


def _viewed(entry: Any) -> dict[str, Any] | None:
    if not isinstance(entry, Mapping):
        raise RenderError("every spec.remoteWrite item must be a mapping")
    if is_promshift_name(_name(entry)):
        return config_entry(entry)
    # Another team's entry: its name and URL are all a swap reads of it; an unnamed one it cannot name at all.
    return {"name": _name(entry), "url": entry.get("url")} if _name(entry) else None


def remote_write_view(entries: Sequence[Any] | None) -> bytes:
    """``spec.remoteWrite`` (None: absent) as the config text a swap reads (``remote_write:`` only).

    Built by ``core.render.add_remote_write`` from an empty config, one entry after the other, so a swap's
    add on the view of a list is the view of the list with that entry appended, and its removal the view
    without it, byte for byte (what ``steps.queues.QueueSwap.undo`` compares)."""
    view = b""
    for entry in entries or ():
        viewed = _viewed(entry)
        if viewed is not None:
            view = add_remote_write(view, viewed)
    return view


def _promshift(view: bytes) -> list[dict[str, Any]]:
    return [e for e in remote_write_entries(view) if is_promshift_name(_name(e))] if view else []


def _others(view: bytes) -> list[dict[str, Any]]:
    return [e for e in remote_write_entries(view) if not is_promshift_name(_name(e))] if view else []


def resource_edit(entries: Sequence[Any] | None, before: bytes, after: bytes) -> list[Any]:
    """The resource's ``spec.remoteWrite`` after the view edit ``before`` -> ``after`` (see the module)."""
    if remote_write_view(entries) != before:
        raise RenderError("spec.remoteWrite changed since the swap read it; read it again")
    old = {_name(e): e for e in _promshift(before)}
    new = _promshift(after)
    if _others(after) != _others(before):
        raise RenderError("a queue swap may edit promshift's remoteWrite entries only")
    for entry in new:
        if _name(entry) in old and old[_name(entry)] != entry:
            raise RenderError(f"remoteWrite {_name(entry)!r} would change in place; a live queue is never edited")
    kept = {_name(e) for e in new}
    removed = set(old) - kept
    added = [operator_entry(e) for e in new if _name(e) not in old]
    return [e for e in entries or () if _name(e) not in removed] + added
