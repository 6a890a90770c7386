"""A restore never loosens what someone set after our snapshot (issue 25, damage).

An admin tightens the source config to 0600 (it holds a basic_auth password), or gives it an ACL, or another
owner, between our snapshot and our rollback: the snapshot's bytes go back, the mode is the stricter of
(snapshot, now), and owner, group and ACLs stay as they are now.
"""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.deploy import FileConfigDeployer, restored_mode, write_keeping

BASE = b"global:\n  scrape_interval: 15s\nscrape_configs:\n- job_name: a\n  basic_auth: {password: s3cret}\n"
EDITED = BASE + b"remote_write:\n- url: http://127.0.0.1:9/api/v1/write\n  name: promshift-gpu-memory\n"
ACL = "system.posix_acl_access"
NOBODY = 0xFFFFFFFF


class ReloadClient:
    """Counts reloads; the file is what these tests look at."""

    base_url = "http://127.0.0.1:9"

    def __init__(self) -> None:
        self.reloads = 0

    def reload(self, *, timeout_s: float | None = None) -> None:
        self.reloads += 1


def deployed(tmp_path: Path, mode: int) -> tuple[FileConfigDeployer, Any, Path]:
    config = tmp_path / "prometheus.yml"
    config.write_bytes(BASE)
    config.chmod(mode)
    client: Any = ReloadClient()
    deployer = FileConfigDeployer(config, client)
    snap = deployer.snapshot()
    write_keeping(config, EDITED)  # our deploy: the file keeps its mode
    return deployer, snap, config


@pytest.mark.parametrize(("snapshot_mode", "admin_mode", "expected"), [
    (0o644, 0o600, 0o600),   # tightened after the snapshot: stays tight
    (0o640, 0o666, 0o640),   # loosened after the snapshot: the snapshot's mode comes back
    (0o644, 0o644, 0o644),
    (0o640, 0o604, 0o600),   # neither is a subset of the other: only the bits both allow
])
def test_restore_keeps_the_stricter_mode(tmp_path: Path, snapshot_mode: int, admin_mode: int, expected: int) -> None:
    deployer, snap, config = deployed(tmp_path, snapshot_mode)
    config.chmod(admin_mode)
    assert deployer.restore(snap) is True
    assert config.read_bytes() == BASE
    assert stat.S_IMODE(config.stat().st_mode) == expected
    assert restored_mode(snapshot_mode, admin_mode) == expected


def test_a_tightened_file_still_counts_as_restored_but_a_looser_one_does_not(tmp_path: Path) -> None:
    deployer, snap, config = deployed(tmp_path, 0o644)
    write_keeping(config, BASE)
    config.chmod(0o600)
    assert deployer.matches(snap) is True
    config.chmod(0o664)
    assert deployer.matches(snap) is False


def test_restore_keeps_the_owner_as_it_is_now(tmp_path: Path) -> None:
    assert os.getuid() == 0, "this test chowns to another user (the sandbox and CI run as root)"
    deployer, snap, config = deployed(tmp_path, 0o644)
    os.chown(config, 4321, 8765)  # the admin hands the file to another user after our snapshot
    assert deployer.restore(snap) is True
    st = config.stat()
    assert (st.st_uid, st.st_gid, config.read_bytes()) == (4321, 8765, BASE)


def test_restore_keeps_an_acl_set_after_the_snapshot(tmp_path: Path) -> None:
    deployer, snap, config = deployed(tmp_path, 0o640)
    # user 4321 may read: USER_OBJ rw, USER(4321) r, GROUP_OBJ r, MASK r, OTHER none
    acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, who) for tag, perm, who in (
        (0x01, 6, NOBODY), (0x02, 4, 4321), (0x04, 4, NOBODY), (0x10, 4, NOBODY), (0x20, 0, NOBODY)))
    os.setxattr(config, ACL, acl)
    assert deployer.restore(snap) is True
    assert config.read_bytes() == BASE
    assert os.getxattr(config, ACL) == acl
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
