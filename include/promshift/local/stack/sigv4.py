"""Check a received request's AWS SigV4 signature the way AMP does, by recomputing it with botocore.

Local stack only: the front door and the local control plane call :func:`verify_request` on
every request they receive. It is a pure function (``now`` is an argument; no network, no
clock, no environment), so each refusal reason is unit-tested without servers.

The signature is recomputed with botocore's own ``SigV4Auth`` over an ``AWSRequest`` rebuilt
from what was received: the raw path and raw query string exactly as sent (botocore quotes the
path once more and sorts the raw query pieces without re-encoding them, which is what a client
that signs the URL it sends computes), the headers named in the request's ``SignedHeaders``
(not botocore's own choice of headers) and the received ``X-Amz-Date`` as the signing time.
Where this differs from AWS: AWS decodes and re-encodes the query before sorting it, so a
client that signs a differently-encoded query than it sends may pass AWS and fail here.

Nothing here puts a secret or a signature into a message: refusal messages name the access
key id (not a secret; AWS puts it in its own error messages) and the scope, never the rest.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from botocore.auth import EMPTY_SHA256_HASH, UNSIGNED_PAYLOAD, SigV4Auth
from botocore.awsrequest import AWSRequest, HTTPHeaders
from botocore.credentials import Credentials as BotocoreCredentials

SERVICE = "aps"
MAX_SKEW = timedelta(minutes=5)
AMZ_DATE_FORMAT = "%Y%m%dT%H%M%SZ"
ALGORITHM = "AWS4-HMAC-SHA256"

# Refusal reasons, used as counter keys by the servers (`/-/sigv4-stats`).
MISSING_AUTHORIZATION = "missing_authorization"
MALFORMED_AUTHORIZATION = "malformed_authorization"
UNKNOWN_ACCESS_KEY = "unknown_access_key"
WRONG_SERVICE = "wrong_service"
WRONG_REGION = "wrong_region"
EXPIRED = "expired"
NOT_YET_VALID = "not_yet_valid"
MISSING_SESSION_TOKEN = "missing_session_token"
WRONG_SESSION_TOKEN = "wrong_session_token"
BODY_HASH_MISMATCH = "body_hash_mismatch"
SIGNATURE_MISMATCH = "signature_mismatch"
REASONS = (
    MISSING_AUTHORIZATION,
    MALFORMED_AUTHORIZATION,
    UNKNOWN_ACCESS_KEY,
    WRONG_SERVICE,
    WRONG_REGION,
    EXPIRED,
    NOT_YET_VALID,
    MISSING_SESSION_TOKEN,
    WRONG_SESSION_TOKEN,
    BODY_HASH_MISMATCH,
    SIGNATURE_MISMATCH,
)

# The x-amzn-ErrorType AWS answers with for each reason.
ERROR_TYPES = {
    MISSING_AUTHORIZATION: "MissingAuthenticationTokenException",
    MALFORMED_AUTHORIZATION: "IncompleteSignatureException",
    UNKNOWN_ACCESS_KEY: "UnrecognizedClientException",
    MISSING_SESSION_TOKEN: "UnrecognizedClientException",
    WRONG_SESSION_TOKEN: "UnrecognizedClientException",
}
DEFAULT_ERROR_TYPE = "InvalidSignatureException"

_AUTH_RE = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=(?P<credential>[^,\s]+)\s*,\s*"
    r"SignedHeaders=(?P<signed>[^,\s]+)\s*,\s*Signature=(?P<signature>[0-9a-fA-F]+)\s*$"
)


@dataclass(frozen=True, repr=False)
class AwsCredentials:
    """The one credential pair a local endpoint accepts (``session_token`` when temporary)."""

    access_key: str
    secret_key: str
    session_token: str | None = None

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ValueError("AWS credentials need both an access key id and a secret access key")

    def __repr__(self) -> str:  # never the secret or the token
        token = "***" if self.session_token else None
        return f"AwsCredentials(access_key={self.access_key!r}, secret_key=***, session_token={token})"

    __str__ = __repr__

    def fingerprint(self) -> str:
        """A short digest that changes when any part of the pair changes (safe to show; not reversible)."""
        material = "\0".join((self.access_key, self.secret_key, self.session_token or ""))
        return hashlib.sha256(material.encode()).hexdigest()[:16]

    def to_botocore(self) -> BotocoreCredentials:
        """The same pair as botocore credentials, for signing."""
        return BotocoreCredentials(self.access_key, self.secret_key, self.session_token)


def make_up_credentials() -> AwsCredentials:
    """A random pair shaped like AWS's (20-char ``AKIA...`` id, 40-char secret), for a local stack."""
    upper = string.ascii_uppercase + string.digits
    access_key = "AKIA" + "".join(secrets.choice(upper) for _ in range(16))
    alphabet = string.ascii_letters + string.digits + "+/"
    secret_key = "".join(secrets.choice(alphabet) for _ in range(40))
    return AwsCredentials(access_key, secret_key)


@dataclass(frozen=True)
class Verdict:
    """Outcome of checking one request: ``ok``, or the ``reason`` (a counter key) and an AWS-style message."""

    ok: bool
    reason: str | None = None
    message: str = ""
    access_key: str | None = None

    @property
    def error_type(self) -> str:
        """The ``x-amzn-ErrorType`` AWS answers a refusal with."""
        return ERROR_TYPES.get(self.reason or "", DEFAULT_ERROR_TYPE)


def _refuse(reason: str, message: str, access_key: str | None = None) -> Verdict:
    return Verdict(False, reason, message, access_key)


@dataclass(frozen=True)
class _Authorization:
    access_key: str
    date: str
    region: str
    service: str
    terminator: str
    signed_headers: tuple[str, ...]
    signature: str


def parse_authorization(value: str) -> _Authorization | None:
    """Split an ``AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...`` header; None if malformed."""
    match = _AUTH_RE.match(value.strip())
    if match is None:
        return None
    parts = match["credential"].split("/")
    if len(parts) != 5:
        return None
    signed = tuple(match["signed"].split(";"))
    return _Authorization(*parts, signed_headers=signed, signature=match["signature"].lower())


class _ReceivedSigV4(SigV4Auth):
    """botocore's SigV4 signer, told which headers the client signed instead of choosing them itself."""

    def __init__(self, credentials: AwsCredentials, service: str, region: str, signed: tuple[str, ...]) -> None:
        super().__init__(credentials.to_botocore(), service, region)
        self._signed = signed

    def headers_to_sign(self, request: AWSRequest) -> HTTPHeaders:
        header_map = HTTPHeaders()
        for name, value in request.headers.items():
            if name.lower() in self._signed:
                header_map[name.lower()] = value
        return header_map


def _header(headers: Mapping[str, str], name: str) -> str | None:
    wanted = name.lower()
    for key, value in headers.items():
        if key.lower() == wanted:
            return value
    return None


def verify_request(
    method: str,
    path: str,
    query: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    expected: AwsCredentials,
    region: str,
    now: datetime,
    service: str = SERVICE,
    max_skew: timedelta = MAX_SKEW,
) -> Verdict:
    """Check one received request's SigV4 signature against the one pair this endpoint accepts.

    ``path`` and ``query`` are raw (as on the request line, still percent-encoded), ``headers``
    as received (``Host`` included), ``now`` timezone-aware. The checks run in the order AWS
    reports them: the Authorization header, the access key, the scope's service and region,
    the date (more than ``max_skew`` away from ``now`` is refused), the session token, the
    body hash, then the signature itself.
    """
    authorization = _header(headers, "Authorization")
    if not authorization:
        return _refuse(MISSING_AUTHORIZATION, "Missing Authentication Token")
    auth = parse_authorization(authorization)
    if auth is None or auth.terminator != "aws4_request":
        return _refuse(
            MALFORMED_AUTHORIZATION,
            f"Authorization header requires '{ALGORITHM} Credential=<key>/<date>/<region>/<service>/aws4_request, "
            "SignedHeaders=..., Signature=...'.",
        )
    if auth.access_key != expected.access_key:
        return _refuse(UNKNOWN_ACCESS_KEY, "The security token included in the request is invalid.", auth.access_key)
    if auth.service != service:
        return _refuse(
            WRONG_SERVICE, f"Credential should be scoped to correct service: '{service}'.", auth.access_key
        )
    if auth.region != region:
        return _refuse(
            WRONG_REGION, f"Credential should be scoped to a valid region, not '{auth.region}'.", auth.access_key
        )
    signed = tuple(name.lower() for name in auth.signed_headers)
    amz_date = _header(headers, "X-Amz-Date")
    if "host" not in signed or amz_date is None or "x-amz-date" not in signed:
        return _refuse(
            MALFORMED_AUTHORIZATION,
            "The request must carry X-Amz-Date and sign it together with Host.",
            auth.access_key,
        )
    missing = [name for name in signed if _header(headers, name) is None]
    if missing:
        return _refuse(
            MALFORMED_AUTHORIZATION, f"Signed headers are missing from the request: {', '.join(missing)}.",
            auth.access_key,
        )
    try:
        signed_at = datetime.strptime(amz_date, AMZ_DATE_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return _refuse(MALFORMED_AUTHORIZATION, f"X-Amz-Date {amz_date!r} is not in the form YYYYMMDDTHHMMSSZ.",
                       auth.access_key)
    if auth.date != amz_date[:8]:
        return _refuse(
            SIGNATURE_MISMATCH, f"Date in Credential scope does not match YYYYMMDD from X-Amz-Date: {auth.date}.",
            auth.access_key,
        )
    stamp = now.astimezone(UTC).strftime(AMZ_DATE_FORMAT)
    if signed_at < now - max_skew:
        limit = (now - max_skew).astimezone(UTC).strftime(AMZ_DATE_FORMAT)
        return _refuse(
            EXPIRED, f"Signature expired: {amz_date} is now earlier than {limit} ({stamp} - 5 min.)", auth.access_key
        )
    if signed_at > now + max_skew:
        limit = (now + max_skew).astimezone(UTC).strftime(AMZ_DATE_FORMAT)
        return _refuse(
            NOT_YET_VALID,
            f"Signature not yet current: {amz_date} is still later than {limit} ({stamp} + 5 min.)",
            auth.access_key,
        )
    token = _header(headers, "X-Amz-Security-Token")
    if expected.session_token:
        if token is None:
            return _refuse(MISSING_SESSION_TOKEN, "The security token included in the request is invalid.",
                           auth.access_key)
        if not hmac.compare_digest(token, expected.session_token):
            return _refuse(WRONG_SESSION_TOKEN, "The security token included in the request is invalid.",
                           auth.access_key)
    elif token is not None:
        return _refuse(WRONG_SESSION_TOKEN, "The security token included in the request is invalid.", auth.access_key)
    content_hash = _header(headers, "X-Amz-Content-SHA256")
    body_hash = hashlib.sha256(body).hexdigest() if body else EMPTY_SHA256_HASH
    if content_hash is not None and content_hash.lower() != body_hash:
        why = "is not signed" if content_hash == UNSIGNED_PAYLOAD else "does not match the body received"
        return _refuse(BODY_HASH_MISMATCH, f"The payload hash in X-Amz-Content-SHA256 {why}.", auth.access_key)

    host = _header(headers, "Host") or "localhost"
    url = f"http://{host}{path}" + (f"?{query}" if query else "")
    request = AWSRequest(method=method.upper(), url=url, data=body, headers=dict(headers.items()))
    request.context["timestamp"] = amz_date
    signer = _ReceivedSigV4(expected, service, region, signed)
    canonical = signer.canonical_request(request)
    computed = signer.signature(signer.string_to_sign(request, canonical), request)
    if not hmac.compare_digest(computed, auth.signature):
        return _refuse(
            SIGNATURE_MISMATCH,
            "The request signature we calculated does not match the signature you provided. Check your AWS "
            "Secret Access Key and signing method. Consult the service documentation for details.",
            auth.access_key,
        )
    return Verdict(True, access_key=auth.access_key)


def sign_request(
    method: str,
    url: str,
    *,
    credentials: AwsCredentials,
    region: str,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    service: str = SERVICE,
    when: datetime | None = None,
) -> dict[str, str]:
    """Headers that SigV4-sign ``method url`` (botocore's signer, at ``when`` or now); the stack's own client.

    ``url`` must be the exact URL sent (query already encoded). Used by the local stack's tests
    and health checks; production code signs with its own hook.
    """
    request = AWSRequest(method=method.upper(), url=url, data=body, headers=dict(headers or {}))
    signer = SigV4Auth(credentials.to_botocore(), service, region)
    if when is None:
        signer.add_auth(request)
    else:
        # add_auth reads the clock; the same steps with a given time (tests of expired/future dates).
        request.context["timestamp"] = when.astimezone(UTC).strftime(AMZ_DATE_FORMAT)
        signer._modify_request_before_signing(request)
        canonical = signer.canonical_request(request)
        signature = signer.signature(signer.string_to_sign(request, canonical), request)
        signer._inject_signature_to_request(request, signature)
    return dict(request.headers.items())
