"""Tenants: a group's label set and its series limit in the workspace configuration (``limitsPerLabelSet``).

A group may declare its tenant (the catalog's ``tenant:``, ``TenantPolicy``): the label set its series carry and
the active series that label set may hold. AMP then refuses a new series of that label set past the limit
(``per_labelset_series_limit``, counted in DiscardedSamples) and nothing else, so one group's cardinality spike
throttles only that group ("Configure your workspace" / UpdateWorkspaceConfiguration, AMP user guide; the lab's
rule: ``core.ingest_limits``, ``local.stack.amp_ingest``).

``tenant_preflight`` checks the limit against what the label set holds now and what the group adds; the
migration then writes the limit with ``merged_limits``: the workspace's other label sets stay as they are (an
UpdateWorkspaceConfiguration replaces the whole list, so the list is read, edited and written back).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from promshift.core.catalog import TenantPolicy
from promshift.core.promql import promql_string


class WorkspaceConfigurationPort(Protocol):
    """The target workspace's configuration: its ``limitsPerLabelSet`` read and written whole."""

    def label_set_limits(self) -> list[dict[str, Any]]: ...

    def set_label_set_limits(self, entries: Sequence[Mapping[str, Any]]) -> None: ...


def tenant_entry(tenant: TenantPolicy) -> dict[str, Any]:
    """The group's ``limitsPerLabelSet`` entry."""
    return {"labelSet": dict(tenant.label_set), "limits": {"maxSeries": int(tenant.max_series)}}


def _key(entry: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in (entry.get("labelSet") or {}).items()))


def merged_limits(existing: Sequence[Mapping[str, Any]], tenant: TenantPolicy) -> list[dict[str, Any]]:
    """The workspace's entries with the group's set (replacing one for the same label set, else appended)."""
    mine = tenant_entry(tenant)
    out: list[dict[str, Any]] = []
    replaced = False
    for entry in existing:
        if _key(entry) == _key(mine):
            out.append(mine)
            replaced = True
        else:
            out.append({"labelSet": dict(entry.get("labelSet") or {}), "limits": dict(entry.get("limits") or {})})
    return out if replaced else [*out, mine]


def current_limit(existing: Sequence[Mapping[str, Any]], tenant: TenantPolicy) -> int | None:
    """The maxSeries the workspace holds for the group's label set now (None: not set)."""
    for entry in existing:
        if _key(entry) == tuple(sorted(tenant.label_set)):
            value = (entry.get("limits") or {}).get("maxSeries")
            return None if value is None else int(value)
    return None


def label_set_selector(tenant: TenantPolicy) -> str:
    """``{a="b", ...}``: every series of the tenant's label set."""
    return "{" + ", ".join(f"{k}={promql_string(v)}" for k, v in tenant.label_set) + "}"


def group_in_set_selector(name_regex: str, tenant: TenantPolicy) -> str:
    """``{a="b", ..., __name__=~"<group>"}``: the group's series that count against the tenant's limit."""
    return label_set_selector(tenant)[:-1] + ", __name__=~" + promql_string(name_regex) + "}"


@dataclass(frozen=True)
class TenantCheck:
    """The pre-flight's answer for a group's tenant: ok, or why not, with the numbers."""

    ok: bool
    reason: str
    numbers: dict[str, Any]


def tenant_preflight(tenant: TenantPolicy, *, group_series: float, group_series_in_set: float,
                     label_set_series: float) -> TenantCheck:
    """Whether the group fits its tenant's limit.

    ``group_series`` the group's series on the source, ``group_series_in_set`` those of them carrying the label
    set (what the target will count against the limit), ``label_set_series`` what the target's label set holds
    now. Refused: a group none of whose series carry the label set (the limit would throttle nothing of it), and a
    limit under the label set's series after the group lands (its own series would be refused on arrival)."""
    numbers = {"label_set": dict(tenant.label_set), "max_series": tenant.max_series, "group_series":
               int(group_series), "group_series_in_set": int(group_series_in_set),
               "label_set_series": int(label_set_series)}
    shown = label_set_selector(tenant)
    if group_series > 0 and group_series_in_set == 0:
        return TenantCheck(False, f"tenant {shown}: none of the group's {group_series:.0f} series carry the label "
                                  "set, so its limit would throttle nothing of the group", numbers)
    projected = label_set_series + group_series_in_set
    numbers["projected"] = int(projected)
    if tenant.max_series > 0 and projected > tenant.max_series:
        return TenantCheck(False, f"tenant {shown}: {projected:.0f} series once the group lands ({label_set_series:.0f}"
                                  f" held + {group_series_in_set:.0f} of the group) > maxSeries {tenant.max_series}",
                           numbers)
    return TenantCheck(True, f"tenant {shown}: {projected:.0f} of maxSeries {tenant.max_series} series", numbers)
