"""The read-only commands without servers: ``catalog check``, ``render``, ``--since`` and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from promshift.adapters.settings import REPO_ROOT
from promshift.cli import main
from promshift.cli.checks import InputError, parse_since
from promshift.core.render import remote_write_name

CATALOG = REPO_ROOT / "catalog" / "metric_groups.yaml"
SOURCE_CONFIG = """# the team's source config: comments and key order are theirs
global:
  scrape_interval: 15s
  external_labels: {cluster: train-a}
scrape_configs:
- job_name: dcgm
  static_configs: [{targets: ['gpu-node-0000:9400']}]
remote_write:
- name: long-term
  url: http://thanos-receive:19291/api/v1/receive
"""


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors exit from inside parse_args
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


# -- --since -----------------------------------------------------------------------------------------

NOW = 1_796_281_200.0  # 2026-12-03T07:00:00Z


@pytest.mark.parametrize("text,expected", [
    ("30m", NOW - 1800), ("1h30m", NOW - 5400), ("2026-12-03T06:00:00Z", NOW - 3600),
    ("2026-12-03T07:00:00+02:00", NOW - 7200), ("1796277600", NOW - 3600), ("1796277600.5", NOW - 3599.5),
])
def test_since_accepts_rfc3339_unix_time_and_a_duration_ago(text: str, expected: float) -> None:
    assert parse_since(text, now=NOW) == expected


@pytest.mark.parametrize("text,reason", [
    ("yesterday", "not an RFC 3339 time, a unix timestamp or a duration"),
    ("2026-12-03T06:00:00", "give a time zone"),
    ("2026-12-03T08:00:00Z", "is not in the past"),
    ("0s", "is not in the past"),
])
def test_a_bad_since_is_named(text: str, reason: str) -> None:
    with pytest.raises(InputError, match=reason):
        parse_since(text, now=NOW)


@pytest.mark.parametrize("argv,message", [
    (["check", "parity", "--group", "gpu-mem", "--source", "http://127.0.0.1:1", "--target", "http://127.0.0.1:1"],
     "promshift: unknown metric group 'gpu-mem'; known groups: gpu-utilization, gpu-memory"),
    (["check", "latency", "--group", "gpu-memory", "--source", "http://127.0.0.1:1", "--target", "http://127.0.0.1:1",
      "--since", "soon"], "promshift: --since 'soon': not an RFC 3339 time"),
    (["check", "parity", "--group", "gpu-memory", "--source", "127.0.0.1:9090", "--target", "http://127.0.0.1:1"],
     "promshift: --source '127.0.0.1:9090': expected an http:// or https:// URL"),
    (["check", "drift", "--group", "gpu-memory", "--source", "http://a", "--target", "http://b"],
     "promshift check: error: argument kind: invalid choice"),
    (["check", "parity", "--group", "gpu-memory"], "the following arguments are required: --source, --target"),
    (["check", "parity", "--group", "gpu-memory", "--source", "http://a", "--target", "http://b",
      "--catalog", "/nonexistent/catalog.yaml"], "promshift: cannot read catalog /nonexistent/catalog.yaml"),
])
def test_bad_input_is_one_line_on_stderr_and_exit_64(argv: list[str], message: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(argv, capsys)
    assert code == 64 and out == ""
    assert err.count("\n") == 1 and message in err


# -- catalog check -----------------------------------------------------------------------------------


def test_catalog_check_passes_the_repo_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["catalog", "check", str(CATALOG), "--profile", "demo"], capsys)
    assert code == 0
    assert out == (f"{CATALOG}: OK (4 groups: gpu-utilization, gpu-memory, gpu-power-thermal, gpu-clocks; "
                   "every profile validated; profile demo applied)\n"
                   "  promshift_source -> promshift_target: "
                   "gpu-utilization, gpu-memory, gpu-power-thermal, gpu-clocks\n"
                   "  migration DAGs: promshift__migrate__promshift_target (4 groups)\n"
                   "  (connections not checked: pass --connections to check that each exists)\n")


def test_catalog_check_refuses_a_connection_that_does_not_exist(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["catalog", "check", str(CATALOG), "--connections", "promshift_source,amp_b",
                        "--connections", "cluster_b"], capsys)
    assert code == 1
    assert out.splitlines()[1:] == [
        "  - catalog (the default of a group, wave and defaults that name none): field 'target': unknown connection "
        "'promshift_target'; known connections: amp_b, cluster_b, promshift_source"]
    code, out, _ = run(["catalog", "check", str(CATALOG), "--connections", "promshift_source,promshift_target"],
                       capsys)
    assert code == 0 and "connections not checked" not in out


def test_catalog_check_summarises_a_large_catalog_per_wave(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """1,000 names on one line help nobody: counts per wave and the first names; the problems stay in full."""
    import sys

    sys.path.insert(0, str(REPO_ROOT / "bench" / "catalog"))
    try:
        from run import catalog_text  # bench/catalog/run.py: the benchmarks' generated fleet
    finally:
        sys.path.remove(str(REPO_ROOT / "bench" / "catalog"))
    big = tmp_path / "catalog.yaml"
    big.write_text(catalog_text(1000))
    code, out, _ = run(["catalog", "check", str(big)], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"{big}: OK (1,000 groups in ") and lines[0].endswith("; every profile validated)")
    waves = [line for line in lines[1:] if line.startswith("  wave ")]
    assert waves and sum(int(line.split(": ")[1].split()[0].replace(",", "")) for line in waves) == 1000
    assert all(line.count(", ") <= 5 for line in waves)  # five names at most, then a count
    # Where they run: one migration DAG per target, with how many groups, never the 1,000 names.
    assert "  migration DAGs: promshift__migrate__promshift_target (1,000 groups)" in lines
    assert len(out) < 4000
    broken = tmp_path / "broken.yaml"
    broken.write_text(catalog_text(1000).replace("sample_hosts: 40", "sample_hosts: 0"))
    code, out, _ = run(["catalog", "check", str(broken)], capsys)
    assert code == 1 and out.count("\n  - ") >= 1 and "problem" in out.splitlines()[0]


def test_catalog_check_prints_every_problem_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "catalog.yaml"
    text = CATALOG.read_text()
    text = text.replace("sample_hosts: 40", "sample_hosts: 0").replace("max_lag: 1m", "max_lag: soon")
    text = text.replace("- name: gpu-memory\n", "- name: GPU memory\n")
    bad.write_text(text)
    code, out, _ = run(["catalog", "check", str(bad)], capsys)
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == f"{bad}: {len(lines) - 1} problems" and len(lines) - 1 >= 3
    assert any("parity.sample_hosts" in line and "must be >= 1" in line for line in lines)
    assert any("warmup.max_lag" in line for line in lines)
    assert any("GPU memory" in line for line in lines)
    assert all(line.startswith("  - ") for line in lines[1:])


def test_catalog_check_of_a_missing_file_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["catalog", "check", str(tmp_path / "nope.yaml")], capsys)
    assert (code, out) == (64, "") and "cannot read catalog" in err


def test_catalog_check_json_is_the_verdict_on_stdout_and_errors_stay_one_line_on_stderr(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    code, out, err = run(["catalog", "check", str(CATALOG), "--json"], capsys)
    found = json.loads(out)
    assert (code, err) == (0, "") and found["ok"] is True and found["problems"] == []
    assert found["catalog"] == str(CATALOG) and found["connections_checked"] is False
    assert [g["name"] for g in found["groups"]] == ["gpu-utilization", "gpu-memory", "gpu-power-thermal", "gpu-clocks"]
    assert found["groups"][0] == {"name": "gpu-utilization", "wave": 1, "source": "promshift_source",
                                  "target": "promshift_target", "dag_id": "promshift__migrate__promshift_target"}
    bad = tmp_path / "catalog.yaml"
    bad.write_text(CATALOG.read_text().replace("sample_hosts: 40", "sample_hosts: 0"))
    code, out, err = run(["catalog", "check", str(bad), "--json", "--connections", "promshift_source"], capsys)
    found = json.loads(out)
    assert (code, err) == (1, "") and found["ok"] is False and found["connections_checked"] is True
    assert any("parity.sample_hosts" in p for p in found["problems"])
    assert any("unknown connection 'promshift_target'" in p for p in found["problems"])
    assert all("\n" not in p for p in found["problems"])
    code, out, err = run(["catalog", "check", str(tmp_path / "nope.yaml"), "--json"], capsys)
    assert (code, out) == (64, "") and err.count("\n") == 1 and "cannot read catalog" in err


def test_without_promshift_catalog_production_refuses_in_one_line_and_the_lab_uses_its_default(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from promshift.adapters.settings import LAB_CATALOG, ProductionSettingsMissing, default_catalog_path

    monkeypatch.delenv("PROMSHIFT_CATALOG", raising=False)
    monkeypatch.setenv("PROMSHIFT_ENV", "production")
    for argv in (["catalog", "check"], ["catalog", "check", "--json"],
                 ["render", "gpu-memory", "--config", str(tmp_path / "prometheus.yml")]):
        code, out, err = run(argv, capsys)
        assert (code, out) == (64, ""), argv
        assert err.count("\n") == 1 and "PROMSHIFT_ENV=production: no catalog (PROMSHIFT_CATALOG is not set" in err
    with pytest.raises(ProductionSettingsMissing, match="no catalog"):
        default_catalog_path()
    monkeypatch.setenv("PROMSHIFT_CATALOG", str(CATALOG))
    assert default_catalog_path() == CATALOG
    assert run(["catalog", "check"], capsys)[0] == 0  # named: production reads it
    monkeypatch.delenv("PROMSHIFT_CATALOG")
    monkeypatch.setenv("PROMSHIFT_ENV", "lab")
    assert default_catalog_path() == LAB_CATALOG == CATALOG
    code, out, _ = run(["catalog", "check"], capsys)
    assert code == 0 and out.startswith(f"{CATALOG}: OK")


# -- render ------------------------------------------------------------------------------------------


def test_render_names_an_edit_the_deploy_would_refuse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text(SOURCE_CONFIG + f"- name: {remote_write_name('gpu-memory')}\n  url: http://elsewhere/write\n")
    before = config.read_bytes()
    code, out, err = run(["render", "gpu-memory", "--config", str(config), "--catalog", str(CATALOG),
                          "--target-url", "http://127.0.0.1:9/api/v1/write"], capsys)
    assert (code, out) == (1, "")
    assert "the deploy would refuse" in err and "never edits a live entry" in err
    assert config.read_bytes() == before


def test_render_of_an_unknown_group_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text(SOURCE_CONFIG)
    code, out, err = run(["render", "gpu-nope", "--config", str(config), "--catalog", str(CATALOG)], capsys)
    assert (code, out) == (64, "") and "unknown metric group 'gpu-nope'" in err


def test_check_with_an_invalid_catalog_is_one_line_and_exit_64(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "catalog.yaml"
    bad.write_text("version: 1\ngroups: [\n")
    code, out, err = run(["check", "parity", "--group", "gpu-memory", "--source", "http://127.0.0.1:1",
                          "--target", "http://127.0.0.1:1", "--catalog", str(bad)], capsys)
    assert (code, out) == (64, "") and err.count("\n") == 1
    assert f"catalog {bad} is invalid (1 problem; first: catalog: invalid YAML" in err
    assert err.rstrip().endswith("see promshift catalog check")
