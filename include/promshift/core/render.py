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
import math
import re
import threading
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.events import (
    AliasEvent,
    DocumentEndEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
)
from ruamel.yaml.nodes import ScalarNode as RuamelScalarNode

from promshift.core.inputs import CONFIG, InputBudget, InputRefused, YamlBudgetCounter, clip, decode_utf8
from promshift.core.memory import cyclic_gc_paused
from promshift.core.redact import redact_text

ENTRY_PREFIX = "promshift-"
# AWS's recommended remote_write queue settings for AMP (AMP user guide, remote write to AMP).
AMP_QUEUE_CONFIG: Mapping[str, int] = {"max_samples_per_send": 1000, "max_shards": 200, "capacity": 2500}
# Marks a remote_write key we created, so removing our last entry removes the key too.
ADDED_KEY_COMMENT = "# added by promshift"
KEY = "remote_write"

_BREAK_CHARS = "\r\n\x85\u2028\u2029"  # what YAML 1.1 (go-yaml v2) and ruamel.yaml count as line breaks
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Plain words YAML 1.1 reads as booleans or null: never written unquoted.
_YAML11_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}

Config = TypeVar("Config", str, bytes)
_YAML11_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class RenderError(ValueError):
    """The source config cannot take the change as asked."""


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
) -> dict[str, Any]:
    """The remote_write entry that dual-writes exactly the group's metrics to ``url``.

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
    entries = _entries(_load(config))
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


def _decode(config: str | bytes) -> str:
    if isinstance(config, str):
        return config
    try:
        return decode_utf8(config, "source config")
    except InputRefused as exc:
        raise RenderError(str(exc)) from None


def _load12(text: str) -> Any:
    """The document as YAML 1.2 values, within the source config's input budget (``core.inputs.CONFIG``)."""
    doc = _parse(text)
    if doc.fast and not doc.exotic:
        return _value(doc.root, _schema("YAML 1.2")) if doc.root is not None else None
    try:
        return YAML(typ="safe", pure=True).load(text)
    except RecursionError:
        raise RenderError("source config: values nest too deeply (through aliases)") from None


def _load(config: str | bytes) -> dict[str, Any]:
    try:
        data = _load12(_decode(config))
    except YAMLError as exc:
        raise RenderError(f"source config is not valid YAML: {_first_line(exc)}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RenderError("source config must be a YAML mapping at the top level")
    return data


class _Schema:
    """Scalar resolution and construction under one YAML version, by the library that implements it:
    PyYAML for YAML 1.1 (as go-yaml v2), ruamel.yaml for YAML 1.2. Results are cached per scalar text."""

    def __init__(self, version: str) -> None:
        self.version = version
        if version == "YAML 1.1":
            self.resolver: Any = yaml.resolver.Resolver()
            self.constructor: Any = yaml.constructor.SafeConstructor()
            self.node_type: Any = yaml.ScalarNode
        else:
            loader = YAML(typ="safe", pure=True)
            self.resolver, self.constructor, self.node_type = loader.resolver, loader.constructor, RuamelScalarNode
        self.cache: dict[tuple[str | None, bool, str | None], Any] = {}

    def scalar(self, node: _Node) -> Any:
        key = (node.value, node.plain, node.tag)
        try:
            return self.cache[key]
        except KeyError:
            pass
        tag = node.tag
        if tag is None:
            tag = self.resolver.resolve(self.node_type, node.value, (node.plain, not node.plain))
        elif tag == "!":
            tag = "tag:yaml.org,2002:str"
        scalar = self.node_type(tag, node.value)
        value = self.constructor.construct_object(scalar, deep=True)
        self.constructor.constructed_objects.pop(scalar, None)
        if len(self.cache) < 100_000:
            self.cache[key] = value
        return value


_SCHEMAS = threading.local()  # a constructor keeps state while it builds: one per thread


def _schema(version: str) -> _Schema:
    schemas: dict[str, _Schema] = _SCHEMAS.__dict__.setdefault("by_version", {})
    if version not in schemas:
        schemas[version] = _Schema(version)
    return schemas[version]


def _value(node: _Node | None, schema: _Schema, depth: int = 0) -> Any:
    """The Python value of a parsed node under ``schema`` (merge keys, aliases; the budget was checked when
    parsing, so following aliases is bounded). A duplicate key is an error under YAML 1.2 (as ruamel.yaml)
    and the last one wins under 1.1 (as PyYAML)."""
    if node is None:
        return None
    if depth > CONFIG.max_depth:  # aliases of aliases nest deeper than any one of them is written
        raise RenderError(f"source config: values nest deeper than {CONFIG.max_depth} levels through aliases")
    depth += 1
    if node.kind == "alias":
        if node.target is None:
            raise RenderError(f"source config is not valid YAML: found undefined alias {node.value!r}")
        return _value(node.target, schema, depth)
    if node.kind == "scalar":
        return schema.scalar(node)
    if node.kind == "seq":
        return [_value(child, schema, depth) for child in node.children]
    merged: list[dict[Any, Any]] = []
    own: dict[Any, Any] = {}
    children = node.children
    for i in range(0, len(children), 2):
        key_node, value_node = children[i], children[i + 1]
        if key_node.kind == "scalar" and key_node.plain and key_node.value == "<<":
            merged += _merge_sources(_value(value_node, schema, depth), key_node)
            continue
        key = _value(key_node, schema, depth)
        try:
            duplicate = key in own
        except TypeError:
            raise RenderError(f"source config has a mapping key that is a {type(key).__name__}, "
                              f"at offset {key_node.start}") from None
        if duplicate and schema.version == "YAML 1.2":
            raise RenderError(f"source config is not valid YAML: found duplicate key {str(key)[:80]!r}")
        own[key] = _value(value_node, schema, depth)
    if not merged:
        return own
    result: dict[Any, Any] = {}
    for source in merged:
        for key, value in source.items():
            result.setdefault(key, value)
    result.update(own)
    return result


def _merge_sources(value: Any, key_node: _Node) -> list[dict[Any, Any]]:
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return list(value)
    raise RenderError("source config is not valid YAML: a merge key (<<) needs a mapping or a list of mappings")


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


def _entries(data: Mapping[str, Any]) -> list[Any]:
    entries = data.get(KEY)
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise RenderError(f"{KEY} must be a list, not {type(entries).__name__}")
    return entries


def remote_write_names(config: str | bytes) -> list[str]:
    """Names of all remote_write entries in a config (unnamed entries show as '')."""
    return [str(e.get("name", "")) if isinstance(e, dict) else "" for e in _entries(_load(config))]


# -- positions (parser events; only marks are used) ------------------------------------------------
#
# LibYAML's parser (PyYAML's CParser) when PyYAML has it: one pass over its events gives the positions,
# the input budget's counts and, per event, a key without marks, so an edit's result can be compared with
# the original event by event. Its grammar is YAML 1.1's, as Prometheus' go-yaml v2 reads it; each scalar
# is then resolved under both the YAML 1.1 and the 1.2 schema. A text LibYAML refuses, or one with tags
# this module does not construct itself, takes the pure path: ruamel.yaml's parser and loaders (its
# grammar is YAML 1.2's), as fast as pure Python allows.

_FAST = bool(yaml.__with_libyaml__)
_NO_CHILDREN: list[_Node] = []  # shared by every scalar and alias: never appended to
_TAB_THEN_TOKEN = re.compile(r"[ \t]*\t[ \t]*[^ \t\r\n\x85\u2028\u2029]")


@dataclass(slots=True)
class _Node:
    kind: str  # map | seq | scalar | alias
    start: int
    end: int  # just after the node's last character
    flow: bool = False
    value: str | None = None
    empty: bool = False  # an implicit null: nothing written after the indicator
    block: bool = False  # a literal (|) or folded (>) scalar
    anchor: str | None = None
    tag: str | None = None
    close: int | None = None  # a flow collection: index of its closing bracket
    children: list[_Node] = field(default_factory=lambda: _NO_CHILDREN)
    plain: bool = False  # a plain scalar (its type comes from the schema)
    first: int = 0  # index of its first event in _Doc.keys
    last: int = 0  # index of its last event
    target: _Node | None = None  # an alias: the node it stands for


@dataclass
class _Doc:
    text: str
    root: _Node | None
    end: int  # where an empty document's content would go: its ``...`` marker, else the end of the text
    floor: int  # 1 after a BOM: no line starts before it
    keys: list[tuple[Any, ...]] = field(default_factory=list)  # every event without its marks
    fast: bool = False  # parsed by LibYAML
    exotic: bool = False  # tags only ruamel.yaml's loader constructs: values come from the pure path


def _parse(text: str, budget: InputBudget = CONFIG, *, fast: bool | None = None) -> _Doc:
    """Positions of every node, counted against ``budget`` (depth, alias expansion, one scalar's length).

    RenderError for a text that is not one YAML document or breaks the budget (an alias bomb is refused at
    the alias that crosses it, before anything is expanded).
    """
    fast = _FAST if fast is None else fast
    # A node per event and no cycles (measured: 5 MB took 4.4 CPU-s with the collector, 2.5 without).
    with cyclic_gc_paused():
        if fast:
            try:
                return _parse_events(text, yaml.parse(text, Loader=yaml.CSafeLoader), budget, fast=True)
            except yaml.YAMLError:
                pass  # LibYAML (YAML 1.1) refuses it: ruamel.yaml (YAML 1.2) may still read it
        try:
            return _parse_events(text, YAML(typ="rt").parse(text), budget, fast=False)
        except YAMLError as exc:
            raise RenderError(f"source config is not valid YAML: {_first_line(exc)}") from exc


_STANDARD_TAGS = frozenset({None, "!", "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                            "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null", "tag:yaml.org,2002:map",
                            "tag:yaml.org,2002:seq"})


def _parse_events(text: str, events: Any, budget: InputBudget, *, fast: bool) -> _Doc:
    # LibYAML skips a BOM: its offsets start after it.
    shift = 1 if fast and text.startswith("\ufeff") else 0
    floor = 1 if text.startswith("\ufeff") else 0
    # The budget as YamlBudgetCounter counts it; depth and scalar length inline (this loop is render's cost).
    counter = YamlBudgetCounter(budget)
    max_depth, max_chars = budget.max_depth, budget.max_scalar_chars
    nodes = 0  # nodes composed plus nodes reached through aliases
    opened: dict[int, int] = {}  # id of an anchored collection -> nodes before it
    stack: list[_Node] = []
    anchors: dict[str, _Node] = {}
    keys: list[tuple[Any, ...]] = []
    append = keys.append
    root: _Node | None = None
    end = len(text)
    documents = 0
    exotic = False
    tabs = fast and "\t" in text
    scalar_classes = (ScalarEvent, yaml.ScalarEvent)
    start_classes = (MappingStartEvent, SequenceStartEvent, yaml.MappingStartEvent, yaml.SequenceStartEvent)
    map_classes = (MappingStartEvent, yaml.MappingStartEvent)
    end_classes = (MappingEndEvent, SequenceEndEvent, yaml.MappingEndEvent, yaml.SequenceEndEvent)
    index = -1
    ev: Any = None
    try:
        for index, ev in enumerate(events):
            cls = type(ev)
            if cls in scalar_classes:
                value, style, tag, anchor = ev.value, ev.style or None, ev.tag, ev.anchor  # LibYAML: '' for plain
                append(("S", value, style, tag, anchor, ev.implicit))
                if len(stack) >= max_depth:
                    raise counter.too_deep()
                if len(value) > max_chars:
                    raise counter.too_long(value)
                nodes += 1
                plain = style is None and tag is None
                node = _Node("scalar", ev.start_mark.index + shift, ev.end_mark.index + shift, False, value,
                             plain and value == "" and anchor is None, style == "|" or style == ">", anchor, tag,
                             None, _NO_CHILDREN, plain, index, index)
                if anchor is not None:
                    counter.sizes[anchor] = 1
                    anchors[anchor] = node
                if tag is not None and tag not in _STANDARD_TAGS:
                    exotic = True
                if tabs and plain and _TAB_THEN_TOKEN.match(text, node.end):
                    # LibYAML reads on; PyYAML's and ruamel.yaml's scanners (and so the checks) refuse it.
                    raise RenderError(f"source config is not valid YAML: a tab before more text on line "
                                      f"{ev.end_mark.line + 1} (use spaces)")
            elif cls in start_classes:
                tag, anchor, flow = ev.tag, ev.anchor, bool(ev.flow_style)
                is_map = cls in map_classes
                append(("M" if is_map else "Q", tag, anchor, flow))
                if len(stack) >= max_depth:
                    raise counter.too_deep()
                node = _Node("map" if is_map else "seq", ev.start_mark.index + shift, ev.end_mark.index + shift,
                             flow, None, False, False, anchor, tag, None, [], False, index, index)
                if anchor is not None:
                    opened[id(node)] = nodes
                nodes += 1
                if tag is not None and tag not in _STANDARD_TAGS:
                    exotic = True
            elif cls in end_classes:
                append((cls.__name__,))
                done = stack.pop()
                done.last = index
                if done.anchor is not None:
                    counter.sizes[done.anchor] = nodes - opened.pop(id(done))
                    anchors[done.anchor] = done
                if done.flow:
                    done.close, done.end = ev.start_mark.index + shift, ev.end_mark.index + shift
                continue
            elif cls is AliasEvent or cls is yaml.AliasEvent:
                append(("A", ev.anchor))
                nodes += counter.alias(ev.anchor, (n.anchor for n in stack))
                node = _Node("alias", ev.start_mark.index + shift, ev.end_mark.index + shift, value=ev.anchor,
                             first=index, last=index, target=anchors.get(ev.anchor))
            else:
                append((cls.__name__,))
                if cls is DocumentStartEvent or cls is yaml.DocumentStartEvent:
                    documents += 1
                    if documents > 1:
                        raise RenderError("source config holds more than one YAML document")
                elif (cls is DocumentEndEvent or cls is yaml.DocumentEndEvent) and ev.explicit:
                    end = ev.start_mark.index + shift
                continue
            if stack:
                stack[-1].children.append(node)
            else:
                root = node
            if node.kind == "map" or node.kind == "seq":
                stack.append(node)
    except InputRefused as exc:
        mark = ev.start_mark
        raise RenderError(f"{budget.what}: {exc} (line {mark.line + 1}, column {mark.column + 1})") from None
    if root is not None:
        _fix_ends(root, text)
        if root.kind == "scalar" and root.empty:
            root = None
    return _Doc(text=text, root=root, end=end, floor=floor, keys=keys, fast=fast, exotic=exotic)


def _fix_ends(node: _Node, text: str, after: int = 0) -> int:
    """Set every node's end to its last character (a block collection's own end mark lies after
    trailing comments); an implicit null ends at its ``:`` or ``-`` indicator. Returns the end."""
    last = after
    children = node.children
    is_map = node.kind == "map"
    for i, child in enumerate(children):
        if child.empty and is_map and i % 2 == 1:
            child.start = child.end = _indicator_end(text, children[i - 1].end, ":")
        elif child.empty:
            child.start = child.end = _indicator_end(text, last, "-")
        elif child.children:
            _fix_ends(child, text, last)
        if child.end > last:
            last = child.end
    if node.kind in ("map", "seq") and not node.flow:
        node.end = last
    return node.end


def _indicator_end(text: str, pos: int, indicator: str) -> int:
    i = pos
    while i < len(text) and text[i] in " \t":
        i += 1
    return i + 1 if text.startswith(indicator, i) else pos


def _line_start(doc: _Doc, i: int) -> int:
    while i > doc.floor and doc.text[i - 1] not in _BREAK_CHARS:
        i -= 1
    return max(i, doc.floor)


def _column(doc: _Doc, i: int) -> int:
    return i - _line_start(doc, i)


def _next_line(doc: _Doc, end: int) -> int:
    """The start of the line after the one where content ends at ``end`` (``len`` at a last line
    without a line break); only blanks and a comment may follow the content on its line."""
    text = doc.text
    if end > doc.floor and text[end - 1] in _BREAK_CHARS:
        return end  # a block scalar ends after its own line breaks
    match = re.compile(rf"[ \t]*(#[^{_BREAK_CHARS}]*)?").match(text, end)
    i = match.end() if match else end
    if i == len(text):
        return i
    if text[i] not in _BREAK_CHARS:
        raise RenderError(f"cannot find a line end after offset {end} (line {_line_no(text, end)})")
    return i + (2 if text.startswith("\r\n", i) else 1)


def _line_no(text: str, i: int) -> int:
    return len(re.findall(f"\r\n|[{_BREAK_CHARS}]", text[:i])) + 1


def _break_before(text: str, i: int) -> int:
    """Length of the line break that ends just before ``i``."""
    if text.startswith("\r\n", i - 2):
        return 2
    return 1 if i > 0 and text[i - 1] in _BREAK_CHARS else 0


def _newline(text: str) -> str:
    match = re.search(r"\r\n|\r|\n", text)
    return match.group(0) if match else "\n"


@dataclass(frozen=True)
class _Style:
    newline: str
    seq_offset: int  # a block list's dash, right of its key
    map_step: int  # a nested mapping's keys, right of its key


def _style(doc: _Doc) -> _Style:
    seq_offset: int | None = None
    map_step: int | None = None
    for parent in _walk(doc.root):
        if parent.kind != "map" or parent.flow:
            continue
        for key, value in zip(parent.children[::2], parent.children[1::2], strict=True):
            if value.flow or value.kind not in ("map", "seq") or not value.children:
                continue
            col = _column(doc, value.start if value.kind == "seq" else value.children[0].start)
            offset = col - _column(doc, key.start)
            if value.kind == "seq" and seq_offset is None and offset >= 0:
                seq_offset = offset
            elif value.kind == "map" and map_step is None and offset > 0:
                map_step = offset
        if seq_offset is not None and map_step is not None:
            break  # the first of each is the file's style
    return _Style(newline=_newline(doc.text), seq_offset=2 if seq_offset is None else seq_offset,
                  map_step=map_step or 2)


def _walk(node: _Node | None) -> Iterator[_Node]:
    if node is None:
        return
    yield node
    for child in node.children:
        yield from _walk(child)


def _root_mapping(doc: _Doc) -> _Node | None:
    if doc.root is None:
        return None
    if doc.root.kind != "map":
        raise RenderError("source config must be a YAML mapping at the top level")
    if doc.root.flow:
        raise RenderError("source config is one flow-style mapping ({...}); promshift edits block-style configs")
    return doc.root


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


# -- rendering our entry ------------------------------------------------------------------------


def _quote(text: str) -> str:
    """A double-quoted scalar that YAML 1.1 and 1.2 read back as exactly ``text``."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= code < 0x7F or (code >= 0xA0 and code not in (0x2028, 0x2029, 0xFEFF)
                                     and not 0xD800 <= code < 0xE000 and code not in (0xFFFE, 0xFFFF)):
            out.append(ch)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04X}")
        else:
            out.append(f"\\U{code:08X}")
    return '"' + "".join(out) + '"'


def _key(key: Any) -> str:
    text = str(key)
    if _PLAIN_KEY.fullmatch(text) and text.lower() not in _YAML11_WORDS:
        return text
    return _quote(text)


def _flow(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        return repr(value)
    if value is None:
        return "null"
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(k)}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    raise RenderError(f"cannot render {type(value).__name__} in a remote_write entry")


def _is_block(value: Any) -> bool:
    """Non-empty mappings, and lists holding one, go in block style; everything else in flow."""
    if isinstance(value, Mapping):
        return bool(value)
    return isinstance(value, list | tuple) and any(isinstance(v, Mapping) and v for v in value)


def _block_mapping(mapping: Mapping[str, Any], col: int, style: _Style) -> list[str]:
    lines = []
    for key, value in mapping.items():
        if not _is_block(value):
            lines.append(f"{' ' * col}{_key(key)}: {_flow(value)}")
        elif isinstance(value, Mapping):
            lines.append(f"{' ' * col}{_key(key)}:")
            lines += _block_mapping(value, col + style.map_step, style)
        else:
            lines.append(f"{' ' * col}{_key(key)}:")
            lines += _block_sequence(value, col + style.seq_offset, style)
    return lines


def _block_sequence(items: Any, dash: int, style: _Style) -> list[str]:
    lines = []
    for item in items:
        if isinstance(item, Mapping) and item:
            sub = _block_mapping(item, dash + 2, style)
            lines += [f"{' ' * dash}- {sub[0][dash + 2:]}"] + sub[1:]
        else:
            lines.append(f"{' ' * dash}- {_flow(item)}")
    return lines


# -- the edits ------------------------------------------------------------------------------------




def _edit(config: Config, change: Callable[[str], str]) -> Config:
    with cyclic_gc_paused():
        if isinstance(config, bytes):
            return change(_decode(config)).encode("utf-8")
        return change(config)


def add_remote_write(config: Config, entry: Mapping[str, Any]) -> Config:
    """Return the config with ``entry`` appended to ``remote_write``, every other byte unchanged.

    Adding an entry whose name is already present with the same content is a no-op (a
    retried deploy); with different content it is refused, because editing a live queue
    loses samples.
    """
    return _edit(config, lambda text: _add(text, entry))


def remove_remote_write(config: Config, name: str) -> Config:
    """Return the config without the remote_write entry called ``name`` (no-op if absent).

    Removes exactly the entry's lines (and the ``remote_write:`` key promshift added, once it
    is empty), so it undoes ``add_remote_write`` byte for byte.
    """
    return _edit(config, lambda text: _remove(text, name))


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


def _loaded(doc: _Doc) -> dict[str, Any]:
    """What an edit needs of ``_load``: the whole document, or, when LibYAML read it, only its top-level
    ``remote_write`` (the rest is checked event by event, never built as values)."""
    root = doc.root
    if not (doc.fast and not doc.exotic) or root is None or root.kind != "map" or any(
            k.kind == "scalar" and k.value == "<<" for k in root.children[::2]):
        return _load(doc.text)
    found = [v for k, v in zip(root.children[::2], root.children[1::2], strict=True)
             if k.kind == "scalar" and k.value == KEY]
    if len(found) > 1:
        raise RenderError(f"source config is not valid YAML: found duplicate key {KEY!r}")
    return {KEY: _value(found[0], _schema("YAML 1.2"))} if found else {}


def _add(text: str, entry: Mapping[str, Any]) -> str:
    check_remote_write_url(entry.get("url"))  # checked where an entry is written (a rollback needs only its name)
    doc = _parse(text)
    before = _loaded(doc)
    entries = _entries(before)
    for existing in entries:
        if isinstance(existing, dict) and existing.get("name") == entry["name"]:
            if existing == dict(entry):
                return text
            raise RenderError(
                f"remote_write entry {entry['name']!r} already exists with different settings; "
                "promshift never edits a live entry — roll the group back first"
            )
    found = _remote_write(doc)
    new = _append_item(doc, found, _root_mapping(doc), KEY, entry)
    if _fast_check_add(doc, found, new, entry):
        return new
    return _checked_add(text, None, new, entry)


class BlockScalarAtEnd(RenderError):
    """The text ends in a block scalar (| or >) without a final line break: nothing can be added after it."""


def _append_item(doc: _Doc, found: tuple[_Node, _Node] | None, mapping: _Node | None, key: str, item: Any) -> str:
    """``doc``'s text with ``item`` appended to a list, every other byte kept.

    ``found`` is the list's key and value nodes in ``mapping`` (a flow list, a block list, or no
    value yet: ``key:`` alone); when None, a new ``key:`` (marked ``ADDED_KEY_COMMENT``) holding
    the item goes after the mapping's last line (``mapping`` None: the document is empty).
    """
    text = doc.text
    style = _style(doc)
    nl = style.newline
    if found is not None and found[1].kind == "seq" and found[1].flow:
        seq = found[1]
        if seq.children:
            at, insert = seq.children[-1].end, f", {_flow(item)}"
        else:
            assert seq.close is not None
            at, insert = seq.close, _flow(item)
        return text[:at] + insert + text[at:]
    if found is not None:
        key_node, value = found
        if value.kind == "seq":  # a block list
            lines = _block_sequence([item], _column(doc, value.start), style)
        else:  # `key:` with nothing after it
            lines = _block_sequence([item], _column(doc, key_node.start) + style.seq_offset, style)
        at = _next_line(doc, value.end)
    else:
        col = _column(doc, mapping.children[0].start) if mapping else 0
        lines = [f"{' ' * col}{key}:  {ADDED_KEY_COMMENT}"] + _block_sequence([item], col + style.seq_offset, style)
        at = _next_line(doc, mapping.end) if mapping else doc.end
    if at == len(text) and text and _break_before(text, at) == 0:
        last = max(_walk(doc.root), key=lambda n: (n.end, n.kind == "scalar"))
        if last.block:
            # A line break after it would become part of its value.
            raise BlockScalarAtEnd("source config ends in a block scalar (| or >) without a final line break; "
                                   "add one, then retry")
        insert = nl + nl.join(lines)  # no final line break: keep it that way
    else:
        insert = "".join(line + nl for line in lines)
    return text[:at] + insert + text[at:]


def _remove(text: str, name: str) -> str:
    doc = _parse(text)
    before = _loaded(doc)
    entries = _entries(before)
    matches = [i for i, e in enumerate(entries) if isinstance(e, dict) and e.get("name") == name]
    if not matches:
        return text
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
        return _checked_remove_of(doc, key, seq, item, _cut_flow_item(text, seq, index, name), name)
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
    return _checked_remove_of(doc, key, seq, item, text[:start] + text[end:], name)


def _checked_remove_of(doc: _Doc, key: _Node, seq: _Node, item: _Node, new: str, name: str) -> str:
    if _fast_check_remove(doc, key, seq, item, new, name):
        return new
    return _checked_remove(doc.text, None, new, name)


def _cut_flow_item(text: str, seq: _Node, index: int, name: str) -> str:
    """``text`` without item ``index`` of the flow list ``seq`` and one comma beside it (only a comma may be
    between them: else RenderError naming ``name``)."""
    item = seq.children[index]
    if index > 0:
        start, end = seq.children[index - 1].end, item.end
        _only(text[start:item.start], ",", name)
    elif len(seq.children) > 1:
        start, end = item.start, seq.children[1].start
        _only(text[item.end:end], ",", name)
    else:
        start, end = item.start, item.end
    return text[:start] + text[end:]


def _dash_before(doc: _Doc, start: int, name: str) -> int:
    i = start
    while i > 0 and doc.text[i - 1] in " \t" + _BREAK_CHARS:
        i -= 1
    if i == 0 or doc.text[i - 1] != "-":
        raise RenderError(f"cannot find the '-' of remote_write entry {name!r}; remove it by hand")
    return i - 1


def _only(gap: str, sep: str, name: str) -> None:
    if gap.strip(" \t" + _BREAK_CHARS) != sep:
        raise RenderError(f"remote_write entry {name!r} sits next to comments in a flow list; remove it by hand")


# -- proof of each edit ---------------------------------------------------------------------------


def _both_loads(text: str, loaded12: Any = None) -> list[tuple[str, Any]]:
    """The document as YAML 1.2 (ruamel.yaml; ``loaded12`` if already loaded) and as YAML 1.1
    (PyYAML, close to Prometheus' go-yaml v2)."""
    try:
        loads = [("YAML 1.2", loaded12 if loaded12 is not None else _load12(text))]
    except YAMLError as exc:
        raise RenderError(f"internal error: the edited config does not parse ({_first_line(exc)}); "
                          "the config was left untouched") from exc
    try:
        loads.append(("YAML 1.1", yaml.load(text, Loader=_YAML11_LOADER)))  # noqa: S506 - a safe loader
    except (yaml.YAMLError, RecursionError):
        loads.append(("YAML 1.1", None))
    return loads


def _without_entries(data: Any) -> tuple[dict[str, Any], list[Any]]:
    data = dict(_canon(data) or {})
    return data, list(data.pop(KEY, None) or [])


def _canon(value: Any) -> Any:
    """``value`` with NaN made comparable (``.nan`` != ``.nan`` would fail every check)."""
    if isinstance(value, float) and math.isnan(value):
        return "<nan>"
    if isinstance(value, dict):
        return {_canon(k): _canon(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canon(v) for v in value]
    return value


def _event_keys(text: str) -> list[tuple[Any, ...]]:
    """Every LibYAML event of ``text`` as ``_parse`` keys it (no positions, no nodes: the edited text's side)."""
    keys: list[tuple[Any, ...]] = []
    append = keys.append
    for ev in yaml.parse(text, Loader=yaml.CSafeLoader):
        cls = type(ev)
        if cls is yaml.ScalarEvent:
            append(("S", ev.value, ev.style or None, ev.tag, ev.anchor, ev.implicit))
        elif cls is yaml.AliasEvent:
            append(("A", ev.anchor))
        elif cls is yaml.MappingStartEvent or cls is yaml.SequenceStartEvent:
            append(("M" if cls is yaml.MappingStartEvent else "Q", ev.tag, ev.anchor, bool(ev.flow_style)))
        else:
            append((cls.__name__,))
    return keys


def _nodes_of_keys(keys: list[tuple[Any, ...]]) -> list[_Node] | None:
    """The top-level nodes that a run of event keys composes to; None if it holds an anchor, an alias or
    does not close every collection it opens."""
    top: list[_Node] = []
    stack: list[_Node] = []
    for key in keys:
        kind = key[0]
        if kind == "A" or (kind in ("S", "M", "Q") and key[4 if kind == "S" else 2] is not None):
            return None
        if kind in ("MappingEndEvent", "SequenceEndEvent"):
            if not stack:
                return None
            stack.pop()
            continue
        if kind == "S":
            node = _Node("scalar", 0, 0, value=key[1], tag=key[3], plain=key[2] is None and key[3] is None)
        elif kind in ("M", "Q"):
            node = _Node("map" if kind == "M" else "seq", 0, 0, tag=key[1], flow=key[3], children=[])
        else:
            return None
        (stack[-1].children if stack else top).append(node)
        if node.kind != "scalar":
            stack.append(node)
    return None if stack else top


def _fast_ready(doc: _Doc) -> bool:
    return doc.fast and not doc.exotic and doc.root is not None and doc.root.kind == "map"


def _after_keys(new: str) -> list[tuple[Any, ...]]:
    try:
        return _event_keys(new)
    except yaml.YAMLError as exc:
        raise RenderError(f"internal error: the edited config does not parse ({_first_line(exc)}); "
                          "the config was left untouched") from exc


def _spliced(before: list[tuple[Any, ...]], after: list[tuple[Any, ...]], start: int, stop: int) -> int | None:
    """The length of what ``after`` holds in place of ``before[start:stop]``, if every other event is the same."""
    grown = len(after) - (len(before) - (stop - start))
    if grown < 0 or after[:start] != before[:start] or after[start + grown:] != before[stop:]:
        return None
    return grown


def _fast_check_add(doc: _Doc, found: tuple[_Node, _Node] | None, new: str, entry: Mapping[str, Any]) -> bool:
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
    after = _after_keys(new)
    grown = _spliced(doc.keys, after, start, stop)
    what = f"adding {entry['name']!r}"
    if grown is None:
        raise RenderError(f"internal error: {what} would change more than its entry; the config was left untouched")
    nodes = _nodes_of_keys(after[start:start + grown])
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


def _fast_check_remove(doc: _Doc, key: _Node, seq: _Node, item: _Node, new: str, name: str) -> bool:
    """Check a remove event by event: the edited text's events are the original's without exactly the entry's
    (and without the ``remote_write`` key it leaves empty). False when the full check must decide."""
    if not _fast_ready(doc):
        return False
    after = _after_keys(new)
    spans = [(item.first, item.last + 1)] + ([(key.first, seq.last + 1)] if len(seq.children) == 1 else [])
    if any(_spliced(doc.keys, after, start, stop) == 0 for start, stop in spans):
        return True
    if len(seq.children) == 1 and _spliced(doc.keys, after, seq.first, seq.last + 1) == 1 \
            and after[seq.first] == ("S", "", None, None, None, (True, False)):
        return True  # `remote_write:` with nothing after it again, as before the add
    if doc.root is not None and len(doc.root.children) == 2:
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
