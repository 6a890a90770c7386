"""``promshift render --output config`` prints exactly the bytes the AMP deploy writes (issue 37 item 8).

The migration's own ``deploy_dual_write`` (an AMP target: its ``sigv4`` block and AMP's queue settings) runs against
a real Prometheus (Debian's 2.42, which loads a sigv4 block only when it finds AWS credentials); the source config
file it leaves is compared byte for byte with what ``promshift render`` printed for the same config, group and
target, before anything was deployed. The diff form shows the same sigv4 and queue_config lines.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.routing import RoutingStore
from promshift.adapters.settings import REPO_ROOT, default_catalog_path, load_catalog
from promshift.cli import main
from promshift.local.stack.local import find_free_ports
from promshift.local.stack.prometheus import PrometheusProcess
from promshift.orchestration.compose import compose_migration
from promshift.steps.migration import Backends

pytestmark = pytest.mark.integration

CATALOG = REPO_ROOT / "catalog" / "metric_groups.yaml"
GROUP = "gpu-memory"
REGION = "us-east-1"
WRITE_URL = f"https://aps-workspaces.{REGION}.amazonaws.com/workspaces/ws-0123abcd/api/v1/remote_write"
# A fleet team's config, written by hand: CRLF, a comment and a flow mapping must come through as they are.
BASE = (b"# the fleet's config\r\nglobal:\r\n  scrape_interval: 5s  # keep\r\n"
        b"  external_labels: {cluster: gpu-east}\r\n"
        b"scrape_configs:\r\n  - job_name: self\r\n    static_configs: [{targets: ['127.0.0.1:1']}]\r\n")


@pytest.fixture
def prometheus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[PrometheusClient, Path]]:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDPROMSHIFTTEST")  # the server's: a sigv4 block loads only with one
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_bytes(BASE)
    with PrometheusProcess("prometheus", tmp_path, port=find_free_ports(1)[0], config=cfg, data_dir=tmp_path / "data",
                           flags=("--web.enable-lifecycle",)) as server:
        yield PrometheusClient(server.url, timeout_s=30), cfg


def render(*args: str) -> tuple[int, bytes, str]:
    out, err = io.BytesIO(), io.StringIO()
    stdout = io.TextIOWrapper(out, encoding="utf-8", newline="")  # render --output config writes its .buffer
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(err):
        code = main(["render", GROUP, "--catalog", str(CATALOG), "--profile", "demo", *args])
        stdout.flush()
    return code, out.getvalue(), err.getvalue()


def test_render_prints_the_bytes_the_amp_deploy_writes(prometheus: tuple[PrometheusClient, Path],
                                                        tmp_path: Path) -> None:
    client, cfg = prometheus
    code, printed, _ = render("--config", str(cfg), "--target-url", WRITE_URL, "--output", "config")
    assert code == 0 and cfg.read_bytes() == BASE  # render writes nothing
    assert b"    sigv4:\r\n" in printed and b"    queue_config:\r\n" in printed
    code, diff, _ = render("--config", str(cfg), "--target-url", WRITE_URL)
    assert code == 0 and f'+      region: "{REGION}"' in diff.decode() and "+    queue_config:" in diff.decode()

    group = load_catalog(CATALOG, profile="demo").get(GROUP)
    backends = Backends(source=client, target=PrometheusClient("http://127.0.0.1:1"), source_config_path=str(cfg),
                        target_remote_write_url=WRITE_URL, target_sigv4={"region": REGION})
    audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    migration = compose_migration(group, backends, audit=audit, routing=RoutingStore(audit.url),
                                  snapshots_dir=tmp_path / "snapshots", run_id="manual__render",
                                  catalog_dir=default_catalog_path().parent)
    now = datetime.now(UTC)
    migration.deploy_dual_write(migration.snapshot(now), now)
    assert cfg.read_bytes() == printed  # byte for byte what render printed
    audit.engine.dispose()
