"""A local GitHub REST API *contract* server for the git deploy's pull-request backend (not GitHub).

``adapters.git_deploy.GitHubPullRequests`` is tested against this small ``ThreadingHTTPServer`` on
127.0.0.1, over a real bare git repository. It serves only what the backend uses, and checks it:

- ``POST /repos/{owner}/{repo}/pulls`` ``{title, head, base, body?, draft?, maintainer_can_modify?}``;
- ``GET /repos/{owner}/{repo}/pulls?head=owner:branch&state=open|closed|all``;
- ``GET|PATCH /repos/{owner}/{repo}/pulls/{number}`` (PATCH ``{title?, body?, state?, base?,
  maintainer_can_modify?}``);
- ``PUT /repos/{owner}/{repo}/pulls/{number}/merge`` (the reviewer's button; ``merge_after_s`` presses it
  by itself for an open pull request that old: the local stand-in for a team's review).

Every request must carry ``Authorization: Bearer <the token>`` (else 401 "Bad credentials", as GitHub),
``Accept: application/vnd.github+json`` (else 415) and ``X-GitHub-Api-Version: 2022-11-28`` (else 400
"unsupported API version"); a body must be a JSON object of the documented fields with the documented
types (else 422 "Validation Failed" or 400 "Problems parsing JSON"; stricter than GitHub, which ignores
unknown fields, so a typo in our own bodies fails a test). ``head`` and ``base`` must be branches of the
repository and differ; a second open pull request from one head is refused (422 "A pull request already
exists for owner:head."). A merge fast-forwards ``base`` to ``head`` in the bare repository (GitHub would
make a merge commit; it refuses with 405 "Pull Request is not mergeable" when ``base`` moved meanwhile).
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs

from promshift.local.stack.contract_http import ContractHandler, ContractServer

log = logging.getLogger(__name__)
API_VERSION = "2022-11-28"
ACCEPT = "application/vnd.github+json"
_PULLS = re.compile(r"^/repos/([^/]+)/([^/]+)/pulls(?:/(\d+)(/merge)?)?$")
_CREATE = {"title": str, "head": str, "base": str, "body": str, "draft": bool, "maintainer_can_modify": bool}
_UPDATE = {"title": str, "body": str, "state": str, "base": str, "maintainer_can_modify": bool}
_MERGE = {"commit_title": str, "commit_message": str, "sha": str, "merge_method": str}


class Refusal(Exception):
    def __init__(self, code: int, message: str, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.errors = code, message, errors


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "--git-dir", str(repo), *args], capture_output=True, text=True, timeout=60,
                          check=False, env={"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(repo)})


class GitHubContractServer(ContractServer):
    """Pull requests over the bare repository ``repo`` as ``owner/name``; ``token`` is the only one accepted."""

    name = "github-api"
    log = log

    def __init__(self, repo: str | Path, *, repository: str, token: str, host: str = "127.0.0.1", port: int = 0,
                 merge_after_s: float | None = None) -> None:
        self.repo = Path(repo)
        self.repository = repository
        self.token = token
        self.merge_after_s = merge_after_s
        self.pulls: dict[int, dict[str, Any]] = {}
        self.bodies: list[tuple[str, str, Any]] = []  # (method, path, JSON body) of every accepted write
        self._lock = threading.RLock()
        self._stop = threading.Event()
        super().__init__(host, port)

    # -- the repository -----------------------------------------------------------------------
    def branch_sha(self, branch: str) -> str | None:
        done = _git(self.repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}")
        return done.stdout.strip() or None if done.returncode == 0 else None

    def _pull_json(self, pr: dict[str, Any]) -> dict[str, Any]:
        owner = self.repository.split("/")[0]
        html = f"{self.base_url}/{self.repository}/pull/{pr['number']}"
        return {"url": f"{self.base_url}/repos/{self.repository}/pulls/{pr['number']}", "html_url": html,
                "number": pr["number"], "state": pr["state"], "title": pr["title"], "body": pr.get("body"),
                "merged": pr["merged"], "merge_commit_sha": pr.get("merge_commit_sha"), "draft": pr.get("draft", False),
                "head": {"ref": pr["head"], "sha": self.branch_sha(pr["head"]) or pr.get("head_sha"),
                         "label": f"{owner}:{pr['head']}"},
                "base": {"ref": pr["base"], "sha": self.branch_sha(pr["base"])}}

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        for key in ("title", "head", "base"):
            if not body.get(key):
                raise Refusal(422, "Validation Failed", [{"resource": "PullRequest", "field": key,
                                                          "code": "missing_field"}])
        head = str(body["head"]).split(":")[-1]
        for key, branch in (("head", head), ("base", body["base"])):
            if self.branch_sha(branch) is None:
                raise Refusal(422, "Validation Failed", [{"resource": "PullRequest", "field": key, "code": "invalid"}])
        if head == body["base"]:
            raise Refusal(422, "Validation Failed", [{"resource": "PullRequest", "code": "custom",
                                                      "message": f"No commits between {body['base']} and {head}"}])
        with self._lock:
            if any(p["head"] == head and p["state"] == "open" for p in self.pulls.values()):
                owner = self.repository.split("/")[0]
                raise Refusal(422, "Validation Failed", [{"resource": "PullRequest", "code": "custom",
                                                          "message": f"A pull request already exists for "
                                                                     f"{owner}:{head}."}])
            number = len(self.pulls) + 1
            self.pulls[number] = {"number": number, "title": body["title"], "body": body.get("body"), "head": head,
                                  "base": body["base"], "state": "open", "merged": False,
                                  "draft": bool(body.get("draft")), "created": time.monotonic()}
            return self._pull_json(self.pulls[number])

    def merge(self, number: int) -> dict[str, Any]:
        with self._lock:
            pr = self.pulls[number]
            if pr["state"] != "open":
                raise Refusal(405, "Pull Request is not mergeable")
            head, base = self.branch_sha(pr["head"]), self.branch_sha(pr["base"])
            if head is None or base is None or _git(self.repo, "merge-base", "--is-ancestor", base,
                                                    head).returncode != 0:
                raise Refusal(405, "Pull Request is not mergeable")
            if _git(self.repo, "update-ref", f"refs/heads/{pr['base']}", head, base).returncode != 0:
                raise Refusal(409, "Base branch was modified. Review and try the merge again.")
            pr.update(state="closed", merged=True, merge_commit_sha=head, head_sha=head)
            log.info("github-api: merged #%s (%s) into %s at %s", number, pr["head"], pr["base"], head[:12])
            return {"sha": head, "merged": True, "message": "Pull Request successfully merged"}

    def _auto_merge(self) -> None:
        while not self._stop.wait(0.5):
            if self.merge_after_s is None:
                continue
            with self._lock:
                due = [n for n, p in self.pulls.items()
                       if p["state"] == "open" and time.monotonic() - p["created"] >= self.merge_after_s]
            for number in due:
                try:
                    self.merge(number)
                except Refusal as exc:
                    log.warning("github-api: auto-merge of #%s refused: %s", number, exc.message)

    def start(self) -> GitHubContractServer:
        super().start()
        threading.Thread(target=self._auto_merge, name="github-api-merge", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        super().stop()

    # -- HTTP ---------------------------------------------------------------------------------
    def _handler(self) -> type[ContractHandler]:
        server = self

        class Handler(ContractHandler):
            contract: ClassVar[ContractServer] = server

            def _serve(self) -> None:
                try:
                    self.answer(*server.serve(self.command, self.path, self.headers, self.read_body()))
                except Refusal as exc:
                    body: dict[str, Any] = {"message": exc.message,
                                            "documentation_url": "https://docs.github.com/rest"}
                    if exc.errors:
                        body["errors"] = exc.errors
                    self.answer(exc.code, body)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve  # noqa: N815 - BaseHTTPRequestHandler's names

        return Handler

    def serve(self, method: str, raw_path: str, headers: Any, raw: bytes) -> tuple[int, Any]:
        path, _, query = raw_path.partition("?")
        if headers.get("Authorization") != f"Bearer {self.token}":
            raise Refusal(401, "Bad credentials")
        if headers.get("Accept") != ACCEPT:
            raise Refusal(415, f"Accept must be {ACCEPT}")
        if headers.get("X-GitHub-Api-Version") != API_VERSION:
            raise Refusal(400, f"unsupported API version {headers.get('X-GitHub-Api-Version')!r}")
        match = _PULLS.match(path)
        if not match or f"{match.group(1)}/{match.group(2)}" != self.repository:
            raise Refusal(404, "Not Found")
        number = int(match.group(3)) if match.group(3) else None
        if number is not None and number not in self.pulls:
            raise Refusal(404, "Not Found")
        if method == "GET" and number is None:
            params = {k: v[-1] for k, v in parse_qs(query).items()}
            state = params.get("state", "open")
            head = params.get("head", "").split(":")[-1]
            with self._lock:
                found = [self._pull_json(p) for p in self.pulls.values()
                         if (state == "all" or p["state"] == state) and (not head or p["head"] == head)]
            return 200, found
        if method == "GET" and not match.group(4):
            return 200, self._pull_json(self.pulls[number])  # type: ignore[index]
        body = self._body(raw, {"POST": _CREATE, "PATCH": _UPDATE, "PUT": _MERGE}.get(method))
        if method == "POST" and number is None:
            self.bodies.append((method, path, body))
            return 201, self.create(body)
        if method == "PATCH" and number is not None and not match.group(4):
            if "state" in body and body["state"] not in ("open", "closed"):
                raise Refusal(422, "Validation Failed", [{"resource": "PullRequest", "field": "state",
                                                          "code": "invalid"}])
            self.bodies.append((method, path, body))
            with self._lock:
                pr = self.pulls[number]
                if pr["merged"] and body.get("state") == "open":
                    raise Refusal(422, "Validation Failed", [{"resource": "PullRequest", "code": "custom",
                                                              "message": "merged pull requests cannot be reopened"}])
                pr.update({k: v for k, v in body.items() if k in ("title", "body", "state", "base")})
                return 200, self._pull_json(pr)
        if method == "PUT" and match.group(4):
            self.bodies.append((method, path, body))
            return 200, self.merge(number)  # type: ignore[arg-type]
        raise Refusal(404, "Not Found")

    @staticmethod
    def _body(raw: bytes, schema: dict[str, type] | None) -> dict[str, Any]:
        if schema is None:
            raise Refusal(404, "Not Found")
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise Refusal(400, "Problems parsing JSON") from None
        if not isinstance(body, dict):
            raise Refusal(400, "Problems parsing JSON")
        errors = [{"resource": "PullRequest", "field": key, "code": "invalid"} for key, value in body.items()
                  if key not in schema or not isinstance(value, schema[key])]
        if errors:
            raise Refusal(422, "Validation Failed", errors)
        return body
