"""A retried task does not notify twice for the same event: the delivery key is claimed in the audit database.

``tell_owners`` is asked as a step asks it, with a task instance's ids and try number in the context, and the
channel is real: Slack's contract server (``tests/slack_webhook.py``) or SES in moto. The store is the audit
database of the Airflow shell (``PROMSHIFT_AUDIT_URL``, SQLite here), the one every worker reaches.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ses import ses_backends

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.notify_deliveries import FAILED, SENDING, SENT, DeliveryLedger, Holder
from promshift.core import notify as notices
from promshift.core.catalog import MetricGroup, NotifyPolicy
from promshift.core.events import EventKind
from promshift.orchestration.notify import tell_owners
from tests.slack_webhook import SlackWebhook, slack_conn, slack_webhook
from tests.unit.adapters.test_audit_store import pg_schemas  # noqa: F401 - the fixture: throwaway schemas on local PostgreSQL

RUN_ID = "scheduled__2026-12-05T00:00:00+00:00"
RESULT = {"performed": True, "restored_identical": True, "method": "reload"}


@dataclass
class TI:
    dag_id: str = "promshift__migrate__promshift_target"
    task_id: str = "rollback"
    map_index: int = -1
    try_number: int = 1
    pushed: dict[str, Any] = field(default_factory=dict)

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


@dataclass
class Step:
    """What ``tell_owners`` reads of a step: its group (with the catalog's notify policy) and its logger."""

    group: MetricGroup
    warnings: list[str] = field(default_factory=list)

    @property
    def log(self) -> Any:
        step = self

        class Log:
            def info(self, *a: Any) -> None:
                pass

            def warning(self, msg: str, *a: Any) -> None:
                step.warnings.append(msg % a)

        return Log()


def step(channel: str, **policy: Any) -> Step:
    return Step(MetricGroup(name="gpu-memory", metrics=("DCGM_FI_DEV_FB_USED",),
                            notify=NotifyPolicy(channel=channel, **policy)))


def context(try_number: int = 1, task_id: str = "rollback") -> dict[str, Any]:
    ti = TI(task_id=task_id, try_number=try_number)
    return {"run_id": RUN_ID, "ti": ti, "task_instance": ti}


@pytest.fixture
def audit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AuditStore]:
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PROMSHIFT_AUDIT_URL", f"sqlite:///{tmp_path / 'audit.db'}")
    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    store = AuditStore()
    yield store
    store.engine.dispose()


@pytest.fixture
def slack(audit: AuditStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlackWebhook]:
    with slack_webhook() as hook:
        monkeypatch.setenv("AIRFLOW_CONN_SLACK_DEFAULT", slack_conn(hook))
        yield hook


def notified(audit: AuditStore) -> list[dict[str, Any]]:
    return [e.evidence_data for e in audit.events(group="gpu-memory") if e.kind == EventKind.NOTIFIED]


def key(channel: str, kind: str = "rolled_back") -> str:
    return notices.delivery_key(group="gpu-memory", run_id=RUN_ID, kind=kind, channel=channel)


def test_a_retried_task_sends_the_same_event_once(audit: AuditStore, slack: SlackWebhook) -> None:
    first = tell_owners(step("slack"), context(try_number=1), "rolled_back", reason="parity FAILED", result=RESULT)
    assert first is not None and first["sent"] is True and first["attempt"] == 1
    again = tell_owners(step("slack"), context(try_number=2), "rolled_back", reason="parity FAILED", result=RESULT)
    assert again is None
    assert len(slack.accepted) == 1 and len(slack.received) == 1
    assert notified(audit) == [first]
    row = DeliveryLedger(audit.url, engine=audit.engine).get(key("slack"))
    assert row is not None
    assert (row["state"], row["attempts"], row["holder_task"], row["holder_try"]) == (
        SENT, 1, "promshift__migrate__promshift_target/rollback/-1", 1)
    assert "s3cr3tW3bh00kT0k3n" not in json.dumps(row, default=str)
    # Another event of the same run is another delivery.
    other = tell_owners(step("slack"), context(try_number=2), "rollback_failed", reason="x", error="boom")
    assert other is not None and other["sent"] is True
    assert len(slack.accepted) == 2


def test_each_channel_gets_the_event_once(audit: AuditStore, slack: SlackWebhook,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1"), ("PROMSHIFT_NOTIFY_FROM", "promshift@example.com"),
                        ("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws"}))):
        monkeypatch.setenv(name, value)
    with mock_aws():
        boto3.client("ses", region_name="us-east-1").verify_email_identity(EmailAddress="promshift@example.com")
        by_ses = step("ses", to=("gpu-platform@example.com",))
        for try_number in (1, 2, 3):
            tell_owners(step("slack"), context(try_number), "rolled_back", reason="r", result=RESULT)
            tell_owners(by_ses, context(try_number), "rolled_back", reason="r", result=RESULT)
        assert len(ses_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].sent_messages) == 1
    assert len(slack.accepted) == 1
    assert sorted(e["channel"] for e in notified(audit)) == ["ses", "slack"]


def test_a_failed_send_is_sent_again_by_the_next_try(audit: AuditStore, slack: SlackWebhook) -> None:
    slack.script.append((500, "rollup_error", {}))
    first = tell_owners(step("slack"), context(1), "rolled_back", reason="r", result=RESULT)
    assert first is not None and first["sent"] is False and "rollup_error" in first["error"]
    ledger = DeliveryLedger(audit.url, engine=audit.engine)
    assert ledger.get(key("slack"))["state"] == FAILED  # type: ignore[index]
    second = tell_owners(step("slack"), context(2), "rolled_back", reason="r", result=RESULT)
    assert second is not None and second["sent"] is True and second["attempt"] == 2
    assert tell_owners(step("slack"), context(3), "rolled_back", reason="r", result=RESULT) is None
    assert [r.status for r in slack.received] == [500, 200]
    assert [e["sent"] for e in notified(audit)] == [False, True]
    row = ledger.get(key("slack"))
    assert (row["state"], row["attempts"], row["error"]) == (SENT, 2, None)  # type: ignore[index]


def test_a_try_whose_worker_died_mid_send_is_taken_over_by_the_next_try(audit: AuditStore,
                                                                        slack: SlackWebhook) -> None:
    ledger = DeliveryLedger(audit.url, engine=audit.engine)
    # Try 1 claimed the delivery and its worker died before it marked the outcome.
    claim = ledger.claim(key("slack"), group="gpu-memory", run_id=RUN_ID, kind="rolled_back", channel="slack",
                         holder=Holder("promshift__migrate__promshift_target/rollback/-1", 1), now=datetime.now(UTC))
    assert claim.owned
    evidence = tell_owners(step("slack"), context(2), "rolled_back", reason="r", result=RESULT)
    assert evidence is not None and evidence["sent"] is True and evidence["attempt"] == 2
    assert len(slack.accepted) == 1
    # The dead try's late mark cannot overwrite the outcome: its claim was taken over.
    assert ledger.finish(key("slack"), claim, sent=False, now=datetime.now(UTC), error="late") is False
    assert ledger.get(key("slack"))["state"] == SENT  # type: ignore[index]


def test_another_tasks_claim_holds_until_its_lease_runs_out(audit: AuditStore) -> None:
    ledger = DeliveryLedger(audit.url, engine=audit.engine, lease_s=600)
    now = datetime(2026, 12, 5, 6, 0, tzinfo=UTC)
    args = {"group": "gpu-memory", "run_id": RUN_ID, "kind": "rolled_back", "channel": "slack"}
    first = ledger.claim("k", **args, holder=Holder("d/rollback/-1", 1), now=now)
    other = ledger.claim("k", **args, holder=Holder("d/full_rollback/-1", 1), now=now + timedelta(seconds=30))
    assert first.owned and not other.owned and other.state == SENDING and other.holder == "d/rollback/-1"
    late = ledger.claim("k", **args, holder=Holder("d/full_rollback/-1", 1), now=now + timedelta(seconds=601))
    assert late.owned and late.attempts == 2
    assert ledger.finish("k", late, sent=True, now=now + timedelta(seconds=602)) is True
    assert not ledger.claim("k", **args, holder=Holder("d/rollback/-1", 2), now=now + timedelta(days=1)).owned


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'audit.db'}"
    return request.getfixturevalue("pg_schemas")()  # type: ignore[no-any-return]


def test_of_many_claims_at_once_one_wins_and_a_failure_is_claimed_again(ledger_url: str) -> None:
    """The production audit database is PostgreSQL: the insert-if-absent and the conditional take-over hold on
    both dialects."""
    ledger = DeliveryLedger(ledger_url)
    now = datetime(2026, 12, 5, 6, 0, tzinfo=UTC)
    args = {"group": "gpu-memory", "run_id": RUN_ID, "kind": "approval_needed", "channel": "ses"}
    claims: list[Any] = []
    barrier = threading.Barrier(6)

    def claim(i: int) -> None:
        barrier.wait()
        claims.append(ledger.claim("k", **args, holder=Holder(f"d/task{i}/-1", 1), now=now))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    [winner] = [c for c in claims if c.owned]
    assert len(claims) == 6
    assert ledger.finish("k", winner, sent=False, now=now, error="MessageRejected: " + "x" * 1000) is True
    row = ledger.get("k")
    assert row is not None and row["state"] == FAILED and len(row["error"]) == 300
    retry = ledger.claim("k", **args, holder=Holder("d/task0/-1", 2), now=now + timedelta(seconds=20))
    assert retry.owned and retry.attempts == 2
    assert not ledger.claim("k", **args, holder=Holder("d/task1/-1", 1), now=now + timedelta(seconds=21)).owned
    assert ledger.finish("k", retry, sent=True, now=now + timedelta(seconds=22)) is True
    assert ledger.get("k")["state"] == SENT  # type: ignore[index]
    ledger.engine.dispose()


def test_two_workers_asking_at_once_send_once(audit: AuditStore, slack: SlackWebhook) -> None:
    results: list[Any] = []
    barrier = threading.Barrier(4)

    def ask(task_id: str) -> None:
        barrier.wait()
        results.append(tell_owners(step("slack"), context(1, task_id), "rolled_back", reason="r", result=RESULT))

    threads = [threading.Thread(target=ask, args=(f"task{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(slack.accepted) == 1
    assert sum(r is not None for r in results) == 1


def test_an_unreachable_delivery_table_still_sends_and_says_a_retry_may_repeat(
        tmp_path: Path, slack: SlackWebhook, monkeypatch: pytest.MonkeyPatch) -> None:
    # A PostgreSQL audit database on a port nothing listens on (the shared store is down).
    monkeypatch.setenv("PROMSHIFT_AUDIT_URL", "postgresql+psycopg://promshift@127.0.0.1:1/promshift?connect_timeout=2")
    asking = step("slack")
    tell_owners(asking, context(1), "rolled_back", reason="r", result=RESULT)
    assert len(slack.accepted) == 1
    assert any("not claimed in the delivery table" in w and "a retry may send it again" in w
               for w in asking.warnings), asking.warnings
