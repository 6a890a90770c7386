"""``promshift check parity|latency`` against real Prometheus servers: a healthy dual-write pair, a group the
target never received, a dual-write too young to compare, a query with nothing behind it, a dead target.

The stack is this module's own (its own temp home and free ports): the shared ``local_stack`` is left to
the tests that migrate groups on it.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from promshift.adapters.deploy import FileConfigDeployer
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.settings import load_catalog
from promshift.cli import main
from promshift.core.render import add_remote_write, remote_write_entry
from promshift.local.stack.local import LocalStack, StackConfig
from tests.integration.sigv4_verifier import SigV4Verifier, VerifyingServer

pytestmark = pytest.mark.integration

FB = ["DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED"]
CATALOG = f"""
version: 1
defaults:
  warmup: {{duration: 1m}}
  parity: {{step: 2s, skip_recent: 4s, sample_hosts: 2}}
  latency:
    repeats: 2
    timeout: 10s
    deadline: 1m
    windows: [{{range: 10s, slo_p95: 5s}}]
groups:
  - name: gpu-memory
    owners: [fleet]
    approvers: [alice, bob]
    metrics: [{", ".join(FB)}]
    latency:
      queries: ["sum by (Hostname) (DCGM_FI_DEV_FB_USED)"]
  - name: gpu-memory-ghost
    owners: [fleet]
    approvers: [alice, bob]
    metrics: [DCGM_FI_DEV_FB_USED_PERCENT]
    latency:
      queries: ['sum(DCGM_FI_DEV_FB_USED_PERCENT{{Hostname="no-such-host"}})']
  - name: gpu-power
    owners: [fleet]
    approvers: [alice, bob]
    metrics: [DCGM_FI_DEV_POWER_USAGE]
    latency:
      queries: ["sum(DCGM_FI_DEV_POWER_USAGE)"]
"""


class DualWrite:
    """A stack whose source dual-writes gpu-memory to the target since ``since``."""

    def __init__(self, stack: LocalStack, catalog: Path, since: float) -> None:
        self.stack, self.catalog, self.since = stack, catalog, since

    def check(self, *args: str) -> list[str]:
        return ["check", *args, "--source", self.stack.source_url, "--target", self.stack.target_url,
                "--catalog", str(self.catalog)]


@pytest.fixture(scope="module")
def dual_write(stack_config_factory: Callable[..., StackConfig],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[DualWrite]:
    catalog = tmp_path_factory.mktemp("check-cli") / "catalog.yaml"
    catalog.write_text(CATALOG)
    group = load_catalog(catalog).get("gpu-memory")
    stack = LocalStack(stack_config_factory(nodes=3))
    try:
        stack.up(timeout=90)
        source = PrometheusClient(stack.source_url, timeout_s=30)
        deployer = FileConfigDeployer(stack.source_config_path, source)
        snap = deployer.snapshot()
        entry = remote_write_entry(group_name=group.name, name_regex=group.name_regex(),
                                   url=stack.target_remote_write_url)
        since = time.time()
        deployer.deploy(add_remote_write(snap.data, entry), snapshot=snap, expect_remote_writes={entry["name"]})
        target = PrometheusClient(stack.target_url, timeout_s=30)
        deadline = time.monotonic() + 40
        count = f"count({group.selector()})"
        while not (0 < (source.scalar(count) or 0) <= (target.scalar(count) or 0)):
            assert time.monotonic() < deadline, "the target never received the group"
            time.sleep(1)
        # A window older than skip_recent (4 s) and past the settle time (2 steps), with a few steps in it.
        time.sleep(max(0.0, since + 2 * 2 + 4 + 4 * 2 - time.time()))
        yield DualWrite(stack, catalog, since)
    finally:
        stack.down()


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses a malformed flag (exit 64, one line on stderr)
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_healthy_dual_write_passes_parity_with_exit_0_and_changes_nothing(
        dual_write: DualWrite, capsys: pytest.CaptureFixture[str]) -> None:
    config = dual_write.stack.source_config_path
    before = (config.read_bytes(), config.stat().st_mtime_ns)
    code, out, _ = run(dual_write.check("parity", "--group", "gpu-memory", "--since", f"{dual_write.since:.3f}"),
                       capsys)
    assert code == 0, out
    assert "verdict: SUCCESSFUL" in out and "host_coverage" in out and "samples" in out
    assert re.search(r"^hosts per label name: source Hostname \d+; target Hostname \d+$", out, re.M), out
    assert f"source {dual_write.stack.source_url}" in out
    code, out, _ = run(dual_write.check("parity", "--group", "gpu-memory", "--since", f"{dual_write.since:.3f}",
                                        "--json"), capsys)
    result = json.loads(out)
    assert code == 0 and result["verdict"] == "SUCCESSFUL" and result["check"] == "parity"
    assert result["points_compared"] > 0 and result["mismatches"] == 0 and len(result["hosts_sampled"]) == 2
    assert result["dual_write_since"] == pytest.approx(dual_write.since, abs=0.001)
    assert (config.read_bytes(), config.stat().st_mtime_ns) == before


def test_a_group_the_target_never_received_fails_parity_with_exit_1(
        dual_write: DualWrite, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(dual_write.check("parity", "--group", "gpu-power", "--since", f"{dual_write.since:.3f}"),
                       capsys)
    assert code == 1, out
    assert "verdict: FAILED" in out and "coverage" in out


def test_a_dual_write_too_young_to_compare_is_inconclusive_with_exit_2(
        dual_write: DualWrite, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(dual_write.check("parity", "--group", "gpu-memory", "--since", "3s"), capsys)
    assert code == 2, out
    assert "verdict: INCONCLUSIVE" in out and "dual-write too short" in out


def test_latency_on_the_pair_passes_and_a_query_without_data_is_inconclusive(
        dual_write: DualWrite, capsys: pytest.CaptureFixture[str]) -> None:
    since = f"{dual_write.since:.3f}"
    code, out, _ = run(dual_write.check("latency", "--group", "gpu-memory", "--since", since, "--json"), capsys)
    result = json.loads(out)
    assert code == 0, [w["outcome"] for w in result["windows"]]
    assert result["verdict"] == "SUCCESSFUL" and all(r["ok"] and r["series"] == 3 for r in result["runs"])
    # The pass has the group's series behind it on both sides: 3 nodes x 8 GPUs of FB_USED.
    assert [w["behind"] for w in result["windows"]] == [
        [{"query": "sum by (Hostname) (DCGM_FI_DEV_FB_USED)", "source": 24.0, "target": 24.0}]]
    # Judged on paired runs, with the interval, the rounds and the machine's own noise in the evidence.
    [window] = result["windows"]
    assert window["interval"]["pairs"] == 2 * window["rounds"] and window["interval"]["level"] == pytest.approx(0.9875)
    code, out, _ = run(dual_write.check("latency", "--group", "gpu-memory", "--since", since), capsys)
    assert code == 0 and "tgt/src [interval]" in out and "noise (paired runs):" in out, out
    assert f"pairs in {window['rounds']} rounds; source-vs-source noise (A/A')" in out, out
    code, out, _ = run(dual_write.check("latency", "--group", "gpu-memory-ghost", "--since", since), capsys)
    assert code == 2, out
    assert "no data behind this query" in out and "verdict: INCONCLUSIVE" in out


def test_an_unreachable_target_is_one_line_and_exit_69(
        dual_write: DualWrite, capsys: pytest.CaptureFixture[str], free_ports: Callable[[int], list[int]]) -> None:
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    argv = ["check", "parity", "--group", "gpu-memory", "--source", dual_write.stack.source_url,
            "--target", dead, "--catalog", str(dual_write.catalog)]
    code, out, err = run(argv, capsys)
    assert (code, out) == (69, "")
    assert err.strip().count("\n") == 0 and err.startswith(f"promshift: target {dead}: unreachable")


# -- an AMP target: requests signed with SigV4 from botocore's default credential chain ---------------

ACCESS_KEY, SECRET = "AKIACHECKCLI00000001", "check-cli-secret-never-printed"


@pytest.fixture
def signed_target(dual_write: DualWrite, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[VerifyingServer]:
    """The pair's target behind a server that recomputes every signature with botocore (403 otherwise)."""
    for name in ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    verifier = SigV4Verifier(upstream=dual_write.stack.target_url, region="us-east-1",
                             keys={ACCESS_KEY: (SECRET, None)})
    with VerifyingServer(verifier) as server:
        yield server


def amp_check(dual_write: DualWrite, server: VerifyingServer, kind: str, *extra: str) -> list[str]:
    return ["check", kind, "--group", "gpu-memory", "--since", f"{dual_write.since:.3f}", "--source",
            dual_write.stack.source_url, "--target", server.endpoint, "--catalog", str(dual_write.catalog), *extra]


def test_check_signs_an_amp_target_with_the_default_credential_chain(
        dual_write: DualWrite, signed_target: VerifyingServer, capsys: pytest.CaptureFixture[str]) -> None:
    verifier = signed_target.verifier
    code, out, err = run(amp_check(dual_write, signed_target, "parity", "--target-region", "us-east-1", "--json"),
                         capsys)
    result = json.loads(out)
    assert code == 0, [(m["name"], m["reason"]) for m in result["measurements"]]
    assert result["verdict"] == "SUCCESSFUL" and result["points_compared"] > 0
    assert not verifier.rejected and len(verifier.verified_keys) >= 5 and set(verifier.verified_keys) == {ACCESS_KEY}
    assert SECRET not in out + err
    verified = len(verifier.verified_keys)
    code, out, err = run(amp_check(dual_write, signed_target, "latency", "--target-region", "us-east-1"), capsys)
    assert code == 0, out
    assert "(SigV4 signed: aps in us-east-1)" in out and "verdict: SUCCESSFUL" in out
    assert not verifier.rejected and len(verifier.verified_keys) > verified and SECRET not in out + err


def test_an_unsigned_or_wrongly_scoped_amp_check_is_refused_in_one_line(
        dual_write: DualWrite, signed_target: VerifyingServer, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    verifier = signed_target.verifier
    code, out, err = run(amp_check(dual_write, signed_target, "parity"), capsys)
    assert (code, out) == (69, "") and "HTTP 403" in err and err.strip().count("\n") == 0
    code, out, err = run(amp_check(dual_write, signed_target, "parity", "--target-region", "eu-west-1"), capsys)
    assert (code, out) == (69, "") and "scoped to a valid region, not 'eu-west-1'" in err and SECRET not in err
    code, out, err = run(amp_check(dual_write, signed_target, "parity", "--target-region", "us-east-1",
                                   "--target-service", "es"), capsys)
    assert code == 69 and "scoped to correct service: 'aps'" in err
    assert verifier.rejected["missing_authorization"] == 1 and not verifier.verified_keys
    code, out, err = run(amp_check(dual_write, signed_target, "parity", "--target-region", "Frankfurt"), capsys)
    assert code == 64 and "'Frankfurt' is not an AWS region (like us-east-1)" in err
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    code, out, err = run(amp_check(dual_write, signed_target, "parity", "--target-region", "us-east-1"), capsys)
    assert (code, out) == (64, "") and "no AWS credentials found" in err


def test_latency_answers_that_need_no_data_are_inconclusive_on_real_servers(
        dual_write: DualWrite, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """gpu-power is not dual-written: the target has none of its series. `or vector(0)` and `absent()`
    still answer a series, fast, on one side or both; they are no evidence."""
    constant = ['sum(DCGM_FI_DEV_POWER_USAGE) or vector(0)', 'absent(DCGM_FI_DEV_POWER_USAGE)']
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG.replace('queries: ["sum(DCGM_FI_DEV_POWER_USAGE)"]', f"queries: {json.dumps(constant)}"))
    argv = ["check", "latency", "--group", "gpu-power", "--since", f"{dual_write.since:.3f}", "--source",
            dual_write.stack.source_url, "--target", dual_write.stack.target_url, "--catalog", str(catalog), "--json"]
    code, out, _ = run(argv, capsys)
    result = json.loads(out)
    [window] = result["windows"]
    assert code == 2 and result["verdict"] == window["verdict"] == "INCONCLUSIVE", window["outcome"]
    runs = {(r["query"], r["backend"]): r["series"] for r in result["runs"]}
    assert runs[(constant[0], "target")] == 1 and runs[(constant[1], "target")] == 1  # answered, with nothing behind
    # Judged by what each read (stats=all): on the target, where gpu-power has no series, neither read a sample.
    assert window["outcome"] == ("no data behind this query: 'sum(DCGM_FI_DEV_POWER_USAGE) or vector(0)' (target: "
                                 "read no samples); 'absent(DCGM_FI_DEV_POWER_USAGE)' (target: read no samples)")
