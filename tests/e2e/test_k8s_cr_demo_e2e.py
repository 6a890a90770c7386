"""End to end: ``make demo TARGET=amp DEPLOY=k8s-cr`` through Airflow (issue 10), its rules moved from a
``PrometheusRule`` (issue 37), and the source retired on the k8s-cr path (``SCENARIO=retire``, issue 36).

The source runs as if by prometheus-operator: the stack's k8s component (the Kubernetes API contract server, not a
cluster) holds the ``Prometheus`` resource ``monitoring/k8s`` and the ``PrometheusRule`` ``monitoring/gpu-rules`` (the
source's rules: gpu-memory's recording rule and alert, and a fleet alert of another team), and its operator stand-in
renders them onto the source (its config, its rule file). Airflow's source connection names the resource, the
``PrometheusRule`` (``extra.kubernetes.prometheus_rules``) and a kubeconfig, no file. One session, in this order:

1. happy on gpu-memory, rules moving with it: the run cuts over with the group's entry added through the resource
   (a sigv4 entry to the signing relay, the keep-filter as ``writeRelabelConfigs``), ``deploy.kind`` ``k8s-cr`` and
   the deploy's status history in ``report.json``; its recording rule and alert leave the ``PrometheusRule`` (the
   fleet alert stays, byte for byte) and are evaluated by the AMP workspace. Overlapping it, once its entry is
   deployed, ``drift`` on gpu-utilization: the gate fails and the run's own rollback removes its entry through the
   same driver (the resource as it was before drift, gpu-memory's entry kept).
2. ``SCENARIO=retire`` in the same session (``run_retire(deploy="k8s-cr")``): the groups not cut over migrate
   (gpu-utilization, gpu-power-thermal and gpu-clocks by hand, side by side, each triggered once the one before has
   written its entry: this session's catalog drops their ``depends_on``, the waves being the fleet scenario's), all
   bake; before the switch the four baked groups' entries are merged into one entry of the ``Prometheus`` resource
   by the lossless queue swap (issue 36's bounded queues: the workspace's out-of-order window, AMP's default 60 s,
   covers the overlap), each group's samples counted on the target across it against the source's (0 lost); the
   ``Prometheus`` becomes a ``PrometheusAgent``, the target keeps receiving, the source stops storing, and the undo
   restores it byte-identical to the server just before the switch: ``report.json``'s ``retire`` is (agent, true,
   false, true).
3. ``promshift__rollback`` by hand on gpu-memory, through the one deploy driver: it first leaves the merged entry by
   one more swap (the other three in a new merged entry, their samples counted again across it: 0 lost), then its
   own restore (the rest of the spec as it was), its rules go back into the ``PrometheusRule`` (restored to its
   snapshot) and off the workspace, reads back on the source.

Session: an Airflow of its own (``start_session``, as ``make demo``); its catalog is the repository's with the
``demo`` profile's bake period shortened to 1 min (a clock) and without the two ``depends_on`` (one after the other
they cost about 400 s more of CI's budget and prove nothing the fleet scenario's waves do not); every rule as it is.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.k8s_rules import spec_text
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.routing import RoutingStore
from promshift.adapters.rules_deploy import loaded_rules
from promshift.core.deploy_kinds import K8S_CR
from promshift.core.events import EventKind
from promshift.core.queues import promshift_queues
from promshift.core.render import is_promshift_name, remote_write_names
from promshift.core.resource_queues import remote_write_view
from promshift.local.demo import REPO_ROOT, DemoSession, run_scenario, scenario_connections, start_session
from promshift.local.demo_lifecycle import ALERT_FAULT_GPUS
from promshift.local.demo_retire import count_swap, run_retire, swap_added_at
from promshift.local.stack.local import LocalStack, StackConfig
from promshift.orchestration.dag_factory import FULL_ROLLBACK_DAG_ID
from tests.e2e.conftest import free_port, stop_stack

# The session's start, two overlapping runs, four more migrations (three one after the other: gpu-power-thermal
# depends on gpu-utilization, gpu-clocks on gpu-power-thermal), a bake, the retire and its undo, and a rollback;
# measured 1,317 s alone (load average 1.4-6.4; the CHANGELOG): above the 600 s pytest-timeout of pyproject.toml.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3000)]

# Stack, Airflow start and the run, on a loaded 2-core machine (as test_amp_demo_e2e).
RUN_TIMEOUT_S = 900.0
OURS = "promshift-gpu-memory"
MOVED = {("record", "gpu:fb_used:ratio"), ("alert", "GpuMemoryNearlyFull")}
KEPT = ("alert", "DcgmExporterDown")
MIGRATED_BY_RETIRE = ("gpu-utilization", "gpu-power-thermal", "gpu-clocks")
MIGRATED_BY_RETIRE_SORTED = tuple(sorted(MIGRATED_BY_RETIRE))
BAKE_LINE = "      period: 2m       # three clean checks a minute apart (`make demo SCENARIO=lifecycle`)\n"


@pytest.fixture
def amp_env(small_stack_env: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAE2EK8SCRDEMO0001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "e2eK8sCrDemoSecretKey/0123456789abcdefgh")
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_REGION", "PROMSHIFT_K8S_PORT"):
        monkeypatch.delenv(name, raising=False)
    return small_stack_env


# The two dependencies that would make the retire's migrations run one after the other (``promshift__waves``).
DEPENDENCIES = ("    depends_on: [gpu-utilization]\n", "    depends_on: [gpu-power-thermal]\n")


def write_catalog(home: Path) -> Path:
    """The repository's catalog (with its dashboards and prices) under ``home``, the ``demo`` profile's bake period
    1 min instead of 2 (two clean checks a minute apart: a clock) and without ``DEPENDENCIES``; every rule as is."""
    folder = home / "k8s-cr-catalog"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(REPO_ROOT / "catalog", folder)
    path = folder / "metric_groups.yaml"
    text = path.read_text(encoding="utf-8")
    assert text.count(BAKE_LINE) == 1, "the demo profile's bake period moved: update BAKE_LINE"
    text = text.replace(BAKE_LINE, "      period: 1m\n")
    for dependency in DEPENDENCIES:
        assert text.count(dependency) == 1, f"the catalog's {dependency.strip()!r} moved: update DEPENDENCIES"
        text = text.replace(dependency, "")
    path.write_text(text, encoding="utf-8")
    return path


def eventually(read: Any, ok: Any, *, timeout_s: float = 60.0) -> Any:
    """``read()`` until ``ok`` of it (what the workspace's rule evaluation shows follows a namespace's change by a
    moment), the last value at the deadline."""
    deadline = time.time() + timeout_s
    while True:
        value = read()
        if ok(value) or time.time() > deadline:
            return value
        time.sleep(2)


def rules_on(url: str) -> set[tuple[str, str]]:
    """(kind, name) of every rule a Prometheus reports loaded."""
    return {(r.kind.value, r.name) for r in loaded_rules(PrometheusClient(url, timeout_s=30))}


def rule_names(spec: dict[str, Any]) -> set[tuple[str, str]]:
    return {("record" if "record" in r else "alert", r.get("record") or r.get("alert"))
            for g in spec.get("groups") or [] for r in g.get("rules") or []}


def entries(cr: dict[str, Any]) -> list[dict[str, Any]]:
    return list(cr["spec"].get("remoteWrite") or [])


def queue_groups(cr: dict[str, Any]) -> list[tuple[str, ...]]:
    """The groups of each promshift entry of the resource, in order (a merged entry names all its members)."""
    return [q.groups() for q in promshift_queues(remote_write_view(entries(cr)))]


def without(cr: dict[str, Any], name: str) -> dict[str, Any]:
    """The resource's spec without entry ``name`` (and with no ``remoteWrite`` when none is left)."""
    spec = {k: v for k, v in cr["spec"].items() if k != "remoteWrite"}
    rest = [e for e in entries(cr) if e.get("name") != name]
    return {**spec, "remoteWrite": rest} if rest else spec


class Background:
    """A scenario run in a thread: its report directory, or the exception it raised; ``read`` right after it."""

    def __init__(self, run: Any, read: Any = None) -> None:
        self.out: Path | None = None
        self.read: dict[str, Any] = {}
        self.error: BaseException | None = None

        def body() -> None:
            try:
                self.out = run()
                self.read = read() if read else {}
            except BaseException as exc:  # noqa: BLE001 - raised again by result()
                self.error = exc

        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()

    def result(self) -> Path:
        self.thread.join()
        if self.error is not None:
            raise self.error
        assert self.out is not None
        return self.out


def wait_entry(stack: LocalStack, name: str, run: Background, *, timeout_s: float = 900.0) -> None:
    """Until ``name`` is rendered onto the source config (the run's deploy is written), or the run ended."""
    deadline = time.time() + timeout_s
    while run.thread.is_alive() and time.time() < deadline:
        if name in remote_write_names(stack.source_config_path.read_text()):
            return
        time.sleep(2)


def test_k8s_cr_demo_moves_rules_retires_and_rolls_back_through_the_resources(
        amp_env: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    phases: dict[str, float] = {}
    t0 = time.time()
    try:
        session: DemoSession = start_session(nodes=12, airflow_port=free_port(), target_kind="amp", kubernetes=True,
                                             catalog=write_catalog)
        phases["session"] = time.time() - t0
        stack = LocalStack(StackConfig.from_env(target_kind="amp", kubernetes=True))
        cr_before = stack.prometheus_cr()
        source_before = stack.source_config_path.read_bytes()
        rule_before = stack.prometheus_rule()
        rule_file_before = stack.source_rules_path.read_text()
        source_rules_before = rules_on(stack.source_url)

        def read_happy() -> dict[str, Any]:
            stack.set_fleet_faults(fb_full_gpus=0)
            return {"cr": stack.prometheus_cr(), "source_config": stack.source_config_path.read_text(),
                    "rule": stack.prometheus_rule(), "rule_file": stack.source_rules_path.read_text(),
                    "source_rules": rules_on(stack.source_url), "target_rules": rules_on(stack.target_url),
                    "kubeconfig": json.loads(stack.kubeconfig_path.read_text()), "api_url": stack.kubernetes_url}

        # 1. happy on gpu-memory (rules moving from the PrometheusRule) and, once its entry is deployed, drift on
        # gpu-utilization: one connection set for both (drift's group has no rules: its move has nothing to move).
        # As in SCENARIO=lifecycle, a few GPUs' framebuffer is full during the run: the moved alert fires, so its
        # rules-parity line compares a firing alert (a quiet one on both sides is INCONCLUSIVE, the gate too).
        stack.set_fleet_faults(fb_full_gpus=ALERT_FAULT_GPUS)
        happy = Background(lambda: run_scenario(session, group_name="gpu-memory", scenario="happy", rules=True,
                                                report_root=amp_env / "reports", deploy=K8S_CR,
                                                timeout_s=RUN_TIMEOUT_S), read_happy)
        wait_entry(stack, OURS, happy)
        cr_before_drift = stack.prometheus_cr()
        drift = Background(lambda: run_scenario(session, group_name="gpu-utilization", scenario="drift", rules=True,
                                                report_root=amp_env / "reports", deploy=K8S_CR,
                                                timeout_s=RUN_TIMEOUT_S),
                           lambda: {"cr": stack.prometheus_cr(), "source": stack.source_config_path.read_bytes()})
        out, drift_out = happy.result(), drift.result()
        phases["happy+drift"] = time.time() - t0 - phases["session"]
        happy_read, drift_read = happy.read, drift.read

        # 2. SCENARIO=retire in the same session: the rest migrate and bake, the source retires and comes back.
        t1 = time.time()
        retired_out = run_retire(session, report_root=amp_env / "reports", deploy=K8S_CR)
        phases["retire"] = time.time() - t1

        # 3. The full rollback of gpu-memory by hand, with gpu-memory's connections (its rules in the PrometheusRule).
        t2 = time.time()
        session.set_connections(scenario_connections(session, "happy", K8S_CR, rules=True))
        cr_pre_rollback = stack.prometheus_cr()
        target_rules_pre_rollback = rules_on(stack.target_url)
        run_id = session.airflow.trigger(FULL_ROLLBACK_DAG_ID, conf={"group": "gpu-memory", "reason": "e2e: undo"})
        rollback_state = session.airflow.follow(FULL_ROLLBACK_DAG_ID, run_id, timeout_s=600)
        rollback_ended = time.time()
        cr_after = stack.prometheus_cr()
        rule_after = stack.prometheus_rule()
        rule_file_after = stack.source_rules_path.read_text()
        source_after = stack.source_config_path.read_text()
        source_rules_after = rules_on(stack.source_url)
        target_rules_after = eventually(lambda: rules_on(stack.target_url), lambda v: not MOVED & v)
        audit = AuditStore(session.audit_url)
        # gpu-memory left the merged entry by one more swap: the other three counted on both sides across it
        left_at = swap_added_at(audit, "gpu-memory", run_id)
        stayed = [session.group(g) for g in MIGRATED_BY_RETIRE]
        left_count = None if left_at is None else count_swap(
            PrometheusClient(stack.source_url), PrometheusClient(stack.target_url), stayed, added_at=left_at,
            done_at=rollback_ended - 10)
        phases["rollback"] = time.time() - t2
        events = audit.events(group="gpu-memory")
        source_events = audit.events(group="source:promshift_source")
        rolled = [e for e in events if e.run_id == run_id and e.kind == "rolled_back"]
        stage_after, read_from = audit.stage_of("gpu-memory").value, RoutingStore(audit.url).read_from("gpu-memory")
        audit.engine.dispose()
    finally:
        stop_stack()
        logging.getLogger(__name__).info("phases (s): %s; total %.0f s",
                                         {k: round(v) for k, v in phases.items()}, time.time() - t0)
        print(f"\nk8s-cr session phases (s): { {k: round(v) for k, v in phases.items()} }; total "
              f"{time.time() - t0:.0f} s")

    # -- 1. happy on gpu-memory, through the Prometheus resource ----------------------------------------------------
    report = json.loads((out / "report.json").read_text())
    assert report["final_stage"] == "cut_over", report["summary"]
    assert [s["stage"] for s in report["stages"]] == ["dual_writing", "warming", "verified", "approved", "cut_over"]
    deploy = report["deploy"]
    assert deploy["kind"] == "k8s-cr", deploy
    history = deploy["status_history"]
    assert history and history[0]["status"] == "CR_UPDATED" and history[-1]["status"] == "LIVE", history
    assert all(change["at"] for change in history)
    # The target is an AMP workspace: the quota pre-flight ran before the resource was written.
    assert deploy["quota"]["group_series"] > 0 and deploy["quota"]["limit"] > 0, deploy
    assert report["parity"]["verdict"] == "SUCCESSFUL" and report["latency"]["verdict"] == "SUCCESSFUL"
    assert report["target"]["kind"] == "amp" and report["target"]["sigv4_rejected"] == 0

    # The resource holds our entry in the operator's spelling; cut-over keeps dual-writing, so it stays.
    cr = happy_read["cr"]
    [ours] = [e for e in entries(cr) if e["name"] == OURS]
    assert ours["sigv4"] == {"region": "us-east-1"} and ours["url"].endswith("/api/v1/write")
    assert ours["writeRelabelConfigs"][0]["action"] == "keep"
    assert ours["writeRelabelConfigs"][0]["sourceLabels"] == ["__name__"]
    # ... and the operator stand-in rendered it onto the source's own config, which still scrapes the fleet.
    assert OURS in remote_write_names(happy_read["source_config"])
    # (and promshift's own /metrics, job promshift: the lab's source scrapes the demo's Airflow)
    assert [job["job_name"] for job in yaml.safe_load(happy_read["source_config"])["scrape_configs"]] \
        == ["dcgm", "promshift"]
    assert happy_read["kubeconfig"]["clusters"][0]["cluster"]["server"] == happy_read["api_url"] \
        != "http://127.0.0.1:0"

    # Its rules moved from the PrometheusRule to the workspace: gone from the object and from the rule file the
    # operator renders (the source evaluates them no more), evaluated by the workspace; the other team's alert and
    # the object's metadata stay exactly as they were.
    assert MOVED <= rule_names(rule_before["spec"]) and MOVED <= source_rules_before
    rule = happy_read["rule"]
    assert rule_names(rule["spec"]) == {KEPT} and happy_read["source_rules"] == {KEPT}
    assert [g for g in rule["spec"]["groups"]] == [g for g in rule_before["spec"]["groups"] if g["name"] == "fleet"]
    assert rule["metadata"]["labels"] == rule_before["metadata"]["labels"]
    assert yaml.safe_load(happy_read["rule_file"]) == rule["spec"] and "gpu:fb_used:ratio" not in happy_read[
        "rule_file"]
    assert MOVED <= happy_read["target_rules"]
    assert report["source_rules"]["identical"] is False
    moved = [e for e in events if e.kind == EventKind.RULES_MOVED and e.run_id == report["run_id"]]
    assert [sorted((r["kind"], r["name"]) for r in e.evidence_data["moved_rules"]) for e in moved] == [sorted(MOVED)]
    assert moved[0].evidence_data["source"]["kind"] == "rules-source-prometheusrule", moved[0].evidence_data
    snapshots = [e for e in events if e.kind == EventKind.RULES_SNAPSHOT and e.run_id == report["run_id"]]
    assert snapshots, "the rules move kept no snapshot"

    # drift on gpu-utilization: its gate fails and its own rollback removes only its entry: the resource is as it
    # was when drift started (gpu-memory's entry in it), the source config without drift's entry.
    drifted = json.loads((drift_out / "report.json").read_text())
    assert drifted["final_stage"] == "rolled_back" and drifted["parity"]["verdict"] == "FAILED", drifted["summary"]
    assert drifted["rollback"]["performed"] is True and drifted["rollback"]["restored_identical"] is True
    assert entries(drift_read["cr"]) == entries(cr_before_drift) == [ours]
    assert remote_write_names(drift_read["source"].decode()) == [OURS]

    # -- 2. SCENARIO=retire on the k8s-cr path -----------------------------------------------------------------------
    retired = json.loads((retired_out / "report.json").read_text())
    r = retired["retire"]
    assert (r["mode"], r["target_receiving"], r["source_storing"], r["undo_byte_identical"]) \
        == ("agent", True, False, True), retired["measured"]
    assert retired["deploy"] == K8S_CR
    # every group of the source baked; the ones not cut over before were migrated here, gpu-memory was not again
    assert set(retired["groups"]) == {"gpu-utilization", "gpu-memory", "gpu-power-thermal", "gpu-clocks"}
    assert all(s == "baked" for s in retired["groups"].values()), retired["groups"]
    assert set(retired["migrated"]) == set(MIGRATED_BY_RETIRE), retired["migrated"]
    assert all(m["state"] == "success" for m in retired["migrated"].values()), retired["migrated"]
    # The Prometheus resource became a PrometheusAgent (no server fields in its spec) and came back as it was.
    resources = retired["resources"]
    assert resources["before"] == ["prometheuses"] and "prometheusagents" in resources["retired"]
    assert resources["undone"] == ["prometheuses"] and resources["prometheus_identical"] is True
    assert not {"ruleSelector", "alerting", "evaluationInterval"} & set(resources["agent_spec_fields"])
    assert "remoteWrite" in resources["agent_spec_fields"]
    assert retired["measured"]["retired"]["query_status"] == 422 and retired["measured"]["undone"]["query_status"] \
        == 200
    assert retired["runs"]["retire"]["state"] == retired["runs"]["unretire"]["state"] == "success"
    # What retiring ended, accepted by name: the fleet alert still evaluated on the source (agents evaluate none).
    assert "DcgmExporterDown" in " ".join(retired["accepted"]), retired["accepted"]
    assert retired["audit"]["chain_ok"] is True
    # Before the switch the four baked groups' entries became one merged entry of the resource, with no gap: every
    # member's samples on the target across the swap equal the source's own count.
    merged = r["consolidated"]
    assert (merged["state"], merged["entries_before"], merged["entries_after"]) == ("merged", 4, 1), merged
    assert merged["members"] == sorted(retired["groups"]) and merged["samples_lost"] == 0, merged
    counted = retired["consolidation"]["counted"]["per_group"]
    assert set(counted) == set(retired["groups"]), counted
    assert all(c["target"] == c["source"] > 0 for c in counted.values()), counted
    # the workspace's out-of-order window the swap relied on: AMP's default 60 s (the lab's control plane answers
    # DescribeWorkspaceConfiguration as AMP does), 2 of the groups' 30 s scrapes
    [added] = [e for e in source_events if e.kind == EventKind.QUEUE_SWAP_ADDED]
    guard = added.evidence_data["target_out_of_order"]
    assert (guard["window_s"], guard["needed_s"], guard["covered"]) == (60.0, 60.0, True), guard
    assert "outOfOrderTimeWindowInSeconds" in guard["origin"], guard
    assert [e.kind for e in source_events if e.kind.startswith("queue_swap")] == ["queue_swap_added",
                                                                                   "queue_swap_done"]
    # the resource as the retire left it (the server restored just as it was before the switch): the merged entry
    assert queue_groups(cr_pre_rollback) == [tuple(sorted(retired["groups"]))]

    # -- 3. promshift__rollback of gpu-memory after all that ---------------------------------------------------------
    assert rollback_state == "success", rollback_state
    # gpu-memory left the merged entry first by one more swap: the other three in a new merged entry, no gap for them
    # (their samples on the target across the leave equal the source's); then its own restore through the same
    # driver; the rest of the spec as before the run.
    assert queue_groups(cr_after) == [MIGRATED_BY_RETIRE_SORTED], entries(cr_after)
    assert not {e["name"] for e in entries(cr_after)} & {e["name"] for e in entries(cr_pre_rollback)}
    assert all(is_promshift_name(e["name"]) for e in entries(cr_after))
    assert without(cr_after, "") == {**cr_before["spec"], "remoteWrite": entries(cr_after)}
    assert left_count is not None, "the rollback recorded no swap out of the merged entry"
    assert left_count["lost"] == 0 and all(c["target"] == c["source"] > 0
                                           for c in left_count["per_group"].values()), left_count
    assert OURS not in remote_write_names(source_after) and "job_name: dcgm" in source_after
    # Its rules back in the PrometheusRule as they were before the run (and evaluated by the source), off the
    # workspace.
    assert rule_after["spec"] == rule_before["spec"] and spec_text(rule_after["spec"]) == spec_text(rule_before["spec"])
    assert rule_after["metadata"]["labels"] == rule_before["metadata"]["labels"]
    assert yaml.safe_load(rule_file_after) == yaml.safe_load(rule_file_before)
    assert source_rules_after == source_rules_before
    assert MOVED <= target_rules_pre_rollback and not MOVED & target_rules_after
    assert (stage_after, read_from) == ("rolled_back", "source")
    [event] = rolled
    evidence = event.evidence_data
    assert evidence.get("left_merged_entry", {}).get("leaving") == "gpu-memory", evidence
    assert (evidence["performed"], evidence["from_stage"]) == (True, "baked"), evidence
    assert evidence["method"] == "k8s-cr_restore" and evidence["deploy"]["kind"] == "k8s-cr"
    # the snapshot the run took had no other group's entry: only ours went, so "identical" is honestly false now
    assert evidence["restored_identical"] is False, evidence
    rules_restored = evidence["restored"]["rules"]
    assert rules_restored["changed"] is True and rules_restored["snapshot_run_id"] == report["run_id"], rules_restored
    assert evidence["deploy"]["status_history"][-1]["status"] in ("LIVE", "RESTORED"), evidence["deploy"]
    # The source config rendered from it: the retire's groups' merged entry only.
    assert remote_write_names(source_after) == [e["name"] for e in entries(cr_after)]
    assert remote_write_names(source_before.decode()) == []
