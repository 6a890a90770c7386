"""The channels behind ``orchestration.notify``: SNS through the amazon provider's SnsNotifier (moto in process),
SMTP settings from the environment, and a notification that can never raise out of a step."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from airflow.providers.amazon.aws.notifications.sns import SnsNotifier
from airflow.providers.smtp.notifications.smtp import SmtpNotifier
from moto import mock_aws

from promshift.core import notify as notices
from promshift.core.catalog import NotifyPolicy
from promshift.orchestration.notify import NotifySettings, channel_notifier, send, tell_owners

NOTICE = notices.rolled_back(group="gpu-memory", run_id="r1", reason="parity FAILED (coverage: 2 hosts missing)",
                             performed=True, restored_identical=True,
                             log_url="http://airflow.test/dags/promshift__migrate__promshift_target/runs/r1/tasks/rollback")


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")  # the topic's region comes from its ARN, not this
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws"}))
    with mock_aws():
        yield


def subscribed_queue(topic_arn: str, region: str) -> tuple[Any, str]:
    sqs = boto3.client("sqs", region_name=region)
    url = sqs.create_queue(QueueName="owners-inbox")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    boto3.client("sns", region_name=region).subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=queue_arn)
    return sqs, url


def test_sns_publishes_subject_and_text_to_the_topics_region(aws: Any) -> None:
    arn = boto3.client("sns", region_name="eu-west-1").create_topic(Name="gpu-memory-owners")["TopicArn"]
    sqs, url = subscribed_queue(arn, "eu-west-1")
    evidence = send(NotifyPolicy(channel="sns", topic_arn=arn), NOTICE, {}, settings=NotifySettings(timeout_s=20))
    assert evidence == {"notice": "rolled_back", "channel": "sns", "recipients": 1, "subject": NOTICE.subject,
                        "link": NOTICE.link, "sent": True}
    [message] = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    body = json.loads(message["Body"])
    assert body["TopicArn"] == arn
    assert body["Subject"] == "[promshift] gpu-memory: rolled back: parity FAILED (coverage: 2 hosts missing)"
    assert "Why: parity FAILED (coverage: 2 hosts missing)" in body["Message"]
    assert NOTICE.link in body["Message"]


def test_sns_to_a_missing_topic_is_recorded_as_not_sent(aws: Any) -> None:
    arn = "arn:aws:sns:eu-west-1:123456789012:nobody-made-this"
    evidence = send(NotifyPolicy(channel="sns", topic_arn=arn), NOTICE, {}, settings=NotifySettings(timeout_s=20))
    assert evidence["sent"] is False
    assert "NotFound" in evidence["error"], evidence


def test_channel_notifiers_carry_the_notice_and_the_deployment_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMSHIFT_SMTP_CONN_ID", "mail_relay")
    monkeypatch.setenv("PROMSHIFT_NOTIFY_FROM", "promshift@example.com")
    monkeypatch.setenv("PROMSHIFT_NOTIFY_TIMEOUT", "7")
    settings = NotifySettings.from_env()
    assert settings == NotifySettings(smtp_conn_id="mail_relay", sns_conn_id="aws_default",
                                      from_email="promshift@example.com", timeout_s=7.0)
    smtp = channel_notifier(NotifyPolicy(channel="smtp", to=("a@example.com", "b@example.com")), NOTICE, settings)
    assert isinstance(smtp, SmtpNotifier)
    assert (smtp.to, smtp.from_email, smtp.smtp_conn_id) == (["a@example.com", "b@example.com"],
                                                             "promshift@example.com", "mail_relay")
    assert (smtp.subject, smtp.html_content) == (NOTICE.subject, NOTICE.html)
    sns = channel_notifier(NotifyPolicy(channel="sns", topic_arn="arn:aws:sns:ap-south-1:123456789012:t"), NOTICE,
                           settings)
    assert isinstance(sns, SnsNotifier)
    assert (sns.region_name, sns.aws_conn_id, sns.message) == ("ap-south-1", "aws_default", NOTICE.text)
    with pytest.raises(ValueError, match="sends nothing"):
        channel_notifier(NotifyPolicy(), NOTICE, settings)


def test_a_bad_timeout_setting_falls_back_to_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMSHIFT_NOTIFY_TIMEOUT", "soon")
    assert NotifySettings.from_env().timeout_s == 30.0
    monkeypatch.setenv("PROMSHIFT_NOTIFY_TIMEOUT", "-1")
    assert NotifySettings.from_env().timeout_s == 30.0


class BrokenStep:
    """A step whose catalog cannot be read any more: telling its owners must still not raise."""

    log = SimpleNamespace(warning=lambda *a: BrokenStep.warnings.append(a[0] % a[1:]), info=lambda *a: None)
    warnings: list[str] = []

    @property
    def group(self) -> Any:
        raise FileNotFoundError("catalog/metric_groups.yaml")


def test_telling_owners_never_raises_out_of_a_step() -> None:
    assert tell_owners(BrokenStep(), {"run_id": "r1"}, "rolled_back", reason="x", result={}) is None
    assert BrokenStep.warnings == ["rolled_back notification not built: FileNotFoundError: catalog/metric_groups.yaml"]
