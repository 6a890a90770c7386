"""The git deploy's choice and connection extra, the pull-request backend's requests (built, not sent), and the
bake's ``entry`` measurement."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests
from requests.adapters import BaseAdapter

from promshift.adapters.git_deploy import GitHubError, GitHubPullRequests, redact_url
from promshift.core.bake import BakeObservation, judge
from promshift.core.deploy_kinds import deploy_kind_of, deploy_of
from promshift.core.git_source import git_source_of
from promshift.core.verdicts import Verdict

GIT = {"url": "https://github.com/acme/monitoring.git", "path": "clusters/east/values.yaml", "shape": "helm-values",
       "backend": "github", "github": {"repository": "acme/monitoring"}, "conn_id": "promshift_git"}


def test_the_source_connection_chooses_git_and_a_bad_extra_is_one_line_at_validate() -> None:
    assert deploy_kind_of({}, conn_id="t", is_amp=True, source_extra={"deploy": "git", "git": GIT}) == "git"
    deploy = deploy_of("git")
    assert deploy.change_request and deploy.source_queue and deploy.config_by_api
    assert not deploy_of("k8s-cr").change_request
    with pytest.raises(ValueError, match="asks for git: choose one"):
        deploy_kind_of({"deploy": "scraper"}, conn_id="t", is_amp=True, source_extra={"deploy": "git", "git": GIT})
    with pytest.raises(ValueError, match=r"^connection 's': extra.git.shape must be one of helm-values, "
                                         r"prometheus-yml, manifest, got 'kustomize'$"):
        deploy_kind_of({}, conn_id="t", is_amp=True, source_conn_id="s",
                       source_extra={"deploy": "git", "git": {**GIT, "shape": "kustomize"}})


@pytest.mark.parametrize(("change", "message"), [
    ({"url": "https://bot:ghp_secret@github.com/a/b.git"}, "must not carry a password"),
    ({"path": "../etc/passwd"}, "relative path in the repository"),
    ({"branch": "main..x"}, "is not a branch name"),
    ({"backend": "gitlab"}, "backend must be one of github, direct"),
    ({"github": {"repository": "not a repo"}}, "github.repository must be owner/name"),
    ({"timeout_s": 0}, "timeout_s must be a positive number"),
    ({"token": "ghp_x"}, "unknown keys \\['token'\\]"),
])
def test_bad_git_extras_name_the_bad_value_and_never_the_token(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        git_source_of({"git": {**GIT, **change}})
    assert "ghp_secret" not in str(caught.value) and "\n" not in str(caught.value)


def test_git_source_defaults_and_change_branches() -> None:
    source = git_source_of({"git": {"url": "/srv/config.git", "path": "prometheus.yml", "shape": "prometheus-yml"}})
    assert (source.backend, source.branch, source.repository, source.timeout_s) == ("direct", "main", None, 900.0)
    assert source.change_branch("gpu-memory", "manual__2026-12-05T03:00:00+00:00", "dual-write") == \
        "promshift/gpu-memory/dual-write-manual__2026-12-05T03-00-00-00-00"
    assert redact_url("https://x-access-token:ghp_abc@github.com/a/b.git") == "https://github.com/a/b.git"


class Recorder(BaseAdapter):
    """A transport that records each prepared request and answers from a script (nothing leaves the process)."""

    def __init__(self, answers: list[tuple[int, Any]]) -> None:
        super().__init__()
        self.answers = answers
        self.sent: list[requests.PreparedRequest] = []

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        self.sent.append(request)
        code, body = self.answers.pop(0)
        resp = requests.Response()
        resp.status_code, resp._content, resp.request, resp.url = code, json.dumps(body).encode(), request, request.url
        return resp

    def close(self) -> None:
        pass


def backend(answers: list[tuple[int, Any]]) -> tuple[GitHubPullRequests, Recorder]:
    session, recorder = requests.Session(), Recorder(answers)
    session.mount("https://", recorder)
    return GitHubPullRequests("https://ghe.example/api/v3", "acme/monitoring", "ghp_token", session=session), recorder


PULL = {"number": 7, "html_url": "https://ghe.example/acme/monitoring/pull/7", "state": "open", "merged": False,
        "head": {"ref": "promshift/gpu-memory/dual-write-r1", "sha": "abc"}, "merge_commit_sha": None}


def test_the_pull_request_is_asked_for_as_githubs_rest_api_documents_it() -> None:
    gh, rec = backend([(201, PULL)])
    pull = gh._pull(gh.request("POST", "/pulls", json={"title": "t", "head": "promshift/gpu-memory/dual-write-r1",
                                                       "base": "main", "body": "b"}))
    [sent] = rec.sent
    assert (sent.method, sent.url) == ("POST", "https://ghe.example/api/v3/repos/acme/monitoring/pulls")
    assert sent.headers["Authorization"] == "Bearer ghp_token"
    assert sent.headers["Accept"] == "application/vnd.github+json"
    assert sent.headers["X-GitHub-Api-Version"] == "2022-11-28"
    assert json.loads(sent.body or b"") == {"title": "t", "head": "promshift/gpu-memory/dual-write-r1", "base": "main",
                                            "body": "b"}
    assert pull == {"kind": "github-pull-request", "url": PULL["html_url"], "number": 7, "state": "open",
                    "merged": False, "branch": "promshift/gpu-memory/dual-write-r1", "commit": "abc",
                    "merge_commit": None}
    assert "ghp_token" not in json.dumps(pull)


def test_withdraw_finds_the_open_pull_request_by_head_and_closes_it() -> None:
    gh, rec = backend([(200, [PULL]), (200, {**PULL, "state": "closed"})])
    closed = gh.withdraw(head="promshift/gpu-memory/dual-write-r1")
    assert closed is not None and closed["closed"] and closed["state"] == "closed"
    find, close = rec.sent
    assert find.method == "GET" and find.url == ("https://ghe.example/api/v3/repos/acme/monitoring/pulls?"
                                                 "head=acme%3Apromshift%2Fgpu-memory%2Fdual-write-r1&state=open")
    assert (close.method, close.url) == ("PATCH", "https://ghe.example/api/v3/repos/acme/monitoring/pulls/7")
    assert json.loads(close.body or b"") == {"state": "closed"}


def test_githubs_refusal_is_one_line_without_the_token() -> None:
    gh, _ = backend([(403, {"message": "Resource not accessible by integration ghp_token"})])
    with pytest.raises(GitHubError, match=r"^GET /repos/acme/monitoring/pulls/7: HTTP 403 ") as caught:
        gh.get(7)
    assert "ghp_token" not in str(caught.value)


def test_the_bake_fails_and_says_so_when_our_entry_left_the_loaded_config() -> None:
    from promshift.adapters.settings import REPO_ROOT, load_catalog

    policy = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get("gpu-memory").bake
    clean = BakeObservation(target_newest_age_s=4, lag_s=1.0, failed_samples=0, source_series=8, target_series=8,
                            parity=Verdict.SUCCESSFUL, entry_loaded=True, entry_name="promshift-gpu-memory")
    assert judge(clean, policy).verdict is Verdict.SUCCESSFUL
    gone = judge(BakeObservation(**{**clean.__dict__, "entry_loaded": False}), policy)
    assert gone.verdict is Verdict.FAILED
    assert gone.reason().startswith("entry FAILED: remote_write promshift-gpu-memory is no longer in the source's "
                                    "loaded config: a later sync")
    unobserved = judge(BakeObservation(**{**clean.__dict__, "entry_loaded": None}), policy)
    assert "entry" not in [m.name for m in unobserved.measurements]
