"""The Slack and SES channels of ``orchestration.notify``, through the providers' own notifiers.

Slack: the Slack provider's ``SlackWebhookNotifier`` posts to a contract server on 127.0.0.1
(``tests/slack_webhook.py``) that refuses what Slack refuses and answers as Slack does (``ok``, ``404
no_service``, ``429`` with Retry-After). SES: the amazon provider's ``SesNotifier`` sends through moto (in
process) from a verified identity, and the message is read back from moto's SES backend.
"""

from __future__ import annotations

import email
import json
import time
import urllib.request
from collections.abc import Iterator
from email.header import decode_header, make_header
from typing import Any

import boto3
import pytest
from airflow.providers.amazon.aws.notifications.ses import SesNotifier
from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ses import ses_backends

from promshift.core import notify as notices
from promshift.core.catalog import NotifyPolicy
from promshift.orchestration.notify import NotifySettings, channel_notifier, send
from tests.slack_webhook import SlackWebhook, blocks_problem, slack_conn, slack_webhook

NOTICE = notices.rolled_back(group="gpu-memory", run_id="r1", reason="parity FAILED <!channel> & <https://x|click>",
                             performed=True, restored_identical=True,
                             log_url="http://airflow.test/dags/promshift__migrate__promshift_target/runs/r1/tasks/rollback?a=1&b=2")
SETTINGS = NotifySettings(timeout_s=20, from_email="promshift@example.com")


@pytest.fixture
def slack(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlackWebhook]:
    with slack_webhook() as hook:
        monkeypatch.setenv("AIRFLOW_CONN_SLACK_DEFAULT", slack_conn(hook))
        yield hook


def post(hook: SlackWebhook, path: str, body: bytes, content_type: str = "application/json") -> tuple[int, str]:
    request = urllib.request.Request(hook.url + path, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310 - 127.0.0.1
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# -- the contract server refuses what Slack refuses -----------------------------------------------------------


def test_the_contract_server_is_not_a_server_that_accepts_anything(slack: SlackWebhook) -> None:
    good = json.dumps({"text": "hi"}).encode()
    assert post(slack, slack.path, good) == (200, "ok")
    assert post(slack, "/services/T0PROMSHIFT/B0NOTIFY/wrong", good) == (403, "invalid_token")
    assert post(slack, "/services/T1/B1/x", good) == (404, "no_service")
    assert post(slack, slack.path, b"text=hi", "application/x-www-form-urlencoded") == (400, "invalid_payload")
    assert post(slack, slack.path, b"{not json") == (400, "invalid_payload")
    assert post(slack, slack.path, b"{}") == (400, "no_text")
    long_header = {"blocks": [{"type": "header", "text": {"type": "plain_text", "text": "x" * 151}}]}
    assert post(slack, slack.path, json.dumps(long_header).encode()) == (400, "invalid_blocks")
    assert blocks_problem([{"type": "section", "text": {"type": "mrkdwn", "text": "y" * 3001}}])
    assert blocks_problem([{"type": "section"}] * 51)
    assert len(slack.accepted) == 1 and len(slack.received) == 7


# -- Slack ------------------------------------------------------------------------------------------------------


def test_slack_posts_text_and_blocks_to_the_webhook_and_escapes_what_slack_would_act_on(slack: SlackWebhook) -> None:
    evidence = send(NotifyPolicy(channel="slack"), NOTICE, {}, settings=SETTINGS)
    assert evidence == {"notice": "rolled_back", "channel": "slack", "recipients": 1, "subject": NOTICE.subject,
                        "link": NOTICE.link, "sent": True}
    [got] = slack.received
    assert (got.path, got.status) == (slack.path, 200)
    assert got.headers["content-type"].startswith("application/json")
    body = got.body
    assert set(body) <= {"text", "blocks", "unfurl_links", "unfurl_media"}
    assert body["unfurl_links"] is False and body["unfurl_media"] is False
    header, headline, *rest = body["blocks"]
    assert header == {"type": "header", "text": {"type": "plain_text", "text": NOTICE.subject}}
    assert headline["text"]["text"].startswith("rolled back: parity FAILED &lt;!channel&gt; &amp; &lt;https://x|")
    # Slack acts on <!channel> and <url|label> in mrkdwn and in the fallback text; a header's plain_text is literal.
    parsed = json.dumps([body["text"], headline, *rest])
    assert "<!channel>" not in parsed and "<https://x|click>" not in parsed
    facts = rest[0]["text"]["text"]
    assert "*Outcome:* the source config was restored identically" in facts
    # The link is a Slack link to the task log, its '&' escaped as Slack's mrkdwn wants it.
    assert f"<{NOTICE.link.replace('&', '&amp;')}|The rollback task's log>" in rest[1]["text"]["text"]
    assert body["text"].startswith(notices.slack_escape(NOTICE.subject))
    assert "s3cr3tW3bh00kT0k3n" not in json.dumps(evidence)


def test_a_groups_own_slack_connection_is_used(slack: SlackWebhook, monkeypatch: pytest.MonkeyPatch) -> None:
    with slack_webhook("/services/T0GPU/B0ONCALL/0nc4llT0k3n") as oncall:
        monkeypatch.setenv("AIRFLOW_CONN_GPU_ONCALL_SLACK", slack_conn(oncall))
        evidence = send(NotifyPolicy(channel="slack", slack_conn="gpu_oncall_slack"), NOTICE, {}, settings=SETTINGS)
        assert evidence["sent"] is True
        assert len(oncall.accepted) == 1
    assert slack.received == []


def test_a_removed_webhook_is_recorded_as_not_sent_without_its_token(slack: SlackWebhook,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    gone = json.loads(slack_conn(slack))
    gone["password"] = "T9REMOVED/B9REMOVED/0ld0ld0ld"
    monkeypatch.setenv("AIRFLOW_CONN_SLACK_DEFAULT", json.dumps(gone))
    evidence = send(NotifyPolicy(channel="slack"), NOTICE, {}, settings=SETTINGS)
    assert evidence["sent"] is False
    assert "no_service" in evidence["error"] and "404" in evidence["error"], evidence
    assert "0ld0ld0ld" not in json.dumps(evidence)
    assert [r.status for r in slack.received] == [404]


def test_a_short_rate_limit_is_waited_once(slack: SlackWebhook) -> None:
    slack.script.append((429, "rate_limited", {"Retry-After": "1"}))
    started = time.monotonic()
    evidence = send(NotifyPolicy(channel="slack"), NOTICE, {}, settings=SETTINGS)
    assert evidence["sent"] is True, evidence
    assert time.monotonic() - started >= 1.0
    assert [r.status for r in slack.received] == [429, 200]
    assert slack.received[0].body == slack.received[1].body


def test_a_long_rate_limit_fails_the_send_at_once(slack: SlackWebhook) -> None:
    slack.script.append((429, "rate_limited", {"Retry-After": "60"}))
    started = time.monotonic()
    evidence = send(NotifyPolicy(channel="slack"), NOTICE, {}, settings=SETTINGS)
    assert time.monotonic() - started < 5
    assert evidence["sent"] is False and "429" in evidence["error"], evidence
    assert [r.status for r in slack.received] == [429]


def test_a_long_reason_still_fits_slacks_limits(slack: SlackWebhook) -> None:
    notice = notices.rollback_failed(group="gpu-memory", run_id="r1", reason="x" * 5000, error="boom " * 2000)
    assert send(NotifyPolicy(channel="slack"), notice, {}, settings=SETTINGS)["sent"] is True
    assert len(slack.accepted) == 1


# -- SES ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws"}))
    with mock_aws():
        yield


def sent_by_ses(region: str) -> list[Any]:
    return list(ses_backends[DEFAULT_ACCOUNT_ID][region].sent_messages)


def test_ses_sends_the_html_notice_from_the_verified_sender(aws: None) -> None:
    boto3.client("ses", region_name="eu-west-1").verify_email_identity(EmailAddress="promshift@example.com")
    settings = NotifySettings(timeout_s=20, from_email="promshift@example.com", ses_region="eu-west-1")
    policy = NotifyPolicy(channel="ses", to=("gpu-platform@example.com", "oncall@example.com"))
    evidence = send(policy, NOTICE, {}, settings=settings)
    assert evidence == {"notice": "rolled_back", "channel": "ses", "recipients": 2, "subject": NOTICE.subject,
                        "link": NOTICE.link, "sent": True}
    [message] = sent_by_ses("eu-west-1")
    assert sent_by_ses("us-east-1") == []
    assert message.source == "promshift@example.com"
    # moto appends the To header's addresses to the Destinations it was given (SES sends to Destinations).
    assert set(message.destinations) == {"gpu-platform@example.com", "oncall@example.com"}
    mime = email.message_from_string(message.raw_data)
    assert str(make_header(decode_header(mime["Subject"]))) == NOTICE.subject
    html = next(part for part in mime.walk() if part.get_content_type() == "text/html").get_payload(decode=True)
    assert "parity FAILED &lt;!channel&gt; &amp;" in html.decode()
    assert "gpu-platform@example.com" not in json.dumps(evidence)


def test_ses_calls_exactly_what_the_iam_policy_allows(aws: None) -> None:
    """deploy/iam's NotifySes allows ses:SendRawEmail (tests/unit/core/test_iam_policies.py's PROVIDER_CALLS): the
    provider's notifier must make that call and no other."""
    boto3.client("ses", region_name="eu-west-1").verify_email_identity(EmailAddress="promshift@example.com")
    settings = NotifySettings(timeout_s=20, from_email="promshift@example.com", ses_region="eu-west-1")
    notifier = channel_notifier(NotifyPolicy(channel="ses", to=("gpu-platform@example.com",)), NOTICE, settings)
    assert isinstance(notifier, SesNotifier)
    calls: list[str] = []
    notifier.hook.conn.meta.events.register("before-call.ses.*", lambda model, **_: calls.append(model.name))
    notifier.notify({})
    assert calls == ["SendRawEmail"]
    assert len(sent_by_ses("eu-west-1")) == 1


def test_ses_refuses_an_unverified_sender_and_it_is_recorded_as_not_sent(aws: None) -> None:
    evidence = send(NotifyPolicy(channel="ses", to=("gpu-platform@example.com",)), NOTICE, {},
                    settings=NotifySettings(timeout_s=20, from_email="nobody-verified@example.com",
                                            ses_region="eu-west-1"))
    assert evidence["sent"] is False
    assert "MessageRejected" in evidence["error"], evidence
    assert sent_by_ses("eu-west-1") == []


def test_ses_without_a_sender_is_not_sent(aws: None) -> None:
    evidence = send(NotifyPolicy(channel="ses", to=("gpu-platform@example.com",)), NOTICE, {},
                    settings=NotifySettings(timeout_s=20))
    assert evidence["sent"] is False and "PROMSHIFT_NOTIFY_FROM" in evidence["error"]


def test_settings_name_the_slack_and_ses_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMSHIFT_SLACK_CONN_ID", "oncall_webhook")
    monkeypatch.setenv("PROMSHIFT_SES_CONN_ID", "aws_mail")
    monkeypatch.setenv("PROMSHIFT_SES_REGION", "eu-central-1")
    monkeypatch.setenv("PROMSHIFT_NOTIFY_FROM", "promshift@example.com")
    settings = NotifySettings.from_env()
    assert (settings.slack_conn_id, settings.ses_conn_id, settings.ses_region) == ("oncall_webhook", "aws_mail",
                                                                                   "eu-central-1")
    slack = channel_notifier(NotifyPolicy(channel="slack"), NOTICE, settings)
    assert isinstance(slack, SlackWebhookNotifier) and slack.slack_webhook_conn_id == "oncall_webhook"
    ses = channel_notifier(NotifyPolicy(channel="ses", to=("a@example.com",)), NOTICE, settings)
    assert isinstance(ses, SesNotifier)
    assert (ses.aws_conn_id, ses.region_name, ses.mail_from, ses.to) == ("aws_mail", "eu-central-1",
                                                                        "promshift@example.com", ["a@example.com"])
