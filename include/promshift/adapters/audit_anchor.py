"""Where the audit chain's head is anchored, out of the audit writer's reach.

``AuditAnchor`` (declared in ``core.audit``) has two implementations here:

- ``SqlAuditAnchor``: an append-only table in a second database (``PROMSHIFT_AUDIT_ANCHOR_URL``;
  by default a SQLite file next to a SQLite audit database). Locally that only guards against
  mistakes; in production make it a different database with different credentials, so whoever
  can write the audit database cannot rewrite the anchors.
- ``S3ObjectLockAnchor`` (``s3://bucket/prefix``): one object per head, written under S3 Object
  Lock in COMPLIANCE mode, which nobody (root included) can delete or shorten before it expires.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import Column, Integer, MetaData, String, Table, inspect, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from promshift.adapters.audit_store import (
    AuditDatabaseMissing,
    append_only,
    open_engine,
    redacted,
    sqlite_file,
)
from promshift.adapters.settings import audit_anchor_retention_days, audit_anchor_url
from promshift.core.audit import AnchorPoint, AuditAnchor

log = logging.getLogger(__name__)

ANCHOR_FILE_NAME = "audit-anchor.db"

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
            try:
                anchor_metadata.create_all(self.engine)
            except SQLAlchemyError:
                # Another writer created it between the check and the CREATE.
                if not inspect(self.engine).has_table(audit_anchors.name):
                    raise

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


# Keys count down, so the newest head is the first key S3 lists: one request, however long the chain.
_SEQ_SPACE = 10**12


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
        key = contents[0]["Key"]
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


def default_anchor(audit_url: str, *, create: bool = True) -> AuditAnchor:
    """``PROMSHIFT_AUDIT_ANCHOR_URL``, else ``audit-anchor.db`` next to a SQLite audit file.

    A server audit database (PostgreSQL) must name its anchor store: a local file would be a
    different anchor on every worker.
    """
    url = audit_anchor_url()
    if url:
        return anchor_for(url, create=create)
    path = sqlite_file(audit_url)
    if path is None:
        raise ValueError(f"the audit database {redacted(audit_url)} is not a SQLite file: set "
                         "PROMSHIFT_AUDIT_ANCHOR_URL to a store its writer cannot rewrite (another database, "
                         "or s3://bucket/prefix under Object Lock)")
    return SqlAuditAnchor(f"sqlite:///{path.parent / ANCHOR_FILE_NAME}", create=create)
