"""core.evidence: the canonical hash an approval is bound to."""

from __future__ import annotations

import math


def test_the_evidence_hash_is_canonical_and_changes_with_any_value() -> None:
    from promshift.core.evidence import evidence_sha256

    a = {"gate": {"verdict": "SUCCESSFUL", "reason": "ok"}, "latency": {"windows": [{"p95": math.nan}]}}
    b = {"latency": {"windows": [{"p95": math.nan}]}, "gate": {"reason": "ok", "verdict": "SUCCESSFUL"}}
    assert evidence_sha256(a) == evidence_sha256(b)  # key order is not evidence; NaN hashes (as "NaN")
    assert len(evidence_sha256(a)) == 64
    assert evidence_sha256(a) != evidence_sha256({**a, "gate": {"verdict": "SUCCESSFUL", "reason": "ok!"}})
    assert evidence_sha256(a) != evidence_sha256({**a, "latency": {"windows": [{"p95": math.inf}]}})
