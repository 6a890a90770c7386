"""The local stack's SigV4 verifier, without servers: requests signed by botocore, then altered one way each."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest

from promshift.local.stack import sigv4
from promshift.local.stack.sigv4 import AwsCredentials, make_up_credentials, sign_request, verify_request

NOW = datetime(2026, 12, 3, 7, 30, 0, tzinfo=UTC)
PAIR = AwsCredentials("AKIAEXAMPLELOCAL0001", "s3cr3t/EXAMPLE+key0123456789abcdefghijkl")
REGION = "us-east-1"
URL = "http://127.0.0.1:9095/workspaces/ws-123/api/v1/query_range?query=sum%28rate%28x%7Bjob%3D%22a%22%7D%5B5m%5D%29%29&start=1&end=2&step=15"


def check(
    url: str = URL,
    *,
    method: str = "GET",
    body: bytes = b"",
    signer: AwsCredentials = PAIR,
    expected: AwsCredentials = PAIR,
    region: str = REGION,
    service: str = "aps",
    when: datetime = NOW,
    now: datetime = NOW,
    alter: dict[str, str] | None = None,
    sent_body: bytes | None = None,
    sent_url: str | None = None,
    headers: dict[str, str] | None = None,
) -> sigv4.Verdict:
    signed = sign_request(method, url, credentials=signer, region=region, service=service, when=when, body=body,
                          headers=headers)
    signed.setdefault("Host", urlsplit(url).netloc)
    signed.update(alter or {})
    parts = urlsplit(sent_url or url)
    return verify_request(method, parts.path, parts.query, signed, body if sent_body is None else sent_body,
                          expected=expected, region=REGION, now=now)


def test_a_request_signed_with_the_pair_passes() -> None:
    verdict = check()
    assert verdict.ok and verdict.reason is None and verdict.access_key == PAIR.access_key


def test_a_signed_post_body_and_label_path_pass() -> None:
    body = b"query=up%7Bjob%3D%22dcgm%22%7D&time=1700000000"
    assert check("http://127.0.0.1:1/workspaces/ws-1/api/v1/query", method="POST", body=body,
                 headers={"Content-Type": "application/x-www-form-urlencoded"}).ok
    assert check("http://127.0.0.1:1/workspaces/ws-1/api/v1/label/__name__/values").ok


def test_content_sha256_header_is_checked_against_the_body() -> None:
    body = b"\x00snappy-ish\xff"
    good = sigv4.hashlib.sha256(body).hexdigest()
    assert check(method="POST", body=body, headers={"X-Amz-Content-SHA256": good}).ok
    verdict = check(method="POST", body=body, headers={"X-Amz-Content-SHA256": good}, sent_body=body + b"x")
    assert verdict.reason == sigv4.BODY_HASH_MISMATCH


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"alter": {"Authorization": ""}}, sigv4.MISSING_AUTHORIZATION),
        ({"alter": {"Authorization": "Bearer abc"}}, sigv4.MALFORMED_AUTHORIZATION),
        ({"signer": AwsCredentials(PAIR.access_key, "wrong-secret")}, sigv4.SIGNATURE_MISMATCH),
        ({"signer": AwsCredentials("AKIAUNKNOWNKEY000000", PAIR.secret_key)}, sigv4.UNKNOWN_ACCESS_KEY),
        ({"when": NOW - timedelta(minutes=5, seconds=1)}, sigv4.EXPIRED),
        ({"when": NOW + timedelta(minutes=5, seconds=1)}, sigv4.NOT_YET_VALID),
        ({"region": "eu-west-1"}, sigv4.WRONG_REGION),
        ({"service": "execute-api"}, sigv4.WRONG_SERVICE),
        ({"method": "POST", "body": b"a=1", "sent_body": b"a=2"}, sigv4.SIGNATURE_MISMATCH),
        ({"sent_url": URL.replace("step=15", "step=60")}, sigv4.SIGNATURE_MISMATCH),
        ({"sent_url": URL.replace("ws-123", "ws-124")}, sigv4.SIGNATURE_MISMATCH),
        ({"alter": {"X-Amz-Date": "20261203T072959Z"}}, sigv4.SIGNATURE_MISMATCH),
        ({"alter": {"X-Amz-Security-Token": "tok"}}, sigv4.WRONG_SESSION_TOKEN),
    ],
    ids=["missing", "not-sigv4", "wrong-secret", "unknown-key", "expired", "future", "wrong-region",
         "wrong-service", "tampered-body", "tampered-query", "tampered-path", "tampered-date", "unexpected-token"],
)
def test_each_bad_signature_is_refused_with_its_reason(kwargs: dict[str, object], reason: str) -> None:
    if kwargs.get("alter") == {"Authorization": ""}:
        kwargs = {"alter": {}}
        signed = sign_request("GET", URL, credentials=PAIR, region=REGION, when=NOW)
        del signed["Authorization"]
        parts = urlsplit(URL)
        verdict = verify_request("GET", parts.path, parts.query, signed, b"", expected=PAIR, region=REGION, now=NOW)
    else:
        verdict = check(**kwargs)  # type: ignore[arg-type]
    assert not verdict.ok
    assert verdict.reason == reason, verdict.message
    assert verdict.reason in sigv4.REASONS
    assert PAIR.secret_key not in verdict.message


def test_skew_inside_five_minutes_passes() -> None:
    assert check(when=NOW - timedelta(minutes=4, seconds=59)).ok
    assert check(when=NOW + timedelta(minutes=4, seconds=59)).ok


def test_session_tokens_are_required_and_compared_when_the_pair_has_one() -> None:
    temporary = AwsCredentials(PAIR.access_key, PAIR.secret_key, "session-token-value")
    assert check(signer=temporary, expected=temporary).ok
    assert check(signer=PAIR, expected=temporary).reason == sigv4.MISSING_SESSION_TOKEN
    other = AwsCredentials(PAIR.access_key, PAIR.secret_key, "another-token")
    assert check(signer=other, expected=temporary).reason == sigv4.WRONG_SESSION_TOKEN


def test_a_header_left_out_of_signed_headers_may_change_but_a_signed_one_may_not() -> None:
    assert check(headers={"X-Extra": "a"}, alter={"User-Agent": "changed"}).ok
    assert check(headers={"X-Extra": "a"}, alter={"X-Extra": "b"}).reason == sigv4.SIGNATURE_MISMATCH


def test_error_types_and_credential_reprs_keep_secrets_out() -> None:
    assert check(signer=AwsCredentials("AKIAOTHER", "x")).error_type == "UnrecognizedClientException"
    assert check(region="eu-west-1").error_type == "InvalidSignatureException"
    made = make_up_credentials()
    assert made.access_key.startswith("AKIA") and len(made.access_key) == 20 and len(made.secret_key) == 40
    assert made.secret_key not in repr(made) and made.secret_key not in made.fingerprint()
    assert made.fingerprint() != make_up_credentials().fingerprint()
    with pytest.raises(ValueError, match="secret access key"):
        AwsCredentials("AKIA", "")
