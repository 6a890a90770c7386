"""The git deploy against a real bare repository, the real ``git`` binary, the GitHub API contract server, the
reconciler stand-in and a real Prometheus: commits in, the sync loads them, a revert brings the bytes back."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from promshift.adapters.git_deploy import DirectPush, GitDeployment, GitHubError, GitHubPullRequests
from promshift.adapters.prometheus import PrometheusClient
from promshift.core.deploy import DeployError, DeployResult, DeployState
from promshift.core.git_render import entry_names
from promshift.core.git_source import GitSource
from promshift.core.render import remote_write_entry, remote_write_names
from promshift.core.verdicts import Verdict
from promshift.local.stack.github_api import GitHubContractServer
from promshift.local.stack.local import PROMETHEUS_BIN, find_free_ports
from promshift.local.stack.prometheus import PrometheusProcess
from promshift.local.stack.reconciler import REPOSITORY, VALUES_PATH, Reconciler, init_repository
from promshift.orchestration.compose import compose_migration

pytestmark = pytest.mark.integration

CONFIG = "# the source's own config\nglobal:\n  scrape_interval: 5s  # keep\nscrape_configs:\n  - job_name: self\n" \
         "    static_configs: [{targets: ['127.0.0.1:1']}]\n"
TOKEN = "ghp_localcontracttoken0123456789"
NAME = "promshift-gpu-memory"


@dataclass
class Env:
    repo: Path
    config: Path
    prometheus: PrometheusClient
    reconciler: Reconciler
    github: GitHubContractServer


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    if not Path(PROMETHEUS_BIN).exists():
        pytest.skip("Prometheus is not installed (apt-get install -y prometheus)")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(CONFIG)
    repo, base = init_repository(tmp_path / "git", cfg)
    (port,) = find_free_ports(1)
    with PrometheusProcess("prometheus", tmp_path, port=port, config=cfg, data_dir=tmp_path / "data",
                           flags=("--web.enable-lifecycle",)) as prometheus:
        reconciler = Reconciler(repo, base=base, config_path=cfg, prometheus_url=prometheus.url, interval_s=0.3)
        reconciler.sync_once()
        reconciler.start()
        github = GitHubContractServer(repo, repository=REPOSITORY, token=TOKEN, merge_after_s=0.5).start()
        try:
            yield Env(repo, cfg, PrometheusClient(prometheus.url, timeout_s=30), reconciler, github)
        finally:
            reconciler.stop()
            github.stop()


def deployer(env: Env, backend: str, *, run_id: str = "manual__t1", token: str = TOKEN) -> GitDeployment:
    source = GitSource(url=str(env.repo), path=VALUES_PATH, shape="helm-values", backend=backend,
                       repository=REPOSITORY if backend == "github" else None, api_url=env.github.base_url,
                       timeout_s=30)
    entry = remote_write_entry(group_name="gpu-memory", name_regex="DCGM_FI_DEV_FB_.*",
                               url="http://127.0.0.1:1/api/v1/write")
    change = (GitHubPullRequests(env.github.base_url, REPOSITORY, token, http_loopback=True) if backend == "github"
              else DirectPush())
    return GitDeployment(source, entry=entry, prometheus=env.prometheus, backend=change, group="gpu-memory",
                         run_id=run_id, token=token)


def follow(d: GitDeployment, result: DeployResult, timeout: float = 20.0) -> DeployResult:
    deadline = time.monotonic() + timeout
    while not result.state.final and time.monotonic() < deadline:
        time.sleep(0.2)
        result = d.verify(result, datetime.now(UTC))
    return result


def tip_file(repo: Path) -> bytes:
    return subprocess.run(["git", "--git-dir", str(repo), "show", f"main:{VALUES_PATH}"], capture_output=True,
                          check=True).stdout


def log(repo: Path) -> list[str]:
    return subprocess.run(["git", "--git-dir", str(repo), "log", "--format=%an|%s", "main"], capture_output=True,
                          text=True, check=True).stdout.splitlines()


def test_direct_push_commits_waits_for_the_sync_and_reverts_byte_for_byte(env: Env) -> None:
    d = deployer(env, "direct")
    before, config_before = tip_file(env.repo), env.config.read_bytes()
    snap = d.snapshot()
    assert snap.content.encode() == before and snap.meta["commit"]
    started = time.monotonic()
    result = d.deploy(snap, datetime.now(UTC))
    assert result.state is DeployState.WAITING and result.status == "CHANGE_PUSHED"
    change = result.details["change"]
    assert change["repository"] == str(env.repo) and change["branch"] == "main" and change["path"] == VALUES_PATH
    assert change["change_request"]["kind"] == "direct-push" and len(change["commits"]) == 1
    assert NAME not in remote_write_names(env.config.read_text())  # nothing live was written by us
    result = follow(d, result)
    assert result.state is DeployState.DONE, result.reason
    print(f"deploy -> loaded by the sync in {time.monotonic() - started:.2f}s (interval 0.3s)")
    assert NAME in remote_write_names(env.prometheus.config_text())
    assert entry_names("helm-values", tip_file(env.repo)) == [NAME]  # the chart's `remoteWrite: []` took it

    restored = follow(d, d.restore(snap, datetime.now(UTC)))
    assert restored.state is DeployState.DONE and restored.details["change"]["method"] == "revert"
    assert restored.details["change"]["restored_identical"] is True
    assert tip_file(env.repo) == before and env.config.read_bytes() == config_before
    assert NAME not in remote_write_names(env.prometheus.config_text())
    assert log(env.repo)[:2] == ['promshift|Revert "promshift: dual-write gpu-memory (promshift-gpu-memory)"',
                                 "promshift|promshift: dual-write gpu-memory (promshift-gpu-memory)"]
    assert d.snapshot().sha256 == snap.sha256  # what DeployStep._live_is compares
    # A retried rollback (the task died after the revert reached the branch) reports the same revert commit.
    again = d.restore(snap, datetime.now(UTC)).details["change"]
    assert (again["method"], again["commits"]) == ("revert", restored.details["change"]["commits"])
    assert again["change_request"]["already_there"] and len(log(env.repo)) == 3


def test_pull_request_backend_merged_by_review_then_reverted_through_another(env: Env) -> None:
    d = deployer(env, "github")
    before = tip_file(env.repo)
    snap = d.snapshot()
    result = d.deploy(snap, datetime.now(UTC))
    request = result.details["change"]["change_request"]
    assert result.status == "CHANGE_REQUESTED" and request["kind"] == "github-pull-request"
    assert request["number"] == 1 and request["url"].endswith(f"/{REPOSITORY}/pull/1")
    assert request["branch"] == "promshift/gpu-memory/dual-write-manual__t1"
    method, path, body = env.github.bodies[0]
    assert (method, path) == ("POST", f"/repos/{REPOSITORY}/pulls")
    assert body["head"] == request["branch"] and body["base"] == "main" and "gpu-memory" in body["title"]
    assert TOKEN not in json.dumps(result.to_dict())
    live = follow(d, result)  # merged by the reviewer stand-in, then synced
    assert live.state is DeployState.DONE and env.github.pulls[1]["merged"] is True
    statuses = [c.status for c in live.status_history]  # WAITING_FOR_RELOAD may come between MERGED and LIVE
    assert statuses[:2] == ["CHANGE_REQUESTED", "MERGED"] and statuses[-1] == "LIVE", statuses

    restored = follow(d, d.restore(snap, datetime.now(UTC)))
    assert restored.state is DeployState.DONE
    assert restored.details["change"]["change_request"]["number"] == 2
    assert tip_file(env.repo) == before


def test_an_unmerged_pull_request_is_closed_and_nothing_is_committed(env: Env) -> None:
    env.github.merge_after_s = None  # nobody reviews
    d = deployer(env, "github", run_id="manual__t2")
    before, commits = tip_file(env.repo), log(env.repo)
    snap = d.snapshot()
    d.deploy(snap, datetime.now(UTC))
    restored = d.restore(snap, datetime.now(UTC))
    assert restored.details["change"]["method"] == "closed_unmerged" and restored.status == "CHANGE_WITHDRAWN"
    assert restored.details["change"]["commits"] == []
    assert env.github.bodies[-1] == ("PATCH", f"/repos/{REPOSITORY}/pulls/1", {"state": "closed"})
    assert env.github.pulls[1]["state"] == "closed" and not env.github.pulls[1]["merged"]
    assert follow(d, restored).state is DeployState.DONE
    assert tip_file(env.repo) == before and log(env.repo) == commits


def test_a_pull_request_closed_without_merging_fails_the_wait(env: Env) -> None:
    env.github.merge_after_s = None
    d = deployer(env, "github", run_id="manual__t3")
    result = d.deploy(d.snapshot(), datetime.now(UTC))
    result = d.verify(result, datetime.now(UTC))
    assert result.state is DeployState.WAITING and result.reason.startswith("waiting for the review of pull request #1")
    GitHubPullRequests(env.github.base_url, REPOSITORY, TOKEN, http_loopback=True).request(
        "PATCH", "/pulls/1", json={"state": "closed"})
    failed = d.verify(result, datetime.now(UTC))
    assert failed.state is DeployState.FAILED and failed.status == "CLOSED_UNMERGED"
    assert failed.reason.endswith("was closed without merging")


def test_the_contract_server_refuses_a_bad_token_and_a_missing_branch_in_one_line(env: Env) -> None:
    bad = GitHubPullRequests(env.github.base_url, REPOSITORY, "ghp_wrong", http_loopback=True)
    with pytest.raises(GitHubError, match=r"HTTP 401 Bad credentials$") as caught:
        bad.request("POST", "/pulls", json={"title": "t", "head": "main", "base": "main"})
    assert "ghp_wrong" not in str(caught.value)
    good = GitHubPullRequests(env.github.base_url, REPOSITORY, TOKEN, http_loopback=True)
    with pytest.raises(GitHubError, match="HTTP 422 Validation Failed"):
        good.request("POST", "/pulls", json={"title": "t", "head": "no-such-branch", "base": "main"})
    with pytest.raises(GitHubError, match="HTTP 422 Validation Failed"):
        good.request("POST", "/pulls", json={"title": "t", "head": "main", "base": "main", "labels": ["x"]})


def test_a_file_changed_since_the_snapshot_is_not_overwritten(env: Env) -> None:
    d = deployer(env, "direct")
    snap = d.snapshot()
    work = env.repo.parent / "other"
    git = ["git", "-c", "user.name=someone", "-c", "user.email=s@x"]
    subprocess.run([*git, "clone", "--quiet", str(env.repo), str(work)], check=True)
    (work / VALUES_PATH).write_text((work / VALUES_PATH).read_text() + "kubeStateMetrics:\n  enabled: false\n")
    subprocess.run([*git, "commit", "--quiet", "-am", "someone else"], cwd=work, check=True)
    subprocess.run([*git, "push", "--quiet", "origin", "HEAD:main"], cwd=work, check=True)
    with pytest.raises(DeployError, match="changed since the snapshot .*refusing to deploy, nothing committed"):
        d.deploy(snap, datetime.now(UTC))
    assert log(env.repo)[0] == "someone|someone else"


def test_a_sync_that_drops_our_entry_during_the_bake_is_reported_by_the_next_check(env: Env, tmp_path: Path) -> None:
    """Someone's commit (a values file from another source of truth) drops our entry; the reconciler syncs it;
    the next bake check fails on ``entry`` and its line says the entry is gone from the loaded config."""
    from promshift.adapters.audit_store import AuditStore
    from promshift.adapters.routing import RoutingStore
    from promshift.adapters.settings import REPO_ROOT, load_catalog
    from promshift.core.deploy_kinds import deploy_of
    from promshift.core.stages import Stage
    from promshift.steps.lifecycle import GroupLifecycle
    from promshift.steps.migration import Backends

    d = deployer(env, "direct")
    before = tip_file(env.repo)
    assert follow(d, d.deploy(d.snapshot(), datetime.now(UTC))).state is DeployState.DONE
    audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    stage = Stage.PLANNED
    for to in (Stage.DUAL_WRITING, Stage.WARMING, Stage.VERIFIED, Stage.APPROVED, Stage.CUT_OVER):
        audit.append(group="gpu-memory", run_id="manual__t1", kind=f"seed_{to.value}", actor="test",
                     at=datetime.now(UTC), evidence={}, stage_from=stage, stage_to=to)
        stage = to
    group = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get("gpu-memory")
    backends = Backends(source=env.prometheus, target=env.prometheus, source_config_path="",
                        target_remote_write_url="")

    def bake() -> GroupLifecycle:
        m = compose_migration(group, backends, audit=audit, routing=RoutingStore(audit.url), snapshots_dir=tmp_path,
                           run_id=f"scheduled__{time.monotonic_ns()}")
        return GroupLifecycle(m, deploy=deploy_of("git"), parity_check=lambda start, now: (Verdict.SUCCESSFUL, "ok"))

    assert bake().observe(datetime.now(UTC)).entry_loaded is True
    # A sync of another source of truth: the values file as it was before our commit, pushed by someone else.
    work = tmp_path / "other"
    git = ["git", "-c", "user.name=platform-bot", "-c", "user.email=p@x"]
    subprocess.run([*git, "clone", "--quiet", str(env.repo), str(work)], check=True)
    (work / VALUES_PATH).write_bytes(before)
    subprocess.run([*git, "commit", "--quiet", "-am", "sync values from the platform chart"], cwd=work, check=True)
    subprocess.run([*git, "push", "--quiet", "origin", "HEAD:main"], cwd=work, check=True)
    deadline = time.monotonic() + 20
    while NAME in remote_write_names(env.prometheus.config_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    out = bake().bake_check(datetime.now(UTC))
    [entry] = [m for m in out["check"]["measurements"] if m["name"] == "entry"]
    assert entry["verdict"] == "FAILED"
    assert entry["reason"].startswith("remote_write promshift-gpu-memory is no longer in the source's loaded config")
    assert out["outcome"] == "rolled_back_reads" and "entry FAILED: remote_write promshift-gpu-memory" in out["reason"]
    audit.engine.dispose()


def test_a_symlinked_directory_in_the_repository_is_refused_before_any_write(tmp_path: Path) -> None:
    """``clusters -> /elsewhere`` committed in the team's repository: the clone's path to the values file leads
    outside the clone; the deploy refuses in one line and the file outside keeps its bytes."""
    outside = tmp_path / "elsewhere"
    (outside / "prod").mkdir(parents=True)
    values = outside / "prod" / "values.yaml"
    values.write_text("prometheus:\n  prometheusSpec:\n    retention: 15d\n")
    before = values.read_bytes()
    git = ["git", "-c", "user.name=someone", "-c", "user.email=s@x"]
    repo, work = tmp_path / "repo.git", tmp_path / "work"
    subprocess.run(["git", "init", "--quiet", "--bare", "--initial-branch", "main", str(repo)], check=True)
    subprocess.run(["git", "clone", "--quiet", str(repo), str(work)], check=True, capture_output=True)
    (work / "clusters").symlink_to(outside)
    subprocess.run([*git, "add", "clusters"], cwd=work, check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "clusters elsewhere"], cwd=work, check=True)
    subprocess.run([*git, "push", "--quiet", "origin", "HEAD:refs/heads/main"], cwd=work, check=True)
    source = GitSource(url=str(repo), path="clusters/prod/values.yaml", shape="helm-values")
    entry = remote_write_entry(group_name="gpu-memory", name_regex="DCGM_FI_DEV_FB_.*",
                               url="http://127.0.0.1:1/api/v1/write")
    d = GitDeployment(source, entry=entry, prometheus=PrometheusClient("http://127.0.0.1:1"), backend=DirectPush(),
                      group="gpu-memory", run_id="manual__t1")
    with pytest.raises(DeployError, match="clusters is a symbolic link in the repository") as refused:
        d.snapshot()
    assert "\n" not in str(refused.value)
    assert values.read_bytes() == before
