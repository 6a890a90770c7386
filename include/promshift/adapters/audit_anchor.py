"""Where the audit chain's head is anchored, out of the audit writer's reach.

``AuditAnchor`` (declared in ``core.audit``) has two implementations here:

- ``SqlAuditAnchor``: an append-only table in a second database (``PROMSHIFT_AUDIT_ANCHOR_URL``;
  by default, for a SQLite audit file only, ``anchors/audit-anchor.db`` beside it in a directory of
  mode 0700, file 0600, refused when group or others may write either: whoever can write a shared audit
  database through its group cannot touch the anchor; its owner still can, so in production make it a
  different database with different credentials, or S3 below). The anchor URL may never be the audit
  database's own URL.
- ``S3ObjectLockAnchor`` (``s3://bucket/prefix``): one object per head, written under S3 Object
  Lock in COMPLIANCE mode, which nobody (root included) can delete or shorten before it expires.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import Column, Integer, MetaData, String, Table, inspect, select
from sqlalchemy.exc import IntegrityError

from promshift.adapters.audit_store import (
    AuditDatabaseMissing,
    append_only,
    create_tables,
    open_engine,
    redacted,
    sqlite_file,
)
from promshift.adapters.settings import audit_anchor_retention_days, audit_anchor_url
from promshift.core.audit import AnchorPoint, AuditAnchor

log = logging.getLogger(__name__)

ANCHOR_FILE_NAME = "audit-anchor.db"
# The default SQLite anchor's own directory beside the audit file: owner-only, so a group that may write the
# audit database (a shared file) cannot write the anchor.
ANCHOR_DIR_NAME = "anchors"
ANCHOR_DIR_MODE = 0o700
ANCHOR_FILE_MODE = 0o600

anchor_metadata = MetaData()
audit_anchors = Table(
    "promshift_audit_anchors",
    anchor_metadata,
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("head", String(64), nullable=False),
    Column("recorded_at", String(40), nullable=False),
)
append_only(audit_anchors, "promshift_audit_anchor")


class AnchorConflict(RuntimeError):
    """Two different heads anchored for the same sequence number: two chains claim one history."""


class SqlAuditAnchor:
    """Anchored heads as rows of an append-only table in a database of their own."""

    def __init__(self, url: str, *, create: bool = True, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
                 ) -> None:
        self.url = url
        self.where = redacted(url)
        self.clock = clock
        try:
            self.engine = open_engine(url, create=create)
        except AuditDatabaseMissing:
            # A reader finding no anchor file: nothing was anchored (and nothing is created).
            self.engine = None
        if create and self.engine is not None:
            create_tables(anchor_metadata, self.engine, audit_anchors)

    def exists(self) -> bool:
        """Whether the anchor store is there at all (a writer creates it with the audit table)."""
        return self.engine is not None and inspect(self.engine).has_table(audit_anchors.name)

    def record(self, seq: int, head: str) -> None:
        if self.engine is None:
            raise RuntimeError(f"anchor store {self.where} is opened read-only and does not exist")
        try:
            with self.engine.begin() as conn:
                conn.execute(audit_anchors.insert().values(seq=seq, head=head,
                                                           recorded_at=self.clock().isoformat()))
        except IntegrityError:
            with self.engine.connect() as conn:
                known = conn.execute(select(audit_anchors.c.head).where(audit_anchors.c.seq == seq)).scalar()
            if known != head:
                raise AnchorConflict(f"seq {seq} is already anchored with another head") from None

    def latest(self) -> AnchorPoint | None:
        if self.engine is None or not inspect(self.engine).has_table(audit_anchors.name):
            return None
        with self.engine.connect() as conn:
            row = conn.execute(select(audit_anchors).order_by(audit_anchors.c.seq.desc()).limit(1)).first()
        return AnchorPoint(row.seq, row.head) if row else None

    def heads(self) -> list[AnchorPoint]:
        """Every anchored head, oldest first: ``verify`` checks each against the chain, not only the latest."""
        if self.engine is None or not inspect(self.engine).has_table(audit_anchors.name):
            return []
        with self.engine.connect() as conn:
            rows = conn.execute(select(audit_anchors.c.seq, audit_anchors.c.head).order_by(audit_anchors.c.seq))
            return [AnchorPoint(int(seq), str(head)) for seq, head in rows]

    def permission_problem(self) -> str | None:
        """For a SQLite anchor file: its directory or file writable by group or others (one line), else None."""
        path = sqlite_file(self.url)
        if path is None:
            return None
        for item in (path.parent, path):
            try:
                have = stat.S_IMODE(item.stat().st_mode)
            except OSError:
                continue
            if have & 0o022:
                return (f"the anchor {'directory' if item.is_dir() else 'file'} {item} is writable by group or "
                        f"others (mode {have:o}): anyone who can write it can rewrite the anchored heads; chmod "
                        f"{ANCHOR_DIR_MODE if item.is_dir() else ANCHOR_FILE_MODE:o} {item}")
        return None


# Keys count down, so the newest head is the first key S3 lists: one request, however long the chain.
_SEQ_SPACE = 10**12
# How many of the newest S3 heads ``verify`` reads (one GET each).
HEADS_CHECKED = 256


class S3ObjectLockAnchor:
    """Anchored heads as S3 objects under Object Lock (COMPLIANCE) in a bucket created with Object Lock on.

    The writer needs ``s3:PutObject`` (and ``s3:PutObjectRetention`` for the lock) on the prefix,
    nothing else. An overwrite makes a new version; ``latest`` reads the oldest version of the
    newest key, so a later version cannot change an anchored head, and flags the overwrite.
    """

    def __init__(self, bucket: str, prefix: str, *, client: Any, retention_days: int,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.client = client
        self.retention = timedelta(days=retention_days)
        self.clock = clock
        self.where = f"s3://{bucket}/{self.prefix}"

    def exists(self) -> bool:
        """Always: under Object Lock in COMPLIANCE mode nobody can delete an anchored head before it expires."""
        return True

    def key_of(self, seq: int) -> str:
        return f"{self.prefix}heads/{_SEQ_SPACE - seq:012d}.json"

    def record(self, seq: int, head: str) -> None:
        now = self.clock()
        body = json.dumps({"seq": seq, "head": head, "recorded_at": now.isoformat()}, sort_keys=True).encode()
        self.client.put_object(Bucket=self.bucket, Key=self.key_of(seq), Body=body,
                               ContentType="application/json", ChecksumAlgorithm="SHA256",
                               ObjectLockMode="COMPLIANCE", ObjectLockRetainUntilDate=now + self.retention)

    def latest(self) -> AnchorPoint | None:
        listing = self.client.list_objects_v2(Bucket=self.bucket, Prefix=f"{self.prefix}heads/", MaxKeys=1)
        contents = listing.get("Contents") or []
        if not contents:
            return None
        return self._read(contents[0]["Key"])

    def heads(self, newest: int = HEADS_CHECKED) -> list[AnchorPoint]:
        """The ``newest`` anchored heads, oldest first (one GET each: the newest are where a replaced chain shows;
        Object Lock keeps every one, so an older copy cannot be put back)."""
        listing = self.client.list_objects_v2(Bucket=self.bucket, Prefix=f"{self.prefix}heads/", MaxKeys=newest)
        return [self._read(item["Key"]) for item in reversed(listing.get("Contents") or [])]

    def _read(self, key: str) -> AnchorPoint:
        versions = [v for v in self.client.list_object_versions(Bucket=self.bucket, Prefix=key).get("Versions", [])
                    if v["Key"] == key]
        if len(versions) > 1:
            raise AnchorConflict(f"anchor object {key} was overwritten ({len(versions)} versions)")
        kwargs = {"VersionId": versions[0]["VersionId"]} if versions else {}
        data = json.loads(self.client.get_object(Bucket=self.bucket, Key=key, **kwargs)["Body"].read())
        if _SEQ_SPACE - int(key.rsplit("/", 1)[1].split(".")[0]) != int(data["seq"]):
            raise AnchorConflict(f"anchor object {key} holds seq {data['seq']}, not the seq its name says")
        return AnchorPoint(int(data["seq"]), str(data["head"]))


def anchor_for(url: str, *, create: bool = True) -> AuditAnchor:
    """The anchor store a URL names: ``s3://bucket/prefix`` or a SQLAlchemy URL."""
    if url.startswith("s3://"):
        parts = urlsplit(url)
        if not parts.netloc:
            raise ValueError(f"anchor URL {url!r} names no bucket (s3://bucket/prefix)")
        import boto3

        return S3ObjectLockAnchor(parts.netloc, parts.path, client=boto3.client("s3"),
                                  retention_days=audit_anchor_retention_days())
    return SqlAuditAnchor(url, create=create)


def _owner_only(path: Path, mode: int) -> None:
    """Refuse a default anchor that group or others may write (one line, with the fix)."""
    have = stat.S_IMODE(path.stat().st_mode)
    if have & 0o022:
        raise ValueError(f"the audit anchor {path} is writable by group or others (mode {have:o}): whoever can "
                         f"write the audit database could rewrite it; chmod {mode:o} {path}, or set "
                         "PROMSHIFT_AUDIT_ANCHOR_URL to a store of its own")


def default_anchor_path(audit_path: Path) -> Path:
    """Where a SQLite audit file's default anchor lives: ``anchors/audit-anchor.db`` beside it."""
    return audit_path.parent / ANCHOR_DIR_NAME / ANCHOR_FILE_NAME


def default_anchor(audit_url: str, *, create: bool = True) -> AuditAnchor:
    """``PROMSHIFT_AUDIT_ANCHOR_URL``, else, for a SQLite audit file, ``anchors/audit-anchor.db`` beside it.

    - SQLite: the default anchor sits in its own directory, mode 0700 (file 0600); a writer refuses one that
      group or others may write. This separates the anchor from a group that shares the audit file, not from
      its owner: production names another store.
    - PostgreSQL (any server database): no default; ``PROMSHIFT_AUDIT_ANCHOR_URL`` must name another database
      (other credentials) or S3, as a local file would be a different anchor on every worker.
    - S3 Object Lock: never a default; ``s3://bucket/prefix`` in a bucket created with Object Lock.
    The anchor URL may not be the audit database's own URL.
    """
    url = audit_anchor_url()
    if url:
        if redacted(url) == redacted(audit_url):
            raise ValueError(f"PROMSHIFT_AUDIT_ANCHOR_URL is the audit database itself ({redacted(url)}): whoever "
                             "writes the audit log could rewrite its anchors; name another database or s3://")
        return anchor_for(url, create=create)
    path = sqlite_file(audit_url)
    if path is None:
        raise ValueError(f"the audit database {redacted(audit_url)} is not a SQLite file: set "
                         "PROMSHIFT_AUDIT_ANCHOR_URL to a store its writer cannot rewrite (another database, "
                         "or s3://bucket/prefix under Object Lock)")
    anchor_path = default_anchor_path(path)
    if create:
        anchor_path.parent.mkdir(mode=ANCHOR_DIR_MODE, parents=True, exist_ok=True)
        _owner_only(anchor_path.parent, ANCHOR_DIR_MODE)
        try:
            os.close(os.open(anchor_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, ANCHOR_FILE_MODE))
        except FileExistsError:
            pass  # another writer made it
        _owner_only(anchor_path, ANCHOR_FILE_MODE)
    return SqlAuditAnchor(f"sqlite:///{anchor_path}", create=create)
