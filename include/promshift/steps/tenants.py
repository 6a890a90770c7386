"""The migration's tenant step: the group's label-set limit checked, then set in the workspace configuration.

Over ``core.tenants.WorkspaceConfigurationPort`` (the AMP adapter: ``adapters.amp_tenants``) and a counter of
series (``count(<selector>)`` on a side). Idempotent: a limit already set to the group's value is left as it is,
so a retried task reaches the same end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from promshift.core.catalog import MetricGroup
from promshift.core.tenants import (
    WorkspaceConfigurationPort,
    current_limit,
    group_in_set_selector,
    label_set_selector,
    merged_limits,
    tenant_preflight,
)


class TenantRefused(RuntimeError):
    """The group does not fit its tenant's limit; nothing was set."""

    def __init__(self, reason: str, numbers: dict[str, Any]) -> None:
        super().__init__(reason)
        self.numbers = numbers


def apply_tenant(group: MetricGroup, workspace: WorkspaceConfigurationPort, *,
                 source_count: Callable[[str], float], target_count: Callable[[str], float]) -> dict[str, Any]:
    """Pre-flight the group's tenant, then set its ``limitsPerLabelSet`` entry; the evidence (``{}``: no tenant).

    ``source_count``/``target_count``: ``count(<selector>)`` on that side (0 for nothing)."""
    tenant = group.tenant
    if not tenant.enabled:
        return {}
    in_set = group_in_set_selector(group.name_regex(), tenant)
    check = tenant_preflight(tenant, group_series=source_count(group.selector()),
                             group_series_in_set=source_count(in_set),
                             label_set_series=target_count(label_set_selector(tenant)))
    if not check.ok:
        raise TenantRefused(f"tenant pre-flight refused: {check.reason}", check.numbers)
    existing = workspace.label_set_limits()
    before = current_limit(existing, tenant)
    if before != tenant.max_series:
        workspace.set_label_set_limits(merged_limits(existing, tenant))
    return {**check.numbers, "previous_max_series": before, "set": before != tenant.max_series}
