"""Rules move with their group, between real Prometheus processes (Debian's 2.42) and onto moto's AMP.

One module-scoped set of processes on free 127.0.0.1 ports: a 2-node DCGM fleet simulator, a
source Prometheus (1 s scrapes and evaluations; its ``rule_files`` glob names a CRLF rule file with
comments and an anchor; the group ``gpu-memory`` dual-written to the target) and a target
Prometheus (remote-write receiver, lifecycle API). Each test starts from the original bytes.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest
import requests

from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.rules_deploy import (
    AmpRulesNamespace,
    PrometheusRulesTarget,
    RulesMove,
    RulesSnapshot,
    SourceRules,
    loaded_rules,
    rules_parity,
)
from promshift.core.catalog import MetricGroup
from promshift.core.deploy import DeployError, DeploySnapshot
from promshift.core.rules import RuleKind, alert_states, parse_rule_file, remove_rules, select_rules
from promshift.core.verdicts import Verdict
from promshift.local.stack.local import PROMETHEUS_BIN, find_free_ports

pytestmark = pytest.mark.integration

GROUP = MetricGroup(name="gpu-memory",
                    metrics=("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED"))
NOW = datetime(2026, 12, 3, 18, 0, tzinfo=UTC)

RULES = """\
# GPU rules of the training fleet (CRLF on purpose)
groups:
  - name: gpu-memory
    interval: 1s
    rules:
      # share of the framebuffer in use
      - record: gpu:fb_used:ratio
        expr: DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)
        labels: &team
          team: gpu-platform
      - alert: GpuMemoryInUse
        expr: gpu:fb_used:ratio >= 0
        labels: *team
      - alert: GpuMemoryExhausted
        expr: DCGM_FI_DEV_FB_FREE < 0
  - name: node
    interval: 1s
    rules:
      - alert: TooHot   # stays on the source
        expr: DCGM_FI_DEV_GPU_TEMP > 1000
""".replace("\n", "\r\n")

SOURCE_CONFIG = """\
# source of the rules test
global:
  scrape_interval: 1s
  evaluation_interval: 1s
  external_labels:
    cluster: rules-test
rule_files:
  - rules/*.yml
scrape_configs:
  - job_name: dcgm
    file_sd_configs:
      - files: [fleet.json]
remote_write:
  - name: promshift-gpu-memory
    url: http://127.0.0.1:{target_port}/api/v1/write
    write_relabel_configs:
      - source_labels: [__name__]
        regex: DCGM_FI_DEV_FB_FREE|DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_RESERVED
        action: keep
"""

TARGET_CONFIG = "# the target: receives remote write\nglobal:\n  evaluation_interval: 1s\nscrape_configs: []\n"


@dataclass
class Rig:
    source_dir: Path
    target_dir: Path
    source: PrometheusClient
    target: PrometheusClient
    started: float

    @property
    def rule_file(self) -> Path:
        return self.source_dir / "rules" / "gpu.yml"

    def move(self, target: PrometheusRulesTarget | AmpRulesNamespace | None = None, on_step=None) -> RulesMove:
        source = SourceRules(self.source_dir / "prometheus.yml", self.source)
        target = target or PrometheusRulesTarget(self.target_dir / "prometheus.yml", self.target,
                                                 group_name=GROUP.name)
        return RulesMove.for_group(source, target, GROUP, on_step=on_step)


def _wait(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"{what} exited with {proc.returncode}"
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, f"{what} did not become ready"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    fleet_port, source_port, target_port = find_free_ports(3)
    home = tmp_path_factory.mktemp("rules")
    source_dir, target_dir = home / "source", home / "target"
    (source_dir / "rules").mkdir(parents=True)
    target_dir.mkdir()
    (source_dir / "rules" / "gpu.yml").write_bytes(RULES.encode())
    (source_dir / "prometheus.yml").write_text(SOURCE_CONFIG.format(target_port=target_port))
    (target_dir / "prometheus.yml").write_text(TARGET_CONFIG)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        fleet = subprocess.Popen([sys.executable, "-m", "promshift.local.stack.fleet", "--nodes", "2", "--port",
                                  str(fleet_port), "--file-sd", str(source_dir / "fleet.json")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(fleet)
        _wait(f"http://127.0.0.1:{fleet_port}/healthz", fleet, "fleet")
        for name, port, extra in (("target", target_port, ["--web.enable-remote-write-receiver"]),
                                  ("source", source_port, [])):
            where = target_dir if name == "target" else source_dir
            proc = subprocess.Popen([PROMETHEUS_BIN, f"--config.file={where / 'prometheus.yml'}",
                                     f"--storage.tsdb.path={where / 'data'}",
                                     f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle", *extra],
                                    stdout=subprocess.DEVNULL, stderr=(where / "log.txt").open("wb"))
            procs.append(proc)
            _wait(f"http://127.0.0.1:{port}/-/ready", proc, name)
        yield Rig(source_dir, target_dir, PrometheusClient(f"http://127.0.0.1:{source_port}"),
                  PrometheusClient(f"http://127.0.0.1:{target_port}"), time.time())
    finally:
        for proc in reversed(procs):  # the source first: its remote-write queue must not wait on the target
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@pytest.fixture
def fresh(rig: Rig) -> Iterator[Rig]:
    """Each test starts and ends with the original files loaded on both sides."""
    yield rig
    rig.rule_file.write_bytes(RULES.encode())
    (rig.target_dir / "prometheus.yml").write_text(TARGET_CONFIG)
    (rig.target_dir / "rules" / "promshift-gpu-memory.yml").unlink(missing_ok=True)
    rig.source.reload()
    rig.target.reload()


def _wait_for_data(rig: Rig, seconds: float) -> tuple[float, float]:
    """A window of ``seconds`` with the group on both sides: from 3 s after the target first had every GPU's
    series (remote write starts at the source's start) to 6 s ago (ingestion lag on loaded cores)."""
    deadline = time.monotonic() + 60
    while len(rig.target.query("DCGM_FI_DEV_FB_USED").series) < 16:
        assert time.monotonic() < deadline, "the target never received the group"
        time.sleep(0.5)
    since = time.time() + 3
    time.sleep(max(0.0, since + seconds + 6 - time.time()))
    return float(int(since) + 1), float(int(time.time() - 6))


def test_rules_parity_compares_every_moved_rule_and_never_passes_a_quiet_one(fresh: Rig) -> None:
    move = fresh.move()
    plan = move.plan(move.snapshot())
    assert [r.name for r in plan.selection.rules] == ["gpu:fb_used:ratio", "GpuMemoryInUse", "GpuMemoryExhausted"]
    start, end = _wait_for_data(fresh, 8)
    measurements = rules_parity(fresh.source, fresh.target, plan.selection, start=start, end=end, step=1.0,
                                abs_tol=1e-9, rel_tol=1e-9, ignore_labels=("cluster",))
    by_name = {m.name: m for m in measurements}
    record, firing, quiet = (by_name["rules[record gpu:fb_used:ratio]"], by_name["rules[alert GpuMemoryInUse]"],
                             by_name["rules[alert GpuMemoryExhausted]"])
    assert record.verdict == Verdict.SUCCESSFUL, record.reason
    assert record.numbers["series_compared"] == 16  # 2 nodes x 8 GPUs
    assert firing.verdict == Verdict.SUCCESSFUL, firing.reason
    assert "label_replace((DCGM_FI_DEV_FB_USED" in firing.queries[-1]  # read through its recording rule
    assert quiet.verdict == Verdict.INCONCLUSIVE
    assert by_name["rules"].verdict == Verdict.INCONCLUSIVE  # a quiet alert proves nothing: never SUCCESSFUL
    # Without normalizing the external label the target's series are other series: FAILED, not passed.
    raw = rules_parity(fresh.source, fresh.target, plan.selection.only(RuleKind.RECORD), start=start, end=end,
                       step=1.0, abs_tol=1e-9, rel_tol=1e-9)
    assert raw[0].verdict == Verdict.FAILED


class Watcher:
    """Polls /api/v1/rules on both sides every few ms, on its own thread, and keeps every state seen."""

    def __init__(self, rig: Rig, alerts, records) -> None:
        self.rig, self.alerts, self.records = rig, alerts, records
        self.src = PrometheusClient(rig.source.base_url, timeout_s=5)
        self.tgt = PrometheusClient(rig.target.base_url, timeout_s=5)
        self.seen: list[tuple[float, dict[str, str], dict[str, str]]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def state(self) -> tuple[dict[str, str], dict[str, str]]:
        src, tgt = loaded_rules(self.src), loaded_rules(self.tgt)
        records = {f"{r.group}/{r.name}": ("source" if any(x.name == r.name and x.kind is r.kind for x in src) else "")
                   + ("target" if any(x.name == r.name and x.kind is r.kind for x in tgt) else "")
                   for r in self.records}
        return alert_states(self.alerts, src, tgt), records

    def run(self) -> None:
        while not self.stop.is_set():
            alerts, records = self.state()
            self.seen.append((time.monotonic(), alerts, records))
            time.sleep(0.005)

    def __enter__(self) -> Watcher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def test_the_handoff_never_evaluates_an_alert_on_both_sides_and_rolls_back_byte_for_byte(fresh: Rig) -> None:
    original_rules = fresh.rule_file.read_bytes()
    original_target = (fresh.target_dir / "prometheus.yml").read_bytes()
    steps: list[tuple[str, dict[str, str], dict[str, str]]] = []
    move = fresh.move()
    snapshot = RulesSnapshot.from_dict(move.snapshot().to_dict())  # through JSON, as between tasks
    plan = move.plan(snapshot)
    assert set(plan.checks) == {"document", "records_document", str(fresh.rule_file)}
    watcher = Watcher(fresh, plan.selection.alerts, plan.selection.records)
    move.on_step = lambda step: steps.append((step, *watcher.state()))
    steps.append(("before", *watcher.state()))
    with watcher:
        move.add_records(plan, snapshot, NOW)
        handed = move.handoff(plan, snapshot, NOW)
        time.sleep(0.2)
    alerts = ("gpu-memory/GpuMemoryInUse", "gpu-memory/GpuMemoryExhausted")
    assert [(s, a) for s, a, _ in steps] == [
        ("before", dict.fromkeys(alerts, "source")),
        ("records_on_target", dict.fromkeys(alerts, "source")),
        ("loaded_on_target", dict.fromkeys(alerts, "target")),
    ]
    assert [r for _, _, r in steps] == [{"gpu-memory/gpu:fb_used:ratio": s} for s in ("source", "sourcetarget",
                                                                                      "target")]
    # Polled every few ms: never on both sides; on neither only inside the handoff's measured gap.
    assert len(watcher.seen) > 20
    assert not [a for _, a, _ in watcher.seen if "both" in a.values()]
    neither = [t for t, a, _ in watcher.seen if "neither" in a.values()]
    if neither:
        assert max(neither) - min(neither) <= handed["gap_s"] < 2.0
    print(f"handoff: {len(watcher.seen)} polls, alerts on neither side in {len(neither)}, gap {handed['gap_s']}s")
    assert not [r for _, _, r in watcher.seen if "" in r.values()]  # a recording rule is always somewhere
    # The source file lost exactly the group's rules, CRLF and comments kept; the target has its own file.
    assert fresh.rule_file.read_bytes() == remove_rules(original_rules, str(fresh.rule_file), plan.selection)
    assert fresh.rule_file.read_bytes().count(b"\r\n") == fresh.rule_file.read_bytes().count(b"\n")
    assert b"TooHot" in fresh.rule_file.read_bytes()
    target_config = (fresh.target_dir / "prometheus.yml").read_bytes()
    assert target_config == original_target + (b'rule_files:  # added by promshift\n'
                                               b'  - "rules/promshift-gpu-memory.yml"\n')
    assert {r.name for r in loaded_rules(fresh.source)} == {"TooHot"}
    # A retried handoff (the same plan and snapshot) changes nothing.
    move.handoff(plan, snapshot, NOW)
    assert fresh.rule_file.read_bytes() == remove_rules(original_rules, str(fresh.rule_file), plan.selection)
    # Another task rebuilds the same plan from the stored snapshot, though the live file has lost the rules.
    assert fresh.move().plan(snapshot).to_dict() == plan.to_dict()
    steps.clear()
    with Watcher(fresh, plan.selection.alerts, plan.selection.records) as back:
        rolled = move.rollback(snapshot, NOW)
        time.sleep(0.2)
    assert rolled["restored_identical"] is True
    assert steps[-1][0:2] == ("rolled_back", dict.fromkeys(alerts, "source"))
    assert not [a for _, a, _ in back.seen if "both" in a.values()]
    assert fresh.rule_file.read_bytes() == original_rules
    assert (fresh.target_dir / "prometheus.yml").read_bytes() == original_target
    assert not (fresh.target_dir / "rules" / "promshift-gpu-memory.yml").exists()
    assert not loaded_rules(fresh.target)


def test_a_target_that_fails_the_handoff_puts_the_alerts_back_on_the_source(fresh: Rig) -> None:
    original = fresh.rule_file.read_bytes()
    dead = PrometheusClient(f"http://127.0.0.1:{find_free_ports(1)[0]}", timeout_s=2)
    steps: list[str] = []
    move = fresh.move(PrometheusRulesTarget(fresh.target_dir / "prometheus.yml", dead, group_name=GROUP.name),
                      on_step=steps.append)
    snapshot = move.snapshot()
    plan = move.plan(snapshot)
    with pytest.raises(DeployError):
        move.handoff(plan, snapshot, NOW)
    assert steps == ["source_restored"]
    assert fresh.rule_file.read_bytes() == original
    assert {r.name for r in loaded_rules(fresh.source)} == {"gpu:fb_used:ratio", "GpuMemoryInUse",
                                                            "GpuMemoryExhausted", "TooHot"}


def test_a_broken_source_edit_is_refused_before_anything_is_deployed(fresh: Rig) -> None:
    # An extra rule whose expression does not parse: our own PromQL check names the rule, before promtool runs.
    broken = RULES.replace("  - name: node\r\n", "  - name: broken\r\n    rules:\r\n      - alert: Bad\r\n"
                           "        expr: sum(\r\n  - name: node\r\n")
    fresh.rule_file.write_bytes(broken.encode())
    with pytest.raises(DeployError, match=r"gpu.yml: group 'broken', rule 1 \(alert 'Bad'\): expr is not valid PromQL"):
        move = fresh.move()
        move.plan(move.snapshot())
    assert fresh.rule_file.read_bytes() == broken.encode()
    # Valid PromQL, but an annotation template promtool cannot parse: promtool refuses the edited file.
    templated = RULES.replace("  - name: node\r\n", "  - name: broken\r\n    rules:\r\n      - alert: Bad\r\n"
                              "        expr: vector(1)\r\n        annotations:\r\n"
                              "          summary: '{{ $labels.x '\r\n  - name: node\r\n")
    fresh.rule_file.write_bytes(templated.encode())
    with pytest.raises(DeployError, match="promtool rejected the rules of .*gpu.yml"):
        move = fresh.move()
        move.plan(move.snapshot())
    assert fresh.rule_file.read_bytes() == templated.encode()


# --------------------------------------------------------------------------- AMP (moto server)


@pytest.fixture(scope="module")
def moto_amp() -> Iterator[tuple[object, str]]:
    port = find_free_ports(1)[0]
    proc = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(url + "/moto-api/", proc, "moto_server", timeout=30)
        amp = boto3.client("amp", region_name="us-east-1", endpoint_url=url, aws_access_key_id="AKIDMOTO",
                           aws_secret_access_key="moto-secret")  # noqa: S106
        yield amp, amp.create_workspace(alias="rules-test")["workspaceId"]
    finally:
        proc.terminate()
        proc.wait(10)


def test_amp_namespace_create_put_and_rollback_against_moto(moto_amp) -> None:
    amp, ws = moto_amp
    ns = AmpRulesNamespace(amp, ws, "gpu-xid", poll_s=0.1, timeout_s=10)
    doc = "groups:\n- name: xid\n  rules:\n  - alert: Xid\n    expr: DCGM_FI_DEV_XID_ERRORS > 0\n"
    sel = select_rules([parse_rule_file("x.yml", doc)], lambda m: m.startswith("DCGM_FI_DEV_XID"))
    before = ns.snapshot()
    assert not before.existed
    done = ns.put(before, doc, sel, NOW)
    assert done.status == "ACTIVE" and done.details["namespace"] == "promshift-gpu-xid"
    assert ns.describe()["data"] == doc.encode()
    assert ns.put(before, doc, sel, NOW).status == "ACTIVE"  # a retry puts the same data
    assert ns.restore(before, NOW).details["restored_identical"] is True
    assert ns.describe() is None
    # An existing namespace gets its previous data back.
    amp.create_rule_groups_namespace(workspaceId=ws, name="promshift-gpu-xid", data=b"groups: []\n")
    existing = ns.snapshot()
    ns.put(existing, doc, sel, NOW)
    ns.restore(existing, NOW)
    assert ns.describe()["data"] == b"groups: []\n"
    amp.delete_rule_groups_namespace(workspaceId=ws, name="promshift-gpu-xid")


# moto 5.2.5 has no alert manager definitions (the local control plane serves them): the moved alerts' check
# is answered by botocore's Stubber on a second client, the model-checked answer of a workspace with one.
ONCALL_DEFINITION = (b"alertmanager_config: |\n  route: {receiver: oncall}\n  receivers:\n"
                     b"    - {name: oncall, sns_configs: [{topic_arn: 'arn:aws:sns:us-east-1:123456789012:oncall'}]}\n")


class _WithDefinition(AmpRulesNamespace):
    def alert_delivery_problem(self, alerts):  # type: ignore[no-untyped-def]
        from botocore.stub import Stubber

        client = boto3.client("amp", region_name="us-east-1", aws_access_key_id="AKIDSTUB",
                              aws_secret_access_key="stub-secret")  # noqa: S106
        with Stubber(client) as stub:
            stub.add_response("describe_alert_manager_definition", {"alertManagerDefinition": {
                "status": {"statusCode": "ACTIVE"}, "data": ONCALL_DEFINITION, "createdAt": NOW,
                "modifiedAt": NOW}}, expected_params={"workspaceId": self.workspace_id})
            moto, self.amp = self.amp, client
            try:
                return super().alert_delivery_problem(alerts)
            finally:
                self.amp = moto


def test_the_handoff_onto_an_amp_namespace(fresh: Rig, moto_amp) -> None:
    amp, ws = moto_amp
    original = fresh.rule_file.read_bytes()
    ns = _WithDefinition(amp, ws, GROUP.name, poll_s=0.1, timeout_s=10)
    move = fresh.move(ns)
    snapshot = move.snapshot()
    plan = move.plan(snapshot)
    records = move.add_records(plan, snapshot, NOW)
    assert records is not None and b"alert:" not in ns.describe()["data"]
    handed = move.handoff(plan, snapshot, NOW)
    assert handed["target"]["state"] == "done"
    assert ns.describe()["data"] == plan.document.encode()
    assert {r.name for r in loaded_rules(fresh.source)} == {"TooHot"}
    rolled = move.rollback(snapshot, NOW)
    assert rolled["restored_identical"] is True
    assert ns.describe() is None
    assert fresh.rule_file.read_bytes() == original


def test_the_watcher_sees_an_overlap_when_the_order_is_wrong(fresh: Rig) -> None:
    """The handoff test's 'never both' could fail: loading alerts on the target before the source drops them
    is seen as ``both`` at once."""
    move = fresh.move()
    snapshot = move.snapshot()
    plan = move.plan(snapshot)
    watcher = Watcher(fresh, plan.selection.alerts, plan.selection.records)
    move.target.put(snapshot.target, plan.document, plan.selection, NOW)
    try:
        assert set(watcher.state()[0].values()) == {"both"}
    finally:
        move.target.restore(snapshot.target, NOW)
    assert set(watcher.state()[0].values()) == {"source"}


def test_the_amp_hook_gives_the_groups_namespace(moto_amp, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from promshift.orchestration.amp_hook import AmpHook

    amp, ws = moto_amp
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "amp", "login": "AKIDMOTO", "password": "moto-secret",
        "extra": {"region_name": "us-east-1", "endpoint_url": amp.meta.endpoint_url, "workspace_id": ws}}))
    ns = AmpHook().rules_namespace("gpu-memory", timeout_s=5)
    assert (ns.workspace_id, ns.name, ns.timeout_s) == (ws, "promshift-gpu-memory", 5)
    assert ns.snapshot().existed is False


def test_a_metric_regex_group_takes_its_candidate_names_from_the_source(fresh: Rig) -> None:
    group = MetricGroup(name="fb", metric_regex="DCGM_FI_DEV_FB_(USED|FREE)")
    deadline = time.monotonic() + 30
    while not fresh.source.query("DCGM_FI_DEV_FB_USED").series:  # the source's first scrapes
        assert time.monotonic() < deadline
        time.sleep(0.5)
    move = RulesMove.for_group(SourceRules(fresh.source_dir / "prometheus.yml", fresh.source),
                               PrometheusRulesTarget(fresh.target_dir / "prometheus.yml", fresh.target,
                                                     group_name="fb"), group)
    assert set(move.candidates) == {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"}
    assert [r.name for r in move.plan(move.snapshot()).selection.rules] == ["gpu:fb_used:ratio", "GpuMemoryInUse",
                                                                            "GpuMemoryExhausted"]


def test_an_amp_namespace_that_fails_to_create_puts_the_alerts_back_on_the_source(fresh: Rig) -> None:
    from botocore.stub import Stubber

    amp = boto3.client("amp", region_name="us-east-1", aws_access_key_id="AKIDSTUB",
                       aws_secret_access_key="stub-secret")  # noqa: S106
    ws, name = "ws-stubbed", "promshift-gpu-memory"
    stub = Stubber(amp)
    stub.add_response("describe_alert_manager_definition", {"alertManagerDefinition": {  # the plan asks first
        "status": {"statusCode": "ACTIVE"}, "data": ONCALL_DEFINITION, "createdAt": NOW, "modifiedAt": NOW}})
    status = {"statusCode": "CREATION_FAILED", "statusReason": "rule group limit exceeded"}
    failed = {"ruleGroupsNamespace": {"arn": "arn:aws:aps:us-east-1:123456789012:rulegroupsnamespace/x", "name": name,
                                      "status": status, "data": b"", "createdAt": NOW, "modifiedAt": NOW}}
    stub.add_client_error("describe_rule_groups_namespace", "ResourceNotFoundException", "none", 404)
    stub.add_response("create_rule_groups_namespace", {"name": name, "arn": "arn:aws:aps:x", "status": {
        "statusCode": "CREATING"}})
    stub.add_response("describe_rule_groups_namespace", failed)
    stub.add_response("describe_rule_groups_namespace", failed)  # the restore looks, deletes, looks again
    stub.add_response("delete_rule_groups_namespace", {}, expected_params={"workspaceId": ws, "name": name})
    stub.add_client_error("describe_rule_groups_namespace", "ResourceNotFoundException", "none", 404)
    original = fresh.rule_file.read_bytes()
    steps: list[str] = []
    move = fresh.move(AmpRulesNamespace(amp, ws, GROUP.name, poll_s=0.01, timeout_s=5), on_step=steps.append)
    snapshot = RulesSnapshot(move.source.snapshot(GROUP.claims, GROUP.metrics),
                             DeploySnapshot("rules-amp", None, "", {"existed": False}))
    with stub:
        plan = move.plan(snapshot)
    with stub, pytest.raises(DeployError, match="is CREATION_FAILED: rule group limit exceeded$"):
        move.handoff(plan, snapshot, NOW)
    stub.assert_no_pending_responses()
    assert steps == ["source_restored"]
    assert fresh.rule_file.read_bytes() == original
    assert {"GpuMemoryInUse", "GpuMemoryExhausted"} <= {r.name for r in loaded_rules(fresh.source)}
