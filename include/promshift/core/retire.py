"""Retiring a source Prometheus: what agent mode refuses, the edit to its agent subset, what retiring ends.

Pure (no I/O, no clock): the source's config bytes and command line in, the agent's out, and the
evidence an approver sees before the source stops storing and evaluating.

- ``agent_config``: the config edited to what Prometheus accepts in agent mode. Agent mode refuses the
  top-level ``rule_files``, ``alerting`` and ``remote_read`` sections ("field rule_files is not allowed in
  agent mode"); every other byte stays (each removed block becomes one comment line naming it). The undo
  does not invert this edit: it writes back the bytes saved before it (``restore`` in the mode switch).
- ``agent_argv``: the command line in agent mode. Agent mode refuses the server-only flags
  (``--storage.tsdb.*``, ``--rules.*``, ``--alertmanager.*``, ``--query.*``: "The following flag(s) can not
  be used in agent mode"); the WAL moves to ``--storage.agent.path``. Prometheus 2.x enables it with
  ``--enable-feature=agent``, 3.x with ``--agent``.
- ``retire_blockers``: rules still evaluated, reads still hitting the source, metrics no group carries;
  each blocks unless accepted by name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from promshift.core.inputs import CONFIG, InputRefused, parse_yaml_bounded

AGENT_REFUSED_SECTIONS = ("rule_files", "alerting", "remote_read")
SERVER_ONLY_FLAG_PREFIXES = ("--storage.tsdb.", "--rules.", "--alertmanager.", "--query.")
AGENT_FEATURE_FLAG = "--enable-feature=agent"  # Prometheus 2.x
AGENT_FLAG = "--agent"  # Prometheus 3.x
REMOVED_MARK = "# promshift retire: removed `{key}:` (agent mode refuses it); promshift__unretire restores it\n"

_TOP_KEY = re.compile(rb"^([A-Za-z_][A-Za-z0-9_]*)\s*:")


class RetireError(ValueError):
    """A config or command line that cannot be turned into an agent's (one line)."""


def _top_level_blocks(data: bytes) -> list[tuple[bytes | None, int, int]]:
    """``(key, start, end)`` byte spans of each top-level mapping key's block (``None`` for lines before the
    first key). A block runs to the next line that starts at column 0 and is neither blank nor a comment."""
    lines = data.splitlines(keepends=True)
    blocks: list[tuple[bytes | None, int, int]] = []
    key: bytes | None = None
    start = offset = 0
    for line in lines:
        match = _TOP_KEY.match(line)
        if match:
            blocks.append((key, start, offset))
            key, start = match.group(1), offset
        offset += len(line)
    blocks.append((key, start, offset))
    return [b for b in blocks if b[2] > b[1]]


def agent_config(data: bytes, refused: Sequence[str] = AGENT_REFUSED_SECTIONS) -> bytes:
    """The config with every top-level section agent mode refuses removed; every other byte kept. Raises
    ``RetireError`` when the config is not a YAML mapping or the edit would change anything else."""
    try:
        before = parse_yaml_bounded(data, CONFIG)  # the source config's size, depth and alias budgets
    except InputRefused as exc:
        raise RetireError(f"the source config is not YAML we can edit: {exc}") from None
    if not isinstance(before, dict):
        raise RetireError("the source config is not a YAML mapping")
    wanted = {k.encode() for k in refused}
    out: list[bytes] = []
    for key, start, end in _top_level_blocks(data):
        block = data[start:end]
        if key in wanted:
            # the trailing blank or comment lines of a block belong to what follows: keep them
            body = block.splitlines(keepends=True)
            tail: list[bytes] = []
            while len(body) > 1 and (not body[-1].strip() or body[-1].lstrip().startswith(b"#")):
                tail.insert(0, body.pop())
            out.append(REMOVED_MARK.format(key=key.decode()).encode())
            out.extend(tail)
        else:
            out.append(block)
    edited = b"".join(out)
    try:
        after = parse_yaml_bounded(edited, CONFIG)
    except InputRefused:
        after = None
    expected = {k: v for k, v in before.items() if k not in refused}
    if after != expected:  # a flow-style or anchored layout this line-wise edit cannot cut cleanly
        raise RetireError("the source config's refused sections cannot be cut out without touching the rest; "
                          "edit it by hand to drop " + ", ".join(refused))
    return edited


def refused_sections(data: bytes, refused: Sequence[str] = AGENT_REFUSED_SECTIONS) -> list[str]:
    """Which of the refused sections the config has (non-empty)."""
    doc = parse_yaml_bounded(data, CONFIG) or {}
    return [k for k in refused if isinstance(doc, dict) and doc.get(k)]


def agent_argv(argv: Sequence[str], agent_path: str, *, major_version: int = 2) -> tuple[str, ...]:
    """The command line in agent mode: the server-only flags dropped, the agent switch and
    ``--storage.agent.path`` added after the binary. Idempotent on an agent's command line."""
    if not argv:
        raise RetireError("the source's command line is empty")
    switch = AGENT_FLAG if major_version >= 3 else AGENT_FEATURE_FLAG
    kept = [a for a in argv[1:]
            if not a.startswith(SERVER_ONLY_FLAG_PREFIXES) and a not in (AGENT_FLAG, AGENT_FEATURE_FLAG)
            and not a.startswith("--storage.agent.path")]
    return (argv[0], switch, *kept, f"--storage.agent.path={agent_path}")


def is_agent_argv(argv: Sequence[str]) -> bool:
    return AGENT_FLAG in argv or AGENT_FEATURE_FLAG in argv


# --------------------------------------------------------------------------- the k8s-cr path: a PrometheusAgent

# prometheus-operator: the ``Prometheus`` resource (monitoring.coreos.com/v1) and the ``PrometheusAgent`` resource
# (monitoring.coreos.com/v1alpha1) share ``CommonPrometheusFields`` (scrape selectors, remoteWrite, externalLabels,
# replicas, shards, storage, resources ...); these ``PrometheusSpec`` fields are the server's alone (rules,
# alerting, storage retention, queries, remote read, Thanos): a PrometheusAgent's schema has none of them, so the
# API server refuses a PrometheusAgent that carries one (strict field validation) or drops it (the default).
PROMETHEUS_ONLY_SPEC = frozenset({
    "baseImage", "tag", "sha", "retention", "retentionSize", "shardRetentionPolicy", "disableCompaction", "rules",
    "prometheusRulesExcludedFromEnforce", "ruleSelector", "ruleNamespaceSelector", "query", "alerting",
    "additionalAlertRelabelConfigs", "additionalAlertManagerConfigs", "remoteRead", "thanos", "queryLogFile",
    "allowOverlappingBlocks", "exemplars", "evaluationInterval", "ruleQueryOffset", "enableAdminAPI"})
# Set by the API server, never by a client: left out of the saved resource and of the byte comparison.
SERVER_SET_METADATA = ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields", "selfLink",
                       "deletionTimestamp", "deletionGracePeriodSeconds")
# The PrometheusAgent carries the Prometheus resource it replaces (what the undo creates again), in this annotation.
SAVED_PROMETHEUS_ANNOTATION = "promshift.io/retired-prometheus"
# Kubernetes refuses an object whose annotations total more than 256 KiB (TotalAnnotationSizeLimitB).
ANNOTATIONS_MAX_BYTES = 256 * 1024
AGENT_API_VERSION, AGENT_KIND = "monitoring.coreos.com/v1alpha1", "PrometheusAgent"


def user_content(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A resource as its owner wrote it: without ``status`` and the metadata the API server sets."""
    out = {k: v for k, v in obj.items() if k != "status"}
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in SERVER_SET_METADATA}
    out["metadata"] = meta
    return out


def canonical(obj: Mapping[str, Any]) -> bytes:
    """The bytes two resources are compared by (JSON, sorted keys, no spaces)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def agent_resource(prometheus: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The ``PrometheusAgent`` that replaces a ``Prometheus`` resource (its owner's content, ``user_content``):
    same name, namespace, labels and every spec field an agent has; the server-only fields dropped (returned by
    name); the Prometheus resource itself saved in an annotation, for the undo. RetireError when the saved
    resource would not fit the API's annotation budget."""
    saved = user_content(prometheus)
    meta = saved.get("metadata") or {}
    if not meta.get("name"):
        raise RetireError("the Prometheus resource has no metadata.name")
    spec = dict(saved.get("spec") or {})
    dropped = sorted(k for k in spec if k in PROMETHEUS_ONLY_SPEC)
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != SAVED_PROMETHEUS_ANNOTATION}
    # in its own key order (not ``canonical``'s sorted one): the undo creates it again as written
    annotations[SAVED_PROMETHEUS_ANNOTATION] = json.dumps(saved, separators=(",", ":"), ensure_ascii=False)
    if sum(len(k) + len(str(v).encode()) for k, v in annotations.items()) > ANNOTATIONS_MAX_BYTES:
        raise RetireError(f"the Prometheus resource is too large to keep in an annotation of its PrometheusAgent "
                          f"(over {ANNOTATIONS_MAX_BYTES} bytes); save it elsewhere and convert it by hand")
    agent_meta: dict[str, Any] = {"name": meta["name"], "annotations": annotations}
    if meta.get("namespace"):
        agent_meta["namespace"] = meta["namespace"]
    if meta.get("labels"):
        agent_meta["labels"] = dict(meta["labels"])
    return ({"apiVersion": AGENT_API_VERSION, "kind": AGENT_KIND, "metadata": agent_meta,
             "spec": {k: v for k, v in spec.items() if k not in PROMETHEUS_ONLY_SPEC}}, dropped)


def saved_prometheus(agent: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``Prometheus`` resource a PrometheusAgent made by ``agent_resource`` replaced, or None."""
    text = ((agent.get("metadata") or {}).get("annotations") or {}).get(SAVED_PROMETHEUS_ANNOTATION)
    if not isinstance(text, str):
        return None
    try:
        saved = json.loads(text)
    except ValueError:
        return None
    return saved if isinstance(saved, dict) and saved.get("kind") == "Prometheus" else None


# --------------------------------------------------------------------------- what retiring ends


@dataclass(frozen=True)
class RetireEnds:
    """What retiring a source ends, by name: each item blocks unless the approver accepts it by name."""

    rules: tuple[str, ...] = ()  # "group/rule" still evaluated on the source
    reads: tuple[str, ...] = ()  # metric names still read on the source (its query log, over the bake)
    unowned_metrics: tuple[str, ...] = ()  # metrics the source stores that no group carries
    # "<group>/<panel|rule>:<name>" still reading further back than the target holds (the history horizon):
    # the source's history is the only copy of that reach, and an agent keeps none
    history: tuple[str, ...] = ()

    def names(self) -> list[str]:
        return [*(f"rule:{r}" for r in self.rules), *(f"read:{m}" for m in self.reads),
                *(f"metric:{m}" for m in self.unowned_metrics), *(f"history:{h}" for h in self.history)]

    def as_dict(self) -> dict[str, Any]:
        return {"rules": list(self.rules), "reads": list(self.reads), "unowned_metrics": list(self.unowned_metrics),
                "history": list(self.history)}


@dataclass(frozen=True)
class RetireDecision:
    blocking: tuple[str, ...]
    accepted: tuple[str, ...]
    unknown_acceptances: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.blocking

    def line(self) -> str:
        if self.ok:
            accepted = f" (accepted: {', '.join(self.accepted)})" if self.accepted else ""
            return "nothing blocks the retirement" + accepted
        return (f"retiring would end {len(self.blocking)} thing(s) not accepted by name: "
                + ", ".join(self.blocking[:20]) + (" …" if len(self.blocking) > 20 else ""))


def parse_acceptances(text: Any) -> tuple[str, ...]:
    """The form's accepted names: comma- or newline-separated, blanks dropped, order kept, no duplicates."""
    if text is None:
        return ()
    items = text if isinstance(text, (list, tuple)) else re.split(r"[,\n]", str(text))
    out: list[str] = []
    for item in items:
        name = str(item).strip()
        if name and name not in out:
            out.append(name)
    return tuple(out)


def retire_decision(ends: RetireEnds, accepted: Iterable[str]) -> RetireDecision:
    """Every name of ``ends`` not in ``accepted`` blocks; an accepted name that names nothing is reported
    (a typo must not pass for an acceptance of something else)."""
    names = ends.names()
    accepted_t = tuple(accepted)
    return RetireDecision(blocking=tuple(n for n in names if n not in accepted_t),
                          accepted=tuple(a for a in accepted_t if a in names),
                          unknown_acceptances=tuple(a for a in accepted_t if a not in names))


def metric_names_of(expr: str) -> set[str]:
    """Metric names a PromQL expression reads (best effort: identifiers not followed by ``(`` and not a
    keyword), used for reads in a query log."""
    words = set(re.findall(r"(?<![\w:\"'.])([A-Za-z_:][\w:]*)\s*(?=[{\[\s)]|$|[-+*/><=!,^%])", expr + " "))
    keywords = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or",
                "unless", "inf", "nan", "Inf", "NaN"}
    return {w for w in words if w not in keywords}


def unowned_metrics(stored: Iterable[str], group_matches: Any) -> tuple[str, ...]:
    """Stored metric names for which ``group_matches(name)`` is false (no group carries them), sorted;
    Prometheus's own series (``up``, ``scrape_*``, ``prometheus_*`` …) are the source's, not the fleet's."""
    own = ("up", "scrape_", "prometheus_", "go_", "process_", "promhttp_", "net_conntrack_", "promshift_")
    return tuple(sorted(m for m in stored if not (m == "up" or m.startswith(own[1:])) and not group_matches(m)))


# The restart a mode switch costs the target, beyond the scrape interval itself: the old process flushing and
# exiting, the new one starting, and Prometheus's discovery manager sending its first targets (every 5 s).
RESTART_BUDGET_S = 10.0


def allowed_gap_s(scrape_interval_s: float) -> float:
    """The longest spacing between a group's samples on the target that still counts as "no gap" across a
    restart of the source: two scrape intervals plus the restart budget. In the lab (5 s scrapes) 20 s; with
    the default 1 m scrapes 130 s; always under the 5 m lookback, so no instant query on the target ever sees
    the series absent."""
    return 2 * scrape_interval_s + RESTART_BUDGET_S


def longest_gap(times: Sequence[float], *, since: float, until: float) -> float | None:
    """The longest spacing between samples in ``[since, until]`` including the edges (a series that stops
    before ``until`` has a gap up to it); None without at least two samples in the window (no data never
    passes)."""
    inside = sorted(t for t in times if since <= t <= until)
    if len(inside) < 2:
        return None
    edges = [since, *inside, until]
    return max(b - a for a, b in zip(edges, edges[1:], strict=False))
