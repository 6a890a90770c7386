"""The local stack's target-bound path: dual-write a group without Airflow, and plant drift on it.

``python -m promshift.local stack dual-write GROUP`` adds the group's own ``remote_write`` entry to the local
source's config through the same render + deployer path a migration uses (promtool check,
write, reload, verified in ``/api/v1/status/config``), then waits until the target holds the
group's series. ``python -m promshift.local stack drift GROUP --rename-label FROM=TO --hosts REGEX`` is fault
injection: it adds ``write_relabel_configs`` rules to that entry which, for the hosts matching
REGEX, copy label FROM into TO and drop FROM, as a fleet that half-upgraded dcgm-exporter would
look on the target. That edits a live entry (its queue restarts), which promshift itself never
does; it is acceptable here because only the local stack is touched.

Both change nothing but the local stack named by ``PROMSHIFT_HOME`` and its ports, and only
when its source and target are up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from promshift.adapters.deploy import ConfigSnapshot, DeployError, FileConfigDeployer
from promshift.adapters.parity_check import promql_string
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.catalog import LABEL_NAME_PATTERN, MetricGroup, _compile_re2, _re2_error
from promshift.core.render import (
    add_remote_write,
    remote_write_entry,
    remote_write_name,
    replace_remote_write,
)
from promshift.local.stack.local import SOURCE, TARGET, LocalStack

# The catalog's RE2 helpers: compile without RE2 logging to stderr, and RE2's complaint in words.
_LABEL_NAME = _compile_re2(LABEL_NAME_PATTERN)


class RemoteWriteError(RuntimeError):
    """The local stack's remote_write could not be changed as asked; one line, says why."""


class BadInput(RemoteWriteError):
    """The command line asked for something invalid; nothing was changed."""


@dataclass(frozen=True)
class LabelRename:
    """Rename label ``old`` to ``new`` on the target-bound path for hosts matching ``hosts_regex``."""

    old: str
    new: str
    hosts_regex: str

    @classmethod
    def parse(cls, spec: str, hosts_regex: str) -> LabelRename:
        """``FROM=TO`` and a host regex (RE2, fully anchored as in relabelling); BadInput says what is wrong."""
        old, sep, new = spec.partition("=")
        if not sep or not old or not new:
            raise BadInput(f"--rename-label must be FROM=TO (e.g. Hostname=hostname), got {spec!r}")
        for name in (old, new):
            if not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
                raise BadInput(f"--rename-label {spec!r}: {name!r} is not a label name promshift may rename "
                               f"({LABEL_NAME_PATTERN}, not starting with __)")
        if old == new:
            raise BadInput(f"--rename-label {spec!r} renames a label to itself")
        problem = _re2_error(hosts_regex)
        if problem:
            raise BadInput(f"--hosts {hosts_regex!r} is not a valid RE2 regex: {problem}")
        return cls(old, new, hosts_regex)

    def rules(self, host_label: str) -> list[dict[str, Any]]:
        """``write_relabel_configs`` rules: for matching hosts, copy ``old`` into ``new``, then drop ``old``.

        Hosts are matched on ``host_label`` (which may be ``old`` itself); a replace that yields an
        empty value deletes the label, so the second rule drops ``old`` only where the host matches.
        """
        sources = [host_label, self.old]
        return [
            {"source_labels": sources, "separator": ";", "regex": f"(?:{self.hosts_regex});(.+)",
             "target_label": self.new, "replacement": "$1", "action": "replace"},
            {"source_labels": sources, "separator": ";", "regex": f"(?:{self.hosts_regex});.+",
             "target_label": self.old, "replacement": "", "action": "replace"},
        ]


@dataclass(frozen=True)
class Change:
    """What a command did: the entry, whether the config changed, what it printed as evidence."""

    entry: str
    changed: bool
    summary: str


def require_up(stack: LocalStack) -> None:
    """RemoteWriteError unless the stack's source and target are running and healthy."""
    status = stack.status()
    down = [name for name in (SOURCE, TARGET) if not (status[name]["alive"] and status[name]["healthy"])]
    if down:
        raise RemoteWriteError(f"the local stack at {stack.home} is not up ({', '.join(down)} down); "
                               f"run `python -m promshift.local stack up` first")


def _entries(config_text: str | bytes) -> dict[str, dict[str, Any]]:
    try:
        data = yaml.safe_load(config_text) or {}
    except yaml.YAMLError as exc:
        raise RemoteWriteError(f"the source config is not valid YAML: {str(exc).splitlines()[0]}") from None
    return {str(e.get("name", "")): e for e in (data.get("remote_write") or [])}


def _wait(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() >= deadline:
            raise RemoteWriteError(f"{what} within {timeout_s:.0f}s")
        time.sleep(0.5)


class LocalRemoteWrite:
    """The local stack's source config, deployer and both backends, for one group."""

    def __init__(self, stack: LocalStack, group: MetricGroup, *, timeout_s: float = 60.0) -> None:
        self.stack = stack
        self.group = group
        self.timeout_s = timeout_s
        self.source = PrometheusClient(stack.source_url, timeout_s=30)
        self.target = PrometheusClient(stack.target_url, timeout_s=30)
        self.deployer = FileConfigDeployer(stack.source_config_path, self.source)
        self.name = remote_write_name(group.name)

    def _target_count(self, matchers: str = "") -> float:
        selector = self.group.selector()[:-1] + (f", {matchers}}}" if matchers else "}")
        return self.target.scalar(f"count({selector})") or 0.0

    def _deploy(self, new_text: bytes, snapshot: ConfigSnapshot) -> None:
        try:
            self.deployer.deploy(new_text, snapshot=snapshot, expect_remote_writes={self.name})
        except (DeployError, PrometheusError) as exc:
            raise RemoteWriteError(str(exc).splitlines()[0]) from exc

    def dual_write(self) -> Change:
        """Add the group's entry (a no-op when present), verify it is loaded and the target receives the group."""
        snapshot = self.deployer.snapshot()
        present = self.name in _entries(snapshot.data)
        if not present:
            entry = remote_write_entry(group_name=self.group.name, name_regex=self.group.name_regex(),
                                       drop_labels=self.group.drop_labels, replicas=self.group.replicas,
                                       url=self.stack.target_remote_write_url)
            self._deploy(add_remote_write(snapshot.data, entry), snapshot)
        elif self.name not in _entries(self.source.config_text()):
            raise RemoteWriteError(f"{self.name} is in {self.stack.source_config_path} but not in the config the "
                                   f"source runs; reload it (`curl -X POST {self.stack.source_url}/-/reload`)")
        _wait(f"the target received no series of {self.group.name}", lambda: self._target_count() > 0,
              self.timeout_s)
        verb = "already dual-writing" if present else "dual-writing"
        return Change(self.name, not present,
                      f"{self.name}: {verb} {self.group.name} ({self.group.selector()}) to "
                      f"{self.stack.target_remote_write_url}; the target holds {self._target_count():.0f} series")

    def plant(self, rename: LabelRename) -> Change:
        """Add the rename's rules to the group's entry (adding the entry, renamed from the start, if absent)."""
        hosts = self._hosts_matching(rename)
        snapshot = self.deployer.snapshot()
        entries = _entries(snapshot.data)
        rules = rename.rules(self.group.host_label)
        if self.name in entries:
            entry = dict(entries[self.name])
            existing = list(entry.get("write_relabel_configs") or [])
            changed = any(rule not in existing for rule in rules)
            if changed:
                entry["write_relabel_configs"] = existing + [r for r in rules if r not in existing]
                self._deploy(replace_remote_write(snapshot.data, entry), snapshot)
        else:
            changed = True
            entry = remote_write_entry(group_name=self.group.name, name_regex=self.group.name_regex(),
                                       drop_labels=self.group.drop_labels, replicas=self.group.replicas,
                                       url=self.stack.target_remote_write_url)
            entry["write_relabel_configs"] = [*entry["write_relabel_configs"], *rules]
            self._deploy(add_remote_write(snapshot.data, entry), snapshot)
        live = _entries(self.source.config_text()).get(self.name, {})
        if len(live.get("write_relabel_configs") or []) != len(entry["write_relabel_configs"]):
            raise RemoteWriteError(f"the source runs {self.name} without the planted rules; "
                                   f"check {self.stack.source_config_path}")
        on_host = rename.new if rename.old == self.group.host_label else self.group.host_label
        arrived = f'{rename.new}!="", {rename.old}="", {on_host}=~{promql_string(rename.hosts_regex)}'
        _wait(f"no series of hosts matching {rename.hosts_regex!r} arrived on the target under "
              f"{rename.new!r}", lambda: self._target_count(arrived) > 0, self.timeout_s)
        shown = ", ".join(hosts[:5]) + (f" and {len(hosts) - 5} more" if len(hosts) > 5 else "")
        verb = "planted" if changed else "already planted"
        return Change(self.name, changed,
                      f"{self.name}: {verb} {rename.old} -> {rename.new} for {len(hosts)} hosts ({shown}); "
                      f"the target receives their {self.group.name} series under `{rename.new}` "
                      f"(fault injection: this entry was edited in place)")

    def _hosts_matching(self, rename: LabelRename) -> list[str]:
        """The source's hosts of this group that match ``--hosts``; BadInput when none does or none carries FROM."""
        label = self.group.host_label
        rows = self.source.query(f"count by ({label}) ({self.group.selector()})").series
        hosts = sorted(h for h in (s.labels.get(label, "") for s in rows) if h)
        pattern = _compile_re2(rename.hosts_regex)
        matching = [h for h in hosts if pattern.fullmatch(h)]
        if not matching:
            raise BadInput(f"--hosts {rename.hosts_regex!r} matches none of the {len(hosts)} hosts of "
                           f"{self.group.name} on the source (e.g. {', '.join(hosts[:3]) or 'none'})")
        carrying = self.group.selector()[:-1] + f", {rename.old}!=\"\"}}"
        if not self.source.scalar(f"count({carrying})"):
            raise BadInput(f"no series of {self.group.name} carries label {rename.old!r} on the source")
        return matching
