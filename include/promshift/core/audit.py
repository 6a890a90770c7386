"""Audit records: an append-only chain where each event carries the hash of the previous one."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

GENESIS_HASH = "0" * 64


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the bytes that get hashed."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str, allow_nan=False)


@dataclass(frozen=True)
class AuditEvent:
    """One recorded decision or transition of a metric group.

    ``evidence`` is the JSON text (canonical) of whatever justified the event:
    resolved PromQL, numbers, config hashes, who approved.
    """

    seq: int
    group: str
    run_id: str
    kind: str
    stage_from: str | None
    stage_to: str | None
    actor: str
    at: datetime
    evidence: str
    prev_hash: str
    hash: str

    @property
    def evidence_data(self) -> Any:
        return json.loads(self.evidence)

    def content_hash(self) -> str:
        """What ``hash`` must be for this event's content; a mismatch means it was edited."""
        return _content_hash({f.name: getattr(self, f.name) for f in fields(self) if f.name != "hash"})


def _content_hash(fields: Mapping[str, Any]) -> str:
    """SHA-256 over every field of an event (``hash`` excluded) and the previous event's hash."""
    return hashlib.sha256(canonical_json({**fields, "at": fields["at"].isoformat()}).encode()).hexdigest()


def new_event(
    *,
    prev: AuditEvent | None,
    group: str,
    run_id: str,
    kind: str,
    stage_from: str | None,
    stage_to: str | None,
    actor: str,
    at: datetime,
    evidence: Mapping[str, Any],
) -> AuditEvent:
    """Build the event that follows ``prev`` (None for the first event of the chain)."""
    if at.tzinfo is None:
        raise ValueError("audit timestamps must be timezone-aware")
    seq = prev.seq + 1 if prev else 1
    prev_hash = prev.hash if prev else GENESIS_HASH
    text = canonical_json(dict(evidence))
    content = dict(
        seq=seq,
        group=group,
        run_id=run_id,
        kind=kind,
        stage_from=stage_from,
        stage_to=stage_to,
        actor=actor,
        at=at,
        evidence=text,
        prev_hash=prev_hash,
    )
    return AuditEvent(**content, hash=_content_hash(content))


@dataclass(frozen=True)
class ChainCheck:
    """Result of verifying the chain: ok, how many events, and what is wrong."""

    ok: bool
    events: int
    problems: tuple[str, ...]


def verify_chain(events: Iterable[AuditEvent]) -> ChainCheck:
    """Check sequence numbers, back-links and hashes of the whole chain, oldest first.

    An edited row no longer matches its hash; a deleted row leaves a gap in ``seq`` and
    a back-link that points at nothing.
    """
    problems: list[str] = []
    prev_hash = GENESIS_HASH
    expected_seq = 1
    count = 0
    for ev in events:
        count += 1
        if ev.seq != expected_seq:
            problems.append(f"event seq {ev.seq}: expected seq {expected_seq} (a row is missing)")
        if ev.prev_hash != prev_hash:
            problems.append(f"event seq {ev.seq}: prev_hash does not match the hash of the event before it")
        if ev.content_hash() != ev.hash:
            problems.append(f"event seq {ev.seq}: content does not match its hash (edited)")
        prev_hash = ev.hash
        expected_seq = ev.seq + 1
    return ChainCheck(ok=not problems, events=count, problems=tuple(problems))
