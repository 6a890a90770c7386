"""End to end on the local AWS: ``make demo TARGET=amp`` through Airflow, and no secret left anywhere (issue 9).

The tester's pair is set in the environment (made up here, as a tester would pick one). The
happy run must cut over with every read and write signed and verified by the front door; the
bad-credentials run (Airflow signs with another secret) must stop at validate with nothing
deployed. After each, neither the secret key nor any ``Signature=`` value may appear anywhere
under PROMSHIFT_HOME (stack logs, Airflow's task logs and database with its XComs, the audit
DB, snapshots, configs) or the report directory, nor in what the demo printed.

Session: each run has an Airflow of its own (``run_demo``, as ``make demo``); tests/e2e/conftest.py says why.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import promshift.local.demo
from promshift.local.demo import QUICK_PROFILE, run_demo
from promshift.local.stack.local import LocalStack, StackConfig
from promshift.local.stack.sigv4 import AwsCredentials
from tests.e2e.conftest import free_port, stop_stack

pytestmark = pytest.mark.e2e

ACCESS_KEY = "AKIAE2EAMPDEMO000001"
SECRET = "e2eAmpDemoSecretKey/0123456789abcdefghij"
# What the bad-credentials scenario gives Airflow instead (searched for too).
WRONG_SECRET = "e2eAmpDemoWrongSecret/0123456789abcdefgh"
SIGNATURE = re.compile(rb"Signature=[0-9a-fA-F]{16,}")
# Stack, Airflow start and the run: the default 9 minutes ran out at the approval on a machine loaded 3-6x over.
RUN_TIMEOUT_S = 900.0


@pytest.fixture
def amp_env(small_stack_env: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    return small_stack_env


def secrets_found(roots: list[Path], printed: str, secrets: tuple[str, ...]) -> list[str]:
    """Every file (bytes, so SQLite databases and their WAL too) and the printed output holding a secret."""
    found = []
    files = [p for root in roots for p in root.rglob("*") if p.is_file()]
    assert len(files) > 20, files  # the search looked at a real run's files
    for path in files:
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # a SQLite -wal/-journal checkpointed away as the last connection closed
            continue
        found += [f"{path}: {s[:6]}..." for s in secrets if s.encode() in data]
        if SIGNATURE.search(data):
            found.append(f"{path}: Signature=")
    found += [f"printed: {s[:6]}..." for s in secrets if s in printed]
    if SIGNATURE.search(printed.encode()):
        found.append("printed: Signature=")
    return found


def xcom_values(home: Path) -> list[str]:
    """Every XCom value in Airflow's own database (the files are searched too; this proves XComs were there)."""
    with sqlite3.connect(home / "airflow" / "airflow.db") as db:
        return [str(v) for (v,) in db.execute("SELECT value FROM xcom")]


def task_logs(home: Path) -> list[Path]:
    return [p for p in (home / "airflow" / "logs").rglob("*") if p.is_file() and p.stat().st_size > 0]


@dataclass
class Run:
    report: dict[str, Any]
    out: Path
    printed: str  # what the demo printed and logged
    source_config: str  # the source config file after the run


def run(env: Path, scenario: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> Run:
    caplog.set_level(logging.INFO)
    try:
        out = run_demo(group_name="gpu-memory", scenario=scenario, nodes=12, airflow_port=free_port(),
                       report_root=env / "reports", target_kind="amp", timeout_s=RUN_TIMEOUT_S,
                       profile=QUICK_PROFILE)
        source_config = LocalStack(StackConfig.from_env(target_kind="amp")).source_config_path.read_text()
    finally:
        stop_stack()
    printed = capsys.readouterr()
    return Run(json.loads((out / "report.json").read_text()), out, printed.out + printed.err + caplog.text,
               source_config)


def test_amp_demo_cuts_over_signed_and_leaves_no_secret(amp_env: Path, capsys: pytest.CaptureFixture[str],
                                                        caplog: pytest.LogCaptureFixture) -> None:
    result = run(amp_env, "happy", capsys, caplog)
    report, out, printed = result.report, result.out, result.printed
    home = amp_env / "state"
    assert report["final_stage"] == "cut_over", report["summary"]
    assert [s["stage"] for s in report["stages"]] == ["dual_writing", "warming", "verified", "approved", "cut_over"]
    target = report["target"]
    assert target["kind"] == "amp" and target["region"] == "us-east-1"
    assert re.fullmatch(r"ws-[0-9a-f-]{36}", target["workspace_id"])
    # Reads (validate, warm-up, parity, latency) and the relay's writes all went through the front door, signed.
    assert target["sigv4_verified"] > 0 and target["sigv4_rejected"] == 0, target
    assert target["control_plane"]["verified"] > 0 and target["control_plane"]["rejected"] == 0, target
    assert report["parity"]["verdict"] == "SUCCESSFUL" and report["parity"]["points_compared"] > 0
    assert report["latency"]["verdict"] == "SUCCESSFUL"
    # The dual-write entry is a sigv4 one (no credentials in it), written to the signing relay.
    assert report["deploy"]["sigv4"] == {"region": "us-east-1"}
    assert report["deploy"]["url"].endswith("/api/v1/write")
    assert "sigv4:" in result.source_config and 'region: "us-east-1"' in result.source_config  # quoted by the editor
    assert f"Target: AMP workspace {target['workspace_id']} in us-east-1: front door verified" in printed
    assert f"AMP workspace {target['workspace_id']} in us-east-1" in (out / "report.md").read_text()
    # No secret anywhere; and the places searched did hold the run's logs and XComs.
    assert any("target_backend" in v for v in xcom_values(home))
    assert any("signed" in p.read_text(errors="replace") or "AMP" in p.read_text(errors="replace")
               for p in task_logs(home))
    assert not (home / "amp" / "credentials.json").exists()  # the stack used the tester's pair, made none up
    assert secrets_found([home, out], printed + result.source_config, (SECRET,)) == []


def test_amp_bad_credentials_stop_at_validate_with_nothing_deployed(amp_env: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str],
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(promshift.local.demo, "make_up_credentials", lambda: AwsCredentials(ACCESS_KEY, WRONG_SECRET))
    result = run(amp_env, "bad-credentials", capsys, caplog)
    report, out, printed = result.report, result.out, result.printed
    home = amp_env / "state"
    assert report["final_stage"] == "planned" and report["stages"] == []
    reason = report["validation"]["reason"]
    assert report["validation"]["ok"] is False
    assert reason.endswith("AWS refused the credentials' signature (InvalidSignatureException)"), reason
    assert report["summary"] == f"Stopped at validate, nothing deployed: {reason}."
    assert report["rollback"] == {"performed": False, "restored_identical": None,
                                  "reason": f"validation failed: {reason}"}
    assert report["deploy"] == {}
    sc = report["source_config"]
    assert sc["identical"] is True and sc["sha256_before"] == sc["sha256_after"]
    assert "remote_write" not in yaml.safe_load(result.source_config)  # no dual-write entry was ever deployed
    assert f"sha256 before {sc['sha256_before']}, after {sc['sha256_after']} (identical)" in printed
    target = report["target"]
    assert target["kind"] == "amp" and target["sigv4_verified"] == 0
    assert target["control_plane"]["rejected_by_reason"].get("signature_mismatch", 0) > 0, target
    assert any(reason in p.read_text(errors="replace") for p in task_logs(home))  # the task's exception text
    assert secrets_found([home, out], printed + result.source_config, (SECRET, WRONG_SECRET)) == []
