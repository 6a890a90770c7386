"""Where the audit key comes from, and the S3 Object Lock anchor (against moto's S3, in process)."""

from __future__ import annotations

import argparse
import logging
import stat
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from promshift.adapters.audit_anchor import AnchorConflict, S3ObjectLockAnchor, anchor_for
from promshift.adapters.audit_store import AuditStore
from promshift.adapters.settings import AUDIT_KEY_FILE_NAME, audit_key, local_audit_key_env
from promshift.cli.audit import add_audit_commands
from promshift.core.audit import AnchorPoint, AuditKeyError

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
BUCKET = "promshift-audit-anchors"


@pytest.fixture
def no_key_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("PROMSHIFT_AUDIT_KEY", "PROMSHIFT_AUDIT_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    monkeypatch.setenv("PROMSHIFT_HOME", str(home))
    return home


# -- the key for the CLI and the local stack ---------------------------------------------------------


def test_no_key_anywhere_is_none(no_key_env: Path) -> None:
    assert audit_key() is None


def test_key_from_text_and_from_a_file(no_key_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMSHIFT_AUDIT_KEY", "  text-key-0123456789abcdef \n")
    assert audit_key() == b"text-key-0123456789abcdef"
    monkeypatch.delenv("PROMSHIFT_AUDIT_KEY")
    f = tmp_path / "k"
    f.write_text("file-key-0123456789abcdef\n")
    f.chmod(0o600)
    monkeypatch.setenv("PROMSHIFT_AUDIT_KEY_FILE", str(f))
    assert audit_key() == b"file-key-0123456789abcdef"


@pytest.mark.parametrize("env,message", [
    ({"PROMSHIFT_AUDIT_KEY": "a" * 32, "PROMSHIFT_AUDIT_KEY_FILE": "/x"}, "not both"),
    ({"PROMSHIFT_AUDIT_KEY": "short"}, "is 5 bytes; use at least 16"),
    ({"PROMSHIFT_AUDIT_KEY_FILE": "/nonexistent/audit.key"}, "cannot read the audit key file /nonexistent/audit.key"),
])
def test_bad_keys_are_one_line_errors(no_key_env: Path, env: dict[str, str], message: str) -> None:
    with pytest.raises(AuditKeyError, match=message):
        audit_key(env)


def test_the_local_stack_makes_a_private_key_file_once_and_never_logs_it(
        no_key_env: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    env = local_audit_key_env(no_key_env)
    path = no_key_env / AUDIT_KEY_FILE_NAME
    assert env == {"PROMSHIFT_AUDIT_KEY_FILE": str(path)}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = path.read_text().strip()
    assert len(bytes.fromhex(key)) == 32
    assert local_audit_key_env(no_key_env) == env and path.read_text().strip() == key  # kept, not replaced
    assert audit_key(env) == key.encode()
    assert audit_key() == key.encode()  # found under PROMSHIFT_HOME without the variable too
    assert key not in caplog.text


def test_the_local_stack_uses_a_key_the_environment_gives(no_key_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMSHIFT_AUDIT_KEY", "given-key-0123456789abcdef")
    assert local_audit_key_env(no_key_env) == {}
    assert not (no_key_env / AUDIT_KEY_FILE_NAME).exists()


def test_a_key_file_others_can_read_is_warned_about(tmp_path: Path, no_key_env: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    f = tmp_path / "k"
    f.write_text("file-key-0123456789abcdef\n")
    f.chmod(0o644)
    assert audit_key({"PROMSHIFT_AUDIT_KEY_FILE": str(f)}) == b"file-key-0123456789abcdef"
    assert "chmod 600" in caplog.text and "file-key" not in caplog.text


# -- S3 Object Lock anchor -------------------------------------------------------------------------------


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)
        yield client


def test_s3_anchor_latest_is_the_highest_seq_whatever_the_order(s3: Any) -> None:
    anchor = S3ObjectLockAnchor(BUCKET, "prod/audit", client=s3, retention_days=30, clock=lambda: T0)
    assert anchor.latest() is None
    for seq in (2, 11, 1, 10):  # concurrent writers anchor out of order
        anchor.record(seq, f"{seq:064x}")
    assert anchor.latest() == AnchorPoint(11, f"{11:064x}")
    assert anchor.where == f"s3://{BUCKET}/prod/audit/"


def test_s3_anchors_are_locked_in_compliance_mode(s3: Any) -> None:
    now = datetime.now(UTC)
    anchor = S3ObjectLockAnchor(BUCKET, "p", client=s3, retention_days=30, clock=lambda: now)
    anchor.record(1, "a" * 64)
    key = anchor.key_of(1)
    meta = s3.head_object(Bucket=BUCKET, Key=key)
    assert meta["ObjectLockMode"] == "COMPLIANCE"
    assert abs(meta["ObjectLockRetainUntilDate"] - (now + timedelta(days=30))) < timedelta(seconds=1)
    [version] = s3.list_object_versions(Bucket=BUCKET, Prefix=key)["Versions"]
    with pytest.raises(s3.exceptions.ClientError, match="AccessDenied"):
        s3.delete_object(Bucket=BUCKET, Key=key, VersionId=version["VersionId"])
    assert anchor.latest() == AnchorPoint(1, "a" * 64)


def test_an_overwritten_s3_anchor_is_a_conflict(s3: Any) -> None:
    anchor = S3ObjectLockAnchor(BUCKET, "p", client=s3, retention_days=1)
    anchor.record(5, "a" * 64)
    anchor.record(5, "b" * 64)  # a new version: the old one stays, locked
    with pytest.raises(AnchorConflict, match="overwritten"):
        anchor.latest()


def test_verify_against_an_s3_anchor_catches_truncation(
        s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import sqlite3

    monkeypatch.setenv("PROMSHIFT_AUDIT_ANCHOR_URL", f"s3://{BUCKET}/audit")
    assert isinstance(anchor_for(f"s3://{BUCKET}/audit"), S3ObjectLockAnchor)
    db = tmp_path / "audit.db"
    store = AuditStore(f"sqlite:///{db}")
    for i in range(3):
        store.append(group="g", run_id="r", kind=f"k{i}", actor="a", at=T0, evidence={"i": i})
    assert not (tmp_path / "anchors").exists()
    parser = argparse.ArgumentParser()
    add_audit_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["audit", "verify", "--url", f"sqlite:///{db}"])
    assert args.handler(args) == 0
    assert f"anchored head: seq 3 {store.events()[-1].hash[:12]} in s3://{BUCKET}/audit/" in capsys.readouterr().out
    con = sqlite3.connect(db)
    con.execute("DROP TRIGGER promshift_audit_no_delete")
    con.execute("DELETE FROM promshift_audit_events WHERE seq = 3")
    con.commit()
    con.close()
    assert args.handler(args) == 2
    assert "the chain ends at seq 2 but seq 3 was anchored" in capsys.readouterr().out


def test_an_s3_url_without_a_bucket_is_refused() -> None:
    with pytest.raises(ValueError, match="names no bucket"):
        anchor_for("s3:///prefix")
