"""The byte-preserving YAML edit machinery under ``core.render`` (and ``core.rules``, ``core.scrape_drop``).

The user's document is never loaded and dumped again (that loses comments, renames anchors and, YAML 1.1
against 1.2, turns ``on`` into ``true``, ``1.10`` into ``1.1`` and ``010`` into ``8``). A parser's event
stream only finds positions (LibYAML's, at C speed, when PyYAML has it; else ruamel.yaml's), counted against
an input budget (``core.inputs``: an alias bomb is refused at its first alias past the budget); an edit
splices text and is then proven (``core.render`` says how).

Memory: ``_parse(text, keep=KEY)`` keeps nodes only for the top-level mapping's first pair, its ``KEY`` and
``<<`` pairs and, in full, ``KEY``'s value (plus, only when that value holds an alias, the anchored values
aliases point at, bounded by the alias budget); every other node's position is folded into its ancestors'
as the events stream by. An edit's check streams both texts' events side by side and stores only what was
inserted. So an edit's memory is a few copies of the text, not a tree of it (``docs/render.md``).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any, TypeVar

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

from promshift.core.inputs import CONFIG, InputBudget, InputRefused, YamlBudgetCounter, decode_utf8
from promshift.core.memory import cyclic_gc_paused

# Marks a key we created (remote_write, metric_relabel_configs, rule_files), so removing our last item removes it.
ADDED_KEY_COMMENT = "# added by promshift"

_BREAK_CHARS = "\r\n\x85\u2028\u2029"  # what YAML 1.1 (go-yaml v2) and ruamel.yaml count as line breaks
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Plain words YAML 1.1 reads as booleans or null: never written unquoted.
_YAML11_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}

Config = TypeVar("Config", str, bytes)
_YAML11_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class RenderError(ValueError):
    """The source config cannot take the change as asked."""


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
    if not node.kept:
        raise RenderError("internal error: a value was read from a node whose children were not kept")
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



# -- positions (parser events; only marks are used) ------------------------------------------------
#
# LibYAML's parser (PyYAML's CParser) when PyYAML has it: one pass over its events gives the positions and
# the input budget's counts. Its grammar is YAML 1.1's, as Prometheus' go-yaml v2 reads it; each scalar is
# then resolved under both the YAML 1.1 and the 1.2 schema. A text LibYAML refuses, or one with tags this
# module does not construct itself, takes the pure path: ruamel.yaml's parser and loaders (its grammar is
# YAML 1.2's), as fast as pure Python allows.
#
# Every node's position is worked out as its events stream by (a block collection ends at its last
# character, not after its trailing comments; an implicit null at its ``:`` or ``-``); only the nodes an
# edit needs are kept (``_parse``'s ``keep``), so a large file never becomes a tree in memory.

_FAST = bool(yaml.__with_libyaml__)
_NO_CHILDREN: list[_Node] = []  # shared by every scalar, alias and collection whose children are not kept
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
    first: int = 0  # index of its first event in the text's event stream
    last: int = 0  # index of its last event
    target: _Node | None = None  # an alias: the node it stands for
    kept: bool = True  # its children (and theirs) are all here


@dataclass
class _Doc:
    text: str
    root: _Node | None
    end: int  # where an empty document's content would go: its ``...`` marker, else the end of the text
    floor: int  # 1 after a BOM: no line starts before it
    fast: bool = False  # parsed by LibYAML
    exotic: bool = False  # tags only ruamel.yaml's loader constructs: values come from the pure path
    pairs: int = 0  # the top-level mapping's key/value pairs (kept or not)
    seq_offset: int | None = None  # the first block list's dash, right of its key (in document order)
    map_step: int | None = None  # the first nested block mapping's keys, right of its key
    last_block: bool = False  # the node that ends last is a block scalar (| or >)


def _parse(text: str, budget: InputBudget = CONFIG, *, fast: bool | None = None, keep: str | None = None) -> _Doc:
    """Positions of the document's nodes, counted against ``budget`` (depth, alias expansion, one scalar's length).

    ``keep`` None keeps every node. A top-level key keeps only what an edit of that key needs: the root
    mapping with its first pair, its ``keep`` and ``<<`` pairs (``_Doc.pairs`` counts them all), ``keep``'s
    value whole and, when that holds an alias, every anchored node an alias points at (a second pass; the
    alias budget bounds them). RenderError for a text that is not one YAML document or breaks the budget
    (an alias bomb is refused at the alias that crosses it, before anything is expanded).
    """
    fast = _FAST if fast is None else fast
    # A node per event and no cycles (measured: 5 MB took 4.4 CPU-s with the collector, 2.5 without).
    with cyclic_gc_paused():
        if fast:
            try:
                return _parse_twice(text, budget, keep, fast=True)
            except yaml.YAMLError:
                pass  # LibYAML (YAML 1.1) refuses it: ruamel.yaml (YAML 1.2) may still read it
        try:
            return _parse_twice(text, budget, keep, fast=False)
        except YAMLError as exc:
            raise RenderError(f"source config is not valid YAML: {_first_line(exc)}") from exc


def _events(text: str, fast: bool) -> Any:
    return yaml.parse(text, Loader=yaml.CSafeLoader) if fast else YAML(typ="rt").parse(text)


def _parse_twice(text: str, budget: InputBudget, keep: str | None, *, fast: bool) -> _Doc:
    doc, referenced = _parse_events(text, _events(text, fast), budget, fast=fast, keep=keep)
    if referenced is not None:  # a kept alias stands for a node that was not kept: keep every alias's target
        doc, _ = _parse_events(text, _events(text, fast), budget, fast=fast, keep=keep, anchored=referenced)
    return doc


_STANDARD_TAGS = frozenset({None, "!", "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                            "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null", "tag:yaml.org,2002:map",
                            "tag:yaml.org,2002:seq"})


class _Frame:
    """An open collection while its events stream by: what its children's positions need, and its own."""

    __slots__ = ("node", "inner", "last", "prev_end", "prev_start", "count", "first_start", "pair_kept",
                 "keep_value")

    def __init__(self, node: _Node, inner: bool, after: int) -> None:
        self.node = node
        self.inner = inner  # its children are kept (appended to node.children)
        self.last = after  # the end of its content so far (its own start's predecessor before any)
        self.prev_end = self.prev_start = self.first_start = 0
        self.count = 0
        self.pair_kept = False  # the root in keep mode: this pair is kept
        self.keep_value = False  # the root in keep mode: this pair's value is kept whole


class _Positions:
    """The running summaries a whole-tree walk used to give: style, the last node, the kept root's pairs."""

    __slots__ = ("text", "seq_key", "seq_offset", "map_key", "map_step", "best", "best_block")

    def __init__(self, text: str) -> None:
        self.text = text
        self.seq_key: tuple[int, int] | None = None
        self.map_key: tuple[int, int] | None = None
        self.seq_offset = self.map_step = 0
        self.best: tuple[int, bool, int] = (-1, False, 0)
        self.best_block = False

    def column(self, i: int, floor: int) -> int:
        text = self.text
        j = i
        while j > floor and text[j - 1] not in _BREAK_CHARS:
            j -= 1
        return i - max(j, floor)

    def done(self, node: _Node, frame: _Frame | None, parent: _Frame | None, floor: int) -> None:
        """``node`` is complete (``frame``: its own, a collection's): fix its end, fold it into ``parent``."""
        if parent is None:
            if frame is not None and not node.flow:
                node.end = frame.last
        else:
            if node.empty:
                if parent.node.kind == "map" and parent.count % 2 == 1:
                    node.start = node.end = _indicator_end(self.text, parent.prev_end, ":")
                else:
                    node.start = node.end = _indicator_end(self.text, parent.last, "-")
            elif frame is not None and not node.flow:
                node.end = frame.last
            if frame is not None and frame.count and not node.flow and parent.count % 2 == 1 \
                    and parent.node.kind == "map" and not parent.node.flow:
                self._style(node, frame, parent, floor)
            if parent.count == 0:
                parent.first_start = node.start
            if node.end > parent.last:
                parent.last = node.end
            parent.prev_end, parent.prev_start = node.end, node.start
            parent.count += 1
        rank = (node.end, node.kind == "scalar", -node.first)
        if rank > self.best:
            self.best, self.best_block = rank, node.block

    def _style(self, value: _Node, frame: _Frame, parent: _Frame, floor: int) -> None:
        """A block mapping's collection value: the file's list or mapping indent, if first in document order."""
        order = (parent.node.first, parent.count // 2)
        is_seq = value.kind == "seq"
        current = self.seq_key if is_seq else self.map_key
        if current is not None and current <= order:
            return
        col = self.column(value.start if is_seq else frame.first_start, floor)
        offset = col - self.column(parent.prev_start, floor)
        if is_seq and offset >= 0:
            self.seq_key, self.seq_offset = order, offset
        elif not is_seq and offset > 0:
            self.map_key, self.map_step = order, offset


def _parse_events(text: str, events: Any, budget: InputBudget, *, fast: bool, keep: str | None = None,
                  anchored: set[int] | None = None) -> tuple[_Doc, set[int] | None]:
    """One pass over ``events`` (``_parse`` says what is kept). Also returns, when a kept alias stands for a
    node that was not kept, the event index of every alias's target (else None)."""
    # LibYAML skips a BOM: its offsets start after it.
    shift = 1 if fast and text.startswith("\ufeff") else 0
    floor = 1 if text.startswith("\ufeff") else 0
    # The budget as YamlBudgetCounter counts it; depth and scalar length inline (this loop is render's cost).
    counter = YamlBudgetCounter(budget)
    max_depth, max_chars = budget.max_depth, budget.max_scalar_chars
    nodes = 0  # nodes composed plus nodes reached through aliases
    opened: dict[int, int] = {}  # id of an anchored collection -> nodes before it
    stack: list[_Frame] = []
    anchors: dict[str, _Node] = {}
    whole = keep is None
    referenced: set[int] = set()  # keep mode: the event index of every alias's target
    missing = False  # keep mode: a kept alias stands for a node that is not kept
    positions = _Positions(text)
    root: _Node | None = None
    pairs = 0
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
            frame: _Frame | None = None
            if cls in scalar_classes:
                value, style, tag, anchor = ev.value, ev.style or None, ev.tag, ev.anchor  # LibYAML: '' for plain
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
                if len(stack) >= max_depth:
                    raise counter.too_deep()
                parent = stack[-1] if stack else None
                inner = whole or (parent is not None and parent.keep_value) or (
                    parent is not None and parent.inner) or (anchored is not None and index in anchored)
                node = _Node("map" if is_map else "seq", ev.start_mark.index + shift, ev.end_mark.index + shift,
                             flow, None, False, False, anchor, tag, None, [] if inner or parent is None else
                             _NO_CHILDREN, False, index, index, None, inner)
                if anchor is not None:
                    opened[id(node)] = nodes
                nodes += 1
                if tag is not None and tag not in _STANDARD_TAGS:
                    exotic = True
                stack.append(_Frame(node, inner, parent.last if parent is not None else 0))
                continue
            elif cls in end_classes:
                frame = stack.pop()
                node = frame.node
                node.last = index
                if node.anchor is not None:
                    counter.sizes[node.anchor] = nodes - opened.pop(id(node))
                    anchors[node.anchor] = node
                if node.flow:
                    node.close, node.end = ev.start_mark.index + shift, ev.end_mark.index + shift
            elif cls is AliasEvent or cls is yaml.AliasEvent:
                nodes += counter.alias(ev.anchor, (f.node.anchor for f in stack))
                target = anchors.get(ev.anchor)
                node = _Node("alias", ev.start_mark.index + shift, ev.end_mark.index + shift, value=ev.anchor,
                             first=index, last=index, target=target)
                if not whole and target is not None:
                    referenced.add(target.first)
            else:
                if cls is DocumentStartEvent or cls is yaml.DocumentStartEvent:
                    documents += 1
                    if documents > 1:
                        raise RenderError("source config holds more than one YAML document")
                elif (cls is DocumentEndEvent or cls is yaml.DocumentEndEvent) and ev.explicit:
                    end = ev.start_mark.index + shift
                continue
            parent = stack[-1] if stack else None
            if parent is None:
                positions.done(node, frame, None, floor)
                root = node
                if frame is not None and node.kind == "map":
                    pairs = frame.count // 2
                continue
            kept = parent.inner
            is_value = parent.count % 2 == 1 and parent.node.kind == "map"
            if not whole and len(stack) == 1 and parent.node.kind == "map":
                if not is_value:  # a top-level key: is its pair kept, and its value whole?
                    named = node.kind == "scalar" and node.value in (keep, "<<")
                    parent.pair_kept = parent.count == 0 or named
                    parent.keep_value = node.kind == "scalar" and node.value == keep
                kept = parent.pair_kept
            positions.done(node, frame, parent, floor)
            if kept:
                parent.node.children.append(node)
                if node.target is not None and not node.target.kept:
                    missing = True
            if is_value:
                parent.keep_value = False
    except InputRefused as exc:
        mark = ev.start_mark
        raise RenderError(f"{budget.what}: {exc} (line {mark.line + 1}, column {mark.column + 1})") from None
    if root is not None and root.kind == "scalar" and root.empty:
        root = None
    doc = _Doc(text=text, root=root, end=end, floor=floor, fast=fast, exotic=exotic, pairs=pairs,
               seq_offset=positions.seq_offset if positions.seq_key is not None else None,
               map_step=positions.map_step if positions.map_key is not None else None,
               last_block=positions.best_block)
    return doc, (referenced if missing and anchored is None else None)


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
    """The file's own style: its newline, and the first block list's and nested mapping's indents (found while
    parsing, in document order)."""
    return _Style(newline=_newline(doc.text), seq_offset=2 if doc.seq_offset is None else doc.seq_offset,
                  map_step=doc.map_step or 2)


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



# -- the edits -------------------------------------------------------------------------------------


def _edit(config: Config, change: Callable[[str], str]) -> Config:
    with cyclic_gc_paused():
        if isinstance(config, bytes):
            return change(_decode(config)).encode("utf-8")
        return change(config)


class BlockScalarAtEnd(RenderError):
    """The text ends in a block scalar (| or >) without a final line break: nothing can be added after it."""


@dataclass(frozen=True)
class _Splice:
    """An edit as a splice: the text's characters ``start:end`` become ``insert``."""

    start: int
    end: int
    insert: str = ""

    def apply(self, text: str) -> str:
        return "".join((text[:self.start], self.insert, text[self.end:]))

    def apply_bytes(self, data: bytes, text: str) -> bytes:
        """The same splice on ``text``'s UTF-8 bytes ``data`` (no second copy of the text as characters)."""
        start, end = _byte_offset(data, text, self.start), _byte_offset(data, text, self.end)
        return b"".join((data[:start], self.insert.encode("utf-8"), data[end:]))


_CONTINUATION = re.compile(rb"[\x80-\xbf]+")  # UTF-8's continuation bytes: every other byte starts a character


def _byte_offset(data: bytes, text: str, i: int) -> int:
    """Where character ``i`` of ``text`` starts in its UTF-8 bytes ``data``."""
    if text.isascii():
        return i
    extra = 0
    for run in _CONTINUATION.finditer(data):
        if run.start() - extra > i:  # the run's character (its lead byte is just before it) is at or after i
            break
        extra += run.end() - run.start()
    return i + extra


def _append_item(doc: _Doc, found: tuple[_Node, _Node] | None, mapping: _Node | None, key: str, item: Any) -> str:
    """``doc``'s text with ``item`` appended to a list, every other byte kept (``_append_splice``)."""
    return _append_splice(doc, found, mapping, key, item).apply(doc.text)


def _append_splice(doc: _Doc, found: tuple[_Node, _Node] | None, mapping: _Node | None, key: str,
                   item: Any) -> _Splice:
    """The splice that appends ``item`` to a list of ``doc``, every other byte kept.

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
        return _Splice(at, at, insert)
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
        if doc.last_block:
            # A line break after it would become part of its value.
            raise BlockScalarAtEnd("source config ends in a block scalar (| or >) without a final line break; "
                                   "add one, then retry")
        insert = nl + nl.join(lines)  # no final line break: keep it that way
    else:
        insert = "".join(line + nl for line in lines)
    return _Splice(at, at, insert)


def _cut_flow_item(text: str, seq: _Node, index: int, name: str) -> str:
    """``text`` without item ``index`` of the flow list ``seq`` (``_flow_cut``)."""
    return _flow_cut(text, seq, index, name).apply(text)


def _flow_cut(text: str, seq: _Node, index: int, name: str) -> _Splice:
    """The splice that removes item ``index`` of the flow list ``seq`` and one comma beside it (only a comma
    may be between them: else RenderError naming ``name``)."""
    item = seq.children[index]
    if index > 0:
        start, end = seq.children[index - 1].end, item.end
        _only(text[start:item.start], ",", name)
    elif len(seq.children) > 1:
        start, end = item.start, seq.children[1].start
        _only(text[item.end:end], ",", name)
    else:
        start, end = item.start, item.end
    return _Splice(start, end)


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


def _canon(value: Any) -> Any:
    """``value`` with NaN made comparable (``.nan`` != ``.nan`` would fail every check)."""
    if isinstance(value, float) and math.isnan(value):
        return "<nan>"
    if isinstance(value, dict):
        return {_canon(k): _canon(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canon(v) for v in value]
    return value


_END = ("end of the stream",)
_MAX_INSERTED = 1_000_000  # events one edit may insert (an entry has tens; a merged entry of many groups, thousands)
Keys = list[tuple[Any, ...]]


def _event_keys(text: str | bytes) -> Iterator[tuple[Any, ...]]:
    """Every LibYAML event of ``text`` (or its UTF-8 bytes) without its marks, as it streams (nothing stored)."""
    for ev in yaml.parse(text, Loader=yaml.CSafeLoader):
        cls = type(ev)
        if cls is yaml.ScalarEvent:
            yield ("S", ev.value, ev.style or None, ev.tag, ev.anchor, ev.implicit)
        elif cls is yaml.AliasEvent:
            yield ("A", ev.anchor)
        elif cls is yaml.MappingStartEvent or cls is yaml.SequenceStartEvent:
            yield ("M" if cls is yaml.MappingStartEvent else "Q", ev.tag, ev.anchor, bool(ev.flow_style))
        else:
            yield (cls.__name__,)


def _take_nodes(count: int) -> Callable[[Iterator[tuple[Any, ...]]], Keys | None]:
    """Reads the events of ``count`` whole nodes from a stream (None when an end event closes what they did
    not open, or the stream ends first)."""
    def take(stream: Iterator[tuple[Any, ...]]) -> Keys | None:
        keys: Keys = []
        depth = done = 0
        while done < count:
            key = next(stream, _END)
            kind = key[0]
            if kind in ("M", "Q"):
                depth += 1
            elif kind in ("MappingEndEvent", "SequenceEndEvent") and depth:
                depth -= 1
                done += depth == 0
            elif kind in ("S", "A"):
                done += depth == 0
            else:
                return None
            keys.append(key)
            if len(keys) > _MAX_INSERTED:
                return None
        return keys
    return take


def _spliced(old: str | bytes, new: str | bytes, start: int, stop: int,
             take: Callable[[Iterator[tuple[Any, ...]]], Keys | None]) -> Keys | None:
    """The events ``new`` holds in place of ``old``'s events ``start:stop`` (read from ``new``'s stream by
    ``take``), if every other event is the same; else None. The two texts' events stream side by side and
    only the inserted ones are kept, so the proof costs no memory of the file's size."""
    try:
        olds, news = _event_keys(old), _event_keys(new)
        for _ in range(start):
            key = next(olds, _END)
            if key is _END or key != next(news, _END):
                return None
        for _ in range(stop - start):
            if next(olds, _END) is _END:
                return None
        inserted = take(news)
        if inserted is None:
            return None
        for key, other in zip_longest(olds, news, fillvalue=_END):
            if key != other:
                return None
        return inserted
    except yaml.YAMLError as exc:
        raise RenderError(f"internal error: the edited config does not parse ({_first_line(exc)}); "
                          "the config was left untouched") from exc


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


