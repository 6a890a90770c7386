"""A restore's reload outlasts a blocked remote-write shutdown (measured 120 s with the default flush deadline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from promshift.adapters.deploy import RESTORE_RELOAD_TIMEOUT_S, FileConfigDeployer


class SlowReloadClient:
    """Records each reload's timeout; stands in for a source whose reload blocks on a dead endpoint."""

    base_url = "http://127.0.0.1:9"

    def __init__(self) -> None:
        self.timeouts: list[float | None] = []

    def reload(self, *, timeout_s: float | None = None) -> None:
        self.timeouts.append(timeout_s)


def test_restore_waits_longer_than_a_blocked_queue_shutdown(tmp_path: Path) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_bytes(b"global: {}\r\n# ours\r\n")
    client: Any = SlowReloadClient()
    deployer = FileConfigDeployer(config, client)
    snap = deployer.snapshot()
    config.write_bytes(b"global: {}\r\nremote_write: []\r\n")
    assert deployer.restore(snap) is True
    assert config.read_bytes() == b"global: {}\r\n# ours\r\n"
    # 120 s measured on Prometheus 2.42 (default --storage.remote.flush-deadline=1m): the old client timeout.
    assert client.timeouts == [RESTORE_RELOAD_TIMEOUT_S] and RESTORE_RELOAD_TIMEOUT_S >= 240
