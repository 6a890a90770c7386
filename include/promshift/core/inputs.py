"""Input budgets: what promshift accepts from a user's file or a server before parsing a byte of it.

Every YAML or JSON document a user or a server hands us (source Prometheus configs, the catalog, rule
files, Grafana dashboards, ConfigMaps, prices) goes through one of these budgets:

- **size**: refused before it is read whole (``adapters.files`` reads at most ``max_bytes + 1``);
- **depth**: nesting deeper than ``max_depth`` (PyYAML's composer and Python's ``json`` recurse);
- **alias expansion**: every node an alias stands for counts, while composing, before any value is built;
  a 600-byte "billion laughs" bomb asks for billions of nodes and is refused at its first alias past
  the budget, so it costs microseconds and no memory. Aliases stay legal (``<<: *defaults``); they just
  cost what writing the block out would cost;
- **one scalar's length**: no field needs megabytes, and a huge value must never reach an error line;
- **UTF-8**: a file in another encoding is one line naming the first bad byte.

Pure: callers hand in text or bytes; ``adapters.files`` does the reading (regular files only, a deadline).
A refusal is an ``InputRefused`` (a ``ValueError``) whose message is one line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.events import AliasEvent, ScalarEvent

MiB = 1 << 20


class InputRefused(ValueError):
    """Input outside its budget, or unreadable as what it should be; the message is one line."""


@dataclass(frozen=True)
class InputBudget:
    """The limits for one kind of input; ``what`` names it in every refusal ("source config")."""

    what: str
    max_bytes: int
    max_depth: int = 64
    max_alias_nodes: int = 100_000
    max_scalar_chars: int = MiB
    read_timeout_s: float = 10.0


# A source Prometheus config: kube-prometheus-stack renders 1-5 MB; 32 MiB leaves room and bounds memory
# (render holds the text and its positions: about 40 bytes of Python per byte of YAML at worst).
CONFIG = InputBudget("source config", max_bytes=32 * MiB)
# Prometheus rule files and Grafana dashboard JSON: large dashboards are a few MB.
RULES = InputBudget("rule file", max_bytes=16 * MiB)
DASHBOARD = InputBudget("dashboard", max_bytes=16 * MiB, max_depth=128)
# The catalog: its own, tighter limits (core/catalog/loader.py says why), reviewed like code.
CATALOG = InputBudget("catalog", max_bytes=64 * MiB, max_depth=32, max_alias_nodes=10_000,
                      max_scalar_chars=65_536)
# Small settings files (AMP prices) and a managed scraper's configuration blob.
SETTINGS = InputBudget("settings file", max_bytes=1 * MiB, max_depth=16, max_alias_nodes=1_000)


def clip(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def decode_utf8(data: bytes, what: str = "input") -> str:
    """``data`` as text; anything but UTF-8 is one line naming the first bad byte (a BOM stays in the text)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputRefused(f"{what} is not valid UTF-8 at byte {exc.start} "
                           f"({data[exc.start:exc.start + 1]!r}); save it as UTF-8") from None


def check_size(data: str | bytes, budget: InputBudget) -> None:
    """Refuse ``data`` over the budget's size (counted in UTF-8 bytes)."""
    if isinstance(data, bytes) or len(data) > budget.max_bytes:
        size = len(data)  # a character is at least one byte: over already
    elif len(data) * 4 <= budget.max_bytes:
        return  # a character is at most four bytes: under for sure, no copy needed
    else:
        size = len(data.encode("utf-8", "surrogatepass"))
    if size > budget.max_bytes:
        raise InputRefused(f"{budget.what} is {size:,} bytes, more than the {budget.max_bytes:,} allowed")


class YamlBudgetCounter:
    """Depth, alias expansion and scalar length, counted node by node while a YAML document is composed.

    Fed by a composer (``enter``/``leave`` around each node, ``alias`` for each alias) or by a plain event
    stream (``feed``). An anchor's size is every node composed under it, aliases' expansions included,
    so each alias costs exactly what writing its value out would cost.
    """

    def __init__(self, budget: InputBudget) -> None:
        self.budget = budget
        self.depth = 0
        self.nodes = 0  # nodes composed plus nodes reached through aliases
        self.alias_nodes = 0
        self.sizes: dict[str, int] = {}
        self._open: list[tuple[str | None, int]] = []

    def enter(self, anchor: str | None, scalar: str | None = None) -> None:
        if self.depth >= self.budget.max_depth:
            raise self.too_deep()
        if scalar is not None and len(scalar) > self.budget.max_scalar_chars:
            raise self.too_long(scalar)
        self._open.append((anchor, self.nodes))
        self.nodes += 1
        self.depth += 1

    def leave(self) -> None:
        anchor, before = self._open.pop()
        self.depth -= 1
        if anchor is not None:
            self.sizes[anchor] = self.nodes - before

    def alias(self, anchor: str, open_anchors: Iterable[str | None] = ()) -> int:
        """Count an alias; returns how many nodes it stands for (``open_anchors``: those still being composed,
        for a caller that tracks nesting itself)."""
        size = self.sizes.get(anchor)
        if size is None:
            if any(name == anchor for name, _ in self._open) or anchor in open_anchors:
                raise InputRefused(f"alias *{clip(anchor)} refers to a value that contains it")
            raise InputRefused(f"found undefined alias *{clip(anchor)} (no anchor of that name before it)")
        self.alias_nodes += size
        if self.alias_nodes > self.budget.max_alias_nodes:
            raise InputRefused(f"aliases expand to more than {self.budget.max_alias_nodes:,} values "
                               "(an alias bomb?); write the values out or share less")
        self.nodes += size
        return size

    def too_deep(self) -> InputRefused:
        return InputRefused(f"nesting deeper than {self.budget.max_depth} levels")

    def too_long(self, scalar: str) -> InputRefused:
        return InputRefused(f"a value of {len(scalar):,} characters (the limit is {self.budget.max_scalar_chars:,})")

    def feed(self, event: Any) -> None:
        """Count one parser event (PyYAML's or ruamel.yaml's: the same attribute names)."""
        name = type(event).__name__
        if name == "ScalarEvent":
            self.enter(event.anchor, event.value)
            self.leave()
        elif name in ("MappingStartEvent", "SequenceStartEvent"):
            self.enter(event.anchor)
        elif name in ("MappingEndEvent", "SequenceEndEvent"):
            self.leave()
        elif name == "AliasEvent":
            self.alias(event.anchor)


def _where(exc: BaseException, mark: Any) -> str:
    return f"{exc} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else str(exc)


def check_yaml_events(events: Iterable[Any], budget: InputBudget) -> None:
    """Run a YAML event stream through the budget; an InputRefused names the line and column."""
    counter = YamlBudgetCounter(budget)
    for event in events:
        try:
            counter.feed(event)
        except InputRefused as exc:
            raise InputRefused(f"{budget.what}: {_where(exc, event.start_mark)}") from None


class BudgetedComposer:
    """A PyYAML loader mixin: the budget while composing, before a single value is built.

    ``yaml.CSafeLoader`` composes in C, out of reach of these checks: mix this into a loader with
    ``Composer`` (Python) over ``CParser`` (LibYAML's scanner and parser) for speed.
    """

    input_budget: InputBudget = CONFIG

    def _start_budgets(self) -> None:
        self._counter = YamlBudgetCounter(self.input_budget)

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[attr-defined]
        try:
            if isinstance(event, AliasEvent):
                self._counter.alias(event.anchor)
                return super().compose_node(parent, index)  # type: ignore[misc]
            self._counter.enter(event.anchor, event.value if isinstance(event, ScalarEvent) else None)
        except InputRefused as exc:
            raise yaml.composer.ComposerError(None, None, str(exc), event.start_mark) from None
        try:
            return super().compose_node(parent, index)  # type: ignore[misc]
        finally:
            self._counter.leave()


class _BudgetedSafeLoader(BudgetedComposer, yaml.SafeLoader):
    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._start_budgets()


_LOADER: type = _BudgetedSafeLoader
if yaml.__with_libyaml__:
    from yaml._yaml import CParser  # type: ignore[import-not-found]

    class _FastBudgetedSafeLoader(BudgetedComposer, yaml.composer.Composer, CParser,  # type: ignore[misc]
                                  yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
        """LibYAML scans and parses; composing stays in Python, with the budget."""

        def __init__(self, stream: Any) -> None:
            CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            self._start_budgets()

    _LOADER = _FastBudgetedSafeLoader


def yaml_error_line(exc: yaml.YAMLError) -> str:
    """A PyYAML error as one line with its position."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        what = " ".join(part for part in (exc.context, exc.problem) if part)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return f"{clip(' '.join(what.split()), 200)}{where}"
    return clip(" ".join(str(exc).split()), 200)


def parse_yaml_bounded(data: str | bytes, budget: InputBudget) -> Any:
    """``yaml.safe_load`` (YAML 1.1, as Prometheus' go-yaml reads it) within ``budget``; one-line InputRefused."""
    check_size(data, budget)
    text = decode_utf8(data, budget.what) if isinstance(data, bytes) else data
    loader = type(f"{budget.what}-loader", (_LOADER,), {"input_budget": budget})
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader with budgets
    except yaml.YAMLError as exc:
        raise InputRefused(f"{budget.what} is not valid YAML: {yaml_error_line(exc)}") from None
    except (UnicodeError, RecursionError) as exc:
        raise InputRefused(f"{budget.what} cannot be read: {clip(str(exc), 120)}") from None


def json_depth(value: Any) -> int:
    """How deeply ``value``'s lists and mappings nest (iterative: no recursion limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            items: Iterable[Any] = item.values()
        elif isinstance(item, list):
            items = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in items)
    return deepest


def parse_json_bounded(data: str | bytes, budget: InputBudget) -> Any:
    """``json.loads`` within ``budget`` (size, then depth); one-line InputRefused."""
    check_size(data, budget)
    text = decode_utf8(data, budget.what) if isinstance(data, bytes) else data
    try:
        value = json.loads(text.lstrip("\ufeff"))
    except RecursionError:
        raise InputRefused(f"{budget.what}: nesting deeper than {budget.max_depth} levels") from None
    except ValueError as exc:
        raise InputRefused(f"{budget.what} is not valid JSON: {clip(str(exc), 200)}") from None
    if json_depth(value) > budget.max_depth:
        raise InputRefused(f"{budget.what}: nesting deeper than {budget.max_depth} levels")
    return value


__all__ = [
    "CATALOG", "CONFIG", "DASHBOARD", "RULES", "SETTINGS", "BudgetedComposer", "InputBudget", "InputRefused",
    "YamlBudgetCounter", "check_size", "check_yaml_events", "clip", "decode_utf8", "json_depth",
    "parse_json_bounded", "parse_yaml_bounded", "yaml_error_line",
]
