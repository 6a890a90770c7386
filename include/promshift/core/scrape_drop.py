"""Decommission on the source: a ``metric_relabel_configs`` drop of a group's metrics in one scrape job.

Like ``core.render``'s remote_write edits, these are byte-preserving: exactly the rule's lines (and a
``metric_relabel_configs:`` key promshift added, marked with a comment) go in or out, every other byte of
the user's file stays as it was, and each edit is proven by loading the result as YAML 1.2 and 1.1 and
comparing it with the original plus (or minus) the rule. ``remove_scrape_drop`` undoes ``add_scrape_drop``
byte for byte.

A drop at scrape time stops the source from storing the group's series, and so from remote-writing them
too: decommissioning is only safe when something else writes the target (the managed collector), which
the caller checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from promshift.core.render_yaml import (
    ADDED_KEY_COMMENT,
    Config,
    RenderError,
    _append_item,
    _both_loads,
    _break_before,
    _canon,
    _column,
    _cut_flow_item,
    _dash_before,
    _Doc,
    _edit,
    _line_start,
    _load,
    _next_line,
    _Node,
    _parse,
    _root_mapping,
)

SCRAPE_KEY = "scrape_configs"
MRC_KEY = "metric_relabel_configs"


def drop_rule(name_regex: str) -> dict[str, Any]:
    """The relabel rule that drops every series whose name the group's keep regex matches."""
    return {"source_labels": ["__name__"], "regex": name_regex, "action": "drop"}


def scrape_jobs(config: Config) -> list[str]:
    """The job names of the config's scrape jobs, in file order."""
    return [str(j.get("job_name", "")) for j in _jobs(_load(config)) if isinstance(j, dict)]


def has_scrape_drop(config: Config, job_name: str, rule: Mapping[str, Any]) -> bool:
    return dict(rule) in _rules(_load(config), job_name)


def drop_is_loaded(loaded_config: str, job_name: str, rule: Mapping[str, Any]) -> bool:
    """Whether a server's loaded config (``/api/v1/status/config``) holds ``rule`` in the job: Prometheus shows
    a rule with its defaults filled in (separator, replacement), so every field of ``rule`` must match."""
    try:
        rules = _rules(_load(loaded_config), job_name)
    except RenderError:
        return False
    return any(isinstance(r, dict) and all(r.get(k) == v for k, v in rule.items()) for r in rules)


def add_scrape_drop(config: Config, job_name: str, rule: Mapping[str, Any]) -> Config:
    """The config with ``rule`` appended to job ``job_name``'s ``metric_relabel_configs`` (a no-op when there)."""
    return _edit(config, lambda text: _add(text, job_name, dict(rule)))


def remove_scrape_drop(config: Config, job_name: str, rule: Mapping[str, Any]) -> Config:
    """The config without ``rule`` in job ``job_name``'s ``metric_relabel_configs`` (a no-op when absent)."""
    return _edit(config, lambda text: _remove(text, job_name, dict(rule)))


def _jobs(data: Any) -> list[Any]:
    jobs = data.get(SCRAPE_KEY) if isinstance(data, dict) else None
    if jobs is None:
        return []
    if not isinstance(jobs, list):
        raise RenderError(f"{SCRAPE_KEY} must be a list")
    return jobs


def _job_index(data: Any, job_name: str) -> int:
    matches = [i for i, j in enumerate(_jobs(data)) if isinstance(j, dict) and j.get("job_name") == job_name]
    if len(matches) != 1:
        raise RenderError(f"source config has {len(matches)} scrape jobs named {job_name!r}; expected one")
    return matches[0]


def _rules(data: Any, job_name: str) -> list[Any]:
    job = _jobs(data)[_job_index(data, job_name)]
    rules = job.get(MRC_KEY) or []
    if not isinstance(rules, list):
        raise RenderError(f"job {job_name!r}: {MRC_KEY} must be a list")
    return rules


def _pairs(node: _Node) -> list[tuple[_Node, _Node]]:
    return list(zip(node.children[::2], node.children[1::2], strict=True))


def _job_node(doc: _Doc, data: Any, job_name: str) -> _Node:
    root = _root_mapping(doc)
    found = [v for k, v in _pairs(root) if k.kind == "scalar" and k.value == SCRAPE_KEY] if root else []
    if len(found) != 1 or found[0].kind != "seq" or found[0].anchor is not None:
        raise RenderError(f"source config has no single top-level {SCRAPE_KEY} list promshift can edit")
    seq = found[0]
    if len(seq.children) != len(_jobs(data)):
        raise RenderError(f"{SCRAPE_KEY} has {len(seq.children)} items but loads as {len(_jobs(data))}")
    node = seq.children[_job_index(data, job_name)]
    if node.kind != "map" or node.flow or node.anchor is not None or not node.children:
        raise RenderError(f"scrape job {job_name!r} is not a block mapping (or is anchored); edit it by hand")
    if any(k.kind == "scalar" and k.value == "<<" for k, _ in _pairs(node)):
        raise RenderError(f"scrape job {job_name!r} merges keys (<<); edit it by hand")
    return node


def _mrc(node: _Node, job_name: str) -> tuple[_Node, _Node] | None:
    found = [(k, v) for k, v in _pairs(node) if k.kind == "scalar" and k.value == MRC_KEY]
    if not found:
        return None
    key, value = found[0]
    if value.kind == "alias" or value.anchor is not None:
        raise RenderError(f"job {job_name!r}: {MRC_KEY} is an alias or anchored; edit it by hand")
    if value.kind == "map" or (value.kind == "scalar" and not value.empty):
        raise RenderError(f"job {job_name!r}: {MRC_KEY} must be a list")
    return key, value


def _add(text: str, job_name: str, rule: dict[str, Any]) -> str:
    before = _load(text)
    if rule in _rules(before, job_name):
        return text
    doc = _parse(text)
    job = _job_node(doc, before, job_name)
    found = _mrc(job, job_name)
    return _checked(text, before, _append_item(doc, found, job, MRC_KEY, rule), job_name, rule, added=True)


def _remove(text: str, job_name: str, rule: dict[str, Any]) -> str:
    before = _load(text)
    rules = _rules(before, job_name)
    matches = [i for i, r in enumerate(rules) if r == rule]
    if not matches:
        return text
    if len(matches) > 1:
        raise RenderError(f"job {job_name!r} holds the drop rule {len(matches)} times; remove it by hand")
    doc = _parse(text)
    job = _job_node(doc, before, job_name)
    found = _mrc(job, job_name)
    if found is None or found[1].kind != "seq" or len(found[1].children) != len(rules):
        raise RenderError(f"job {job_name!r}: cannot find its {MRC_KEY} list; remove the rule by hand")
    key, seq = found
    index = matches[0]
    item = seq.children[index]
    what = f"the drop rule of job {job_name!r}"
    if seq.flow:
        return _checked(text, before, _cut_flow_item(text, seq, index, what), job_name, rule, added=False)
    dash = _dash_before(doc, item.start, what)
    start, end = _line_start(doc, dash), _next_line(doc, item.end)
    if text[start:dash].strip(" "):
        raise RenderError(f"{what} does not start its own line; remove it by hand")
    if len(seq.children) == 1:
        key_start = _line_start(doc, key.start)
        if text[key_start:start].rstrip("\r\n") == f"{' ' * _column(doc, key.start)}{MRC_KEY}:  {ADDED_KEY_COMMENT}":
            start = key_start
    if end == len(text) and _break_before(text, end) == 0:
        start -= _break_before(text, start)
    return _checked(text, before, text[:start] + text[end:], job_name, rule, added=False)


def _split(data: Any, job_name: str) -> tuple[Any, list[Any]]:
    """The document with the job's metric_relabel_configs taken out, and that list."""
    data = _canon(data) or {}
    jobs = list(data.get(SCRAPE_KEY) or [])
    index = _job_index(data, job_name)
    job = dict(jobs[index])
    rules = list(job.pop(MRC_KEY, None) or [])
    jobs[index] = job
    return {**data, SCRAPE_KEY: jobs}, rules


def _checked(text: str, before: Any, new: str, job_name: str, rule: dict[str, Any], *, added: bool) -> str:
    for (version, old), (_, now) in zip(_both_loads(text, before), _both_loads(new), strict=True):
        if version == "YAML 1.1" and old is None and text.strip():
            continue  # PyYAML cannot read this file; YAML 1.2 still checked it
        old_rest, old_rules = _split(old, job_name)
        new_rest, new_rules = _split(now, job_name)
        wanted = old_rules + [_canon(rule)] if added else [r for r in old_rules if r != _canon(rule)]
        if new_rest != old_rest or new_rules != wanted:
            raise RenderError(f"internal error: {'adding' if added else 'removing'} the drop rule of job "
                              f"{job_name!r} would change more than the rule ({version}); the config was left "
                              "untouched")
    return new
