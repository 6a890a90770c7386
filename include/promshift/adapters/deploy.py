"""Deploy a Prometheus config as a local file: check with promtool, write, reload, verify.

Any failure after the file is touched restores the snapshot byte for byte and reloads
it, so a failed deploy leaves the source exactly as it was.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.render import remote_write_names, sha256_text

log = logging.getLogger(__name__)


class DeployError(RuntimeError):
    """The new config was not deployed; the source runs its previous config."""


@dataclass(frozen=True)
class ConfigSnapshot:
    """The exact bytes of a config file at one moment, and their hash."""

    path: str
    text: str
    sha256: str


@dataclass(frozen=True)
class DeployResult:
    before_sha256: str
    after_sha256: str
    live_remote_writes: tuple[str, ...]


class FileConfigDeployer:
    """Owns one Prometheus config file and the server that loads it."""

    def __init__(self, config_path: str | os.PathLike[str], client: PrometheusClient, *,
                 promtool: str = "promtool") -> None:
        self.config_path = Path(config_path)
        self.client = client
        self.promtool = promtool

    def snapshot(self) -> ConfigSnapshot:
        text = self.config_path.read_text()
        return ConfigSnapshot(path=str(self.config_path), text=text, sha256=sha256_text(text))

    def check(self, text: str) -> None:
        """Run ``promtool check config`` on ``text`` next to the real file (relative paths resolve)."""
        exe = shutil.which(self.promtool)
        if exe is None:
            raise DeployError(f"{self.promtool!r} not found; install Debian's prometheus package")
        fd, tmp = tempfile.mkstemp(prefix=".promshift-check-", suffix=".yml", dir=self.config_path.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            proc = subprocess.run([exe, "check", "config", tmp], capture_output=True, text=True, timeout=60)
        finally:
            os.unlink(tmp)
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().replace(tmp, str(self.config_path))
            raise DeployError(f"promtool rejected the new config for {self.config_path}: {detail}")

    def _write(self, text: str) -> None:
        # Write then rename, so Prometheus never reads a half-written file.
        fd, tmp = tempfile.mkstemp(prefix=".promshift-", suffix=".yml", dir=self.config_path.parent)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        mode = self.config_path.stat().st_mode & 0o777 if self.config_path.exists() else 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, self.config_path)

    def deploy(self, new_text: str, *, snapshot: ConfigSnapshot, expect_remote_writes: set[str],
               expect_absent: set[str] = frozenset()) -> DeployResult:
        """Check, write, reload and verify ``new_text``; on any failure restore ``snapshot``.

        Verified means ``/api/v1/status/config`` lists every name in ``expect_remote_writes``
        and none in ``expect_absent``: a reload that returned 200 is not proof on its own.
        """
        current = self.config_path.read_text()
        if sha256_text(current) != snapshot.sha256:
            raise DeployError(f"{self.config_path} changed since the snapshot was taken "
                              f"(sha256 {sha256_text(current)[:12]} != {snapshot.sha256[:12]}); refusing to deploy")
        self.check(new_text)
        self._write(new_text)
        try:
            log.info("reloading %s", self.client.base_url)
            self.client.reload()
            live = remote_write_names(self.client.config_text())
            missing = sorted(expect_remote_writes - set(live))
            extra = sorted(expect_absent & set(live))
            if missing or extra:
                raise DeployError(f"loaded config does not match: missing remote_write {missing}, "
                                  f"still present {extra}")
        except (PrometheusError, DeployError) as exc:
            log.error("deploy failed (%s); restoring snapshot %s", exc, snapshot.sha256[:12])
            self.restore(snapshot)
            if isinstance(exc, DeployError):
                raise
            raise DeployError(f"deploy to {self.client.base_url} failed and was reverted: {exc}") from exc
        return DeployResult(before_sha256=snapshot.sha256, after_sha256=sha256_text(new_text),
                            live_remote_writes=tuple(live))

    def restore(self, snapshot: ConfigSnapshot) -> bool:
        """Write the snapshot's exact bytes back and reload; True when the file is identical."""
        self._write(snapshot.text)
        try:
            self.client.reload()
        except PrometheusError as exc:
            log.error("reload after restore failed: %s", exc)
            raise DeployError(f"restored {self.config_path} but reload failed: {exc}") from exc
        return sha256_text(self.config_path.read_text()) == snapshot.sha256
