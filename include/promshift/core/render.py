"""Edit a Prometheus config's ``remote_write`` list in place: every other byte of the file stays.

Each metric group gets its own ``remote_write`` entry with a keep-filter. A live entry is
never edited: measured on Prometheus 2.42, editing a live entry's regex restarts its queue
and lost ~8 % of a scrape, while adding a new entry left the other queues untouched.

The user's document is never loaded and dumped again (that loses comments, renames anchors
and, YAML 1.1 against 1.2, turns ``on`` into ``true``, ``1.10`` into ``1.1`` and ``010``
into ``8``). A parser's event stream only finds positions (LibYAML's, at C speed, when PyYAML has
it; else ruamel.yaml's), counted against the source config's input budget (``core.inputs.CONFIG``:
an alias bomb is refused at its first alias past the budget); the edit splices text:

- add: our entry's lines go in at the start of the line after the last content of the
  ``remote_write`` list (after the whole document when the key is missing, in which case a
  ``remote_write:`` key line marked ``# added by promshift`` goes in too), in the file's own
  newline style and indentation; a flow list (``remote_write: []``) gets a one-line flow
  entry before its ``]``. Every string we write is double-quoted, so YAML 1.1 (Prometheus'
  go-yaml v2) and 1.2 read the same value.
- remove: exactly the lines of the entry (and the marked key line when the list becomes
  empty), so add then remove gives back the original text.
- every edit is checked after the fact, or it raises instead of returning. With LibYAML: the
  edited text's events must be the original's with exactly our entry's events added (or
  removed) at the end of ``remote_write`` (so every other value is unchanged under any schema),
  and those events, read under the YAML 1.1 (PyYAML) and YAML 1.2 (ruamel.yaml) schemas, must
  give exactly the entry. Otherwise (no LibYAML, a text it refuses, non-standard tags): the
  document, loaded whole by a YAML 1.2 and a YAML 1.1 loader, must equal the original with our
  entry appended (or removed) and nothing else changed.

``add_remote_write`` and ``remove_remote_write`` take ``str`` or ``bytes`` and return the
same type. Give them bytes to keep everything exact: a str read with Python's universal
newlines has already turned CRLF into LF. Bytes must be UTF-8 (a BOM is kept as it is).
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from promshift.core.catalog import ReplicaPolicy
from promshift.core.ha import dedup_relabel
from promshift.core.inputs import clip
from promshift.core.memory import cyclic_gc_paused
from promshift.core.redact import redact_text
from promshift.core.render_yaml import (
    _BREAK_CHARS,
    ADDED_KEY_COMMENT,
    BlockScalarAtEnd,  # noqa: F401 - raised by the edits; callers catch it from here
    Config,
    RenderError,
    _append_splice,
    _both_loads,
    _break_before,
    _canon,
    _column,
    _dash_before,
    _decode,
    _Doc,
    _flow_cut,
    _line_start,
    _load,
    _next_line,
    _Node,
    _nodes_of_keys,
    _parse,
    _root_mapping,
    _schema,
    _Splice,
    _spliced,
    _take_nodes,
    _value,
    _walk,
)

ENTRY_PREFIX = "promshift-"
# AWS's recommended remote_write queue settings for AMP (AMP user guide, remote write to AMP).
AMP_QUEUE_CONFIG: Mapping[str, int] = {"max_samples_per_send": 1000, "max_shards": 200, "capacity": 2500}
KEY = "remote_write"


def remote_write_name(group_name: str) -> str:
    """The ``remote_write`` entry name promshift owns for a group."""
    return f"{ENTRY_PREFIX}{group_name}"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    return sha256_bytes(text.encode())


def remote_write_entry(
    *,
    group_name: str,
    name_regex: str,
    url: str,
    queue_config: Mapping[str, Any] | None = None,
    sigv4: Mapping[str, str] | None = None,
    drop_labels: tuple[str, ...] = (),
    replicas: ReplicaPolicy | None = None,
) -> dict[str, Any]:
    """The remote_write entry that dual-writes exactly the group's metrics to ``url``.

    ``replicas`` (a source declared as an HA pair) add AMP's dedup labels after them (``core.ha.dedup_relabel``:
    the replica label becomes ``__replica__``, the cluster label ``cluster``), so the workspace keeps one replica.

    ``drop_labels`` (the group's declared drops) add one ``labeldrop`` after the keep filter,
    its regex the names' exact alternation; none, no rule (the entry is as before).

    Prometheus anchors relabel regexes, so ``name_regex`` must match whole names. With
    ``sigv4`` (``{region, role_arn?}``, an AMP target) the entry signs its writes and, unless
    ``queue_config`` says otherwise, uses AMP's recommended queue settings.
    """
    entry: dict[str, Any] = {
        "name": remote_write_name(group_name),
        "url": url,
        "write_relabel_configs": [
            {"source_labels": ["__name__"], "regex": name_regex, "action": "keep"},
        ],
    }
    if drop_labels:
        # Label names ([a-zA-Z_][a-zA-Z0-9_]*) need no escaping in a regex.
        entry["write_relabel_configs"].append({"regex": "|".join(drop_labels), "action": "labeldrop"})
    if replicas is not None:
        entry["write_relabel_configs"].extend(dedup_relabel(replicas))
    entry.update(_write_settings(queue_config, sigv4))
    return entry


def _write_settings(queue_config: Mapping[str, Any] | None, sigv4: Mapping[str, str] | None) -> dict[str, Any]:
    """An entry's ``sigv4`` and ``queue_config`` keys (a signed target gets AMP's queue settings by default)."""
    settings: dict[str, Any] = {}
    if sigv4 is not None:
        if not sigv4.get("region"):
            raise RenderError("a sigv4 remote_write needs a region")
        settings["sigv4"] = {k: str(sigv4[k]) for k in ("region", "role_arn") if sigv4.get(k)}
        queue_config = queue_config or AMP_QUEUE_CONFIG
    if queue_config:
        settings["queue_config"] = dict(queue_config)
    return settings


# -- merged entries (bounded write queues) --------------------------------------------------------
#
# Every remote_write entry keeps its own queue tailing the WAL (prometheus/prometheus#13174), so groups
# that have cut over share one entry per (source, target). A merged entry never changes either: a new
# member set is a new entry (its name carries a digest of its members and URL), added beside the old
# ones and proven before they go (``steps.queues``). Its relabel rules name every member:
#
#   1. per member: ``replace`` ``__tmp_promshift_group`` with the member's name when ``__name__``
#      matches the member's keep regex (the member's own keep filter, unchanged);
#   2. ``keep`` what got a member (the union of the keep filters);
#   3. per declared drop of a member: ``replace`` the label with "" when the member claimed the series
#      (Prometheus deletes a label replaced by an empty value: the member's labeldrop, for its series only);
#   4. ``labeldrop`` the marker, so the target sees exactly the series the per-group entries sent.
#
# Relabelling runs once per series when a queue reads it from the WAL (not per sample), so the rules
# cost what the per-group entries' filters cost together, in one queue instead of one each.

MERGED_PREFIX = f"{ENTRY_PREFIX}-merged-"  # "promshift--merged-": no group's entry (group names start with a letter)
MEMBER_LABEL = "__tmp_promshift_group"
_MEMBER_NAME = re.compile(r"[a-z][a-z0-9-]*")  # the catalog's group names: literal as a regex, as a label value


@dataclass(frozen=True)
class QueueMember:
    """One group's share of a promshift entry: its keep regex on ``__name__`` and its declared label drops."""

    group: str
    name_regex: str
    drop_labels: tuple[str, ...] = ()


def is_merged_name(name: str) -> bool:
    """Whether ``name`` is a merged entry's (``promshift--merged-...``)."""
    return name.startswith(MERGED_PREFIX)


def is_promshift_name(name: str) -> bool:
    """Whether promshift owns the ``remote_write`` entry called ``name`` (a group's or a merged one)."""
    return name.startswith(ENTRY_PREFIX)


def merged_entry_name(url: str, members: Iterable[str]) -> str:
    """The merged entry's name: a digest of its URL and member set (a new member set is a new entry)."""
    digest = hashlib.sha256(json.dumps([url, sorted(set(members))]).encode()).hexdigest()[:12]
    return f"{MERGED_PREFIX}{digest}"


def merged_remote_write_entry(
    *,
    members: Iterable[QueueMember],
    url: str,
    queue_config: Mapping[str, Any] | None = None,
    sigv4: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The one entry that writes every member's series to ``url``, as each member's own entry did.

    Members are written in name order, so the same member set always renders the same entry
    (a retried swap adds nothing twice). ``queue_config``/``sigv4`` as in ``remote_write_entry``.
    """
    by_name: dict[str, QueueMember] = {}
    for member in members:
        if member.group in by_name and by_name[member.group] != member:
            raise RenderError(f"group {member.group!r} appears twice with different filters")
        by_name[member.group] = member
    if not all(_MEMBER_NAME.fullmatch(name) for name in by_name):
        raise RenderError("a merged entry's groups must be catalog group names ([a-z][a-z0-9-]*)")
    if not by_name:
        raise RenderError("a merged remote_write entry needs at least one group")
    ordered = [by_name[name] for name in sorted(by_name)]
    rules: list[dict[str, Any]] = [
        {"source_labels": ["__name__"], "regex": m.name_regex, "target_label": MEMBER_LABEL,
         "replacement": m.group, "action": "replace"} for m in ordered]
    rules.append({"source_labels": [MEMBER_LABEL], "regex": ".+", "action": "keep"})
    for m in ordered:
        for label in m.drop_labels:
            rules.append({"source_labels": [MEMBER_LABEL], "regex": m.group, "target_label": label,
                          "replacement": "", "action": "replace"})
    rules.append({"regex": MEMBER_LABEL, "action": "labeldrop"})
    entry: dict[str, Any] = {"name": merged_entry_name(url, by_name), "url": url, "write_relabel_configs": rules}
    entry.update(_write_settings(queue_config, sigv4))  # the members' own signing and queue: only relabelling differs
    return entry


def queue_members(entry: Mapping[str, Any]) -> tuple[QueueMember, ...]:
    """The groups a promshift entry writes, read back from the entry itself (a group's or a merged one).

    Only the shapes ``remote_write_entry`` and ``merged_remote_write_entry`` write are read; any other
    (an entry edited by hand) is refused, so a merge never guesses what a filter meant.
    """
    name = str(entry.get("name", ""))
    rules = entry.get("write_relabel_configs")
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise RenderError(f"remote_write entry {name!r} has no write_relabel_configs list")
    if not is_merged_name(name):
        group = name[len(ENTRY_PREFIX):]
        keep = rules[0] if rules else {}
        drops: tuple[str, ...] = ()
        if len(rules) == 2 and rules[1].get("action") == "labeldrop" and set(rules[1]) == {"regex", "action"}:
            drops = tuple(str(rules[1]["regex"]).split("|"))
        elif len(rules) != 1:
            raise RenderError(f"remote_write entry {name!r} is not the shape promshift writes; merge it by hand")
        if keep != {"source_labels": ["__name__"], "regex": keep.get("regex"), "action": "keep"} or not group:
            raise RenderError(f"remote_write entry {name!r} is not the shape promshift writes; merge it by hand")
        return (QueueMember(group, str(keep["regex"]), drops),)
    regex: dict[str, str] = {}
    drops_of: dict[str, list[str]] = {}
    for rule in rules:
        if rule.get("target_label") == MEMBER_LABEL and rule.get("action") == "replace":
            regex[str(rule["replacement"])] = str(rule["regex"])
        elif rule.get("action") == "replace" and rule.get("source_labels") == [MEMBER_LABEL]:
            group = rule.get("regex") if rule.get("regex") in regex else None
            if group is None:
                raise RenderError(f"merged entry {name!r} drops a label for an unknown group; merge it by hand")
            drops_of.setdefault(group, []).append(str(rule["target_label"]))
    members = tuple(QueueMember(g, regex[g], tuple(drops_of.get(g, ()))) for g in sorted(regex))
    if not members or merged_remote_write_entry(members=members, url=str(entry.get("url")),
                                                queue_config=entry.get("queue_config"),
                                                sigv4=entry.get("sigv4")) != dict(entry):
        raise RenderError(f"merged entry {name!r} is not the shape promshift writes; merge it by hand")
    return members


def remote_write_entries(config: str | bytes) -> list[dict[str, Any]]:
    """Every ``remote_write`` entry of a config as loaded (YAML 1.2), in order; a non-mapping item is refused."""
    entries = _read_entries(config)
    if not all(isinstance(e, dict) for e in entries):
        raise RenderError(f"every {KEY} item must be a mapping")
    return entries


def check_remote_write_url(url: Any) -> None:
    """Refuse a remote_write URL Prometheus would refuse or should never be given (``add_remote_write`` and the
    ``Prometheus`` CR deploy call it before writing anything): not a string, a line break
    or control character (it would inject YAML; promtool rejects the result), a scheme other than http or
    https (``file:///etc/passwd``), or no host (``not a url``). The message never shows its credentials."""
    if not isinstance(url, str) or not url:
        raise RenderError(f"remote_write URL must be a non-empty string, got {type(url).__name__}")
    shown = clip(repr(redact_text(url)), 200)
    bad = next((ch for ch in url if ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")), None)
    if bad is not None:
        raise RenderError(f"remote_write URL {shown} contains {bad!r} (a line break, space or control character)")
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise RenderError(f"remote_write URL {shown} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise RenderError(f"remote_write URL {shown} must start with http:// or https://")
    if not host:
        raise RenderError(f"remote_write URL {shown} has no host")



# -- reading (YAML 1.2, as loaded values; never dumped) ------------------------------------------


def _entries(data: Mapping[str, Any]) -> list[Any]:
    entries = data.get(KEY)
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise RenderError(f"{KEY} must be a list, not {type(entries).__name__}")
    return entries


def remote_write_names(config: str | bytes) -> list[str]:
    """Names of all remote_write entries in a config (unnamed entries show as '')."""
    return [str(e.get("name", "")) if isinstance(e, dict) else "" for e in _read_entries(config)]


def _read_entries(config: str | bytes) -> list[Any]:
    """The top-level ``remote_write`` list as an edit reads it (only that key's nodes kept, ``_loaded``)."""
    text = _decode(config)
    with cyclic_gc_paused():
        return _entries(_loaded(_parse(text, keep=KEY)))


def _remote_write(doc: _Doc) -> tuple[_Node, _Node] | None:
    """The top-level ``remote_write`` key and value nodes, or None when the key is missing."""
    root = _root_mapping(doc)
    if root is None:
        return None
    found = [(k, v) for k, v in zip(root.children[::2], root.children[1::2], strict=True)
             if k.kind == "scalar" and k.value == KEY]
    if len(found) > 1:
        raise RenderError(f"source config has {len(found)} top-level {KEY} keys")
    if not found and any(k.kind == "scalar" and k.value == "<<" for k in root.children[::2]):
        raise RenderError(f"source config merges keys into its top level (<<); add the {KEY} key by hand")
    if not found:
        return None
    key, value = found[0]
    if value.kind == "alias" or value.anchor is not None:
        raise RenderError(f"{KEY} is an alias or has an anchor; editing it would change other parts of the file")
    if value.kind == "scalar" and not value.empty:
        raise RenderError(f"{KEY} is {doc.text[value.start:value.end]!r}, not a list; write `{KEY}: []`")
    if value.kind == "map":
        raise RenderError(f"{KEY} must be a list, not a mapping")
    return key, value



# -- the edits -------------------------------------------------------------------------------------


def add_remote_write(config: Config, entry: Mapping[str, Any]) -> Config:
    """Return the config with ``entry`` appended to ``remote_write``, every other byte unchanged.

    Adding an entry whose name is already present with the same content is a no-op (a
    retried deploy); with different content it is refused, because editing a live queue
    loses samples.
    """
    return _spliced_edit(config, lambda text: _add(text, entry))


def remove_remote_write(config: Config, name: str) -> Config:
    """Return the config without the remote_write entry called ``name`` (no-op if absent).

    Removes exactly the entry's lines (and the ``remote_write:`` key promshift added, once it
    is empty), so it undoes ``add_remote_write`` byte for byte.
    """
    return _spliced_edit(config, lambda text: _remove(text, name))


def replace_remote_write(config: Config, entry: Mapping[str, Any]) -> Config:
    """Return the config with the existing ``remote_write`` entry of ``entry``'s name replaced by it.

    Editing a live entry restarts its queue and loses samples (see the module docstring), so
    migrations never call this; the local stack's fault injection (``python -m promshift.local stack drift``) does.
    The entry is removed and added again (so it moves to the end of the list); every other byte
    stays as it was.
    """
    if entry["name"] not in remote_write_names(config):
        raise RenderError(f"no remote_write entry {entry['name']!r} to replace")
    return add_remote_write(remove_remote_write(config, entry["name"]), entry)


# A config read or checked as a whole document (its tree, loaded under two YAML versions) costs about a hundred
# times its size; above this, such a config is refused with one line, so every edit stays within a fixed
# memory budget (docs/troubleshooting.md, "Input budgets"). The LibYAML path needs no whole document.
WHOLE_DOCUMENT_MAX = 2 * 1024 * 1024


def _whole_document(text: str, why: str) -> None:
    if len(text) > WHOLE_DOCUMENT_MAX:
        raise RenderError(f"source config is {len(text) / 1024 / 1024:.1f} MiB and {why}: promshift reads such a "
                          f"file whole only up to {WHOLE_DOCUMENT_MAX // 1024 // 1024} MiB; edit it by hand")


@dataclass(frozen=True)
class _Planned:
    """An edit before it is made: its splice, its event-by-event proof (False: the full check decides) and its
    full check, each given the old and the new config (as bytes when the caller gave bytes)."""

    splice: _Splice
    fast: Callable[[str | bytes, str | bytes], bool]
    full: Callable[[str, str], str]


def _spliced_edit(config: Config, plan: Callable[[str], _Planned | None]) -> Config:
    """``config`` with ``plan``'s splice made and proven (``plan`` None: unchanged). A bytes config is spliced
    and proven as bytes, so its text is never copied whole as characters again (four bytes each, when the
    file holds one character outside the BMP)."""
    with cyclic_gc_paused():
        text = _decode(config) if isinstance(config, bytes) else config
        planned = plan(text)
        if planned is None:
            return config
        if isinstance(config, bytes):
            data = planned.splice.apply_bytes(config, text)
            if not planned.fast(config, data):
                _whole_document(text, "its edit must be checked on the whole document")
                planned.full(text, data.decode("utf-8"))
            return data
        new = planned.splice.apply(text)
        if not planned.fast(text, new):
            _whole_document(text, "its edit must be checked on the whole document")
            planned.full(text, new)
        return new


def _loaded(doc: _Doc) -> dict[str, Any]:
    """What an edit needs of ``_load``: the whole document, or, when LibYAML read it, only its top-level
    ``remote_write`` (the rest is checked event by event, never built as values; ``_parse(text, keep=KEY)``
    keeps the top-level pairs this reads)."""
    root = doc.root
    if root is not None and root.kind == "map" and any(k.kind == "scalar" and k.value == "<<"
                                                       for k in root.children[::2]):
        _whole_document(doc.text, "merges keys into its top level (<<)")
    elif not doc.fast:
        _whole_document(doc.text, "LibYAML cannot read it (or PyYAML has no LibYAML)")
    elif doc.exotic:
        _whole_document(doc.text, "it has tags other than YAML's standard ones")
    elif root is not None and root.kind != "map" and len(doc.text) > WHOLE_DOCUMENT_MAX:
        raise RenderError("source config must be a YAML mapping at the top level")
    if not (doc.fast and not doc.exotic) or root is None or root.kind != "map" or any(
            k.kind == "scalar" and k.value == "<<" for k in root.children[::2]):
        return _load(doc.text)
    found = [v for k, v in zip(root.children[::2], root.children[1::2], strict=True)
             if k.kind == "scalar" and k.value == KEY]
    if len(found) > 1:
        raise RenderError(f"source config is not valid YAML: found duplicate key {KEY!r}")
    return {KEY: _value(found[0], _schema("YAML 1.2"))} if found else {}


def _add(text: str, entry: Mapping[str, Any]) -> _Planned | None:
    check_remote_write_url(entry.get("url"))  # checked where an entry is written (a rollback needs only its name)
    doc = _parse(text, keep=KEY)
    before = _loaded(doc)
    entries = _entries(before)
    for existing in entries:
        if isinstance(existing, dict) and existing.get("name") == entry["name"]:
            if existing == dict(entry):
                return None
            raise RenderError(
                f"remote_write entry {entry['name']!r} already exists with different settings; "
                "promshift never edits a live entry — roll the group back first"
            )
    found = _remote_write(doc)
    return _Planned(_append_splice(doc, found, _root_mapping(doc), KEY, entry),
                    lambda old, new: _fast_check_add(doc, found, old, new, entry),
                    lambda old, new: _checked_add(old, None, new, entry))


def _remove(text: str, name: str) -> _Planned | None:
    doc = _parse(text, keep=KEY)
    before = _loaded(doc)
    entries = _entries(before)
    matches = [i for i, e in enumerate(entries) if isinstance(e, dict) and e.get("name") == name]
    if not matches:
        return None
    if len(matches) > 1:
        raise RenderError(f"source config has {len(matches)} remote_write entries named {name!r}")
    found = _remote_write(doc)
    if found is None or found[1].kind != "seq":
        raise RenderError(f"{KEY} entry {name!r} does not come from a top-level {KEY} list; remove it by hand")
    key, seq = found
    if len(seq.children) != len(entries):
        raise RenderError(f"{KEY} has {len(seq.children)} items but loads as {len(entries)}")
    index = matches[0]
    item = seq.children[index]
    if any(node.anchor is not None for node in _walk(item)):
        # An alias elsewhere may stand for it (or for an anchor it redefines): removing it changes that value.
        raise RenderError(f"{KEY} entry {name!r} defines an anchor (&); remove it by hand")
    if seq.flow:
        return _removal(doc, key, seq, item, _flow_cut(text, seq, index, name), name)
    dash = _dash_before(doc, item.start, name)
    start, end = _line_start(doc, dash), _next_line(doc, item.end)
    if text[start:dash].strip(" "):
        raise RenderError(f"remote_write entry {name!r} does not start its own line; remove it by hand")
    if len(seq.children) == 1:
        key_start = _line_start(doc, key.start)
        key_line = text[key_start:start]
        if key_line.rstrip(_BREAK_CHARS) == f"{' ' * _column(doc, key.start)}{KEY}:  {ADDED_KEY_COMMENT}":
            start = key_start
    if end == len(text) and _break_before(text, end) == 0:
        start -= _break_before(text, start)  # the entry was the last line: take the break before it
    return _removal(doc, key, seq, item, _Splice(start, end), name)


def _removal(doc: _Doc, key: _Node, seq: _Node, item: _Node, splice: _Splice, name: str) -> _Planned:
    return _Planned(splice, lambda old, new: _fast_check_remove(doc, key, seq, item, old, new, name),
                    lambda old, new: _checked_remove(old, None, new, name))


# -- proof of each edit ---------------------------------------------------------------------------


def _without_entries(data: Any) -> tuple[dict[str, Any], list[Any]]:
    data = dict(_canon(data) or {})
    return data, list(data.pop(KEY, None) or [])


def _fast_ready(doc: _Doc) -> bool:
    return doc.fast and not doc.exotic and doc.root is not None and doc.root.kind == "map"


def _fast_check_add(doc: _Doc, found: tuple[_Node, _Node] | None, old: str | bytes, new: str | bytes,
                    entry: Mapping[str, Any]) -> bool:
    """Check an add event by event: the edited text's events are the original's with exactly our entry's
    events at the end of ``remote_write`` (so every other value is the same under any schema), and those
    events read as YAML 1.2 and as YAML 1.1 give exactly ``entry``. False when the full check must decide."""
    if not _fast_ready(doc):
        return False
    root = doc.root
    assert root is not None
    if found is None:
        start = stop = root.last  # a new key at the end of the top-level mapping
    elif found[1].kind == "seq":
        start = stop = found[1].last  # before the list's end
    else:
        start, stop = found[1].first, found[1].first + 1  # `remote_write:` (null) becomes a list
    inserted = _spliced(old, new, start, stop, _take_nodes(1 if found is not None else 2))
    what = f"adding {entry['name']!r}"
    if inserted is None:
        raise RenderError(f"internal error: {what} would change more than its entry; the config was left untouched")
    nodes = _nodes_of_keys(inserted)
    if found is None and nodes is not None and len(nodes) == 2 and nodes[0].kind == "scalar" \
            and nodes[0].plain and nodes[0].value == KEY:
        nodes = nodes[1:]
    if found is None or found[1].kind != "seq":
        nodes = nodes[0].children if nodes and len(nodes) == 1 and nodes[0].kind == "seq" else None
    for version in ("YAML 1.2", "YAML 1.1"):
        schema = _schema(version)
        if nodes is None or [_canon(_value(n, schema)) for n in nodes] != [_canon(dict(entry))]:
            raise RenderError(f"internal error: {what} would not read back as exactly its entry ({version}); "
                              "the config was left untouched")
    return True


def _fast_check_remove(doc: _Doc, key: _Node, seq: _Node, item: _Node, old: str | bytes, new: str | bytes,
                       name: str) -> bool:
    """Check a remove event by event: the edited text's events are the original's without exactly the entry's
    (and without the ``remote_write`` key it leaves empty). False when the full check must decide."""
    if not _fast_ready(doc):
        return False
    spans = [(item.first, item.last + 1)] + ([(key.first, seq.last + 1)] if len(seq.children) == 1 else [])
    if any(_spliced(old, new, start, stop, _take_nodes(0)) == [] for start, stop in spans):
        return True
    if len(seq.children) == 1 and _spliced(old, new, seq.first, seq.last + 1, _take_nodes(1)) \
            == [("S", "", None, None, None, (True, False))]:
        return True  # `remote_write:` with nothing after it again, as before the add
    if doc.pairs == 1:
        return False  # the document may become empty: the full check decides (it is small)
    raise RenderError(f"internal error: removing {name!r} would change more than its entry; "
                      "the config was left untouched")


def _checked_add(text: str, before: Any, new: str, entry: Mapping[str, Any]) -> str:
    for (version, old), (_, now) in zip(_both_loads(text, before), _both_loads(new), strict=True):
        if version == "YAML 1.1" and old is None and text.strip():
            continue  # PyYAML cannot read this file; YAML 1.2 still checked it
        old_rest, old_entries = _without_entries(old)
        new_rest, new_entries = _without_entries(now)
        if new_rest != old_rest or new_entries != old_entries + [_canon(dict(entry))]:
            raise RenderError(f"internal error: adding {entry['name']!r} would change more than its entry "
                              f"({version}); the config was left untouched")
    return new


def _checked_remove(text: str, before: Any, new: str, name: str) -> str:
    for (version, old), (_, now) in zip(_both_loads(text, before), _both_loads(new), strict=True):
        if version == "YAML 1.1" and old is None and text.strip():
            continue
        old_rest, old_entries = _without_entries(old)
        new_rest, new_entries = _without_entries(now)
        kept = [e for e in old_entries if not (isinstance(e, dict) and e.get("name") == name)]
        if new_rest != old_rest or new_entries != kept:
            raise RenderError(f"internal error: removing {name!r} would change more than its entry "
                              f"({version}); the config was left untouched")
    return new

