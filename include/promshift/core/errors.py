"""How a query failed, as a kind the checks can branch on (not a prefix of a message)."""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    """Why a backend gave no usable answer.

    The client raises the first five; the latency probe refines HTTP errors by status
    (``QUERY_TOO_EXPENSIVE`` for AMP's 422, ``THROTTLED`` for 429/503 after retries) and
    adds ``PARTIAL`` for an answer that carries warnings.
    """

    TIMEOUT = "timeout"  # no complete answer within the client's timeout (headers and body)
    UNREACHABLE = "unreachable"  # no connection
    MALFORMED = "malformed"  # HTTP 200 whose body is not a Prometheus API answer
    TOO_LARGE = "too large"  # the answer is bigger than the client accepts
    HTTP = "error"  # the server answered with an error (status or API error body)
    QUERY_TOO_EXPENSIVE = "HTTP 422"
    THROTTLED = "throttled"
    PARTIAL = "partial data"
