"""The migration's deploy steps on the managed-collector path, against the local AMP stack.

The steps run as the operators run them (``DeployStep`` built from the target connection's
``AmpHook``, the wait done by ``ScraperStatusTrigger`` followed by connection id, as the triggerer
would), and the audit log is read back: a deploy that ends DUAL_WRITING with its status history,
an ``UPDATE_FAILED`` that ends rolled back with AWS's reason in the audit, and a quota crossing at
80 % that deploys nothing and audits ``quota_refused``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.amp_scraper import wait_for
from promshift.adapters.audit_store import AuditStore
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.routing import RoutingStore
from promshift.adapters.settings import default_catalog_path, load_catalog
from promshift.adapters.snapshot_store import FileSnapshotStore
from promshift.core.catalog import MetricGroup
from promshift.core.deploy_kinds import SCRAPER_INTERVAL_S, deploy_of, group_for_deploy
from promshift.core.scraper_config import render_scraper_config
from promshift.core.stages import Stage
from promshift.core.warmup import assess_warmup
from promshift.local.stack.local import LocalStack, StackConfig, find_free_ports
from promshift.orchestration.amp_hook import AmpHook
from promshift.orchestration.compose import compose_migration
from promshift.orchestration.triggers import ScraperStatusTrigger
from promshift.steps.deploy import DeployStep, DeployStepFailed
from promshift.steps.migration import Backends, observe_warmup
from tests.fakes import FakeTI, fed

pytestmark = pytest.mark.integration

RUN_ID = "manual__test-scraper-path"
FAST = {"delay_s": 1, "collector_scrape_interval_s": 1}


@pytest.fixture(scope="module")
def stack(stack_config_factory: Callable[..., StackConfig]) -> Iterator[LocalStack]:
    """A 2-node AMP stack (1 s scrapes) with its own made-up pair."""
    aws_port, moto_port, frontdoor_port, relay_port = find_free_ports(4)
    config = stack_config_factory(nodes=2, scrape_interval="1s", target_kind="amp", aws_port=aws_port,
                                  moto_port=moto_port, frontdoor_port=frontdoor_port, relay_port=relay_port)
    with pytest.MonkeyPatch.context() as patch:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            patch.delenv(name, raising=False)
        local = LocalStack(config)
        try:
            local.up(timeout=120)
            yield local
        finally:
            local.down()


@pytest.fixture(autouse=True)
def target_connection(stack: LocalStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The target ``amp`` connection as the recipe wires it: ``deploy: scraper`` and ``extra.scraper``."""
    pair = stack.aws_credentials()
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "amp", "login": pair.access_key, "password": pair.secret_key,
        "extra": {**stack.amp_connection_extra(), "deploy": "scraper", "scraper": stack.scraper_extra()}}))
    stack.set_aws_faults(scraper=FAST)
    yield
    stack.set_aws_faults()


def group(name: str) -> MetricGroup:
    return load_catalog(profile="demo").get(name)


def now() -> datetime:
    return datetime.now(UTC)


class Run:
    """One run's migration and scraper step, wired as ``_GroupStep.deploy_step`` wires them."""

    def __init__(self, stack: LocalStack, tmp_path: Path, name: str) -> None:
        self.hook = AmpHook()
        self.group = group(name)
        self.audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
        backends = Backends(source=PrometheusClient(stack.source_url, timeout_s=30),
                            target=self.hook.prometheus_client(), source_config_path=str(stack.source_config_path),
                            target_remote_write_url=self.hook.remote_write_url, target_sigv4=self.hook.sigv4)
        self.migration = compose_migration(self.group, backends, audit=self.audit,
                                        routing=RoutingStore(self.audit.url),
                                        snapshots_dir=tmp_path / "snapshots", run_id=RUN_ID,
                                        catalog_dir=default_catalog_path().parent)
        self.deployer = self.hook.scraper_deployer(self.group.name, self.group.name_regex(),
                                                   scrape_interval_s=SCRAPER_INTERVAL_S, timeout_s=60)

        def quota(group_series: int, at: datetime) -> dict[str, Any]:
            return self.hook.quota_preflight().require(group_series=group_series,
                                                       scrape_interval_s=SCRAPER_INTERVAL_S, now=at)

        self.step = DeployStep(self.migration, self.deployer, FileSnapshotStore(tmp_path / "snapshots"),
                                      quota=quota)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.audit.events(group=self.group.name)]

    def event(self, kind: str) -> dict[str, Any]:
        [ev] = [e for e in self.audit.events(group=self.group.name) if e.kind == kind]
        return dict(ev.evidence_data)


def follow(result: dict[str, Any]) -> dict[str, Any]:
    """Run ScraperStatusTrigger as the triggerer would, from the target connection id; its one event."""
    async def first() -> dict[str, Any]:
        trigger = ScraperStatusTrigger(target_conn_id="promshift_target", result=result, poll_interval_s=0.3)
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first(), timeout=90))


def test_a_scraper_deploy_ends_dual_writing_warms_up_without_a_queue_and_rolls_back(
        stack: LocalStack, tmp_path: Path) -> None:
    run = Run(stack, tmp_path, "gpu-utilization")
    stack.publish_usage()
    info = run.step.snapshot(now())
    assert info["kind"] == "scraper" and info["existed"] is False
    started = run.step.start(info, now())
    assert started["deploy"]["state"] == "waiting" and started["quota"]["group_series"] == 2 * 8 * 4
    event = follow(started["deploy"])
    assert event["status"] == "done", event
    out = run.step.finish(event, started["quota"], now())

    deploy = out["deploy"]
    assert deploy["kind"] == "scraper" and deploy["state"] == "done"
    assert [c["status"] for c in deploy["status_history"]] == ["CREATING", "ACTIVE"]
    assert set(deploy["quota"]) == {"group_series", "workspace_series", "limit", "share", "workspace_id",
                                    "pending_groups", "pending_series"}
    assert 0 < deploy["quota"]["share"] < 0.8
    active_at = datetime.fromisoformat(deploy["status_history"][-1]["at"]).timestamp()
    assert out["dual_write_since"] == active_at
    assert run.audit.stage_of(run.group.name) == Stage.DUAL_WRITING
    assert run.event("dual_write_deployed")["deploy"]["status_history"] == deploy["status_history"]

    # Warm-up on this path: the series counts, and no remote-write queue on the source to wait for.
    g, backends = run.group, run.migration.backends
    deadline = time.time() + 40
    while True:
        obs = observe_warmup(group_name=g.name, selector=g.selector(), source=backends.source,
                             target=backends.target, elapsed_s=time.time() - active_at)
        assert obs.lag_s is None  # the source has no queue for this group
        status = assess_warmup(obs, min_duration_s=1, timeout_s=60, max_lag_s=None)
        if status.state == "ready":
            break
        assert time.time() < deadline, status.reason
        time.sleep(0.5)
    assert "no remote-write queue" in status.reason
    assert group_for_deploy(g, deploy_of("scraper")).parity.mode == "independent_scraper"

    run.migration.start_warmup(now())
    restoring = run.step.restore(info, reason="test: end of the round trip", now=now())
    assert restoring.details.get("deleted") is True
    done = follow(restoring.to_dict())
    rolled = run.step.finish_rollback(done, info, reason="test: end of the round trip", now=now())
    assert rolled["restored_identical"] is True
    assert rolled["deploy"]["status_history"][-1]["status"] == "DELETED"
    assert run.deployer.snapshot().existed is False
    assert run.audit.stage_of(g.name) == Stage.ROLLED_BACK
    assert run.kinds() == ["snapshot_taken", "quota_reserved", "dual_write_deployed", "warmup_started", "rolled_back"]
    # The passed pre-flight reserved the group's series on its workspace, for the pre-flights of other groups.
    reserved = run.event("quota_reserved")
    assert reserved["workspace_id"] and reserved["group_series"] > 0 and reserved["pending_series"] == 0
    assert run.audit.verify().ok


def test_update_failed_ends_rolled_back_with_the_aws_reason_in_the_audit(stack: LocalStack, tmp_path: Path) -> None:
    run = Run(stack, tmp_path, "gpu-memory")
    # The group already has a scraper (an earlier run's, every 60 s): this run's deploy is an UpdateScraper.
    earlier = AmpHook().scraper_deployer(run.group.name, run.group.name_regex(), scrape_interval_s=60, timeout_s=60)
    created = wait_for(earlier, earlier.deploy(earlier.snapshot(), now()), poll_s=0.3)
    assert created.state.value == "done", created.reason
    old_blob = render_scraper_config(name_regex=run.group.name_regex(), scrape_interval_s=60)
    try:
        stack.publish_usage()
        info = run.step.snapshot(now())
        assert info["existed"] is True
        reason = "Unable to reach the cluster's API server"
        stack.set_aws_faults(scraper={**FAST, "fail_update": reason})
        started = run.step.start(info, now())
        event = follow(started["deploy"])
        assert event["status"] == "failed", event
        with pytest.raises(DeployStepFailed) as caught:
            run.step.finish(event, started["quota"], now())
        assert str(caught.value) == f"scraper deploy failed: scraper is UPDATE_FAILED: {reason}"
        failed = run.event("deploy_failed")
        assert failed["reason"] == f"scraper is UPDATE_FAILED: {reason}"
        assert [c["status"] for c in failed["deploy"]["status_history"]] == ["UPDATING", "UPDATE_FAILED"]
        assert failed["deploy"]["quota"]["group_series"] == 2 * 8 * 3
        assert run.audit.stage_of(run.group.name) == Stage.PLANNED  # never dual-writing

        # The rollback task: its reason is AWS's, the old blob goes back, the audit says so.
        stack.set_aws_faults(scraper=FAST)
        why = run.migration.failure_reason()
        assert why == f"deploy failed: scraper is UPDATE_FAILED: {reason}"
        done = follow(run.step.restore(info, reason=why, now=now()).to_dict())
        rolled = run.step.finish_rollback(done, info, reason=why, now=now())
        assert rolled["restored_identical"] is True
        assert rolled["deploy"]["status_history"][-1]["status"] == "ACTIVE"
        assert run.deployer.snapshot().content == old_blob
        assert run.event("rolled_back")["reason"] == why
        assert run.kinds() == ["snapshot_taken", "quota_reserved", "deploy_failed", "rolled_back"]
        assert run.audit.verify().ok
    finally:
        stack.set_aws_faults(scraper=FAST)
        current = earlier.snapshot()
        if current.existed:
            gone = wait_for(earlier, earlier.restore(type(current)("scraper", None, "", {"existed": False}), now()),
                            poll_s=0.3)
            assert gone.state.value == "done", gone.reason


def test_a_quota_crossing_at_80_percent_deploys_nothing_and_is_audited(stack: LocalStack, tmp_path: Path) -> None:
    run = Run(stack, tmp_path, "gpu-clocks")
    stack.publish_usage()
    fits = run.hook.quota_preflight().require(group_series=1, scrape_interval_s=30, now=now())
    workspace_series = fits["workspace_series"]
    group_series = int(run.migration.backends.source.scalar(f"count({run.group.selector()})") or 0)
    assert group_series > 0
    # The group would bring the workspace to ~85 % of its active-series quota: over 80 %, under 100 %.
    limit = int((workspace_series + group_series) / 0.85)
    stack.set_aws_faults(scraper=FAST, aps_quotas={"active_series": limit})
    info = run.step.snapshot(now())
    with pytest.raises(DeployStepFailed, match=r"quota pre-flight refused: active series would reach 8[0-9]\.\d%"):
        run.step.start(info, now())
    refused = run.event("quota_refused")
    assert refused["deploy"]["kind"] == "scraper" and refused["deploy"]["status_history"] == []
    quota = refused["deploy"]["quota"]
    assert quota["limit"] == limit and 0.8 < quota["share"] < 1.0
    assert (quota["group_series"], quota["workspace_series"]) == (group_series, workspace_series)
    assert run.deployer.snapshot().existed is False  # nothing deployed
    assert run.kinds() == ["snapshot_taken", "quota_refused"]
    assert run.migration.failure_reason().startswith("quota refused: quota pre-flight refused: active series")
    assert run.audit.stage_of(run.group.name) == Stage.PLANNED


# -- the operators of the group's DAG, on this path ---------------------------------------------------


def test_the_dags_deploy_and_rollback_tasks_defer_on_the_scraper_and_record_it(
        stack: LocalStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from promshift.local.group_dag import build_group_dag

    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PROMSHIFT_AUDIT_URL", f"sqlite:///{tmp_path / 'audit.db'}")
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps({
        "conn_type": "prometheus", "host": stack.source_url, "extra": {"config_path": str(stack.source_config_path)}}))
    stack.publish_usage()
    config_before = stack.source_config_path.read_bytes()
    g = group("gpu-power-thermal")
    dag = build_group_dag(g, catalog_path=default_catalog_path(), profile="demo")
    context = {"run_id": RUN_ID, "ti": FakeTI()}

    # Each task's output is the next tasks' input (an XComArg in the DAG, the value here).
    snap = dag.get_task("snapshot").execute(context)
    # A snapshot in the object store (file:// under PROMSHIFT_HOME by default), not a worker-local path.
    ref = snap["snapshot_ref"]
    assert snap["kind"] == "scraper" and ref.startswith("file://")
    assert Path(ref.removeprefix("file://")).is_file()
    deploy = fed(dag, "deploy_dual_write", snapshot=snap)
    with pytest.raises(TaskDeferred) as deferred:
        deploy.execute(context)
    trigger = deferred.value.trigger
    assert isinstance(trigger, ScraperStatusTrigger) and deferred.value.method_name == "execute_complete"
    assert deferred.value.kwargs["quota"]["group_series"] > 0
    trigger.poll_interval_s = 0.3
    deployed = deploy.execute_complete(context, follow(trigger.result), **deferred.value.kwargs)
    assert [c["status"] for c in deployed["deploy"]["status_history"]] == ["CREATING", "ACTIVE"]
    assert stack.source_config_path.read_bytes() == config_before  # this path never edits the source's file

    audit = AuditStore()
    try:
        assert audit.stage_of(g.name) == Stage.DUAL_WRITING
        rollback = fed(dag, "rollback", snapshot=snap)  # the same value again when the deferred restore resumes
        with pytest.raises(TaskDeferred) as deferred:
            rollback.execute(context)
        event = follow(deferred.value.trigger.result)
        evidence = rollback.execute_complete(context, event, **deferred.value.kwargs)
        assert evidence["deploy"]["status_history"][-1]["status"] == "DELETED" and evidence["restored_identical"]
        assert audit.stage_of(g.name) == Stage.ROLLED_BACK
        assert [e.kind for e in audit.events(group=g.name)] == ["snapshot_taken", "quota_reserved",
                                                               "dual_write_deployed", "rolled_back",
                                                               "notified", "report_published"]
    finally:
        audit.engine.dispose()
