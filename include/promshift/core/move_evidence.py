"""Typed evidence of what a group's run deploys and moves, and of what happens after its cut-over.

- ``DeployEvidence``: the deploy's record, as ``dual_write_deployed`` (and, on a deploy path, ``deploy_failed``
  or ``quota_refused``) holds it: the file path's ``remote_write`` entry and the config's hashes, or a deploy
  path's kind, state, status history, quota and (git) change;
- ``RulesEvidence``, ``ReadPathEvidence``, ``BakeEvidence``, ``DecommissionEvidence``: the report's summary of
  the rules that moved with the group, the dashboards switched, the bake checks and the decommission, each
  folded from the run's audit events (``MovedEvidence.from_events``).

Each has one ``to_dict`` (the JSON shape the audit and ``report.json`` hold) and one ``from_dict`` that reads
every shape already stored: older records lack later keys and read as their defaults. The report
(``core.report``) and the board (``board.evidence``) read these, not the dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from promshift.core.events import EventKind

_NOT_CONFIGURED = "not configured"


def _known(cls: type, d: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``d`` that are fields of ``cls`` (a missing key takes the field's default)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


# -- the deploy ----------------------------------------------------------------------------------------------

# The deploy kinds whose evidence may carry a deploy path's record under ``deploy``.
_DEPLOY_RECORDS = (EventKind.DUAL_WRITE_DEPLOYED, EventKind.DEPLOY_FAILED, EventKind.QUOTA_REFUSED)


@dataclass(frozen=True)
class DeployEvidence:
    """What the deploy recorded. None: not recorded (the file path records no ``kind``, a deploy path no
    ``keep_regex``); ``extra`` keeps every other key, and a key recorded as null, so ``to_dict`` gives back
    the record as it was."""

    # The file path (remote_write): the entry added and the config before and after.
    remote_write: str | None = None
    keep_regex: str | None = None
    url: str | None = None
    sigv4: Mapping[str, Any] | None = None
    drop_labels: tuple[str, ...] | None = None
    config_before_sha256: str | None = None
    config_after_sha256: str | None = None
    live_remote_writes: tuple[str, ...] | None = None
    dual_write_since: float | None = None
    # A deploy path (scraper, k8s-configmap, k8s-cr, git): ``{kind, state, status_history, reason, quota, change}``.
    kind: str | None = None
    state: str | None = None
    status_history: tuple[Mapping[str, Any], ...] | None = None
    reason: str | None = None
    quota: Mapping[str, Any] | None = None
    change: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or value is None:
                continue
            if f.name == "status_history":
                value = [dict(change) for change in value]
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeployEvidence:
        known = {k: v for k, v in _known(cls, d).items() if k != "extra" and v is not None}
        for key in ("drop_labels", "live_remote_writes"):
            if key in known:
                known[key] = tuple(known[key])
        if "status_history" in known:
            known["status_history"] = tuple(dict(change) for change in known["status_history"])
        return cls(**known, extra={k: v for k, v in d.items() if k not in known})

    @classmethod
    def from_event(cls, kind: str, data: Mapping[str, Any]) -> DeployEvidence | None:
        """The deploy's record in an event of ``kind``, or None when that event holds none. A deploy path's
        ``deploy`` block is merged over the event's other keys (its ``reason`` wins)."""
        if kind in _DEPLOY_RECORDS and "deploy" in data:
            return cls.from_dict({**{k: v for k, v in data.items() if k != "deploy"}, **data["deploy"]})
        if kind == EventKind.DUAL_WRITE_DEPLOYED:
            return cls.from_dict(data)
        return None


# -- what moves with the group, and after ------------------------------------------------------------------


@dataclass(frozen=True)
class RulesEvidence:
    """The group's rules: how many there were, how many the cut-over moved (0 when none), the gap, the restore."""

    configured: bool = False
    moved: int = 0
    rules: int = 0
    records: int = 0
    alerts: int = 0
    records_added: bool = False
    gap_s: float | None = None
    restored: bool = False
    restored_identical: bool | None = None
    reason: str | None = _NOT_CONFIGURED

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RulesEvidence:
        return cls(**_known(cls, d))

    def with_event(self, kind: str, data: Mapping[str, Any]) -> RulesEvidence:
        if kind == EventKind.RULES_SNAPSHOT:
            return replace(self, configured=True, reason=None, rules=data.get("rules", 0),
                           records=data.get("records", 0), alerts=data.get("alerts", 0))
        if kind == EventKind.RULES_RECORDS_ADDED:
            return replace(self, records_added=True)
        if kind == EventKind.RULES_MOVED:
            moved = int(data.get("rules", self.rules) or 0) if data.get("moved") else 0
            return replace(self, moved=moved, gap_s=data.get("gap_s"))
        if kind == EventKind.RULES_RESTORED and data.get("changed"):
            return replace(self, restored=True, restored_identical=data.get("restored_identical"))
        return self


@dataclass(frozen=True)
class ReadPathEvidence:
    """The group's dashboards: how many, switched to the target (with their panels), restored. ``kind``: the
    read path's kind, recorded once it was configured."""

    configured: bool = False
    switched: bool = False
    dashboards: int = 0
    panels: int = 0
    restored: bool = False
    reason: str | None = _NOT_CONFIGURED
    kind: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "kind"}
        return {**out, "kind": self.kind} if self.configured else out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReadPathEvidence:
        return cls(**_known(cls, d))

    def with_event(self, kind: str, data: Mapping[str, Any]) -> ReadPathEvidence:
        if kind == EventKind.READ_PATH_SNAPSHOT:
            snap = data.get("snapshot") or {}
            return replace(self, configured=True, reason=None, kind=data.get("kind"),
                           dashboards=len(snap.get("files") or snap.get("dashboards") or []))
        if kind == EventKind.READ_PATH_SWITCHED:
            return replace(self, switched=True, dashboards=data.get("dashboards", 0), panels=data.get("panels", 0))
        if kind == EventKind.READ_PATH_RESTORED and data.get("changed"):
            return replace(self, restored=True)
        return self


@dataclass(frozen=True)
class BakeEvidence:
    """The bake after cut-over: checks run and failed, baked (clean since when), reads rolled back (why)."""

    checks: int = 0
    failed_checks: int = 0
    baked: bool = False
    clean_since: Any = None
    reads_rolled_back: bool = False
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BakeEvidence:
        return cls(**_known(cls, d))

    def with_event(self, kind: str, data: Mapping[str, Any]) -> BakeEvidence:
        if kind == EventKind.BAKE_CHECK:
            failed = data.get("verdict") in ("FAILED", "ERROR")
            return replace(self, checks=self.checks + 1, failed_checks=self.failed_checks + failed)
        if kind == EventKind.BAKED:
            return replace(self, baked=True, clean_since=data.get("clean_since"))
        if kind == EventKind.READS_ROLLED_BACK:
            return replace(self, reads_rolled_back=True, reason=data.get("reason"))
        return self


@dataclass(frozen=True)
class DecommissionEvidence:
    """The source side's decommission: performed, what it freed, the source's series after; or why not."""

    performed: bool = False
    source_series_after: Any = None
    freed_series: Any = 0
    freed_samples_per_s: Any = 0
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DecommissionEvidence:
        return cls(**_known(cls, d))

    def with_event(self, kind: str, data: Mapping[str, Any]) -> DecommissionEvidence:
        if kind == EventKind.DECOMMISSIONED:
            freed = data.get("freed") or {}
            return replace(self, performed=True, source_series_after=data.get("source_series_after"),
                           freed_series=freed.get("series", 0), freed_samples_per_s=freed.get("samples_per_s") or 0,
                           reason=None)
        if kind in (EventKind.DECOMMISSION_REFUSED, EventKind.DECOMMISSION_FAILED):
            return replace(self, reason=data.get("reason") or kind.replace("_", " "))
        return self


@dataclass(frozen=True)
class MovedEvidence:
    """The report's ``rules``, ``read_path``, ``bake`` and ``decommission``: every field present, false or 0
    when it did not happen (``configured: false`` / ``reason: not configured`` when nothing was set up)."""

    rules: RulesEvidence = RulesEvidence()
    read_path: ReadPathEvidence = ReadPathEvidence()
    bake: BakeEvidence = BakeEvidence()
    decommission: DecommissionEvidence = DecommissionEvidence()

    def to_dict(self) -> dict[str, Any]:
        return {"rules": self.rules.to_dict(), "read_path": self.read_path.to_dict(), "bake": self.bake.to_dict(),
                "decommission": self.decommission.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MovedEvidence:
        """A report's blocks; a report from before one of them reads it as nothing happened."""
        return cls(rules=RulesEvidence.from_dict(d.get("rules") or {}),
                   read_path=ReadPathEvidence.from_dict(d.get("read_path") or {}),
                   bake=BakeEvidence.from_dict(d.get("bake") or {}),
                   decommission=DecommissionEvidence.from_dict(d.get("decommission") or {}))

    @classmethod
    def from_events(cls, events: Iterable[tuple[str, Mapping[str, Any]]]) -> MovedEvidence:
        """Folded from a run's ``(kind, evidence)`` pairs, oldest first."""
        moved = cls()
        for kind, data in events:
            moved = cls(rules=moved.rules.with_event(kind, data), read_path=moved.read_path.with_event(kind, data),
                        bake=moved.bake.with_event(kind, data),
                        decommission=moved.decommission.with_event(kind, data))
        return moved
