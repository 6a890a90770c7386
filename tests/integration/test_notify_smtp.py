"""Notifications end to end on a real SMTP server: the local sink (``promshift.local.stack.smtp_sink``) as a process,
Airflow's SmtpNotifier sending to it through ``orchestration.notify``, the message read back from the sink.

The operators are the production ones, from the DAG ``build_group_dag`` makes from the shipped catalog,
whose groups mail their owners (``notify: {channel: smtp, ...}``). A sink that is not there, or one that
accepts the connection and never answers, must cost the step a warning and a ``notified`` event with
``sent: false``, never the step itself.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

import promshift
from promshift.adapters.audit_store import AuditStore
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.board import URL_PREFIX
from promshift.core.audit import AuditEvent
from promshift.core.events import EventKind
from promshift.core.stages import Stage
from promshift.local.airflow_lab import DEMO_TEAMS
from promshift.local.group_dag import build_group_dag
from promshift.local.stack.local import find_free_ports
from promshift.local.stack.smtp_sink import ReceivedMail, answers, read_mail, sink_address
from tests.fakes import FakeTI, fed

pytestmark = pytest.mark.integration

CATALOG = REPO_ROOT / "catalog" / "metric_groups.yaml"
GROUP = "gpu-memory"
OWNERS_MAIL = "gpu-platform@example.com"  # the shipped catalog's notify.to for gpu-memory
RUN_ID = "manual__2026-01-01T00:00:00+00:00"
UI = "http://airflow.test:28080"
DAG_ID = "promshift__migrate__promshift_target"  # gpu-memory's target's migration DAG: its runs' links name it


@dataclass
class LinkedTI(FakeTI):
    """A task instance as far as links need one: its ids and Airflow 3's ``log_url``."""

    dag_id: str = DAG_ID
    run_id: str = RUN_ID
    task_id: str = "approval"
    try_number: int = 1
    id: str = "0199a1b2-0000-7000-8000-000000000001"  # the task instance's UUID, which HITL keys its request by

    @property
    def log_url(self) -> str:
        return f"{UI}/dags/{self.dag_id}/runs/{quote(self.run_id)}/tasks/{self.task_id}?try_number={self.try_number}"


def context_for(op: Any) -> dict[str, Any]:
    ti = LinkedTI(task_id=op.task_id)
    return {"run_id": RUN_ID, "ti": ti, "task_instance": ti, "task": op, "dag_run": None}


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[Path]:
    """The sink as the stack runs it: ``python -m promshift.local.stack.smtp_sink``, a free port; yields its dir."""
    directory = tmp_path / "mail"
    env = dict(os.environ, PYTHONPATH=str(Path(promshift.__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, "-m", "promshift.local.stack.smtp_sink", "--dir", str(directory)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while (address := sink_address(directory)) is None or not answers(address[0], address[1]):
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else "sink exited"
            assert time.monotonic() < deadline, "the sink did not start"
            time.sleep(0.05)
        yield directory
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def smtp_conn(port: int, **extra: Any) -> str:
    return json.dumps({"conn_type": "smtp", "host": "127.0.0.1", "port": port,
                       "extra": {"from_email": "promshift@localhost", "disable_ssl": True, "disable_tls": True,
                                 "timeout": 5, "retry_limit": 0, **extra}})


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PROMSHIFT_HOME, a SQLite audit DB, the backends' connections (closed port) and the UI's base URL."""
    (tmp_path / "home").mkdir()
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 2s}\n")
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PROMSHIFT_AUDIT_URL", f"sqlite:///{tmp_path / 'audit.db'}")
    for conn in ("SOURCE", "TARGET"):
        monkeypatch.setenv(f"AIRFLOW_CONN_PROMSHIFT_{conn}", json.dumps({
            "conn_type": "prometheus", "host": "http://127.0.0.1:1",
            "extra": {"config_path": str(config), "remote_write_url": "http://127.0.0.1:1/api/v1/write"}}))
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", UI)
    # The shipped catalog's gpu-memory asks team:gpu-oncall: the demo's teams, as the Airflow Variable.
    monkeypatch.setenv("AIRFLOW_VAR_PROMSHIFT_TEAMS", json.dumps(DEMO_TEAMS))
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS",
                       ",".join(f"{user}:user" for team in DEMO_TEAMS.values() for user in team))
    for name in ("PROMSHIFT_SMTP_CONN_ID", "PROMSHIFT_NOTIFY_FROM", "PROMSHIFT_NOTIFY_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.fixture
def audit(env: Path) -> Iterator[AuditStore]:
    store = AuditStore()
    yield store
    store.engine.dispose()


@pytest.fixture
def dag() -> Any:
    dag = build_group_dag(load_catalog(CATALOG, profile="demo").get(GROUP), catalog_path=CATALOG, profile="demo")
    assert dag.dag_id == DAG_ID
    return dag


def notified(audit: AuditStore) -> list[AuditEvent]:
    return [e for e in audit.events(group=GROUP) if e.kind == EventKind.NOTIFIED]


def only_mail(directory: Path) -> ReceivedMail:
    mails = read_mail(directory)
    assert len(mails) == 1, [m.subject for m in mails]
    return mails[0]


GATE = {"verdict": "INCONCLUSIVE", "action": "ask_approval", "checks": {"parity": "INCONCLUSIVE"},
        "reason": "parity INCONCLUSIVE (golden: no data behind 2 queries)"}


def test_approval_request_is_mailed_to_the_owners_with_the_required_action_link(
        dag: Any, audit: AuditStore, sink: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", smtp_conn(sink_address(sink)[1]))  # type: ignore[index]
    op = dag.get_task("approval")
    # The approval hands its notifier who it asked (team:gpu-oncall resolved, the trigger user left out).
    notifier = op.owners_notifier("approval_needed", gate=GATE, approvers=["oncall-alice", "oncall-bob"])
    notifier(context_for(op))  # as HITLOperator.execute calls its notifiers, once the request exists

    mail = only_mail(sink)
    assert mail.rcpt_tos == (OWNERS_MAIL,) and mail.mail_from == "promshift@localhost"
    assert mail.subject == "[promshift] gpu-memory: approval needed to cut over to AMP (gate INCONCLUSIVE)"
    link = f"{UI}/dags/{DAG_ID}/runs/{RUN_ID}/tasks/approval/required_actions?map_index=-1"
    body = mail.body()
    assert f'href="{link}"' in body
    assert "parity INCONCLUSIVE (golden: no data behind 2 queries)" in body
    assert "oncall-alice, oncall-bob" in body

    [event] = notified(audit)
    assert event.stage_to is None and event.actor == "promshift"
    assert event.evidence_data == {"notice": "approval_needed", "channel": "smtp", "recipients": 1,
                                   "subject": mail.subject, "link": link, "sent": True, "attempt": 1}
    assert notifier.evidence == event.evidence_data
    assert OWNERS_MAIL not in json.dumps(event.evidence_data)

    # The approval task's next try (Airflow retried it) runs its notifiers again: the owners are not mailed twice.
    retried = context_for(op)
    retried["ti"].try_number = retried["task_instance"].try_number = 2
    again = op.owners_notifier("approval_needed", gate=GATE)
    again(retried)
    assert again.evidence is None
    assert len(read_mail(sink)) == 1 and len(notified(audit)) == 1


def test_rollback_mails_why_and_the_task_log_link_verbatim(
        dag: Any, audit: AuditStore, sink: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", smtp_conn(sink_address(sink)[1]))  # type: ignore[index]
    # A reason quoting text that looks like a Jinja template: it must arrive as written, not rendered.
    audit.append(group=GROUP, run_id=RUN_ID, kind="validation_failed", actor="promshift", at=datetime.now(UTC),
                 evidence={"reason": "source {{ 7 * 7 }} <down>"}, stage_from=None, stage_to=None)
    op = fed(dag, "rollback")
    result = op.execute(context_for(op))
    assert result["performed"] is False

    mail = only_mail(sink)
    assert mail.subject == "[promshift] gpu-memory: rolled back: validation failed: source {{ 7 * 7 }} <down>"
    body = mail.body()
    assert "nothing to restore: nothing was deployed" in body
    assert f'href="{UI}/dags/{DAG_ID}/runs/{quote(RUN_ID)}/tasks/rollback?try_number=1"' in body
    assert "source {{ 7 * 7 }} &lt;down&gt;" in body and "49" not in mail.subject
    assert [e.kind for e in audit.events(group=GROUP)] == ["validation_failed", "rollback_not_needed",
                                                           EventKind.NOTIFIED, "report_published"]
    assert notified(audit)[0].evidence_data["sent"] is True


def test_unreachable_smtp_server_costs_the_rollback_a_warning_not_the_step(
        dag: Any, audit: AuditStore, env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    [closed] = find_free_ports(1)
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", smtp_conn(closed))
    op = fed(dag, "rollback")
    started = time.monotonic()
    result = op.execute(context_for(op))
    assert time.monotonic() - started < 10
    assert result["performed"] is False
    assert audit.stage_of(GROUP) == Stage.PLANNED
    [event] = notified(audit)
    assert event.evidence_data["sent"] is False
    assert event.evidence_data["error"].startswith("ConnectionRefusedError")
    assert event.evidence_data["recipients"] == 1 and event.evidence_data["channel"] == "smtp"


def test_a_server_that_never_answers_is_given_up_on_after_the_timeout(
        dag: Any, audit: AuditStore, env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A black hole: accepts the TCP connection and never sends the SMTP greeting."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        hole.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(hole.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", smtp_conn(hole.getsockname()[1], timeout=60))
        monkeypatch.setenv("PROMSHIFT_NOTIFY_TIMEOUT", "2")
        op = fed(dag, "rollback")
        started = time.monotonic()
        op.execute(context_for(op))
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        hole.close()
    assert accepted, "the notifier never connected"
    assert 2 <= elapsed < 8
    [event] = notified(audit)
    assert event.evidence_data["sent"] is False
    assert event.evidence_data["error"] == "TimeoutError: no answer within 2s (left to finish in the background)"


def test_a_group_without_a_channel_sends_and_records_nothing(
        dag: Any, audit: AuditStore, sink: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", smtp_conn(sink_address(sink)[1]))  # type: ignore[index]
    quiet = tmp_path / "catalog" / "metric_groups.yaml"
    quiet.parent.mkdir()
    quiet.write_text(CATALOG.read_text().replace("notify: {channel: smtp, to: [gpu-platform@example.com]}",
                                                 "notify: {channel: none}"))
    shutil.copytree(CATALOG.parent / "dashboards", quiet.parent / "dashboards")
    quiet_dag = build_group_dag(load_catalog(quiet, profile="demo").get(GROUP), catalog_path=quiet, profile="demo")
    op = fed(quiet_dag, "rollback")
    op.execute(context_for(op))
    assert read_mail(sink) == []
    assert notified(audit) == []


def test_the_approval_task_mails_once_its_request_exists_then_waits(
        dag: Any, audit: AuditStore, sink: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real ``execute``: HITL writes the request (stubbed: it needs Airflow's API), runs the notifiers, waits."""
    from airflow.providers.standard.operators import hitl
    from airflow.sdk.exceptions import TaskAwaitingInput

    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", smtp_conn(sink_address(sink)[1]))  # type: ignore[index]
    order: list[str] = []
    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **kwargs: order.append("request:" + kwargs["subject"]))
    gate = {**GATE, "verdict": "SUCCESSFUL", "reason": "every check passed"}
    op = fed(dag, "approval", gate_evidence={"gate": gate})  # the gate task's output: its whole evidence
    with pytest.raises(TaskAwaitingInput):
        op.execute(context_for(op))
    mail = only_mail(sink)
    assert order == ["request:[SUCCESSFUL] Cut over metric group gpu-memory to AMP?"]
    assert mail.subject == "[promshift] gpu-memory: approval needed to cut over to AMP (gate SUCCESSFUL)"
    assert "every check passed" in mail.body() and "/tasks/approval/required_actions" in mail.body()
    assert f'href="{UI}{URL_PREFIX}/groups/gpu-memory">The evidence on the migration board</a>' in mail.body()
    [event] = notified(audit)
    assert event.evidence_data["sent"] is True and event.evidence_data["notice"] == "approval_needed"


def test_an_approval_whose_mail_fails_still_waits_for_its_answer(
        dag: Any, audit: AuditStore, env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.standard.operators import hitl
    from airflow.sdk.exceptions import TaskAwaitingInput

    monkeypatch.delenv("AIRFLOW_CONN_SMTP_DEFAULT", raising=False)  # no SMTP connection at all
    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **kwargs: None)
    op = fed(dag, "approval", gate_evidence={"gate": GATE})
    with pytest.raises(TaskAwaitingInput):
        op.execute(context_for(op))
    [event] = notified(audit)
    assert event.evidence_data["sent"] is False
    assert event.evidence_data["error"] == "AirflowException: SMTP connection is not found."


def test_a_rollback_that_fails_mails_rollback_failed_and_still_fails(
        dag: Any, audit: AuditStore, sink: Path, env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot is gone and the source does not answer its reload: the rollback fails, the owners are told."""
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", smtp_conn(sink_address(sink)[1]))  # type: ignore[index]
    snapshot = {"snapshot_path": str(env / "gone.yml"), "sha256": "0" * 64, "config_path": str(env / "prometheus.yml")}
    op = fed(dag, "rollback", snapshot=snapshot)
    with pytest.raises(Exception) as failure:  # noqa: B017 - whatever the source's client raises
        op.execute(context_for(op))
    mail = only_mail(sink)
    assert mail.subject.startswith("[promshift] gpu-memory: ROLLBACK FAILED: ")
    assert type(failure.value).__name__ in mail.body()
    assert "The source config may still carry the group&#x27;s dual-write entry" in mail.body()
    kinds = [e.kind for e in audit.events(group=GROUP)]
    assert kinds == ["rollback_failed", EventKind.NOTIFIED], kinds
    assert notified(audit)[0].evidence_data["notice"] == "rollback_failed"
