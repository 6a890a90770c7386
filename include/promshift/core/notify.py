"""What a group's owners are told, as text: an approval waits for them, a run rolled back, a bake check failed,
a run is overdue.

Pure: no Airflow, no I/O. The orchestration shell (``promshift.orchestration.notify``) finds the
links (Airflow's own helpers), sends the ``Notice`` through the channel's Airflow notifier and
records ``notice_evidence`` in the audit log.

Everything that goes into a header is one line and clipped (a reason may quote catalog text or
a server's error); the HTML body escapes every value and links only http(s) URLs.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from promshift.core.redact import redact_text
from promshift.core.text import shown

APPROVAL_NEEDED = "approval_needed"
ROLLED_BACK = "rolled_back"
ROLLBACK_FAILED = "rollback_failed"
BAKE_FAILED = "bake_failed"
RUN_OVERDUE = "run_overdue"
NOTICE_KINDS = (APPROVAL_NEEDED, ROLLED_BACK, ROLLBACK_FAILED, BAKE_FAILED, RUN_OVERDUE)

SUBJECT_PREFIX = "[promshift]"
# Long enough for a group name and a short reason; mail clients cut subjects anyway.
MAX_SUBJECT_CHARS = 160
# SNS refuses a subject over 100 characters (and any line break or non-ASCII-printable character).
MAX_SNS_SUBJECT_CHARS = 100
MAX_REASON_CHARS = 2000

_SPACE_RE = re.compile(r"\s+")
_CONTROL_RE = re.compile("[\x00-\x1f\x7f]")


def one_line(text: Any, limit: int) -> str:
    """``text`` on one line (runs of whitespace and control characters become one space), URL credentials
    redacted (a reason or a server's error may quote a URL), clipped with '…'."""
    # Bidirectional overrides and other format characters left after that are written as escapes (\u202e).
    flat = shown(_SPACE_RE.sub(" ", _CONTROL_RE.sub(" ", redact_text(str(text)))).strip())
    return flat if len(flat) <= limit else flat[: max(limit - 1, 0)].rstrip() + "…"


def sns_subject(subject: str) -> str:
    """The subject as SNS takes it: printable ASCII, at most 100 characters."""
    ascii_only = "".join(ch if " " <= ch <= "~" else "?" for ch in one_line(subject, 10 * MAX_SNS_SUBJECT_CHARS))
    ascii_only = ascii_only.replace("…", "...")
    return ascii_only if len(ascii_only) <= MAX_SNS_SUBJECT_CHARS else ascii_only[: MAX_SNS_SUBJECT_CHARS - 3] + "..."


def _safe_link(url: str | None) -> str | None:
    """A link worth putting in a message: an absolute http(s) URL on one line, else None."""
    if not url:
        return None
    url = str(url).strip()
    if not re.match(r"https?://[^\s/]+", url) or _CONTROL_RE.search(url) or " " in url:
        return None
    return url


@dataclass(frozen=True)
class Notice:
    """One message: a one-line subject, a plain-text body, the same as HTML, and the main UI link."""

    kind: str
    group: str
    run_id: str
    subject: str
    text: str
    html: str
    link: str | None = None
    # The parts the text and HTML were made of, for channels that lay a message out themselves (Slack).
    headline: str = ""
    facts: tuple[tuple[str, str], ...] = ()
    links: tuple[tuple[str, str], ...] = ()
    closing: str = ""


def _build(kind: str, group: str, run_id: str, headline: str, facts: Sequence[tuple[str, str]],
           links: Sequence[tuple[str, str | None]], closing: str) -> Notice:
    if kind not in NOTICE_KINDS:
        raise ValueError(f"unknown notice kind {kind!r}; known: {', '.join(NOTICE_KINDS)}")
    subject = one_line(f"{SUBJECT_PREFIX} {group}: {headline}", MAX_SUBJECT_CHARS)
    facts = [(label, shown(str(value))) for label, value in facts]  # free text of any origin, escaped
    shown_links = [(label, url) for label, url in ((label, _safe_link(url)) for label, url in links) if url]
    text_lines = [one_line(headline, MAX_REASON_CHARS), ""]
    text_lines += [f"{label}: {value}" for label, value in facts]
    if shown_links:
        text_lines.append("")
        text_lines += [f"{label}: {url}" for label, url in shown_links]
    text_lines += ["", closing]
    rows = "".join(f"<tr><th align=\"left\">{html.escape(label)}</th><td>{html.escape(value)}</td></tr>"
                   for label, value in facts)
    anchors = "".join(f"<li><a href=\"{html.escape(url, quote=True)}\">{html.escape(label)}</a></li>"
                      for label, url in shown_links)
    body = (f"<p><strong>{html.escape(one_line(headline, MAX_REASON_CHARS))}</strong></p>"
            f"<table>{rows}</table>"
            + (f"<ul>{anchors}</ul>" if anchors else "<p>(no link: Airflow's [api] base_url is not set)</p>")
            + f"<p>{html.escape(closing)}</p>")
    return Notice(kind=kind, group=group, run_id=run_id, subject=subject, text="\n".join(text_lines) + "\n",
                  html=body, link=shown_links[0][1] if shown_links else None,
                  headline=one_line(headline, MAX_REASON_CHARS), facts=tuple(facts),
                  links=tuple((label, url) for label, url in shown_links), closing=closing)


def approval_needed(*, group: str, run_id: str, verdict: str, reason: str, approvers: Sequence[str],
                    required_action_url: str | None, run_url: str | None = None,
                    timeout: str | None = None, board_url: str | None = None) -> Notice:
    """An on-call approval is waiting: the gate's verdict and reason, who may answer, and the link to answer."""
    facts = [("Group", group), ("Run", run_id), ("Gate verdict", verdict),
             ("Gate reason", one_line(reason or "-", MAX_REASON_CHARS)),
             ("Who may approve", ", ".join(approvers) or "-")]
    if timeout:
        facts.append(("Unanswered after", f"{timeout} the group rolls back"))
    return _build(APPROVAL_NEEDED, group, run_id, f"approval needed to cut over to AMP (gate {verdict})", facts,
                  [("Answer the approval (required action)", required_action_url),
                   ("The evidence on the migration board", board_url), ("The DAG run", run_url)],
                  "Whoever triggered the run cannot approve it (four-eyes rule). Reject rolls the group back.")


def rolled_back(*, group: str, run_id: str, reason: str, performed: bool | None,
                restored_identical: bool | None, method: str | None = None, log_url: str | None = None,
                run_url: str | None = None) -> Notice:
    """A run rolled back (gate failed, approval rejected or timed out, a step failed): why, and what was restored."""
    if not performed:
        outcome = "nothing to restore: nothing was deployed"
    elif restored_identical:
        outcome = "the source config was restored identically" + (f" ({method})" if method else "")
    else:
        outcome = "NOT restored identically: check the source config now"
    headline = f"rolled back: {one_line(reason or 'a step failed', 100)}"
    if performed and not restored_identical:
        headline = f"ROLLBACK INCOMPLETE: {one_line(reason or 'a step failed', 90)}"
    facts = [("Group", group), ("Run", run_id), ("Why", one_line(reason or "-", MAX_REASON_CHARS)),
             ("Outcome", outcome)]
    return _build(ROLLED_BACK, group, run_id, headline, facts,
                  [("The rollback task's log", log_url), ("The DAG run", run_url)],
                  "Reads stay on (or went back to) the self-hosted source.")


def rollback_failed(*, group: str, run_id: str, reason: str, error: str, log_url: str | None = None,
                    run_url: str | None = None) -> Notice:
    """The rollback itself failed: the most urgent message there is."""
    facts = [("Group", group), ("Run", run_id), ("Rolling back because", one_line(reason or "-", MAX_REASON_CHARS)),
             ("Rollback error", one_line(error, MAX_REASON_CHARS))]
    return _build(ROLLBACK_FAILED, group, run_id, f"ROLLBACK FAILED: {one_line(error, 100)}", facts,
                  [("The rollback task's log", log_url), ("The DAG run", run_url)],
                  "The source config may still carry the group's dual-write entry: check it now.")


def bake_failed(*, group: str, run_id: str, check: str, reason: str, log_url: str | None = None,
                run_url: str | None = None) -> Notice:
    """A bake check after cut-over failed (the bake watch is a later issue; the message is ready)."""
    facts = [("Group", group), ("Run", run_id), ("Check", check), ("Why", one_line(reason or "-", MAX_REASON_CHARS))]
    return _build(BAKE_FAILED, group, run_id, f"bake check {one_line(check, 60)} failed", facts,
                  [("The check's log", log_url), ("The DAG run", run_url)],
                  "Reads are served by AMP: decide whether to route them back to the source.")


def run_overdue(*, group: str, run_id: str, stage: str, running_for: str, deadline_after: str,
                last_step: str | None, last_at: str | None, queued_at: str, dry_run: bool = False,
                warmup_override: str = "", run_url: str | None = None) -> Notice:
    """A migration run passed its DAG's deadline alert and has not ended: it is stuck beyond both of its waits.

    ``running_for``: how long since the run was queued; ``deadline_after``: the deadline's interval (the longest
    warm-up timeout plus approval timeout of the DAG's groups, plus the margin for the steps' own work)."""
    last = f"{last_step} at {last_at}" if last_step else "nothing recorded yet (it never got past validate)"
    facts = [("Group", group), ("Run", run_id), ("Stage", stage), ("Last step recorded", last),
             ("Queued at", queued_at), ("Running for", running_for), ("Deadline", f"{deadline_after} after queued")]
    if dry_run:
        facts.append(("Dry run", "yes: it waits for no warm-up and no approval"))
    if warmup_override:
        facts.append(("Warm-up override", f"{warmup_override}: the deadline counts the catalog's warm-up, so a "
                                          "longer override can reach it while still warming up"))
    paragraph = (f"The migration run {one_line(run_id, 200)} of group {one_line(group, 100)} was queued "
                 f"{running_for} ago and has not ended: the group is at stage {stage}, and the run's last recorded "
                 f"step is {last}. That is past its deadline of {deadline_after}, longer than its warm-up and its "
                 "approval could both have waited plus the steps' own work, so a task is stuck (a worker hung in a "
                 "call, a deferred task its triggerer lost, a latency probe waiting behind its workspace's other "
                 "probes, or a task waiting for a worker slot). Nothing was stopped: look at the run's running "
                 "task, and fail it to roll the group back if it cannot finish.")
    return _build(RUN_OVERDUE, group, run_id, f"run overdue: still going {running_for} after it was queued", facts,
                  [("The DAG run", run_url)], paragraph)


# Slack's Block Kit limits: a header's plain text at most 150 characters, a section's text at most 3,000, at most
# 50 blocks in a message; the top-level ``text`` (the notification's fallback) is clipped to the same 3,000.
SLACK_HEADER_CHARS = 150
SLACK_SECTION_CHARS = 3000
SLACK_MAX_BLOCKS = 50


def slack_escape(text: str) -> str:
    """Text as Slack's mrkdwn takes it literally: ``&``, ``<`` and ``>`` are its only control characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def slack_message(notice: Notice) -> dict[str, Any]:
    """The notice as an incoming webhook's JSON body: a fallback ``text`` and Block Kit ``blocks``.

    Every value is escaped (a reason may quote ``<!channel>`` or ``<https://evil|click>``, which Slack would
    otherwise render as a mention or a link); links are the notice's http(s) ones, written ``<url|label>``.
    """
    facts = "\n".join(f"*{slack_escape(label)}:* {slack_escape(value)}" for label, value in notice.facts)
    links = "\n".join(f"<{_slack_url(url)}|{slack_escape(label).replace('|', '¦')}>" for label, url in notice.links)
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _clip(notice.subject, SLACK_HEADER_CHARS)}},
        {"type": "section", "text": {"type": "mrkdwn",
                                     "text": _clip(slack_escape(notice.headline) or "-", SLACK_SECTION_CHARS)}},
    ]
    if facts:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _clip(facts, SLACK_SECTION_CHARS)}})
    if links:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _clip(links, SLACK_SECTION_CHARS)}})
    if notice.closing:
        blocks.append({"type": "context", "elements": [
            {"type": "mrkdwn", "text": _clip(slack_escape(notice.closing), SLACK_SECTION_CHARS)}]})
    # The fallback (what a phone's notification shows): the subject, then the text below its headline.
    fallback = "\n".join([notice.subject, *notice.text.splitlines()[1:]]).strip()
    return {"text": _clip(slack_escape(fallback), SLACK_SECTION_CHARS), "blocks": blocks}


def _slack_url(url: str) -> str:
    """A link target Slack cannot misread: ``|``, ``<`` and ``>`` end or split ``<url|label>``."""
    return url.replace("|", "%7C").replace("<", "%3C").replace(">", "%3E").replace("&", "&amp;")


def delivery_key(*, group: str, run_id: str, kind: str, channel: str, detail: str = "") -> str:
    """The identity of one event's notification on one channel: the same in every try of a task.

    A retried task (or one re-run after its worker died) asks again with the same group, run, kind and
    channel, and finds the key already delivered. ``detail`` separates events of one kind in one run
    (none today). A hash, so that any run id fits a key column.
    """
    parts = json.dumps([group, run_id, kind, channel, detail], ensure_ascii=True)
    return hashlib.sha256(parts.encode()).hexdigest()


def notice_evidence(notice: Notice, *, channel: str, recipients: int, sent: bool,
                    error: str | None = None) -> dict[str, Any]:
    """What the audit records about one notification: never an address, a body or a credential."""
    evidence: dict[str, Any] = {"notice": notice.kind, "channel": channel, "recipients": recipients,
                                "subject": notice.subject, "link": notice.link, "sent": sent}
    if error is not None:
        evidence["error"] = one_line(error, 300)
    return evidence


def gate_summary(gate: Mapping[str, Any]) -> tuple[str, str]:
    """(verdict, reason) of a gate verdict's dict form, for ``approval_needed``."""
    verdict = gate.get("verdict")
    if isinstance(verdict, Mapping):  # tolerate a nested form
        verdict = verdict.get("value")
    return str(verdict or "UNKNOWN"), str(gate.get("reason") or "")
