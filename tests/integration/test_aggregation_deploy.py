"""Dual-write deploys a group's aggregations (issue 40 item 2) on a real Prometheus: its recording rules in the
group's own rule file, named in ``rule_files`` in the same byte-preserving edit as the ``remote_write`` entry, whose
keep filter ships the recorded series; a rollback puts the config's bytes back and removes the file."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from promshift.adapters.deploy import FileConfigDeployer
from promshift.adapters.file_deployment import FileDeployment
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.rules_deploy import loaded_rules
from promshift.adapters.settings import load_catalog
from promshift.core.catalog import Aggregate
from promshift.core.deploy import DeployError, DeployState, InMemorySnapshotStore, group_entry, group_entry_record
from promshift.local.stack.fleet import FleetServer, FleetSpec, file_sd_groups
from promshift.local.stack.local import find_free_ports
from promshift.local.stack.prometheus import PrometheusProcess
from promshift.orchestration.compose import aggregation_rule_file

pytestmark = pytest.mark.integration

RULE_GROUP = "promshift-aggregate-gpu-power-thermal"


def _base(tmp: Path) -> str:
    (tmp / "sd.json").parent.mkdir(exist_ok=True)
    (tmp / "theirs.yml").write_text("groups: []\n")
    return ("# kept byte for byte\r\nglobal: {scrape_interval: 1s, evaluation_interval: 1s}\r\n"
            "rule_files:\r\n  - theirs.yml   # their own rules\r\n"
            f"scrape_configs:\r\n- job_name: dcgm\r\n  file_sd_configs: [{{files: ['{tmp / 'sd.json'}']}}]\r\n")


def test_the_recording_rules_deploy_with_the_entry_and_roll_back_byte_for_byte(tmp_path: Path) -> None:
    fleet = FleetSpec(nodes=1)
    server = FleetServer(fleet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "sd.json").write_text(json.dumps(file_sd_groups(fleet, server.port)))
    cfg = tmp_path / "prometheus.yml"
    base = _base(tmp_path)
    cfg.write_bytes(base.encode())
    cfg.chmod(0o640)
    group = dataclasses.replace(load_catalog(profile="demo").get("gpu-power-thermal"), scrape_interval_s=1.0,
                                aggregations=(Aggregate("DCGM_FI_DEV_GPU_TEMP", ("Hostname",), ("max",)),))
    (port,) = find_free_ports(1)
    try:
        with PrometheusProcess("source", tmp_path, port=port, config=cfg, data_dir=tmp_path / "data",
                               flags=("--web.enable-lifecycle", "--storage.remote.flush-deadline=1s")) as prometheus:
            client = PrometheusClient(prometheus.url, timeout_s=30)
            url = "http://127.0.0.1:9/api/v1/write"
            rules = aggregation_rule_file(group, cfg)
            deployment = FileDeployment(FileConfigDeployer(cfg, client), group_entry(group, url, None),
                                        record=group_entry_record(group, url, None), keep_others=True, rules=rules)
            assert rules is not None and rules.path == tmp_path / "rules" / f"{RULE_GROUP}.yml"
            store = InMemorySnapshotStore()
            ref = store.put(group.name, "run-1", deployment.snapshot())
            now = datetime.now(UTC)

            result = deployment.deploy(store.get(ref), now)
            assert result.state is DeployState.DONE
            record = result.details["record"]
            assert record["recording_rules"] == ["Hostname:DCGM_FI_DEV_GPU_TEMP:max"]
            assert record["keep_regex"] == group.name_regex()
            text = cfg.read_bytes().decode()
            # One edit: their bytes as they were, ours appended (the rule file listed after theirs, CRLF kept).
            assert text.startswith("# kept byte for byte\r\n") and "  - theirs.yml   # their own rules\r\n" in text
            assert "  - \"rules/promshift-aggregate-gpu-power-thermal.yml\"\r\n" in text
            # The keep filter: the recorded series (RE2-escaped), not the raw metric.
            assert "Hostname\\\\:DCGM_FI_DEV_GPU_TEMP\\\\:max" in text and "DCGM_FI_DEV_GPU_TEMP|" not in text
            assert {r.name for r in loaded_rules(client) if r.group == RULE_GROUP} == {
                "Hostname:DCGM_FI_DEV_GPU_TEMP:max"}
            deadline = time.time() + 20
            while not client.scalar("count(Hostname:DCGM_FI_DEV_GPU_TEMP:max)"):
                assert time.time() < deadline, "the source never recorded the aggregate"
                time.sleep(0.5)
            # One per node, from 8 GPUs' series.
            assert client.scalar("count(Hostname:DCGM_FI_DEV_GPU_TEMP:max)") == 1
            assert client.scalar("count(DCGM_FI_DEV_GPU_TEMP)") == 8

            # Someone else's edit after ours: the rollback removes only our two entries and our file.
            cfg.write_bytes(cfg.read_bytes() + b"# someone else's edit\r\n")
            restored = deployment.restore(store.get(ref), now)
            assert restored.state is DeployState.DONE
            assert cfg.read_bytes() == base.encode() + b"# someone else's edit\r\n"
            assert not rules.path.exists()
            assert not [r for r in loaded_rules(client) if r.group == RULE_GROUP]

            # Without the edit: the snapshot's bytes back, byte for byte, mode kept.
            cfg.write_bytes(base.encode())
            ref = store.put(group.name, "run-2", deployment.snapshot())
            deployment.deploy(store.get(ref), now)
            restored = deployment.restore(store.get(ref), now)
            assert restored.details["restored_identical"] is True and restored.details["record"]["rule_file_removed"]
            assert cfg.read_bytes() == base.encode() and oct(cfg.stat().st_mode & 0o777) == "0o640"
            assert not rules.path.exists()

            # A file of that name that is not ours: refused before anything is written.
            rules.path.parent.mkdir(exist_ok=True)
            rules.path.write_text("groups: []  # a hand-made file\n")
            ref = store.put(group.name, "run-3", deployment.snapshot())
            with pytest.raises(DeployError, match="is not this group's aggregation rules"):
                deployment.deploy(store.get(ref), now)
            assert cfg.read_bytes() == base.encode()
            assert rules.path.read_text() == "groups: []  # a hand-made file\n"
    finally:
        server.shutdown()
