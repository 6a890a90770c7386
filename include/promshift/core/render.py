"""Edit a Prometheus config's ``remote_write`` list in place: every other byte of the file stays.

Each metric group gets its own ``remote_write`` entry with a keep-filter. A live entry is
never edited: measured on Prometheus 2.42, editing a live entry's regex restarts its queue
and lost ~8 % of a scrape, while adding a new entry left the other queues untouched.

The user's document is never loaded and dumped again (that loses comments, renames anchors
and, YAML 1.1 against 1.2, turns ``on`` into ``true``, ``1.10`` into ``1.1`` and ``010``
into ``8``). A round-trip parser (ruamel.yaml's event stream) only finds positions; the edit
splices text:

- add: our entry's lines go in at the start of the line after the last content of the
  ``remote_write`` list (after the whole document when the key is missing, in which case a
  ``remote_write:`` key line marked ``# added by promshift`` goes in too), in the file's own
  newline style and indentation; a flow list (``remote_write: []``) gets a one-line flow
  entry before its ``]``. Every string we write is double-quoted, so YAML 1.1 (Prometheus'
  go-yaml v2) and 1.2 read the same value.
- remove: exactly the lines of the entry (and the marked key line when the list becomes
  empty), so add then remove gives back the original text.
- every edit is checked after the fact: the document, read by a YAML 1.2 loader and by a
  YAML 1.1 loader, must equal the original with our entry appended (or removed) and nothing
  else changed, or the edit raises instead of returning.

``add_remote_write`` and ``remove_remote_write`` take ``str`` or ``bytes`` and return the
same type. Give them bytes to keep everything exact: a str read with Python's universal
newlines has already turned CRLF into LF. Bytes must be UTF-8 (a BOM is kept as it is).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.events import (
    AliasEvent,
    DocumentEndEvent,
    DocumentStartEvent,
    Event,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
)

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
    if sigv4 is not None:
        if not sigv4.get("region"):
            raise RenderError("a sigv4 remote_write needs a region")
        entry["sigv4"] = {k: str(sigv4[k]) for k in ("region", "role_arn") if sigv4.get(k)}
        queue_config = queue_config or AMP_QUEUE_CONFIG
    if queue_config:
        entry["queue_config"] = dict(queue_config)
    return entry


# -- reading (YAML 1.2, as loaded values; never dumped) ------------------------------------------


def _decode(config: str | bytes) -> str:
    if isinstance(config, str):
        return config
    try:
        return config.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RenderError(f"source config is not UTF-8: {exc}") from exc


def _load12(text: str) -> Any:
    return YAML(typ="safe", pure=True).load(text)


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


# -- positions (ruamel.yaml events; only marks are used) ------------------------------------------


@dataclass
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
    children: list[_Node] = field(default_factory=list)


@dataclass
class _Doc:
    text: str
    root: _Node | None
    end: int  # where an empty document's content would go: its ``...`` marker, else the end of the text
    floor: int  # 1 after a BOM: no line starts before it


def _parse(text: str) -> _Doc:
    try:
        events = list(YAML(typ="rt").parse(text))
    except YAMLError as exc:
        raise RenderError(f"source config is not valid YAML: {_first_line(exc)}") from exc
    if sum(isinstance(e, DocumentStartEvent) for e in events) > 1:
        raise RenderError("source config holds more than one YAML document")
    floor = 1 if text.startswith("\ufeff") else 0
    stack: list[_Node] = []
    root: _Node | None = None
    end = len(text)
    for ev in events:
        node = _node_of(ev)
        if node is not None:
            if stack:
                stack[-1].children.append(node)
            else:
                root = node
            if node.kind in ("map", "seq"):
                stack.append(node)
        elif isinstance(ev, MappingEndEvent | SequenceEndEvent):
            done = stack.pop()
            if done.flow:
                done.close, done.end = ev.start_mark.index, ev.end_mark.index
        elif isinstance(ev, DocumentEndEvent) and ev.explicit:
            end = ev.start_mark.index
    if root is not None:
        _fix_ends(root, text)
        if root.kind == "scalar" and root.empty:
            root = None
    return _Doc(text=text, root=root, end=end, floor=floor)


def _node_of(ev: Event) -> _Node | None:
    start, end = ev.start_mark.index, ev.end_mark.index
    if isinstance(ev, ScalarEvent):
        empty = ev.value == "" and ev.style is None and ev.anchor is None and ev.tag is None
        return _Node("scalar", start, end, value=ev.value, empty=empty, anchor=ev.anchor, tag=ev.tag,
                     block=ev.style in ("|", ">"))
    if isinstance(ev, AliasEvent):
        return _Node("alias", start, end)
    if isinstance(ev, MappingStartEvent | SequenceStartEvent):
        kind = "map" if isinstance(ev, MappingStartEvent) else "seq"
        return _Node(kind, start, end, flow=bool(ev.flow_style), anchor=ev.anchor, tag=ev.tag)
    return None


def _fix_ends(node: _Node, text: str, after: int = 0) -> int:
    """Set every node's end to its last character (a block collection's own end mark lies after
    trailing comments); an implicit null ends at its ``:`` or ``-`` indicator. Returns the end."""
    last = after
    for i, child in enumerate(node.children):
        if child.empty and node.kind == "map" and i % 2 == 1:
            child.start = child.end = _indicator_end(text, node.children[i - 1].end, ":")
        elif child.empty:
            child.start = child.end = _indicator_end(text, last, "-")
        else:
            _fix_ends(child, text, last)
        last = max(last, child.end)
    if node.kind in ("map", "seq") and not node.flow:
        node.end = max([last] + [c.end for c in node.children])
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


def _add(text: str, entry: Mapping[str, Any]) -> str:
    before = _load(text)
    entries = _entries(before)
    for existing in entries:
        if isinstance(existing, dict) and existing.get("name") == entry["name"]:
            if existing == dict(entry):
                return text
            raise RenderError(
                f"remote_write entry {entry['name']!r} already exists with different settings; "
                "promshift never edits a live entry — roll the group back first"
            )
    doc = _parse(text)
    found = _remote_write(doc)
    return _checked_add(text, before, _append_item(doc, found, _root_mapping(doc), KEY, entry), entry)


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
    before = _load(text)
    entries = _entries(before)
    matches = [i for i, e in enumerate(entries) if isinstance(e, dict) and e.get("name") == name]
    if not matches:
        return text
    if len(matches) > 1:
        raise RenderError(f"source config has {len(matches)} remote_write entries named {name!r}")
    doc = _parse(text)
    found = _remote_write(doc)
    if found is None or found[1].kind != "seq":
        raise RenderError(f"{KEY} entry {name!r} does not come from a top-level {KEY} list; remove it by hand")
    key, seq = found
    if len(seq.children) != len(entries):
        raise RenderError(f"{KEY} has {len(seq.children)} items but loads as {len(entries)}")
    index = matches[0]
    item = seq.children[index]
    if seq.flow:
        return _checked_remove(text, before, _cut_flow_item(text, seq, index, name), name)
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
    return _checked_remove(text, before, text[:start] + text[end:], name)


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
    except yaml.YAMLError:
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
