"""rules_deploy's local parts: promtool on rule documents, where the target's rule file goes."""

from __future__ import annotations

from pathlib import Path

import pytest

from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.rules_deploy import PrometheusRulesTarget, promtool_check_rules
from promshift.core.deploy import DeployError


def test_promtool_checks_a_rule_document_and_names_the_file_when_it_refuses() -> None:
    good = b"groups:\n- name: g\n  rules:\n  - record: a:b\n    expr: sum(DCGM_FI_DEV_FB_USED)\n"
    assert "SUCCESS: 1 rules found" in promtool_check_rules(good, name="promshift-gpu-memory.yml")
    bad = b"groups:\n- name: g\n  rules:\n  - alert: A\n    expr: sum(\n"
    with pytest.raises(DeployError, match=r"^promtool rejected the rules of promshift-gpu-memory.yml: .*"
                                          r"promshift-gpu-memory.yml"):
        promtool_check_rules(bad, name="promshift-gpu-memory.yml")
    with pytest.raises(DeployError, match="not found; install Debian's prometheus package"):
        promtool_check_rules(good, name="x.yml", promtool="no-such-promtool")


def test_the_target_rule_file_is_named_relative_to_the_config_and_a_covering_glob_is_enough(tmp_path: Path) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {}\n")
    target = PrometheusRulesTarget(config, PrometheusClient("http://127.0.0.1:9"), group_name="gpu-memory")
    assert target.rule_path == tmp_path / "rules" / "promshift-gpu-memory.yml"
    assert target.listed_path == "rules/promshift-gpu-memory.yml"
    assert not target._covered(b"global: {}\n")
    assert target._covered(b"rule_files: [rules/*.yml]\n")
    assert not target._covered(b"rule_files: [other/*.yml]\n")
    outside = PrometheusRulesTarget(config, PrometheusClient("http://127.0.0.1:9"), group_name="g",
                                    rules_dir="/etc/prometheus/rules")
    assert outside.listed_path == "/etc/prometheus/rules/promshift-g.yml"


def test_the_source_snapshot_keeps_crlf_bytes_through_the_snapshot_store(tmp_path: Path) -> None:
    from promshift.adapters.rules_deploy import SourceRules
    from promshift.adapters.snapshot_store import FileSnapshotStore

    (tmp_path / "rules").mkdir()
    crlf = (Path(__file__).resolve().parents[1] / "data" / "rules" / "gpu-crlf.yml").read_bytes()
    (tmp_path / "rules" / "gpu.yml").write_bytes(crlf)
    (tmp_path / "rules" / "other.yml").write_bytes(b"groups:\n- name: o\n  rules:\n  - alert: Up\n    expr: up == 0\n")
    (tmp_path / "prometheus.yml").write_bytes(b"rule_files:\r\n  - rules/*.yml\r\n")
    source = SourceRules(tmp_path / "prometheus.yml", PrometheusClient("http://127.0.0.1:9"))
    assert [p.name for p in source.rule_files()] == ["gpu.yml", "other.yml"]
    claims = {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"}.__contains__
    snap = source.snapshot(claims)
    store = FileSnapshotStore(tmp_path / "snapshots")
    back = store.get(store.put("gpu-memory", "run 1", snap))
    assert source.snapshot_files(back) == {str(tmp_path / "rules" / "gpu.yml"): crlf}  # only the file with rules
    assert [r.name for r in source.selection_of(back, claims).rules] == ["gpu:fb_used:ratio", "GpuMemoryHigh",
                                                                         "GpuMemoryLeak"]


def test_a_symlinked_rule_file_keeps_its_link_and_mode(tmp_path: Path) -> None:
    from promshift.adapters.deploy import write_keeping

    real = tmp_path / "real.yml"
    real.write_bytes(b"groups: []\n")
    real.chmod(0o640)
    link = tmp_path / "link.yml"
    link.symlink_to(real)
    write_keeping(link, b"groups:\r\n")
    assert link.is_symlink() and real.read_bytes() == b"groups:\r\n"
    assert real.stat().st_mode & 0o777 == 0o640
