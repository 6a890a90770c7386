"""What a group's owners are told (core/notify.py): one-line subjects, escaped bodies, only http(s) links."""

from __future__ import annotations

import json

import pytest

from promshift.core import notify as n

LINK = "http://airflow.example:8080/dags/promshift__migrate__promshift_target/runs/r1/tasks/approval/required_actions?map_index=-1"


def approval(**overrides: object) -> n.Notice:
    values: dict[str, object] = {"group": "gpu-memory", "run_id": "r1", "verdict": "SUCCESSFUL",
                                 "reason": "every check passed", "approvers": ["oncall-alice", "oncall-bob"],
                                 "required_action_url": LINK, "run_url": "http://airflow.example:8080/dags/d/runs/r1",
                                 "timeout": "1d"}
    values.update(overrides)
    return n.approval_needed(**values)  # type: ignore[arg-type]


def test_approval_names_group_verdict_reason_approvers_and_the_required_action_link() -> None:
    notice = approval()
    assert notice.kind == n.APPROVAL_NEEDED
    assert notice.subject == "[promshift] gpu-memory: approval needed to cut over to AMP (gate SUCCESSFUL)"
    assert notice.link == LINK
    for text in (notice.text, notice.html):
        assert "every check passed" in text and "oncall-alice, oncall-bob" in text and "SUCCESSFUL" in text
        assert "1d the group rolls back" in text
    assert f"Answer the approval (required action): {LINK}" in notice.text
    assert f'<a href="{LINK.replace("&", "&amp;")}">Answer the approval (required action)</a>' in notice.html


def test_subject_is_one_clipped_line_whatever_the_reason() -> None:
    notice = n.rolled_back(group="gpu-memory", run_id="r1", reason="parity FAILED\r\nBcc: everyone@example.com " * 20,
                           performed=True, restored_identical=True)
    assert "\n" not in notice.subject and "\r" not in notice.subject
    assert len(notice.subject) <= n.MAX_SUBJECT_CHARS
    assert notice.subject.startswith("[promshift] gpu-memory: rolled back: parity FAILED Bcc:")
    assert notice.subject.endswith("…")


def test_body_escapes_html_and_refuses_non_http_links() -> None:
    notice = approval(reason='<script>alert("x")</script> & {{ 7*7 }}', required_action_url="javascript:alert(1)",
                      run_url=None)
    assert "<script>" not in notice.html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; {{ 7*7 }}" in notice.html
    assert "javascript:" not in notice.html and "javascript:" not in notice.text
    assert notice.link is None
    assert "no link: Airflow's [api] base_url is not set" in notice.html


@pytest.mark.parametrize(
    ("performed", "identical", "subject", "outcome"),
    [
        (True, True, "rolled back: gate FAILED", "the source config was restored identically (snapshot)"),
        (False, None, "rolled back: gate FAILED", "nothing to restore: nothing was deployed"),
        (True, False, "ROLLBACK INCOMPLETE: gate FAILED", "NOT restored identically: check the source config now"),
    ],
)
def test_rollback_says_what_was_restored(performed: bool, identical: bool | None, subject: str, outcome: str) -> None:
    notice = n.rolled_back(group="g", run_id="r", reason="gate FAILED", performed=performed,
                           restored_identical=identical, method="snapshot", log_url="https://af/x", run_url=None)
    assert notice.subject == f"[promshift] g: {subject}"
    assert f"Outcome: {outcome}" in notice.text
    assert notice.link == "https://af/x"


def test_rollback_failed_and_bake_failed_are_urgent_and_named() -> None:
    failed = n.rollback_failed(group="g", run_id="r", reason="gate FAILED", error="DeployError: reload refused")
    assert failed.subject == "[promshift] g: ROLLBACK FAILED: DeployError: reload refused"
    bake = n.bake_failed(group="g", run_id="r", check="error-rate", reason="5xx over 1%")
    assert bake.subject == "[promshift] g: bake check error-rate failed"
    assert "Why: 5xx over 1%" in bake.text


def test_audit_evidence_has_counts_not_addresses_or_bodies() -> None:
    notice = approval()
    evidence = n.notice_evidence(notice, channel="smtp", recipients=2, sent=False,
                                 error="SMTPRecipientsRefused: {'a@example.com': (550, b'no')}\n" + "x" * 1000)
    assert set(evidence) == {"notice", "channel", "recipients", "subject", "link", "sent", "error"}
    assert evidence["recipients"] == 2 and evidence["sent"] is False
    assert evidence["subject"] == notice.subject and evidence["link"] == LINK
    assert "\n" not in evidence["error"] and len(evidence["error"]) <= 300
    assert "every check passed" not in str(evidence)  # no body
    assert "error" not in n.notice_evidence(notice, channel="smtp", recipients=2, sent=True)


def test_sns_subject_is_printable_ascii_within_100() -> None:
    subject = n.sns_subject("[promshift] gpu-memory: rolled back: «drift» on hosts " + "x" * 200)
    assert len(subject) <= 100 and subject.endswith("...")
    assert all(" " <= ch <= "~" for ch in subject)
    assert n.sns_subject("short") == "short"


def test_unknown_kind_and_gate_summary() -> None:
    with pytest.raises(ValueError, match="unknown notice kind 'bogus'"):
        n._build("bogus", "g", "r", "h", [], [], "c")
    assert n.gate_summary({"verdict": "INCONCLUSIVE", "reason": "no data", "action": "ask_approval"}) == (
        "INCONCLUSIVE", "no data")
    assert n.gate_summary({}) == ("UNKNOWN", "")


def test_url_credentials_in_a_reason_or_error_never_reach_a_message() -> None:
    failed = n.rollback_failed(group="g", run_id="r", reason="deploy to http://admin:s3cret@prom:9090 failed",
                               error="DeployError: POST https://ops:hunter2@prom:9090/-/reload: 500")
    evidence = n.notice_evidence(failed, channel="smtp", recipients=1, sent=False,
                                 error="SMTPAuthenticationError at smtp://relay:pa55@mail:587")
    for text in (failed.subject, failed.text, failed.html, str(evidence)):
        assert "s3cret" not in text and "hunter2" not in text and "pa55" not in text
    assert "http://REDACTED@prom:9090" in failed.text


# -- Slack's layout and the delivery key (issue 27) --------------------------------------------------------------


def test_the_slack_message_fits_block_kit_limits_even_with_the_longest_subject() -> None:
    from tests.slack_webhook import blocks_problem

    group = "g" * 94  # the longest group name the catalog accepts
    notice = n.bake_failed(group=group, run_id="r" * 250, check="c" * 500, reason="<!here> " * 2000,
                                 log_url="http://airflow.test/x|y>z", run_url="javascript:alert(1)")
    message = n.slack_message(notice)
    assert len(notice.subject) > n.SLACK_HEADER_CHARS  # the header clips what a mail subject keeps
    assert blocks_problem(message["blocks"]) is None
    assert len(message["blocks"][0]["text"]["text"]) == n.SLACK_HEADER_CHARS
    assert len(message["text"]) <= n.SLACK_SECTION_CHARS
    sections = " ".join(b["text"]["text"] for b in message["blocks"][1:] if b["type"] == "section")
    assert "<!here>" not in sections and "&lt;!here&gt;" in sections
    assert "<http://airflow.test/x%7Cy%3Ez|The check's log>" in sections  # '|' and '>' cannot end the link early
    assert "javascript:" not in json.dumps(message)


def test_the_delivery_key_names_one_event_on_one_channel() -> None:
    key = n.delivery_key(group="gpu-memory", run_id="r1", kind="rolled_back", channel="slack")
    assert key == n.delivery_key(group="gpu-memory", run_id="r1", kind="rolled_back", channel="slack")
    assert len(key) == 64
    others = {n.delivery_key(group=g, run_id=r, kind=k, channel=c) for g, r, k, c in (
        ("gpu-clocks", "r1", "rolled_back", "slack"), ("gpu-memory", "r2", "rolled_back", "slack"),
        ("gpu-memory", "r1", "rollback_failed", "slack"), ("gpu-memory", "r1", "rolled_back", "ses"),
        # no separator trick makes two events one key
        ("gpu-memory\", \"r1", "", "rolled_back", "slack"))}
    assert key not in others and len(others) == 5
