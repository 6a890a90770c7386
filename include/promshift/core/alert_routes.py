"""Does a moved alert page someone? An AMP alert manager definition's route tree, walked for a rule's labels.

Pure: the caller fetches the definition (``DescribeAlertManagerDefinition``'s ``data``, the YAML
document with ``alertmanager_config:`` and ``template_files:``) and hands over its bytes.

- ``parse_definition(data)``: the definition's ``alertmanager_config`` (a YAML string, as AMP
  documents it, or a mapping) as an ``AlertRouting``: the route tree and which receivers have an
  integration (any non-empty ``*_configs`` list, e.g. ``sns_configs``). Size and depth are bounded.
- ``AlertRouting.receivers_for(labels)``: the receivers an alert with these labels may reach,
  following Alertmanager's rules: the root route takes every alert; a child route matches when all
  its ``matchers`` / ``match`` / ``match_re`` hold; the first matching child wins unless it says
  ``continue: true``; a route without a matching child handles the alert itself; a route without
  a ``receiver`` inherits its parent's.
- ``alert_route_problem(routing, alerts)``: one line naming the first alert that pages nobody
  (every receiver it may reach has no integration), or None.

An alert's labels are only partly known before it fires: ``alertname`` and the rule's static
``labels:`` are; the series' labels (``instance``, ``gpu``, ...) and templated values are not.
A matcher on an unknown label is *maybe*: the route is followed and its siblings too, so the
check refuses only alerts that certainly reach no integration.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import yaml

from promshift.core.catalog.regex import _compile_re2

MAX_DEFINITION_BYTES = 1_048_576  # AMP's alert manager definition is a blob of at most 1 MB
MAX_ROUTE_DEPTH = 32
MAX_ROUTES = 2_000
# A matcher string: name, operator, value (quoted with Go's escapes, or bare), as Alertmanager parses it.
_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(".*"|[^"]*?)\s*$', re.S)


class AlertRoutesError(ValueError):
    """The alert manager definition cannot be read as a route tree; one line that says where."""


class Match(Enum):
    YES = "yes"
    NO = "no"
    MAYBE = "maybe"


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str  # one of = != =~ !~
    value: str

    def test(self, labels: Mapping[str, str | None]) -> Match:
        """YES/NO for a known label (an absent one is the empty string, as in Alertmanager); MAYBE when
        the label's value is not known before the alert fires (``labels[name]`` is None)."""
        if self.name in labels and labels[self.name] is None:
            return Match.MAYBE
        if self.name not in labels and self.name != "alertname":
            # not set by the rule: the series may carry it (external labels, instance, ...)
            return Match.MAYBE
        value = labels.get(self.name) or ""
        if self.op in ("=", "!="):
            hit = value == self.value
        else:
            hit = _compile_re2(f"^(?:{self.value})$").match(value) is not None
        return Match.YES if hit == (self.op in ("=", "=~")) else Match.NO

    def __str__(self) -> str:
        return f"{self.name}{self.op}{self.value!r}"


@dataclass(frozen=True)
class Route:
    receiver: str | None
    matchers: tuple[Matcher, ...]
    cont: bool
    routes: tuple[Route, ...]

    def match(self, labels: Mapping[str, str | None]) -> Match:
        results = [m.test(labels) for m in self.matchers]
        if Match.NO in results:
            return Match.NO
        return Match.MAYBE if Match.MAYBE in results else Match.YES


@dataclass(frozen=True)
class AlertRouting:
    """An alert manager definition's route tree and its receivers (name -> has an integration)."""

    root: Route
    receivers: Mapping[str, bool]

    def receivers_for(self, labels: Mapping[str, str | None]) -> tuple[str, ...]:
        """Every receiver an alert with ``labels`` may reach (None values: not known before it fires)."""
        found = _walk(self.root, labels, self.root.receiver or "")
        return tuple(dict.fromkeys(found))

    def pages(self, receiver: str) -> bool:
        return bool(self.receivers.get(receiver))


def _walk(route: Route, labels: Mapping[str, str | None], receiver: str) -> list[str]:
    receiver = route.receiver or receiver
    out: list[str] = []
    certain = False
    for child in route.routes:
        matched = child.match(labels)
        if matched is Match.NO:
            continue
        out += _walk(child, labels, receiver)
        if matched is Match.YES:
            certain = True  # this route no longer handles the alert itself
            if not child.cont:
                break
    if not certain:
        out.append(receiver)
    return out


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            return str(yaml.safe_load(value))  # a double-quoted YAML scalar has Go's escapes
        except yaml.YAMLError:
            raise AlertRoutesError(f"matcher value {value[:80]!r} is not a valid quoted string") from None
    return value


def parse_matcher(text: str) -> Matcher:
    found = _MATCHER.match(text) if isinstance(text, str) else None
    if found is None:
        raise AlertRoutesError(f"route matcher {str(text)[:80]!r} is not 'name=value', '!=', '=~' or '!~'")
    matcher = Matcher(found[1], found[2], _unquote(found[3]))
    if matcher.op in ("=~", "!~"):
        _check_regex(matcher.value, f"route matcher {text[:80]!r}")
    return matcher


def _check_regex(value: str, what: str) -> None:
    try:
        _compile_re2(f"^(?:{value})$")
    except Exception:
        raise AlertRoutesError(f"{what}: invalid regular expression") from None


def _route(node: Any, where: str, depth: int, count: list[int]) -> Route:
    if not isinstance(node, Mapping):
        raise AlertRoutesError(f"{where} is not a mapping")
    count[0] += 1
    if depth > MAX_ROUTE_DEPTH or count[0] > MAX_ROUTES:
        raise AlertRoutesError(f"the route tree is deeper than {MAX_ROUTE_DEPTH} or has more than {MAX_ROUTES} routes")
    matchers: list[Matcher] = []
    raw = node.get("matchers") or []
    if not isinstance(raw, list):
        raise AlertRoutesError(f"{where}.matchers is not a list")
    matchers += [parse_matcher(m) for m in raw]
    for key, op in (("match", "="), ("match_re", "=~")):
        pairs = node.get(key) or {}
        if not isinstance(pairs, Mapping):
            raise AlertRoutesError(f"{where}.{key} is not a mapping")
        for name, value in pairs.items():
            matcher = Matcher(str(name), op, str(value))
            if op == "=~":
                _check_regex(matcher.value, f"{where}.match_re.{name}")
            matchers.append(matcher)
    children = node.get("routes") or []
    if not isinstance(children, list):
        raise AlertRoutesError(f"{where}.routes is not a list")
    receiver = node.get("receiver")
    return Route(str(receiver) if receiver else None, tuple(matchers), bool(node.get("continue")),
                 tuple(_route(c, f"{where}.routes[{i}]", depth + 1, count) for i, c in enumerate(children)))


def _load(data: str | bytes, what: str) -> Any:
    try:
        return yaml.safe_load(data)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        raise AlertRoutesError(f"{what} is not valid YAML{at}") from None
    except RecursionError:
        raise AlertRoutesError(f"{what} nests too deeply") from None


def parse_definition(data: str | bytes) -> AlertRouting:
    """An AMP alert manager definition (the YAML document AMP stores) as its route tree and receivers."""
    if len(data) > MAX_DEFINITION_BYTES:
        raise AlertRoutesError(f"the alert manager definition is {len(data)} bytes, over {MAX_DEFINITION_BYTES}")
    document = _load(data, "the alert manager definition")
    if not isinstance(document, Mapping) or "alertmanager_config" not in document:
        raise AlertRoutesError("the alert manager definition has no alertmanager_config")
    config = document["alertmanager_config"]
    if isinstance(config, str | bytes):
        config = _load(config, "alertmanager_config")
    if not isinstance(config, Mapping):
        raise AlertRoutesError("alertmanager_config is not a mapping")
    if not isinstance(config.get("route"), Mapping):
        raise AlertRoutesError("alertmanager_config has no route")
    root = _route(config["route"], "route", 0, [0])
    if not root.receiver:
        raise AlertRoutesError("alertmanager_config's root route names no receiver")
    receivers: dict[str, bool] = {}
    for item in config.get("receivers") or []:
        if isinstance(item, Mapping) and item.get("name"):
            receivers[str(item["name"])] = any(
                key.endswith("_configs") and isinstance(value, list) and bool(value) for key, value in item.items())
    unknown = sorted(r for r in _named_receivers(root) if r not in receivers)
    if unknown:
        raise AlertRoutesError(f"alertmanager_config's routes name undefined receivers: {', '.join(unknown[:5])}")
    return AlertRouting(root, receivers)


def _named_receivers(route: Route) -> set[str]:
    out = {route.receiver} if route.receiver else set()
    for child in route.routes:
        out |= _named_receivers(child)
    return out


def alert_labels(name: str, labels: Mapping[str, Any] | None) -> dict[str, str | None]:
    """What is known of an alert's labels before it fires: ``alertname`` and the rule's static labels
    (a templated value, ``{{ ... }}``, is known only when it fires: None)."""
    out: dict[str, str | None] = {}
    for key, value in (labels or {}).items():
        text = str(value)
        out[str(key)] = None if "{{" in text else text
    out["alertname"] = name
    return out


def alert_route_problem(routing: AlertRouting, alerts: Sequence[tuple[str, Mapping[str, Any] | None]]) -> str | None:
    """One line for the first alert (``(name, rule labels)``) whose every reachable receiver has no
    integration; None when each may page someone."""
    for name, labels in alerts:
        known = alert_labels(name, labels)
        reached = routing.receivers_for(known)
        if not any(routing.pages(r) for r in reached):
            shown = ", ".join(f"{k}={v!r}" for k, v in sorted(known.items()) if v is not None)
            return (f"alert {name} ({shown}) pages nobody: the alert manager definition routes it to receiver "
                    f"{', '.join(repr(r) for r in reached)}, which has no integration")
    return None
