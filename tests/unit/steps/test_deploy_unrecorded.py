"""Nothing stays deployed without its event (``steps.deploy.DeployStep.finish``), even when the audit database is
what failed: the snapshot the deploy loaded before writing is what goes back, not a second read of a store that may
live in the same unreachable database (the fault matrix's fault 9, here without servers)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.audit_store import AuditStore
from promshift.core.deploy import DeployError, InMemoryConfigDeployer, InMemorySnapshotStore
from tests.unit.steps.test_migration_retry import migration

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BEFORE, AFTER = "global: {}\n", "global: {}\nremote_write: [{name: promshift-gpu-memory}]\n"


class DatabaseDown(RuntimeError):
    """The audit database went away."""


class FlakyStore(InMemorySnapshotStore):
    """A snapshot store that becomes unreadable (kept in the audit database, which went away)."""

    down = False

    def get(self, ref: str) -> Any:
        if self.down:
            raise DeployError("snapshot store unreachable")
        return super().get(ref)


@pytest.mark.parametrize("fails", ["append", "read"])
def test_an_unrecorded_deploy_is_undone_from_the_snapshot_loaded_before_the_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str) -> None:
    audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    deployer, store = InMemoryConfigDeployer(BEFORE, AFTER, kind="file"), FlakyStore()
    m = migration(tmp_path, audit)
    m._deployer, m._snapshots = deployer, store  # noqa: SLF001 - the ports under test
    m.record("validated", T0, {})
    snap = m.snapshot(T0)
    real_deploy = deployer.deploy

    def deploy_then_database_down(*args: Any, **kwargs: Any) -> Any:
        result = real_deploy(*args, **kwargs)
        store.down = True

        def down(*_a: Any, **_k: Any) -> Any:
            raise DatabaseDown("server closed the connection unexpectedly")

        monkeypatch.setattr(audit, "append", down)
        if fails == "read":  # the retry check before the append reads the log first
            monkeypatch.setattr(m, "recorded", down)
        return result

    monkeypatch.setattr(deployer, "deploy", deploy_then_database_down)
    with pytest.raises(DatabaseDown):
        m.deploy_dual_write(snap, T0)
    assert deployer.live == BEFORE
    assert deployer.calls[-1] == "restore"
    audit.engine.dispose()


def test_a_recorded_deploy_is_not_undone_when_a_later_read_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    deployer = InMemoryConfigDeployer(BEFORE, AFTER, kind="file")
    m = migration(tmp_path, audit)
    m._deployer, m._snapshots = deployer, InMemorySnapshotStore()  # noqa: SLF001
    m.record("validated", T0, {})
    snap = m.snapshot(T0)
    m.deploy_dual_write(snap, T0)
    assert deployer.live == AFTER
    event = {"status": "done", "reason": "", "result": {}}

    def confirm_fails() -> None:
        raise DatabaseDown("reload refused")

    monkeypatch.setattr(deployer, "confirm_live", confirm_fails, raising=False)
    with pytest.raises(DatabaseDown):
        m.deploy_step.finish(event, None, T0, snapshot_info=snap)
    assert deployer.live == AFTER  # recorded: the deploy stands, the retry re-confirms it
    audit.engine.dispose()
