"""Where the audit anchor lives by default, and what a writer refuses (issue 25; docs/audit.md "Anchors").

A SQLite audit file's default anchor is ``anchors/audit-anchor.db`` beside it, in a directory of mode 0700
(file 0600): a group that shares the audit file cannot write it. A writer refuses a default anchor that group or
others may write, and an anchor URL that is the audit database itself. The anchor store is made with the table,
so an emptied table without it is "anchor missing", not "0 events" (tests/data/bad_inputs_ops.yaml).
"""

from __future__ import annotations

import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest

from promshift.adapters.audit_anchor import ANCHOR_DIR_NAME, ANCHOR_FILE_NAME, default_anchor
from promshift.adapters.audit_store import AuditStore

KEY = "0123456789abcdef0123456789abcdef"


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMSHIFT_AUDIT_KEY", KEY)
    monkeypatch.delenv("PROMSHIFT_AUDIT_ANCHOR_URL", raising=False)


def test_the_default_anchor_is_owner_only_beside_the_audit_file_and_made_with_the_table(tmp_path: Path) -> None:
    AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")  # a writer, before any append
    folder = tmp_path / ANCHOR_DIR_NAME
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / ANCHOR_FILE_NAME).stat().st_mode) == 0o600
    assert not (tmp_path / ANCHOR_FILE_NAME).exists()  # no longer loose beside the audit database


@pytest.mark.parametrize("loosen", ["directory", "file"])
def test_a_writer_refuses_a_default_anchor_that_group_or_others_may_write(tmp_path: Path, loosen: str) -> None:
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}", anchor=None)
    default_anchor(store.url)
    folder = tmp_path / ANCHOR_DIR_NAME
    (folder if loosen == "directory" else folder / ANCHOR_FILE_NAME).chmod(0o770 if loosen == "directory" else 0o660)
    with pytest.raises(ValueError, match=r"is writable by group or others \(mode [67][67]0\).*chmod"):
        default_anchor(store.url)
    writer = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    with pytest.raises(ValueError, match="writable by group or others"):
        writer.append(group="g", run_id="r", kind="note", actor="a", at=datetime(2026, 1, 1, tzinfo=UTC),
                      evidence={})
    assert writer.events() == []  # refused before anything was written


def test_the_anchor_url_may_not_be_the_audit_database_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    monkeypatch.setenv("PROMSHIFT_AUDIT_ANCHOR_URL", url)
    with pytest.raises(ValueError, match="is the audit database itself"):
        default_anchor(url)


def test_a_postgresql_audit_database_has_no_default_anchor() -> None:
    with pytest.raises(ValueError, match="is not a SQLite file: set PROMSHIFT_AUDIT_ANCHOR_URL"):
        default_anchor("postgresql+psycopg://promshift@db.internal/promshift")
