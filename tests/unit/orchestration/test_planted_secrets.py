"""A secret never enters a record: one distinctive secret planted in every connection, URL and webhook promshift
reads, then everything written is searched for it.

- ``plan`` with the source URL carrying ``user:SECRET@``, and the source's answers quoting URLs with the secret
  (userinfo, a token parameter, a Slack webhook path): every file it writes, its stdout/stderr and its log;
- a notification (what every migration step sends) through a Slack webhook whose path holds the secret, to a
  contract server whose error page echoes the path: the evidence, the audit database's bytes, the delivery
  table, the step's warnings and the log;
- a catalog with a Slack webhook URL (the secret in its path) typed where a connection id belongs: ``catalog
  check``'s output, the DAG file's log and the ``promshift__catalog_errors`` DAG as Airflow serializes it (docs,
  params, tasks);
- a git source whose URL carries the secret as user name or password: the refusal's line.

Each part first checks the secret really reached the code (the server received it, the catalog names it), so a
part that never saw the secret cannot pass.
"""

from __future__ import annotations

import json
import logging
import runpy
from pathlib import Path
from typing import Any

import pytest
import yaml

from promshift.adapters.audit_store import AuditStore
from promshift.cli import main
from tests.slack_webhook import slack_conn, slack_webhook
from tests.unit.cli.test_bad_inputs import GOOD_LOG_LINE, GOOD_RULE_FILE, _Source
from tests.unit.core.test_notify_once import context, step

REPO = Path(__file__).resolve().parents[3]
SECRET = "PLANTEDs3cr3tZq7XwV"


def _no_secret(where: str, text: str | bytes) -> None:
    found = SECRET.encode() in text if isinstance(text, bytes) else SECRET in text
    assert not found, f"the secret is in {where}"


def test_plan_writes_no_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               caplog: pytest.LogCaptureFixture) -> None:
    answers = {
        "/api/v1/status/tsdb": json.dumps({"status": "error", "errorType": "unavailable",
                                           "error": f"proxy https://svc:{SECRET}@10.0.0.1/tsdb refused"}),
        "/api/v1/metadata": json.dumps({"status": "error", "error": f"see /api/v1/metadata?token={SECRET}"}),
        "/api/v1/rules": json.dumps({"status": "error", "error": f"alert to https://hooks.slack.com/services/T0/B0/"
                                                                 f"{SECRET} failed"}),
    }
    source = _Source(answers)
    (tmp_path / "q.log").write_text(GOOD_LOG_LINE)
    (tmp_path / "r.yml").write_text(GOOD_RULE_FILE)
    url = source.url.replace("http://", f"http://promshift:{SECRET}@")
    out = tmp_path / "plan"
    caplog.set_level(logging.DEBUG)
    try:
        code = main(["plan", "--source", url, "--query-log", str(tmp_path / "q.log"), "--rule-file",
                     str(tmp_path / "r.yml"), "--prices", str(REPO / "catalog" / "amp_prices.yaml"), "--out", str(out)])
    finally:
        source.close()
    printed = capsys.readouterr()
    assert code == 2, printed.err  # partial: the TSDB status, metadata and rules could not be read
    assert "REDACTED" in (out / "plan.md").read_text()  # the notes quoting the secret were written, redacted
    for path in out.iterdir():
        _no_secret(str(path), path.read_bytes())
    _no_secret("stdout", printed.out)
    _no_secret("stderr", printed.err)
    _no_secret("the log", caplog.text)


def test_a_failing_webhook_records_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    from promshift.orchestration.notify import tell_owners

    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PROMSHIFT_AUDIT_URL", f"sqlite:///{tmp_path / 'audit.db'}")
    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    caplog.set_level(logging.DEBUG)
    store = AuditStore()
    try:
        with slack_webhook(path=f"/services/T0PROMSHIFT/B0NOTIFY/{SECRET}") as hook:
            hook.echo_path = True
            hook.script.append((500, "rollup_error", {}))
            monkeypatch.setenv("AIRFLOW_CONN_SLACK_DEFAULT", slack_conn(hook))
            asking = step("slack")
            evidence = tell_owners(asking, context(), "rolled_back", reason="parity FAILED",
                                   result={"performed": True, "restored_identical": True, "method": "reload"})
        assert hook.received and SECRET in hook.received[0].path  # the secret did go out, to the webhook
        assert evidence is not None and evidence["sent"] is False and "rollup_error" in evidence["error"]
        _no_secret("the notification evidence", json.dumps(evidence))
        _no_secret("the step's warnings", "\n".join(asking.warnings))
        _no_secret("the log", caplog.text)
        with store.engine.connect() as conn:
            from sqlalchemy import text

            tables = [row[0] for row in conn.execute(text("SELECT name FROM sqlite_master WHERE type='table'"))]
            assert tables
            for table in tables:
                rows = conn.execute(text(f'SELECT * FROM "{table}"')).fetchall()  # noqa: S608 - our own names
                _no_secret(f"audit table {table}", repr(rows))
    finally:
        store.engine.dispose()
    _no_secret("the audit database file", (tmp_path / "audit.db").read_bytes())


def test_a_webhook_url_in_the_connection_field_stays_out_of_the_catalog_errors_dag(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization

    from promshift.core.catalog import CATALOG_ERRORS_DAG_ID

    doc = yaml.safe_load((REPO / "catalog" / "metric_groups.yaml").read_text())
    victim = next(g for g in doc["groups"] if g["name"] == "gpu-memory")
    victim["source"] = f"https://hooks.slack.com/services/T0PROMSHIFT/B0NOTIFY/{SECRET}"
    catalog = tmp_path / "metric_groups.yaml"
    catalog.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert SECRET in catalog.read_text()
    monkeypatch.delenv("PROMSHIFT_PROFILE", raising=False)
    assert main(["catalog", "check", str(catalog)]) == 1
    printed = capsys.readouterr()
    assert "gpu-memory" in printed.out and "REDACTED" in printed.out
    _no_secret("catalog check's output", printed.out + printed.err)

    monkeypatch.setenv("PROMSHIFT_CATALOG", str(catalog))
    monkeypatch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)
    caplog.set_level(logging.DEBUG)
    dags: dict[str, Any] = {v.dag_id: v for v in runpy.run_path(str(REPO / "dags" / "promshift_groups.py")).values()
                            if isinstance(v, DAG)}
    errors = dags[CATALOG_ERRORS_DAG_ID]
    serialized = json.dumps(DagSerialization.to_dict(errors), default=str)
    assert "gpu-memory" in serialized and "REDACTED" in serialized
    _no_secret("the catalog_errors DAG", serialized)
    _no_secret("the DAG file's log", caplog.text)


@pytest.mark.parametrize("url", [f"https://{SECRET}@git.example/acme/monitoring.git",
                                 f"HTTPS://bot:{SECRET}@git.example/acme/monitoring.git",
                                 f"https://git.example/acme/monitoring.git?access_token={SECRET} x"])
def test_a_git_url_with_the_secret_is_refused_without_it(url: str) -> None:
    from promshift.core.git_source import git_source_of

    with pytest.raises(ValueError) as refused:
        git_source_of({"git": {"url": url, "path": "values.yaml", "shape": "helm-values"}})
    _no_secret("the refusal", str(refused.value))
