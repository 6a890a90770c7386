"""Deploy a Prometheus config as a local file: check with promtool, write, reload, verify.

The deployer respects the file it owns:

- it works on bytes (CRLF, a BOM or a missing final line break survive) and compares sha256
  over bytes;
- a symlinked config keeps its link: the write goes through to the link's target;
- the owner, group and mode of the file are kept (the write is refused before it happens
  when they cannot be);
- any failure after the write, of any exception type, restores the snapshot byte for byte
  and reloads it, so a failed deploy leaves the source exactly as it was.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from promshift.adapters.files import read_user_file
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.deploy import DeployError
from promshift.core.inputs import CONFIG, InputRefused
from promshift.core.redact import redact_text
from promshift.core.render import remote_write_names, sha256_bytes

log = logging.getLogger(__name__)

# How long a restore's reload may take: removing a queue whose endpoint is down waits out the flush deadline
# (the reload took 120 s on 2.42 with the default 1 m). A restore is the step that must not give up early.
RESTORE_RELOAD_TIMEOUT_S = 300.0

# One exception for every deployer (core.deploy): a deploy, verify or restore not done, in one line;
# for this file: the new config was not deployed and the source runs its previous config.
__all__ = ["ConfigSnapshot", "DeployError", "FileConfigDeployer", "FileDeployOutcome", "promtool_on",
           "promtool_version", "restored_mode", "write_atomically", "write_keeping", "write_restoring"]

# POSIX ACLs live in these extended attributes; a write-then-rename makes a new inode, so they are copied
# from the file being replaced (an admin's ACL stays as it is now).
_ACL_XATTRS = ("system.posix_acl_access", "system.posix_acl_default")


def _copy_acls(src: Path, dst: str) -> None:
    """Copy ``src``'s POSIX ACLs (if any, and if the filesystem has them) onto ``dst``."""
    for name in _ACL_XATTRS:
        try:
            value = os.getxattr(src, name)
        except OSError:  # ENODATA: no such ACL; ENOTSUP: the filesystem has none
            continue
        try:
            os.setxattr(dst, name, value)
        except PermissionError as exc:
            raise DeployError(f"cannot keep the ACL of {src} as uid {os.getuid()}: {exc.strerror}; "
                              "refusing to write") from None
        except OSError:
            continue


def restored_mode(snapshot_mode: int | None, current_mode: int | None) -> int | None:
    """The stricter of the snapshot's mode and the file's mode now: only bits both allow.

    An admin who tightened the file after our snapshot (0644 -> 0600, it holds a password) keeps 0600; one
    who loosened it gets the snapshot's mode back. A restore never widens a mode.
    """
    if snapshot_mode is None or current_mode is None:
        return current_mode if snapshot_mode is None else snapshot_mode
    return snapshot_mode & current_mode


def write_restoring(path: Path, data: bytes, *, snapshot_mode: int | None) -> None:
    """Write a snapshot's bytes back: mode the stricter of (snapshot, now); owner, group and ACLs as they are now."""
    real = Path(os.path.realpath(path))
    st = real.stat() if real.exists() else None
    mode = restored_mode(snapshot_mode, stat.S_IMODE(st.st_mode) if st else None)
    write_keeping(real, data, mode=0o644 if mode is None else mode)


def write_atomically(path: Path, data: bytes, *, mode: int, uid: int = -1, gid: int = -1) -> None:
    """Replace ``path`` with ``data`` by write-then-rename: readers see the old bytes or the new, never half.

    The new file gets ``mode`` and, unless -1, ``uid``/``gid`` before it takes the name; a
    chown we may not do raises DeployError and leaves ``path`` untouched.
    """
    fd, tmp = tempfile.mkstemp(prefix=".promshift-", suffix=".tmp", dir=path.parent)  # created 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if (uid, gid) != (-1, -1):
            try:
                os.chown(tmp, uid, gid)
            except PermissionError as exc:
                raise DeployError(f"cannot keep the owner of {path} (uid {uid}, gid {gid}) as uid {os.getuid()}: "
                                  f"{exc.strerror}; refusing to write") from None
        if path.exists():
            _copy_acls(path, tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_keeping(path: Path, data: bytes, *, mode: int | None = None, uid: int | None = None,
                  gid: int | None = None) -> None:
    """Replace the file's bytes atomically, keeping its mode, owner and group (or the given ones); a symlink
    keeps its link (the write goes to its target)."""
    real = Path(os.path.realpath(path))
    st = real.stat() if real.exists() else None
    mode = mode if mode is not None else (stat.S_IMODE(st.st_mode) if st else 0o644)
    uid = uid if uid is not None else (st.st_uid if st else -1)
    gid = gid if gid is not None else (st.st_gid if st else -1)
    write_atomically(real, data, mode=mode, uid=uid, gid=gid)


def promtool_on(data: bytes, command: str, *, promtool: str, prefix: str,
                folder: Path | None = None) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run ``promtool check <command>`` on ``data`` written to a temporary file (in ``folder``, else the
    system's); the finished process and the temporary file's name (gone by then) to replace in its output."""
    exe = shutil.which(promtool)
    if exe is None:
        raise DeployError(f"{promtool!r} not found; install Debian's prometheus package")
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".yml", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        proc = subprocess.run([exe, "check", command, tmp], capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(tmp)
    return proc, tmp


@dataclass(frozen=True)
class ConfigSnapshot:
    """The exact bytes of a config file at one moment, their hash, and the file's mode and owner.

    ``mode``/``uid``/``gid`` are None when unknown (a snapshot recorded by an older version):
    a restore then keeps whatever the file has.
    """

    path: str
    data: bytes
    sha256: str
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None

    @classmethod
    def of(cls, path: str | os.PathLike[str], data: bytes, *, mode: int | None = None, uid: int | None = None,
           gid: int | None = None) -> ConfigSnapshot:
        return cls(path=str(path), data=data, sha256=sha256_bytes(data), mode=mode, uid=uid, gid=gid)


@dataclass(frozen=True)
class FileDeployOutcome:
    """A file deploy that went live: the config's sha256 before and after, and the remote_writes now loaded."""

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

    @property
    def real_path(self) -> Path:
        """The file the bytes live in: the link's target when ``config_path`` is a symlink."""
        return Path(os.path.realpath(self.config_path))

    def snapshot(self) -> ConfigSnapshot:
        real = self.real_path
        try:
            data = read_user_file(real, CONFIG)  # a regular file within the config budget
        except InputRefused as exc:
            raise DeployError(str(exc)) from None
        st = real.stat()
        return ConfigSnapshot.of(self.config_path, data, mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid)

    def check(self, data: bytes) -> None:
        """Run ``promtool check config`` on ``data`` next to the real file (relative paths resolve)."""
        # Next to the path Prometheus was given (a symlink's own folder): relative paths resolve from there.
        proc, tmp = promtool_on(data, "config", promtool=self.promtool, prefix=".promshift-check-",
                                folder=self.config_path.parent)
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().replace(tmp, str(self.config_path))
            raise DeployError(redact_text(f"promtool rejected the new config for {self.config_path}: {detail}"))

    def _write(self, data: bytes, *, mode: int | None = None, uid: int | None = None, gid: int | None = None) -> None:
        """Replace the real file's bytes atomically, keeping its mode, owner and group (or the given ones)."""
        write_keeping(self.real_path, data, mode=mode, uid=uid, gid=gid)

    def deploy(self, new_data: bytes, *, snapshot: ConfigSnapshot, expect_remote_writes: set[str],
               expect_absent: set[str] = frozenset()) -> FileDeployOutcome:
        """Check, write, reload and verify ``new_data``; on any failure restore ``snapshot``.

        Verified means ``/api/v1/status/config`` lists every name in ``expect_remote_writes``
        and none in ``expect_absent``: a reload that returned 200 is not proof on its own.
        """
        current = self.real_path.read_bytes()
        if sha256_bytes(current) != snapshot.sha256:
            raise DeployError(f"{self.config_path} changed since the snapshot was taken "
                              f"(sha256 {sha256_bytes(current)[:12]} != {snapshot.sha256[:12]}); refusing to deploy")
        self.check(new_data)
        self._write(new_data)
        try:
            log.info("reloading %s", redact_text(self.client.base_url))
            self.client.reload()
            live = remote_write_names(self.client.config_text())
            missing = sorted(expect_remote_writes - set(live))
            extra = sorted(expect_absent & set(live))
            if missing or extra:
                raise DeployError(f"loaded config does not match: missing remote_write {missing}, "
                                  f"still present {extra}")
        except BaseException as exc:
            # Whatever went wrong (an HTML page for status/config, a KeyError, a kill), the old bytes go back.
            reason = redact_text(f"{type(exc).__name__}: {exc}")
            log.error("deploy failed (%s); restoring snapshot %s", reason, snapshot.sha256[:12])
            try:
                self.restore(snapshot)
            except Exception as restore_exc:
                raise DeployError(f"deploy to {redact_text(self.client.base_url)} failed ({reason}) and restoring "
                                  f"the snapshot failed too: {redact_text(str(restore_exc))}") from None
            if isinstance(exc, DeployError) or not isinstance(exc, Exception):
                raise
            where = redact_text(self.client.base_url)
            raise DeployError(f"deploy to {where} failed and was reverted: {reason}") from exc
        return FileDeployOutcome(before_sha256=snapshot.sha256, after_sha256=sha256_bytes(new_data),
                            live_remote_writes=tuple(live))

    def restore(self, snapshot: ConfigSnapshot) -> bool:
        """Write the snapshot's exact bytes back and reload; the mode is the stricter of (snapshot, now), the
        owner, group and ACLs are as they are now (``write_restoring``): a restore never loosens what someone
        set after our snapshot.

        True when the file is identical (see ``matches``). A symlinked config stays a symlink:
        the bytes go to its target.
        """
        write_restoring(self.real_path, snapshot.data, snapshot_mode=snapshot.mode)
        try:
            # Dropping our remote_write queue while its endpoint is down blocks the reload: measured 120 s with
            # Prometheus 2.42's default --storage.remote.flush-deadline=1m, just at the default client timeout.
            self.client.reload(timeout_s=RESTORE_RELOAD_TIMEOUT_S)
        except PrometheusError as exc:
            log.error("reload after restore failed: %s", exc)
            raise DeployError(f"restored {self.config_path} but reload failed: {exc}") from exc
        return self.matches(snapshot)

    def matches(self, snapshot: ConfigSnapshot) -> bool:
        """Whether the file now holds the snapshot's bytes with a mode no looser than the snapshot's (where known).

        The owner is not compared: a restore keeps the owner someone set after the snapshot.
        """
        real = self.real_path
        if not real.exists() or sha256_bytes(real.read_bytes()) != snapshot.sha256:
            return False
        have = stat.S_IMODE(real.stat().st_mode)
        return snapshot.mode is None or have & ~snapshot.mode == 0


def promtool_version(promtool: str = "promtool", *, timeout_s: float = 20.0) -> str:
    """What ``promtool --version`` prints (its first line); DeployError when it cannot be run."""
    exe = shutil.which(promtool)
    if exe is None:
        raise DeployError(f"{promtool!r} not found; the image copies it from the fleet's Prometheus "
                          "(docs/deployment.md#promtool)")
    try:
        proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DeployError(f"{promtool!r} --version did not run: {exc}") from None
    text = (proc.stdout or proc.stderr).strip()
    if proc.returncode != 0 or not text:
        raise DeployError(f"{promtool!r} --version failed (exit {proc.returncode})")
    return text.splitlines()[0]
