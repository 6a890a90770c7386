"""Numbers in evidence as JSON can carry them: NaN and ±Inf are evidence too, written as text.

XCom, the audit store (``allow_nan=False``) and ``promshift check --json`` all take the
``to_dict()`` form of the typed results. JSON has no NaN or infinity, so a non-finite number
is written as the strings Prometheus itself uses in its API answers: ``"NaN"``, ``"+Inf"``,
``"-Inf"``. :func:`number_from_json` reads them back.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

NON_FINITE = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf, "Inf": math.inf}


def json_number(value: float) -> float | str:
    """A number for JSON evidence: finite ones as they are, non-finite ones as ``"NaN"``/``"+Inf"``/``"-Inf"``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return value


def number_from_json(value: Any) -> float:
    """The number :func:`json_number` wrote (``"NaN"``, ``"+Inf"``, ``"-Inf"`` or a number)."""
    if isinstance(value, str):
        if value in NON_FINITE:
            return NON_FINITE[value]
        raise ValueError(f"not a number in evidence: {value!r}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"not a number in evidence: {value!r}")
    return float(value)


def optional_number(value: Any) -> float | None:
    """:func:`number_from_json` that keeps None (a number that was not measured)."""
    return None if value is None else number_from_json(value)


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float, at any depth, replaced by its text; tuples become lists."""
    if isinstance(value, float):
        return json_number(value)
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def evidence_sha256(evidence: Mapping[str, Any]) -> str:
    """The sha256 of ``evidence`` as canonical JSON (sorted keys, no spaces, non-finite numbers as text).

    An approval is bound to what the approver was shown: the HITL body prints this hash of the
    gate, parity and latency evidence, the audit records it with the request and the answer, and an
    approval is refused when the evidence hashes differently by the time the answer arrives.
    """
    canonical = json.dumps(json_safe(evidence), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()
