"""A source managed through git (kube-prometheus-stack values) switched to agent mode and back, by a commit.

``GitSourceModeSwitch`` is the retire DAG's switch (``core.ports.SourceModeSwitch``) on the git path: the same
repository, file and change backend as the git deploy (``adapters.git_deploy``: a fresh clone per call, a commit of
ours carrying a ``Promshift-Change`` trailer, then ``DirectPush`` or a ``GitHubPullRequests`` pull request). The
edit is the chart's own switch, ``prometheus.agentMode: true`` (``core.git_agent``, byte for byte): the chart then
renders a ``PrometheusAgent`` instead of the ``Prometheus`` resource and the team's sync applies it; the operator
runs the agent (``--enable-feature=agent``) and the sync prunes the server.

``to_agent`` (each call reads the repository and the source first, so a retry after a crash reaches the same end):

1. a fresh clone of ``branch``; ``prometheus.agentMode`` read (anything but a plain true/false refused);
2. already ``true`` (our commit reached the branch, or the owner set it): wait until the source answers as an
   agent; nothing committed (``changed`` False);
3. otherwise one commit setting it, proposed through the backend (a retried pull request reuses the open one: the
   head branch is fixed per source, ``promshift/source-<conn>/agent-mode``), then: the pull request merged (closed
   unmerged: refused; not merged within ``timeout_s``: closed again, refused), and the source answering
   ``/-/ready`` as "Prometheus Agent" within the same deadline. An agent that never comes up is undone by
   ``restore`` (a revert through the same backend) and the call fails.

``restore``: the newest commit of ours for this source reverted (``git revert``: the file's bytes come back exactly,
``byte_identical`` compares the file's blob with the one before our commit); when the file changed since so that
the revert conflicts, only the key is set back (``core.git_agent.set_agent_mode(..., False)``: our marked key
removed, a flipped ``false`` flipped back). A values file that says agent without a commit of ours is refused
(someone else retired it: restore by hand). Values that already say server: a retire pull request never merged is
closed, and the call waits until the source answers as a server.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from promshift.adapters.git_deploy import CHANGE_TRAILER, ChangeBackend, GitHubPullRequests, RepoFile
from promshift.adapters.source_mode import ModeChange, SourceModeError, probe_mode
from promshift.core.deploy import DeployError
from promshift.core.git_agent import WHERE, agent_mode, set_agent_mode
from promshift.core.git_render import HELM_VALUES, GitRenderError
from promshift.core.git_source import GitSource
from promshift.core.render import sha256_bytes


@dataclass(frozen=True)
class GitModeChange(ModeChange):
    change: dict[str, Any] = field(default_factory=dict)  # the commit and its change request (a pull request)

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "change": dict(self.change)}


class GitSourceModeSwitch(RepoFile):
    """``mode``/``to_agent``/``restore`` of the source whose Helm values live in ``source`` (module docstring)."""

    def __init__(self, source: GitSource, *, backend: ChangeBackend, url: str, conn_id: str, run_id: str,
                 token: str | None = None, timeout_s: float | None = None, poll_s: float = 2.0,
                 log: Callable[[str], None] | None = None) -> None:
        if source.shape != HELM_VALUES:
            raise SourceModeError(f"{source.path}: retiring through git needs kube-prometheus-stack values "
                                  f"(shape {HELM_VALUES}); a {source.shape} file has no agent switch")
        super().__init__(source, token=token)
        self.backend, self.url, self.conn_id, self.run_id = backend, url, conn_id, run_id
        self.timeout_s = source.timeout_s if timeout_s is None else timeout_s
        self.poll_s = poll_s
        self._log = log or (lambda _line: None)
        safe = re.sub(r"[^A-Za-z0-9._-]+", "-", conn_id).strip("-.")[:80] or "source"
        self.heads = {"retire": f"promshift/source-{safe}/agent-mode",
                      "unretire": f"promshift/source-{safe}/server-mode"}

    def mode(self) -> str:
        return probe_mode(self.url)

    # -- the repository

    def _trailer(self, action: str) -> str:
        return f"{CHANGE_TRAILER}: {action} source:{self.conn_id} "

    def _ours(self, repo: Path, action: str) -> str | None:
        """The newest commit of ours on the branch for ``action`` (retire/unretire) of this source."""
        found = self.git.run("log", "--format=%H", "-F", f"--grep={self._trailer(action)}", cwd=repo).stdout.split()
        return found[0] if found else None

    def _blob(self, repo: Path, rev: str) -> str | None:
        done = self.git.run("rev-parse", "--verify", "--quiet", f"{rev}:{self.source.path}", cwd=repo, check=False)
        return done.stdout.strip() or None

    def _agent_mode(self, live: bytes) -> bool:
        try:
            return bool(agent_mode(live))
        except GitRenderError as exc:
            raise SourceModeError(f"{self.where}: {exc}") from None

    def _wait(self, deadline: float, change: dict[str, Any], wanted: str) -> dict[str, Any]:
        """The change request merged (a pull request), then the source answering as ``wanted``."""
        pulls = self.backend if isinstance(self.backend, GitHubPullRequests) else None
        number = change.get("number")
        while pulls is not None and number and not change.get("merged"):
            pull = pulls.get(int(number))
            change.update(pull)  # in place: the caller sees whether it merged, whatever is raised after
            if pull["merged"]:
                self._log(f"pull request #{number} merged; waiting for the sync")
                break
            if pull["state"] == "closed":
                raise SourceModeError(f"pull request #{number} ({change.get('url')}) was closed without merging")
            if time.monotonic() > deadline:
                closed = pulls.withdraw(head=str(change.get("branch") or ""))
                raise SourceModeError(f"pull request #{number} ({change.get('url')}) was not merged within "
                                      f"{self.timeout_s:.0f}s" + ("; closed again" if closed else ""))
            time.sleep(self.poll_s)
        while (mode := self.mode()) != wanted:
            if time.monotonic() > deadline:
                raise SourceModeError(f"the source at {self.url} still answers as {mode!r} {self.timeout_s:.0f}s "
                                      f"after {WHERE} was committed for a {wanted} (is the sync running?)")
            time.sleep(self.poll_s)
        return change

    def _propose(self, repo: Path, action: str, content: bytes, subject: str, body: str) -> tuple[str, dict[str, Any]]:
        sha = self._commit(repo, content, f"{subject}\n\n{body}\n\n{self._trailer(action)}{self.run_id}\n")
        try:
            change = self.backend.propose(self.git, repo, base=self.source.branch, head=self.heads[action],
                                          title=subject, body=body)
        except DeployError as exc:
            raise SourceModeError(f"{self.where}: {exc}") from None
        self._log(f"{subject}: commit {sha[:12]} " + (f"in {change['url']}" if change.get("url") else "pushed"))
        return sha, change

    # -- the switch

    def to_agent(self) -> ModeChange:
        deadline = time.monotonic() + self.timeout_s
        with self.git.clone(self.source.branch) as repo:
            live, tip = self._read(repo)
            before = ("helm-values", f"{self.source.path}@{tip[:12]}")
            if self._agent_mode(live):
                ours = self._ours(repo, "retire")
                self._log(f"{WHERE} is already true at {tip[:12]}; waiting for the source to answer as an agent")
                sha = sha256_bytes(live)
                change = {"kind": self.backend.kind, "branch": self.source.branch, "commit": ours or tip,
                          "merged": True, "already_there": True, "ours": ours is not None}
                self._wait(deadline, change, "agent")
                return GitModeChange("agent", False, before, before, sha, sha, change=change)
            if self.mode() == "agent":
                raise SourceModeError(f"the source at {self.url} answers as an agent but {self.where} says a server "
                                      f"({WHERE} not true): not switching what something else runs")
            try:
                wanted = set_agent_mode(live, True)
            except GitRenderError as exc:
                raise SourceModeError(f"{self.where}: {exc}") from None
            sha, change = self._propose(
                repo, "retire", wanted, f"promshift: retire source {self.conn_id} ({WHERE}: true)",
                f"Sets `{WHERE}: true` in {self.source.path}: kube-prometheus-stack then renders a PrometheusAgent "
                f"(forwarder only: no rules, alerting, queries or local storage) instead of the Prometheus resource. "
                f"Every metric group of `{self.conn_id}` has baked (run `{self.run_id}`).")
        try:
            change = self._wait(deadline, change, "agent")
        except SourceModeError as exc:
            if change.get("number") and not change.get("merged"):
                raise  # never merged: nothing to undo (closed when it timed out)
            self._log(f"the agent did not come up ({exc}); reverting")
            try:
                self.restore()
            except Exception as undo:  # noqa: BLE001 - both failures are named in the one line raised
                raise SourceModeError(f"{exc}; the revert failed too: {str(undo).splitlines()[0][:200]}") from None
            raise SourceModeError(f"{exc}; {WHERE} was reverted and the source answers as a server again") from None
        return GitModeChange("agent", True, before, ("helm-values", f"{self.source.path}@{sha[:12]}"),
                             sha256_bytes(live), sha256_bytes(wanted), change={**change, "commit": sha})

    def restore(self) -> ModeChange:
        deadline = time.monotonic() + self.timeout_s
        with self.git.clone(self.source.branch) as repo:
            live, tip = self._read(repo)
            before = ("helm-values", f"{self.source.path}@{tip[:12]}")
            ours = self._ours(repo, "retire")
            saved = self._blob(repo, f"{ours}^") if ours else None
            if not self._agent_mode(live):
                withdrawn = self.backend.withdraw(head=self.heads["retire"])  # a retire never merged
                if withdrawn:
                    self._log(f"closed the retire pull request #{withdrawn.get('number')}, never merged")
                identical = None if saved is None else self._blob(repo, "HEAD") == saved
                sha = sha256_bytes(live)
                change = {"kind": self.backend.kind, "branch": self.source.branch, "commit": tip, "merged": True,
                          "already_there": True, "withdrawn": withdrawn}
                self._wait(deadline, change, "server")
                return GitModeChange("server", False, before, before, sha, sha, identical, change=change)
            if ours is None:
                raise SourceModeError(f"{self.where} says {WHERE}: true, but no commit of promshift set it for "
                                      f"{self.conn_id}: restore it by hand")
            reverted = self._reverted(repo, ours)
            if reverted is not None:
                method, content = "revert", reverted
            else:  # the file changed since our commit: only the key goes back
                method = "unset_key"
                try:
                    content = set_agent_mode(live, False)
                except GitRenderError as exc:
                    raise SourceModeError(f"{self.where}: cannot set {WHERE} back: {exc}") from None
            sha, change = self._propose(
                repo, "unretire", content, f"Revert \"promshift: retire source {self.conn_id} ({WHERE}: true)\"",
                (f"This reverts commit {ours}." if method == "revert" else
                 f"The file changed since commit {ours}; only {WHERE} is set back.")
                + f" The source `{self.conn_id}` runs as a Prometheus server again (run `{self.run_id}`).")
            identical = self._blob(repo, "HEAD") == saved
        change = self._wait(deadline, {**change, "method": method}, "server")
        return GitModeChange("server", True, before, ("helm-values", f"{self.source.path}@{sha[:12]}"),
                             sha256_bytes(live), sha256_bytes(content), identical,
                             change={**change, "commit": sha, "reverted": ours})
