"""The file deployer behind the ConfigDeployer seam, against a real Prometheus: the same steps as the scraper."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from promshift.adapters.deploy import FileConfigDeployer
from promshift.adapters.file_deployment import FileDeployment
from promshift.adapters.prometheus import PrometheusClient
from promshift.core.deploy import ConfigDeployer, DeployError, DeployState, InMemorySnapshotStore
from promshift.core.render import remote_write_entry
from promshift.local.stack.local import find_free_ports
from promshift.local.stack.prometheus import PrometheusProcess

pytestmark = pytest.mark.integration

BASE = "# kept byte for byte\nglobal: {scrape_interval: 5s}\nscrape_configs: []\n"


def test_file_deployment_through_the_seam(tmp_path: Path) -> None:
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(BASE)
    (port,) = find_free_ports(1)
    with PrometheusProcess("prometheus", tmp_path, port=port, config=cfg, data_dir=tmp_path / "data",
                           flags=("--web.enable-lifecycle",)) as prometheus:
        client = PrometheusClient(prometheus.url, timeout_s=30)
        entry = remote_write_entry(group_name="gpu-memory", name_regex="DCGM_FI_DEV_FB_USED",
                                   url="http://127.0.0.1:9/api/v1/write")
        deployment = FileDeployment(FileConfigDeployer(cfg, client), entry)
        assert isinstance(deployment, ConfigDeployer)
        store = InMemorySnapshotStore()
        ref = store.put("gpu-memory", "run-1", deployment.snapshot())
        now = datetime.now(UTC)
        result = deployment.deploy(store.get(ref), now)
        assert result.state is DeployState.DONE and result.details["remote_write"] == "promshift-gpu-memory"
        assert deployment.verify(result, now).state is DeployState.DONE

        cfg.write_text(cfg.read_text() + "# someone else's edit\n")
        with pytest.raises(DeployError, match="changed since the snapshot"):
            deployment.deploy(store.get(ref), now)

        restored = deployment.restore(store.get(ref), now)
        assert restored.state is DeployState.DONE and restored.details["restored_identical"] is True
        assert cfg.read_text() == BASE
        assert deployment.verify(result, now).state is DeployState.FAILED
