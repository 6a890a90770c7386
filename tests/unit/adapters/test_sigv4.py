"""AwsSigV4Auth on prepared requests: what is signed, what is sent, and fresh credentials per request.

Each signature is recomputed by the test verifier (botocore, from the known secret) over the
request exactly as it would go on the wire.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import requests
from botocore.credentials import ReadOnlyCredentials

from promshift.adapters.sigv4 import AwsSigV4Auth, canonical_url
from promshift.local.stack.sigv4 import SIGNATURE_MISMATCH
from tests.integration.sigv4_verifier import SigV4Verifier

URL = "http://127.0.0.1:9/workspaces/ws-1/api/v1"


class ChangingCredentials:
    """Hands out the next pair on every ``get_frozen_credentials()``, as a refresh would."""

    def __init__(self, pairs: list[tuple[str, str, str | None]]) -> None:
        self.pairs = list(pairs)
        self.calls = 0

    def get_frozen_credentials(self) -> ReadOnlyCredentials:
        pair = self.pairs[min(self.calls, len(self.pairs) - 1)]
        self.calls += 1
        return ReadOnlyCredentials(*pair)


def prepare(auth: AwsSigV4Auth, method: str, path: str, **kwargs: object) -> requests.PreparedRequest:
    return requests.Request(method, URL + path, auth=auth, **kwargs).prepare()  # type: ignore[arg-type]


def verify(verifier: SigV4Verifier, req: requests.PreparedRequest) -> str | None:
    parts = urlsplit(str(req.url))
    headers = requests.structures.CaseInsensitiveDict({**req.headers, "Host": parts.netloc})
    body = req.body if isinstance(req.body, bytes) else (req.body or "").encode()
    return verifier.check(str(req.method), parts.path + (f"?{parts.query}" if parts.query else ""), headers, body)


def test_canonical_url_encodes_the_query_as_sigv4_does() -> None:
    assert canonical_url("http://h/p?match%5B%5D=up+%7Bjob%3D%22a%22%7D&start=1.5&x=&t=~") == (
        "http://h/p?match%5B%5D=up%20%7Bjob%3D%22a%22%7D&start=1.5&x=&t=~")
    assert canonical_url("http://h/p") == "http://h/p"


def test_post_form_and_get_query_are_signed_over_what_is_sent() -> None:
    creds = ChangingCredentials([("AKID1", "secret-1", None)])
    verifier = SigV4Verifier(upstream="", keys={"AKID1": ("secret-1", None)})
    auth = AwsSigV4Auth(creds, "us-east-1")
    post = prepare(auth, "POST", "/query", data={"query": 'sum by (Hostname) (up{job="x y"})', "time": "1.5"})
    assert isinstance(post.body, bytes) and post.headers["Content-Length"] == str(len(post.body))
    assert "SignedHeaders=content-type;host;x-amz-date," in post.headers["Authorization"]
    assert verify(verifier, post) is None
    get = prepare(auth, "GET", "/label/Hostname/values", params={"match[]": '{__name__=~"DCGM_.*", a!=""}'})
    assert "+" not in str(get.url) and "%20" in str(get.url)
    assert verify(verifier, get) is None
    # Tampering with the body after signing is caught: the signature covers the exact bytes.
    post.body = post.body.replace(b"x+y", b"x+z")
    assert verify(verifier, post) == SIGNATURE_MISMATCH


def test_credentials_are_read_for_every_request_and_tokens_are_signed() -> None:
    creds = ChangingCredentials([("ASIA1", "secret-1", "token-1"), ("ASIA2", "secret-2", "token-2")])
    verifier = SigV4Verifier(upstream="", keys={"ASIA1": ("secret-1", "token-1"), "ASIA2": ("secret-2", "token-2")})
    auth = AwsSigV4Auth(creds, "us-east-1")
    first, second = (prepare(auth, "POST", "/query", data={"query": "vector(1)"}) for _ in range(2))
    assert creds.calls == 2
    assert "Credential=ASIA1/" in first.headers["Authorization"] and first.headers["X-Amz-Security-Token"] == "token-1"
    assert "Credential=ASIA2/" in second.headers["Authorization"]
    assert "x-amz-security-token" in second.headers["Authorization"]
    assert verify(verifier, first) is None and verify(verifier, second) is None
    verifier.keys["ASIA2"] = ("rotated-away", "token-2")
    assert verify(verifier, second) == SIGNATURE_MISMATCH


def test_the_auth_never_shows_its_keys() -> None:
    auth = AwsSigV4Auth(ChangingCredentials([("AKID1", "secret-1", None)]), "eu-west-1")
    assert repr(auth) == "AwsSigV4Auth(service='aps', region='eu-west-1')"
    with pytest.raises(ValueError, match="no AWS credentials"):
        AwsSigV4Auth(None, "eu-west-1")
