"""Recording and alerting rules that move with their metric group: find, select, extract, cut out.

Pure: the caller reads the files (bytes) and globs the ``rule_files`` patterns; nothing here
touches the disk, the network or the clock.

- ``rule_file_patterns(config)``: the source config's ``rule_files`` (globs relative to the config).
- ``parse_rule_file(path, data)``: a Prometheus rule file's rules in file order.
- ``select_rules(rules, claims)``: the rules whose ``expr`` reads a metric the group claims, plus,
  transitively, the rules that read a recording rule already selected (an alert on
  ``gpu:fb_used:ratio`` moves with the recording rule that reads ``DCGM_FI_DEV_FB_USED``).
- ``rules_document(selection)``: the selected rules as one valid rule file (their groups' names,
  intervals and order kept) for the target.
- ``remove_rules(data, path, selection)``: the source rule file without exactly those rules (a
  group whose rules all move is removed whole); every other byte stays (comments, anchors,
  CRLF, a BOM, a missing final line break). As in ``core.render``, positions come from
  ruamel.yaml's event stream and the edit splices text; the result is checked after the fact:
  it must load as the original minus the selected rules and nothing else, or the edit raises
  (e.g. a removed rule defines an anchor a kept one uses).
- ``add_rule_file(config, path)`` / ``remove_rule_file``: the target config's ``rule_files`` list,
  edited the same way.

Rule files are read as YAML 1.2 (Prometheus reads them with yaml.v3); the extracted document is
written with every ambiguous scalar quoted, so YAML 1.1 and 1.2 read the same values.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

import yaml
from ruamel.yaml.error import YAMLError

from promshift.core import render
from promshift.core.catalog.regex import _compile_re2
from promshift.core.durations import parse_duration
from promshift.core.parity import LabelSet, Points, SampleComparison
from promshift.core.promql import _TOKEN, PromQLError, analyse, metric_names, promql_string
from promshift.core.render import RenderError
from promshift.core.verdicts import Measurement, Verdict, worst

RULE_FILES = "rule_files"
Text = TypeVar("Text", str, bytes)


class RulesError(ValueError):
    """A rule file or config cannot be read or edited as asked; one line that names the file."""


class RuleKind(StrEnum):
    RECORD = "record"
    ALERT = "alert"


@dataclass(frozen=True)
class Rule:
    """One rule as written: where it is (file, group, position) and what it reads."""

    file: str
    group: str
    index: int  # position within its group
    kind: RuleKind
    name: str  # the recorded metric or the alert name
    expr: str
    body: Mapping[str, Any]  # the rule's mapping as loaded (YAML 1.2; aliases resolved)
    reads: tuple[str, ...]  # metric names its expr reads
    # Selectors without a metric name (``{__name__=~"DCGM_FI_DEV_FB_.*"}``): PromQL text and __name__ matchers.
    nameless: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.file, self.group, self.index)

    @property
    def label(self) -> str:
        return f"{self.kind.value} {self.name} ({self.file}: group {self.group!r}, rule {self.index + 1})"


@dataclass(frozen=True)
class RuleGroup:
    """A rule group's own settings (everything but its rules) and its rule count."""

    file: str
    name: str
    settings: Mapping[str, Any]  # interval, limit, ... as loaded
    size: int


@dataclass(frozen=True)
class RuleFile:
    path: str
    groups: tuple[RuleGroup, ...]
    rules: tuple[Rule, ...]


@dataclass(frozen=True)
class Selection:
    """The rules that move with a group, and why each one does."""

    rules: tuple[Rule, ...]  # in file, group and rule order
    groups: tuple[RuleGroup, ...]  # the groups they come from
    why: Mapping[tuple[str, str, int], str] = field(default_factory=dict)
    # Metrics a selected rule reads that neither the group claims nor a selected recording rule makes:
    # the target may not have them, so parity (not this module) decides whether the rule can move.
    foreign: Mapping[tuple[str, str, int], tuple[str, ...]] = field(default_factory=dict)
    # Rules left behind that read selectors without a metric name this module cannot tie to the group.
    unsure: Mapping[tuple[str, str, int], tuple[str, ...]] = field(default_factory=dict)

    @property
    def records(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.kind is RuleKind.RECORD)

    @property
    def alerts(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.kind is RuleKind.ALERT)

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.file for r in self.rules))

    def in_file(self, path: str) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.file == path)

    def whole_groups(self, path: str) -> tuple[str, ...]:
        """Groups of ``path`` all of whose rules move (removed whole from the source)."""
        counts: dict[str, int] = {}
        for r in self.in_file(path):
            counts[r.group] = counts.get(r.group, 0) + 1
        return tuple(g.name for g in self.groups if g.file == path and counts.get(g.name) == g.size)

    def only(self, kind: RuleKind) -> Selection:
        """The same selection with only one kind of rule (e.g. the recording rules, moved first)."""
        rules = tuple(r for r in self.rules if r.kind is kind)
        keys = {r.key for r in rules}
        groups = tuple(g for g in self.groups if any((g.file, g.name) == (r.file, r.group) for r in rules))
        return Selection(rules, groups, {k: v for k, v in self.why.items() if k in keys},
                         {k: v for k, v in self.foreign.items() if k in keys}, self.unsure)

    def to_dict(self) -> dict[str, Any]:
        return {"rules": [{"file": r.file, "group": r.group, "index": r.index, "kind": r.kind.value, "name": r.name,
                           "expr": r.expr, "why": self.why.get(r.key, ""),
                           "foreign_reads": list(self.foreign.get(r.key, ()))} for r in self.rules],
                "records": len(self.records), "alerts": len(self.alerts),
                "unsure": [{"rule": "/".join(map(str, k)), "selectors": list(v)} for k, v in self.unsure.items()]}


# -- reading ---------------------------------------------------------------------------------------


def _text(data: str | bytes, what: str) -> str:
    try:
        return render._decode(data)
    except RenderError as exc:
        raise RulesError(f"{what}: {exc}") from None


def _load(text: str, what: str) -> Any:
    try:
        return render._load12(text)
    except YAMLError as exc:
        raise RulesError(f"{what} is not valid YAML: {render._first_line(exc)}") from None
    except RenderError as exc:  # the input budget, or one of its own refusals
        raise RulesError(f"{what}: {str(exc).removeprefix('source config: ')}") from None


def rule_file_patterns(config: str | bytes) -> tuple[str, ...]:
    """The config's ``rule_files`` entries (globs; relative ones are relative to the config file)."""
    data = _load(_text(config, "the config"), "the config") or {}
    if not isinstance(data, dict):
        raise RulesError("the config must be a YAML mapping at the top level")
    patterns = data.get(RULE_FILES) or []
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise RulesError(f"{RULE_FILES} must be a list of file globs")
    return tuple(patterns)


# A recording rule's name is a metric name (Prometheus: model.IsValidMetricName).
_RECORD_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _is_duration(value: Any) -> bool:
    """A Prometheus duration with its unit (``1m``, ``30s``); Prometheus refuses a bare number for an interval."""
    if not isinstance(value, str) or not value or value.replace(".", "", 1).isdigit():
        return False
    try:
        return parse_duration(value) > 0
    except ValueError:
        return False


def parse_rule_file(path: str, data: str | bytes) -> RuleFile:
    """Read one Prometheus rule file (``groups: [{name, interval?, rules: [{record|alert, expr, ...}]}]``)."""
    loaded = _load(_text(data, path), path)
    if loaded is None:
        return RuleFile(path, (), ())
    if not isinstance(loaded, dict) or not isinstance(loaded.get("groups") or [], list):
        raise RulesError(f"{path}: a rule file is a mapping with a `groups` list")
    groups: list[RuleGroup] = []
    rules: list[Rule] = []
    seen: set[str] = set()
    for gi, group in enumerate(loaded.get("groups") or []):
        if not isinstance(group, dict) or not isinstance(group.get("name"), str):
            raise RulesError(f"{path}: group {gi + 1} has no name")
        name = group["name"]
        if name in seen:
            raise RulesError(f"{path}: group {name!r} is defined twice")
        seen.add(name)
        items = group.get("rules") or []
        if not isinstance(items, list):
            raise RulesError(f"{path}: group {name!r}: `rules` must be a list")
        interval = group.get("interval")
        if interval is not None and not _is_duration(interval):
            raise RulesError(f"{path}: group {name!r}: interval {str(interval)[:40]!r} is not a duration such as 1m "
                             "(Prometheus refuses the file)")
        groups.append(RuleGroup(path, name, {k: v for k, v in group.items() if k != "rules"}, len(items)))
        for ri, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get("expr"), str | int | float):
                raise RulesError(f"{path}: group {name!r}, rule {ri + 1}: needs an `expr`")
            kind = RuleKind.RECORD if "record" in item else RuleKind.ALERT if "alert" in item else None
            if kind is None or ("record" in item and "alert" in item):
                raise RulesError(f"{path}: group {name!r}, rule {ri + 1}: needs exactly one of `record` or `alert`")
            if kind is RuleKind.RECORD and not (isinstance(item["record"], str)
                                                and _RECORD_NAME.fullmatch(item["record"])):
                raise RulesError(f"{path}: group {name!r}, rule {ri + 1}: record {str(item['record'])[:80]!r} is not a "
                                 "valid metric name (Prometheus refuses the file)")
            expr = str(item["expr"])
            try:
                analyse(expr)
            except PromQLError as exc:
                # Read off its identifiers, an invalid expr would claim to read metrics `sum`, `rate`, ...
                shown = " ".join(str(exc).split())[:200]
                raise RulesError(f"{path}: group {name!r}, rule {ri + 1} ({kind.value} "
                                 f"{str(item[kind.value])[:80]!r}): expr is not valid PromQL: {shown}") from None
            rules.append(Rule(path, name, ri, kind, str(item[kind.value]), expr, dict(item),
                              tuple(dict.fromkeys(metric_names(expr))), _nameless(expr)))
    return RuleFile(path, tuple(groups), tuple(rules))


def _nameless(expr: str) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    try:
        selectors = analyse(expr).selectors
    except PromQLError:
        return ()
    return tuple((s.promql(), tuple((op, value) for label, op, value in s.matchers if label == "__name__"))
                 for s in selectors if s.name is None)


def _name_matches(matchers: Sequence[tuple[str, str]], name: str) -> bool:
    """Whether a selector's ``__name__`` matchers select ``name`` (regexes fully anchored, as in Prometheus)."""
    for op, value in matchers:
        hit = name == value if op in ("=", "!=") else _compile_re2(value).fullmatch(name) is not None
        if hit != (op in ("=", "=~")):
            return False
    return True


# -- selecting -------------------------------------------------------------------------------------


def select_rules(files: Iterable[RuleFile], claims: Callable[[str], bool], *,
                 candidates: Iterable[str] = ()) -> Selection:
    """The rules that read the group (``claims(metric_name)``), directly or through selected recording rules.

    Repeated to a fixed point, so a chain (alert -> recording rule -> recording rule -> group) moves
    whole, wherever in the files its links are. A selector without a metric name
    (``{__name__=~"DCGM_FI_DEV_FB_.*"}``) reads the group when its ``__name__`` matchers select one of
    ``candidates`` (the group's known metric names). One with no ``__name__`` matcher at all (or any,
    when no candidates are given) may read anything: its rule is named in ``Selection.unsure`` and
    does not move on its own.
    """
    known = tuple(candidates)
    all_files = list(files)
    rules = [r for f in all_files for r in f.rules]
    why: dict[tuple[str, str, int], str] = {}
    made: set[str] = set()
    changed = True
    while changed:
        changed = False
        for r in rules:
            if r.key in why:
                continue
            direct = [m for m in r.reads if claims(m)]
            direct += [sel for sel, matchers in r.nameless
                       if matchers and any(claims(m) and _name_matches(matchers, m) for m in known)]
            via = [m for m in r.reads if m in made]
            if direct or via:
                why[r.key] = (f"reads {', '.join(direct)}" if direct else f"reads recording rule {', '.join(via)}")
                if r.kind is RuleKind.RECORD:
                    made.add(r.name)
                changed = True
    chosen = tuple(r for r in rules if r.key in why)
    foreign = {r.key: tuple(m for m in r.reads if not claims(m) and m not in made) for r in chosen}
    groups = tuple(g for f in all_files for g in f.groups if any((g.file, g.name) == (r.file, r.group) for r in chosen))
    unsure = {r.key: tuple(sel for sel, matchers in r.nameless if not matchers or not known)
              for r in rules if r.key not in why and r.nameless}
    return Selection(chosen, groups, why, {k: v for k, v in foreign.items() if v},
                     {k: v for k, v in unsure.items() if v})


# -- the target's document -------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """Block style, multi-line strings as literal blocks, keys in their written order."""


def _str(dumper: yaml.SafeDumper, value: str) -> Any:
    style = "|" if "\n" in value and value == value.strip(" ") and "\r" not in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def rules_document(selection: Selection, *, header: str = "") -> str:
    """The selected rules as one Prometheus rule file: their groups (name, interval, limit) in order.

    Two source files with a group of the same name cannot share one document: refused.
    ``header`` (comment lines) goes on top.
    """
    names: dict[str, str] = {}
    groups: list[dict[str, Any]] = []
    for g in selection.groups:
        if g.name in names:
            raise RulesError(f"rule group {g.name!r} is in both {names[g.name]} and {g.file}; rename one")
        names[g.name] = g.file
        body = {k: _plain(v) for k, v in g.settings.items()}
        body["rules"] = [_plain(r.body) for r in selection.rules if (r.file, r.group) == (g.file, g.name)]
        groups.append(body)
    text = yaml.dump({"groups": groups}, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=100_000)
    lines = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return lines + text


def _plain(value: Any) -> Any:
    """Loaded YAML as plain dicts, lists and scalars (what the dumper knows)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


# -- cutting the rules out of the source file ------------------------------------------------------


def remove_rules(data: Text, path: str, selection: Selection) -> Text:
    """``data`` (rule file ``path``) without the selected rules; every other byte as it was.

    A group all of whose rules are selected goes whole (its ``- name:`` item); otherwise only the
    rules' items go. Flow-style lists are refused (edit by hand).
    """
    if isinstance(data, bytes):
        return _remove_rules(_text(data, path), path, selection).encode("utf-8")
    return _remove_rules(data, path, selection)


def _map_get(node: render._Node, key: str) -> render._Node | None:
    for k, v in zip(node.children[::2], node.children[1::2], strict=True):
        if k.kind == "scalar" and k.value == key:
            return v
    return None


def _seq_items(node: render._Node | None, what: str, path: str) -> list[render._Node]:
    if node is None or (node.kind == "scalar" and node.empty):
        return []
    if node.kind == "alias" or node.anchor is not None:
        raise RulesError(f"{path}: {what} is an alias or has an anchor; edit it by hand")
    if node.kind != "seq":
        raise RulesError(f"{path}: {what} is not a list")
    if node.flow:
        raise RulesError(f"{path}: {what} is a flow-style list ([...]); edit it by hand")
    return node.children


def _remove_rules(text: str, path: str, selection: Selection) -> str:
    chosen = selection.in_file(path)
    if not chosen:
        return text
    before = parse_rule_file(path, text)
    if {r.key: r.expr for r in before.rules if r.key in {c.key for c in chosen}} != {c.key: c.expr for c in chosen}:
        raise RulesError(f"{path} changed since its rules were selected; select again")
    try:
        doc = render._parse(text)
    except RenderError as exc:
        raise RulesError(f"{path}: {exc}") from None
    root = doc.root
    if root is None or root.kind != "map" or root.flow:
        raise RulesError(f"{path}: a rule file is a block mapping with a `groups` list")
    group_items = _seq_items(_map_get(root, "groups"), "groups", path)
    whole = set(selection.whole_groups(path))
    spans: list[tuple[int, int]] = []
    for g_node, g in zip(group_items, before.groups, strict=True):
        if g_node.kind != "map" or g_node.flow:
            raise RulesError(f"{path}: group {g.name!r} is not a block mapping; edit it by hand")
        if g.name in whole:
            spans.append(_item_span(doc, g_node, f"group {g.name!r}", path))
            continue
        rule_items = _seq_items(_map_get(g_node, "rules"), f"group {g.name!r}'s rules", path)
        for r in chosen:
            if r.group == g.name:
                spans.append(_item_span(doc, rule_items[r.index], r.label, path))
    spans.sort()
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise RulesError(f"{path}: rules share lines; edit it by hand")
    new = text
    for start, end in reversed(spans):
        new = new[:start] + new[end:]
    _check_removed(text, new, path, selection)
    return new


def _item_span(doc: render._Doc, item: render._Node, what: str, path: str) -> tuple[int, int]:
    """The lines of a block-list item: from its dash's line to the line after its content."""
    text = doc.text
    i = item.start
    while i > 0 and text[i - 1] in " \t" + render._BREAK_CHARS:
        i -= 1
    if i == 0 or text[i - 1] != "-":
        raise RulesError(f"{path}: cannot find the '-' of {what}; edit it by hand")
    dash = i - 1
    start = render._line_start(doc, dash)
    if text[start:dash].strip(" "):
        raise RulesError(f"{path}: {what} does not start its own line; edit it by hand")
    try:
        end = render._next_line(doc, item.end)
    except RenderError as exc:
        raise RulesError(f"{path}: {exc}") from None
    if end == len(text) and render._break_before(text, end) == 0:
        start -= render._break_before(text, start)  # the last line: take the break before it
    return start, end


def _check_removed(old: str, new: str, path: str, selection: Selection) -> None:
    """The edited file must load as the old one minus the selected rules (and emptied groups)."""
    try:
        loaded_old, loaded_new = render._load12(old), render._load12(new)
    except (YAMLError, RenderError) as exc:
        raise RulesError(f"{path}: removing the rules would break the file ({render._first_line(exc)}); "
                         "does a removed rule define an anchor another rule uses? Edit it by hand") from None
    keys = {r.key for r in selection.in_file(path)}
    whole = set(selection.whole_groups(path))
    want = dict(loaded_old)
    groups = []
    for g in loaded_old.get("groups") or []:
        if g["name"] in whole:
            continue
        kept = [r for i, r in enumerate(g.get("rules") or []) if (path, g["name"], i) not in keys]
        groups.append({**g, "rules": kept} if "rules" in g else g)
    want["groups"] = groups
    have = dict(loaded_new or {})
    have["groups"] = have.get("groups") or []
    if render._canon(want) != render._canon(have):
        raise RulesError(f"internal error: removing the rules from {path} would change more than those rules; "
                         "the file was left untouched")


# -- the target config's rule_files ----------------------------------------------------------------


def add_rule_file(config: Text, rule_path: str) -> Text:
    """The config with ``rule_path`` appended to ``rule_files`` (the key added, marked, when missing).

    A no-op when the path is already listed. Every other byte stays.
    """
    return render._edit(config, lambda text: _add_rule_file(text, rule_path))


def remove_rule_file(config: Text, rule_path: str) -> Text:
    """The config without the ``rule_files`` entry ``rule_path`` (and the key, if promshift added it)."""
    return render._edit(config, lambda text: _remove_rule_file(text, rule_path))


def _rule_files(doc: render._Doc) -> tuple[render._Node, render._Node] | None:
    try:
        root = render._root_mapping(doc)
    except RenderError as exc:
        raise RulesError(str(exc)) from None
    if root is None:
        return None
    found = [(k, v) for k, v in zip(root.children[::2], root.children[1::2], strict=True)
             if k.kind == "scalar" and k.value == RULE_FILES]
    if not found:
        if any(k.kind == "scalar" and k.value == "<<" for k in root.children[::2]):
            raise RulesError(f"the config merges keys into its top level (<<); add {RULE_FILES} by hand")
        return None
    key, value = found[0]
    _seq_items(value, RULE_FILES, "the config")
    return key, value


def _add_rule_file(text: str, rule_path: str) -> str:
    patterns = rule_file_patterns(text)
    if rule_path in patterns:
        return text
    try:
        doc = render._parse(text)
    except RenderError as exc:
        raise RulesError(str(exc)) from None
    found = _rule_files(doc)  # a block list (flow lists are refused), ``rule_files:`` alone, or None
    try:
        new = render._append_item(doc, found, render._root_mapping(doc), RULE_FILES, rule_path)
    except render.BlockScalarAtEnd:
        raise RulesError("the config ends in a block scalar (| or >) without a final line break; add one") from None
    _check_rule_files(text, new, [*patterns, rule_path])
    return new


def _remove_rule_file(text: str, rule_path: str) -> str:
    patterns = rule_file_patterns(text)
    if rule_path not in patterns:
        return text
    doc = render._parse(text)
    found = _rule_files(doc)
    assert found is not None
    key, value = found
    index = patterns.index(rule_path)
    start, end = _item_span(doc, value.children[index], f"{RULE_FILES} entry {rule_path!r}", "the config")
    if len(value.children) == 1:
        key_start = render._line_start(doc, key.start)
        key_line = text[key_start:start].rstrip(render._BREAK_CHARS)
        if key_line == f"{' ' * render._column(doc, key.start)}{RULE_FILES}:  {render.ADDED_KEY_COMMENT}":
            start = key_start
    new = text[:start] + text[end:]
    _check_rule_files(text, new, [p for p in patterns if p != rule_path])
    return new


def _check_rule_files(old: str, new: str, want: Sequence[str]) -> None:
    before, after = dict(render._load12(old) or {}), dict(render._load12(new) or {})
    before.pop(RULE_FILES, None)
    got = after.pop(RULE_FILES, None) or []
    if render._canon(before) != render._canon(after) or list(got) != list(want):
        raise RulesError(f"internal error: editing {RULE_FILES} would change more than that list; "
                         "the config was left untouched")


# -- parity: a moved rule's expression on both backends ------------------------------------------


_LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})


def inline_recording_rules(expr: str, records: Mapping[str, Rule], *, depth: int = 8) -> str:
    """``expr`` with each read of a recording rule in ``records`` replaced by the rule's own expression.

    Before the move the target has no recorded series (nobody evaluates the rule there, and the
    group's keep-filter does not send them), so a rule reading one is compared through its
    definition: ``rec`` becomes ``(expr)``, ``rec[5m]`` the subquery ``(expr)[5m:]``, and the
    rule's ``labels`` are set with ``label_replace``. A read with label matchers, an offset or
    ``@`` cannot be rewritten in PromQL 2.x: PromQLError (the caller reports it INCONCLUSIVE).
    """
    for _ in range(depth):
        reads = [r for r in analyse(expr).reads if r.selector.name in records]
        if not reads:
            return expr
        for r in reads:
            if r.selector.matchers:
                raise PromQLError(f"reads recording rule {r.selector.name} with label matchers; "
                                  "compared after it moves")
            if r.anchor != "t" or r.ahead_s:
                raise PromQLError(f"reads recording rule {r.selector.name} with an offset or @; "
                                  "compared after it moves")
        tokens = _TOKEN.findall(expr)
        out: list[str] = []
        braces = 0
        labels = False  # inside a by/without/on/ignoring/group_* label list
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            prev = next((t for t in reversed(out) if not t.isspace()), "")
            braces += {"{": 1, "}": -1}.get(tok, 0)
            if tok == "(":
                labels = prev in _LABEL_LISTS
            elif tok == ")":
                labels = False
            rule = records.get(tok)
            if rule is None or braces or labels:
                out.append(tok)
                i += 1
                continue
            body = f"({rule.expr.strip()})"
            for k, v in (rule.body.get("labels") or {}).items():
                body = f"label_replace({body}, {promql_string(str(k))}, {promql_string(str(v))}, \"\", \"\")"
            j = i + 1
            while j < len(tokens) and tokens[j].isspace():
                j += 1
            if j < len(tokens) and tokens[j] == "[":
                k = j
                while k < len(tokens) and tokens[k] != "]":
                    k += 1
                inner = "".join(tokens[j + 1:k])
                body += "[" + inner + ("" if ":" in inner else ":") + "]"
                i = k + 1
            else:
                i += 1
            out.append(body)
        expr = "".join(out)
    raise PromQLError(f"recording rules nest deeper than {depth}")


def rule_parity_name(rule: Rule) -> str:
    return f"rules[{rule.kind.value} {rule.name}]"


def rule_measurement(rule: Rule, expr: str, source: Mapping[LabelSet, Points], target: Mapping[LabelSet, Points],
                     *, abs_tol: float, rel_tol: float, window: Mapping[str, float],
                     noise_k: float = 0.0) -> Measurement:
    """One moved rule's expression compared point by point over the window (normalized series per side).

    ``noise_k`` as for the samples layer (``SampleComparison``): on the managed-scraper path the two sides
    scraped at different instants, so a rule over a noisy gauge may differ by its own jitter.

    Nothing on either side is INCONCLUSIVE, never SUCCESSFUL: an alert quiet on both sides, or a
    recording rule with no input, proves nothing. Answers on one side only FAIL (the rule would
    record or fire differently after the move).
    """
    name = rule_parity_name(rule)
    queries = (expr,) if expr == rule.expr else (rule.expr, expr)
    numbers = {"source_series": len(source), "target_series": len(target), "window": dict(window),
               "kind": rule.kind.value, "file": rule.file, "group": rule.group}
    if not source and not target:
        what = "the alert is quiet on both sides" if rule.kind is RuleKind.ALERT else "no data on either side"
        return Measurement(name, Verdict.INCONCLUSIVE, f"{what}: nothing to compare", queries, numbers)
    comparison = SampleComparison(abs_tol=abs_tol, rel_tol=rel_tol, noise_k=noise_k)
    comparison.add(source, target)
    m = comparison.measurement(queries)
    if not source or not target:
        side = "target" if source else "source"
        return Measurement(name, Verdict.FAILED, f"no answer on the {side}: {m.reason}", queries,
                           {**m.numbers, **numbers})
    return Measurement(name, m.verdict, m.reason, queries, {**m.numbers, **numbers})


def rules_verdict(measurements: Sequence[Measurement]) -> Measurement:
    """The rules layer's own line: the worst rule wins; no rules compared is INCONCLUSIVE."""
    verdict = worst(m.verdict for m in measurements)
    counts = {v.value: sum(m.verdict == v for m in measurements) for v in Verdict}
    reason = ("no rule compared" if not measurements else
              ", ".join(f"{n} {k.lower()}" for k, n in counts.items() if n) + f" of {len(measurements)} rules")
    return Measurement("rules", verdict, reason, (), {"rules": len(measurements), **counts})


# -- the seams the adapters fill -------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedRule:
    """One rule a backend reports loaded (``/api/v1/rules``): its file, group, kind and name; and how its
    evaluation goes (health ``ok``/``err``/``unknown``, ``lastError``, ``lastEvaluation`` as reported, its
    group's evaluation interval in seconds), when the answer says."""

    file: str
    group: str
    kind: RuleKind
    name: str
    health: str = ""
    last_error: str = ""
    last_evaluation: str = ""
    interval_s: float | None = None


def rule_kind_of(api_type: str) -> RuleKind:
    """``/api/v1/rules``' ``recording``/``alerting`` as a RuleKind."""
    return RuleKind.RECORD if api_type == "recording" else RuleKind.ALERT


def missing_rules(expected: Iterable[Rule], loaded: Iterable[LoadedRule], *,
                  same_file: Callable[[str, str], bool] | None = None) -> list[Rule]:
    """The expected rules a backend does not report loaded (matched by group, kind and name, and file if asked)."""
    have = list(loaded)
    return [r for r in expected
            if not any((lr.group, lr.kind, lr.name) == (r.group, r.kind, r.name)
                       and (same_file is None or same_file(r.file, lr.file)) for lr in have)]


def alert_states(alerts: Iterable[Rule], source: Iterable[LoadedRule], target: Iterable[LoadedRule]) -> dict[str, str]:
    """Per moved alert, where it is evaluated now: ``source``, ``target``, ``both`` or ``neither``.

    The handoff must never leave an alert on ``both`` (double pages) or ``neither`` (no page)
    at any verified step; tests record this after every step.
    """
    src = {(lr.group, lr.name) for lr in source if lr.kind is RuleKind.ALERT}
    tgt = {(lr.group, lr.name) for lr in target if lr.kind is RuleKind.ALERT}
    out = {}
    for a in alerts:
        on = ((a.group, a.name) in src, (a.group, a.name) in tgt)
        out[f"{a.group}/{a.name}"] = {(True, True): "both", (True, False): "source", (False, True): "target",
                       (False, False): "neither"}[on]
    return out
