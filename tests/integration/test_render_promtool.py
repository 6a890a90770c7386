"""``promshift render`` end to end with the real promtool: the edited config is checked as the file deploy checks
it, so a config promtool refuses exits 1 with its one line (moved here from tests/unit/cli/test_checks_cli.py: the
unit tier starts no process)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from promshift.core.render import remote_write_name
from tests.unit.cli.test_checks_cli import CATALOG, SOURCE_CONFIG, run

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")]


def test_render_prints_the_deploys_diff_and_leaves_the_config_byte_for_byte(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text(SOURCE_CONFIG)
    before = (config.read_bytes(), config.stat().st_mtime_ns)
    url = "https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write"
    code, out, err = run(["render", "gpu-memory", "--config", str(config), "--catalog", str(CATALOG),
                          "--target-url", url], capsys)
    assert code == 0 and err == ""
    assert out.startswith(f"--- {config} (now)\n+++ {config} (after dual-writing gpu-memory)\n")
    added = [line[1:] for line in out.splitlines() if line.startswith("+") and not line.startswith("+++")]
    # The editor double-quotes every string it writes (YAML 1.1 and 1.2 then read the same value).
    name = remote_write_name("gpu-memory")
    assert f'- name: "{name}"' in added
    assert f'  url: "{url}"' in added
    assert any('regex: "DCGM_FI_DEV_FB_FREE|DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_RESERVED"' in line for line in added)
    assert (config.read_bytes(), config.stat().st_mtime_ns) == before
    assert list(tmp_path.iterdir()) == [config]  # no temp or backup file either


def test_render_without_a_target_url_shows_a_placeholder_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text(SOURCE_CONFIG)
    code, out, err = run(["render", "gpu-memory", "--config", str(config), "--catalog", str(CATALOG)], capsys)
    assert code == 0 and "WORKSPACE_ID" in out and "placeholder" in err


def test_render_exits_1_on_a_config_promtool_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text(SOURCE_CONFIG.replace("global:\n", "global:\n  evaluation_interval: 1x\n", 1))
    assert "evaluation_interval: 1x" in config.read_text()
    before = config.read_bytes()
    code, out, err = run(["render", "gpu-memory", "--config", str(config), "--catalog", str(CATALOG),
                          "--target-url", "http://127.0.0.1:9/api/v1/write"], capsys)
    assert (code, out) == (1, "")
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"promshift render: the deploy would refuse {config}: promtool "
                                                   "check config:"), err
    assert "1x" in lines[0]
    assert config.read_bytes() == before and list(tmp_path.iterdir()) == [config]
