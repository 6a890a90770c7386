"""SigV4 signing for requests (service ``aps``), as AMP's query and remote-write APIs require."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

# Headers the signature covers besides host and x-amz-*: hop-by-hop and client-chosen headers
# (Connection, Accept-Encoding, User-Agent) may be changed on the way, so they stay unsigned.
SIGNED_HEADERS = ("content-type",)


def canonical_url(url: str) -> str:
    """The URL with its query encoded as SigV4 canonicalises it (``%20``, never ``+``; ``~`` kept).

    requests encodes spaces as ``+``, which AWS decodes differently from how it signs; sending
    the canonical form means what is signed and what arrives are the same bytes.
    """
    parts = urlsplit(url)
    if not parts.query:
        return url
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in pairs)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


class AwsSigV4Auth(requests.auth.AuthBase):
    """Signs every request with botocore's ``SigV4Auth``; the credentials are read per request.

    ``credentials`` is a botocore credentials object (from a boto3 session): each request asks
    it for ``get_frozen_credentials()``, so refreshable (assumed-role) credentials are renewed
    before they expire instead of being reused until AWS refuses them. Form bodies are signed
    over the exact bytes that are sent.
    """

    def __init__(self, credentials: Any, region: str, service: str = "aps") -> None:
        if credentials is None:
            raise ValueError("no AWS credentials to sign with")
        self.credentials = credentials
        self.region = region
        self.service = service

    def __repr__(self) -> str:  # never the keys
        return f"AwsSigV4Auth(service={self.service!r}, region={self.region!r})"

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        body = r.body
        if isinstance(body, str):
            body = body.encode("utf-8")
            r.body = body
            r.headers["Content-Length"] = str(len(body))
        if body is not None and not isinstance(body, bytes):
            raise ValueError("SigV4 signing needs the request body as bytes (no streamed bodies)")
        r.url = canonical_url(str(r.url))
        headers = {name: r.headers[name] for name in r.headers if name.lower() in SIGNED_HEADERS}
        aws_request = AWSRequest(method=r.method, url=r.url, data=body or b"", headers=headers)
        SigV4Auth(self.credentials.get_frozen_credentials(), self.service, self.region).add_auth(aws_request)
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token"):
            if name in aws_request.headers:
                r.headers[name] = aws_request.headers[name]
        return r
