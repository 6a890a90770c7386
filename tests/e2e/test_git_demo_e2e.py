"""End to end: ``make demo TARGET=amp DEPLOY=git`` and ``SCENARIO=drift DEPLOY=git`` through Airflow (issue 23).

The source is managed through git: the stack's git component holds a bare config repository (kube-prometheus-stack
values), a reconciler stand-in that syncs it onto the source like Argo CD / Flux, and a GitHub API contract
server whose reviewer stand-in merges pull requests. Airflow's source connection says ``extra.deploy: git``; the
group's entry must reach the source only as a commit merged through a pull request, and the drift run must roll
back with a revert commit that leaves the values file byte-identical.

Session: one stack and one Airflow of its own for both scenarios, one after the other (the spine session's stack
has no git component, and the reconciler owns the source config, undoing other scenarios' direct edits).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from promshift.core.deploy_kinds import GIT
from promshift.core.render import remote_write_names
from promshift.local.demo import QUICK_PROFILE
from promshift.local.stack.local import LocalStack
from tests.e2e.conftest import SharedSession, shared_session

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3000)]
RUN_TIMEOUT_S = 1200.0  # the first counts from the session start; Airflow took 6 min to start at load 26
AWS = {"AWS_ACCESS_KEY_ID": "AKIAE2EGITDEMO000001", "AWS_SECRET_ACCESS_KEY": "e2eGitDemoSecretKey/0123456789abcdefghij"}


@pytest.fixture(scope="module")
def git_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedSession]:
    with shared_session(tmp_path_factory.mktemp("git"), env={**AWS, "PROMSHIFT_GITHUB_PORT": "0"},
                        unset=("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_REGION", "PROMSHIFT_K8S_PORT"),
                        nodes=12, target_kind="amp", git=True, profile=QUICK_PROFILE) as shared:
        yield shared


def read_repository(stack: LocalStack) -> dict[str, Any]:
    address = stack.git_address() or {}
    out = subprocess.run(["git", "--git-dir", address["repo"], "show", f"main:{address['path']}"],
                         capture_output=True, check=True).stdout
    log = subprocess.run(["git", "--git-dir", address["repo"], "log", "--format=%an|%s", "main"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    return {"values": out, "log": log, "token": stack.git_token()}


def happy(session: SharedSession) -> Any:
    return session.run("happy", group="gpu-memory", scenario="happy", deploy=GIT, read=read_repository,
                       timeout_s=RUN_TIMEOUT_S)


def test_happy_cuts_over_through_commits_only(git_session: SharedSession) -> None:
    run = happy(git_session)
    report = run.report
    assert report["final_stage"] == "cut_over", report["summary"]
    deploy = report["deploy"]
    assert deploy["kind"] == "git" and deploy["status_history"][-1]["status"] == "LIVE", deploy
    assert deploy["status_history"][0]["status"] == "CHANGE_REQUESTED"
    change = deploy["change"]
    assert change["shape"] == "helm-values" and change["branch"] == "main" and len(change["commits"]) == 1
    request = change["change_request"]
    assert request["kind"] == "github-pull-request" and request["url"].endswith("/platform/gpu-monitoring/pull/1")
    # The config repository: our commit was merged through the pull request; every source change was a sync.
    repo = report["config_repository"]
    assert [line.split(" ", 1)[1] for line in repo["commits"]] == [
        "promshift promshift: dual-write gpu-memory (promshift-gpu-memory)"]
    assert any(s["changed"] for s in repo["syncs"]) and not repo["identical"]
    assert b"promshift-gpu-memory" in run.read["values"]
    assert remote_write_names(run.source_config) == ["promshift-gpu-memory"]
    assert report["parity"]["verdict"] == "SUCCESSFUL" and report["target"]["sigv4_rejected"] == 0
    assert run.read["token"] not in (run.out / "report.json").read_text()  # no secret in the report


def test_drift_rolls_back_with_a_revert_commit_and_identical_bytes(git_session: SharedSession) -> None:
    happy(git_session)  # one after the other: each run's revert must see only its own commit
    run = git_session.run("drift", group="gpu-utilization", scenario="drift", deploy=GIT, read=read_repository,
                          timeout_s=RUN_TIMEOUT_S)
    report = run.report
    assert report["final_stage"] == "rolled_back", report["summary"]
    assert report["rollback"]["performed"] and report["rollback"]["restored_identical"], report["rollback"]
    change = report["rollback"]["change"]
    assert change["method"] == "revert" and len(change["commits"]) == 1
    repo = report["config_repository"]
    assert repo["identical"] and repo["file_sha256_before"] == repo["file_sha256_after"], repo
    assert [line.split(" ", 1)[1] for line in repo["commits"]] == [
        'promshift Revert "promshift: dual-write gpu-utilization (promshift-gpu-utilization)"',
        "promshift promshift: dual-write gpu-utilization (promshift-gpu-utilization)"]
    assert report["source_config"]["identical"], report["source_config"]
    assert remote_write_names(run.source_config) == ["promshift-gpu-memory"]  # the happy run's entry stays
