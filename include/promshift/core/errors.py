"""How a query failed, as a kind the checks can branch on (not a prefix of a message)."""

from __future__ import annotations

from enum import StrEnum

from promshift.core.redact import redact_text


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


class PrometheusError(RuntimeError):
    """A query or admin call failed: unreachable, timed out, HTTP error, API error body, or an
    answer that is malformed or too large. ``kind`` says which; ``error_type`` is the server's
    ``errorType`` when it sent one, else the kind's value. Its text and ``base_url`` have URL
    credentials redacted: errors end up in logs and records. (Raised by ``adapters.prometheus``; here so the
    steps, which see the client only as ``core.ports.PrometheusProbe``, can catch it.)"""

    def __init__(self, base_url: str, message: str, *, http_status: int | None = None,
                 error_type: str | None = None, kind: ErrorKind = ErrorKind.HTTP) -> None:
        super().__init__(redact_text(f"{base_url}: {message}"))
        self.base_url = redact_text(base_url)
        self.http_status = http_status
        self.kind = kind
        self.error_type = error_type or (kind.value if kind != ErrorKind.HTTP else None)


class RoutingError(RuntimeError):
    """The routing state cannot be read or written (database unreachable, table missing, corrupt file)."""


class AlertmanagerError(RuntimeError):
    """The Alertmanager could not be read; one line. (Raised by ``adapters.alertmanager``.)"""
