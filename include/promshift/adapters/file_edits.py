"""One ``core.queues.ConfigChange`` of the source's config file behind the ``ConfigDeployer`` seam (a queue swap's add,
removal or undo), on the file path's own driver: ``FileDeployment``'s snapshot and byte-for-byte restore, the
file deployer's promtool check, reload and verification of the loaded config. Only ``deploy`` and ``verify``
differ: the new bytes come from the change, and the loaded config must list the change's ``live`` entries and
none of its ``gone`` ones.
"""

from __future__ import annotations

from datetime import datetime

from promshift.adapters.deploy import FileConfigDeployer
from promshift.adapters.file_deployment import FileDeployment
from promshift.adapters.prometheus import PrometheusError
from promshift.core.deploy import DeployError, DeployResult, DeploySnapshot, DeployState
from promshift.core.queues import ConfigChange
from promshift.core.render import RenderError, remote_write_names, sha256_bytes


class FileEditDeployment(FileDeployment):
    """A ConfigDeployer that puts one ``ConfigChange`` of the source's config file live (and takes it back)."""

    def __init__(self, deployer: FileConfigDeployer, change: ConfigChange) -> None:
        super().__init__(deployer, {"name": change.describe})
        self.change = change

    def deploy(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        data = snapshot.content.encode("utf-8")
        try:
            new_data = self.change.apply(data)
        except RenderError as exc:
            raise DeployError(str(exc)) from exc
        done = self.deployer.deploy(new_data, snapshot=self._file_snapshot(snapshot),
                                    expect_remote_writes=set(self.change.live), expect_absent=set(self.change.gone))
        return DeployResult(self.kind, "deploy", DeployState.WAITING).observed(
            "LIVE", now, state=DeployState.DONE, reason=self.change.describe,
            config_before_sha256=done.before_sha256, config_after_sha256=sha256_bytes(new_data),
            live_remote_writes=list(done.live_remote_writes))

    def verify(self, result: DeployResult, now: datetime) -> DeployResult:
        try:
            live = set(remote_write_names(self.deployer.client.config_text()))
        except PrometheusError as exc:
            raise DeployError(f"cannot read the loaded config: {exc}") from exc
        if self.change.live <= live and not self.change.gone & live:
            return result.observed("LIVE", now, state=DeployState.DONE, reason=self.change.describe)
        return result.observed("NOT_LIVE", now, state=DeployState.FAILED,
                               reason=f"{self.change.describe}: the loaded config does not show it")
