"""Audit records: an append-only chain where each event carries the hash of the previous one.

Two schemes, recorded on every event:

- ``sha256-v1``: a plain SHA-256 over the event. Anyone who can write the database can
  recompute it, so it only catches careless edits. Databases written before the key existed
  use it and keep verifying.
- ``hmac-sha256-v2``: an HMAC-SHA256 over the event (scheme included) with a key kept outside
  the audit database. Whoever can write rows but lacks the key cannot forge a valid event.

Truncation and wholesale replacement leave a valid-looking chain; the anchored head
(``AuditAnchor``: the last sequence number and head hash, kept where the writer cannot
rewrite them) is what ``verify_chain`` checks them against.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Protocol

from promshift.core.redact import redact

GENESIS_HASH = "0" * 64
SHA256_V1 = "sha256-v1"
HMAC_SHA256_V2 = "hmac-sha256-v2"
SCHEMES = (SHA256_V1, HMAC_SHA256_V2)
# 128 bits: shorter keys are guessable, and a guessed key forges the whole chain.
MIN_KEY_BYTES = 16


class AuditKeyError(ValueError):
    """The audit key is missing or unusable; the message says which and how to fix it."""


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the bytes that get hashed."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str, allow_nan=False)


def check_key(key: bytes) -> bytes:
    """The key itself, if long enough to be worth anything."""
    if len(key) < MIN_KEY_BYTES:
        raise AuditKeyError(f"the audit key is {len(key)} bytes; use at least {MIN_KEY_BYTES} random bytes "
                            "(e.g. 64 hex characters)")
    return key


def content_hash(content: Mapping[str, Any], *, scheme: str, key: bytes | None) -> str:
    """The hash an event with this content (every field but ``hash``) must carry under ``scheme``.

    The one function that both builds and verifies. ``sha256-v1`` hashes the content without the
    scheme (as it was hashed before schemes existed); ``hmac-sha256-v2`` keys the scheme in too,
    so a keyed event cannot be relabelled.
    """
    body = {k: v for k, v in content.items() if k != "scheme"}
    body["at"] = body["at"].isoformat()
    if scheme == SHA256_V1:
        return hashlib.sha256(canonical_json(body).encode()).hexdigest()
    if scheme == HMAC_SHA256_V2:
        if key is None:
            raise AuditKeyError(f"{HMAC_SHA256_V2} events need the audit key")
        message = canonical_json({**body, "scheme": scheme}).encode()
        return hmac.new(check_key(key), message, hashlib.sha256).hexdigest()
    raise ValueError(f"unknown audit hash scheme {scheme!r} (known: {', '.join(SCHEMES)})")


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
    scheme: str = SHA256_V1

    @property
    def evidence_data(self) -> Any:
        return json.loads(self.evidence)

    def content(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "hash"}

    def hash_matches(self, key: bytes | None) -> bool:
        """Whether ``hash`` is what this content hashes to; a mismatch means it was edited (or forged)."""
        return hmac.compare_digest(content_hash(self.content(), scheme=self.scheme, key=key), self.hash)


@dataclass(frozen=True)
class AnchorPoint:
    """A chain head as recorded outside the audit database: event ``seq`` had hash ``head``."""

    seq: int
    head: str

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "head": self.head}


class AuditAnchor(Protocol):
    """Where chain heads are recorded so that the audit writer cannot rewrite them.

    ``record`` is called after every append (heads may arrive out of order from concurrent
    writers); ``latest`` is the anchored head with the highest ``seq``, or None if nothing
    was ever anchored. ``where`` names the store for people, without credentials.
    """

    where: str

    def record(self, seq: int, head: str) -> None: ...

    def latest(self) -> AnchorPoint | None: ...

    # Optional: ``heads()``, every anchored head (or the newest ones) oldest first, for ``verify`` to check each.


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
    key: bytes | None,
) -> AuditEvent:
    """Build the event that follows ``prev`` (None for the first event of the chain).

    With a key the event is ``hmac-sha256-v2``; ``key=None`` builds the legacy unkeyed scheme.
    """
    if at.tzinfo is None:
        raise ValueError("audit timestamps must be timezone-aware")
    scheme = SHA256_V1 if key is None else HMAC_SHA256_V2
    content = dict(
        seq=prev.seq + 1 if prev else 1,
        group=group,
        run_id=run_id,
        kind=str(kind),  # an ``EventKind`` as the plain string it is stored as (and hashed as: its value)
        stage_from=stage_from,
        stage_to=stage_to,
        actor=actor,
        at=at,
        evidence=canonical_json(redact(dict(evidence))),  # redacted on entry: no secret is ever hashed in
        prev_hash=prev.hash if prev else GENESIS_HASH,
        scheme=scheme,
    )
    return AuditEvent(**content, hash=content_hash(content, scheme=scheme, key=key))


@dataclass(frozen=True)
class SchemeRun:
    """Consecutive events under one hash scheme."""

    scheme: str
    first_seq: int
    last_seq: int
    events: int

    def to_dict(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "first_seq": self.first_seq, "last_seq": self.last_seq,
                "events": self.events}


@dataclass(frozen=True)
class ChainCheck:
    """Result of verifying the chain: ok, how many events, what is wrong, and what is merely worth knowing."""

    ok: bool
    events: int
    problems: tuple[str, ...]
    notes: tuple[str, ...] = ()
    schemes: tuple[SchemeRun, ...] = ()
    head: AnchorPoint | None = None
    anchor: AnchorPoint | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "events": self.events, "problems": list(self.problems), "notes": list(self.notes),
                "schemes": [s.to_dict() for s in self.schemes],
                "head": self.head.to_dict() if self.head else None,
                "anchor": self.anchor.to_dict() if self.anchor else None}


def verify_chain(events: Iterable[AuditEvent], *, key: bytes | None = None, anchored: bool = False,
                 anchor: AnchorPoint | None = None, allow_unanchored_tail: bool = False) -> ChainCheck:
    """Check sequence numbers, back-links, schemes and hashes of the whole chain, oldest first.

    An edited row no longer matches its hash; a deleted row leaves a gap in ``seq`` and a
    back-link that points at nothing; an unkeyed event after a keyed one is a downgrade (only
    someone without the key writes one). With ``anchored``, ``anchor`` is the latest head the
    anchor store holds (None: it holds none), and a chain that ends before it (truncated,
    emptied) or differs from it there (replaced) is broken, and so is one that goes on past it (events
    forged with the key, or an anchor outage) unless ``allow_unanchored_tail``, when that is a note.
    """
    verifier = ChainVerifier(key=key, keep_hashes=0)
    verifier.watch(anchor)
    verifier.feed(events)
    return verifier.check(anchored=anchored, anchor=anchor, allow_unanchored_tail=allow_unanchored_tail)


class ChainVerifier:
    """``verify_chain`` in steps: feed the chain's events oldest first, in as many calls as they arrive, and
    ``check`` at any point. Fed once, an event is never read again, so a reader that keeps a verifier checks
    only the events appended since (the board). An edit to an event already fed is not seen by this verifier:
    a fresh one over the whole chain sees it.

    The anchored head is compared with the hash of the event at its ``seq``: the hashes of the last
    ``keep_hashes`` events are kept for that (an anchor trails the head by at most the writers in flight), and
    the one ``watch``ed before feeding is kept whatever its age. ``check`` raises ``LookupError`` for an anchor
    on an event neither kept: verify afresh.
    """

    def __init__(self, *, key: bytes | None, keep_hashes: int = 1024) -> None:
        self.key = key
        self.keep_hashes = keep_hashes
        self.problems: list[str] = []
        self.runs: list[SchemeRun] = []
        self.prev_hash = GENESIS_HASH
        self.expected_seq = 1
        self.count = 0
        self.keyed_seen: int | None = None
        self.unverifiable: list[int] = []
        self.keyed_mismatch = 0
        self.keyed_total = 0
        self._head: AnchorPoint | None = None
        self.unkeyed = 0
        self._recent: dict[int, str] = {}
        self._watched: dict[int, str | None] = {}

    def watch(self, anchor: AnchorPoint | None) -> None:
        """Keep the hash of the event at ``anchor.seq`` when it is fed."""
        if anchor is not None:
            self._watched.setdefault(anchor.seq, None)

    def feed(self, events: Iterable[AuditEvent]) -> None:
        key = self.key
        for ev in events:
            self.count += 1
            self._head = AnchorPoint(ev.seq, ev.hash)
            if ev.seq != self.expected_seq:
                self.problems.append(f"event seq {ev.seq}: expected seq {self.expected_seq} (a row is missing)")
            if ev.prev_hash != self.prev_hash:
                self.problems.append(f"event seq {ev.seq}: prev_hash does not match the hash of the event before it")
            runs = self.runs
            if runs and runs[-1].scheme == ev.scheme:
                r = runs[-1]
                runs[-1] = SchemeRun(r.scheme, r.first_seq, ev.seq, r.events + 1)
            else:
                runs.append(SchemeRun(ev.scheme, ev.seq, ev.seq, 1))
            if ev.scheme not in SCHEMES:
                self.problems.append(f"event seq {ev.seq}: unknown hash scheme {ev.scheme!r}")
            elif ev.scheme == HMAC_SHA256_V2:
                self.keyed_total += 1
                self.keyed_seen = self.keyed_seen or ev.seq
                if key is None:
                    self.unverifiable.append(ev.seq)
                elif not ev.hash_matches(key):
                    self.keyed_mismatch += 1
                    self.problems.append(f"event seq {ev.seq}: content does not match its HMAC (edited, or forged "
                                         "without the audit key)")
            else:
                self.unkeyed += 1
                if self.keyed_seen is not None:
                    self.problems.append(f"event seq {ev.seq}: unkeyed ({SHA256_V1}) after keyed events (from seq "
                                         f"{self.keyed_seen}): written without the audit key")
                if not ev.hash_matches(None):
                    self.problems.append(f"event seq {ev.seq}: content does not match its hash (edited)")
            if ev.seq in self._watched:
                self._watched[ev.seq] = ev.hash
            if self.keep_hashes:
                self._recent[ev.seq] = ev.hash
                if len(self._recent) > self.keep_hashes:
                    del self._recent[next(iter(self._recent))]
            self.prev_hash = ev.hash
            self.expected_seq = ev.seq + 1

    @property
    def head(self) -> AnchorPoint | None:
        return self._head

    @property
    def clean(self) -> bool:
        """Nothing wrong so far: every event fed verified (what a checkpoint may record)."""
        return not self.problems and not self.unverifiable and self.keyed_mismatch == 0

    def state(self) -> dict[str, Any]:
        """What ``resume`` needs to go on from here, as JSON (for a checkpoint; only of a ``clean`` verifier)."""
        if not self.clean:
            raise ValueError("only a chain verified clean so far can be resumed")
        return {"count": self.count, "head": self._head.to_dict() if self._head else None,
                "keyed_seen": self.keyed_seen, "keyed_total": self.keyed_total, "unkeyed": self.unkeyed,
                "runs": [r.to_dict() for r in self.runs]}

    @classmethod
    def resume(cls, state: Mapping[str, Any], *, key: bytes | None, keep_hashes: int = 1024) -> ChainVerifier:
        """A verifier that goes on after the events a clean ``state`` covers, without reading them again."""
        v = cls(key=key, keep_hashes=keep_hashes)
        v.count, v.keyed_seen = int(state["count"]), state["keyed_seen"]
        v.keyed_total, v.unkeyed = int(state["keyed_total"]), int(state["unkeyed"])
        v.runs = [SchemeRun(r["scheme"], int(r["first_seq"]), int(r["last_seq"]), int(r["events"]))
                  for r in state["runs"]]
        head = state.get("head")
        if head:
            v._head = AnchorPoint(int(head["seq"]), str(head["head"]))
            v.prev_hash, v.expected_seq = v._head.head, v._head.seq + 1
            if keep_hashes:
                v._recent[v._head.seq] = v._head.head
        return v


    def anchored_heads_problems(self, heads: Iterable[AnchorPoint]) -> list[str]:
        """Each anchored head (``watch``ed before feeding) against the chain fed: the event at its ``seq`` must
        have its hash. The latest alone is not enough: a table emptied and written again past the old latest
        would pass, while every earlier head still holds the old chain. One line per kind of mismatch."""
        fed = self._head.seq if self._head is not None else 0
        replaced = [h.seq for h in heads if h.seq <= fed and self._watched.get(h.seq) != h.head]
        if not replaced:
            return []
        shown_ = ", ".join(str(seq) for seq in replaced[:5]) + (" ..." if len(replaced) > 5 else "")
        return [f"{len(replaced)} anchored head(s) (seq {shown_}) do not match the chain's events at those seqs: "
                "the chain was replaced"]

    def check(self, *, anchored: bool = False, anchor: AnchorPoint | None = None,
              allow_unanchored_tail: bool = False) -> ChainCheck:
        """The chain fed so far, as ``verify_chain`` judges it."""
        problems = list(self.problems)
        notes: list[str] = []
        if self.unverifiable:
            problems.append(f"{len(self.unverifiable)} keyed ({HMAC_SHA256_V2}) events (seq {self.unverifiable[0]}.."
                            f"{self.unverifiable[-1]}) cannot be checked: no audit key was given")
        if self.keyed_total > 1 and self.keyed_mismatch == self.keyed_total:
            notes.append("every keyed event fails its HMAC: is this the key the chain was written with?")
        if self.unkeyed:
            notes.append(f"{self.unkeyed} events use the unkeyed {SHA256_V1} scheme: anyone who could write the "
                         "database could have recomputed them")
        head = self.head
        if anchored:
            hash_at_anchor = None
            if anchor is not None and head is not None and anchor.seq <= head.seq:
                if anchor.seq in self._watched:
                    hash_at_anchor = self._watched[anchor.seq]
                elif anchor.seq in self._recent:
                    hash_at_anchor = self._recent[anchor.seq]
                elif self.keep_hashes:
                    raise LookupError(f"anchored seq {anchor.seq} is older than the {self.keep_hashes} hashes kept")
            problems.extend(_anchor_problems(head, anchor, hash_at_anchor, keyed=self.keyed_total > 0, notes=notes,
                                             allow_unanchored_tail=allow_unanchored_tail))
        return ChainCheck(ok=not problems, events=self.count, problems=tuple(problems), notes=tuple(notes),
                          schemes=tuple(self.runs), head=head, anchor=anchor)


def checkpoint_mac(state: Mapping[str, Any], *, key: bytes) -> str:
    """The HMAC a verification checkpoint carries: whoever can write the database but lacks the key cannot
    claim a chain was verified."""
    message = canonical_json({"kind": "promshift-audit-checkpoint-v1", "state": dict(state)}).encode()
    return hmac.new(check_key(key), message, hashlib.sha256).hexdigest()


def _anchor_problems(head: AnchorPoint | None, anchor: AnchorPoint | None, hash_at_anchor: str | None, *,
                     keyed: bool, notes: list[str], allow_unanchored_tail: bool = False) -> list[str]:
    """What the anchored head says about the chain's end: truncated, emptied, replaced, or fine."""
    if anchor is None:
        if keyed:
            return ["keyed events but the anchor store holds no head: it was reset, or points elsewhere"]
        if head is not None:
            notes.append("no anchored head: truncation and replacement of this chain cannot be detected")
        return []
    if head is None:
        return [f"the audit table is empty but {anchor.seq} events were anchored (head seq {anchor.seq}): "
                "every event was deleted"]
    if head.seq < anchor.seq:
        return [f"the chain ends at seq {head.seq} but seq {anchor.seq} was anchored: "
                f"{anchor.seq - head.seq} trailing event(s) were deleted"]
    if hash_at_anchor != anchor.head:
        return [f"event seq {anchor.seq} does not match the anchored head: the chain was replaced"]
    if head.seq > anchor.seq:
        tail = f"{head.seq - anchor.seq} events after the last anchored head (seq {anchor.seq})"
        if allow_unanchored_tail:
            notes.append(f"{tail} are not protected against truncation (accepted: --allow-unanchored-tail)")
            return []
        return [f"{tail} are not anchored: forged with the key, or the anchor store was down when they were "
                "written (check the writer's log; --allow-unanchored-tail accepts them)"]
    return []

