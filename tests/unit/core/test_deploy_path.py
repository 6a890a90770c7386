"""The deploy choice (one place), the scraper path's step over the seam's in-memory fakes, and its report block."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.routing import RoutingStore
from promshift.adapters.settings import load_catalog
from promshift.core.deploy import DeployState, InMemoryConfigDeployer, InMemorySnapshotStore
from promshift.core.deploy_kinds import (
    deploy_kind_of,
    deploy_of,
    group_for_deploy,
)
from promshift.core.quota import QuotaExceeded, assess_quota
from promshift.core.report import build_report
from promshift.core.stages import Stage
from promshift.core.warmup import WarmupObservation, assess_warmup
from promshift.orchestration.compose import compose_migration
from promshift.steps.deploy import DeployStep, DeployStepFailed, active_since, final_event
from promshift.steps.migration import Backends, GroupMigration

GROUP = "gpu-memory"
RUN = "manual__unit"


def test_the_deploy_kind_comes_from_the_target_connection_with_one_line_errors() -> None:
    assert deploy_kind_of({}, conn_id="t", is_amp=False) == "remote_write"
    assert deploy_kind_of({"deploy": "Scraper"}, conn_id="t", is_amp=True) == "scraper"
    with pytest.raises(ValueError, match=r"^connection 't': extra.deploy must be one of remote_write, scraper, "
                                         r"got 'k8s-cr'$"):
        deploy_kind_of({"deploy": "k8s-cr"}, conn_id="t", is_amp=True)
    with pytest.raises(ValueError, match="'scraper' needs an amp connection"):
        deploy_kind_of({"deploy": "scraper"}, conn_id="t", is_amp=False)


def test_the_scraper_path_compares_as_independent_scrapers() -> None:
    group = load_catalog(profile="demo").get(GROUP)
    assert group.parity.mode == "dual_write"
    assert group_for_deploy(group, deploy_of("scraper")).parity.mode == "independent_scraper"
    # No blanket tolerance for two scrapers: the catalog's stays the floor, the noise model judges the rest.
    independent = group_for_deploy(group, deploy_of("scraper")).parity
    assert (independent.abs_tolerance, independent.rel_tolerance) == (group.parity.abs_tolerance,
                                                                      group.parity.rel_tolerance)
    looser = dataclasses.replace(group, parity=dataclasses.replace(group.parity, rel_tolerance=0.25))
    assert group_for_deploy(looser, deploy_of("scraper")).parity.rel_tolerance == 0.25
    assert group_for_deploy(group, deploy_of("remote_write")) is group


def test_warmup_without_a_queue_skips_lag_but_still_needs_the_series() -> None:
    obs = WarmupObservation(elapsed_s=10, source_series=8, target_series=8, lag_s=None, failed_samples=None)
    assert assess_warmup(obs, min_duration_s=5, timeout_s=60, max_lag_s=30).state == "waiting"
    assert assess_warmup(obs, min_duration_s=5, timeout_s=60, max_lag_s=None).state == "ready"
    short = WarmupObservation(elapsed_s=10, source_series=8, target_series=3, lag_s=None, failed_samples=None)
    assert assess_warmup(short, min_duration_s=5, timeout_s=60, max_lag_s=None).state == "waiting"


@pytest.fixture
def migration(tmp_path: Path) -> Iterator[GroupMigration]:
    audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    dead = PrometheusClient("http://127.0.0.1:1")  # never asked: these steps run without a quota check
    backends = Backends(source=dead, target=dead, source_config_path=str(tmp_path / "none.yml"),
                        target_remote_write_url="")
    yield compose_migration(load_catalog(profile="demo").get(GROUP), backends, audit=audit,
                         routing=RoutingStore(audit.url), snapshots_dir=tmp_path, run_id=RUN)
    audit.engine.dispose()


def now() -> datetime:
    return datetime.now(UTC)


def settle(deployer: InMemoryConfigDeployer, result: object) -> dict[str, object]:
    from promshift.core.deploy import DeployResult

    assert isinstance(result, DeployResult)
    while not result.state.final:
        result = deployer.verify(result, now())
    return final_event(result)


def report(m: GroupMigration) -> dict[str, object]:
    return build_report(group=GROUP, run_id=RUN, events=m.audit.events(group=GROUP, run_id=RUN),
                        final_stage=m.stage().value, chain=m.audit.verify())


def test_a_deploy_that_goes_active_is_dual_writing_and_the_report_has_its_history(migration: GroupMigration) -> None:
    from promshift.core.deploy import DeployResult

    fake = InMemoryConfigDeployer(None, "scrape_configs: []\n", kind="scraper",
                                  statuses=(("CREATING", DeployState.WAITING), ("ACTIVE", DeployState.DONE)))
    step = DeployStep(migration, fake, InMemorySnapshotStore(), quota=None)
    info = step.snapshot(now())
    started = step.start(info, now())
    event = settle(fake, DeployResult.from_dict(started["deploy"]))
    out = step.finish(event, {"group_series": 48, "workspace_series": 100, "limit": 1000.0, "share": 0.148,
                              "ok": True}, now())
    assert [c["status"] for c in out["deploy"]["status_history"]] == ["CREATING", "ACTIVE"]
    assert out["dual_write_since"] == active_since(event["result"], deploy_of("scraper"))  # type: ignore[arg-type]
    assert migration.stage() == Stage.DUAL_WRITING
    block = report(migration)["deploy"]
    assert isinstance(block, dict)
    assert block["kind"] == "scraper" and block["quota"] == {"group_series": 48, "workspace_series": 100,
                                                             "limit": 1000.0, "share": 0.148}
    assert [c["status"] for c in block["status_history"]] == ["CREATING", "ACTIVE"]


def test_a_failed_deploy_is_audited_with_its_reason_and_rolls_back(migration: GroupMigration) -> None:
    from promshift.core.deploy import DeployResult

    fake = InMemoryConfigDeployer("old blob\n", "new blob\n", kind="scraper",
                                  statuses=(("UPDATING", DeployState.WAITING), ("UPDATE_FAILED", DeployState.FAILED)))
    step = DeployStep(migration, fake, InMemorySnapshotStore(), quota=None)
    info = step.snapshot(now())
    event = settle(fake, DeployResult.from_dict(step.start(info, now())["deploy"]))
    with pytest.raises(DeployStepFailed, match="^scraper deploy failed: scraper is UPDATE_FAILED$"):
        step.finish(event, None, now())
    reason = migration.failure_reason()
    assert reason == "deploy failed: scraper is UPDATE_FAILED"
    done = settle(fake, step.restore(info, reason=reason, now=now()))
    step.finish_rollback(done, info, reason=reason, now=now())
    assert fake.live == "old blob\n"
    assert [e.kind for e in migration.audit.events(group=GROUP)] == ["snapshot_taken", "deploy_failed", "rolled_back"]
    assert report(migration)["rollback"] == {"performed": True, "restored_identical": True, "reason": reason}
    block = report(migration)["deploy"]
    assert isinstance(block, dict) and block["reason"] == "scraper is UPDATE_FAILED"
    assert [c["status"] for c in block["status_history"]] == ["UPDATING", "UPDATE_FAILED"]


def test_a_quota_refusal_deploys_nothing(migration: GroupMigration) -> None:
    fake = InMemoryConfigDeployer(None, "scrape_configs: []\n", kind="scraper")
    assessment = assess_quota(group_series=100, workspace_series=800, series_limit=1000, scrape_interval_s=30)

    def refuse(series: int, at: datetime) -> dict[str, object]:
        raise QuotaExceeded(assessment, {"workspace_series_from": "cloudwatch"})

    step = DeployStep(migration, fake, InMemorySnapshotStore(), quota=refuse)
    info = step.snapshot(now())
    # The group's count on the source: the one number asked of a backend here (the real path: count(selector)).
    migration.backends.source.scalar = lambda query: 100.0  # type: ignore[method-assign]
    with pytest.raises(DeployStepFailed, match="would reach 90.0% of the workspace quota"):
        step.start(info, now())
    assert "deploy" not in fake.calls and fake.live is None
    block = report(migration)["deploy"]
    assert isinstance(block, dict) and block["quota"]["share"] == 0.9 and block["status_history"] == []


def test_retried_finish_and_finish_rollback_record_once(migration: GroupMigration,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 12: a finish that crashed before (or after) its event, retried, ends as a run without a crash."""
    from promshift.core.deploy import DeployResult

    fake = InMemoryConfigDeployer(None, "scrape_configs: []\n", kind="scraper",
                                  statuses=(("CREATING", DeployState.WAITING), ("ACTIVE", DeployState.DONE)))
    step = DeployStep(migration, fake, InMemorySnapshotStore(), quota=None)
    info = step.snapshot(now())
    event = settle(fake, DeployResult.from_dict(step.start(info, now())["deploy"]))
    real = migration.audit.append
    crashed: list[str] = []

    def append_crashing_once(**kw: object) -> object:
        if kw["kind"] == "dual_write_deployed" and not crashed:
            crashed.append("x")
            raise RuntimeError("worker died before the event")
        return real(**kw)  # type: ignore[arg-type]

    monkeypatch.setattr(migration.audit, "append", append_crashing_once)
    with pytest.raises(RuntimeError, match="worker died"):
        step.finish(event, None, now())
    out = step.finish(event, None, now())
    assert step.finish(event, None, now()) == out  # again: the recorded evidence, no new event
    assert [(e.kind, e.stage_to) for e in migration.audit.events(group=GROUP)] == [
        ("snapshot_taken", None), ("dual_write_deployed", "dual_writing")]

    reason = "test: retried rollback"
    done = settle(fake, step.restore(info, reason=reason, now=now()))
    first = step.finish_rollback(done, info, reason=reason, now=now())
    again = step.finish_rollback(done, info, reason=reason, now=now())
    assert again == {**first, "already_rolled_back": True, "found": {"restored_identical": True,
                                                                     "read_from": "source"}}
    assert [e.kind for e in migration.audit.events(group=GROUP)] == [
        "snapshot_taken", "dual_write_deployed", "rolled_back"]
    assert migration.stage() == Stage.ROLLED_BACK
    assert migration.audit.verify().ok


# -- a Kubernetes-run source: the source connection's extra.deploy / extra.kubernetes --------------------------


def test_a_kubernetes_source_connection_chooses_the_kubernetes_deployer() -> None:
    from promshift.core.deploy_kinds import KubernetesSource, kubernetes_source_of

    cr = {"deploy": "k8s-cr", "kubernetes": {"namespace": "monitoring", "name": "k8s", "conn_id": "kubernetes_eks",
                                             "timeout_s": 120}}
    assert deploy_kind_of({}, conn_id="t", is_amp=True, source_extra=cr) == "k8s-cr"
    assert deploy_kind_of({"deploy": "remote_write"}, conn_id="t", is_amp=False,
                          source_extra={"deploy": "k8s-configmap", "kubernetes": {
                              "namespace": "monitoring", "name": "prometheus-config", "key": "prom.yml",
                              "config_file": "/etc/kube/config", "cluster_context": "eks-east"}}) == "k8s-configmap"
    assert deploy_kind_of({}, conn_id="t", is_amp=False, source_extra={"config_path": "/x.yml"}) == "remote_write"
    assert kubernetes_source_of(cr, conn_id="s") == KubernetesSource(
        kind="k8s-cr", namespace="monitoring", name="k8s", conn_id="kubernetes_eks", timeout_s=120.0)
    assert kubernetes_source_of({"deploy": "file"}) is None
    with pytest.raises(ValueError, match=r"^connection 't' deploys through the managed collector, but connection "
                                         r"'s' asks for k8s-cr: choose one$"):
        deploy_kind_of({"deploy": "scraper"}, conn_id="t", is_amp=True, source_extra=cr, source_conn_id="s")


@pytest.mark.parametrize(("extra", "message"), [
    ({"deploy": "helm"}, "extra.deploy must be one of file, k8s-configmap, k8s-cr, git, got 'helm'"),
    ({"deploy": "k8s-cr"}, "needs extra.kubernetes"),
    ({"deploy": "k8s-cr", "kubernetes": {"name": "k8s"}}, "namespace must be a DNS label, got ''"),
    ({"deploy": "k8s-cr", "kubernetes": {"namespace": "Monitoring", "name": "k8s"}}, "namespace must be a DNS label"),
    ({"deploy": "k8s-cr", "kubernetes": {"namespace": "m", "name": "K8S_"}}, "name must be a DNS subdomain"),
    ({"deploy": "k8s-cr", "kubernetes": {"namespace": "m", "name": "k", "key": "p.yml"}}, "ConfigMap only"),
    ({"deploy": "k8s-cr", "kubernetes": {"namespace": "m", "name": "k", "namespce": "x"}},
     r"unknown keys \['namespce'\]"),
    ({"deploy": "k8s-cr", "kubernetes": {"namespace": "m", "name": "k", "kind": "k8s-configmap"}},
     r"unknown keys \['kind'\]"),
    ({"deploy": "k8s-cr", "kubernetes": {"namespace": "m", "name": "k", "timeout_s": "soon"}}, "timeout_s"),
    ({"deploy": "k8s-cr", "kubernetes": {"namespace": "m", "name": "k", "in_cluster": "yes"}}, "in_cluster"),
])
def test_bad_kubernetes_source_extras_are_one_line_errors(extra: dict[str, object], message: str) -> None:
    from promshift.core.deploy_kinds import kubernetes_source_of

    with pytest.raises(ValueError, match=f"^connection 's': .*{message}") as err:
        kubernetes_source_of(extra, conn_id="s")
    assert "\n" not in str(err.value)


def test_the_same_steps_drive_a_kubernetes_deployer_live_once_loaded(migration: GroupMigration) -> None:
    from promshift.core.deploy import DeployResult

    fake = InMemoryConfigDeployer('[{"name":"team"}]', '[{"name":"team"},{"name":"promshift-gpu-memory"}]',
                                  kind="k8s-cr", statuses=(("CR_UPDATED", DeployState.WAITING),
                                                           ("WAITING_FOR_RELOAD", DeployState.WAITING),
                                                           ("LIVE", DeployState.DONE)))
    step = DeployStep(migration, fake, InMemorySnapshotStore(), quota=None)
    info = step.snapshot(now())
    event = settle(fake, DeployResult.from_dict(step.start(info, now())["deploy"]))
    out = step.finish(event, None, now())
    assert [c["status"] for c in out["deploy"]["status_history"]] == ["CR_UPDATED", "WAITING_FOR_RELOAD", "LIVE"]
    assert out["dual_write_since"] == active_since(event["result"], deploy_of("k8s-cr")) and "scraper_id" not in out
    assert migration.stage() == Stage.DUAL_WRITING and report(migration)["deploy"]["kind"] == "k8s-cr"  # type: ignore[index]
    reason = "test: gate failed"
    done = settle(fake, step.restore(info, reason=reason, now=now()))
    evidence = step.finish_rollback(done, info, reason=reason, now=now())
    assert evidence["method"] == "k8s-cr_restore" and evidence["restored_identical"] is True
    assert fake.live == '[{"name":"team"}]' and migration.stage() == Stage.ROLLED_BACK


def test_a_kubernetes_deploy_that_never_loads_fails_with_its_reason(migration: GroupMigration) -> None:
    from promshift.core.deploy import DeployResult

    fake = InMemoryConfigDeployer("a: 1\n", "a: 2\n", kind="k8s-configmap",
                                  statuses=(("CONFIGMAP_UPDATED", DeployState.WAITING),
                                            ("NOT_LOADED", DeployState.TIMEOUT)))
    step = DeployStep(migration, fake, InMemorySnapshotStore(), quota=None)
    event = settle(fake, DeployResult.from_dict(step.start(step.snapshot(now()), now())["deploy"]))
    with pytest.raises(DeployStepFailed, match="^k8s-configmap deploy timeout: k8s-configmap is NOT_LOADED$"):
        step.finish(event, None, now())
    assert [e.kind for e in migration.audit.events(group=GROUP)] == ["snapshot_taken", "deploy_failed"]


# ------------------------------------------------------------------ one place where a kind becomes behaviour

KIND_NAMES = {"REMOTE_WRITE", "SCRAPER", "FILE", "K8S_CONFIGMAP", "K8S_CR", "K8S_KINDS", "DEPLOY_KINDS"}
KIND_STRINGS = {"remote_write", "scraper", "file", "k8s-configmap", "k8s-cr"}


def kind_comparisons(source: str) -> list[str]:
    """Comparisons (``==``, ``!=``, ``in``) with a deploy kind's constant, string or ``deploy_kind``."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            if ((isinstance(side, ast.Name) and side.id in KIND_NAMES)
                    or (isinstance(side, ast.Constant) and side.value in KIND_STRINGS)
                    or (isinstance(side, ast.Attribute) and side.attr in {"deploy_kind", "kind"}
                        and any(isinstance(o, ast.Name) and o.id in KIND_NAMES for o in node.comparators))):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_operators_and_steps_never_compare_deploy_kinds() -> None:
    from pathlib import Path

    package = Path(__file__).resolve().parents[3] / "include" / "promshift"
    modules = [package / "orchestration" / "operators.py", *sorted((package / "steps").glob("*.py"))]
    found = {m.name: hits for m in modules if (hits := kind_comparisons(m.read_text()))}
    assert found == {}, f"branch on Deploy's answers (core.deploy_kinds.DEPLOYS), not on the kind: {found}"
    assert kind_comparisons("if self.deploy_kind == SCRAPER:\n    pass\n")  # the scan finds one


def test_every_deploy_kind_says_what_it_does() -> None:
    from promshift.core.deploy_kinds import DEPLOY_KINDS, DEPLOYS, GIT, K8S_KINDS, Deploy

    assert set(DEPLOYS) == set(DEPLOY_KINDS) | set(K8S_KINDS) | {GIT}
    rw, scraper = deploy_of("remote_write"), deploy_of("scraper")
    assert (rw.source_queue, rw.own_writer) == (True, False)
    assert (scraper.source_queue, scraper.own_writer) == (False, True)
    # One driver (steps.deploy.DeployStep) for every kind: nothing says which kinds take another road.
    assert not any(hasattr(deploy, "via_deployer") for deploy in DEPLOYS.values())
    assert scraper.live_status == "ACTIVE" and scraper.waits_for_scraper and scraper.writer_interval_s == 30.0
    for kind in K8S_KINDS:  # the same remote_write entry, written through the Kubernetes API
        k8s = deploy_of(kind)
        assert (k8s.source_queue, k8s.own_writer, k8s.live_status) == (True, False, "LIVE")
        assert k8s.config_by_api and not rw.config_by_api and not scraper.config_by_api
    assert isinstance(rw, Deploy)
    git = deploy_of(GIT)  # the same entry, as a commit in the team's config repository
    assert (git.source_queue, git.own_writer, git.config_by_api, git.change_request) == (
        True, False, True, True)
    assert not any(deploy_of(kind).change_request for kind in (*DEPLOY_KINDS, *K8S_KINDS))
    with pytest.raises(ValueError, match="unknown deploy 'helm'"):
        deploy_of("helm")
