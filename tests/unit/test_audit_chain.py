from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from promshift.core.audit import GENESIS_HASH, AuditEvent, new_event, verify_chain

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def chain(n: int) -> list[AuditEvent]:
    events: list[AuditEvent] = []
    for i in range(n):
        events.append(new_event(prev=events[-1] if events else None, group="gpu-memory", run_id="r1",
                                kind=f"k{i}", stage_from=None, stage_to=None, actor="promshift",
                                at=T0 + timedelta(seconds=i), evidence={"i": i, "nan": None}))
    return events


def test_chain_links_and_verifies() -> None:
    events = chain(5)
    assert events[0].prev_hash == GENESIS_HASH and events[0].seq == 1
    assert all(b.prev_hash == a.hash for a, b in zip(events, events[1:], strict=False))
    check = verify_chain(events)
    assert check.ok and check.events == 5 and not check.problems


def test_edited_evidence_is_detected() -> None:
    events = chain(4)
    events[2] = dataclasses.replace(events[2], evidence='{"i":99}')
    check = verify_chain(events)
    assert not check.ok
    assert any("seq 3" in p and "edited" in p for p in check.problems)


def test_deleted_row_is_detected() -> None:
    events = chain(4)
    del events[1]
    check = verify_chain(events)
    assert not check.ok
    assert any("missing" in p for p in check.problems)


def test_naive_timestamps_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone"):
        new_event(prev=None, group="g", run_id="r", kind="k", stage_from=None, stage_to=None, actor="a",
                  at=datetime(2026, 1, 1), evidence={})
