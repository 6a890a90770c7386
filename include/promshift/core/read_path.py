"""The read path switch: which dashboard panels read a group's metrics, and their datasource edit.

Pure: given a Grafana dashboard's JSON *text*, ``plan_dashboard`` finds every panel (rows' nested
``panels`` and old-schema ``rows[].panels`` included) whose ``targets[]`` read the group's metrics
and computes the edit that points them at the AMP datasource. ``DashboardPlan.apply`` returns the
text with only those ``datasource`` values replaced: every other byte (whitespace, CRLF, key order,
other panels, a BOM) stays as it was. A small JSON scanner records each value's exact span
(``parse_spans``); the text is never re-serialised.

Decisions (documented in docs/rules-and-dashboards.md):

- A target *reads* what ``core.promql`` says its expression selects, after Grafana's variables are
  substituted the way ``core.golden`` does (``substitute`` with ``grafana_builtins``; the catalog's
  ``golden_variables`` as values; an unknown variable outside a string, e.g. ``[$interval]``, is
  read as ``5m`` only to list the metrics). A selector without a metric name reads the group only
  when it is the group's own ``{__name__=~"<name_regex>"}``; otherwise it may read anything.
- A panel is **switched** only when every target that reads through the source datasource reads
  the group's metrics and nothing else (targets with no selector, e.g. ``vector(1)``, are neutral).
  A panel that also reads other metrics is **mixed** and left alone: AMP holds only the groups
  already moved, so switching it would blank its other series. A target that does not parse but
  names a group metric makes its panel **unparsed** (left alone, reported).
- What counts as the source datasource: its uid or its name (Grafana < 8.3 stored names as plain
  strings), in the string form or the ``{type, uid}`` object form; a reference to a datasource
  *variable* (``$datasource``, ``${DS_PROMETHEUS}``, ``[[ds]]``, also as ``{"uid": "$datasource"}``)
  of Prometheus type, or one the dashboard does not define (an export's ``__inputs``); and, with
  ``default_is_source`` (the default), a panel with no datasource at all or the old ``"default"``
  (Grafana's default datasource).
- The new value is always the explicit object ``{"type": "prometheus", "uid": <amp uid>}`` (AMP is
  Grafana's Prometheus datasource with SigV4). A panel that used a variable gets it too: the
  variable stays in ``templating`` for the other panels, and a viewer's choice of datasource can no
  longer send a switched panel back to the source. A panel with no ``datasource`` key gets one,
  inserted as the panel's first key followed by the whitespace that preceded the old first key
  (one space when there was none).
- A target's own ``datasource`` is replaced only when it names the source (or a variable); a
  target without one inherits the panel's. A ``-- Mixed --`` panel keeps that value and only its
  targets change. Another datasource (Loki, another Prometheus, ``-- Grafana --``) is never touched,
  and its targets do not count for the decision.
- A panel already on the AMP datasource is **already** (no edit): a retry is a no-op.
- Templating variables whose query reads the group are reported (``variables_reading_group``), not
  switched: a variable feeds every panel. Library panels (``libraryPanel`` without targets) keep
  their queries in Grafana's library, not in the dashboard: listed (``library_panels``), not switched.

Duplicate keys: the last one wins (as in Go's and Python's JSON decoders); that is the one edited.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any, Protocol

from promshift.core.aggregation import rewrite_group_read
from promshift.core.catalog import MetricGroup
from promshift.core.horizon import Horizon, panel_reach
from promshift.core.promql import PromQLError, analyse, grafana_builtins, metric_names, substitute

SWITCH = "switch"
ALREADY = "already"
MIXED = "mixed"
UNPARSED = "unparsed"
WAITING = "waiting"  # would switch, but the target's history does not cover how far back it reads yet

MIXED_DATASOURCE = "-- Mixed --"
_VARIABLE_REF = re.compile(r"^\$(\w+)$|^\$\{(\w+)(?::[^}]*)?\}$|^\[\[(\w+)(?::\w+)?\]\]$")
_MAX_DEPTH = 200
# What an unknown Grafana variable is read as, only to list the metrics an expression names.
_PLACEHOLDER = "5m"


class ReadPathError(ValueError):
    """A dashboard this module cannot plan for: not JSON, not a dashboard, or an edit that would not hold.

    ``evidence``: what a step did before it failed (a restore's per-dashboard record), for the audit.
    """

    def __init__(self, message: str, *, evidence: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.evidence = evidence


class ReadPathSwitch(Protocol):
    """What the DAG calls, in file mode (``adapters.dashboard_files``) and API mode (``adapters.grafana``).

    Every method returns a JSON-able dict without content or credentials (audit evidence);
    ``snapshot`` before ``switch``, ``restore`` with the same snapshot on rollback. ``switch`` and
    ``restore`` are retry-safe (a second call reports ``already`` / ``already restored`` / ``unchanged``)
    and raise ``ReadPathError`` (restore: with ``.evidence``) rather than overwrite someone else's change.
    """

    kind: str

    def plan(self) -> dict[str, Any]: ...

    def snapshot(self, run_id: str) -> dict[str, Any]: ...

    def switch(self, snapshot: Mapping[str, Any]) -> dict[str, Any]: ...

    def restore(self, snapshot: Mapping[str, Any]) -> dict[str, Any]: ...


# --------------------------------------------------------------------------- JSON with spans


@dataclass
class Node:
    """One JSON value and where it sits in the text: ``text[start:end]`` is its exact source.

    ``items`` holds ``(key, key_start, Node)`` for objects, ``(None, -1, Node)`` for arrays;
    ``value`` holds a scalar's Python value.
    """

    kind: str  # object, array, string, number, literal
    start: int
    end: int
    value: Any = None
    items: list[tuple[str | None, int, Node]] = field(default_factory=list)

    def get(self, key: str) -> Node | None:
        """The value of ``key`` in an object (the last one, as JSON decoders keep), else None."""
        if self.kind != "object":
            return None
        found = None
        for k, _, node in self.items:
            if k == key:
                found = node
        return found

    def elements(self) -> list[Node]:
        return [node for _, _, node in self.items] if self.kind == "array" else []

    def py(self) -> Any:
        """The plain Python value (what ``json.loads`` gives for this span)."""
        if self.kind == "object":
            return {k: node.py() for k, _, node in self.items}
        if self.kind == "array":
            return [node.py() for _, _, node in self.items]
        return self.value


_WS = " \t\n\r"
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_LITERALS = (("true", True), ("false", False), ("null", None))


def _where(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return f"line {line} column {col}"


def parse_spans(text: str) -> Node:
    """Parse strict JSON (RFC 8259; a leading BOM allowed) into ``Node``s with exact spans."""
    pos = 1 if text.startswith("\ufeff") else 0

    def skip(i: int) -> int:
        while i < len(text) and text[i] in _WS:
            i += 1
        return i

    def fail(msg: str, i: int) -> ReadPathError:
        return ReadPathError(f"not JSON: {msg} at {_where(text, i)}")

    def string(i: int) -> tuple[str, int]:
        try:
            return scanstring(text, i + 1, True)
        except ValueError as exc:
            raise fail(f"bad string ({exc.args[0].split(':')[0]})", i) from None

    def value(i: int, depth: int) -> Node:
        if depth > _MAX_DEPTH:
            raise fail(f"nested deeper than {_MAX_DEPTH}", i)
        if i >= len(text):
            raise fail("unexpected end", i)
        ch = text[i]
        if ch == "{":
            node = Node("object", i, i)
            i = skip(i + 1)
            if i < len(text) and text[i] == "}":
                node.end = i + 1
                return node
            while True:
                if i >= len(text) or text[i] != '"':
                    raise fail("expected a key", i)
                key_start = i
                key, i = string(i)
                i = skip(i)
                if i >= len(text) or text[i] != ":":
                    raise fail("expected ':'", i)
                child = value(skip(i + 1), depth + 1)
                node.items.append((key, key_start, child))
                i = skip(child.end)
                if i < len(text) and text[i] == ",":
                    i = skip(i + 1)
                    continue
                if i < len(text) and text[i] == "}":
                    node.end = i + 1
                    return node
                raise fail("expected ',' or '}'", i)
        if ch == "[":
            node = Node("array", i, i)
            i = skip(i + 1)
            if i < len(text) and text[i] == "]":
                node.end = i + 1
                return node
            while True:
                child = value(i, depth + 1)
                node.items.append((None, -1, child))
                i = skip(child.end)
                if i < len(text) and text[i] == ",":
                    i = skip(i + 1)
                    continue
                if i < len(text) and text[i] == "]":
                    node.end = i + 1
                    return node
                raise fail("expected ',' or ']'", i)
        if ch == '"':
            s, end = string(i)
            return Node("string", i, end, s)
        m = _NUMBER.match(text, i)
        if m and m.end() > i:
            raw = m.group(0)
            return Node("number", i, m.end(), float(raw) if any(c in raw for c in ".eE") else int(raw))
        for word, val in _LITERALS:
            if text.startswith(word, i):
                return Node("literal", i, i + len(word), val)
        raise fail(f"unexpected {ch!r}", i)

    root = value(skip(pos), 0)
    end = skip(root.end)
    if end != len(text):
        raise fail("extra data after the value", end)
    return root


# --------------------------------------------------------------------------- datasources


@dataclass(frozen=True)
class DatasourceRef:
    """A Grafana datasource: its uid (what object refs name), type, and name (what old string refs name)."""

    uid: str
    type: str = "prometheus"
    name: str | None = None

    def names(self) -> frozenset[str]:
        return frozenset(x for x in (self.uid, self.name) if x)

    def ref(self) -> dict[str, str]:
        """The object form Grafana (8.3+) stores: ``{"type": ..., "uid": ...}``."""
        return {"type": self.type, "uid": self.uid}

    def to_dict(self) -> dict[str, Any]:
        return {"uid": self.uid, "type": self.type, "name": self.name}


# What a datasource value resolves to.
_SOURCE, _TARGET, _INHERIT, _MIXED_DS, _ELSEWHERE = "source", "target", "inherit", "mixed-datasource", "elsewhere"


@dataclass(frozen=True)
class _Datasources:
    source: DatasourceRef
    target: DatasourceRef
    variables: Mapping[str, str | None]  # datasource variables: name -> plugin type (None: any)
    default_is_source: bool

    def classify(self, value: Any, *, panel: bool) -> str:
        """What ``value`` (a panel's or target's ``datasource``) points at."""
        if value is None:
            if panel:
                return _SOURCE if self.default_is_source else _ELSEWHERE
            return _INHERIT
        if isinstance(value, Mapping):
            uid, kind = value.get("uid"), value.get("type")
            if uid is None:
                # {"type": "prometheus"} alone: the default datasource of that type
                return (_SOURCE if self.default_is_source and kind in (None, self.source.type) else _ELSEWHERE) \
                    if panel else _INHERIT
            return self._name(str(uid), kind=None if kind is None else str(kind))
        if isinstance(value, str):
            return self._name(value, kind=None)
        return _ELSEWHERE

    def _name(self, text: str, *, kind: str | None) -> str:
        if text == MIXED_DATASOURCE:
            return _MIXED_DS
        if text == "default":  # old dashboards' explicit "the default datasource"
            return _SOURCE if self.default_is_source else _ELSEWHERE
        if text in self.target.names() and kind in (None, self.target.type):
            return _TARGET
        if text in self.source.names() and kind in (None, self.source.type):
            return _SOURCE
        m = _VARIABLE_REF.match(text)
        if m:
            var = m.group(1) or m.group(2) or m.group(3)
            if var in self.variables:
                plugin = self.variables[var]
                return _SOURCE if plugin in (None, "", self.source.type) else _ELSEWHERE
            # not defined by the dashboard: an export's ${DS_...} input, resolved on import to a Prometheus
            return _SOURCE if kind in (None, self.source.type) else _ELSEWHERE
        return _ELSEWHERE


# --------------------------------------------------------------------------- what targets read


@dataclass(frozen=True)
class TargetRead:
    """What one target's expression reads: ``group`` / ``other`` / ``mixed`` / ``none`` / ``unparsed``."""

    ref_id: str
    state: str
    metrics: tuple[str, ...]
    reason: str = ""


def target_reads(expr: str, group: MetricGroup, variables: Mapping[str, str] | None = None, *,
                 ref_id: str = "") -> TargetRead:
    """Classify one dashboard expression against ``group`` (see the module's decisions)."""
    builtins = grafana_builtins(60.0, 3600.0)
    sub = substitute(expr, dict(variables or {}), builtins=builtins)
    text = sub.expr
    if sub.unknown:
        text = substitute(text, {name: _PLACEHOLDER for name in sub.unknown}).expr
    try:
        selectors = analyse(text).selectors
    except PromQLError as exc:
        named = tuple(dict.fromkeys(n for n in metric_names(text) if group.reads(n)))
        if named:
            return TargetRead(ref_id, UNPARSED, named, str(exc).splitlines()[0][:200])
        return TargetRead(ref_id, "other", (), "does not parse and names none of the group's metrics")
    if not selectors:
        return TargetRead(ref_id, "none", ())
    own = group.name_regex()
    mine: list[str] = []
    others: list[str] = []
    for sel in selectors:
        if sel.name is not None:
            (mine if group.reads(sel.name) else others).append(sel.name)
        elif any(label == "__name__" and op == "=~" and value == own for label, op, value in sel.matchers):
            mine.append(sel.promql())
        else:
            others.append(sel.promql())
    metrics = tuple(dict.fromkeys(mine + others))
    if mine and others:
        return TargetRead(ref_id, MIXED, metrics, "also reads " + ", ".join(dict.fromkeys(others)))
    return TargetRead(ref_id, "group" if mine else "other", metrics)


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Edit:
    """One datasource change: at ``path`` (keys/indexes from the root), ``old`` becomes ``new``.

    ``start``/``end`` is the span replaced in the text (equal for an insertion), ``text`` the new bytes.
    """

    path: tuple[str | int, ...]
    old: Any
    new: Any
    start: int
    end: int
    text: str
    inserted: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"path": _path_text(self.path), "from": self.old, "to": self.new, "inserted": self.inserted}


@dataclass(frozen=True)
class PanelPlan:
    """One panel that reads the group: what it reads, what is decided, and the edits."""

    path: tuple[str | int, ...]
    id: Any
    title: str
    state: str  # switch, already, mixed, unparsed
    targets: tuple[TargetRead, ...]
    edits: tuple[Edit, ...] = ()
    reason: str = ""
    horizon: Mapping[str, Any] | None = None  # with a horizon: its reach and, when it waits, its ready time

    def to_dict(self) -> dict[str, Any]:
        return {"path": _path_text(self.path), "id": self.id, "title": self.title, "state": self.state,
                "reason": self.reason, "horizon": None if self.horizon is None else dict(self.horizon),
                "targets": [{"refId": t.ref_id, "reads": t.state, "metrics": list(t.metrics)} for t in self.targets],
                "edits": [e.to_dict() for e in self.edits]}


def _path_text(path: Sequence[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass(frozen=True)
class DashboardPlan:
    """Every panel of one dashboard that reads the group, and the edit that switches the ones that may."""

    name: str
    uid: str | None
    title: str
    source: DatasourceRef
    target: DatasourceRef
    panels: tuple[PanelPlan, ...]
    variables_reading_group: tuple[str, ...] = ()
    library_panels: tuple[str, ...] = ()
    # How many panel or target datasource values resolve to the source (its uid or name, a Prometheus variable,
    # the default), and the explicit datasource names the dashboard uses: a source matching nothing shows here.
    source_references: int = 0
    datasources_named: tuple[str, ...] = ()

    @property
    def edits(self) -> tuple[Edit, ...]:
        return tuple(e for p in self.panels if p.state == SWITCH for e in p.edits)

    @property
    def changes(self) -> bool:
        return bool(self.edits)

    def by_state(self, state: str) -> tuple[PanelPlan, ...]:
        return tuple(p for p in self.panels if p.state == state)

    def apply(self, text: str) -> str:
        """``text`` with the edits spliced in; checked by re-parsing against the intended model."""
        edits = sorted(self.edits, key=lambda e: (e.start, e.end))
        for a, b in zip(edits, edits[1:], strict=False):
            if b.start < a.end or (b.start == a.start and a.inserted and b.inserted):
                raise ReadPathError(f"overlapping edits at {_path_text(a.path)} and {_path_text(b.path)}")
        out, last = [], 0
        for e in edits:
            out.append(text[last:e.start])
            out.append(e.text)
            last = e.end
        out.append(text[last:])
        new_text = "".join(out)
        expected = apply_to_model(json.loads(text.lstrip("\ufeff")), self.edits)
        try:
            if json.loads(new_text.lstrip("\ufeff")) != expected:
                raise ReadPathError("the edited text does not parse to the intended dashboard")
        except ValueError as exc:
            raise ReadPathError(f"the edited text is not JSON: {exc}") from None
        return new_text

    def to_dict(self) -> dict[str, Any]:
        return {"dashboard": self.name, "uid": self.uid, "title": self.title,
                "from": self.source.to_dict(), "to": self.target.to_dict(),
                "switched": [p.to_dict() for p in self.by_state(SWITCH)],
                "already": [p.to_dict() for p in self.by_state(ALREADY)],
                "mixed": [p.to_dict() for p in self.by_state(MIXED)],
                "unparsed": [p.to_dict() for p in self.by_state(UNPARSED)],
                "waiting": [p.to_dict() for p in self.by_state(WAITING)],
                "edits": len(self.edits), "variables_reading_group": list(self.variables_reading_group),
                "library_panels": list(self.library_panels)}

    def not_switched(self) -> list[dict[str, Any]]:
        """The group's panels left alone on purpose (mixed, unparsed), for the record."""
        return [{"path": _path_text(p.path), "title": p.title, "state": p.state, "reason": p.reason}
                for p in self.panels if p.state in (MIXED, UNPARSED)]


def apply_to_model(model: Any, edits: Sequence[Edit]) -> Any:
    """The parsed dashboard with ``edits`` applied (in place; returned for convenience)."""
    for e in edits:
        holder = model
        for part in e.path[:-1]:
            holder = holder[part]
        holder[e.path[-1]] = json.loads(json.dumps(e.new))
    return model


def _panels(node: Node, path: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], Node]]:
    """Every panel under ``node`` (an object holding ``panels`` / old-schema ``rows``), rows' panels included."""
    for key in ("panels", "rows"):
        arr = node.get(key)
        if arr is None or arr.kind != "array":
            continue
        for i, child in enumerate(arr.elements()):
            if child.kind != "object":
                continue
            cpath = (*path, key, i)
            if key == "panels":
                yield cpath, child
            yield from _panels(child, cpath)


def _datasource_variables(root: Node) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    templating = root.get("templating")
    lst = templating.get("list") if templating is not None else None
    for var in lst.elements() if lst is not None else []:
        if var.kind == "object" and (t := var.get("type")) is not None and t.value == "datasource":
            name = var.get("name")
            query = var.get("query")
            if name is not None and isinstance(name.value, str):
                out[name.value] = query.value if query is not None and isinstance(query.value, str) else None
    return out


def _variables_reading(root: Node, group: MetricGroup, values: Mapping[str, str]) -> tuple[str, ...]:
    templating = root.get("templating")
    lst = templating.get("list") if templating is not None else None
    out = []
    for var in lst.elements() if lst is not None else []:
        if var.kind != "object" or (t := var.get("type")) is None or t.value != "query":
            continue
        query = var.get("query")
        q = query.py() if query is not None else None
        text = q.get("query") if isinstance(q, Mapping) else q
        if not isinstance(text, str):
            continue
        inner = re.sub(r"^\s*(?:label_values|query_result|metrics)\((.*)\)\s*$", r"\1", text, flags=re.S)
        inner = re.sub(r",\s*\w+\s*$", "", inner)
        names = metric_names(substitute(inner, values, builtins=grafana_builtins(60.0, 3600.0)).expr)
        if any(group.reads(n) for n in names):
            name = var.get("name")
            out.append(str(name.value) if name is not None else "?")
    return tuple(out)


def plan_dashboard(text: str, group: MetricGroup, *, source: DatasourceRef, target: DatasourceRef,
                   variables: Mapping[str, str] | None = None, default_is_source: bool = True,
                   name: str = "", horizon: Horizon | None = None) -> DashboardPlan:
    """Plan the read-path switch of one dashboard's text for ``group`` (see the module's decisions).

    ``variables`` are template values (the catalog's ``golden_variables``); they only help parse
    expressions. ``name`` labels the plan (a file name, a dashboard uid). With ``horizon`` (the group's
    dual-write start and now, ``core.horizon``), a panel that would switch but reads further back than the
    target holds is ``waiting`` instead: no edit now, its ready time in ``horizon``.
    """
    if source.names() & target.names():
        raise ReadPathError("the source and the target datasource are the same")
    root = parse_spans(text)
    if root.kind != "object":
        raise ReadPathError("not a Grafana dashboard: the JSON is not an object")
    if root.get("dashboard") is not None and root.get("panels") is None:
        raise ReadPathError("this is an API envelope ({dashboard, meta}); plan its 'dashboard'")
    values = dict(variables or {})
    ds = _Datasources(source, target, _datasource_variables(root), default_is_source)
    new_value = target.ref()
    new_text = json.dumps(new_value, ensure_ascii=False)
    plans: list[PanelPlan] = []
    library: list[str] = []
    source_references = 0
    named: dict[str, None] = {}
    for path, panel in _panels(root, ()):
        targets = panel.get("targets")
        if panel.get("libraryPanel") is not None and (targets is None or not targets.items):
            lib = panel.get("libraryPanel")
            lib_name = lib.get("name") if lib is not None else None
            library.append(str(lib_name.value if lib_name is not None else _path_text(path)))
            continue
        if targets is None or targets.kind != "array":
            continue
        panel_ds_node = panel.get("datasource")
        panel_ds = panel_ds_node.py() if panel_ds_node is not None else None
        panel_kind = ds.classify(panel_ds, panel=True)
        source_references += panel_kind == _SOURCE
        _note_name(panel_ds, named)
        reads: list[TargetRead] = []
        target_kinds: list[tuple[int, Node, str, Node | None]] = []
        for i, t in enumerate(targets.elements()):
            if t.kind != "object":
                continue
            t_ds_node = t.get("datasource")
            t_kind = ds.classify(t_ds_node.py() if t_ds_node is not None else None, panel=False)
            source_references += t_kind == _SOURCE
            _note_name(t_ds_node.py() if t_ds_node is not None else None, named)
            effective = panel_kind if t_kind == _INHERIT else t_kind
            if effective not in (_SOURCE, _TARGET):
                continue  # another datasource: never touched, does not count
            expr_node = t.get("expr")
            expr = expr_node.value.strip() if expr_node is not None and isinstance(expr_node.value, str) else ""
            if not expr:
                continue
            ref = t.get("refId")
            reads.append(target_reads(expr, group, values, ref_id=str(ref.value) if ref is not None else str(i)))
            target_kinds.append((i, t, t_kind, t_ds_node))
        states = {r.state for r in reads}
        if not states & {"group", MIXED, UNPARSED}:
            continue  # does not read the group
        pid = panel.get("id")
        ptitle = panel.get("title")
        common = {"path": path, "id": pid.value if pid is not None else None,
                  "title": str(ptitle.value) if ptitle is not None and ptitle.value is not None else "",
                  "targets": tuple(reads)}
        if states - {"group", "none"}:
            state = UNPARSED if UNPARSED in states and not states & {MIXED, "other"} else MIXED
            why = "; ".join(f"{r.ref_id}: {r.state}" + (f" ({r.reason})" if r.reason else "")
                            for r in reads if r.state not in ("group", "none"))
            plans.append(PanelPlan(**common, state=state, reason=why))
            continue
        try:
            rewrites = _aggregation_rewrites(group, path, target_kinds, reads)
        except PromQLError as exc:
            plans.append(PanelPlan(**common, state=MIXED, reason=f"reads the raw series of a metric the group ships "
                                   f"aggregated (they stay on the source): {exc}"))
            continue
        edits: list[Edit] = []
        inherits = any(kind == _INHERIT for _, _, kind, _ in target_kinds)
        if panel_kind == _SOURCE and (inherits or panel_ds_node is not None):
            if panel_ds_node is not None:
                edits.append(Edit((*path, "datasource"), panel_ds, new_value, panel_ds_node.start,
                                  panel_ds_node.end, new_text))
            else:
                first = panel.items[0][1] if panel.items else panel.end - 1
                gap = text[panel.start + 1:first] if panel.items else ""
                insert = f'"datasource": {new_text},' + (gap or " ")
                edits.append(Edit((*path, "datasource"), None, new_value, first, first, insert, inserted=True))
        for i, _, kind, node in target_kinds:
            if kind == _SOURCE and node is not None:
                edits.append(Edit((*path, "targets", i, "datasource"), node.py(), new_value, node.start, node.end,
                                  new_text))
        edits += rewrites
        if edits and horizon is not None:
            time_node = root.get("time")
            reach = panel_reach(panel.py(), [r_expr for r_expr in _group_exprs(targets, reads)],
                                dashboard_time=time_node.py() if time_node is not None else None,
                                name=f"{name or 'dashboard'} / {common['title'] or _path_text(path)}",
                                scrape_interval_s=horizon.scrape_interval_s, now=horizon.now, variables=values)
            split = horizon.split([reach])
            if split.waiting:
                wait = split.waiting[0]
                when = wait.ready_at.isoformat() if wait.ready_at else "unknown (accept short history to switch)"
                plans.append(PanelPlan(**common, state=WAITING, edits=tuple(edits), horizon=wait.to_dict(),
                                       reason=f"reads {'; '.join(reach.parts)}; the target holds "
                                              f"{wait.held_s:.0f}s; ready at {when}"))
                continue
            info = {**reach.to_dict(), "accepted_short": bool(split.accepted_short)}
            plans.append(PanelPlan(**common, state=SWITCH, edits=tuple(edits), horizon=info))
        elif edits:
            plans.append(PanelPlan(**common, state=SWITCH, edits=tuple(edits)))
        else:
            plans.append(PanelPlan(**common, state=ALREADY, reason="already reads the target datasource"))
    uid = root.get("uid")
    title = root.get("title")
    return DashboardPlan(name=name, uid=uid.value if uid is not None and isinstance(uid.value, str) else None,
                         title=str(title.value) if title is not None and title.value is not None else "",
                         source=source, target=target, panels=tuple(plans),
                         variables_reading_group=_variables_reading(root, group, values),
                         library_panels=tuple(library), source_references=source_references,
                         datasources_named=tuple(named))


def _aggregation_rewrites(group: MetricGroup, path: tuple[str | int, ...],
                          target_kinds: Sequence[tuple[int, Node, str, Node | None]],
                          reads: Sequence[TargetRead]) -> list[Edit]:
    """Each target expression that reads a metric the group ships aggregated, pointed at its recorded series (the
    expression's own text, every other byte kept: ``core.aggregation.rewrite_group_read``); PromQLError naming
    the target when one cannot be (it needs the raw series, or a Grafana variable stands where the parser cannot
    read it)."""
    if not group.aggregations:
        return []
    edits = []
    for (i, t, _, _), read in zip(target_kinds, reads, strict=True):
        if not any(group.aggregate_of(m) for m in read.metrics):
            continue
        node = t.get("expr")
        assert node is not None and isinstance(node.value, str)
        try:
            new = rewrite_group_read(node.value, group.aggregations)
        except PromQLError as exc:
            raise PromQLError(f"{read.ref_id}: {str(exc).splitlines()[0][:200]}") from None
        if new != node.value:
            edits.append(Edit((*path, "targets", i, "expr"), node.value, new, node.start, node.end,
                              json.dumps(new, ensure_ascii=False)))
    return edits


def _group_exprs(targets: Node, reads: Sequence[TargetRead]) -> list[str]:
    """The expressions of a panel's targets that read through the source or the target (what it shows)."""
    wanted = {r.ref_id for r in reads}
    out = []
    for i, t in enumerate(targets.elements()):
        if t.kind != "object":
            continue
        ref, expr = t.get("refId"), t.get("expr")
        ref_id = str(ref.value) if ref is not None else str(i)
        if ref_id in wanted and expr is not None and isinstance(expr.value, str):
            out.append(expr.value)
    return out


def _note_name(value: Any, named: dict[str, None]) -> None:
    """Remember an explicit datasource uid or name (not a variable, not the default) for messages."""
    text = value.get("uid") if isinstance(value, Mapping) else value
    if isinstance(text, str) and text and text not in ("default", MIXED_DATASOURCE) and not _VARIABLE_REF.match(text):
        named.setdefault(text[:60], None)


def unmatched_source(plans: Sequence[DashboardPlan], source: DatasourceRef) -> str | None:
    """One line when the source datasource matches nothing in any of the dashboards (a wrong uid), or None.

    Then the plan is empty not because no panel reads the group but because none reads through the source:
    switching nothing while the group's data moves would leave every such panel blank later.
    """
    if not plans or any(p.source_references or p.panels for p in plans):
        return None
    seen = list(dict.fromkeys(n for p in plans for n in p.datasources_named))
    names = " or ".join(repr(n) for n in sorted(source.names()))
    return (f"source datasource {names} matches no panel or target datasource in {len(plans)} dashboard(s)"
            + (f" (they name {', '.join(repr(n) for n in seen[:5])}{', ...' if len(seen) > 5 else ''})" if seen
               else "") + ": check the read path's source datasource uid")
