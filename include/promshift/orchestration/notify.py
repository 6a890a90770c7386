"""Tell a group's owners, through Airflow's notifiers, that an approval waits, that a run rolled back or is
overdue (``orchestration.deadlines``).

The channel is the catalog's (``notify:`` in ``catalog/metric_groups.yaml``): ``smtp`` sends with the
SMTP provider's ``SmtpNotifier``, ``sns`` with the amazon provider's ``SnsNotifier``, ``ses`` with its
``SesNotifier`` (``ses:SendRawEmail``), ``slack`` with the Slack provider's ``SlackWebhookNotifier`` (an
incoming webhook: text plus Block Kit blocks); ``none`` (the default) sends nothing. The text is built
in the pure core (``promshift.core.notify``); the links come from Airflow:
``HITLOperator.generate_link_to_ui_from_context`` for the approval's required action, the task
instance's ``log_url`` otherwise (both need ``[api] base_url``).

Deployment settings, never catalog data and never a secret in a record:

- ``PROMSHIFT_SMTP_CONN_ID`` (default ``smtp_default``): the SMTP connection (host, port, login,
  password, ``extra.from_email``; TLS as the provider reads it);
- ``PROMSHIFT_SNS_CONN_ID`` (default ``aws_default``): the AWS connection that publishes;
- ``PROMSHIFT_SES_CONN_ID`` (default ``aws_default``) and ``PROMSHIFT_SES_REGION`` (default: the
  connection's region): the AWS connection that sends through SES;
- ``PROMSHIFT_SLACK_CONN_ID`` (default ``slack_default``, conn type ``slackwebhook``): the incoming
  webhook of groups whose catalog names no ``notify.slack_conn``;
- ``PROMSHIFT_NOTIFY_FROM``: the sender, else the SMTP connection's ``from_email``; required for
  ``ses`` (an identity SES has verified);
- ``PROMSHIFT_NOTIFY_TIMEOUT`` (default 30 s): the longest a step waits for the channel.

A notification never fails or blocks the step that sends it: any error (no connection, a server
that refuses or does not answer, a bad topic) and a send that outlives the timeout become one
warning line in the task log and a ``notified`` audit event with ``sent: false`` and the reason.
The audit event holds the notice kind, channel, number of recipients, subject, link and outcome;
no address, body or credential.

An event is sent once per channel however often its task is retried: ``tell_owners`` claims the
event's delivery key (group, run, kind, channel) in the audit database before sending
(``adapters.notify_deliveries``); a try that finds it sent sends and records nothing, a failed send is
sent again by the next ask.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.sdk.bases.notifier import BaseNotifier

from promshift.adapters.notify_deliveries import DeliveryLedger, Holder
from promshift.core import notify as notices
from promshift.core.catalog import NotifyPolicy
from promshift.core.durations import format_duration

if TYPE_CHECKING:
    from promshift.core.catalog import MetricGroup

log = logging.getLogger(__name__)

SMTP_CONN_ENV = "PROMSHIFT_SMTP_CONN_ID"
SNS_CONN_ENV = "PROMSHIFT_SNS_CONN_ID"
SES_CONN_ENV = "PROMSHIFT_SES_CONN_ID"
SES_REGION_ENV = "PROMSHIFT_SES_REGION"
SLACK_CONN_ENV = "PROMSHIFT_SLACK_CONN_ID"
FROM_ENV = "PROMSHIFT_NOTIFY_FROM"
TIMEOUT_ENV = "PROMSHIFT_NOTIFY_TIMEOUT"
DEFAULT_SMTP_CONN = "smtp_default"
DEFAULT_SNS_CONN = "aws_default"
DEFAULT_SES_CONN = "aws_default"
DEFAULT_SLACK_CONN = "slack_default"
DEFAULT_TIMEOUT_S = 30.0
# Slack answers 429 with Retry-After: a wait this short is waited once within the send; a longer one fails the
# send (the delivery stays unsent, so the next ask sends it) rather than hold the step.
MAX_SLACK_RETRY_AFTER_S = 5


@dataclass(frozen=True)
class NotifySettings:
    """Which connections send and how long a step waits for them."""

    smtp_conn_id: str = DEFAULT_SMTP_CONN
    sns_conn_id: str = DEFAULT_SNS_CONN
    from_email: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    ses_conn_id: str = DEFAULT_SES_CONN
    ses_region: str | None = None
    slack_conn_id: str = DEFAULT_SLACK_CONN

    @classmethod
    def from_env(cls) -> NotifySettings:
        raw_timeout = os.environ.get(TIMEOUT_ENV, "").strip()
        try:
            timeout = float(raw_timeout) if raw_timeout else DEFAULT_TIMEOUT_S
        except ValueError:
            log.warning("%s=%r is not a number of seconds; using %gs", TIMEOUT_ENV, raw_timeout, DEFAULT_TIMEOUT_S)
            timeout = DEFAULT_TIMEOUT_S
        return cls(smtp_conn_id=os.environ.get(SMTP_CONN_ENV) or DEFAULT_SMTP_CONN,
                   sns_conn_id=os.environ.get(SNS_CONN_ENV) or DEFAULT_SNS_CONN,
                   from_email=os.environ.get(FROM_ENV) or None,
                   timeout_s=timeout if timeout > 0 else DEFAULT_TIMEOUT_S,
                   ses_conn_id=os.environ.get(SES_CONN_ENV) or DEFAULT_SES_CONN,
                   ses_region=os.environ.get(SES_REGION_ENV) or None,
                   slack_conn_id=os.environ.get(SLACK_CONN_ENV) or DEFAULT_SLACK_CONN)


# --------------------------------------------------------------------------- links into the Airflow UI


def ui_base_url() -> str | None:
    """Airflow's ``[api] base_url`` (what the UI is reached at), or None when it is not set."""
    from airflow.sdk.configuration import conf

    value = conf.get("api", "base_url", fallback=None)
    return str(value).rstrip("/") if value else None


def run_url(dag_id: str, run_id: str) -> str | None:
    """The DAG run's page in the UI."""
    base = ui_base_url()
    return f"{base}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}" if base else None


def task_log_url(context: Mapping[str, Any]) -> str | None:
    """The task instance's own ``log_url`` (Airflow 3's link to this try's page), when the UI's URL is known."""
    if ui_base_url() is None:
        return None
    ti = context.get("ti") or context.get("task_instance")
    try:
        return str(ti.log_url) if ti is not None else None
    except Exception as exc:  # noqa: BLE001 - a link is optional
        log.debug("no log_url: %s", exc)
        return None


def required_action_url(context: Mapping[str, Any]) -> str | None:
    """The approval's required-action page (``HITLOperator.generate_link_to_ui_from_context``)."""
    from airflow.providers.standard.operators.hitl import HITLOperator

    base = ui_base_url()
    if base is None:
        return None
    try:
        return HITLOperator.generate_link_to_ui_from_context(context=context, base_url=base)  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - a link is optional
        log.debug("no required-action link: %s", exc)
        return None


# --------------------------------------------------------------------------- building and sending


def build_notice(group: MetricGroup, context: Mapping[str, Any], kind: str, details: Mapping[str, Any]
                 ) -> notices.Notice:
    """The notice of ``kind`` for this task's run, with Airflow's links."""
    run_id = str(context.get("run_id") or "")
    run = run_url(group.dag_id, run_id) if run_id else None
    if kind == notices.APPROVAL_NEEDED:
        verdict, reason = notices.gate_summary(details.get("gate") or {})
        return notices.approval_needed(group=group.name, run_id=run_id, verdict=verdict, reason=reason,
                                       approvers=details.get("approvers") or group.approvers,
                                       required_action_url=required_action_url(context),
                                       run_url=run, timeout=format_duration(group.approval_timeout_s),
                                       board_url=details.get("board_url"))
    if kind == notices.ROLLED_BACK:
        result = details.get("result") or {}
        return notices.rolled_back(group=group.name, run_id=run_id, reason=str(details.get("reason") or ""),
                                   performed=result.get("performed"),
                                   restored_identical=result.get("restored_identical"),
                                   method=result.get("method"), log_url=task_log_url(context), run_url=run)
    if kind == notices.ROLLBACK_FAILED:
        error = details.get("error")
        text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
        return notices.rollback_failed(group=group.name, run_id=run_id, reason=str(details.get("reason") or ""),
                                       error=text, log_url=task_log_url(context), run_url=run)
    if kind == notices.BAKE_FAILED:
        return notices.bake_failed(group=group.name, run_id=run_id, check=str(details.get("check") or "?"),
                                   reason=str(details.get("reason") or ""), log_url=task_log_url(context),
                                   run_url=run)
    if kind == notices.RUN_OVERDUE:
        return notices.run_overdue(group=group.name, run_id=run_id, stage=str(details.get("stage") or "?"),
                                   running_for=str(details.get("running_for") or "?"),
                                   deadline_after=str(details.get("deadline_after") or "?"),
                                   last_step=details.get("last_step"), last_at=details.get("last_at"),
                                   queued_at=str(details.get("queued_at") or "?"),
                                   dry_run=bool(details.get("dry_run")),
                                   warmup_override=str(details.get("warmup_override") or ""), run_url=run)
    raise ValueError(f"unknown notice kind {kind!r}")


def channel_notifier(policy: NotifyPolicy, notice: notices.Notice, settings: NotifySettings) -> BaseNotifier:
    """The Airflow notifier of the group's channel, carrying this notice."""
    if policy.channel == "smtp":
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier

        return SmtpNotifier(to=list(policy.to), from_email=settings.from_email, subject=notice.subject,
                            html_content=notice.html, smtp_conn_id=settings.smtp_conn_id)
    if policy.channel == "sns":
        from airflow.providers.amazon.aws.notifications.sns import SnsNotifier

        arn = policy.topic_arn or ""
        region = arn.split(":")[3] if arn.count(":") >= 5 else None
        return SnsNotifier(aws_conn_id=settings.sns_conn_id, target_arn=arn, message=notice.text,
                           subject=notices.sns_subject(notice.subject), region_name=region)
    if policy.channel == "ses":
        from airflow.providers.amazon.aws.notifications.ses import SesNotifier

        if not settings.from_email:
            raise ValueError(f"channel 'ses' needs a sender: set {FROM_ENV} to an identity SES has verified")
        return SesNotifier(aws_conn_id=settings.ses_conn_id, region_name=settings.ses_region,
                           mail_from=settings.from_email, to=list(policy.to), subject=notice.subject,
                           html_content=notice.html)
    if policy.channel == "slack":
        from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier

        message = notices.slack_message(notice)
        return SlackWebhookNotifier(slack_webhook_conn_id=policy.slack_conn or settings.slack_conn_id,
                                    text=message["text"], blocks=message["blocks"], unfurl_links=False,
                                    unfurl_media=False, timeout=max(1, math.ceil(settings.timeout_s)),
                                    retry_handlers=slack_retry_handlers())
    raise ValueError(f"channel {policy.channel!r} sends nothing")


def slack_retry_handlers(max_wait_s: float = MAX_SLACK_RETRY_AFTER_S) -> list[Any]:
    """One more try after a 429 whose Retry-After is at most ``max_wait_s``; nothing else is retried in the send.

    slack_sdk's default retries a refused connection and logs the webhook's URL (its secret path) while
    doing so: a refused send fails here, and the delivery's next ask sends it.
    """
    from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler

    class ShortRateLimitRetry(RateLimitErrorRetryHandler):
        def _can_retry(self, *, state: Any, request: Any, response: Any = None, error: Any = None) -> bool:
            if response is None or response.status_code != 429:
                return False
            waits = [v for k, vs in response.headers.items() if k.lower() == "retry-after" for v in vs]
            try:
                return bool(waits) and 0 <= int(waits[0]) <= max_wait_s
            except ValueError:
                return False

    return [ShortRateLimitRetry(max_retry_count=1)]


def _within(timeout_s: float, work: Callable[[], None]) -> None:
    """Run ``work``; raise what it raised, or TimeoutError if it is still running after ``timeout_s``."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            failure.append(exc)

    worker = threading.Thread(target=run, name="promshift-notify", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise TimeoutError(f"no answer within {timeout_s:g}s (left to finish in the background)")
    if failure:
        raise failure[0]


def send(policy: NotifyPolicy, notice: notices.Notice, context: Mapping[str, Any], *,
         settings: NotifySettings | None = None, logger: logging.Logger | logging.LoggerAdapter[Any] = log
         ) -> dict[str, Any]:
    """Send ``notice`` on the policy's channel; return the audit evidence. Never raises.

    The channel notifier's ``notify`` is called directly rather than through ``__call__``: that
    would render the subject and body as Jinja templates, and they quote reasons and catalog text.
    """
    settings = settings or NotifySettings.from_env()
    recipients = len(policy.recipients)
    try:
        notifier = channel_notifier(policy, notice, settings)
        _within(settings.timeout_s, lambda: notifier.notify(context))  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - a notification must never fail the step
        error = f"{type(exc).__name__}: {notices.one_line(exc, 240) or 'no message'}"
        logger.warning("notification not sent (%s via %s to %s recipient(s)): %s", notice.kind, policy.channel,
                       recipients, error)
        return notices.notice_evidence(notice, channel=policy.channel, recipients=recipients, sent=False, error=error)
    logger.info("notified %s recipient(s) via %s: %s", recipients, policy.channel, notice.subject)
    return notices.notice_evidence(notice, channel=policy.channel, recipients=recipients, sent=True)


def _audit(step: Any, context: Mapping[str, Any]) -> Any:
    from promshift.orchestration.wiring import audit_store

    publish = getattr(step, "_publish_audit_head", None)
    return audit_store(on_head=(lambda head: publish(context, head)) if publish else None)


def _record(audit: Any, step: Any, context: Mapping[str, Any], evidence: Mapping[str, Any]) -> None:
    from promshift.core.events import EventKind
    from promshift.steps.migration import record_event

    record_event(audit, group_name=step.group.name, run_id=str(context["run_id"]), kind=EventKind.NOTIFIED,
                 evidence=evidence, now=datetime.now(UTC))


def holder_of(context: Mapping[str, Any]) -> Holder:
    """This task instance (``dag/task/map_index``) and its try: who claims a delivery."""
    ti = context.get("ti") or context.get("task_instance")
    if ti is None:
        return Holder("unknown", 0)
    task = "/".join(str(getattr(ti, name, "?")) for name in ("dag_id", "task_id", "map_index"))
    try:
        return Holder(task, int(getattr(ti, "try_number", 0) or 0))
    except (TypeError, ValueError):
        return Holder(task, 0)


def tell_owners(step: Any, context: Mapping[str, Any], kind: str, **details: Any) -> dict[str, Any] | None:
    """Notify a step's group's owners of ``kind`` on the catalog's channel and record ``notified``; once.

    Returns the recorded evidence, or None when the group's channel is ``none`` (nothing is sent
    or recorded), when an earlier try already delivered this event on this channel (nothing is sent
    or recorded again), or something failed before sending. Never raises.

    With the delivery table unreachable the notice is still sent (a lost approval request costs more
    than a repeated one); the warning says a retry may repeat it.
    """
    logger = getattr(step, "log", log)
    try:
        group = step.group
        if not group.notify.enabled:
            logger.info("group %s has no notify channel; no %s notification", group.name, kind)
            return None
        notice = build_notice(group, context, kind, details)
    except Exception as exc:  # noqa: BLE001 - a notification must never fail the step
        logger.warning("%s notification not built: %s: %s", kind, type(exc).__name__, notices.one_line(exc, 240))
        return None
    policy = group.notify
    key = notices.delivery_key(group=group.name, run_id=notice.run_id, kind=kind, channel=policy.channel)
    audit = ledger = claim = None
    try:
        audit = _audit(step, context)
        ledger = DeliveryLedger(audit.url, engine=audit.engine)
        claim = ledger.claim(key, group=group.name, run_id=notice.run_id, kind=kind, channel=policy.channel,
                             holder=holder_of(context), now=datetime.now(UTC))
    except Exception as exc:  # noqa: BLE001
        logger.warning("%s notification via %s not claimed in the delivery table (%s: %s): sending it anyway; a "
                       "retry may send it again", kind, policy.channel, type(exc).__name__, notices.one_line(exc, 240))
    if claim is not None and not claim.owned:
        logger.info("%s notification via %s is already %s (%s): not sent again", kind, policy.channel, claim.state,
                    claim.holder or "another task")
        return None
    evidence = send(policy, notice, context, logger=logger)
    if claim is not None and ledger is not None:
        evidence["attempt"] = claim.attempts
        try:
            ledger.finish(key, claim, sent=evidence["sent"], now=datetime.now(UTC), error=evidence.get("error"))
        except Exception as exc:  # noqa: BLE001
            logger.warning("%s notification (sent=%s) not marked in the delivery table: %s: %s", kind,
                           evidence["sent"], type(exc).__name__, notices.one_line(exc, 240))
    try:
        _record(audit if audit is not None else _audit(step, context), step, context, evidence)
    except Exception as exc:  # noqa: BLE001
        logger.warning("%s notification (sent=%s) not recorded in the audit: %s: %s", kind, evidence["sent"],
                       type(exc).__name__, notices.one_line(exc, 240))
    return evidence


class OwnersNotifier(BaseNotifier):
    """An Airflow notifier that runs ``tell_owners`` (e.g. in ``HITLOperator(notifiers=...)``); never raises.

    ``evidence`` holds what was recorded after it ran.
    """

    template_fields = ()

    def __init__(self, *, step: Any, kind: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.step = step
        self.kind = kind
        self.details = dict(details or {})
        self.evidence: dict[str, Any] | None = None

    def notify(self, context: Any) -> None:
        self.evidence = tell_owners(self.step, context, self.kind, **self.details)
