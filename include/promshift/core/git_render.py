"""The group's ``remote_write`` entry in the files teams keep in git, edited byte for byte (pure).

Three shapes (``SHAPES``), each holding a list of remote-write entries:

- ``prometheus-yml``: a plain ``prometheus.yml``; its ``remote_write`` list, edited by ``core.render``'s
  ``add_remote_write`` / ``remove_remote_write`` (the same edit the file deployer makes);
- ``helm-values``: kube-prometheus-stack's Helm values, ``prometheus.prometheusSpec.remoteWrite``;
- ``manifest``: a prometheus-operator ``Prometheus`` or ``PrometheusAgent`` resource, ``spec.remoteWrite``
  (one such document in the file; other documents stay untouched).

The two operator shapes spell the entry as prometheus-operator's ``RemoteWriteSpec``
(``writeRelabelConfigs``, ``sourceLabels``, ``queueConfig``, ``sigv4.roleArn``; ``operator_entry``).

As in ``core.render`` the document is never loaded and dumped again: ruamel.yaml's composer only finds
positions (its nodes' marks) and the edit splices text.

- add: our item's lines go in at the start of the line after the last content of the list, at the list's
  own dash column, in the file's newline style; an empty or flow list (``remoteWrite: []``, the chart's
  default) gets a one-line JSON flow item before its ``]``. Keys on the path that are missing are added
  at the end of the deepest mapping that exists, each marked ``# added by promshift``.
- remove (by name): exactly the item's lines (or its flow text and one separator), then each marked key
  left empty, so add then remove gives back the original bytes.
- every edit is checked after the fact: the document read by a YAML 1.1 loader (PyYAML; Helm's and
  Prometheus' go-yaml are 1.1-ish) and a YAML 1.2 loader (ruamel.yaml) must equal the original with our
  item added (or removed) and nothing else, or the edit raises ``GitRenderError`` instead of returning.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from promshift.core.inputs import InputBudget, InputRefused, check_size, check_yaml_events, decode_utf8
from promshift.core.render import RenderError, add_remote_write, remote_write_names, remove_remote_write

HELM_VALUES, PROMETHEUS_YML, MANIFEST = "helm-values", "prometheus-yml", "manifest"
SHAPES = (HELM_VALUES, PROMETHEUS_YML, MANIFEST)
PATHS: Mapping[str, tuple[str, ...]] = {HELM_VALUES: ("prometheus", "prometheusSpec", "remoteWrite"),
                                        MANIFEST: ("spec", "remoteWrite")}
MANIFEST_KINDS = ("Prometheus", "PrometheusAgent")
ADDED = "# added by promshift"
# Maps whose keys are user data, not field names: never renamed between the two spellings.
_DATA_MAPS = frozenset({"headers", "proxy_connect_header", "proxyConnectHeader"})

Text = TypeVar("Text", str, bytes)
# A file in the team's repository: the deployer refuses more than 1 MiB (adapters.git_deploy.MAX_FILE_BYTES).
GIT_FILE = InputBudget("git file", max_bytes=1 << 20)
_EVENTS = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


class GitRenderError(RenderError):
    """The file cannot take (or give back) our entry; one line naming the file's problem."""


# -- spellings -------------------------------------------------------------------------------------


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _snake(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def _rename(value: Any, rename: Any) -> Any:
    if isinstance(value, Mapping):
        return {rename(str(k)): (dict(v) if str(k) in _DATA_MAPS and isinstance(v, Mapping) else _rename(v, rename))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_rename(item, rename) for item in value]
    return value


def operator_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A Prometheus-config ``remote_write`` entry in prometheus-operator's ``RemoteWriteSpec`` spelling."""
    return _rename(dict(entry), _camel)


def config_entry(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A ``RemoteWriteSpec`` back in Prometheus-config spelling (what the operator renders)."""
    return _rename(dict(spec), _snake)


def _check_shape(shape: str) -> None:
    if shape not in SHAPES:
        raise GitRenderError(f"file shape must be one of {', '.join(SHAPES)}, got {shape!r}")


# -- reading ---------------------------------------------------------------------------------------


def _decode(text: str | bytes) -> str:
    """The file as text, within its input budget (size, depth, alias expansion, scalar length) before any loader
    builds a value from it: a 600-byte alias bomb in Helm values costs one pass over its events, not minutes."""
    try:
        check_size(text, GIT_FILE)
        doc = text if isinstance(text, str) else decode_utf8(text, GIT_FILE.what)
        check_yaml_events(yaml.parse(doc, Loader=_EVENTS), GIT_FILE)
    except InputRefused as exc:
        raise GitRenderError(str(exc)) from None
    except yaml.YAMLError as exc:
        raise GitRenderError(f"the file is not valid YAML: {_one_line(exc)}") from None
    return doc


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


def _load_all(text: str, *, yaml11: bool) -> list[Any]:
    try:
        if yaml11:
            return list(yaml.safe_load_all(text))
        return list(YAML(typ="safe", pure=True).load_all(text))
    except (YAMLError, yaml.YAMLError) as exc:
        raise GitRenderError(f"the file is not valid YAML: {_one_line(exc)}") from None


def _doc_index(shape: str, docs: Sequence[Any]) -> int:
    """Which document holds the list: the only one for values; the Prometheus/PrometheusAgent one for a manifest."""
    if shape != MANIFEST:
        if len(docs) > 1:
            raise GitRenderError(f"a {shape} file must hold one YAML document, found {len(docs)}")
        return 0
    found = [i for i, d in enumerate(docs) if isinstance(d, Mapping) and d.get("kind") in MANIFEST_KINDS
             and str(d.get("apiVersion") or "").startswith("monitoring.coreos.com/")]
    if len(found) != 1:
        raise GitRenderError(f"a manifest file must hold exactly one monitoring.coreos.com "
                             f"{' or '.join(MANIFEST_KINDS)} document, found {len(found)}")
    return found[0]


def _list_at(data: Any, path: Sequence[str]) -> list[Any]:
    node = data
    for depth, key in enumerate(path):
        if node is None:
            return []
        if not isinstance(node, Mapping):
            raise GitRenderError(f"{'.'.join(path[:depth]) or 'the document'} must be a mapping")
        node = node.get(key)
    if node is None:
        return []
    if not isinstance(node, list):
        raise GitRenderError(f"{'.'.join(path)} must be a list, not {type(node).__name__}")
    return node


def entries_of(shape: str, text: str | bytes) -> list[dict[str, Any]]:
    """The file's remote-write entries, in Prometheus-config spelling, in order (what a sync would render)."""
    _check_shape(shape)
    doc = _decode(text)
    if shape == PROMETHEUS_YML:
        loaded = _load_all(doc, yaml11=False)
        data = loaded[0] if loaded else {}
        entries = _list_at(data or {}, ("remote_write",))
        return [dict(e) for e in entries if isinstance(e, Mapping)]
    docs = _load_all(doc, yaml11=False) or [None]
    entries = _list_at(docs[_doc_index(shape, docs)], PATHS[shape])
    return [config_entry(e) for e in entries if isinstance(e, Mapping)]


def entry_names(shape: str, text: str | bytes) -> list[str]:
    """The names of the file's remote-write entries (unnamed ones as '')."""
    if shape == PROMETHEUS_YML:
        return remote_write_names(text)
    return [str(e.get("name") or "") for e in entries_of(shape, text)]


# -- positions --------------------------------------------------------------------------------------


def _compose_all(text: str) -> list[Node | None]:
    try:
        return list(YAML(typ="rt").compose_all(text))
    except YAMLError as exc:
        raise GitRenderError(f"the file is not valid YAML: {_one_line(exc)}") from None


def _get(mapping: MappingNode, key: str) -> tuple[Node, Node] | None:
    for k, v in mapping.value:
        if isinstance(k, ScalarNode) and k.value == key:
            return k, v
    return None


def _is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag.endswith(":null")


def _content_end(node: Node) -> int:
    """Index just past the last character of the node's own content (not the comments or blank lines after)."""
    if isinstance(node, MappingNode) and node.value and not node.flow_style:
        key, value = node.value[-1]
        return max(_content_end(key), _content_end(value))
    if isinstance(node, SequenceNode) and node.value and not node.flow_style:
        return _content_end(node.value[-1])
    return int(node.end_mark.index)


def _line_start(text: str, i: int) -> int:
    return text.rfind("\n", 0, i) + 1


def _after_line(text: str, end: int) -> int | None:
    """Start of the line after the one ``end`` is on (``end`` itself when it is a line start); None at EOF."""
    if end > 0 and text[end - 1] == "\n":
        return end
    nl = text.find("\n", end)
    return None if nl < 0 else nl + 1


def _column(text: str, i: int) -> int:
    return i - _line_start(text, i)


def _cut_last_line(text: str, start: int) -> str:
    """``text`` without its last line (from ``start``, no newline after it) and the newline before it."""
    head = text[:start]
    for nl in ("\r\n", "\n"):
        if head.endswith(nl):
            return head[: -len(nl)]
    return head


def _newline(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


def _block_item(entry: Mapping[str, Any], dash: int, newline: str) -> str:
    dumped = yaml.safe_dump([dict(entry)], default_flow_style=False, sort_keys=False, width=10**6,
                            allow_unicode=False)
    return "".join(" " * dash + line + newline for line in dumped.splitlines())


def _flow_item(entry: Mapping[str, Any]) -> str:
    return json.dumps(dict(entry), separators=(", ", ": "))


def _splice(text: str, at: int | None, lines: str, newline: str) -> str:
    if at is None:  # the last line has no newline: ours go after one, and the file still ends without one
        return text + newline + lines[: -len(newline)]
    return text[:at] + lines + text[at:]


def _target(shape: str, text: str) -> Node | None:
    docs = _compose_all(text)
    if not docs:
        return None
    return docs[_doc_index(shape, _load_all(text, yaml11=False) or [None])]


def _name_of(item: Node) -> str | None:
    if isinstance(item, MappingNode):
        found = _get(item, "name")
        if found and isinstance(found[1], ScalarNode):
            return str(found[1].value)
    return None


def _nested_add(shape: str, text: str, entry: Mapping[str, Any]) -> str:
    path, newline = PATHS[shape], _newline(text)
    root = _target(shape, text)
    if root is not None and _is_null(root):
        root = None
    if root is not None and not (isinstance(root, MappingNode) and not root.flow_style):
        raise GitRenderError("the document must be a block mapping at the top level")
    node: MappingNode | None = root
    depth = 0
    while node is not None and depth < len(path):
        found = _get(node, path[depth])
        if found is None:
            break
        value = found[1]
        where = ".".join(path[: depth + 1])
        if depth == len(path) - 1:
            return _add_to_list(text, value, entry, where, newline)
        if _is_null(value):
            raise GitRenderError(f"{where} is empty (null); give it a mapping or remove the key")
        if not isinstance(value, MappingNode) or value.flow_style:
            raise GitRenderError(f"{where} must be a block mapping to take {path[-1]}")
        node, depth = value, depth + 1
    missing = path[depth:]
    if node is None:  # an empty document: append at its end
        col, at = 0, (len(text) if not text or text.endswith("\n") else None)
    else:
        col = _column(text, int(node.value[0][0].start_mark.index))
        at = _after_line(text, _content_end(node))
    lines = "".join(" " * (col + 2 * i) + f"{key}:  {ADDED}{newline}" for i, key in enumerate(missing))
    return _splice(text, at, lines + _block_item(entry, col + 2 * len(missing), newline), newline)


def _add_to_list(text: str, value: Node, entry: Mapping[str, Any], where: str, newline: str) -> str:
    if _is_null(value):
        raise GitRenderError(f"{where} is empty (null); write [] or a list")
    if not isinstance(value, SequenceNode):
        raise GitRenderError(f"{where} must be a list")
    if value.flow_style:
        if value.value:
            at = _content_end(value.value[-1])
            return text[:at] + ", " + _flow_item(entry) + text[at:]
        close = int(value.end_mark.index) - 1
        if text[close] != "]":
            raise GitRenderError(f"{where}: cannot find the end of its flow list")
        return text[:close] + _flow_item(entry) + text[close:]
    start = int(value.value[0].start_mark.index)
    dash = text.rfind("-", _line_start(text, start), start)
    if dash < 0:
        raise GitRenderError(f"{where}: cannot find its first item's dash")
    return _splice(text, _after_line(text, _content_end(value)), _block_item(entry, _column(text, dash), newline),
                   newline)


def _nested_remove(shape: str, text: str, name: str) -> tuple[str, int]:
    """Text without our item (and the marked keys left empty), and how many keys of the path were removed."""
    path = PATHS[shape]
    root = _target(shape, text)
    chain: list[tuple[Node, Node]] = []
    node = root
    for key in path:
        if not isinstance(node, MappingNode):
            return text, -1
        found = _get(node, key)
        if found is None:
            return text, -1
        chain.append(found)
        node = found[1]
    seq = node
    if not isinstance(seq, SequenceNode):
        return text, -1
    index = next((i for i, item in enumerate(seq.value) if _name_of(item) == name), None)
    if index is None:
        return text, -1
    item = seq.value[index]
    if seq.flow_style:
        if index > 0:
            cut = (_content_end(seq.value[index - 1]), _content_end(item))
        elif len(seq.value) > 1:
            cut = (int(item.start_mark.index), int(seq.value[1].start_mark.index))
        else:
            cut = (int(item.start_mark.index), _content_end(item))
        return text[:cut[0]] + text[cut[1]:], 0
    start = _line_start(text, int(item.start_mark.index))
    end = _after_line(text, _content_end(item))
    new = text[:start] + text[end:] if end is not None else _cut_last_line(text, start)
    if len(seq.value) > 1:
        return new, 0
    return _prune_marked(shape, new, path)


def _prune_marked(shape: str, text: str, path: Sequence[str]) -> tuple[str, int]:
    """Remove the marked keys the add created, deepest first, while each is left with no value."""
    removed = 0
    for depth in range(len(path) - 1, -1, -1):
        node = _target(shape, text)
        found = None
        for key in path[: depth + 1]:
            if not isinstance(node, MappingNode):
                return text, removed
            found = _get(node, key)
            if found is None:
                return text, removed
            node = found[1]
        assert found is not None
        key_node, value = found
        start = _line_start(text, int(key_node.start_mark.index))
        end = _after_line(text, int(key_node.end_mark.index))
        line = text[start:end if end is not None else len(text)]
        if not _is_null(value) or not line.rstrip("\r\n").endswith(ADDED):
            return text, removed
        text = text[:start] + text[end:] if end is not None else _cut_last_line(text, start)
        removed += 1
    return text, removed


# -- checks -----------------------------------------------------------------------------------------


def _with(data: Any, path: Sequence[str], change: Any) -> Any:
    out = copy.deepcopy(data) if data is not None else {}
    node = out
    for key in path[:-1]:
        if node.get(key) is None:
            node[key] = {}
        node = node[key]
    node[path[-1]] = change(list(node.get(path[-1]) or []))
    return out


def _pruned(data: Any, path: Sequence[str], keys: int) -> Any:
    """``data`` without the last ``keys`` keys of ``path`` (each was left empty)."""
    for depth in range(len(path) - 1, len(path) - 1 - keys, -1):
        node = data
        for key in path[:depth]:
            node = node[key]
        del node[path[depth]]
    return data


def _check(shape: str, before: str, after: str, expect: Any) -> None:
    for yaml11 in (True, False):
        old, new = _load_all(before, yaml11=yaml11), _load_all(after, yaml11=yaml11)
        old = old or [None]
        i = _doc_index(shape, old)
        wanted = [*old[:i], expect(old[i]), *old[i + 1:]]
        if new != wanted and not (wanted == [{}] and new in ([], [None])):
            loader = "YAML 1.1" if yaml11 else "YAML 1.2"
            raise GitRenderError(f"the {shape} edit would change more than our entry (read as {loader}); "
                                 "nothing written")


def add_entry(shape: str, text: Text, entry: Mapping[str, Any]) -> Text:
    """``text`` with our entry (Prometheus-config spelling) added to the shape's list; every other byte kept.

    The same entry already present is a no-op (a retried deploy); another entry of that name is refused.
    """
    _check_shape(shape)
    if shape == PROMETHEUS_YML:
        return add_remote_write(text, entry)
    doc = _decode(text)
    spec = operator_entry(entry)
    name = str(entry["name"])
    present = [e for e in entries_of(shape, doc) if e.get("name") == name]
    if present:
        if present == [config_entry(spec)]:
            return text
        raise GitRenderError(f"the file already has a different remote-write entry {name}; refusing to edit a live "
                             "queue")
    new = _nested_add(shape, doc, spec)
    _check(shape, doc, new, lambda data: _with(data, PATHS[shape], lambda items: [*items, spec]))
    return new.encode("utf-8") if isinstance(text, bytes) else new  # type: ignore[return-value]


def remove_entry(shape: str, text: Text, name: str) -> Text:
    """``text`` without the entry called ``name`` (a no-op when absent); undoes ``add_entry`` byte for byte."""
    _check_shape(shape)
    if shape == PROMETHEUS_YML:
        return remove_remote_write(text, name)
    doc = _decode(text)
    new, pruned = _nested_remove(shape, doc, name)
    if pruned < 0:
        return text
    path = PATHS[shape]

    def expect(data: Any) -> Any:
        out = _with(data, path, lambda items: [e for e in items if not (isinstance(e, Mapping)
                                                                         and e.get("name") == name)])
        return _pruned(out, path, pruned)

    _check(shape, doc, new, expect)
    return new.encode("utf-8") if isinstance(text, bytes) else new  # type: ignore[return-value]
