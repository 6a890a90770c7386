"""The SMTP sink as a component of the local stack: `up` starts it, a second `up` reuses it, `down` stops it,
and ``smtp_connection_env()`` is an Airflow SMTP connection that reaches it (what the demo gives Airflow)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from promshift.core import notify as notices
from promshift.core.catalog import NotifyPolicy
from promshift.local.stack.local import MAIL, LocalStack, StackConfig, StackError
from promshift.local.stack.smtp_sink import answers
from promshift.orchestration.notify import NotifySettings, send

pytestmark = pytest.mark.integration


def test_stack_runs_the_sink_and_its_connection_delivers_a_notification(
        stack_config_factory: Callable[..., StackConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    stack = LocalStack(stack_config_factory(nodes=2))
    try:
        status = stack.up(timeout=90)
        row = status[MAIL]
        assert row["alive"] and row["healthy"], row
        port = stack.smtp_port
        assert port > 0 and row["url"] == f"smtp://127.0.0.1:{port}"
        assert answers("127.0.0.1", port)

        env = stack.smtp_connection_env()
        assert list(env) == ["AIRFLOW_CONN_SMTP_DEFAULT"]
        conn = json.loads(env["AIRFLOW_CONN_SMTP_DEFAULT"])
        assert (conn["conn_type"], conn["host"], conn["port"]) == ("smtp", "127.0.0.1", port)
        assert "password" not in conn and "login" not in conn

        for name, value in env.items():
            monkeypatch.setenv(name, value)
        notice = notices.rolled_back(group="gpu-memory", run_id="r1", reason="parity FAILED", performed=True,
                                     restored_identical=True, log_url="http://127.0.0.1:28080/dags/d/runs/r1")
        policy = NotifyPolicy(channel="smtp", to=("gpu-platform@example.com", "datacenter-ops@example.com"))
        evidence = send(policy, notice, {}, settings=NotifySettings(timeout_s=20))
        assert evidence["sent"] is True, evidence
        [mail] = stack.mail()
        assert mail.subject == "[promshift] gpu-memory: rolled back: parity FAILED"
        assert mail.rcpt_tos == ("gpu-platform@example.com", "datacenter-ops@example.com")
        assert 'href="http://127.0.0.1:28080/dags/d/runs/r1"' in mail.body()

        pid = row["pid"]
        again = stack.up(timeout=60)
        assert (again[MAIL]["pid"], stack.smtp_port) == (pid, port), "a second up must reuse the sink"
    finally:
        stack.down()
    assert not Path(f"/proc/{pid}").exists() or not answers("127.0.0.1", port)
    assert not stack.pid_path(MAIL).exists()
    assert stack.status()[MAIL]["alive"] is False
    with pytest.raises(StackError, match="the SMTP sink is not running"):
        stack.smtp_connection_env()
    stack.reset()
    assert not stack.mail_dir.exists()


def test_a_fixed_smtp_port_is_used_and_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMSHIFT_SMTP_PORT", "2526")
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path))
    config = StackConfig.from_env()
    assert config.smtp_port == 2526 and LocalStack(config).smtp_port == 2526
    with pytest.raises(ValueError, match="ports must differ"):
        StackConfig(home=tmp_path, smtp_port=9090)
    monkeypatch.delenv("PROMSHIFT_SMTP_PORT")
    assert StackConfig.from_env().smtp_port == 0  # default: any free port, chosen by the sink
