"""kube-prometheus-stack's agent switch in the team's Helm values, edited byte for byte (pure).

The chart (prometheus-community/helm-charts, ``charts/kube-prometheus-stack``) has ``prometheus.agentMode``
(default ``false``, "Toggle prometheus into agent mode"). Its ``templates/prometheus/prometheus.yaml`` then renders
``kind: PrometheusAgent`` (``monitoring.coreos.com/v1alpha1``) instead of ``kind: Prometheus`` under the same name,
and leaves out every server-only field (alerting, rules selectors, retention, query, remote read, Thanos, exemplars,
admin API); ``prometheusSpec.remoteWrite`` is rendered for both. The operator runs the agent with
``--enable-feature=agent`` (``--agent`` on 3.x); the sync (Argo CD with pruning, Flux, ``helm upgrade``) deletes the
``Prometheus`` resource the release no longer renders.

The chart tests the value with Go template truth (``{{- if .Values.prometheus.agentMode }}``) and ships no values
schema: the string ``"false"`` renders an agent. So only plain ``true``/``false`` are read here; any other spelling
(quoted, ``yes``/``on``, a number, null, a tag, an anchor or alias, a merge key in ``prometheus``) is refused with one
line, never edited.

- ``agent_mode``: ``True``/``False``, or ``None`` when the key is absent (the chart's default, a server);
- ``set_agent_mode(text, True)``: ``false`` becomes ``true`` in place (only those bytes); an absent key is added as
  the last key of ``prometheus`` at its keys' column, marked ``# added by promshift`` (``prometheus:`` itself too when
  missing); already ``true``: the same text (a retry);
- ``set_agent_mode(text, False)``: undoes that when a revert commit cannot (the file changed since): a marked key is
  removed with its line (and a marked ``prometheus:`` left empty), an unmarked ``true`` becomes ``false``.

Every edit is checked after the fact, as ``core.git_render``'s: read by a YAML 1.1 and a YAML 1.2 loader the result
must equal the original with only ``prometheus.agentMode`` changed, or ``GitRenderError`` is raised and nothing is
returned.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

from ruamel.yaml.nodes import MappingNode, Node, ScalarNode

from promshift.core.git_render import (
    ADDED,
    HELM_VALUES,
    GitRenderError,
    _after_line,
    _column,
    _compose_all,
    _content_end,
    _cut_last_line,
    _decode,
    _get,
    _is_null,
    _line_start,
    _load_all,
    _newline,
    _prune_marked,
    _splice,
)

KEY, PARENT = "agentMode", "prometheus"
WHERE = f"{PARENT}.{KEY}"
_TRUE, _FALSE = ("true", "True", "TRUE"), ("false", "False", "FALSE")
_FLIP = {**dict(zip(_TRUE, _FALSE, strict=True)), **dict(zip(_FALSE, _TRUE, strict=True))}

Text = TypeVar("Text", str, bytes)


def _root(text: str) -> MappingNode | None:
    docs = _compose_all(text)
    if len(docs) > 1:
        raise GitRenderError(f"a {HELM_VALUES} file must hold one YAML document, found {len(docs)}")
    root = docs[0] if docs else None
    if root is None or _is_null(root):
        return None
    if not isinstance(root, MappingNode) or root.flow_style:
        raise GitRenderError("the values must be a block mapping at the top level")
    return root


def _plain_value(text: str, key: Node, value: Node, where: str) -> None:
    """Refuse a value that is an alias or anchored (its bytes are elsewhere, or shared with other keys)."""
    if getattr(value, "anchor", None):
        raise GitRenderError(f"{where} carries an anchor (&{value.anchor}); refusing to edit what other keys share")
    between = text[int(key.end_mark.index):int(value.start_mark.index)]
    if int(value.start_mark.index) < int(key.end_mark.index) or between.strip() != ":":
        raise GitRenderError(f"{where} is an alias or tagged; set it by hand")


def _parent(text: str, root: MappingNode | None) -> tuple[Node, Node] | None:
    if root is None:
        return None
    found = _get(root, PARENT)
    if found is None:
        return None
    key, value = found
    if getattr(value, "anchor", None) or int(value.start_mark.index) < int(key.end_mark.index):
        raise GitRenderError(f"{PARENT} is anchored or an alias; refusing to edit what other keys share")
    if _is_null(value):
        raise GitRenderError(f"{PARENT} is empty (null); give it a mapping or remove the key")
    if not isinstance(value, MappingNode) or value.flow_style:
        raise GitRenderError(f"{PARENT} must be a block mapping to take {KEY}")
    if _get(value, "<<") is not None:
        raise GitRenderError(f"{PARENT} has a merge key (<<): its {KEY} may come from elsewhere; set it by hand")
    return found


def _switch(text: str) -> tuple[MappingNode | None, tuple[Node, Node] | None, tuple[Node, Node] | None]:
    root = _root(text)
    parent = _parent(text, root)
    found = _get(parent[1], KEY) if parent is not None and isinstance(parent[1], MappingNode) else None
    if parent is not None and isinstance(parent[1], MappingNode) and sum(
            isinstance(k, ScalarNode) and k.value == KEY for k, _v in parent[1].value) > 1:
        raise GitRenderError(f"{WHERE} is set twice (YAML loaders disagree on which one wins); set it by hand")
    if found is not None:
        key, value = found
        _plain_value(text, key, value, WHERE)
        spelled = text[int(value.start_mark.index):int(value.end_mark.index)]
        if not isinstance(value, ScalarNode) or spelled not in _FLIP:
            raise GitRenderError(f"{WHERE} is {spelled.strip()[:40]!r}, not a plain true or false (the chart reads "
                                 "any non-empty value as true); set it by hand")
    return root, parent, found


def agent_mode(text: str | bytes) -> bool | None:
    """``prometheus.agentMode`` of the values: True, False, or None when absent (the chart's default: a server)."""
    doc = _decode(text)
    _root_, parent, found = _switch(doc)
    if parent is not None and isinstance(parent[1], MappingNode):
        enabled = _get(parent[1], "enabled")
        if enabled is not None and isinstance(enabled[1], ScalarNode) and enabled[1].value in _FALSE:
            raise GitRenderError(f"{PARENT}.enabled is false: the chart renders no Prometheus to switch")
    if found is None:
        return None
    return str(found[1].value) in _TRUE


def _with_mode(data: Any, on: bool | None) -> Any:
    out = copy.deepcopy(data) if isinstance(data, dict) else {}
    prometheus = out.get(PARENT)
    if on is None:  # our marked key removed (and a marked prometheus: left empty)
        if isinstance(prometheus, dict):
            prometheus.pop(KEY, None)
            if not prometheus:
                out.pop(PARENT, None)
        return out
    if not isinstance(prometheus, dict):
        prometheus = out[PARENT] = {}
    prometheus[KEY] = on
    return out


def _check(before: str, after: str, expect: Callable[[Any], Any]) -> None:
    for yaml11 in (True, False):
        old = (_load_all(before, yaml11=yaml11) or [None])[0]
        new = (_load_all(after, yaml11=yaml11) or [None])[0]
        if (new or {}) != (expect(old) or {}):  # an emptied document reads as null
            loader = "YAML 1.1" if yaml11 else "YAML 1.2"
            raise GitRenderError(f"the {WHERE} edit would change more than that key (read as {loader}); "
                                 "nothing written")


def _add(text: str, root: MappingNode | None, parent: tuple[Node, Node] | None) -> str:
    newline = _newline(text)
    if parent is not None:
        mapping = parent[1]
        assert isinstance(mapping, MappingNode)
        col = _column(text, int(mapping.value[0][0].start_mark.index))
        return _splice(text, _after_line(text, _content_end(mapping)), f"{' ' * col}{KEY}: true  {ADDED}{newline}",
                       newline)
    lines = f"{PARENT}:  {ADDED}{newline}  {KEY}: true  {ADDED}{newline}"
    if root is None:
        return text + lines if not text or text.endswith("\n") else _splice(text, None, lines, newline)
    col = _column(text, int(root.value[0][0].start_mark.index))
    if col:
        raise GitRenderError("the values' top-level keys are indented; add prometheus.agentMode by hand")
    return _splice(text, _after_line(text, _content_end(root)), lines, newline)


def _remove_marked(text: str, key: Node) -> str:
    start = _line_start(text, int(key.start_mark.index))
    end = _after_line(text, int(key.end_mark.index))
    text = text[:start] + text[end:] if end is not None else _cut_last_line(text, start)
    return _prune_marked(HELM_VALUES, text, (PARENT,))[0]


def set_agent_mode(text: Text, on: bool) -> Text:
    """The values with ``prometheus.agentMode`` set to ``on``; every other byte kept (module docstring)."""
    doc = _decode(text)
    agent_mode(doc)  # refuses what cannot be read safely (and a disabled prometheus)
    root, parent, found = _switch(doc)
    target: bool | None = on  # what prometheus.agentMode reads after the edit (None: the key is gone)
    if found is None:
        if not on:
            return text  # absent: already the chart's default (a server)
        new = _add(doc, root, parent)
    else:
        key, value = found
        spelled = doc[int(value.start_mark.index):int(value.end_mark.index)]
        if (spelled in _TRUE) == on:
            return text
        line_start = _line_start(doc, int(key.start_mark.index))
        line_end = _after_line(doc, int(value.end_mark.index))
        line = doc[line_start:line_end if line_end is not None else len(doc)]
        if not on and line.rstrip("\r\n").endswith(ADDED):
            new, target = _remove_marked(doc, key), None
        else:
            at = int(value.start_mark.index)
            new = doc[:at] + _FLIP[spelled] + doc[int(value.end_mark.index):]
    _check(doc, new, lambda data: _with_mode(data, target))
    return new.encode("utf-8") if isinstance(text, bytes) else new  # type: ignore[return-value]
