"""Today's file deployer (``adapters.deploy.FileConfigDeployer``) behind the ``core.deploy.ConfigDeployer`` seam.

A shim, so the file path and the managed-collector path (``adapters.amp_scraper.ScraperDeployer``)
are driven by the same steps: ``snapshot`` is the file's bytes, ``deploy`` adds the group's own
``remote_write`` entry and reloads (``FileConfigDeployer`` verifies ``/api/v1/status/config`` and
restores the bytes itself on any failure), ``verify`` re-reads the loaded config, ``restore`` writes
the bytes back. The file path knows at once, so its results are DONE (or raise) immediately.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from promshift.adapters.deploy import ConfigSnapshot, FileConfigDeployer
from promshift.adapters.prometheus import PrometheusError
from promshift.core.deploy import DeployError, DeployKind, DeployResult, DeploySnapshot, DeployState
from promshift.core.inputs import InputRefused, decode_utf8
from promshift.core.render import RenderError, add_remote_write, remote_write_names


class FileDeployment:
    """A ConfigDeployer that adds one group's ``remote_write`` entry to a Prometheus config file."""

    kind = DeployKind.FILE.value

    def __init__(self, deployer: FileConfigDeployer, entry: Mapping[str, Any]) -> None:
        self.deployer = deployer
        self.entry = dict(entry)

    @staticmethod
    def _file_snapshot(snapshot: DeploySnapshot) -> ConfigSnapshot:
        # The protocol's content is text; the file deployer works on the file's exact bytes (UTF-8, as
        # the editor requires), and keeps the file's mode and owner from the snapshot's meta.
        meta = snapshot.meta
        return ConfigSnapshot.of(str(snapshot.ref), snapshot.content.encode("utf-8"), mode=meta.get("mode"),
                                 uid=meta.get("uid"), gid=meta.get("gid"))

    def snapshot(self) -> DeploySnapshot:
        snap = self.deployer.snapshot()
        try:
            text = decode_utf8(snap.data, f"source config {snap.path}")
        except InputRefused as exc:
            raise DeployError(str(exc)) from None
        return DeploySnapshot(self.kind, snap.path, text,
                              {"existed": True, "mode": snap.mode, "uid": snap.uid, "gid": snap.gid})

    def deploy(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        try:
            new_text = add_remote_write(snapshot.content.encode("utf-8"), self.entry)
            done = self.deployer.deploy(new_text, snapshot=self._file_snapshot(snapshot),
                                        expect_remote_writes={self.entry["name"]})
        except RenderError as exc:
            raise DeployError(str(exc)) from exc
        return DeployResult(self.kind, "deploy", DeployState.WAITING).observed(
            "LIVE", now, state=DeployState.DONE, reason=f"remote_write {self.entry['name']} is live",
            remote_write=self.entry["name"], config_before_sha256=done.before_sha256,
            config_after_sha256=done.after_sha256, live_remote_writes=list(done.live_remote_writes))

    def verify(self, result: DeployResult, now: datetime) -> DeployResult:
        try:
            live = remote_write_names(self.deployer.client.config_text())
        except PrometheusError as exc:
            raise DeployError(f"cannot read the loaded config: {exc}") from exc
        if self.entry["name"] in live:
            return result.observed("LIVE", now, state=DeployState.DONE, reason=f"remote_write {self.entry['name']} "
                                   "is live", live_remote_writes=live)
        return result.observed("NOT_LIVE", now, state=DeployState.FAILED,
                               reason=f"remote_write {self.entry['name']} is not in the loaded config",
                               live_remote_writes=live)

    def restore(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        identical = self.deployer.restore(self._file_snapshot(snapshot))
        state = DeployState.DONE if identical else DeployState.FAILED
        return DeployResult(self.kind, "restore", DeployState.WAITING).observed(
            "RESTORED" if identical else "DIFFERS", now, state=state, restored_identical=identical,
            reason="config restored byte for byte" if identical else "restored file differs from the snapshot")
