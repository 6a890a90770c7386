"""Deploy a group's ``remote_write`` entry as a commit in the team's config repository (the ``git`` deploy).

Where Prometheus is managed through git (kube-prometheus-stack values synced by Argo CD, Flux or
``helm upgrade``), a write to the live ConfigMap or resource is undone by the next sync. ``GitDeployment``
(a ``core.deploy.ConfigDeployer``) changes the file in git instead and lets the team's sync deploy it:

- ``snapshot``: the file's bytes at the tip of ``branch`` (and that commit's SHA);
- ``deploy``: a fresh clone (a temporary directory, removed afterwards: no state on the worker), the file
  edited byte for byte (``core.git_render.add_entry``), one commit, then the change backend:
  ``DirectPush`` pushes it to ``branch``; ``GitHubPullRequests`` pushes a branch of its own and opens a pull
  request through GitHub's REST API. The result is WAITING until the source's loaded config shows the entry
  (``verify`` = ``adapters.k8s_deploy.observe_loaded_config``, the ``LoadedConfigTrigger``), TIMEOUT at
  ``timeout_s`` (the run then rolls back);
- ``restore``: a revert commit of ours through the same backend (``git revert``: the file's bytes come back
  exactly); if others edited the file since, only our entry is removed. A pull request that was never
  merged is closed instead, and nothing is committed.

The real ``git`` binary does the work (``subprocess``, no shell, a time budget per call). The token (an
Airflow connection's password, resolved by the caller) reaches git in its environment as an HTTP header
(``GIT_CONFIG_*``), never on a command line, and never in a result, record or message (``redact_text``).
"""

from __future__ import annotations

import base64
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import requests

from promshift.adapters.files import read_user_file
from promshift.adapters.prometheus import PrometheusClient
from promshift.core.deploy import DeployError, DeployKind, DeployResult, DeploySnapshot, DeployState
from promshift.core.git_render import GIT_FILE, GitRenderError, add_entry, entry_names, remove_entry
from promshift.core.git_source import GitSource, plain_http_problem
from promshift.core.inputs import InputRefused
from promshift.core.redact import redact_text
from promshift.core.render import sha256_text

GIT_TIMEOUT_S = 120.0
MAX_FILE_BYTES = GIT_FILE.max_bytes  # a config file larger than this is refused, not edited
MAX_RESPONSE_BYTES = 1 << 20
HTTP_TIMEOUT_S = 15.0
GITHUB_API_VERSION = "2022-11-28"
CHANGE_TRAILER = "Promshift-Change"

log = logging.getLogger(__name__)


def redact_url(url: str) -> str:
    """A repository URL without any user:password part."""
    return redact_text(re.sub(r"^([a-z+]+://)[^/@]*@", r"\1", url, flags=re.IGNORECASE))


def scrub(text: str, secret: str | None) -> str:
    """``text`` redacted, and without ``secret`` (our own token, which a server may echo back) anywhere in it."""
    text = redact_text(text)
    return text.replace(secret, "***") if secret else text


class GitError(DeployError):
    """A git command failed; one line (the command's last words, redacted)."""


@dataclass
class Git:
    """The ``git`` binary over one repository URL; every call gets a time budget and a clean environment."""

    url: str
    token: str | None = None
    binary: str = "git"
    timeout_s: float = GIT_TIMEOUT_S

    http_loopback: bool = False

    def env(self, home: str) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "LANG": "C", "LC_ALL": "C",
               "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
        if self.token:
            problem = plain_http_problem(self.url, self.http_loopback)
            if problem:
                raise GitError(f"not sending the token: {problem}")
            if self.url.lower().startswith("http://"):
                log.warning("git: the token goes over plain http to %s (http_loopback: a local lab)",
                            redact_url(self.url))
            basic = base64.b64encode(f"x-access-token:{self.token}".encode()).decode()
            env.update({"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "http.extraHeader",
                        "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}"})
        return env

    def run(self, *args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        try:
            done = subprocess.run([self.binary, *args], cwd=cwd, env=self.env(str(cwd)), capture_output=True,
                                  text=True, timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise GitError(f"git {args[0]} took longer than {self.timeout_s:.0f}s; nothing more done") from None
        except OSError as exc:
            raise GitError(f"cannot run {self.binary!r}: {exc.strerror}") from None
        if check and done.returncode != 0:
            said = " ".join((done.stderr or done.stdout).split())[-300:]
            raise GitError(f"git {args[0]} failed ({done.returncode}): {scrub(said, self.token)}")
        return done

    @contextmanager
    def clone(self, branch: str) -> Iterator[Path]:
        """A fresh clone of ``branch`` in a temporary directory (removed afterwards, whatever happens)."""
        top = Path(tempfile.mkdtemp(prefix="promshift-git-"))
        try:
            self.run("clone", "--quiet", "--no-tags", "--single-branch", "--branch", branch, "--", self.url, "repo",
                     cwd=top)
            yield top / "repo"
        finally:
            shutil.rmtree(top, ignore_errors=True)


# -- change backends -------------------------------------------------------------------------------------


class ChangeBackend(Protocol):
    """How a commit on a local clone reaches the branch the team's sync deploys from."""

    kind: str

    def propose(self, git: Git, repo: Path, *, base: str, head: str, title: str, body: str) -> dict[str, Any]: ...

    def withdraw(self, *, head: str) -> dict[str, Any] | None: ...


class DirectPush:
    """For teams without review: the commit is pushed to the base branch (refused, not forced, if it moved)."""

    kind = "direct-push"

    def propose(self, git: Git, repo: Path, *, base: str, head: str, title: str, body: str) -> dict[str, Any]:
        sha = git.run("rev-parse", "HEAD", cwd=repo).stdout.strip()
        pushed = git.run("push", "--porcelain", "origin", f"HEAD:refs/heads/{base}", cwd=repo, check=False)
        if pushed.returncode != 0:
            why = " ".join((pushed.stderr or pushed.stdout).split())[-200:]
            raise GitError(f"push to {base} refused (someone pushed since our clone?): {scrub(why, git.token)}; "
                           "nothing deployed")
        return {"kind": self.kind, "url": None, "branch": base, "commit": sha, "merged": True}

    def withdraw(self, *, head: str) -> dict[str, Any] | None:
        return None


class GitHubError(DeployError):
    """GitHub's REST API refused or failed; one line with its status and message."""


class GitHubPullRequests:
    """A branch of our own and a pull request on GitHub (REST API v3, ``X-GitHub-Api-Version`` 2022-11-28).

    ``POST /repos/{owner}/{repo}/pulls`` opens it (422 "already exists": the open one for that head is found
    with ``GET …/pulls?head=owner:branch&state=open``), ``GET …/pulls/{n}`` reads its merge state,
    ``PATCH …/pulls/{n}`` ``{"state": "closed"}`` closes it. Bearer token; bodies and time budgeted.
    """

    kind = "github-pull-request"

    def __init__(self, api_url: str, repository: str, token: str | None, *,
                 session: requests.Session | None = None, http_loopback: bool = False) -> None:
        self.api_url = api_url.rstrip("/")
        if token:
            problem = plain_http_problem(self.api_url, http_loopback)
            if problem:
                raise GitHubError(f"GitHub API: not sending the token: {problem}")
            if self.api_url.lower().startswith("http://"):
                log.warning("GitHub API: the token goes over plain http to %s (http_loopback: a local lab)",
                            redact_url(self.api_url))
        self.repository = repository
        self.owner = repository.split("/")[0]
        self.token = token
        self.session = session or requests.Session()

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": GITHUB_API_VERSION,
                   "User-Agent": "promshift"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def request(self, method: str, path: str, *, json: Mapping[str, Any] | None = None,
                params: Mapping[str, str] | None = None) -> Any:
        url = f"{self.api_url}/repos/{self.repository}{path}"
        try:
            resp = self.session.request(method, url, json=json, params=params, headers=self.headers(),
                                        timeout=HTTP_TIMEOUT_S)
        except requests.RequestException as exc:
            raise GitHubError(f"cannot reach GitHub's API at {redact_text(self.api_url)}: {type(exc).__name__}") \
                from None
        if len(resp.content) > MAX_RESPONSE_BYTES:
            raise GitHubError(f"{method} {path}: answer larger than {MAX_RESPONSE_BYTES} bytes")
        try:
            body = resp.json() if resp.content else None
        except ValueError:
            body = None
        if resp.status_code >= 400:
            message = body.get("message") if isinstance(body, dict) else resp.reason
            raise GitHubError(f"{method} /repos/{self.repository}{path}: HTTP {resp.status_code} "
                              f"{scrub(' '.join(str(message).split())[:200], self.token)}")
        return body

    def _pull(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("number"), int):
            raise GitHubError("GitHub answered without a pull request number")
        return {"kind": self.kind, "url": body.get("html_url"), "number": body["number"],
                "state": body.get("state"), "merged": bool(body.get("merged")),
                "branch": (body.get("head") or {}).get("ref"), "commit": (body.get("head") or {}).get("sha"),
                "merge_commit": body.get("merge_commit_sha")}

    def propose(self, git: Git, repo: Path, *, base: str, head: str, title: str, body: str) -> dict[str, Any]:
        git.run("push", "--porcelain", "--force", "origin", f"HEAD:refs/heads/{head}", cwd=repo)
        try:
            pull = self.request("POST", "/pulls", json={"title": title, "head": head, "base": base, "body": body,
                                                        "maintainer_can_modify": True})
        except GitHubError as exc:
            if "already exists" not in str(exc):
                raise
            found = self.find_open(head)
            if found is None:
                raise
            return found
        return self._pull(pull)

    def find_open(self, head: str) -> dict[str, Any] | None:
        pulls = self.request("GET", "/pulls", params={"head": f"{self.owner}:{head}", "state": "open"})
        return self._pull(pulls[0]) if isinstance(pulls, list) and pulls else None

    def get(self, number: int) -> dict[str, Any]:
        return self._pull(self.request("GET", f"/pulls/{int(number)}"))

    def withdraw(self, *, head: str) -> dict[str, Any] | None:
        """Close our pull request from ``head`` if it is still open (never merged: nothing to revert)."""
        found = self.find_open(head)
        if found is None:
            return None
        return {**self._pull(self.request("PATCH", f"/pulls/{found['number']}", json={"state": "closed"})),
                "closed": True}


# -- the deployer ----------------------------------------------------------------------------------------


class RepoFile:
    """The source's file in a fresh clone of the team's config repository: checked, read and committed (the git
    deploy's and the git retire switch's, ``adapters.git_source_mode``)."""

    def __init__(self, source: GitSource, *, token: str | None = None) -> None:
        self.source = source
        self.git = Git(source.url, token=token, http_loopback=source.http_loopback)

    @property
    def where(self) -> str:
        return f"{redact_url(self.source.url)} {self.source.branch}:{self.source.path}"

    def _inside(self, repo: Path) -> Path:
        """The file's path in the clone, every component checked before anything is read or written: no
        component may be a symlink (``clusters -> /elsewhere`` would put our write outside the clone), the file
        must be a regular one, and the resolved path must stay under the clone."""
        root = repo.resolve()
        path = root
        for part in Path(self.source.path).parts:
            path = path / part
            if path.is_symlink():
                raise DeployError(f"{self.where}: {path.relative_to(root)} is a symbolic link in the repository; "
                                  "refusing to read or write through it")
        if not path.is_file() or not path.resolve().is_relative_to(root):
            raise DeployError(f"{self.where} is not a regular file in the repository; nothing to deploy into")
        return path

    def _reverted(self, repo: Path, commit: str) -> bytes | None:
        """The file's bytes once ``commit`` is reverted (the clone left at its tip either way), or None when the
        revert does not apply cleanly (the file changed since)."""
        reverted = self.git.run("revert", "--no-edit", "--no-commit", commit, cwd=repo, check=False).returncode == 0
        content = self._read(repo)[0] if reverted else None
        self.git.run("reset", "--quiet", "--hard", "HEAD", cwd=repo)
        return content

    def _read(self, repo: Path) -> tuple[bytes, str]:
        path = self._inside(repo)
        try:
            content = read_user_file(path, GIT_FILE)
        except InputRefused as exc:
            raise DeployError(f"{self.where}: {exc}") from None
        return content, self.git.run("rev-parse", "HEAD", cwd=repo).stdout.strip()

    def _commit(self, repo: Path, content: bytes, message: str) -> str:
        path = self._inside(repo)
        # In place (git keeps the file's mode), never through a symlink swapped in since the check.
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        self.git.run("add", "--", self.source.path, cwd=repo)
        self.git.run("-c", f"user.name={self.source.author_name}", "-c", f"user.email={self.source.author_email}",
                     "commit", "--quiet", "--no-verify", "-m", message, cwd=repo)
        return self.git.run("rev-parse", "HEAD", cwd=repo).stdout.strip()


class GitDeployment(RepoFile):
    """A ConfigDeployer writing the group's entry into the team's config repository (module docstring)."""

    kind = DeployKind.GIT.value

    def __init__(self, source: GitSource, *, entry: Mapping[str, Any], prometheus: PrometheusClient,
                 backend: ChangeBackend, group: str, run_id: str, token: str | None = None) -> None:
        super().__init__(source, token=token)
        self.entry = dict(entry)
        self.name = str(entry["name"])
        self.prometheus = prometheus
        self.backend = backend
        self.group = group
        self.run_id = run_id

    def _trailer(self, action: str) -> str:
        return f"{CHANGE_TRAILER}: {action} {self.group} {self.run_id}"

    def _details(self, base: dict[str, Any], change: dict[str, Any], now: datetime) -> dict[str, Any]:
        return {"remote_write": self.name, "timeout_s": self.source.timeout_s,
                "deadline": (now + timedelta(seconds=self.source.timeout_s)).isoformat(),
                "change": {"repository": redact_url(self.source.url), "path": self.source.path,
                           "shape": self.source.shape, "branch": self.source.branch, **base,
                           "change_request": change}}

    def snapshot(self) -> DeploySnapshot:
        with self.git.clone(self.source.branch) as repo:
            content, sha = self._read(repo)
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError:
            raise DeployError(f"{self.where} is not UTF-8; refusing to edit it") from None
        return DeploySnapshot(self.kind, f"{redact_url(self.source.url)}#{self.source.branch}:{self.source.path}",
                              text, {"existed": True, "commit": sha, "branch": self.source.branch,
                                     "path": self.source.path, "shape": self.source.shape})

    def deploy(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        before = snapshot.content.encode("utf-8")
        try:
            wanted = add_entry(self.source.shape, before, self.entry)
        except GitRenderError as exc:
            raise DeployError(f"{self.where}: {exc}") from None
        head = self.source.change_branch(self.group, self.run_id, "dual-write")
        with self.git.clone(self.source.branch) as repo:
            live, tip = self._read(repo)
            if live == wanted:  # a retried deploy whose commit already reached the branch
                ours = self.git.run("log", "--format=%H", "-F", f"--grep={self._trailer('dual-write')}",
                                    cwd=repo).stdout.split()
                commits = ours[:1] or [tip]
                change = {"kind": self.backend.kind, "url": None, "branch": self.source.branch, "commit": commits[0],
                          "merged": True, "already_there": True}
            elif live != before:
                raise DeployError(f"{self.where} changed since the snapshot (commit {snapshot.meta.get('commit')} -> "
                                  f"{tip}); refusing to deploy, nothing committed")
            else:
                sha = self._commit(repo, wanted, f"promshift: dual-write {self.group} ({self.name})\n\n"
                                   f"Adds the remote-write entry {self.name} (keep-filter on the group's metrics) to "
                                   f"{self.source.path}.\n\n{self._trailer('dual-write')}\n")
                change = self.backend.propose(self.git, repo, base=self.source.branch, head=head,
                                              title=f"promshift: dual-write {self.group}",
                                              body=f"Adds remote-write entry `{self.name}` for metric group "
                                                   f"`{self.group}` (run `{self.run_id}`).")
                commits = [sha]
        status = "CHANGE_PUSHED" if change.get("merged") else "CHANGE_REQUESTED"
        details = self._details({"base_commit": snapshot.meta.get("commit"), "commits": commits,
                                 "config_before_sha256": snapshot.sha256,
                                 "config_after_sha256": sha256_text(wanted.decode("utf-8"))}, change, now)
        reason = (f"{self.where}: commit {commits[0][:12]} "
                  + (f"in change request {change.get('url')}" if change.get("url") else "pushed")
                  + "; waiting for the sync to load it")
        return DeployResult(self.kind, "deploy", DeployState.WAITING).observed(
            status, now, state=DeployState.WAITING, reason=reason, **details)

    def verify(self, result: DeployResult, now: datetime) -> DeployResult:
        pulls = self.backend if isinstance(self.backend, GitHubPullRequests) else None
        return observe_git_change(GitObserver(self.prometheus, pulls), result, now)

    def restore(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        """A revert commit of ours (byte-identical file), or only our entry removed if others edited since."""
        before = snapshot.content.encode("utf-8")
        head = self.source.change_branch(self.group, self.run_id, "rollback")
        with self.git.clone(self.source.branch) as repo:
            live, tip = self._read(repo)
            try:
                ours_live = self.name in entry_names(self.source.shape, live)
            except GitRenderError as exc:
                raise DeployError(f"{self.where}: {exc}") from None
            change: dict[str, Any] | None
            commits: list[str] = []
            reverted_before = [] if ours_live else self.git.run(
                "log", "--format=%H", "-F", f"--grep={self._trailer('rollback')}", cwd=repo).stdout.split()
            if reverted_before:  # a retried rollback: our revert already reached the branch; report it again
                commits, method = reverted_before[:1], "revert"
                change = {"kind": self.backend.kind, "branch": self.source.branch, "commit": commits[0],
                          "merged": True, "already_there": True}
            elif not ours_live:  # never merged (a pull request still open or closed), or nothing of ours
                closed = self.backend.withdraw(head=self.source.change_branch(self.group, self.run_id, "dual-write"))
                method = "closed_unmerged" if closed else "nothing_to_revert"
                change = {"kind": self.backend.kind, "withdrawn": closed} if closed else None
            else:
                ours = self.git.run("log", "--format=%H", "-F", f"--grep={self._trailer('dual-write')}",
                                    cwd=repo).stdout.split()
                reverted = self._reverted(repo, ours[0]) if ours else None
                if reverted is not None:
                    method, content = "revert", reverted
                else:
                    method = "remove_entry"
                    try:
                        content = remove_entry(self.source.shape, live, self.name)
                    except GitRenderError as exc:
                        raise DeployError(f"{self.where}: cannot remove {self.name}: {exc}") from None
                message = (f"Revert \"promshift: dual-write {self.group} ({self.name})\"\n\n"
                           + (f"This reverts commit {ours[0]}.\n\n" if method == "revert" else
                              f"The file changed since our commit; only the entry {self.name} is removed.\n\n")
                           + f"{self._trailer('rollback')}\n")
                sha = self._commit(repo, content, message)
                change = self.backend.propose(self.git, repo, base=self.source.branch, head=head,
                                              title=f"promshift: roll back {self.group}",
                                              body=f"Removes remote-write entry `{self.name}` (rollback of run "
                                                   f"`{self.run_id}`).")
                commits = [sha]
                live = content
        details = self._details({"base_commit": tip, "commits": commits, "method": method,
                                 "restored_identical": live == before}, change or {}, now)
        status = {"closed_unmerged": "CHANGE_WITHDRAWN", "nothing_to_revert": "NOTHING_TO_REVERT"}.get(
            method, "REVERT_" + ("PUSHED" if (change or {}).get("merged") else "REQUESTED"))
        return DeployResult(self.kind, "restore", DeployState.WAITING).observed(
            status, now,
            state=DeployState.WAITING, reason=f"{self.where}: {method}; waiting for the sync to drop {self.name}",
            **details)


@dataclass
class GitObserver:
    """What following a git change reads: the source's loaded config, and the pull request (None: a direct push)."""

    prometheus: PrometheusClient
    pulls: GitHubPullRequests | None = None


def observe_git_change(observer: GitObserver, result: DeployResult, now: datetime) -> DeployResult:
    """The change's merge state first (a pull request not merged yet: WAITING; closed unmerged: FAILED; past the
    deadline: TIMEOUT), then the loaded config (``observe_loaded_config``). Reads only."""
    from promshift.adapters.k8s_deploy import observe_loaded_config

    if result.state.final:
        return result
    change = dict(result.details.get("change") or {})
    request = dict(change.get("change_request") or {})
    if observer.pulls is not None and request.get("number") and not request.get("merged"):
        pull = observer.pulls.get(int(request["number"]))
        where = f"pull request #{request['number']} ({request.get('url')})"
        if pull["merged"]:
            change["change_request"] = {**request, **pull}
            result = result.observed("MERGED", now, state=DeployState.WAITING, change=change,
                                     reason=f"{where} merged; waiting for the sync")
        elif pull["state"] == "closed":
            return result.observed("CLOSED_UNMERGED", now, state=DeployState.FAILED,
                                   reason=f"{where} was closed without merging")
        else:
            deadline = result.details.get("deadline")
            if deadline and now >= datetime.fromisoformat(str(deadline)):
                return result.observed("NOT_MERGED", now, state=DeployState.TIMEOUT,
                                       reason=f"{where} was not merged by {deadline}")
            return result.observed(result.status or "CHANGE_REQUESTED", now, state=DeployState.WAITING,
                                   reason=f"waiting for the review of {where}")
    return observe_loaded_config(observer.prometheus, result, now)


def change_backend(source: GitSource, token: str | None) -> ChangeBackend:
    """The source's backend: ``github`` (a pull request) or ``direct`` (a push to the branch)."""
    if source.backend == "github":
        return GitHubPullRequests(source.api_url, str(source.repository), token, http_loopback=source.http_loopback)
    return DirectPush()
