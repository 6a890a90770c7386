"""URL credentials are redacted everywhere a record is made; nothing else in the text changes."""

from __future__ import annotations

import pytest

from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.redact import REDACTED, is_secret_param, redact, redact_text
from promshift.local.stack.local import find_free_ports

SECRET = "s3cr3t-T0KEN"


@pytest.mark.parametrize(("text", "expected"), [
    (f"https://user:{SECRET}@aps.example/ws", f"https://{REDACTED}@aps.example/ws"),
    (f"http://{SECRET}@127.0.0.1:9090/api", f"http://{REDACTED}@127.0.0.1:9090/api"),
    (f"http://u:p@{SECRET}@host/", f"http://{REDACTED}@host/"),  # '@' inside the password
    (f"https://s3.example/b/o?X-Amz-Algorithm=AWS4&X-Amz-Signature={SECRET}&X-Amz-Security-Token={SECRET}#x",
     f"https://s3.example/b/o?X-Amz-Algorithm={REDACTED}&X-Amz-Signature={REDACTED}"
     f"&X-Amz-Security-Token={REDACTED}#x"),
    (f"http://h/w?TOKEN={SECRET}&step=15&Key={SECRET};api_key={SECRET}",
     f"http://h/w?TOKEN={REDACTED}&step=15&Key={REDACTED};api_key={REDACTED}"),
    (f"/api/v1/query?query=up&password={SECRET}", f"/api/v1/query?query=up&password={REDACTED}"),
    (f"see http://a:{SECRET}@h1/x and https://h2/y?secret={SECRET} end",
     f"see http://{REDACTED}@h1/x and https://h2/y?secret={REDACTED} end"),
    (f"'http://h/?signature={SECRET}'", f"'http://h/?signature={REDACTED}'"),
])
def test_credentials_in_urls_are_redacted(text: str, expected: str) -> None:
    assert redact_text(text) == expected
    assert SECRET not in redact_text(text)


@pytest.mark.parametrize("text", [
    "http://127.0.0.1:9090/api/v1/query?query=up&step=15s",
    "ops@example.com approved; see https://wiki.example/page?id=7",
    "match[]={__name__=~\"DCGM_.*\"}&start=1&end=2",
    "token=abc outside a URL query is not a URL credential",
    "",
])
def test_text_without_url_credentials_is_unchanged(text: str) -> None:
    assert redact_text(text) == text


def test_which_parameters_are_secret() -> None:
    secret = ["X-Amz-Credential", "x-amz-date", "token", "access_token", "Key", "apikey", "password", "passwd",
              "pwd", "client_secret", "Signature", "sig", "auth", "credential"]
    plain = ["query", "match[]", "start", "step", "region", "name", "time", "id"]
    assert all(is_secret_param(p) for p in secret)
    assert not any(is_secret_param(p) for p in plain)


def test_redact_walks_json_like_values_and_copies() -> None:
    evidence = {"url": f"https://u:{SECRET}@h/w", "nested": [{"target": f"http://h/?token={SECRET}"}, 3, None],
                "pair": ("x", f"http://{SECRET}@h"), f"http://{SECRET}@key": True, "n": 1.5}
    out = redact(evidence)
    assert SECRET not in repr(out)
    assert out["n"] == 1.5 and out["nested"][1:] == [3, None] and out[f"http://{REDACTED}@key"] is True
    assert evidence["url"] == f"https://u:{SECRET}@h/w"  # the input is not touched


def test_prometheus_errors_never_carry_url_credentials() -> None:
    """A real request to a closed port: the error text and its base_url are redacted."""
    port = find_free_ports(1)[0]
    client = PrometheusClient(f"http://promshift:{SECRET}@127.0.0.1:{port}/prefix?token={SECRET}", timeout_s=2)
    with pytest.raises(PrometheusError) as excinfo:
        client.query("up")
    assert "unreachable" in str(excinfo.value)
    assert SECRET not in str(excinfo.value) and SECRET not in excinfo.value.base_url
    assert f"http://{REDACTED}@127.0.0.1:{port}" in str(excinfo.value)
    direct = PrometheusError(f"https://u:{SECRET}@aps/ws", f"HTTP 403 for /api/v1/query?X-Amz-Signature={SECRET}")
    assert SECRET not in str(direct)


@pytest.mark.parametrize(("text", "kept"), [
    (f"404 no_service (POST /services/T0ABC/B0DEF/{SECRET})", "404 no_service (POST /services/REDACTED)"),
    (f"https://hooks.slack.com/services/T0ABC/B0DEF/{SECRET}", "https://hooks.slack.com/services/REDACTED"),
    (f"https://hooks.slack.com/workflows/T0ABC/{SECRET}", "https://hooks.slack.com/workflows/REDACTED"),
    (f"https://discord.example/api/webhooks/123/{SECRET}", "https://discord.example/api/webhooks/REDACTED"),
    ("token ghp_A1b2C3d4E5f6G7h8I9j0", "token REDACTED"),
    (f"Authorization: Bearer {SECRET}", "Authorization: Bearer REDACTED"),
    (f"Authorization: token {SECRET}", "Authorization: token REDACTED"),
    (f"xoxb-{SECRET}", "REDACTED"),
])
def test_webhook_paths_and_tokens_are_redacted(text: str, kept: str) -> None:
    assert redact_text(text) == kept


@pytest.mark.parametrize("text", ["the token rotation is fine", "GET /api/v1/status/config", "service T0 is up",
                                  "Bearer of bad news"])
def test_prose_that_looks_near_a_secret_stays(text: str) -> None:
    assert redact_text(text) == text
