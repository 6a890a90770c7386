"""FileConfigDeployer against a real Prometheus: deploy, reload, verify, restore; bad configs rejected."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.deploy import DeployError, FileConfigDeployer
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.render import (
    add_remote_write,
    remote_write_entry,
    remote_write_names,
    remove_remote_write,
    sha256_bytes,
)
from promshift.local.stack.local import find_free_ports
from promshift.local.stack.prometheus import PrometheusProcess
from promshift.orchestration.compose import compose_migration

pytestmark = pytest.mark.integration

BASE = b"""# hand-written by the fleet team; comments and order must survive a rollback
global:
  scrape_interval: 5s
  external_labels: {cluster: test}
scrape_configs:
  - job_name: self
    static_configs: [{targets: ['127.0.0.1:1']}]
"""


def free_port() -> int:
    return find_free_ports(1)[0]


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[PrometheusClient, Path]]:
    cfg = tmp_path / "prometheus.yml"
    cfg.write_bytes(BASE)
    # Environment as the test runs: a test that sets AWS_* variables first gives them to the server.
    with PrometheusProcess("prometheus", tmp_path, port=free_port(), config=cfg, data_dir=tmp_path / "data",
                           flags=("--web.enable-lifecycle",)) as prometheus:
        yield PrometheusClient(prometheus.url, timeout_s=30), cfg


def entry(regex: str = "DCGM_FI_DEV_FB_(FREE|USED)") -> dict:
    return remote_write_entry(group_name="gpu-memory", name_regex=regex, url="http://127.0.0.1:9/api/v1/write")


def test_deploy_reloads_verifies_and_restore_is_byte_identical(prometheus: tuple[PrometheusClient, Path]) -> None:
    client, cfg = prometheus
    deployer = FileConfigDeployer(cfg, client)
    snap = deployer.snapshot()
    result = deployer.deploy(add_remote_write(BASE, entry()), snapshot=snap,
                             expect_remote_writes={"promshift-gpu-memory"})
    assert "promshift-gpu-memory" in result.live_remote_writes
    assert remote_write_names(client.config_text()) == ["promshift-gpu-memory"]
    assert deployer.restore(snap) is True
    assert cfg.read_bytes() == BASE
    assert remote_write_names(client.config_text()) == []


def test_promtool_rejection_leaves_the_file_and_server_untouched(prometheus: tuple[PrometheusClient, Path]) -> None:
    client, cfg = prometheus
    deployer = FileConfigDeployer(cfg, client)
    snap = deployer.snapshot()
    bad = add_remote_write(BASE, entry(regex="DCGM_FI_DEV_(("))
    with pytest.raises(DeployError, match="promtool rejected"):
        deployer.deploy(bad, snapshot=snap, expect_remote_writes={"promshift-gpu-memory"})
    assert cfg.read_bytes() == BASE
    assert remote_write_names(client.config_text()) == []


def test_reload_failure_restores_the_snapshot(prometheus: tuple[PrometheusClient, Path]) -> None:
    """A config promtool accepts but the server rejects: the old one keeps running, the file is restored."""
    client, cfg = prometheus
    deployer = FileConfigDeployer(cfg, client)
    # promtool resolves rule files when checking; skip it to reach the server's own rejection.
    deployer.check = lambda text: None  # type: ignore[method-assign]
    snap = deployer.snapshot()
    bad = BASE + b"remote_write: [{url: 'http://x', name: dup}, {url: 'http://y', name: dup}]\n"
    with pytest.raises(DeployError, match="reload rejected"):
        deployer.deploy(bad, snapshot=snap, expect_remote_writes={"dup"})
    assert sha256_bytes(cfg.read_bytes()) == snap.sha256
    assert "\nprometheus_config_last_reload_successful 1\n" in client.metrics_text()


def test_changed_file_since_snapshot_is_refused(prometheus: tuple[PrometheusClient, Path]) -> None:
    client, cfg = prometheus
    deployer = FileConfigDeployer(cfg, client)
    snap = deployer.snapshot()
    cfg.write_bytes(BASE + b"# someone else edited this\n")
    with pytest.raises(DeployError, match="changed since the snapshot"):
        deployer.deploy(add_remote_write(BASE, entry()), snapshot=snap, expect_remote_writes=set())


def test_unreachable_backend_is_a_clear_error() -> None:
    client = PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    with pytest.raises(PrometheusError, match="unreachable"):
        client.query("up")
    assert client.ready() is False


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials in the server's environment (set before ``prometheus`` starts it)."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDPROMSHIFTTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret")


AMP_ENTRY = remote_write_entry(group_name="gpu-memory", name_regex="DCGM_FI_DEV_FB_(FREE|USED)",
                               url="http://127.0.0.1:9/api/v1/write",
                               sigv4={"region": "us-east-1", "role_arn": "arn:aws:iam::123456789012:role/promshift"})


def test_an_amp_entry_without_aws_credentials_on_the_server_is_reverted(
        prometheus: tuple[PrometheusClient, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured on Debian's 2.42: a sigv4 entry loads only if the server finds AWS credentials
    (it then still sends unsigned, hence the local signing relay); without them the reload fails."""
    client, cfg = prometheus
    deployer = FileConfigDeployer(cfg, client)
    with pytest.raises(DeployError, match="failed and was reverted: .*reload rejected"):
        deployer.deploy(add_remote_write(BASE, AMP_ENTRY), snapshot=deployer.snapshot(),
                        expect_remote_writes={"promshift-gpu-memory"})
    assert cfg.read_bytes() == BASE
    assert remote_write_names(client.config_text()) == []


def test_an_amp_entry_with_sigv4_passes_promtool_and_goes_live(aws_env: None,
                                                               prometheus: tuple[PrometheusClient, Path]) -> None:
    """The AMP form of the entry (sigv4 + AMP's queue settings) passes the real promtool and loads."""
    import yaml

    from promshift.core.render import AMP_QUEUE_CONFIG

    client, cfg = prometheus
    deployer = FileConfigDeployer(cfg, client)
    snap = deployer.snapshot()
    amp = AMP_ENTRY
    result = deployer.deploy(add_remote_write(BASE, amp), snapshot=snap, expect_remote_writes={"promshift-gpu-memory"})
    assert "promshift-gpu-memory" in result.live_remote_writes
    [live] = yaml.safe_load(client.config_text())["remote_write"]
    assert live["sigv4"] == {"region": "us-east-1", "role_arn": "arn:aws:iam::123456789012:role/promshift"}
    assert {k: live["queue_config"][k] for k in AMP_QUEUE_CONFIG} == dict(AMP_QUEUE_CONFIG)
    assert deployer.restore(snap) is True
    # promtool really checks the block: a field sigv4 does not have is refused.
    bad = add_remote_write(BASE, amp).replace(b'region: "us-east-1"', b'region: "us-east-1"\n      regoin: typo')
    with pytest.raises(DeployError, match=r"promtool rejected(.|\n)*field regoin not found in type sigv4"):
        deployer.deploy(bad, snapshot=deployer.snapshot(), expect_remote_writes={"promshift-gpu-memory"})
    assert cfg.read_bytes() == BASE


# -- the deployer respects the file ----------------------------------------------------------------

CORPUS = Path(__file__).resolve().parents[1] / "data" / "configs"


def test_a_symlinked_config_keeps_its_link_and_the_target_gets_the_bytes(
        prometheus: tuple[PrometheusClient, Path], tmp_path: Path) -> None:
    client, cfg = prometheus
    real = tmp_path / "managed" / "prometheus.yml"
    real.parent.mkdir()
    real.write_bytes(BASE)
    cfg.unlink()
    cfg.symlink_to(real)
    deployer = FileConfigDeployer(cfg, client)
    snap = deployer.snapshot()
    deployer.deploy(add_remote_write(BASE, entry()), snapshot=snap, expect_remote_writes={"promshift-gpu-memory"})
    assert cfg.is_symlink() and os.readlink(cfg) == str(real)
    assert b"promshift-gpu-memory" in real.read_bytes()
    assert [p.name for p in real.parent.iterdir()] == ["prometheus.yml"]  # no temp file left behind
    assert deployer.restore(snap) is True
    assert cfg.is_symlink() and os.readlink(cfg) == str(real)
    assert real.read_bytes() == BASE


def test_owner_group_and_mode_are_kept_through_deploy_and_restore(prometheus: tuple[PrometheusClient, Path]) -> None:
    """The sandbox runs as root: the file belongs to another uid/gid, mode 0640."""
    client, cfg = prometheus
    assert os.getuid() == 0, "this test chowns to another user"
    os.chown(cfg, 4321, 8765)
    os.chmod(cfg, 0o640)
    deployer = FileConfigDeployer(cfg, client)
    snap = deployer.snapshot()
    assert (snap.mode, snap.uid, snap.gid) == (0o640, 4321, 8765)
    deployer.deploy(add_remote_write(BASE, entry()), snapshot=snap, expect_remote_writes={"promshift-gpu-memory"})
    st = cfg.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (4321, 8765, 0o640)
    # Someone loosens the mode while dual-write runs: restoring the snapshot brings its mode back.
    os.chmod(cfg, 0o666)
    assert deployer.matches(snap) is False
    assert deployer.restore(snap) is True
    st = cfg.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777, cfg.read_bytes()) == (4321, 8765, 0o640, BASE)


@pytest.mark.parametrize("failure", [KeyError("data"), ValueError("Expecting value: line 1 column 1 (char 0)"),
                                     KeyboardInterrupt()], ids=lambda e: type(e).__name__)
def test_any_failure_after_the_write_restores_the_snapshot(prometheus: tuple[PrometheusClient, Path],
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           failure: BaseException) -> None:
    """status/config answering HTML or a body without ``data`` (not a PrometheusError) still reverts."""
    client, cfg = prometheus
    deployer = FileConfigDeployer(cfg, client)
    snap = deployer.snapshot()
    real_config_text = client.config_text

    def broken() -> str:
        raise failure

    monkeypatch.setattr(client, "config_text", broken)
    expected: type[BaseException] = KeyboardInterrupt if isinstance(failure, KeyboardInterrupt) else DeployError
    with pytest.raises(expected) as excinfo:
        deployer.deploy(add_remote_write(BASE, entry()), snapshot=snap, expect_remote_writes={"promshift-gpu-memory"})
    if expected is DeployError:
        assert f"failed and was reverted: {type(failure).__name__}" in str(excinfo.value)
    monkeypatch.setattr(client, "config_text", real_config_text)
    assert cfg.read_bytes() == BASE
    assert remote_write_names(client.config_text()) == []  # the old config was reloaded


def test_url_credentials_stay_in_the_file_and_out_of_errors(prometheus: tuple[PrometheusClient, Path]) -> None:
    client, cfg = prometheus
    secret = "rw-T0KEN-42"
    deployer = FileConfigDeployer(cfg, client)
    bad = remote_write_entry(group_name="gpu-memory", name_regex="DCGM_((", url=f"http://u:{secret}@127.0.0.1:9/w")
    with pytest.raises(DeployError, match="promtool rejected") as excinfo:
        deployer.deploy(add_remote_write(BASE, bad), snapshot=deployer.snapshot(), expect_remote_writes=set())
    assert secret not in str(excinfo.value)
    good = remote_write_entry(group_name="gpu-memory", name_regex="x", url=f"http://u:{secret}@127.0.0.1:9/w")
    deployer.deploy(add_remote_write(BASE, good), snapshot=deployer.snapshot(),
                    expect_remote_writes={"promshift-gpu-memory"})
    assert secret.encode() in cfg.read_bytes()  # the entry has to work


def promtool_accepts(path: Path) -> tuple[bool, str]:
    proc = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    return proc.returncode == 0, (proc.stderr or proc.stdout).strip()


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.yml")), ids=lambda p: p.name)
def test_corpus_edits_pass_promtool_and_round_trip_through_a_live_server(
        prometheus: tuple[PrometheusClient, Path], path: Path) -> None:
    """Each corpus config goes live, gets our entry (checked by the real promtool, loaded, verified),
    loses it again by name, and ends byte-identical to the original."""
    client, cfg = prometheus
    original = path.read_bytes()
    ok, why = promtool_accepts(path)
    assert ok, f"corpus file {path.name} must be a config promtool accepts: {why}"
    cfg.write_bytes(original)
    client.reload()
    deployer = FileConfigDeployer(cfg, client)
    for amp in (False, True):
        edited = add_remote_write(original, AMP_ENTRY if amp else entry())
        edited_path = cfg.parent / f"edited-{path.name}"
        edited_path.write_bytes(edited)
        ok, why = promtool_accepts(edited_path)
        assert ok, f"promtool rejects {path.name} with our {'AMP ' if amp else ''}entry: {why}"
    deployer.deploy(add_remote_write(original, entry()), snapshot=deployer.snapshot(),
                    expect_remote_writes={"promshift-gpu-memory"})
    removed = remove_remote_write(cfg.read_bytes(), "promshift-gpu-memory")
    deployer.deploy(removed, snapshot=deployer.snapshot(), expect_remote_writes=set(),
                    expect_absent={"promshift-gpu-memory"})
    assert cfg.read_bytes() == original


# -- the migration's snapshot, rollback and records ------------------------------------------------

SECRET = "T0KEN-that-must-never-be-recorded"


def self_group() -> Any:
    """The catalog's gpu-memory group, keeping only ``up`` (the fixture's server scrapes one target)."""
    from promshift.adapters.settings import REPO_ROOT, load_catalog

    group = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get("gpu-memory")
    return dataclasses.replace(group, metrics=("up",), metric_regex=None)


def migration_for(client: PrometheusClient, cfg: Path, tmp_path: Path, *, secret_urls: bool = False) -> Any:
    from promshift.adapters.audit_store import AuditStore
    from promshift.adapters.routing import RoutingStore
    from promshift.steps.migration import Backends

    source_url = identity_url = client.base_url
    remote_write = f"{source_url}/api/v1/write"
    if secret_urls:  # Prometheus ignores basic auth it was not configured for: the URLs still work
        source_url = source_url.replace("http://", f"http://promshift:{SECRET}@")
        identity_url = f"{source_url}?token={SECRET}&X-Amz-Signature={SECRET}"
        remote_write = f"{source_url}/api/v1/write?X-Amz-Signature={SECRET}&token={SECRET}"
    source = PrometheusClient(source_url, timeout_s=30)
    backends = Backends(source=source, target=PrometheusClient(source_url, timeout_s=30),
                        source_config_path=str(cfg), target_remote_write_url=remote_write,
                        target_identity={"kind": "prometheus", "url": identity_url})
    audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    return compose_migration(self_group(), backends, audit=audit,
                          routing=RoutingStore(audit.url), snapshots_dir=tmp_path / "snapshots",
                          run_id="manual__deploy-test")


def now() -> datetime:
    return datetime.now(UTC)


def test_snapshot_keeps_the_source_mode_or_stricter_and_restores_bytes_with_crlf(
        prometheus: tuple[PrometheusClient, Path], tmp_path: Path) -> None:
    client, cfg = prometheus
    crlf = (CORPUS / "crlf.yml").read_bytes()
    cfg.write_bytes(crlf)
    client.reload()
    for source_mode, snapshot_mode in ((0o600, 0o600), (0o664, 0o644), (0o755, 0o644)):
        os.chmod(cfg, source_mode)
        migration = migration_for(client, cfg, tmp_path)
        info = migration.snapshot(now())
        snap_path = Path(info["snapshot_path"])
        assert snap_path.stat().st_mode & 0o7777 == snapshot_mode, oct(source_mode)
        assert snap_path.read_bytes() == crlf and info["bytes"] == len(crlf)
        assert info["sha256"] == sha256_bytes(crlf) and info["mode"] == f"{source_mode:04o}"
    assert snap_path.parent.stat().st_mode & 0o777 == 0o700
    migration.deploy_dual_write(info, now())
    assert b"\r\n  - name: \"promshift-gpu-memory\"\r\n" in cfg.read_bytes()
    rolled = migration.rollback(info, reason="test", now=now())
    assert (rolled["method"], rolled["restored_identical"]) == ("snapshot", True)
    assert cfg.read_bytes() == crlf and cfg.stat().st_mode & 0o7777 == 0o755


@pytest.mark.parametrize("loss", ["deleted", "changed"])
def test_a_lost_snapshot_rolls_back_by_removing_our_entry_verified_and_audited(
        prometheus: tuple[PrometheusClient, Path], tmp_path: Path, loss: str) -> None:
    client, cfg = prometheus
    migration = migration_for(client, cfg, tmp_path)
    info = migration.snapshot(now())
    migration.deploy_dual_write(info, now())
    assert "promshift-gpu-memory" in remote_write_names(client.config_text())
    if loss == "deleted":
        Path(info["snapshot_path"]).unlink()
    else:
        Path(info["snapshot_path"]).write_bytes(b"global: {}\n")
    rolled = migration.rollback(info, reason="test: snapshot lost", now=now())
    assert rolled["performed"] is True and rolled["method"] == "removed_entry"
    assert rolled["restored_identical"] is True  # the file's hash equals the one recorded at the snapshot
    assert rolled["remote_write_still_live"] is False
    assert ("cannot be read" if loss == "deleted" else "does not match its recorded hash") in rolled["snapshot_error"]
    assert cfg.read_bytes() == BASE
    assert remote_write_names(client.config_text()) == []
    last = migration.audit.events(group="gpu-memory")[-1]
    assert (last.kind, last.stage_to, last.evidence_data["method"]) == ("rolled_back", "rolled_back", "removed_entry")


def test_an_unreadable_routing_store_does_not_keep_the_rollback_out_of_the_audit(
        prometheus: tuple[PrometheusClient, Path], tmp_path: Path) -> None:
    from sqlalchemy import inspect, text

    from promshift.adapters.routing import RoutingError, routing_table

    client, cfg = prometheus
    migration = migration_for(client, cfg, tmp_path)
    info = migration.snapshot(now())
    migration.deploy_dual_write(info, now())
    migration.routing.route("gpu-memory", read_from="target", url="http://127.0.0.1:1", at=now(), run_id="r")
    with migration.routing.engine.begin() as conn:  # the routing table is lost (the audit table is not)
        conn.execute(text(f"DROP TABLE {routing_table.name}"))
    with pytest.raises(RoutingError, match="routing store .* is unreadable or corrupt"):
        migration.rollback(info, reason="test: routing lost", now=now())
    assert cfg.read_bytes() == BASE and remote_write_names(client.config_text()) == []
    last = migration.audit.events(group="gpu-memory")[-1]
    assert (last.kind, last.stage_to) == ("rolled_back", "rolled_back")
    assert last.evidence_data["restored_identical"] is True
    assert "no such table" in last.evidence_data["routing_error"]
    # Never silently re-created empty: every other group's route would read as "source".
    assert not inspect(migration.routing.engine).has_table(routing_table.name)


def test_url_credentials_never_reach_a_record(prometheus: tuple[PrometheusClient, Path], tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Credentials in the source, target and remote_write URLs: the steps work, and the secret is in
    no audit event, ``audit show --json``, step result (XCom), report.json, log line or error text."""
    import argparse
    import json
    import logging

    from promshift.cli.audit import _show
    from promshift.core.audit import AuditEvent
    from promshift.local.demo import write_report

    client, cfg = prometheus
    caplog.set_level(logging.DEBUG)
    migration = migration_for(client, cfg, tmp_path, secret_urls=True)
    assert SECRET in migration.backends.source.base_url
    deadline = time.time() + 20
    while not migration.backends.source.scalar("count(up)"):
        assert time.time() < deadline, "the fixture's server has not scraped yet"
        time.sleep(0.5)
    results = [migration.validate(now())]
    info = migration.snapshot(now())
    results += [info, migration.deploy_dual_write(info, now())]
    assert SECRET.encode() in cfg.read_bytes()  # the live entry keeps its real URL
    migration.routing.route("gpu-memory", read_from="target", url="http://127.0.0.1:1", at=now(), run_id="r")
    results.append(migration.rollback(info, reason=f"failed at http://u:{SECRET}@host/?token={SECRET}", now=now()))
    assert results[-1]["restored_identical"] is True
    # A Prometheus error with the same URL.
    dead = PrometheusClient(f"http://promshift:{SECRET}@127.0.0.1:{free_port()}", timeout_s=2)
    with pytest.raises(PrometheusError) as excinfo:
        dead.query("up")
    assert SECRET not in str(excinfo.value)
    # Every record.
    events: list[AuditEvent] = migration.audit.events()
    assert [e.kind for e in events] == ["validated", "snapshot_taken", "dual_write_deployed", "rolled_back"]
    assert all(SECRET not in e.evidence for e in events)
    assert "REDACTED" in events[0].evidence and "REDACTED" in events[2].evidence
    assert SECRET not in json.dumps(results)
    _show(argparse.Namespace(url=migration.audit.url, group="gpu-memory", run_id=None, json=True))
    shown = capsys.readouterr().out
    assert "dual_write_deployed" in shown and SECRET not in shown
    write_report(audit=migration.audit, group="gpu-memory", run_id=migration.run_id, out_dir=tmp_path / "report")
    report = (tmp_path / "report" / "report.json").read_text()
    assert "rolled_back" in report and SECRET not in report
    assert caplog.records and all(SECRET not in r.getMessage() for r in caplog.records)


def test_validate_names_an_unreachable_credentialed_target_without_its_secret(
        prometheus: tuple[PrometheusClient, Path], tmp_path: Path) -> None:
    client, cfg = prometheus
    migration = migration_for(client, cfg, tmp_path)
    dead = f"http://promshift:{SECRET}@127.0.0.1:{free_port()}"
    migration.backends = dataclasses.replace(migration.backends, target=PrometheusClient(dead, timeout_s=2))
    with pytest.raises(RuntimeError, match="is unreachable or not ready") as excinfo:
        migration.validate(now())
    assert SECRET not in str(excinfo.value) and "REDACTED@127.0.0.1" in str(excinfo.value)
    # The refusal is audited (validation_failed), redacted like everything else.
    assert [e.kind for e in migration.audit.events()] == ["validation_failed"]
    assert SECRET not in json.dumps([e.evidence_data for e in migration.audit.events()])
