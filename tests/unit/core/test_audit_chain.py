"""The pure audit chain: both hash schemes, forgery without the key, and checks against the anchored head."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from datetime import UTC, datetime, timedelta

import pytest

from promshift.core.audit import (
    GENESIS_HASH,
    HMAC_SHA256_V2,
    SHA256_V1,
    AnchorPoint,
    AuditEvent,
    AuditKeyError,
    content_hash,
    new_event,
    verify_chain,
)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
KEY = b"the-real-audit-key-0123456789"
ATTACKER_KEY = b"a-guessed-audit-key-987654321"


def chain(n: int, *, key: bytes | None = KEY, start: list[AuditEvent] | None = None) -> list[AuditEvent]:
    events: list[AuditEvent] = list(start or [])
    for i in range(n):
        events.append(new_event(prev=events[-1] if events else None, group="gpu-memory", run_id="r1",
                                kind=f"k{len(events)}", stage_from=None, stage_to=None, actor="promshift",
                                at=T0 + timedelta(seconds=len(events)), evidence={"i": i, "nan": None}, key=key))
    return events


def head(events: list[AuditEvent]) -> AnchorPoint:
    return AnchorPoint(events[-1].seq, events[-1].hash)


def test_keyed_chain_links_and_verifies_with_the_key_only() -> None:
    events = chain(5)
    assert events[0].prev_hash == GENESIS_HASH and events[0].seq == 1
    assert all(b.prev_hash == a.hash for a, b in zip(events, events[1:], strict=False))
    assert {e.scheme for e in events} == {HMAC_SHA256_V2}
    check = verify_chain(events, key=KEY, anchored=True, anchor=head(events))
    assert check.ok and check.events == 5 and not check.problems and not check.notes
    assert [(r.scheme, r.first_seq, r.last_seq) for r in check.schemes] == [(HMAC_SHA256_V2, 1, 5)]
    # Without the key nothing keyed can be vouched for.
    no_key = verify_chain(events)
    assert not no_key.ok and "no audit key" in no_key.problems[0] and "seq 1..5" in no_key.problems[0]


def test_the_unkeyed_scheme_hashes_exactly_as_before_schemes_existed() -> None:
    """Databases written by earlier releases keep verifying: sha256-v1 is the old formula, unchanged."""
    [ev] = chain(1, key=None)
    old = {f.name: getattr(ev, f.name) for f in dataclasses.fields(ev) if f.name not in ("hash", "scheme")}
    old["at"] = ev.at.isoformat()
    expected = hashlib.sha256(json.dumps(old, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert ev.scheme == SHA256_V1 and ev.hash == expected


def test_legacy_chain_verifies_and_says_it_is_unkeyed() -> None:
    events = chain(3, key=None)
    check = verify_chain(events, key=KEY, anchored=True, anchor=None)
    assert check.ok
    assert [(r.scheme, r.first_seq, r.last_seq) for r in check.schemes] == [(SHA256_V1, 1, 3)]
    assert any("unkeyed" in n for n in check.notes) and any("no anchored head" in n for n in check.notes)


def test_upgraded_chain_keyed_after_unkeyed_verifies() -> None:
    events = chain(2, key=KEY, start=chain(3, key=None))
    check = verify_chain(events, key=KEY, anchored=True, anchor=head(events))
    assert check.ok, check.problems
    assert [(r.scheme, r.first_seq, r.last_seq) for r in check.schemes] == [(SHA256_V1, 1, 3),
                                                                         (HMAC_SHA256_V2, 4, 5)]


def forged_unkeyed(events: list[AuditEvent]) -> list[AuditEvent]:
    """An attacker appends an ``approved`` event, recomputing the unkeyed hash."""
    return chain(1, key=None, start=events)


def forged_wrong_key(events: list[AuditEvent]) -> list[AuditEvent]:
    return chain(1, key=ATTACKER_KEY, start=events)


def forged_path_to_cut_over(events: list[AuditEvent]) -> list[AuditEvent]:
    return chain(3, key=ATTACKER_KEY, start=events)


def relabelled_as_unkeyed(events: list[AuditEvent]) -> list[AuditEvent]:
    """Edit the last keyed event and pass it off as sha256-v1 (which needs no key)."""
    last = dataclasses.replace(events[-1], evidence='{"decision":"Approve"}', scheme=SHA256_V1)
    return [*events[:-1], dataclasses.replace(last, hash=content_hash(last.content(), scheme=SHA256_V1, key=None))]


def edited(events: list[AuditEvent]) -> list[AuditEvent]:
    return [*events[:2], dataclasses.replace(events[2], evidence='{"i":99}'), *events[3:]]


def deleted_middle(events: list[AuditEvent]) -> list[AuditEvent]:
    return [events[0], *events[2:]]


def truncated(events: list[AuditEvent]) -> list[AuditEvent]:
    return events[:2]


def emptied(events: list[AuditEvent]) -> list[AuditEvent]:
    return []


def replaced_by_a_keyed_chain(events: list[AuditEvent]) -> list[AuditEvent]:
    """Someone with the key (but not the anchor store) writes a different history of the same length."""
    out: list[AuditEvent] = []
    for i in range(len(events)):
        out.append(new_event(prev=out[-1] if out else None, group="gpu-memory", run_id="forged", kind="approved",
                             stage_from=None, stage_to=None, actor="mallory", at=T0, evidence={"i": i}, key=KEY))
    return out


def rewritten_unkeyed(events: list[AuditEvent]) -> list[AuditEvent]:
    """The whole chain rewritten under the unkeyed scheme: a legal-looking legacy chain."""
    return chain(len(events), key=None)


@pytest.mark.parametrize("tamper,needle", [
    pytest.param(forged_unkeyed, "unkeyed (sha256-v1) after keyed events", id="forged-append-unkeyed"),
    pytest.param(forged_wrong_key, "does not match its HMAC", id="forged-append-wrong-key"),
    pytest.param(forged_path_to_cut_over, "does not match its HMAC", id="forged-path"),
    pytest.param(relabelled_as_unkeyed, "after keyed events", id="relabelled-unkeyed"),
    pytest.param(edited, "does not match its HMAC", id="edited"),
    pytest.param(deleted_middle, "a row is missing", id="deleted-middle"),
    pytest.param(truncated, "trailing event(s) were deleted", id="truncated"),
    pytest.param(emptied, "table is empty but 4 events were anchored", id="emptied"),
    pytest.param(replaced_by_a_keyed_chain, "does not match the anchored head", id="replaced-with-key"),
    pytest.param(rewritten_unkeyed, "does not match the anchored head", id="rewritten-unkeyed"),
])
def test_tampering_is_broken(tamper: object, needle: str) -> None:
    events = chain(4)
    anchor = head(events)
    check = verify_chain(tamper(events), key=KEY, anchored=True, anchor=anchor)  # type: ignore[operator]
    assert not check.ok
    assert any(needle in p for p in check.problems), check.problems


def test_verifying_with_the_wrong_key_says_so() -> None:
    events = chain(3)
    check = verify_chain(events, key=ATTACKER_KEY, anchored=True, anchor=head(events))
    assert not check.ok and len(check.problems) == 3
    assert any("is this the key" in n for n in check.notes)


def test_keyed_events_without_an_anchored_head_are_broken() -> None:
    """The writer anchors every keyed event: none anchored means the anchor store was reset or is elsewhere."""
    check = verify_chain(chain(2), key=KEY, anchored=True, anchor=None)
    assert not check.ok and "anchor store holds no head" in check.problems[0]


def test_events_after_the_anchored_head_fail_unless_explicitly_allowed() -> None:
    """Events forged with the key but never anchored fail; an operator who checked an anchor outage allows them."""
    events = chain(4)
    check = verify_chain(events, key=KEY, anchored=True, anchor=AnchorPoint(2, events[1].hash))
    assert not check.ok and "2 events after the last anchored head (seq 2) are not anchored" in check.problems[0]
    allowed = verify_chain(events, key=KEY, anchored=True, anchor=AnchorPoint(2, events[1].hash),
                           allow_unanchored_tail=True)
    assert allowed.ok and any("2 events after the last anchored head" in n for n in allowed.notes)


def test_an_empty_unanchored_chain_is_fine() -> None:
    check = verify_chain([], key=KEY, anchored=True, anchor=None)
    assert check.ok and check.events == 0 and check.head is None


@pytest.mark.parametrize("key", [b"", b"short"])
def test_short_keys_are_refused(key: bytes) -> None:
    with pytest.raises(AuditKeyError, match="at least 16"):
        chain(1, key=key)


def test_unknown_scheme_is_a_problem_not_a_crash() -> None:
    events = chain(2)
    events[1] = dataclasses.replace(events[1], scheme="md5-v0")
    check = verify_chain(events, key=KEY)
    assert not check.ok and any("unknown hash scheme 'md5-v0'" in p for p in check.problems)


def test_naive_timestamps_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone"):
        new_event(prev=None, group="g", run_id="r", kind="k", stage_from=None, stage_to=None, actor="a",
                  at=datetime(2026, 1, 1), evidence={}, key=KEY)
