"""The migration's tenant step: the group's label-set limit checked, then set in the workspace configuration.

Over ``core.tenants.WorkspaceConfigurationPort`` (the AMP adapter: ``adapters.amp_tenants``) and a counter of
series (``count(<selector>)`` on a side). Idempotent: a limit already set to the group's value is left as it is,
so a retried task reaches the same end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from promshift.core.catalog import MetricGroup
from promshift.core.deploy import DeployError
from promshift.core.tenants import (
    WorkspaceConfigurationPort,
    current_limit,
    group_in_set_selector,
    label_set_selector,
    merged_limits,
    tenant_preflight,
)


def set_tenant_limit(m: Any) -> dict[str, Any]:
    """The migration's group's tenant (``tenant:``) pre-flighted and set (``apply_tenant``); ``{}`` without one.
    Raises ``DeployError`` when refused, or when the target has no workspace configuration to hold it (fail
    closed: a limit the catalog asks for is never skipped)."""
    if not m.group.tenant.enabled:
        return {}
    workspace = m.backends.workspace_configuration
    if workspace is None:
        raise DeployError(f"group {m.group.name} declares a tenant, but its target has no workspace configuration "
                          "to hold the label-set limit (an AMP target has)")

    def count(client: Any) -> Callable[[str], float]:
        return lambda selector: float(client.scalar(f"count({selector})") or 0.0)

    try:
        evidence = apply_tenant(m.group, workspace, source_count=count(m.backends.source),
                                target_count=count(m.backends.target))
    except TenantRefused as exc:
        raise DeployError(str(exc), details={"tenant": exc.numbers}) from None
    log.info("tenant %s: %s", m.group.name, evidence)
    return evidence


log = logging.getLogger(__name__)


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
