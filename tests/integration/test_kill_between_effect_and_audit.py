"""Issue 12: a step killed between its side effect and its audit event, then retried, ends as a run without a kill.

Every step that changes something outside the audit log runs in a forked child process that is SIGKILLed
exactly there: no ``finally``, no exception handler, no atexit runs, as when a worker's pod is evicted. The
hook is the child's own ``AuditStore.append``, which kills the process when the step appends its event;
where the step's event is recorded by a later part of the same Airflow task (the managed-collector and
Kubernetes deploys: ``start`` deploys, the triggerer waits, ``finish`` records), the child is also killed
right after the deployer's write returns. Airflow's retry is then a fresh process with fresh objects that
runs the whole task again; it must succeed, leave exactly one event of the step's kind, the stage where a
run without a kill leaves it, the source config (file, scraper or ``Prometheus`` resource) and the route as
expected, and a verifiable chain.

Backends are real: the file path runs on the session's local stack (``local_stack``); the managed
collector and the ``k8s-cr`` path on one local AMP stack that also runs the Kubernetes API contract server
over its source (``stack up --target amp --k8s``); the ``k8s-configmap`` path on the contract server with its
config-reloader stand-in and a real Prometheus (as ``test_k8s_deploy.py`` runs them).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration

from promshift.adapters.amp_scraper import ScraperDeployer, wait_for
from promshift.adapters.audit_store import AuditStore
from promshift.adapters.deploy import ConfigSnapshot, FileConfigDeployer
from promshift.adapters.k8s_deploy import ConfigMapDeployment, PrometheusCRDeployment, kubernetes_deployer
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.routing import RoutingStore
from promshift.adapters.settings import default_catalog_path, load_catalog
from promshift.adapters.snapshot_store import FileSnapshotStore
from promshift.core.catalog import MetricGroup
from promshift.core.deploy import DeployResult, DeploySnapshot
from promshift.core.deploy_kinds import SCRAPER_INTERVAL_S, kubernetes_source_of
from promshift.core.render import add_remote_write, remote_write_entry, remote_write_name, remote_write_names
from promshift.core.stages import Stage
from promshift.local.stack.k8s_api import CONFIGMAPS, ConfigReloader, K8sApiServer
from promshift.local.stack.local import LocalStack, StackConfig, find_free_ports
from promshift.local.stack.prometheus import PrometheusProcess

# Imported here, in the parent: every forked attempt inherits them instead of importing Airflow again.
from promshift.orchestration.amp_hook import AmpHook
from promshift.orchestration.compose import compose_migration
from promshift.orchestration.hooks import kubernetes_hook
from promshift.steps.deploy import DeployStep, final_event
from promshift.steps.migration import Backends, GroupMigration

pytestmark = pytest.mark.integration

FORK = multiprocessing.get_context("fork")
T_KILL_S = 120.0
FAST = {"delay_s": 1, "collector_scrape_interval_s": 1}


def now() -> datetime:
    return datetime.now(UTC)


def group(name: str) -> MetricGroup:
    return load_catalog(profile="demo").get(name)


def killed(attempt: Callable[[], object], *, at_event: str | None = None,
           after: tuple[type, str] | None = None) -> None:
    """Run ``attempt`` in a forked child that is SIGKILLed right before it appends an audit event of kind
    ``at_event``, or right after method ``after = (class, name)`` returns; fail unless it died there."""

    def child() -> None:
        die = os.getpid()
        if at_event is not None:
            real_append = AuditStore.append

            def append(self: AuditStore, **kw: Any) -> Any:
                if kw["kind"] == at_event:
                    os.kill(die, signal.SIGKILL)
                return real_append(self, **kw)

            AuditStore.append = append  # type: ignore[method-assign]
        if after is not None:
            cls, name = after
            real = getattr(cls, name)

            def then_die(self: Any, *args: Any, **kw: Any) -> Any:
                out = real(self, *args, **kw)
                os.kill(die, signal.SIGKILL)
                return out

            setattr(cls, name, then_die)
        attempt()

    proc = FORK.Process(target=child, daemon=True)
    proc.start()
    proc.join(T_KILL_S)
    if proc.is_alive():
        proc.kill()
        proc.join()
    assert proc.exitcode == -signal.SIGKILL, (
        f"the attempt was not killed at {at_event or after} (exit code {proc.exitcode}: it "
        f"{'finished without reaching the hook' if proc.exitcode == 0 else 'failed before the hook'})")


def kinds(audit_url: str, name: str) -> list[str]:
    store = AuditStore(audit_url)
    try:
        return [e.kind for e in store.events(group=name)]
    finally:
        store.engine.dispose()


def check_chain_and_stage(audit_url: str, name: str, kind: str, stage: Stage) -> list[str]:
    """Exactly one ``kind`` event, the stage, a verifiable chain; returns the group's event kinds."""
    store = AuditStore(audit_url)
    try:
        found = [e.kind for e in store.events(group=name)]
        assert found.count(kind) == 1, found
        assert store.stage_of(name) == stage, (store.stage_of(name), found)
        assert store.verify().ok
        return found
    finally:
        store.engine.dispose()


# -- the file path: GroupMigration's own steps on the session's local stack ------------------------------------

FILE_GROUP = "gpu-memory"
FILE_RUN_ID = "manual__kill-file"


class FileRun:
    """What one attempt of a task builds (``_GroupStep.migration``): fresh stores, fresh clients."""

    def __init__(self, stack: LocalStack, tmp_path: Path) -> None:
        self.audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
        backends = Backends(source=PrometheusClient(stack.source_url, timeout_s=30),
                            target=PrometheusClient(stack.target_url, timeout_s=30),
                            source_config_path=str(stack.source_config_path),
                            target_remote_write_url=stack.target_remote_write_url)
        self.migration = compose_migration(group(FILE_GROUP), backends, audit=self.audit,
                                        routing=RoutingStore(self.audit.url), snapshots_dir=tmp_path / "snapshots",
                                        run_id=FILE_RUN_ID, catalog_dir=default_catalog_path().parent)

    def __enter__(self) -> GroupMigration:
        return self.migration

    def __exit__(self, *exc: object) -> None:
        self.audit.engine.dispose()


@pytest.fixture
def file_env(local_stack: LocalStack, tmp_path: Path) -> Iterator[tuple[LocalStack, Path, bytes]]:
    """(stack, tmp_path, the source config's bytes before the test); the bytes are put back if a test left them."""
    path = local_stack.source_config_path
    original = path.read_bytes()
    yield local_stack, tmp_path, original
    if path.read_bytes() != original:
        FileConfigDeployer(path, PrometheusClient(local_stack.source_url)).restore(ConfigSnapshot.of(path, original))


def file_deployed_bytes(original: bytes, m: GroupMigration) -> bytes:
    return add_remote_write(original, remote_write_entry(group_name=FILE_GROUP, name_regex=m.group.name_regex(),
                                                         url=m.backends.target_remote_write_url))


def live_names(stack: LocalStack) -> list[str]:
    return remote_write_names(PrometheusClient(stack.source_url).config_text())


def test_snapshot_killed_before_its_event(file_env: tuple[LocalStack, Path, bytes]) -> None:
    stack, tmp_path, original = file_env
    snaps: list[dict[str, Any]] = []

    def attempt() -> None:
        with FileRun(stack, tmp_path) as m:
            m.snapshot(now())

    killed(attempt, at_event="snapshot_taken")
    assert [p.read_bytes() for p in (tmp_path / "snapshots").rglob("*") if p.is_file()] == [original]  # written
    assert kinds(f"sqlite:///{tmp_path / 'audit.db'}", FILE_GROUP) == []
    with FileRun(stack, tmp_path) as m:
        snaps.append(m.snapshot(now()))
    assert m._load_snapshot(snaps[0]).data == original
    check_chain_and_stage(f"sqlite:///{tmp_path / 'audit.db'}", FILE_GROUP, "snapshot_taken", Stage.PLANNED)
    assert stack.source_config_path.read_bytes() == original


def test_deploy_dual_write_killed_before_its_event(file_env: tuple[LocalStack, Path, bytes]) -> None:
    stack, tmp_path, original = file_env
    entry = remote_write_name(FILE_GROUP)
    with FileRun(stack, tmp_path) as m:
        snap = m.snapshot(now())
        wanted = file_deployed_bytes(original, m)

    def attempt() -> None:
        with FileRun(stack, tmp_path) as m:
            m.deploy_dual_write(snap, now())

    killed(attempt, at_event="dual_write_deployed")
    assert stack.source_config_path.read_bytes() == wanted and entry in live_names(stack)  # the side effect
    with FileRun(stack, tmp_path) as m:
        deployed = m.deploy_dual_write(snap, now())  # the retry
        assert deployed["config_after_sha256"] != deployed["config_before_sha256"] == snap["sha256"]
        assert "resumed" in deployed
        check_chain_and_stage(m.audit.url, FILE_GROUP, "dual_write_deployed", Stage.DUAL_WRITING)
        assert stack.source_config_path.read_bytes() == wanted
        assert remote_write_names(stack.source_config_path.read_bytes()).count(entry) == 1
        assert entry in live_names(stack)
        m.rollback(snap, reason="test: end", now=now())
    assert stack.source_config_path.read_bytes() == original


def to_approved(m: GroupMigration, snap: dict[str, Any]) -> None:
    """Dual-writing for real, then the gate's and the approver's moves as recorded transitions."""
    m.deploy_dual_write(snap, now())
    m.start_warmup(now())
    m.record("gate_passed", now(), {"test": True}, to=Stage.VERIFIED)
    m.record_approval(decision="Approve", by="tester", comment="", now=now())


def test_cutover_killed_before_its_event(file_env: tuple[LocalStack, Path, bytes]) -> None:
    stack, tmp_path, original = file_env
    with FileRun(stack, tmp_path) as m:
        snap = m.snapshot(now())
        to_approved(m, snap)

    def attempt() -> None:
        with FileRun(stack, tmp_path) as m:
            m.cutover(now())

    killed(attempt, at_event="cut_over")
    with FileRun(stack, tmp_path) as m:
        assert m.routing.read_from(FILE_GROUP) == "target"  # the side effect
        version = m.routing.version(FILE_GROUP)
        evidence = m.cutover(now())  # the retry
        assert evidence["routing"]["read_from"] == "target"
        assert m.routing.read_from(FILE_GROUP) == "target"
        assert m.routing.get(FILE_GROUP)["url"] == stack.target_url  # type: ignore[index]
        assert m.routing.version(FILE_GROUP) <= version + 1
        check_chain_and_stage(m.audit.url, FILE_GROUP, "cut_over", Stage.CUT_OVER)
        m.rollback(snap, reason="test: end", now=now())
    assert stack.source_config_path.read_bytes() == original


def test_rollback_of_a_cut_over_run_killed_before_its_event(file_env: tuple[LocalStack, Path, bytes]) -> None:
    """Both of the rollback's side effects happen before it is killed: the config restored, the reads routed back."""
    stack, tmp_path, original = file_env
    entry = remote_write_name(FILE_GROUP)
    with FileRun(stack, tmp_path) as m:
        snap = m.snapshot(now())
        to_approved(m, snap)
        m.cutover(now())

    def attempt() -> None:
        with FileRun(stack, tmp_path) as m:
            m.rollback(snap, reason="test: killed rollback", now=now())

    killed(attempt, at_event="rolled_back")
    assert stack.source_config_path.read_bytes() == original and entry not in live_names(stack)  # the side effects
    with FileRun(stack, tmp_path) as m:
        assert m.routing.read_from(FILE_GROUP) == "source"
        rolled = m.rollback(snap, reason="test: killed rollback", now=now())  # the retry
        assert rolled["restored_identical"] is True
        found = check_chain_and_stage(m.audit.url, FILE_GROUP, "rolled_back", Stage.ROLLED_BACK)
        assert found == ["snapshot_taken", "dual_write_deployed", "warmup_started", "gate_passed", "approved",
                         "cut_over", "rolled_back"]
        assert m.routing.read_from(FILE_GROUP) == "source"
    assert stack.source_config_path.read_bytes() == original and entry not in live_names(stack)


# -- the managed collector and the Kubernetes resource: DeployStep on a local AMP + k8s stack -----------


@pytest.fixture(scope="module")
def amp_k8s_stack(stack_config_factory: Callable[..., StackConfig]) -> Iterator[LocalStack]:
    """A 2-node AMP stack (1 s scrapes, its own made-up pair) with the Kubernetes contract server over its source."""
    aws_port, moto_port, frontdoor_port, relay_port = find_free_ports(4)
    config = stack_config_factory(nodes=2, scrape_interval="1s", target_kind="amp", kubernetes=True,
                                  aws_port=aws_port, moto_port=moto_port, frontdoor_port=frontdoor_port,
                                  relay_port=relay_port)
    with pytest.MonkeyPatch.context() as patch:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            patch.delenv(name, raising=False)
        local = LocalStack(config)
        try:
            local.up(timeout=120)
            yield local
        finally:
            local.down()


@pytest.fixture
def amp_env(amp_k8s_stack: LocalStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalStack]:
    """The target ``amp`` connection as the recipe wires it for the scraper path; scrapers that move in ~1 s."""
    stack = amp_k8s_stack
    pair = stack.aws_credentials()
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "amp", "login": pair.access_key, "password": pair.secret_key,
        "extra": {**stack.amp_connection_extra(), "deploy": "scraper", "scraper": stack.scraper_extra()}}))
    stack.set_aws_faults(scraper=FAST)
    yield stack
    stack.set_aws_faults()


# The ConfigMap path: the Kubernetes API contract server (in this process, so the config-reloader stand-in runs
# here too) and a real Prometheus whose prometheus.yml the reloader writes from the ConfigMap.
NS, CM_NAME = "monitoring", "prometheus"
CM_BASE = ("# the fleet team's config\nglobal:\n  scrape_interval: 5s\n"
           "scrape_configs:\n  - job_name: self\n    static_configs: [{targets: ['127.0.0.1:1']}]\n")


@dataclass
class ConfigMapEnv:
    server: K8sApiServer
    prometheus: PrometheusProcess
    config: Path

    @property
    def source_url(self) -> str:
        return self.prometheus.url


@pytest.fixture(scope="module")
def configmap_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConfigMapEnv]:
    tmp = tmp_path_factory.mktemp("configmap")
    config = tmp / "prometheus.yml"
    config.write_text(CM_BASE)
    (port,) = find_free_ports(1)
    with PrometheusProcess("source", tmp, port=port, config=config, data_dir=tmp / "data",
                           flags=("--web.enable-lifecycle",)) as prometheus, K8sApiServer() as server:
        server.create(CONFIGMAPS, NS, CM_NAME, {"data": {"prometheus.yml": CM_BASE}})
        reloader = ConfigReloader(server, namespace=NS, name=CM_NAME, config_path=config,
                                  prometheus_url=prometheus.url, delay_s=0.3)
        try:
            yield ConfigMapEnv(server, prometheus, config)
        finally:
            reloader.stop()


Env = LocalStack | ConfigMapEnv


class StepRun:
    """One attempt of a task on the scraper, k8s-cr or k8s-configmap path, wired as ``_GroupStep.deploy_step``
    wires it (fresh hooks, clients and stores)."""

    def __init__(self, env: Env, tmp_path: Path, kind: str, run_id: str) -> None:
        self.audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
        name = "gpu-utilization" if kind == "scraper" else "gpu-memory"
        self.group = group(name)
        source = PrometheusClient(env.source_url, timeout_s=30)
        if isinstance(env, ConfigMapEnv):
            backends = Backends(source=source, target=PrometheusClient("http://127.0.0.1:1"),
                                source_config_path=str(env.config), target_remote_write_url="")
            entry = remote_write_entry(group_name=name, name_regex=self.group.name_regex(),
                                       url="http://127.0.0.1:9/api/v1/write")
            self.deployer: Any = ConfigMapDeployment(ApiClient(Configuration(host=env.server.base_url)),
                                                     namespace=NS, name=CM_NAME, entry=entry, prometheus=source,
                                                     timeout_s=60)
        elif kind == "scraper":
            hook = AmpHook()
            backends = Backends(source=source, target=hook.prometheus_client(),
                                source_config_path=str(env.source_config_path),
                                target_remote_write_url=hook.remote_write_url, target_sigv4=hook.sigv4)
            self.deployer = hook.scraper_deployer(name, self.group.name_regex(),
                                                  scrape_interval_s=SCRAPER_INTERVAL_S, timeout_s=60)
        else:
            k8s = kubernetes_source_of({"deploy": "k8s-cr", "kubernetes": env.kubernetes_source_extra(timeout_s=60)})
            assert k8s is not None
            backends = Backends(source=source, target=PrometheusClient(env.target_url, timeout_s=30),
                                source_config_path=str(env.source_config_path),
                                target_remote_write_url=env.target_remote_write_url)
            entry = remote_write_entry(group_name=name, name_regex=self.group.name_regex(),
                                       url=env.target_remote_write_url)
            self.deployer = kubernetes_deployer(k8s.kind, kubernetes_hook(k8s), namespace=k8s.namespace,
                                                name=k8s.name, entry=entry, prometheus=source, timeout_s=60)
        self.migration = compose_migration(self.group, backends, audit=self.audit, routing=RoutingStore(self.audit.url),
                                        snapshots_dir=tmp_path / "snapshots", run_id=run_id,
                                        catalog_dir=default_catalog_path().parent)
        self.step = DeployStep(self.migration, self.deployer, FileSnapshotStore(tmp_path / "snapshots"),
                                      quota=None)

    def __enter__(self) -> StepRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.audit.engine.dispose()

    # The tasks, as DeployDualWriteOperator and RollbackOperator run them (the wait done in-process).
    def deploy_task(self, snap: dict[str, Any]) -> dict[str, Any]:
        started = self.step.start(snap, now())
        result = wait_for(self.deployer, DeployResult.from_dict(started["deploy"]), poll_s=0.3)
        return self.step.finish(final_event(result), started["quota"], now())

    def rollback_task(self, snap: dict[str, Any], reason: str) -> dict[str, Any]:
        result = wait_for(self.deployer, self.step.restore(snap, reason=reason, now=now()), poll_s=0.3)
        return self.step.finish_rollback(final_event(result), snap, reason=reason, now=now())


DEPLOYERS = {"scraper": ScraperDeployer, "k8s-cr": PrometheusCRDeployment, "k8s-configmap": ConfigMapDeployment}


def live_state(env: Env, run: StepRun, kind: str) -> dict[str, Any]:
    """What is deployed now: the scraper (exists, blob is ours, status) or the object's entries and the loaded
    config's."""
    name = remote_write_name(run.group.name)
    if kind == "scraper":
        snap = run.deployer.snapshot()
        return {"exists": snap.existed, "ours": snap.existed and snap.content == run.deployer.blob,
                "status": snap.meta.get("status")}
    if isinstance(env, ConfigMapEnv):
        entries = remote_write_names(env.server.get(CONFIGMAPS, NS, CM_NAME)["data"]["prometheus.yml"])
    else:
        entries = [e.get("name") for e in env.prometheus_cr()["spec"].get("remoteWrite") or []]
    loaded = remote_write_names(PrometheusClient(env.source_url).config_text())
    return {"exists": name in entries, "entries": entries, "live": name in loaded}


def cleanup(env: Env, tmp_path: Path, kind: str) -> None:
    """Whatever a failed test left deployed goes."""
    with StepRun(env, tmp_path / "cleanup", kind, "manual__kill-cleanup") as run:
        if not live_state(env, run, kind)["exists"]:
            return
        if isinstance(env, ConfigMapEnv):
            env.server.edit(CONFIGMAPS, NS, CM_NAME, lambda obj: obj["data"].update({"prometheus.yml": CM_BASE}))
        elif kind == "scraper":
            empty = DeploySnapshot("scraper", None, "", {"existed": False})
            wait_for(run.deployer, run.deployer.restore(empty, now()), poll_s=0.3)
        else:
            wait_for(run.deployer, run.deployer.restore(run.deployer.snapshot(), now()), poll_s=0.3)


PATHS = ["scraper", "k8s-cr", "k8s-configmap"]


@pytest.fixture
def path_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Env, Path, str]]:
    kind = request.param
    env: Env = request.getfixturevalue("configmap_env" if kind == "k8s-configmap" else "amp_env")
    (tmp_path / "cleanup").mkdir()
    source_path = env.config if isinstance(env, ConfigMapEnv) else env.source_config_path
    source_before = source_path.read_bytes()
    # Nothing of the group is deployed yet; built once in the parent too, so the forked attempts inherit the
    # clients' lazily imported modules (kubernetes, botocore's models) instead of loading them each time.
    with StepRun(env, tmp_path / "cleanup", kind, "manual__kill-precheck") as run:
        assert live_state(env, run, kind)["exists"] is False
    yield env, tmp_path, kind
    cleanup(env, tmp_path, kind)
    if kind != "scraper":  # the source's file is as before the test: byte for byte
        assert source_path.read_bytes() == source_before


@pytest.mark.parametrize("path_env", PATHS, indirect=True)
def test_path_snapshot_killed_before_its_event(path_env: tuple[Env, Path, str]) -> None:
    env, tmp_path, kind = path_env
    run_id = f"manual__kill-snapshot-{kind}"

    def attempt() -> None:
        with StepRun(env, tmp_path, kind, run_id) as run:
            run.step.snapshot(now())

    killed(attempt, at_event="snapshot_taken")
    assert any(p.is_file() for p in (tmp_path / "snapshots").rglob("*"))  # the side effect: the stored snapshot
    with StepRun(env, tmp_path, kind, run_id) as run:
        before = live_state(env, run, kind)
        info = run.step.snapshot(now())  # the retry
        assert info["kind"] == kind and run.step.store.get(info["snapshot_ref"]).sha256 == info["sha256"]
        check_chain_and_stage(run.audit.url, run.group.name, "snapshot_taken", Stage.PLANNED)
        assert live_state(env, run, kind) == before and before["exists"] is False


@pytest.mark.parametrize("hook", ["after-deploy-write", "before-event"])
@pytest.mark.parametrize("path_env", PATHS, indirect=True)
def test_path_deploy_killed_between_its_write_and_its_event(path_env: tuple[Env, Path, str], hook: str) -> None:
    """Killed right after the deployer's write (the task never deferred) or right before ``dual_write_deployed``
    (in ``finish``, after the triggerer's event): Airflow's retry runs the whole task again from ``start``."""
    env, tmp_path, kind = path_env
    run_id = f"manual__kill-deploy-{kind}"
    with StepRun(env, tmp_path, kind, run_id) as run:
        snap = run.step.snapshot(now())

    def attempt() -> None:
        with StepRun(env, tmp_path, kind, run_id) as run:
            run.deploy_task(snap)

    if hook == "after-deploy-write":
        killed(attempt, after=(DEPLOYERS[kind], "deploy"))
    else:
        killed(attempt, at_event="dual_write_deployed")
    with StepRun(env, tmp_path, kind, run_id) as run:
        assert live_state(env, run, kind)["exists"] is True  # the side effect
        out = run.deploy_task(snap)  # the retry: the whole task
        assert out["deploy"]["state"] == "done"
        found = check_chain_and_stage(run.audit.url, run.group.name, "dual_write_deployed", Stage.DUAL_WRITING)
        assert found == ["snapshot_taken", "dual_write_deployed"]
        state = live_state(env, run, kind)
        if kind == "scraper":
            assert state == {"exists": True, "ours": True, "status": "ACTIVE"}
        else:
            assert state["entries"].count(remote_write_name(run.group.name)) == 1 and state["live"] is True
        rolled = run.rollback_task(snap, reason="test: end")
        assert rolled["restored_identical"] is True
        assert live_state(env, run, kind)["exists"] is False


@pytest.mark.parametrize("hook", ["after-restore-write", "before-event"])
@pytest.mark.parametrize("path_env", PATHS, indirect=True)
def test_path_rollback_killed_between_its_write_and_its_event(path_env: tuple[Env, Path, str],
                                                              hook: str) -> None:
    """A cut-over run rolled back: killed right after the deployer's restore write, or right before
    ``rolled_back`` (the reads already routed back to the source); the retry runs the whole task again."""
    env, tmp_path, kind = path_env
    run_id = f"manual__kill-rollback-{kind}"
    with StepRun(env, tmp_path, kind, run_id) as run:
        snap = run.step.snapshot(now())
        run.deploy_task(snap)
        m = run.migration
        m.start_warmup(now())
        m.record("gate_passed", now(), {"test": True}, to=Stage.VERIFIED)
        m.record_approval(decision="Approve", by="tester", comment="", now=now())
        m.cutover(now())
        assert m.routing.read_from(run.group.name) == "target"

    def attempt() -> None:
        with StepRun(env, tmp_path, kind, run_id) as run:
            run.rollback_task(snap, reason="test: killed rollback")

    if hook == "after-restore-write":
        killed(attempt, after=(DEPLOYERS[kind], "restore"))
    else:
        killed(attempt, at_event="rolled_back")
    with StepRun(env, tmp_path, kind, run_id) as run:
        if hook == "before-event":
            assert run.migration.routing.read_from(run.group.name) == "source"  # the side effect
            assert live_state(env, run, kind)["exists"] is False
        rolled = run.rollback_task(snap, reason="test: killed rollback")  # the retry: the whole task
        assert rolled["restored_identical"] is True
        found = check_chain_and_stage(run.audit.url, run.group.name, "rolled_back", Stage.ROLLED_BACK)
        assert found == ["snapshot_taken", "dual_write_deployed", "warmup_started", "gate_passed", "approved",
                         "cut_over", "rolled_back"]
        assert run.migration.routing.read_from(run.group.name) == "source"
        state = live_state(env, run, kind)
        assert state["exists"] is False
        if kind != "scraper":
            assert state["live"] is False
