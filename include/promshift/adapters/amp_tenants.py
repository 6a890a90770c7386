"""The target workspace's ``limitsPerLabelSet`` (Describe/UpdateWorkspaceConfiguration), as ``core.tenants`` needs.

``AmpWorkspaceConfiguration`` is ``core.tenants.WorkspaceConfigurationPort`` over an ``amp`` boto3 client: the list
is read whole and written whole (AMP replaces it on update), so the step edits one entry and keeps the others.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from promshift.adapters.amp import AmpError, AmpTarget, aws_error_message

MAX_ENTRIES = 1000  # a workspace answer bigger than this is refused, not read


@dataclass
class AmpWorkspaceConfiguration:
    """One workspace's configuration through the AMP control plane."""

    client: Any
    target: AmpTarget
    workspace_id: str

    def label_set_limits(self) -> list[dict[str, Any]]:
        try:
            answer = self.client.describe_workspace_configuration(workspaceId=self.workspace_id)
        except Exception as exc:
            raise aws_error_message(exc, action="DescribeWorkspaceConfiguration", target=self.target,
                                    workspace=self.workspace_id) from None
        entries = (answer.get("workspaceConfiguration") or {}).get("limitsPerLabelSet") or []
        if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
            raise AmpError(f"workspace {self.workspace_id}: limitsPerLabelSet is not a list of at most "
                           f"{MAX_ENTRIES} entries")
        return [dict(e) for e in entries if isinstance(e, Mapping)]

    def set_label_set_limits(self, entries: Sequence[Mapping[str, Any]]) -> None:
        try:
            self.client.update_workspace_configuration(
                workspaceId=self.workspace_id, clientToken=str(uuid.uuid4()),
                limitsPerLabelSet=[{"labelSet": dict(e["labelSet"]), "limits": dict(e["limits"])} for e in entries])
        except Exception as exc:
            raise aws_error_message(exc, action="UpdateWorkspaceConfiguration", target=self.target,
                                    workspace=self.workspace_id) from None
