"""Where the strict local AMP's limits come from: the control plane's Service Quotas and workspace configuration.

One table (``APS_QUOTAS``) feeds both sides: the control plane answers ListServiceQuotas / GetServiceQuota from it
(``promshift.local.stack.controlplane``), and the front door enforces the same values
(``promshift.local.stack.frontdoor`` through ``amp_ingest``). A value is AMP's documented default unless
``<state-dir>/faults.json`` sets it: ``aps_quotas`` (``{"active_series": N, ...}``, every workspace),
``aps_quotas_by_workspace`` (``{"ws-...": {...}}``, one workspace's own, as GetServiceQuota's ContextId answers)
and ``aps_limits`` (the limits AMP documents but Service Quotas does not adjust: label lengths, request size,
query limits, ``series_floor``; tests set small ones). The workspace configuration (retention,
``outOfOrderTimeWindowInSeconds``, ``limitsPerLabelSet``) is what UpdateWorkspaceConfiguration stored in
``<state-dir>/workspace-configurations.json``.

Defaults and their sources: docs/local-stack.md ("The strict workspace's limits").
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from promshift.core.ingest_limits import WorkspaceLimits, label_set_limits

DEFAULTS = WorkspaceLimits()
# key -> (the stand-in's quota code, AWS's quota name, default, the AWS/Usage resource that counts its use).
# Callers find a quota by its name, as they must when AWS's codes are not pinned.
APS_QUOTAS = {
    "active_series": ("L-PROMSHIFT-LOCAL-ACTIVE-SERIES", "Active series per workspace", DEFAULTS.active_series,
                      "ActiveSeries"),
    "ingestion_rate": ("L-PROMSHIFT-LOCAL-INGESTION-RATE", "Ingestion rate per workspace", DEFAULTS.ingestion_rate,
                       "IngestionRate"),
    "ingestion_burst": ("L-PROMSHIFT-LOCAL-INGESTION-BURST", "Ingestion burst size per workspace",
                        DEFAULTS.ingestion_burst, "IngestionBurstSize"),
    "labels_per_series": ("L-PROMSHIFT-LOCAL-LABELS-PER-SERIES", "Labels per metric series",
                          float(DEFAULTS.labels_per_series), "LabelsPerMetricSeries"),
}
CONFIGURATIONS_FILE = "workspace-configurations.json"
DEFAULT_OUT_OF_ORDER_WINDOW_S = int(DEFAULTS.out_of_order_window_s)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}


def quota_value(faults: dict[str, Any], key: str, workspace: str = "") -> float:
    """What Service Quotas answers for ``key`` (for ``workspace`` when it has its own value)."""
    value = float((faults.get("aps_quotas") or {}).get(key, APS_QUOTAS[key][2]))
    return float(((faults.get("aps_quotas_by_workspace") or {}).get(workspace) or {}).get(key, value))


def read_configurations(state_dir: Path | None) -> dict[str, dict[str, Any]]:
    """Every workspace's stored configuration (empty without a state dir or a file)."""
    return _read_json(state_dir / CONFIGURATIONS_FILE) if state_dir is not None else {}


def write_configurations(state_dir: Path | None, configurations: dict[str, dict[str, Any]]) -> None:
    """Store the configurations for the front door (atomically; the control plane holds its lock)."""
    if state_dir is None:
        return
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / f".{CONFIGURATIONS_FILE}.tmp"
    tmp.write_text(json.dumps(configurations, default=str))
    os.replace(tmp, state_dir / CONFIGURATIONS_FILE)


def workspace_limits(state_dir: Path | None, workspace: str) -> WorkspaceLimits:
    """The limits the front door enforces on ``workspace`` now."""
    faults = _read_json(state_dir / "faults.json") if state_dir is not None else {}
    values: dict[str, Any] = {key: quota_value(faults, key, workspace) for key in APS_QUOTAS}
    values.update(faults.get("aps_limits") or {})
    configuration = read_configurations(state_dir).get(workspace) or {}
    if configuration.get("outOfOrderTimeWindowInSeconds") is not None:
        values["out_of_order_window_s"] = configuration["outOfOrderTimeWindowInSeconds"]
    limits = DEFAULTS.with_values(values)
    entries = configuration.get("limitsPerLabelSet") or []
    return limits if not entries else WorkspaceLimits(**{**{k: getattr(limits, k) for k in
                                                             limits.__dataclass_fields__},
                                                          "label_set_limits": label_set_limits(entries)})
